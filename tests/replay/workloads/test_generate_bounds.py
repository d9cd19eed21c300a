"""``workload generate``'s counts and sizes are bounded, each past its bound one
line and exit 2 before anything is written, and ``--schedule`` reads only the times it needs
(docs/TESTING.md). The cases that used to allocate without end run in a child process under an
address-space limit, so a regression fails the test instead of the machine."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import InvalidRequestError
from replay.cli.main import main
from replay.workloads import distributions
from replay.workloads.arrivals import ArrivalProcess
from replay.workloads.distributions import parse
from replay.workloads.generate import MAX_NUM_REQUESTS, GenerateSpec, Generator

MEMORY_LIMIT = 3 << 30  # bytes of address space the child may take (numpy and all)
TIMEOUT_S = 120


def _generate(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``replayllm workload generate --out tmp/w.jsonl OPTIONS`` in a child process with at
    most ``MEMORY_LIMIT`` of address space and ``TIMEOUT_S`` seconds."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "replay.cli.main", "workload", "generate",
         "--out", str(tmp_path / "w.jsonl"), *options],
        capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=limit)


def _one_error_line(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_num_requests_past_the_bound_is_one_line(tmp_path: Path) -> None:
    """``--num-requests 1000000000000`` (a typo of 10**12): one line naming the bound, exit 2,
    at once, no file. Before: it ran (about 8 MB/s of JSONL, hours) until the disk was full;
    this test timed out."""
    done = _generate(tmp_path, "--num-requests", str(10**12))
    _one_error_line(done, "--num-requests must be at most", f"{MAX_NUM_REQUESTS:,}",
                    "1,000,000,000,000")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InvalidRequestError, match="--num-requests must be at most"):
        GenerateSpec(num_requests=MAX_NUM_REQUESTS + 1)
    GenerateSpec(num_requests=MAX_NUM_REQUESTS)  # the bound itself is allowed


def test_turns_that_would_not_fit_in_memory_are_one_line(tmp_path: Path) -> None:
    """``--turns fixed:65536`` over 65,536 conversations drew every later turn of a chunk at
    once: 4.3 billion draws, tens of GB. Before: the allocation failed (here under the limit; on
    a machine, it swapped then died) and the line blamed the KV cache. Now the error names
    --turns, exit 2, no file."""
    done = _generate(tmp_path, "--num-requests", "65536", "--turns", "fixed:65536")
    _one_error_line(done, "--turns", "later turns")
    assert list(tmp_path.iterdir()) == []


def test_system_prompts_that_would_not_fit_in_memory_are_one_line(tmp_path: Path) -> None:
    """65,536 system prompts of 2^20 tokens in blocks of 1: 68 billion block ids, all built
    before the first request. Before: memory ran out (a misleading KV-cache line under the
    limit). Now one line naming the options, exit 2, no file."""
    done = _generate(tmp_path, "--num-requests", "1", "--system-prompts", "65536",
                     "--system-prompt-len", "fixed:1048576", "--hash-block-size", "1")
    _one_error_line(done, "--system-prompts", "--system-prompt-len", "--hash-block-size")
    assert list(tmp_path.iterdir()) == []


def test_schedule_reads_only_the_times_it_needs(tmp_path: Path) -> None:
    """``--arrivals schedule`` with ``--num-requests 2``: a file whose 4th line is not a number
    gives the first two times. Before: the whole file was read and checked, and the bad line
    past the two needed failed generation. A bad time among the needed ones still fails."""
    schedule = tmp_path / "s.txt"
    schedule.write_text("0\n0.5\n1\nnot-a-time\n")
    out = tmp_path / "w.jsonl"
    assert main(["workload", "generate", "--num-requests", "2", "--arrivals", "schedule",
                 "--schedule", str(schedule), "--out", str(out)]) == 0
    spec = GenerateSpec(num_requests=2, arrivals=ArrivalProcess(
        "schedule", schedule=str(schedule)))
    assert [r.arrival_s for r in Generator(spec)] == [0.0, 0.5]
    with pytest.raises(InvalidRequestError, match="not a number"):
        list(Generator(GenerateSpec(num_requests=4, arrivals=ArrivalProcess(
            "schedule", schedule=str(schedule)))))


def test_an_empirical_file_past_the_bound_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``empirical:FILE`` holds every value in memory (a draw picks any of them): a file over
    ``MAX_EMPIRICAL_VALUES`` is refused once that many are read, not read to its end first.
    Before: any size was read whole (a billion-line file, tens of GB)."""
    monkeypatch.setattr(distributions, "MAX_EMPIRICAL_VALUES", 3)
    values = tmp_path / "v.txt"
    values.write_text("1\n2\n3\n")
    assert parse(f"empirical:{values}", "--prompt-len").values == (1.0, 2.0, 3.0)
    values.write_text("1\n2\n3\n4\nnot-read\n")
    with pytest.raises(InvalidRequestError, match="--prompt-len: .* more than 3 values"):
        parse(f"empirical:{values}", "--prompt-len")
