"""Generated workloads match their specification within sampling error: the rate and the
inter-arrival coefficient of variation (1/sqrt(burstiness), vLLM's and AIPerf's Gamma), length
distributions, system-prompt popularity, conversations; the same seed gives the same file."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from engine.errors import InvalidRequestError
from replay.workloads.arrivals import ArrivalProcess
from replay.workloads.distributions import IntDraws, parse
from replay.workloads.generate import GenerateSpec, Generator

N = 40_000
SIGMAS = 4.0  # tolerances: four standard errors


def arrivals(process: ArrivalProcess, n: int = N, seed: int = 0) -> np.ndarray:
    return np.concatenate(list(process.times(n, np.random.default_rng(seed))))


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_have_the_rate_and_cv_of_their_burstiness(burstiness: float) -> None:
    rate = 50.0
    kind = "poisson" if burstiness == 1.0 else "gamma"
    times = arrivals(ArrivalProcess(kind, rate, burstiness))
    gaps = np.diff(times)
    assert times[0] == 0.0 and np.all(gaps >= 0)
    cv = 1 / math.sqrt(burstiness)
    # mean gap 1/rate, standard error cv/(rate sqrt(n))
    assert abs(gaps.mean() * rate - 1) < SIGMAS * cv / math.sqrt(len(gaps))
    # sample variance of a Gamma(k): relative standard error sqrt((2 + 6/k) / n); the CV's is
    # about half of it, plus the mean's
    rel_se = 0.5 * math.sqrt((2 + 6 / burstiness) / len(gaps)) + cv / math.sqrt(len(gaps))
    measured = gaps.std(ddof=1) / gaps.mean()
    assert abs(measured / cv - 1) < SIGMAS * rel_se, (measured, cv)


def test_constant_and_scheduled_arrivals_are_exact(tmp_path: Path) -> None:
    times = arrivals(ArrivalProcess("constant", 4.0), n=9)
    assert np.allclose(times, np.arange(9) / 4.0)
    schedule = tmp_path / "times.txt"
    schedule.write_text("0\n0.5\n2.25\n")
    assert arrivals(ArrivalProcess("schedule", schedule=str(schedule)), n=3).tolist() == [
        0.0, 0.5, 2.25]
    with pytest.raises(InvalidRequestError, match="3 arrival times for 4 requests"):
        arrivals(ArrivalProcess("schedule", schedule=str(schedule)), n=4)
    assert not arrivals(ArrivalProcess(None, None), n=5).any()  # no rate: all at once


@pytest.mark.parametrize("spec, mean, std", [
    ("uniform:10,30", 20.0, math.sqrt((21**2 - 1) / 12)),
    ("normal:200,20", 200.0, 20.0),
    ("lognormal:300,0.5", 300.0, 300.0 * math.sqrt(math.exp(0.25) - 1)),
    ("exponential:50", 50.0, 50.0),
])
def test_length_distributions_have_their_mean(spec: str, mean: float, std: float) -> None:
    values = parse(spec).sample(np.random.default_rng(1), N)
    assert abs(values.mean() - mean) < SIGMAS * std / math.sqrt(N)


def test_zipf_and_empirical_lengths(tmp_path: Path) -> None:
    values = parse("zipf:1.5,100").sample(np.random.default_rng(2), N)
    weights = np.arange(1, 101) ** -1.5
    p1 = weights[0] / weights.sum()
    assert values.min() >= 1 and values.max() <= 100
    assert abs((values == 1).mean() - p1) < SIGMAS * math.sqrt(p1 * (1 - p1) / N)
    source = tmp_path / "lengths.txt"
    source.write_text("7\n7\n100\n")
    drawn = parse(f"empirical:{source}").sample(np.random.default_rng(3), N)
    assert set(drawn.tolist()) == {7.0, 100.0}
    assert abs((drawn == 7).mean() - 2 / 3) < SIGMAS * math.sqrt(2 / 9 / N)
    with pytest.raises(InvalidRequestError, match="lengths.txt:2: not a number"):
        source.write_text("7\nseven\n")
        parse(f"empirical:{source}")
    with pytest.raises(InvalidRequestError, match="unknown distribution 'pareto'"):
        parse("pareto:1")


def test_system_prompts_follow_their_popularity_and_conversations_their_turns() -> None:
    spec = GenerateSpec(num_requests=4000, system_prompts=4, popularity=1.0,
                        system_prompt_len=parse("fixed:40"), prompt_len=parse("fixed:10"),
                        turns=parse("uniform:1,3"), think_time_s=parse("fixed:2"),
                        user_len=parse("fixed:5"), hash_block_size=16, seed=5)
    generator = Generator(spec)
    requests = list(generator)
    firsts = [r for r in requests if not r.follows_previous_turn]
    later = [r for r in requests if r.follows_previous_turn]
    assert len(firsts) == 4000 == generator.counts.conversations
    assert generator.counts.requests == len(requests)
    firsts_ids = [r.prompt.hash_ids[0] for r in firsts]
    top = max(set(firsts_ids), key=firsts_ids.count)
    weights = 1 / np.arange(1, 5)
    p = weights[0] / weights.sum()
    share = firsts_ids.count(top) / len(firsts)
    assert abs(share - p) < SIGMAS * math.sqrt(p * (1 - p) / len(firsts))
    # the system prompt rounds up to whole 16-token blocks (48), then the first turn's 10 tokens
    assert {len(r.prompt) for r in firsts} == {58} and {len(r.prompt) for r in later} == {5}
    assert {r.think_time_s for r in later} == {2.0}
    mean_turns = len(requests) / len(firsts)
    assert abs(mean_turns - 2) < SIGMAS * math.sqrt(2 / 3 / len(firsts))
    salts = [r.prompt.salt for r in requests]
    assert len(set(salts)) == len(salts)  # every request's own tokens are its own


def test_the_same_seed_gives_the_same_workload_and_another_seed_another() -> None:
    spec = dict(num_requests=50, arrivals=ArrivalProcess("gamma", 10.0, 0.5),
                prompt_len=parse("lognormal:100,1"), system_prompts=3)
    a, b = list(Generator(GenerateSpec(**spec, seed=1))), list(Generator(GenerateSpec(**spec,
                                                                                       seed=1)))
    c = list(Generator(GenerateSpec(**spec, seed=2)))
    assert a == b and a != c


def test_clipped_lengths_are_counted() -> None:
    dist = parse("normal:5,10")
    raw = np.rint(dist.sample(np.random.default_rng(1), 2000))
    draws = IntDraws(dist, upper=20)
    clipped = draws.sample(np.random.default_rng(1), 2000)
    assert clipped.min() == 1 and clipped.max() == 20
    assert draws.clipped_low == int((raw < 1).sum()) > 0
    assert draws.clipped_high == int((raw > 20).sum()) > 0
    generator = Generator(GenerateSpec(num_requests=2000, prompt_len=dist, seed=1))
    assert min(len(r.prompt) for r in generator) == 1
    assert generator.counts.clipped["prompt_len"] > 0
