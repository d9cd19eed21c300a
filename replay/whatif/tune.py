"""SLO-driven configuration search: the highest goodput whose run meets every SLO.

As Vidur-Search does, every configuration of a space is simulated and judged against the SLOs
(latency percentiles), and the result is the best one plus the Pareto front of what was
evaluated. Goodput here is the served requests per second (over the makespan) of a run that
meets every SLO, at the workload's own arrivals; a run missing one has none. A rejected request
is not served, nor one a recorded abort ended before it finished.

Search: where the space holds more configurations than ``budget``, successive halving on request
subsets (Hyperband's inner loop): every configuration runs on the first ``n / eta^R`` requests,
the best ``1/eta`` of them (by goodput, then by how far they miss the SLOs) go on to ``eta``
times as many requests, until at most ``budget`` run on the whole workload (the last cut keeps
``budget`` where subsets under ``MIN_SUBSET`` requests would be needed to cut by ``eta``; a
workload too small for any subset runs every configuration, and the search says so). Configurations
the Config rejects (``prefill_first`` with a token budget under ``max_model_len``) are dropped
before anything runs. The source's own configuration always runs on the whole workload, so the
result says whether the defaults meet the SLOs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.config import AUTO_SIZED_BLOCKS
from engine.errors import ConfigError, ReplayLLMError
from replay.metrics import LATENCIES, PERCENTILES
from replay.whatif.simulate import SimResult, SimWorkload, format_overrides

# Runs (name, overrides) variants of a workload and returns their results in input order.
RunVariants = Callable[[SimWorkload, list[tuple[str, dict[str, Any]]]], list[SimResult]]

SLO_METRICS = tuple(f"{n}_{s}" for n in LATENCIES for s in ("mean", *(f"p{p}" for p in
                                                                      PERCENTILES)))
DEFAULT_BUDGET = 16
DEFAULT_ETA = 3
MIN_SUBSET = 32  # requests: a smaller subset says too little about the whole


class TuneError(ReplayLLMError):
    """Bad tune arguments."""


@dataclass(frozen=True)
class Slo:
    """An upper bound on one latency metric, e.g. ``ttft_p99 <= 0.5`` seconds."""

    metric: str
    limit_s: float

    @property
    def key(self) -> str:
        return f"{self.metric}_s"

    def ratio(self, metrics: dict[str, float]) -> float:
        """value / limit (<= 1 meets it); inf when the run has no such value."""
        value = metrics.get(self.key, math.nan)
        return value / self.limit_s if math.isfinite(value) else math.inf

    def __str__(self) -> str:
        return f"{self.metric}<={self.limit_s:g}s"


def parse_slo(text: str) -> Slo:
    """``ttft_p99=0.5`` (seconds) -> Slo; errors name the metrics accepted."""
    metric, sep, value = text.partition("=")
    metric = metric.strip()
    if not sep or metric not in SLO_METRICS:
        raise TuneError(f"--slo expects METRIC=SECONDS with METRIC one of "
                        f"{', '.join(SLO_METRICS)}; got {text!r}")
    try:
        limit = float(value)
    except ValueError:
        raise TuneError(f"--slo {metric}: {value!r} is not a number of seconds") from None
    if not 0 < limit < math.inf:  # inf bounds nothing: every configuration would meet it
        raise TuneError(f"--slo {metric}: the limit must be a finite number > 0 of seconds, "
                        f"got {value}")
    return Slo(metric, limit)


def check_slos(slos: list[Slo]) -> tuple[Slo, ...]:
    """The SLOs to meet, checked: at least one, and one limit per metric (a metric given twice
    would be held to both limits in silence, one of them moot)."""
    if not slos:
        raise TuneError("give at least one --slo METRIC=SECONDS")
    seen: set[str] = set()
    for slo in slos:
        if slo.metric in seen:
            raise TuneError(f"--slo {slo.metric} is given twice; give each metric one limit")
        seen.add(slo.metric)
    return tuple(slos)


def parse_slos(texts: list[str]) -> tuple[Slo, ...]:
    """``--slo`` values (``METRIC=SECONDS`` each) -> the checked SLOs (``check_slos``)."""
    return check_slos([parse_slo(text) for text in texts])


def default_space(workload: SimWorkload) -> dict[str, list[Any]]:
    """The space searched when ``--space`` names no key: around the source's own settings.

    Under ``chunked`` the token budget is the chunk budget, so values below max_model_len
    (which ``prefill_first`` rejects) search chunk sizes too."""
    config = workload.config
    blocks = config.num_kvcache_blocks
    space: dict[str, list[Any]] = {
        "max_num_seqs": sorted({64, 128, 256, config.max_num_seqs}),
        "max_num_batched_tokens": sorted({2048, 4096, 8192, config.max_num_batched_tokens}),
        "policy": ["prefill_first", "chunked"],
        "enable_prefix_caching": [True, False],
    }
    if blocks != AUTO_SIZED_BLOCKS:
        space["num_kvcache_blocks"] = sorted({max(blocks // 4, 1), max(blocks // 2, 1), blocks})
    return space


@dataclass
class Evaluation:
    """One configuration's result on the whole workload (or on the largest subset it reached)."""

    overrides: dict[str, Any]
    result: SimResult
    requests: int  # how many of the workload's requests it ran on
    slos: tuple[Slo, ...]

    @property
    def name(self) -> str:
        return format_overrides(self.overrides)

    @property
    def meets(self) -> bool:
        """Every SLO met, serving every request the source serves: a configuration rejecting a
        workload file's long requests would meet latency SLOs by leaving its hardest work out."""
        return (self.result.ok and not self.result.newly_rejected
                and all(s.ratio(self.result.metrics) <= 1 for s in self.slos))

    @property
    def throughput_req_s(self) -> float:
        m = self.result.metrics
        served = m.get("requests", 0.0) - m.get("rejected", 0.0) - self.aborted
        makespan = m.get("makespan_s", math.nan)
        return served / makespan if self.result.ok and makespan > 0 else 0.0

    @property
    def aborted(self) -> int:
        """Requests a replayed abort ended before they finished: not served. (An abort comes
        at its recorded time, so a slower configuration has more of them and, ending early,
        a shorter makespan: counted as served, they raised its goodput.)"""
        frame = self.result.requests
        if frame is None or "finish_reason" not in frame:
            return 0
        return int((frame["finish_reason"] == "aborted").sum())

    @property
    def goodput_req_s(self) -> float:
        return self.throughput_req_s if self.meets else 0.0

    def rank_key(self) -> tuple[float, float]:
        """Larger is better: goodput first, then (for those missing) the worst SLO ratio."""
        if not self.result.ok:
            return (-math.inf, -math.inf)
        if self.result.newly_rejected:  # below every run serving all, above one that cannot run
            return (-math.inf, -float(self.result.newly_rejected))
        worst = max((s.ratio(self.result.metrics) for s in self.slos), default=0.0)
        return (self.goodput_req_s, -worst)


@dataclass
class TuneResult:
    """Every evaluation on the whole workload, the source's own, the best, and the search log."""

    slos: tuple[Slo, ...]
    evaluations: list[Evaluation]
    baseline: Evaluation
    source_config: Any
    rungs: list[tuple[int, int]] = field(default_factory=list)  # (requests, configurations)
    considered: int = 0
    budget: int = DEFAULT_BUDGET

    def changes(self, e: Evaluation) -> int:
        """How many settings ``e`` changes from the source's."""
        base = self.source_config.to_dict()
        return sum(base.get(k) != v for k, v in e.overrides.items())

    def _preferred(self, runs: list[Evaluation]) -> Evaluation | None:
        """The top run by ``rank_key``; of equals, the fewest changes from the source (of equal
        changes, the first: a searched run before the source's own)."""
        return max(runs, key=lambda e: (e.rank_key(), -self.changes(e)), default=None)

    def _whole_runs(self) -> list[Evaluation]:
        """Every run on the whole workload: the searched ones, then the source's own (which a
        search narrowed to ``--budget`` may have cut, or whose space may not hold it)."""
        return [*self.evaluations, self.baseline]

    @property
    def best(self) -> Evaluation | None:
        """The highest goodput meeting every SLO; of equals, the fewest changes from the source."""
        return self._preferred([e for e in self._whole_runs() if e.meets])

    @property
    def closest(self) -> Evaluation | None:
        """Where nothing meets the SLOs: the run missing them by the least (None otherwise)."""
        if self.best is not None:
            return None
        return self._preferred([e for e in self._whole_runs() if e.result.ok])

    def pareto_front(self) -> list[Evaluation]:
        """The runs no other run beats on throughput and on every SLO metric at once."""
        # Of runs with equal values, the one with the fewest changes stands for them all (the
        # one ``best`` picks, so the best is a row of the printed front), then the first.
        ok = sorted((e for e in self.evaluations if e.result.ok and not e.result.newly_rejected),
                    key=self.changes)  # a run rejecting requests does not serve the workload

        def values(e: Evaluation) -> tuple[float, ...]:
            return (-e.throughput_req_s, *(e.result.metrics.get(s.key, math.inf)
                                           for s in self.slos))

        front = []
        for i, e in enumerate(ok):
            mine = values(e)
            dominated = any(
                all(a <= b for a, b in zip(theirs, mine)) and (theirs != mine or j < i)
                for j, theirs in ((j, values(o)) for j, o in enumerate(ok))
            )
            if not dominated:
                front.append(e)
        return sorted(front, key=lambda e: -e.throughput_req_s)

    def set_lines(self) -> list[str]:
        """The best configuration as ``--set`` lines (the fields it changes from the source)."""
        best = self.best
        if best is None:
            return []
        base = self.source_config.to_dict()
        return [f"--set {k}={_text(v)}" for k, v in best.overrides.items() if base.get(k) != v]


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def candidates(workload: SimWorkload, space: dict[str, list[Any]],
               rejected: list[str] | None = None) -> list[dict[str, Any]]:
    """Every combination of the space the Config accepts, in a fixed order (``rejected``, if
    given, gets each other one with the Config's reason)."""
    keys = list(space)
    out = []
    for combo in itertools.product(*(space[k] for k in keys)):
        overrides = dict(zip(keys, combo))
        try:
            workload.config.replace(**overrides)
        except ConfigError as exc:
            if rejected is not None:
                rejected.append(f"{format_overrides(overrides)}: {exc}")
            continue
        out.append(overrides)
    return out


def subset(workload: SimWorkload, num_requests: int) -> SimWorkload:
    """The workload's first ``num_requests`` requests (and the aborts and stops that target
    them); a workload file's requests (``workload``, which a simulation feeds, indexing
    ``requests`` by position) are cut alike."""
    if num_requests >= len(workload.requests):
        return workload
    return dataclasses.replace(
        workload,
        requests=workload.requests[:num_requests],
        aborts=[a for a in workload.aborts if a[2] < num_requests],
        stops=[a for a in workload.stops if a[2] < num_requests],
        workload=None if workload.workload is None else workload.workload[:num_requests],
        recorded=None,
    )


def rung_sizes(num_candidates: int, num_requests: int, budget: int, eta: int) -> list[int]:
    """Requests per rung of successive halving, smallest first, ending with the whole workload."""
    rungs = 0
    while math.ceil(num_candidates / eta**rungs) > budget:
        rungs += 1
    sizes = [num_requests]
    for _ in range(rungs):
        smaller = sizes[0] // eta
        if smaller < MIN_SUBSET:
            break
        sizes.insert(0, smaller)
    return sizes


def tune(
    workload: SimWorkload,
    slos: list[Slo],
    space: dict[str, list[Any]],
    run_variants: RunVariants,
    budget: int = DEFAULT_BUDGET,
    eta: int = DEFAULT_ETA,
) -> TuneResult:
    """Search ``space`` for the highest goodput meeting ``slos`` (see the module docstring)."""
    slos_t = check_slos(slos)
    if budget < 1 or eta < 2:
        raise TuneError(f"--budget must be >= 1 and --eta >= 2, got {budget} and {eta}")
    rejected: list[str] = []
    pool = candidates(workload, space, rejected)
    if not pool:  # the first one's reason: the rest are usually alike
        raise TuneError(f"no configuration of the space is valid ({len(rejected)} rejected; "
                        f"the first, {rejected[0]})")
    total = len(workload.requests)
    sizes = rung_sizes(len(pool), total, budget, eta)
    rungs = []
    for number, size in enumerate(sizes):
        last = number == len(sizes) - 1
        results = run_variants(subset(workload, size),
                               [(format_overrides(o), o) for o in pool])
        evaluations = [Evaluation(o, r, size, slos_t) for o, r in zip(pool, results)]
        rungs.append((size, len(pool)))
        if last:
            break
        ranked = sorted(range(len(pool)), key=lambda i: evaluations[i].rank_key(), reverse=True)
        keep = max(math.ceil(len(pool) / eta), 1)
        if number == len(sizes) - 2:  # into the whole workload: never more than the budget
            keep = min(keep, budget)
        pool = [pool[i] for i in ranked[:keep] if evaluations[i].result.ok] or [pool[ranked[0]]]
    baseline_result = run_variants(workload, [("as recorded", {})])[0]
    baseline = Evaluation({}, baseline_result, total, slos_t)
    return TuneResult(slos_t, evaluations, baseline, workload.config, rungs,
                      len(candidates(workload, space)), budget)
