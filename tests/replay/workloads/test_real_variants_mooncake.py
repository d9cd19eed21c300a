"""Mooncake-style JSONL traces as published (hand-written rows under ``fixtures/``): the
FAST'25 conversation and tool-agent traces (integer ``timestamp`` in ms, quantised to about
3 s, 512-token ``hash_ids`` blocks) and Alibaba Bailian's ``qwen_trace*_blksz_16.jsonl``
(qwen-bailian-usagetraces-anon, ATC'25): Mooncake's fields plus ``chat_id``,
``parent_chat_id``, ``type`` and ``turn``, its ``timestamp`` in SECONDS (``61.114``) and its
``hash_ids`` of 16-token blocks (``--block-size 16``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

FIXTURES = Path(__file__).parent / "fixtures"


def run(path: Path, **options: object) -> list[tuple[float, int, int, tuple[int, ...], int]]:
    requests = import_workload(path, "mooncake", ImportOptions(**options),  # type: ignore
                               ImportCounts())
    return [(r.arrival_s, r.prompt_len, r.max_tokens, r.prompt.hash_ids, r.prompt.block_size)
            for r in requests]


def test_fast25_conversation_trace_reads_milliseconds_and_512_token_blocks() -> None:
    """The FAST'25 layout: ``timestamp`` ms from the start, ``hash_ids`` of 512 tokens."""
    assert run(FIXTURES / "mooncake_fast25_conversation.jsonl") == [
        (0.0, 1100, 500, (0, 1, 2), 512), (0.0, 1300, 490, (0, 3, 4), 512),
        (3.0, 900, 71, (0, 5), 512), (5.999, 512, 26, (0,), 512)]


def test_bailian_trace_reads_seconds_and_its_fields() -> None:
    """A Bailian record (told by its ``chat_id``) has its ``timestamp`` in seconds: the
    request at 61.114 s arrives at 61.114 s, and its Bailian fields are known (no
    --ignore-unknown-fields needed). Before: the file was refused (``field 'chat_id': unknown
    field``), and read past it with --ignore-unknown-fields every arrival was read as
    milliseconds: 61.114 s came out 0.061 s, the trace 1000 times too fast."""
    bailian = FIXTURES / "bailian_qwen_trace_blksz_16.jsonl"
    assert run(bailian, block_size=16) == [
        (0.0, 40, 12, (0, 1, 2), 16), (1.52, 33, 7, (3, 4, 5), 16),
        (61.114, 70, 8, (0, 1, 2, 6, 7), 16)]
    flags = run(bailian, ignore_unknown_fields=True, block_size=16)
    assert flags[2][0] == 61.114  # the flag that read past the fields reads the same times


def test_a_bailian_trace_at_mooncake_block_size_names_16() -> None:
    """The block size is given as for any Mooncake file (the CLI records its default, 512, in
    the output's header); at 512 a Bailian file's ids are too many, and the one-line error
    says which block size its traces use."""
    with pytest.raises(WorkloadFormatError, match=r"blksz_16.jsonl:1: field 'hash_ids': 3 ids "
                       r"for 40 tokens at --block-size 512 .* Bailian trace's blocks are 16 "
                       r"tokens: --block-size 16\)$"):
        run(FIXTURES / "bailian_qwen_trace_blksz_16.jsonl")


def test_a_file_mixing_bailian_and_mooncake_records_is_one_line(tmp_path: Path) -> None:
    """Seconds and milliseconds cannot share a file: a record of the other layout is an error
    naming its line and the first record's, not a time read in the wrong unit."""
    lines = (FIXTURES / "bailian_qwen_trace_blksz_16.jsonl").read_text().splitlines()
    mooncake = {"timestamp": 3000, "input_length": 40, "output_length": 5, "hash_ids": [0]}
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines[:2] + [json.dumps(mooncake)]) + "\n")
    with pytest.raises(WorkloadFormatError, match=r"mixed.jsonl:3: no field 'chat_id'.*"
                       r"mixed.jsonl:1.*seconds.*milliseconds"):
        run(path, block_size=16)


def test_an_unknown_field_beside_bailian_fields_is_still_an_error(tmp_path: Path) -> None:
    """Only Bailian's own fields are known in a Bailian record: another is still refused."""
    record = json.loads((FIXTURES / "bailian_qwen_trace_blksz_16.jsonl").read_text()
                        .splitlines()[0])
    path = tmp_path / "extra.jsonl"
    path.write_text(json.dumps({**record, "user_id": 3}) + "\n")
    with pytest.raises(WorkloadFormatError, match=r"extra.jsonl:1: field 'user_id': unknown"):
        run(path, block_size=16)
