"""The command a generated workload's header records reproduces the file: its options given
back to ``replayllm workload generate`` write the same requests and the same header (but
``--out``), also with ``--rate inf`` (every request at 0). Before, the header dropped an
infinite rate (JSON has no infinity) and kept the ``poisson`` it implied: given back, that was
``--arrivals poisson`` without ``--rate``, an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replay.cli.main import main
from replay.workloads.store import read_metadata

# Options whose flag is not ``--`` and the option's name (store_false: given when False).
NEGATED = {"ignore_eos": "--no-ignore-eos"}


def _argv(command: dict[str, Any], out: Path) -> list[str]:
    """The ``replayllm`` arguments a header's command stands for, writing to ``out``."""
    argv = ["workload", "generate", "--out", str(out)]
    for name, value in command.items():
        if name == "out" or value is None:
            continue
        if name in NEGATED:
            argv += [] if value else [NEGATED[name]]
        else:
            argv.append(f"--{name.replace('_', '-')}={value}")
    return argv


def _generated(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The header's ``generated`` record without ``out``, and the request lines."""
    generated = dict(read_metadata(path)["generated"])
    generated["command"] = {k: v for k, v in generated["command"].items() if k != "out"}
    return generated, path.read_text().splitlines()[1:]


@pytest.mark.parametrize("options", [
    ["--rate", "inf"],
    ["--arrivals", "constant", "--rate", "inf"],
    ["--arrivals", "gamma", "--rate", "inf", "--burstiness", "0.5"],
    ["--rate", "inf", "--system-prompts", "3", "--turns", "uniform:1,3",
     "--think-time", "exponential:2"],
    ["--rate", "50"],
    [],
], ids=["inf", "constant-inf", "gamma-inf", "inf-conversations", "finite", "no-rate"])
def test_the_recorded_command_reproduces_the_file(tmp_path: Path, options: list[str]) -> None:
    first = tmp_path / "first.jsonl"
    assert main(["workload", "generate", "--num-requests", "20", "--seed", "3",
                 "--out", str(first), *options]) == 0
    command = read_metadata(first)["generated"]["command"]
    json.dumps(command, allow_nan=False)  # plain JSON: no Infinity or NaN
    again = tmp_path / "again.jsonl"
    assert main(_argv(command, again)) == 0
    assert _generated(again) == _generated(first)


def test_an_infinite_rate_is_recorded_as_given(tmp_path: Path) -> None:
    """``--rate inf`` is recorded as ``inf`` (a string: what the option takes), with the
    process it ran; every request arrives at 0."""
    out = tmp_path / "w.jsonl"
    assert main(["workload", "generate", "--num-requests", "5", "--rate", "inf",
                 "--out", str(out)]) == 0
    command = read_metadata(out)["generated"]["command"]
    assert (command["arrivals"], command["rate"]) == ("poisson", "inf")
    rows = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert all(row.get("arrival_s", 0.0) == 0.0 for row in rows)
