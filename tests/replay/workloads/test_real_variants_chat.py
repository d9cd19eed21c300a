"""Chat datasets as users download them (hand-written entries under ``fixtures/`` in each
published layout): ShareGPT_V3_unfiltered_cleaned_split.json (a pretty-printed array; split
conversations that start with an answer, ``system``, ``chatgpt`` and ``bing`` roles, an empty
conversation), LMSYS-Chat-1M and WildChat-1M as their Hugging Face Parquet shards (built here
with their published Arrow types: WildChat's nested ``header`` struct and UTC timestamps)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

FIXTURES = Path(__file__).parent / "fixtures"
HEADER = pa.struct([("accept-language", pa.string()), ("user-agent", pa.string())])
UTC = pa.timestamp("us", tz="UTC")
WILDCHAT_MESSAGE = pa.struct([
    ("content", pa.string()), ("country", pa.string()), ("hashed_ip", pa.string()),
    ("header", HEADER), ("language", pa.string()), ("redacted", pa.bool_()),
    ("role", pa.string()), ("state", pa.string()), ("timestamp", UTC), ("toxic", pa.bool_()),
    ("turn_identifier", pa.int64())])
WILDCHAT = pa.schema([
    ("conversation_hash", pa.string()), ("model", pa.string()), ("timestamp", UTC),
    ("conversation", pa.list_(WILDCHAT_MESSAGE)), ("turn", pa.int64()),
    ("language", pa.string()), ("toxic", pa.bool_()), ("redacted", pa.bool_()),
    ("state", pa.string()), ("country", pa.string()), ("hashed_ip", pa.string()),
    ("header", HEADER)])


def run(path: Path) -> tuple[list[tuple[float, int, str | None, int]], ImportCounts]:
    counts = ImportCounts()
    requests = [(r.arrival_s, r.turn, r.conversation_id, r.max_tokens)
                for r in import_workload(path, "sharegpt", ImportOptions(), counts)]
    return requests, counts


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def _times(value: object) -> object:
    """The fixture's ISO times as the datetimes Arrow's timestamp columns hold."""
    if isinstance(value, dict):
        return {k: _times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_times(v) for v in value]
    if isinstance(value, str) and value.endswith("Z") and value[:4].isdigit():
        return dt.datetime.fromisoformat(value[:-1]).replace(tzinfo=dt.timezone.utc)
    return value


def test_sharegpt_v3_split_file_reads_every_turn_and_counts_the_rest() -> None:
    """The V3 split file: each question and the answer after it is a turn; a split
    conversation's leading answer and an empty conversation are dropped, counted; a system
    message joins the next question's prompt; ``chatgpt`` and ``bing`` are answers."""
    requests, counts = run(FIXTURES / "sharegpt_v3_unfiltered_cleaned_split.json")
    assert [(turn, conversation) for _, turn, conversation, _ in requests] == [
        (0, "QWJhYvA_0#0"), (1, "QWJhYvA_0#0"), (0, "QWJhYvA_1#1"), (0, "i6IyJda_0#2")]
    assert (counts.read, counts.kept) == (6, 4)
    assert counts.dropped == {"answer with no question text before it": 1,
                              "empty conversation": 1}


def test_lmsys_chat_1m_parquet_shard_reads_its_conversations(tmp_path: Path) -> None:
    """LMSYS-Chat-1M's Parquet rows (``conversation_id``, ``conversation`` of
    ``{content, role}``, moderation structs beside) give one turn per user message."""
    out = tmp_path / "train-00000-of-00006.parquet"
    pq.write_table(pa.Table.from_pylist(rows("lmsys_chat_1m_rows.jsonl")), out)
    requests, counts = run(out)
    assert [(turn, conversation) for _, turn, conversation, _ in requests] == [
        (0, "33f01939a744455c869cb234afca47f1#0"), (0, "0f8c1a6e2b7d4e3f9a5c8b1d2e3f4a5b#1"),
        (1, "0f8c1a6e2b7d4e3f9a5c8b1d2e3f4a5b#1")]
    assert (counts.read, counts.kept) == (3, 3)


def test_wildchat_1m_parquet_keeps_its_conversation_hash(tmp_path: Path) -> None:
    """WildChat-1M names a conversation by ``conversation_hash`` (the original WildChat by
    ``conversation_id``): the requests' conversation ids keep it, as LMSYS's and ShareGPT's
    ids are kept. Before: ``#0``, the entry's identity lost. Its messages' nested ``header``
    structs, null fields and UTC timestamps read as they are."""
    out = tmp_path / "train-00000-of-00014.parquet"
    pq.write_table(pa.Table.from_pylist(_times(rows("wildchat_1m_rows.jsonl")),
                                        schema=WILDCHAT), out)
    requests, counts = run(out)
    assert [(turn, conversation) for _, turn, conversation, _ in requests] == [
        (0, "c9ab1e5d2f7a4b6e8d0c3f1a2b4c6d8e#0")]
    assert (counts.read, counts.kept) == (1, 1)


def test_unified_message_structs_with_null_fields_read_as_their_form(tmp_path: Path) -> None:
    """Arrow gives every message of a column one struct type, so a Parquet shard (or the
    JSONL ``datasets`` exports from it) of a chat set whose entries use ``from``/``value`` in
    some and ``role``/``content`` in others holds, in each message, the other form's fields as
    nulls. A null nested field is absent, as a null column is: each message reads in the form
    it has. Before: ``row 1: field 'conversations': message 0: expected {"from": str, "value":
    str} or {"role": str, "content": str}, got an object with fields from, value, role,
    content``, the whole shard refused."""
    entries = [{"id": "a", "conversations": [{"role": "user", "content": "Hi there"},
                                             {"role": "assistant", "content": "Hello"}]},
               {"id": "b", "conversations": [{"from": "human", "value": "Hi there"},
                                             {"from": "gpt", "value": "Hello"}]}]
    table = pa.Table.from_pylist(entries)
    shard = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(table, shard)
    exported = tmp_path / "exported.jsonl"
    exported.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    assert table.to_pylist()[0]["conversations"][0]["from"] is None  # the nulls are there
    for path in (shard, exported):
        requests, counts = run(path)
        assert [(turn, conversation) for _, turn, conversation, _ in requests] == [
            (0, "a#0"), (0, "b#1")]
        assert requests[0][3] == requests[1][3]  # one answer, one length


def test_a_null_conversation_field_beside_another_is_absent(tmp_path: Path) -> None:
    """The JSONL ``datasets`` exports from a shard holding both ``messages`` and
    ``conversation`` columns keeps each row's empty one as ``null``: that field is absent and
    the other is read. Before: ``field 'messages': expected a list of messages, got
    NoneType`` (the Parquet shard itself read, its null columns dropped)."""
    chat = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"}]
    table = pa.Table.from_pylist([
        {"conversation_id": "c0", "conversation": chat, "messages": None},
        {"conversation_id": "c1", "conversation": None, "messages": chat}])
    exported = tmp_path / "exported.jsonl"
    exported.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    assert '"messages": null' in exported.read_text()
    requests, _ = run(exported)
    assert [(turn, conversation) for _, turn, conversation, _ in requests] == [
        (0, "c0#0"), (0, "c1#1")]
