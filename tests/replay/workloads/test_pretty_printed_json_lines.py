"""A JSON Lines trace saved pretty-printed (each object spread over several lines, as the
Mooncake README shows its sample) is said to be that: not JSON Lines, naming the file and the
line. Before, ``--format mooncake`` read the line ``{`` as a CSV header and said "not JSON
(Expecting property name enclosed in double quotes, column 1) (columns found: {)", and
``--format replayllm`` said only "not JSON (Expecting property name ...)": neither told the
user that the file was fine JSON, only not one object a line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.cli.main import main

MOONCAKE = [{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]},
            {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47]}]
WORKLOAD = [{"prompt_len": 8, "salt": 1, "max_tokens": 4},
            {"prompt_len": 8, "salt": 2, "max_tokens": 4}]


def _import(trace: Path, fmt: str, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a failed import (exit code 2); nothing written."""
    assert main(["workload", "import", str(trace), "--format", fmt, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
    return err


@pytest.mark.parametrize("fmt, records", [("mooncake", MOONCAKE), ("sharegpt", None),
                                          ("replayllm", WORKLOAD)])
def test_a_pretty_printed_file_is_named_not_json_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str,
        records: list[dict[str, object]] | None) -> None:
    """Every JSON Lines reader (the importers' ``json_records`` and the workload file's
    reader) says the file is not JSON Lines at its first line, and shows no "columns found"."""
    if records is None:
        records = [{"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                                  {"from": "gpt", "value": "hello"}]}]
    trace = tmp_path / "pretty.jsonl"
    trace.write_text("".join(json.dumps(r, indent=2) + "\n" for r in records))
    err = _import(trace, fmt, tmp_path / "w.jsonl", capsys)
    assert f"{trace}:1: not JSON Lines: the JSON object goes on past the end of the line" in err
    assert "pretty-printed" in err
    assert "columns found" not in err and "Expecting property name" not in err


def test_a_later_pretty_printed_record_names_its_own_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file whose first record is one line and whose second is spread over lines names the
    second record's first line (3), for the importers and for a workload file alike."""
    trace = tmp_path / "mixed.jsonl"
    trace.write_text(json.dumps(MOONCAKE[0]) + "\n\n" + json.dumps(MOONCAKE[1], indent=2) + "\n")
    err = _import(trace, "mooncake", tmp_path / "w.jsonl", capsys)
    assert f"{trace}:3: not JSON Lines: the JSON object goes on past the end of the line" in err
    trace.write_text(json.dumps(WORKLOAD[0]) + "\n" + json.dumps(WORKLOAD[1], indent=1) + "\n")
    err = _import(trace, "replayllm", tmp_path / "w.jsonl", capsys)
    assert f"{trace}:2: not JSON Lines: the JSON object goes on past the end of the line" in err


def test_a_last_line_cut_short_and_a_bad_line_keep_their_own_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only an object that goes on past a line end is called multi-line: a last line with no
    line end is still a write not finished, a line end inside a string is still not JSON, and a
    CSV given as mooncake still names its columns."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(MOONCAKE[0]) + "\n" + '{"timestamp": 1, "input_')
    err = _import(trace, "mooncake", tmp_path / "w.jsonl", capsys)
    assert f"{trace}:2: not JSON" in err and "cut short" in err and "JSON Lines" not in err
    trace.write_text(json.dumps(MOONCAKE[0]) + "\n" + '{"timestamp": "1\n2"}\n')
    err = _import(trace, "mooncake", tmp_path / "w.jsonl", capsys)
    assert f"{trace}:2: not JSON (Invalid control character" in err and "JSON Lines" not in err
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n")
    err = _import(trace, "mooncake", tmp_path / "w.jsonl", capsys)
    assert "columns found: TIMESTAMP, ContextTokens, GeneratedTokens" in err
