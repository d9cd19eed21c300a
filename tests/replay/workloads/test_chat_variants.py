"""Chat datasets in layouts the ShareGPT importer was not tuned to (session 33,
docs/TESTING.md): LMSYS-Chat-1M's ``conversation`` field, messages whose text is absent or null
(ShareGPT dumps, OpenAI tool calls), an entry holding both ``conversations`` and ``messages``,
and errors in a pretty-printed JSON array naming the line of the element."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

QUESTION, ANSWER = "What is a KV cache?", "Cached keys and values."


def run(path: Path) -> tuple[list[tuple[object, ...]], ImportCounts]:
    counts = ImportCounts()
    requests = [(r.prompt, r.max_tokens, r.turn, r.conversation_id)
                for r in import_workload(path, "sharegpt", ImportOptions(), counts)]
    return requests, counts


def write_lines(path: Path, entries: list[object]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def test_lmsys_conversation_field_reads_as_messages(tmp_path: Path) -> None:
    """An LMSYS-Chat-1M (or WildChat) row, ``{"conversation_id", "conversation": [{"role",
    "content"}], "model", ...}``, gives the requests of the same messages under ``messages``,
    its ``conversation_id`` naming the conversation. Before: ``not a ShareGPT conversation: no
    field 'conversations' or 'messages'``."""
    chat = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}]
    lmsys = write_lines(tmp_path / "lmsys.jsonl", [{
        "conversation_id": "c7", "model": "vicuna-13b", "conversation": chat, "turn": 1,
        "language": "English", "openai_moderation": [], "redacted": False}])
    messages = write_lines(tmp_path / "m.jsonl", [{"id": "c7", "messages": chat}])
    assert run(lmsys) == run(messages)
    assert run(lmsys)[0][0][3] == "c7#0"


@pytest.mark.parametrize("absent", [
    {"from": "gpt"}, {"from": "gpt", "value": None}, {"from": "gpt", "markdown": None},
    {"role": "assistant", "tool_calls": [{"id": "1"}]}, {"role": "assistant", "content": None},
])
def test_a_message_without_text_is_an_empty_message(tmp_path: Path, absent: dict) -> None:
    """A message whose text is absent or null, beside its role and fields that hold no text
    (ShareGPT's ``markdown``, OpenAI's ``tool_calls``), is a message of no text, as
    ``content: null`` was: an answer of 0 tokens raised to 1 and counted. Before: a ShareGPT
    file with one such message (``{"from": "gpt"}``, ``"value": null``) failed whole:
    ``expected {"from": str, "value": str} ..., got an object with fields from``."""
    key = "from" if "from" in absent else "role"
    question = {key: "human" if key == "from" else "user",
                ("value" if key == "from" else "content"): QUESTION}
    path = write_lines(tmp_path / "t.jsonl", [{"conversations": [question, absent]}])
    requests, counts = run(path)
    assert [r[1:3] for r in requests] == [(1, 0)]
    assert counts.changed == {"output length 0 raised to 1": 1}


def test_a_question_without_text_drops_its_answer_counted(tmp_path: Path) -> None:
    """An absent question's text is no question: its answer is dropped and counted, as an
    empty question's is."""
    path = write_lines(tmp_path / "t.jsonl", [{"conversations": [
        {"from": "human"}, {"from": "gpt", "value": ANSWER},
        {"from": "human", "value": QUESTION}, {"from": "gpt", "value": ANSWER}]}])
    requests, counts = run(path)
    assert len(requests) == 1 and counts.dropped == {"answer with no question text before it": 1}


@pytest.mark.parametrize("message", [{"role": "user", "text": "hi"},
                                     {"from": "human", "msg": "hi"}])
def test_text_under_another_name_is_still_an_error(tmp_path: Path, message: dict) -> None:
    """A field beside an absent text that may be the text under another name is still the
    one-line error naming the fields, never a message read as empty."""
    path = write_lines(tmp_path / "t.jsonl", [{"conversations": [message]}])
    with pytest.raises(WorkloadFormatError, match=r"t.jsonl:1: field 'conversations': message 0: "
                       r"expected .* got an object with fields"):
        run(path)


def test_both_conversation_fields_holding_one_conversation_read_once(tmp_path: Path) -> None:
    """An entry with ``conversations`` and ``messages`` holding the same messages (roles by
    side: ``human`` is ``user``) reads as one of them, each turn once."""
    both = write_lines(tmp_path / "both.jsonl", [{
        "conversations": [{"from": "human", "value": QUESTION}, {"from": "gpt", "value": ANSWER}],
        "messages": [{"role": "user", "content": QUESTION},
                     {"role": "assistant", "content": ANSWER}]}])
    one = write_lines(tmp_path / "one.jsonl", [{"messages": [
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}]}])
    assert run(both) == run(one) and len(run(both)[0]) == 1


@pytest.mark.parametrize("messages, differ", [
    ([{"role": "user", "content": "Another question"}, {"role": "assistant", "content": ANSWER}],
     r"message 0 differs"),
    ([{"role": "user", "content": QUESTION}], r"2 and 1 messages"),
    ([{"role": "assistant", "content": QUESTION}, {"role": "assistant", "content": ANSWER}],
     r"message 0 differs"),
])
def test_both_conversation_fields_differing_is_one_line(tmp_path: Path, messages: list,
                                                        differ: str) -> None:
    """An entry whose ``conversations`` and ``messages`` differ is one line naming the line,
    both fields and the first difference. Before: ``conversations`` was read, ``messages``
    ignored in silence."""
    path = write_lines(tmp_path / "t.jsonl", [{
        "conversations": [{"from": "human", "value": QUESTION}, {"from": "gpt", "value": ANSWER}],
        "messages": messages}])
    with pytest.raises(WorkloadFormatError, match=r"t.jsonl:1: fields 'conversations' and "
                       r"'messages' hold different conversations \(" + differ + r"\): keep one"):
        run(path)


def test_an_array_elements_error_names_its_line(tmp_path: Path) -> None:
    """In a pretty-printed JSON array (ShareGPT's usual form) an element's error names the
    line it starts on, also past the reader's 1 MB chunks. Before: ``sg.json: element N``, no
    line (a 600 MB file has some 15 million)."""
    good = {"id": "x" * 2000, "conversations": [{"from": "human", "value": QUESTION},
                                                {"from": "gpt", "value": ANSWER}]}
    entries: list[object] = [good] * 1200 + [{"id": "bad", "conversations": [5]}]
    text = json.dumps(entries, indent=2)
    assert len(text) > 2 << 20  # the bad element lies past two chunks
    path = tmp_path / "sg.json"
    path.write_text(text)
    line = text[:text.index('"bad"')].count("\n")  # the element's "{" is the line above
    with pytest.raises(WorkloadFormatError, match=rf"sg.json:{line}: element 1200: field "
                       r"'conversations': message 0: expected"):
        run(path)


def test_parquet_chat_and_mooncake_files_read_as_their_jsonl(tmp_path: Path) -> None:
    """LMSYS-Chat-1M and WildChat ship as Parquet only (Hugging Face), as many chat sets do: a
    Parquet file of the records reads as its JSONL (a null column an absent field, the rows
    named ``path:row N``). Before: ``not UTF-8 text (invalid start byte at byte 19)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chat = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}]
    rows = [{"conversation_id": f"c{i}", "conversation": chat, "messages": None}
            for i in range(3)]
    parquet = tmp_path / "train-00000-of-00006.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    jsonl = write_lines(tmp_path / "chat.jsonl",
                        [{"conversation_id": f"c{i}", "conversation": chat} for i in range(3)])
    assert run(parquet) == run(jsonl) and len(run(parquet)[0]) == 3
    records = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
               {"timestamp": 3000, "input_length": 512, "output_length": 7, "hash_ids": None}]
    moon = tmp_path / "trace.parquet"
    pq.write_table(pa.Table.from_pylist(records), moon)
    moon_jsonl = write_lines(tmp_path / "trace.jsonl", records)

    def mooncake(path: Path) -> list[object]:
        return list(import_workload(path, "mooncake", ImportOptions(), ImportCounts()))
    assert mooncake(moon) == mooncake(moon_jsonl)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"timestamp": 0, "input_length": -1,
                                          "output_length": 5}]), bad)
    with pytest.raises(WorkloadFormatError, match=r"bad.parquet:row 1: field 'input_length'"):
        mooncake(bad)
    with pytest.raises(WorkloadFormatError, match=r"trace.parquet: a Parquet file, not text: "
                       r"azure and burstgpt read CSV"):
        list(import_workload(moon, "azure", ImportOptions(), ImportCounts()))
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(moon.read_bytes()[:40])
    with pytest.raises(WorkloadFormatError, match=r"cut.parquet: not a readable Parquet file"):
        mooncake(cut)


def test_long_or_odd_ids_make_conversation_ids_the_reader_takes(tmp_path: Path) -> None:
    """An entry id of 300 characters became a ``conversation_id`` of 302 that the import wrote
    and every reader of the file then refused (``must be a string of 1 to 256 characters``);
    it is now cut to fit, ``#INDEX`` keeping it unique, and the written file reads back. A null
    or object id (``None#1``, ``{'a': 1}#2``) is left out (``#1``)."""
    from replay.workloads.store import WorkloadWriter, read_workload

    chat = [{"from": "human", "value": QUESTION}, {"from": "gpt", "value": ANSWER}]
    path = write_lines(tmp_path / "t.jsonl", [{"id": "x" * 300, "conversations": chat},
                                              {"id": None, "conversations": chat},
                                              {"id": {"a": 1}, "conversations": chat},
                                              {"id": 7, "conversations": chat}])
    requests = list(import_workload(path, "sharegpt", ImportOptions(), ImportCounts()))
    assert [r.conversation_id for r in requests] == ["x" * 254 + "#0", "#1", "#2", "7#3"]
    out = tmp_path / "w.jsonl"
    writer = WorkloadWriter(out)
    writer.write_all(requests)
    writer.close()
    assert list(read_workload(out)) == requests


def test_a_conversation_with_a_lone_surrogate_is_dropped_counted(tmp_path: Path) -> None:
    """JSON text may hold a lone surrogate (``"\\ud83d"`` without its pair: an emoji cut in a
    scraped dump); the tokenizer raised ``TypeError: TextInputSequence must be str``, a
    traceback ending the import. Such a conversation is now dropped whole, each turn counted;
    a surrogate pair (``"\\ud83d\\ude00"``, one emoji) reads as the character."""
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"id": "a", "conversations": [{"from": "human", "value": "fine"}, {"from": "gpt", '
        '"value": "ok"}]}\n'
        '{"id": "s", "conversations": [{"from": "human", "value": "hi \\ud83d"}, {"from": '
        '"gpt", "value": "ok"}, {"from": "human", "value": "more"}, {"from": "gpt", '
        '"value": "yes"}]}\n'
        '{"id": "p", "conversations": [{"from": "human", "value": "pair \\ud83d\\ude00"}, '
        '{"from": "gpt", "value": "ok"}]}\n')
    requests, counts = run(path)
    assert [r[3] for r in requests] == ["a#0", "p#2"]
    assert counts.dropped == {"text with a lone surrogate, not Unicode": 1,
                              "later turn of a conversation not kept": 1}


def test_a_workload_text_prompt_with_a_lone_surrogate_names_its_line(tmp_path: Path) -> None:
    """A workload file's text prompt holding a lone surrogate is refused where it is read, by
    file, line and field (before: read, then ``run`` failed with ``a prompt is not valid
    Unicode text``, naming no request)."""
    from replay.workloads.store import read_workload

    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "ok", "max_tokens": 2}\n{"prompt": "hi \\ud83d", '
                    '"max_tokens": 2}\n')
    with pytest.raises(WorkloadFormatError, match=r"w.jsonl:2: field 'prompt': holds a lone "
                       r"surrogate"):
        list(read_workload(path))


def test_responses_api_text_parts_read_as_text_parts(tmp_path: Path) -> None:
    """Content parts of the OpenAI Responses API (``input_text`` in a question,
    ``output_text`` in an answer) are text, as chat's ``text`` parts are (before: ``content
    part 0 is 'input_text': only text parts are read``); an image part stays an error."""
    def chat(question: str, answer: str) -> list[dict]:
        return [{"role": "user", "content": [{"type": question, "text": QUESTION}]},
                {"role": "assistant", "content": [{"type": answer, "text": ANSWER}]}]
    responses = write_lines(tmp_path / "r.jsonl", [{"messages": chat("input_text",
                                                                     "output_text")}])
    parts = write_lines(tmp_path / "p.jsonl", [{"messages": chat("text", "text")}])
    assert run(responses) == run(parts) and len(run(parts)[0]) == 1
    image = write_lines(tmp_path / "i.jsonl", [{"messages": chat("input_image", "text")}])
    with pytest.raises(WorkloadFormatError, match="content part 0 is 'input_image': only text"):
        run(image)
