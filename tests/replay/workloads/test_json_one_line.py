"""JSON files as ``json.dump`` writes them without ``indent``: a whole array on one line.

``json_records`` told an array from JSON Lines by reading the file's first line, which for a
one-line array is the whole file, and ``_ArrayText`` dropped decoded text only at line starts:
a one-line ShareGPT or Mooncake array was held whole (twice its size, as text), where the docs
promise one chunk and one element at a time."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.text_input import ARRAY_CHUNK, PEEK_CHARS, json_records


def _conversations(n: int) -> list[dict[str, object]]:
    return [{"id": f"c{i}", "conversations": [{"from": "human", "value": "hello " * 100},
                                               {"from": "gpt", "value": "ok"}]}
            for i in range(n)]


def test_a_one_line_array_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """An 8 MB array on one line is read holding a few chunks of text, not the file: the peak
    traced memory stays under 6 chunks (it was over twice the file's size), and every element
    comes back, each named by line 1."""
    path = tmp_path / "one_line.json"
    elements = _conversations(12_000)
    path.write_text(json.dumps(elements))
    size = path.stat().st_size
    assert size > 7 * ARRAY_CHUNK  # the bound below is then well under the file
    tracemalloc.start()
    try:
        count = 0
        for where, value in json_records(path):
            assert where == f"{path}:1: element {count}"
            assert value == elements[count]
            count += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == len(elements)
    assert peak < 6 * ARRAY_CHUNK, f"peak {peak:,} bytes for a {size:,}-byte file"


@pytest.mark.parametrize("lines", [False, True])
@pytest.mark.parametrize("mistake", ["value", "delimiter"])
def test_errors_far_into_a_long_line_name_json_s_line_and_column(tmp_path: Path, lines: bool,
                                                                  mistake: str) -> None:
    """Dropping decoded text mid-line keeps the error's line and column those ``json.loads``
    gives for the whole file, on a one-line array and on one whose last line is megabytes."""
    text = json.dumps(_conversations(9_000))
    if lines:  # some elements on lines of their own, the rest on one long line
        text = text.replace('}]}, {"id"', '}]},\n  {"id"', 3_000)
    cut = text.rindex(', {"id"')
    bad = text[:cut] + (", ?" if mistake == "value" else " {") + text[cut + 2:]
    path = tmp_path / "bad.json"
    path.write_text(bad)
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(bad)
    assert len(bad) - bad.rfind("\n") > 2 * ARRAY_CHUNK  # the error lies past a cut
    with pytest.raises(WorkloadFormatError) as error:
        for _ in json_records(path):
            pass
    assert str(error.value) == (f"{path}:{expected.value.lineno}: not a JSON array "
                                f"({expected.value.msg}, column {expected.value.colno})")


def test_json_lines_longer_than_the_peek_keep_their_records_and_lines(tmp_path: Path) -> None:
    """JSON Lines are still read line by line after the peek that tells them from an array:
    blank lines first, a first line far longer than the peek, and CRLF line ends give every
    record whole, named by its line; a first line that is not JSON names what it holds."""
    records = [{"timestamp": i, "input_length": 10_000, "output_length": 3,
                "hash_ids": list(range(i, i + 3 * PEEK_CHARS))} for i in range(3)]
    path = tmp_path / "trace.jsonl"
    path.write_bytes(("\r\n\r\n" + "\r\n".join(json.dumps(r) for r in records) + "\r\n")
                     .encode())
    assert list(json_records(path)) == [(f"{path}:{3 + i}", r) for i, r in enumerate(records)]
    path.write_text("\n TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n")
    with pytest.raises(WorkloadFormatError, match=r"trace.jsonl:2: not JSON .*columns found: "
                       r"TIMESTAMP, ContextTokens, GeneratedTokens"):
        list(json_records(path, "mooncake"))
