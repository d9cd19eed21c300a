"""Session 37's import and workload-file cases: files users really have that an import lost
count of or refused with a message that did not say what was wrong (docs/TESTING.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.cli.main import main
from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload
from replay.workloads.store import read_workload


def run(path: Path, fmt: str, **options: object) -> tuple[list, ImportCounts]:
    counts = ImportCounts()
    requests = list(import_workload(path, fmt, ImportOptions(**options), counts))  # type: ignore
    return requests, counts


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_sharegpt_conversations_with_no_text_are_counted(tmp_path: Path) -> None:
    """A conversation whose only question is empty ("" or null) and that has no answer makes
    no turn: it is counted as read and dropped. Before, it was not counted at all (4
    conversations read as 3), and a file of only such conversations was "holds no requests (an
    empty file, or a header only)", which it is not."""
    data = [{"id": "a", "conversations": [{"from": "human", "value": "hello"},
                                          {"from": "gpt", "value": "hi"}]},
            {"id": "c", "conversations": [{"from": "human", "value": ""}]},
            {"id": "d", "conversations": [{"from": "human", "value": None}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    requests, counts = run(path, "sharegpt")
    assert len(requests) == 1 and counts.read == 3 and counts.kept == 1
    assert counts.dropped == {"conversation with no question text": 2}

    only = tmp_path / "only.json"
    only.write_text(json.dumps(data[1:]))
    with pytest.raises(WorkloadFormatError) as exc:
        run(only, "sharegpt")
    assert "keeps none of its requests (read 2, kept 0, dropped 2 (conversation with no " \
        "question text))" in str(exc.value)
    # outside the window (dropped whole, untokenized), such a conversation is counted too
    counts = ImportCounts()
    with pytest.raises(WorkloadFormatError):
        list(import_workload(path, "sharegpt", ImportOptions(rate=1.0, start_s=1e5), counts))
    assert counts.read == 3
    assert counts.dropped == {"outside the time window": 1,
                              "conversation with no question text": 2}


def test_mooncake_lengths_written_as_whole_floats_are_read(tmp_path: Path) -> None:
    """A Mooncake line whose lengths and ids are whole numbers written as floats (``10.0``,
    as a CSV's "12.0" is read; JavaScript and pandas tools write them so) is read as those
    integers. Before: "field 'input_length': expected an integer in [0, 2147483647], got 10.0".
    A fraction (10.5) is still an error naming file, line and field."""
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 1000.0, "output_length": 5.0,
                                "hash_ids": [3.0, 4]}) + "\n")
    requests, _ = run(path, "mooncake")
    [request] = requests
    assert request.prompt.length == 1000 and request.prompt.hash_ids == (3, 4)
    assert request.max_tokens == 5 and isinstance(request.max_tokens, int)
    assert all(type(h) is int for h in request.prompt.hash_ids)
    for field, line in (("input_length", {"input_length": 10.5, "output_length": 5}),
                        ("output_length", {"input_length": 10, "output_length": float("inf")}),
                        ("hash_ids", {"input_length": 10, "output_length": 5,
                                      "hash_ids": [0.5]})):
        path.write_text(json.dumps({"timestamp": 0, **line}) + "\n")
        with pytest.raises(WorkloadFormatError, match=rf"trace.jsonl:1: field '{field}'"):
            run(path, "mooncake")


def test_a_workload_written_as_a_json_array_says_so(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A workload file holding a JSON array of requests (``json.dump(list)``, on one line or
    indented) is refused in one line saying it is an array and a workload file is JSON Lines.
    Before: "a request must be a JSON object, got list" (one line) or "not JSON (Expecting
    value, column 1)" (indented: its first line is "["), neither saying what to change."""
    records = [{"prompt_len": 5, "max_tokens": 3}, {"prompt_len": 6, "max_tokens": 3}]
    for name, indent in (("one.json", None), ("indented.json", 2)):
        path = tmp_path / name
        path.write_text(json.dumps(records, indent=indent))
        for argv in (["workload", "describe", str(path)],
                     ["workload", "import", str(path), "--format", "replayllm", "--out",
                      str(tmp_path / "o.jsonl")]):
            line = _error(capsys, argv)
            assert line.startswith(f"replayllm workload: error: {path}:1: a JSON array, not "
                                   "JSON Lines"), line
            assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("fmt", ["replayllm", "mooncake"])
def test_a_cut_last_line_says_so(tmp_path: Path, fmt: str) -> None:
    """A JSONL file whose last line was cut (a copy or a write interrupted: no line end, the
    JSON unfinished) is an error naming its line and saying it is the last one, cut short.
    Before: only "not JSON (Unterminated string starting at, column 2)"."""
    first = ({"prompt_len": 5, "max_tokens": 3} if fmt == "replayllm" else
             {"timestamp": 0, "input_length": 5, "output_length": 3})
    path = tmp_path / "cut.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(first)[:12])
    with pytest.raises(WorkloadFormatError) as exc:
        if fmt == "replayllm":
            list(read_workload(path))
        else:
            run(path, fmt)
    assert str(exc.value).startswith(f"{path}:2: not JSON (")
    assert "the file's last line, cut short (no line end)" in str(exc.value)
    # the same line with its line end is not called cut
    path.write_text(json.dumps(first) + "\n" + json.dumps(first)[:12] + "\n")
    with pytest.raises(WorkloadFormatError) as exc:
        list(read_workload(path)) if fmt == "replayllm" else run(path, fmt)
    assert "cut short" not in str(exc.value)


@pytest.mark.parametrize(("times", "expected"), [
    (["1715299200.123", "1715299200.5", "1715299201.000000007"], [0.0, 0.377, 0.877000007]),
    (["1715299200123.4", "1715299200500.25"], [0.0, 0.37685]),  # epoch milliseconds
])
def test_epoch_decimals_give_exact_arrivals(tmp_path: Path, times: list[str],
                                           expected: list[float]) -> None:
    """Epoch seconds written with decimals no float holds (``.123``; near 1.7e9 floats are
    238 ns apart) give arrivals exact to the nanosecond: the digits are read, not the float.
    Before: 0.377000093 s for 0.377 s, in the written workload."""
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    + "".join(f"{t},100,10\n" for t in times))
    requests, _ = run(path, "azure")
    assert [r.arrival_s for r in requests] == expected
