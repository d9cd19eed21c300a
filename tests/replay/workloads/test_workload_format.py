"""The workload file format: JSONL and Parquet round-trip every field; the reader is strict and
its errors name the file, the line (or row) and the field in one line; recipes give identical
token blocks for equal ids at any engine block size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.block_hash import NO_HASH, chain_hash
from engine.errors import InvalidRequestError
from replay.workloads.fields import WorkloadFormatError
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import Request
from replay.workloads.store import WorkloadWriter, load_workload, read_metadata, read_workload

REQUESTS = [
    Request([1, 2, 3], 5, temperature=0.0, ignore_eos=False),
    Request(PromptRecipe((7, 8), 16, 40, salt=3), 9, arrival_s=1.5, conversation_id="c",
            priority=-2),
    Request("hello there", 3, conversation_id="c", turn=1, think_time_s=0.25),
]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_every_field_round_trips_with_metadata(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"w{suffix}"
    writer = WorkloadWriter(path, {"made_by": "test"})
    writer.write_all(REQUESTS)
    writer.close({"counts": {"kept": 3}})
    assert list(read_workload(path)) == REQUESTS
    assert load_workload(str(path)) == REQUESTS
    assert read_metadata(path) == {"replayllm_workload": 1, "made_by": "test",
                                   "counts": {"kept": 3}}


def write_lines(tmp_path: Path, *items: object) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items))
    return path


GOOD = {"prompt_token_ids": [1, 2], "max_tokens": 4}


@pytest.mark.parametrize("record, field, says", [
    ({**GOOD, "ignore_eos": "true"}, "ignore_eos", "true or false"),
    ({**GOOD, "prompt_token_ids": [1, 2.0]}, "prompt_token_ids", "element 1"),
    ({**GOOD, "prompt_token_ids": [1, 2**31]}, "prompt_token_ids", "2147483647"),
    ({**GOOD, "prompt_token_ids": [True]}, "prompt_token_ids", "element 0"),
    ({**GOOD, "prompt_token_ids": []}, "prompt_token_ids", "empty"),
    ({**GOOD, "max_tokens": 0}, "max_tokens", "[1, 1048576]"),
    ({**GOOD, "max_tokens": 2**21}, "max_tokens", "[1, 1048576]"),
    ({**GOOD, "max_tokens": 4.0}, "max_tokens", "integer"),
    ({"prompt_token_ids": [1]}, "max_tokens", "missing"),
    ({**GOOD, "arrival_s": -1}, "arrival_s", "finite"),
    ({**GOOD, "arrival_s": "1"}, "arrival_s", "number"),
    ({**GOOD, "temperature": False}, "temperature", "number"),
    ({**GOOD, "priority": 2**31}, "priority", "2147483647"),
    ({**GOOD, "prompt": "x"}, "prompt", "exactly one"),
    ({"max_tokens": 4}, "prompt_token_ids", "exactly one"),
    ({**GOOD, "hash_ids": [1]}, "hash_ids", "recipe"),
    ({"prompt_len": 10, "hash_ids": [1, 2, 3, 4], "hash_block_size": 4, "max_tokens": 1},
     "hash_ids", "has 3"),
    ({"prompt_len": 10, "hash_ids": [1], "max_tokens": 1}, "hash_block_size", "missing"),
    ({**GOOD, "turn": 1}, "turn", "conversation_id"),
    ({**GOOD, "turn": 1, "conversation_id": "a", "arrival_s": 2.0}, "arrival_s", "later turn"),
    ({**GOOD, "think_time_s": 1.0}, "think_time_s", "later turns"),
    ({**GOOD, "conversation_id": True}, "conversation_id", "string"),
    ({**GOOD, "colour": "blue"}, "colour", "unknown field"),
])
def test_a_malformed_record_names_file_line_and_field(tmp_path: Path, record: dict, field: str,
                                                      says: str) -> None:
    path = write_lines(tmp_path, GOOD, record)
    with pytest.raises(WorkloadFormatError) as caught:
        list(read_workload(path))
    message = str(caught.value)
    assert isinstance(caught.value, InvalidRequestError)
    assert message.startswith(f"{path}:2: field {field!r}") and says in message, message
    assert "\n" not in message


def test_non_finite_and_non_json_lines_are_errors(tmp_path: Path) -> None:
    path = write_lines(tmp_path, GOOD, '{"prompt_token_ids": [1], "max_tokens": 1, '
                       '"arrival_s": NaN}', "{oops")
    with pytest.raises(WorkloadFormatError, match=r"bad.jsonl:2: field 'arrival_s'"):
        list(read_workload(path))
    path = write_lines(tmp_path, GOOD, "{oops")
    with pytest.raises(WorkloadFormatError, match=r"bad.jsonl:2: not JSON"):
        list(read_workload(path))


def test_unknown_fields_are_read_past_only_when_asked(tmp_path: Path) -> None:
    path = write_lines(tmp_path, {**GOOD, "colour": "blue"})
    assert list(read_workload(path, ignore_unknown_fields=True)) == [
        Request([1, 2], 4, ignore_eos=False)]


def test_turns_must_follow_in_order_and_versions_are_checked(tmp_path: Path) -> None:
    first = {**GOOD, "conversation_id": "a"}
    path = write_lines(tmp_path, first, {**GOOD, "conversation_id": "a", "turn": 2})
    with pytest.raises(WorkloadFormatError, match=r":2: field 'turn': .*expects turn 1"):
        list(read_workload(path))
    path = write_lines(tmp_path, {"replayllm_workload": 99}, GOOD)
    with pytest.raises(WorkloadFormatError, match=r"bad.jsonl:1: workload format version 99"):
        list(read_workload(path))


def test_a_parquet_row_with_a_wrong_type_names_the_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    table = pa.table({"prompt_token_ids": [[1], [2]], "max_tokens": [3.0, 4.5]})
    pq.write_table(table, path)  # no metadata: read as version 1, like a header-less JSONL
    with pytest.raises(WorkloadFormatError, match=r"bad.parquet:row 1: field 'max_tokens': "
                       "must be an integer"):
        list(read_workload(path))


def _block_hashes(tokens: list[int], block: int) -> list[int]:
    out, parent = [], NO_HASH
    for start in range(0, len(tokens) - block + 1, block):
        parent = chain_hash(tokens[start:start + block], parent, 0)
        out.append(parent)
    return out


@pytest.mark.parametrize("engine_block", [16, 48, 512, 1000])
def test_equal_hash_ids_give_identical_blocks_at_any_engine_block_size(engine_block: int) -> None:
    a = PromptRecipe((5, 6, 7), 512, 1400, salt=1)
    b = PromptRecipe((5, 6, 9), 512, 1536, salt=2)  # shares two 512-token blocks with a
    c = PromptRecipe((4, 6, 7), 512, 1400, salt=1)  # a different first block: shares nothing
    ha, hb, hc = (_block_hashes(r.token_ids(), engine_block) for r in (a, b, c))
    shared = sum(x == y for x, y in zip(ha, hb))
    assert shared == 1024 // engine_block  # exactly the engine blocks inside the shared ids
    assert not set(ha) & set(hc)
    # describe's keys without tokens agree with the engine's hashes block for block
    for x, y in ((a, b), (a, c), (b, c)):
        keys = [x.block_keys(engine_block), y.block_keys(engine_block)]
        hashes = [_block_hashes(r.token_ids(), engine_block) for r in (x, y)]
        assert [k1 == k2 for k1, k2 in zip(*keys)] == [h1 == h2 for h1, h2 in zip(*hashes)]
    tokens = np.asarray(a.token_ids())
    assert tokens.min() >= 0 and tokens.max() < 10000 and len(tokens) == 1400
    assert a.clipped(700).token_ids() == a.token_ids()[:700]


DEEP = "[" * 100_000 + "]" * 100_000
LONG_INT = "9" * 5_000


@pytest.mark.parametrize("line, needle", [
    ('{"prompt_token_ids": ' + DEEP + ', "max_tokens": 2}', "nested too deeply"),
    (DEEP, "nested too deeply"),
    ('{"prompt_token_ids": [1], "max_tokens": ' + LONG_INT + "}", "a number too long to read"),
    ('{"prompt_token_ids": [' + LONG_INT + '], "max_tokens": 2}', "a number too long to read"),
])
def test_json_the_parser_cannot_take_is_a_format_error(tmp_path: Path, line: str,
                                                       needle: str) -> None:
    """A line nested past the recursion limit or holding an integer of over 4,300 digits was a
    RecursionError / ValueError traceback from every command reading a workload (describe,
    import, loadgen, whatif --stream); now one line naming the file and line."""
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_token_ids": [1], "max_tokens": 2}\n' + line + "\n")
    with pytest.raises(WorkloadFormatError, match=rf"w\.jsonl:2: not JSON \({needle}"):
        list(read_workload(path))
    path.write_text(line + "\n")  # as a first line: no header, not an exception
    assert read_metadata(path) == {}
