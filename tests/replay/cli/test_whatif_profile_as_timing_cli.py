"""A device profile given where a step-time model is read is named as a profile.

``--timing-from`` takes a trace or a saved cost model (``cost_model.json``); a device profile
(``replayllm profile``'s file) is neither, but it is JSON with a ``version`` of 1, so ``whatif
--timing-from PROFILE.json`` said ``cost model version 1, expected 12``: a version problem
that an upgrade would not fix. It now says the file is a device profile and where one goes
(``--profile``, beside a trace), for ``whatif`` and ``tune`` alike, and ``CostModel.load``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import REPO, SAMPLE, message_lines, run_cli

from replay.whatif.cost.model import CostModel, CostModelError

PROFILE = REPO / "traces" / "profiles" / "h200-qwen3-0.6b-s33.profile.json"


def test_load_names_a_profile() -> None:
    """``CostModel.load`` of a profile: a ``CostModelError`` saying it is a device profile."""
    with pytest.raises(CostModelError, match="a device profile .* not a saved cost model"):
        CostModel.load(PROFILE)


@pytest.mark.parametrize("command", [
    ["whatif", str(SAMPLE)],
    ["tune", str(SAMPLE), "--slo", "ttft_p99=1"],
])
def test_timing_from_a_profile_is_one_line(tmp_path: Path, command: list[str]) -> None:
    """``whatif``/``tune --timing-from PROFILE.json``: one line naming the file as a device
    profile and ``--profile``, exit 2, no output written."""
    out = tmp_path / "out"
    code, stdout, stderr = run_cli([*command, "--timing-from", str(PROFILE), "--out", str(out),
                                    "--no-plots"])
    lines = message_lines(stderr)
    assert code == 2
    assert len(lines) == 1, stderr
    assert "a device profile" in lines[0] and "--profile" in lines[0], lines[0]
    assert "version" not in lines[0]
    assert not out.exists()
