"""The instruction counter reads callgrind's total and reports the cost per request.

What this proves: ``instructions`` runs ``simulate_scale --mode stream --one N`` under callgrind
with a fixed hash seed and reads its ``Collected`` total; ``main`` prints
``(I(N) - I(1)) / (N - 1)``; a run without a total is an error, not a zero (valgrind itself is
not run here: ``subprocess.run`` is replaced).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks import simulate_instructions


def _fake_run(totals: dict[str, int], seen: list) -> object:
    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        seen.append((command, kwargs["env"]["PYTHONHASHSEED"]))  # type: ignore[index]
        total = totals.get(command[-1])
        stderr = f"==1== Events    : Ir\n==1== Collected : {total}\n" if total else "boom"
        return subprocess.CompletedProcess(command, 0, "", stderr)
    return run


def test_the_cost_per_request_is_the_difference_over_the_extra_requests(monkeypatch, capsys):
    seen: list = []
    monkeypatch.setattr(subprocess, "run", _fake_run({"1": 2_000_000, "11": 2_000_000 + 10 * 7},
                                                     seen))
    assert simulate_instructions.main(["--requests", "11"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["per_request"] == 7 and out["instructions_11"] == 2_000_070
    assert [command[-1] for command, _ in seen] == ["1", "11"]
    assert all(command[:2] == ["valgrind", "--tool=callgrind"] and seed == "0"
               for command, seed in seen)
    assert seen[0][0][-5:-1] == ["benchmarks.simulate_scale", "--mode", "stream", "--one"]


def test_a_run_without_a_total_is_an_error(monkeypatch):
    monkeypatch.setattr(subprocess, "run", _fake_run({}, []))
    with pytest.raises(SystemExit, match="no callgrind total"):
        simulate_instructions.instructions(5)
