"""``--report FILE.html``: one self-contained page that headless Chromium loads with no console
error, every plot in it (as many inline PNGs as the run wrote) and nothing from the network.

Chromium is Debian's ``chromium`` (CI's .ci/run installs it); the test is skipped, saying so,
only where it is absent.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess

import pytest

from engine.config import Config
from replay.cli.main import main
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _load_in_chromium(page) -> tuple[str, str]:
    """(DOM after load, Chromium's log) of ``page`` in headless Chromium."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=2000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True)
    return done.stdout, done.stderr


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (CI's .ci/run installs "
                    "it: apt-get install -y chromium)")
def test_whatif_report_loads_in_chromium_with_every_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    requests = [Request(r.prompt[:200], min(r.max_tokens, 60)) for r in reference_workload(12)]
    trace = tmp_path / "trace"
    record_workload(Config(num_kvcache_blocks=60, kvcache_block_size=32, max_num_seqs=16),
                    requests, StepLaw(), trace_dir=str(trace), seed=1)
    page = tmp_path / "report.html"
    out = tmp_path / "out"
    assert main(["whatif", str(trace), "--grid", "max_num_seqs=4,16", "--out", str(out),
                 "--report", str(page)]) == 0
    capsys.readouterr()
    text = page.read_text()
    assert not re.search(r"(src|href)=['\"]?https?:", text)  # nothing from the network
    written = sorted(p.stem for p in out.glob("*.png"))
    assert len(written) >= 3
    dom, log = _load_in_chromium(page)
    shown = re.findall(r"<img class=\"plot\" alt=\"([^\"]+)\" src=\"data:image/png;base64,"
                       r"([^\"]+)\"", dom)
    assert sorted(name for name, _ in shown) == written
    assert all(base64.b64decode(data)[:8] == PNG_SIGNATURE for _, data in shown)
    assert "max_num_seqs=16" in dom and "<table" in dom
    errors = [line for line in log.splitlines() if "CONSOLE" in line or "Failed to load" in line]
    assert errors == []
