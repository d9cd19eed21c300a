"""``--temperature``, ``--no-ignore-eos`` and ``--seed`` set what an importer gives the
requests it makes from a public trace; a workload file's requests (``--format replayllm``)
keep their own. With ``--format replayllm`` the three were silently ignored (every request kept
its temperature 0.6 under ``--temperature 0``) while the output's header recorded them as
applied; they are now one line, exit 2, as every option of another format is
(``FORMAT_OPTIONS``), given on the command line even at their default value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import InvalidRequestError
from replay.cli.main import main
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload


def _workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"prompt_len": 8, "max_tokens": 4, "salt": 7}) + "\n")
    return path


@pytest.mark.parametrize("flags", [["--temperature", "0"], ["--temperature", "0.6"],
                                   ["--no-ignore-eos"], ["--seed", "5"], ["--seed", "0"]])
def test_request_options_with_a_workload_file_are_one_line(
        tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Each flag with --format replayllm: exit 2, one line naming it, no output file."""
    out = tmp_path / "out.jsonl"
    assert main(["workload", "import", str(_workload(tmp_path)), "--format", "replayllm",
                 "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err == (f"replayllm workload: error: {flags[0]} applies to --format azure, "
                   "burstgpt, mooncake and sharegpt only, not replayllm (its requests keep "
                   "their own)\n")
    assert not out.exists()


def test_the_api_refuses_them_too(tmp_path: Path) -> None:
    """ImportOptions with another temperature, EOS rule or seed and --format replayllm."""
    for options in (ImportOptions(temperature=0.0), ImportOptions(ignore_eos=False),
                    ImportOptions(seed=3)):
        with pytest.raises(InvalidRequestError, match="applies to --format azure, burstgpt, "
                           "mooncake and sharegpt only, not replayllm"):
            list(import_workload(_workload(tmp_path), "replayllm", options, ImportCounts()))


def test_without_them_a_workload_file_imports_as_it_is(tmp_path: Path) -> None:
    """No flag: the request as the file has it, the header's command without the three."""
    out = tmp_path / "out.jsonl"
    assert main(["workload", "import", str(_workload(tmp_path)), "--format", "replayllm",
                 "--out", str(out)]) == 0
    header, row = (json.loads(line) for line in out.read_text().splitlines())
    assert row == {"prompt_len": 8, "max_tokens": 4, "salt": 7}
    command = header["imported"]["command"]
    assert (command["temperature"], command["seed"]) == (None, None)


def test_traces_still_take_them_and_record_their_defaults(tmp_path: Path) -> None:
    """A trace format takes the three, and records 0.6 and 0 where they are not given."""
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,100,10\n")
    for flags, temperature, seed in (([], 0.6, 0), (["--temperature", "0", "--seed", "2"], 0.0,
                                                    2)):
        out = tmp_path / f"out{seed}.jsonl"
        assert main(["workload", "import", str(trace), "--format", "azure", "--out", str(out),
                     *flags]) == 0
        header, row = (json.loads(line) for line in out.read_text().splitlines())
        command = header["imported"]["command"]
        assert (command["temperature"], command["seed"]) == (temperature, seed)
        assert row.get("temperature", 0.6) == temperature
