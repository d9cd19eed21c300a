"""Options that change times or apply to some workloads only: ``--time-scale`` scales every time
of the traffic (arrivals and think times), is >= 0 (0: everything at once), and an option that
cannot apply (of another format, of later turns without them, of system prompts without them) is
one error, never silently ignored."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.errors import InvalidRequestError
from replay.workloads.arrivals import ArrivalProcess
from replay.workloads.distributions import parse
from replay.workloads.generate import GenerateSpec, Generator
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

CONVERSATION = [
    {"prompt_len": 4, "max_tokens": 2, "arrival_s": 2.0, "conversation_id": "a"},
    {"prompt_len": 4, "max_tokens": 2, "conversation_id": "a", "turn": 1, "think_time_s": 10.0},
    {"prompt_len": 4, "max_tokens": 2, "arrival_s": 3.0},
    {"prompt_len": 4, "max_tokens": 2, "conversation_id": "a", "turn": 2, "think_time_s": 0.5},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def imported(path: Path, fmt: str = "replayllm", **options: object) -> list:
    return list(import_workload(path, fmt, ImportOptions(**options), ImportCounts()))  # type: ignore


def test_time_scale_scales_think_times_as_arrivals(tmp_path: Path) -> None:
    """``--time-scale 0.5`` replays a conversation workload twice as fast: its later turns'
    think times are halved with the arrivals (before: arrivals only, think times kept, so the
    conversations ran at the old pace)."""
    source = write_jsonl(tmp_path / "c.jsonl", CONVERSATION)
    requests = imported(source, time_scale=0.5)
    assert [r.arrival_s for r in requests if not r.turn] == [1.0, 1.5]
    assert [r.think_time_s for r in requests if r.turn] == [5.0, 0.25]
    # the window rebases arrivals only: think times are relative, kept, then scaled
    windowed = imported(source, start_s=2.0, time_scale=4.0)
    assert [(r.arrival_s, r.think_time_s) for r in windowed] == [(0.0, 0.0), (0.0, 40.0),
                                                                (4.0, 0.0), (0.0, 2.0)]
    assert imported(source) == imported(source, time_scale=1.0)


def test_a_think_time_scaled_past_a_week_is_refused_naming_the_scale(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "c.jsonl", CONVERSATION[:2])
    with pytest.raises(InvalidRequestError, match=r"request 2: --time-scale 100000 makes its "
                       r"think time 1e\+06 s: think_time_s must be .* a smaller --time-scale "
                       r"keeps the think times within it"):
        imported(source, time_scale=1e5)


@pytest.mark.parametrize("scale", [-1.0, -1e-300, float("nan"), float("inf")])
def test_a_time_scale_must_be_finite_and_not_negative(scale: float) -> None:
    with pytest.raises(InvalidRequestError, match=r"--time-scale must be a finite number >= 0"):
        ImportOptions(time_scale=scale)


def test_a_time_scale_of_zero_sends_everything_at_once(tmp_path: Path) -> None:
    """0 (and -0.0, which is that 0: before, arrivals were written as -0.0) puts every
    arrival and think time at 0."""
    source = write_jsonl(tmp_path / "c.jsonl", CONVERSATION)
    for scale in (0.0, -0.0):
        times = [(r.arrival_s, r.think_time_s) for r in imported(source, time_scale=scale)]
        assert all(t == 0.0 and math.copysign(1.0, t) == 1.0 for pair in times for t in pair)


@pytest.mark.parametrize("fmt", ["azure", "burstgpt", "sharegpt"])
def test_ignore_unknown_fields_applies_to_mooncake_and_replayllm_only(tmp_path: Path,
                                                                      fmt: str) -> None:
    """CSV columns are read by name (others ignored) and ShareGPT reads its fields only:
    ``--ignore-unknown-fields`` had no effect there (before: accepted silently)."""
    with pytest.raises(InvalidRequestError, match=f"--ignore-unknown-fields applies to --format "
                       f"mooncake and replayllm only, not {fmt}"):
        imported(tmp_path / "any", fmt, ignore_unknown_fields=True)
    source = write_jsonl(tmp_path / "u.jsonl", [{**CONVERSATION[2], "extra": 1}])
    assert len(imported(source, ignore_unknown_fields=True)) == 1


@pytest.mark.parametrize("changes,message", [
    ({"user_len": parse("fixed:5")}, r"--user-len applies to later turns only, and --turns "
     r"fixed:1 gives every conversation one turn"),
    ({"user_len": parse("fixed:5"), "turns": parse("uniform:1,1")}, r"--user-len applies"),
    ({"think_time_s": parse("fixed:2")}, r"--think-time applies to later turns only"),
    ({"think_time_s": parse("exponential:1"), "turns": parse("zipf:2,1")},
     r"--think-time applies"),
    ({"popularity": 0.0}, r"--popularity applies to system prompts only: give --system-prompts"),
    ({"hash_block_size": 8}, r"--hash-block-size applies to system prompts only"),
    ({"system_prompt_len": parse("fixed:3")}, r"--system-prompt-len applies to system prompts"),
])
def test_generate_options_that_cannot_apply_are_errors(changes: dict, message: str) -> None:
    """Before: accepted and without effect (single-turn conversations have no later turn, no
    system prompt has no length, popularity or blocks)."""
    with pytest.raises(InvalidRequestError, match=message):
        GenerateSpec(num_requests=2, **changes)


def test_generate_options_that_apply_are_kept() -> None:
    """A think time of 0 with one turn changes nothing and is accepted; turns that may be 2
    (normal:1,1 rounds to 2 at times) take later-turn options; system prompts take theirs,
    and their defaults are set."""
    GenerateSpec(num_requests=1, think_time_s=parse("fixed:0"))
    GenerateSpec(num_requests=1, turns=parse("normal:1,1"), user_len=parse("fixed:3"),
                 think_time_s=parse("fixed:1"))
    spec = GenerateSpec(num_requests=1, system_prompts=2)
    assert (spec.system_prompt_len, spec.popularity, spec.hash_block_size) == (
        parse("fixed:512"), 1.0, 16)
    assert len(list(Generator(GenerateSpec(num_requests=3, system_prompts=1, popularity=0.0,
                                           hash_block_size=8)))) == 3


@pytest.mark.parametrize("kind", ["constant", "gamma", "poisson"])
def test_an_arrival_process_without_a_rate_is_an_error(kind: str) -> None:
    """Without ``--rate`` every request arrives at 0: ``--arrivals constant``, ``gamma`` (and
    its ``--burstiness``) or ``poisson`` named had no effect (before: accepted)."""
    with pytest.raises(InvalidRequestError, match=f"--arrivals {kind} needs --rate"):
        ArrivalProcess(kind, None, 0.5 if kind == "gamma" else 1.0)
    default = ArrivalProcess()  # none named: Poisson, all at 0 without a rate, as documented
    assert (default.kind, default.rate) == ("poisson", None)
    assert ArrivalProcess(rate=2.0).kind == "poisson"
