"""Chat datasets as ShareGPT imports (session 32, docs/TESTING.md): ShareGPT files whose messages
use ``role``/``content`` keys and OpenAI-style ``messages`` files (many Hugging Face datasets)
read like ShareGPT's ``from``/``value``, with the same roles, system handling and drop counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

# One multi-turn dialogue, as (role in ShareGPT's from/value form, role in the chat form, text).
DIALOGUE = [("system", "system", "Be brief."),
            ("human", "user", "What is a KV cache?"),
            ("gpt", "assistant", "Cached keys and values."),
            ("human", "user", ""),  # a question with no text: its answer is dropped, counted
            ("gpt", "assistant", "An answer to nothing."),
            ("human", "user", "Thanks"),
            ("gpt", "model", "Welcome.")]


def run(path: Path, fmt: str = "sharegpt", **options: object) -> tuple[list, ImportCounts]:
    counts = ImportCounts()
    requests = list(import_workload(path, fmt, ImportOptions(**options), counts))  # type: ignore
    return requests, counts


def turns(requests: list) -> list[tuple[object, ...]]:
    return [(r.prompt, r.max_tokens, r.turn, r.conversation_id, r.arrival_s) for r in requests]


def write(tmp_path: Path, name: str, entries: list[object], lines: bool = False) -> Path:
    path = tmp_path / name
    text = "\n".join(json.dumps(e) for e in entries) + "\n" if lines else json.dumps(entries)
    path.write_text(text)
    return path


def sharegpt_forms(tmp_path: Path) -> dict[str, Path]:
    """The same two conversations (an empty one first) in each form read."""
    from_value = [{"from": a, "value": t} for a, _, t in DIALOGUE]
    role_content = [{"role": b, "content": t} for _, b, t in DIALOGUE]
    return {
        "from/value": write(tmp_path, "fv.json", [{"id": "e", "conversations": []},
                                                  {"id": "d", "conversations": from_value}]),
        "role/content": write(tmp_path, "rc.json", [{"id": "e", "conversations": []},
                                                    {"id": "d", "conversations": role_content}]),
        "messages": write(tmp_path, "m.jsonl", [{"id": "e", "messages": []},
                                                {"id": "d", "messages": role_content}], True),
        "parts": write(tmp_path, "p.jsonl", [{"id": "e", "messages": []}, {"id": "d", "messages": [
            {"role": b, "content": [{"type": "text", "text": t}]} for _, b, t in DIALOGUE]}],
            True),
    }


@pytest.mark.parametrize("form", ["role/content", "messages", "parts"])
def test_role_content_and_messages_files_read_as_sharegpt(tmp_path: Path, form: str) -> None:
    """``{"conversations": [{"role", "content"}]}`` and ``{"messages": [...]}`` (OpenAI chat,
    text parts too) give the very requests and counts of ShareGPT's ``from``/``value`` form:
    the system message goes before the first question, an answer with no question text and an
    empty conversation are dropped and counted (before: 'expected a list of {"from": str,
    "value": str}' and 'not a ShareGPT conversation: no field 'conversations'')."""
    paths = sharegpt_forms(tmp_path)
    expected, expected_counts = run(paths["from/value"], rate=2.0)
    requests, counts = run(paths[form], rate=2.0)
    assert turns(requests) == turns(expected) and len(requests) == 2
    assert counts == expected_counts
    assert counts.dropped == {"empty conversation": 1,
                              "answer with no question text before it": 1}
    from engine.model.checkpoint import default_model_dir
    from engine.model.tokenizer import load_tokenizer

    encode = load_tokenizer(default_model_dir()).encode
    assert requests[0].prompt == (encode("Be brief.", add_special_tokens=False)
                                  + encode("What is a KV cache?", add_special_tokens=False))


def test_tool_roles_and_null_content(tmp_path: Path) -> None:
    """A tool call's answer (content null) is an answer of no text, raised to 1 token and
    counted; the tool's result is the next prompt (its input), as a user message is."""
    path = write(tmp_path, "tools.jsonl", [{"messages": [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "content": "18 C, sunny"},
        {"role": "assistant", "content": "It is 18 C and sunny."}]}], lines=True)
    requests, counts = run(path)
    assert [(r.turn, r.max_tokens) for r in requests][0] == (0, 1) and len(requests) == 2
    assert counts.changed == {"output length 0 raised to 1": 1} and not counts.dropped


@pytest.mark.parametrize("entry, message", [
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "critic", "content": "no"}]},
     r"t.jsonl:1: field 'messages': message 1: unknown role 'critic' \(the prompt side: "
     r"human, user, .*; the answer side: gpt, assistant, .*; a system message: system, "
     r"developer\)$"),
    ({"conversations": [{"role": "user", "text": "hi"}]},
     r"t.jsonl:1: field 'conversations': message 0: expected \{\"from\": str, \"value\": str\} "
     r"or \{\"role\": str, \"content\": str\}, got an object with fields role, text$"),
    ({"messages": "hi"}, r"t.jsonl:1: field 'messages': expected a list of messages, got str$"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     r"t.jsonl:1: field 'messages': message 0: content part 0 is 'image_url': only text "
     r"parts are read$"),
    ({"id": "a", "instruction": "hi", "output": "hello"},
     r"t.jsonl:1: not a ShareGPT conversation: no field 'conversations', 'messages' or "
     r"'conversation' \(fields "
     r"found: id, instruction, output\); workload import reads .*sharegpt \(JSON: "
     r"conversations or messages or conversation\).*$"),
])
def test_malformed_chat_entries_are_one_line(tmp_path: Path, entry: dict, message: str) -> None:
    path = write(tmp_path, "t.jsonl", [entry], lines=True)
    with pytest.raises(WorkloadFormatError) as caught:
        run(path)
    assert "\n" not in str(caught.value)
    assert re.search(message, str(caught.value).replace(str(tmp_path) + "/", "")), \
        str(caught.value)


def test_a_messages_file_given_as_another_format_is_named(tmp_path: Path) -> None:
    """A chat file imported as Mooncake is told to look like --format sharegpt."""
    path = write(tmp_path, "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}],
                 lines=True)
    with pytest.raises(WorkloadFormatError, match=r"fields found: messages\).*this file looks "
                       r"like --format sharegpt$"):
        run(path, "mooncake")


def test_conversations_the_import_drops_whole_are_not_tokenized(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversation past ``--limit`` or outside the window is dropped whole, so its text is
    not tokenized (before: every message of the file was, ~2 ms a conversation: minutes for a
    600 MB ShareGPT file with ``--limit 10``); the counts are those of tokenizing it all, up to
    where reading stops (after the conversation that reaches ``--limit``)."""
    from engine.model import tokenizer as tokenizer_module

    real = tokenizer_module.load_tokenizer
    encoded: list[str] = []

    class Counting:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def encode(self, text: str, **kwargs: object) -> list[int]:
            encoded.append(text)
            return self.inner.encode(text, **kwargs)  # type: ignore[attr-defined]

    monkeypatch.setattr(tokenizer_module, "load_tokenizer", lambda d: Counting(real(d)))
    chat = [{"from": a, "value": t} for a, _, t in DIALOGUE]
    entries = [{"id": str(i), "conversations": [] if i == 3 else chat} for i in range(6)]
    path = write(tmp_path, "sg.json", entries)
    everything, all_counts = run(path)
    assert len(encoded) == 5 * len(DIALOGUE)
    for options, kept in [({"limit": 2}, [0, 1]), ({"rate": 1.0, "start_s": 1e-9, "end_s": 1e9,
                                                     "seed": 3}, [1, 2, 4, 5])]:
        encoded.clear()
        requests, counts = run(path, **options)  # type: ignore[arg-type]
        assert {r.conversation_id for r in requests} == {f"{i}#{i}" for i in kept}
        assert len(encoded) == len(kept) * len(DIALOGUE)
        assert counts.kept == 2 * len(kept)
        assert sum(counts.dropped.values()) == counts.read - counts.kept
        assert counts.read == (all_counts.read if counts.stopped is None else 6)
    encoded.clear()
    _, counts = run(path, limit=2)
    assert counts.dropped == {"answer with no question text before it": 2}  # none read after
    assert counts.stopped.startswith(f"stopped reading at {path}:1: element 1 (--limit 2")
