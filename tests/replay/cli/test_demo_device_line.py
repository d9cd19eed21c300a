"""``replayllm demo``'s speed line names the device the run was recorded on.

It printed ``(N tok/s on CPU)`` whatever ran the model: ``make demo`` on a GPU host (the engine
takes CUDA where there is one) said CPU of a CUDA run. It now says the trace header's device.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _cli import run_cli

import tracing.header
from replay.cli import demo
from replay.workloads.builtin import demo_workload
from replay.workloads.request import Request


def _small_workload() -> list[Request]:
    """Two of the demo's requests, a few tokens each: the line, not the run, is under test."""
    return [Request(r.prompt, max_tokens=2, temperature=0.0, ignore_eos=True)
            for r in demo_workload()[:2]]


@pytest.mark.parametrize("device", [None, "NVIDIA H200"])
def test_the_speed_line_names_the_recorded_device(tmp_path: Path, device: str | None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "demo_workload", _small_workload)
    if device is not None:  # as a CUDA run's header reads (this machine has no GPU)
        monkeypatch.setattr(tracing.header, "recorded_device", lambda header: device)
    code, out, err = run_cli(["demo", "--out", str(tmp_path / "d")])
    assert code == 0, err
    line = next(x for x in out.splitlines() if "tokens generated" in x)
    expected = device or "cpu"
    assert re.search(rf"\(\d+ tok/s on {re.escape(expected)}\)$", line), line
