"""``--max-prompt-len`` holds for the prompt a later turn is sent with, its history included.

A later turn of a conversation is sent with the previous turns' prompts and answers before its
own new tokens (docs/workloads.md, "Conversations"). Before, ``workload import --max-prompt-len
L`` compared only the new tokens with L: a third turn of 100 new tokens after two turns of 100
tokens and 50-token answers was kept though it is sent as a 400-token prompt, so a user capping
prompts at 300 got prompts of 400 (and, on long ShareGPT conversations, far past any limit).
Now the history (each earlier turn's prompt plus its ``max_tokens``, the most the engine can
answer) counts: such a turn is dropped, or with ``--over-length clip`` keeps only the new tokens
that fit, and a turn with no room left is dropped with the rest of its conversation.
"""

from __future__ import annotations

import json
from pathlib import Path

from replay.workloads.import_options import LATER_TURN, ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

DROPPED = "prompt over {} tokens with its conversation's history"
CLIPPED = "prompt clipped to {} tokens with its conversation's history"


def _conversations(tmp_path: Path) -> Path:
    """Conversation ``a``: three turns of 100 new tokens, answers of 50; ``b``: one turn of
    280 tokens (a first turn: no history)."""
    rows = [{"prompt_len": 100, "max_tokens": 50, "salt": 1, "conversation_id": "a", "turn": t}
            for t in range(3)]
    rows.insert(1, {"prompt_len": 280, "max_tokens": 5, "salt": 2, "conversation_id": "b"})
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _import(path: Path, **options: object) -> tuple[list, ImportCounts]:
    counts = ImportCounts()
    kept = list(import_workload(path, "replayllm", ImportOptions(**options), counts))  # type: ignore[arg-type]
    return kept, counts


def _sent_lengths(requests: list) -> list[int]:
    """Each kept request's prompt as it is sent: its conversation's history, then its own."""
    history: dict[str, int] = {}
    lengths = []
    for request in requests:
        before = history.get(request.conversation_id, 0) if request.turn else 0
        lengths.append(before + request.prompt_len)
        history[request.conversation_id] = before + request.prompt_len + request.max_tokens
    return lengths


def test_a_later_turn_over_the_limit_with_its_history_is_dropped(tmp_path: Path) -> None:
    """L = 300: turn 1 is sent with 250 tokens (kept), turn 2 with 400 (dropped, counted as a
    prompt over the limit with its history); the 280-token first turn is within it."""
    kept, counts = _import(_conversations(tmp_path), max_prompt_len=300)
    assert [(r.conversation_id, r.turn) for r in kept] == [("a", 0), ("b", 0), ("a", 1)]
    assert max(_sent_lengths(kept)) <= 300
    assert counts.dropped == {DROPPED.format(300): 1}


def test_clip_keeps_the_new_tokens_that_fit_after_the_history(tmp_path: Path) -> None:
    """L = 350, clip: turn 2's history is 300 tokens, so 50 of its 100 new tokens are kept."""
    kept, counts = _import(_conversations(tmp_path), max_prompt_len=350, over_length="clip")
    assert [(r.conversation_id, r.turn, r.prompt_len) for r in kept] == [
        ("a", 0, 100), ("b", 0, 280), ("a", 1, 100), ("a", 2, 50)]
    assert _sent_lengths(kept)[-1] == 350
    assert counts.changed == {CLIPPED.format(350): 1} and counts.dropped == {}


def test_a_turn_whose_history_fills_the_limit_ends_its_conversation(tmp_path: Path) -> None:
    """L = 260, clip: turn 1's history (150) leaves room for 110 > 100 (kept whole); turn 2's
    (300) leaves none: dropped even under clip. L = 140, clip: turn 1 has no room, and turn 2
    follows a turn not kept (dropped as such)."""
    kept, counts = _import(_conversations(tmp_path), max_prompt_len=260, over_length="clip")
    assert [(r.conversation_id, r.turn) for r in kept] == [("a", 0), ("b", 0), ("a", 1)]
    assert counts.dropped == {DROPPED.format(260): 1}
    kept, counts = _import(_conversations(tmp_path), max_prompt_len=140, over_length="clip")
    assert [(r.conversation_id, r.turn, r.prompt_len) for r in kept] == [
        ("a", 0, 100), ("b", 0, 140)]
    assert counts.dropped == {DROPPED.format(140): 1, LATER_TURN: 1}
    assert counts.changed == {"prompt clipped to 140 tokens": 1}


def test_without_a_limit_every_turn_is_kept_unchanged(tmp_path: Path) -> None:
    """No --max-prompt-len: the history counts against nothing but the format's own limit."""
    kept, counts = _import(_conversations(tmp_path))
    assert [r.prompt_len for r in kept] == [100, 280, 100, 100]
    assert counts.dropped == {} and counts.changed == {}
