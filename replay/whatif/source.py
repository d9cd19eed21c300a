"""What a what-if simulation re-runs: a source's requests, their tokens, arrivals and aborts.

A source is a recording (a trace directory, a trace from ``read_trace``, ``RecordedEvents``) or a
workload without one (``replay.workloads``, synthetic tokens). ``load_source`` takes any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.config import Config
from engine.errors import ConfigError, ReplayLLMError
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from replay.metrics import has_timings
from replay.recorded import RecordedEvents, from_trace
from replay.replayer import OUTSIDE_FINISHES, PRECHECK_REJECTION, config_from_header
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import Request
from tracing.events import NullEventBuffer


@dataclass
class SimRequest:
    """One request to re-run, with the completion tokens the source sampled for it (if any).

    ``prompt`` and ``tokens``: lists of ints, or (streamed, ``replay.whatif.stream``) an int32
    array; a streamed prompt may also be a ``PromptRecipe`` until it is due."""

    prompt: list[int] | np.ndarray | PromptRecipe
    params: SamplingParams
    arrival_s: float
    step: int  # the step before which the source added it (0 for a workload file)
    tokens: list[int] | np.ndarray | None = None
    precheck_error: str | None = None  # rejected before the scheduler in the source
    rejected_in_source: bool = False
    priority: int = 0


@dataclass
class SimWorkload:
    """What a simulation re-runs: the source's Config, header and requests."""

    name: str
    config: Config
    header: dict[str, Any]
    requests: list[SimRequest]
    aborts: list[tuple[float, int, int]] = field(default_factory=list)  # (time, step, request)
    start_s: float = 0.0  # the last arrival before the source's first step
    recorded: RecordedEvents | None = None
    # A workload's own requests (no recording): fed through ``WorkloadInputs``, which sends a
    # conversation's later turn once the simulated previous turn finished.
    workload: list[Request] | None = None
    # Requests finished by a stop string found in their text, fed like aborts: (time, step, request)
    stops: list[tuple[float, int, int]] = field(default_factory=list)
    # The first arrival before the source's first step (None: ``start_s``): where an engine
    # stamped each request as it added it, the batch took from here to ``start_s`` to add.
    first_s: float | None = None
    # An incomplete source's finished requests (``replay.whatif.compare.RecordedScope``, set by
    # ``incomplete_source``): each variant's metrics cover those only, as its recorded row does.
    scope: Any = None

    @property
    def timed_source(self) -> bool:
        return self.recorded is not None and has_timings(self.recorded)


def _tokens_by_seq(events: RecordedEvents) -> dict[int, list[int]]:
    ts = events.tables["token_sampled"]
    seq = np.asarray(ts["seq_id"], dtype=np.int64)
    if not len(seq):
        return {}
    order = np.argsort(seq, kind="stable")  # stable: each sequence's tokens stay in event order
    tokens = np.asarray(ts["token_id"], dtype=np.int64)[order]
    unique, starts = np.unique(seq[order], return_index=True)
    bounds = np.append(starts, len(seq))
    return {
        int(s): tokens[bounds[i] : bounds[i + 1]].tolist() for i, s in enumerate(unique.tolist())
    }


# Stands in for a recorded user policy absent here while the Config's other rules are checked:
# a user policy is never held to the whole-prompt token rule, and neither is ``chunked``.
_STAND_IN_POLICY = "chunked"


def source_config(header: dict[str, Any], name: str, policy_needed: bool = True) -> Config:
    """The recording's Config; a user policy that cannot be imported here is named as such
    (the simulation re-runs the source's scheduler, so it needs the policy's module).

    ``policy_needed`` False (every variant sets another policy): such a policy is kept by name
    only (``_config_naming_policy``), so a variant overriding it runs without its module."""
    from engine.policy import is_import_path, policy_class

    policy = str((header.get("config") or {}).get("policy", ""))
    if is_import_path(policy):
        try:
            policy_class(policy)
        except ConfigError as exc:
            if not policy_needed:
                return _config_naming_policy(header, policy)
            raise ReplayLLMError(
                f"{name} was recorded with the user policy {policy}, which cannot be imported "
                f"here ({exc}); the simulation builds the recorded configuration, so put the "
                "policy's package on PYTHONPATH, or set a built-in policy for every variant "
                "(whatif --set policy=chunked, tune --space policy=...)") from None
    return config_from_header(header)


def _config_naming_policy(header: dict[str, Any], policy: str) -> Config:
    """The recorded Config, its ``policy`` the user policy's name although it cannot be
    imported: every other rule is checked (on a stand-in policy), ``to_dict`` is the recorded
    configuration, ``replace(policy=...)`` gives a valid Config and any other ``replace`` the
    import's ``ConfigError`` (a variant keeping the policy: ``cannot run``, naming it)."""
    config = config_from_header({**header, "config": {**header["config"],
                                                      "policy": _STAND_IN_POLICY}})
    object.__setattr__(config, "policy", policy)  # frozen: the recorded name, unvalidated
    return config


def _probe_config(config: Config) -> Config:
    """A Config whose scheduler can be built, for ``admission_error`` (policy-independent)."""
    from engine.policy import policy_class

    try:
        policy_class(config.policy)
    except ConfigError:
        return config.replace(policy=_STAND_IN_POLICY)
    return config


def workload_from_recorded(events: RecordedEvents, name: str = "trace",
                           policy_needed: bool = True) -> SimWorkload:
    """The workload of a recording: its requests, their tokens, arrivals and aborts.
    ``policy_needed`` False: a recorded user policy may be absent (``source_config``)."""
    config = source_config(events.header, name, policy_needed)
    added, finished = events.tables["request_added"], events.tables["request_finished"]
    reasons = dict(zip(np.asarray(finished["seq_id"]).tolist(),
                       np.asarray(finished["reason"]).tolist()))
    tokens = _tokens_by_seq(events)
    probe = Scheduler(_probe_config(config), config.num_kvcache_blocks, NullEventBuffer())
    requests: list[SimRequest] = []
    index_of: dict[int, int] = {}
    for row, seq_id in enumerate(np.asarray(added["seq_id"]).tolist()):
        params = events.request_params(row)
        prompt = list(added["prompt_token_ids"][row])
        precheck = None
        rejected = reasons.get(seq_id) == "rejected"
        # Rejected although the scheduler would take it: a pre-scheduler check (bad token).
        if rejected and probe.admission_error(Sequence(seq_id, prompt, params)) is None:
            precheck = PRECHECK_REJECTION
        index_of[seq_id] = len(requests)
        requests.append(SimRequest(prompt, params, float(added["arrival_s"][row]),
                                   int(added["step"][row]), tokens.get(seq_id), precheck,
                                   rejected, events.request_priority(row)))
    ms = events.tables["model_step"]
    steps = np.asarray(ms["step"], dtype=np.int64)
    ends = np.asarray(ms["wall_time_s"], dtype=float)
    first_step = int(steps[0]) if len(steps) else 0
    starting = [r.arrival_s for r in requests if r.step <= first_step]
    start = max(starting) if starting else 0.0
    first = min(starting) if starting else 0.0
    aborts, stops = [], []
    for seq_id, step, reason in zip(np.asarray(finished["seq_id"]).tolist(),
                                    np.asarray(finished["step"]).tolist(),
                                    np.asarray(finished["reason"]).tolist()):
        if reason in OUTSIDE_FINISHES and seq_id in index_of:
            before = np.searchsorted(steps, step) - 1  # the abort came after the previous step
            at = float(ends[before]) if before >= 0 else start
            (aborts if reason == "aborted" else stops).append((at, int(step), index_of[seq_id]))
    return SimWorkload(name, config, dict(events.header), requests, aborts, start, events,
                       stops=stops, first_s=first)


def workload_from_requests(requests: list[Request], config: Config, name: str) -> SimWorkload:
    """A workload (``replay.workloads``) with no recording: tokens are synthetic (set a
    request's ``tokens`` to give it the answer a live run sampled). A later conversation turn's
    prompt here is its new tokens only: the rest comes from the simulated previous turn."""
    out = []
    for number, request in enumerate(requests):
        prompt = request.prompt_token_ids()
        if isinstance(prompt, str):
            raise ReplayLLMError(
                f"{name}: request {number} has a text prompt; the simulator needs token ids "
                "(prompt_token_ids)"
            )
        out.append(SimRequest(list(prompt), request.sampling_params(), request.arrival_s, 0,
                              priority=request.priority))
    header = {"config": config.to_dict(), "workload": name}
    return SimWorkload(name, config, header, out, start_s=0.0, workload=list(requests))


def load_source(source: Any, policy_needed: bool = True) -> SimWorkload:
    """A SimWorkload from a trace path, an opened trace, recorded events or a SimWorkload.
    ``policy_needed`` False: every variant sets its own policy, so a recorded user policy's
    module may be absent (a variant keeping it cannot run)."""
    if isinstance(source, SimWorkload):
        return source
    if isinstance(source, RecordedEvents):
        return workload_from_recorded(source, policy_needed=policy_needed)
    if isinstance(source, (str, Path)):
        from tracing.reader import read_trace

        return workload_from_recorded(from_trace(read_trace(source)), str(source), policy_needed)
    if hasattr(source, "table") and hasattr(source, "header"):
        return workload_from_recorded(from_trace(source), str(getattr(source, "path", "")),
                                      policy_needed)
    raise TypeError(f"cannot simulate from a {type(source).__name__}")
