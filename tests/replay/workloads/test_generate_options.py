"""``replayllm workload generate`` options that are zero, negative, contradictory or extreme:
each is one clear error, or every value it changes is counted and the file reads back."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import InvalidRequestError
from replay.workloads.arrivals import ArrivalProcess
from replay.workloads.distributions import parse
from replay.workloads.fields import MAX_TOKENS_LIMIT
from replay.workloads.generate import GenerateSpec, Generator
from replay.workloads.store import WorkloadWriter, read_workload


@pytest.mark.parametrize("option,spec,message", [
    ("prompt_len", "fixed:0", r"--prompt-len: 'fixed:0': every value lies outside \[1, 1048576\]"),
    ("output_len", "exponential:0", r"--output-len: 'exponential:0': every value lies outside"),
    ("turns", "fixed:0", r"--turns: 'fixed:0': every value lies outside \[1, 65536\]"),
    ("prompt_len", "normal:-100,0", r"--prompt-len: 'normal:-100,0': every value lies outside"),
    ("prompt_len", "fixed:5e6", r"--prompt-len: 'fixed:5e6': every value lies outside"),
    ("prompt_len", "uniform:1,1e300", r"uniform takes integers LO,HI in \[0, 9007199254740992\]"),
    ("think_time_s", "uniform:0.5,1.5", r"uniform takes integers"),
])
def test_distributions_that_cannot_give_a_valid_value_are_errors(option: str, spec: str,
                                                                 message: str) -> None:
    """A length or turn distribution whose every value is out of range (before: silently all
    clipped to 1 or 2^20, a zero-token prompt becoming one token), a uniform bound too large for
    the integer sampler (before: a numpy traceback) and non-integer uniform bounds (before:
    silently truncated, so ``--think-time uniform:0.5,1.5`` drew 0 or 1) are errors."""
    with pytest.raises(InvalidRequestError, match=message):
        Generator(GenerateSpec(num_requests=1, **{option: parse(spec, f"--{option}")}))


@pytest.mark.parametrize("process,message", [
    (lambda: ArrivalProcess("poisson", 2.0, schedule="times.txt"),
     "--schedule needs --arrivals schedule, not poisson"),
    (lambda: ArrivalProcess("poisson", 2.0, burstiness=0.5),
     "--burstiness applies to --arrivals gamma, not poisson"),
    (lambda: ArrivalProcess("schedule", 2.0, schedule="times.txt"),
     "--rate does not apply to --arrivals schedule"),
])
def test_contradictory_arrival_options_are_errors(process: object, message: str) -> None:
    """An option the chosen arrival process would ignore (a schedule file without
    ``--arrivals schedule``, a burstiness without gamma, a rate with a schedule) is an error
    (before: silently ignored)."""
    with pytest.raises(InvalidRequestError, match=message):
        process()  # type: ignore[operator]


def test_an_unsorted_schedule_and_an_overflowing_rate_are_errors(tmp_path: Path) -> None:
    """A schedule whose times go back (before: first turns written out of arrival order) and a
    rate so small that arrival times overflow to infinity (before: ``arrival_s: Infinity``
    written, a file no reader accepts) are errors."""
    schedule = tmp_path / "times.txt"
    schedule.write_text("1\n0.5\n2\n")
    with pytest.raises(InvalidRequestError, match=r"times.txt:2: 0.5 is before the time above "
                       r"it \(1\)"):
        list(Generator(GenerateSpec(3, ArrivalProcess("schedule", schedule=str(schedule)))))
    with pytest.raises(InvalidRequestError, match="makes arrival times overflow"):
        list(Generator(GenerateSpec(3, ArrivalProcess("constant", 1e-320))))


@pytest.mark.parametrize("changes,message", [
    ({"temperature": float("nan")}, "--temperature must be a finite number >= 0"),
    ({"temperature": -1.0}, "--temperature must be a finite number >= 0"),
    ({"system_prompts": 3, "popularity": float("nan")}, "--popularity must be finite"),
    # 10**20 was a numpy "Maximum allowed dimension exceeded" traceback; 10**9 ran out of memory
    # making every system prompt before the first request
    ({"system_prompts": 10**20}, "--system-prompts must be at most 65,536"),
    ({"system_prompts": 10**9}, "--system-prompts must be at most 65,536"),
])
def test_settings_the_file_format_refuses_are_errors(changes: dict, message: str) -> None:
    """A temperature that is NaN or negative (before: written, then refused by every reader)
    and a NaN popularity (before: a numpy traceback) are errors at once."""
    with pytest.raises(InvalidRequestError, match=message):
        GenerateSpec(num_requests=1, **changes)


def test_values_clipped_after_drawing_are_counted_and_the_file_reads_back(
        tmp_path: Path) -> None:
    """A system prompt plus the request's own tokens over 2^20 is clipped to 2^20 (before: a
    prompt_len the reader refuses), and negative think times raised to 0 are counted like
    clipped lengths (before: silently)."""
    spec = GenerateSpec(num_requests=4, system_prompts=1,
                        system_prompt_len=parse("fixed:1048576"), prompt_len=parse("fixed:10"),
                        turns=parse("fixed:3"), think_time_s=parse("normal:0,5"), seed=1)
    generator = Generator(spec)
    out = tmp_path / "w.jsonl"
    writer = WorkloadWriter(out)
    writer.write_all(generator)
    writer.close()
    requests = list(read_workload(out))
    firsts = [r for r in requests if r.turn == 0]
    assert [len(r.prompt) for r in firsts] == [MAX_TOKENS_LIMIT] * 4
    assert generator.counts.clipped["prompt_len (with its system prompt)"] == 4
    negative = sum(r.think_time_s == 0 for r in requests if r.turn)
    assert negative > 0 and generator.counts.clipped["think_time_s"] == negative


def test_the_same_generate_command_twice_writes_the_same_file(tmp_path: Path) -> None:
    """Two runs of one ``replayllm workload generate`` command write byte-identical files."""
    from replay.cli.main import main

    args = ["workload", "generate", "--num-requests", "300", "--rate", "5", "--arrivals",
            "gamma", "--burstiness", "0.3", "--system-prompts", "4", "--turns", "uniform:1,3",
            "--think-time", "exponential:2", "--prompt-len", "lognormal:300,1", "--seed", "7",
            "--out", str(tmp_path / "w.jsonl")]
    assert main(args) == 0
    first = (tmp_path / "w.jsonl").read_bytes()
    assert main(args) == 0
    assert (tmp_path / "w.jsonl").read_bytes() == first
