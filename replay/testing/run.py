"""Drive a generated workload through ``EngineCore`` and collect every property violation.

``run_workload(workload)`` adds each request at its arrival step (idle steps count), aborts the
ones with an abort step, steps an ``EngineCore`` with the ``ScriptedExecutor`` (scripted tokens, a
simulated paged KV cache), checks each step (``StepObserver``), the outcome (``admission``,
``completion``, ``bounded``, ``drained``), the whole event stream (``check_events``: block
accounting, refcounts, hash chains, budgets, every event field against the state it reports) and
that the recorded events replay identically (``replay``: ``replay.verify.verify_events`` re-drives
the scheduler and the policy from the recording; a policy that decides differently from the same
state, by randomness, the clock or ``id()``, fails it, as its traces would fail ``verify``).
A policy that raises or answers what the scheduler cannot carry out (a ``PolicyError``, at
construction, in a step or in an abort, whose freed blocks ``eviction_key`` ranks) is the
``policy`` violation, one that schedules nothing while
requests wait the ``progress`` one: the run stops there and the events so far are checked;
a request the stop left unfinished is checked for the tokens it has, not reported as a
``completion`` violation (its missing tokens are the stop's consequence, not a second cause).
The ``Run`` it returns holds the violations by name; ``run.raise_violations()`` reports them.
"""

from __future__ import annotations

import itertools
from typing import Any

from engine.engine_core import EngineCore
from engine.policy import PolicyError
from engine.sampling_params import SamplingParams
from engine.sequence import SequenceStatus
from replay.testing.invariants import check_events
from replay.testing.observer import StepObserver, Stop, step_failure
from replay.testing.scripted import Run, ScriptedExecutor, signed_xxh64_of_int32
from replay.testing.strategies import (
    Workload,
    completion_cap,
    expected_completion,
    is_admissible,
)
from tracing.sink import MemorySink


def run_workload(
    workload: Workload,
    sink: Any = None,
    observe: bool = True,
    overlap: bool = False,
    replay: bool = True,
) -> Run:
    """Drive ``workload`` through an EngineCore step by step; collect every property violation.

    Requests are added at their arrival step (driver steps count idle ones too); the run stops when
    all have arrived and none is unfinished, or when the step bound is passed. ``overlap``: the
    executor launches asynchronously, so EngineCore overlaps steps where it can (the observer,
    which checks the state after every step, needs ``observe=False`` then: no property but the
    simulated KV's is checked). ``replay``: with ``observe``, also check that the recording
    replays identically (the ``replay`` property; skipped after a violation that stopped the run).
    """
    config = workload.config
    run = Run(workload)
    executor = ScriptedExecutor(config, run, overlap)
    ticks = itertools.count()
    run.sink = sink if sink is not None else MemorySink()
    try:
        run.core = core = EngineCore(config, executor, sink=run.sink,
                                     clock=lambda: next(ticks) * 1e-3)
    except PolicyError as exc:  # the policy cannot even be built: nothing ran
        run.check(False, "policy", f"engine start: {exc}")
        return run
    observer = StepObserver(run) if observe else None
    order = sorted(range(len(workload.requests)), key=lambda i: workload.requests[i].arrival_step)
    requests = [workload.requests[i] for i in order]
    bound = max(r.arrival_step for r in requests) + 2
    bound += sum(
        len(r.prompt) + completion_cap(config, len(r.prompt), r.max_tokens)
        for r in requests
        if is_admissible(config, len(r.prompt), r.max_tokens)
    )
    next_request = 0
    try:
        for t in itertools.count():
            while next_request < len(requests) and requests[next_request].arrival_step <= t:
                spec = requests[next_request]
                next_request += 1
                params = SamplingParams(
                    temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos
                )
                seq = core.add_request(list(spec.prompt), params, arrival_s=float(t),
                                       priority=spec.priority)
                executor.scripts[seq.seq_id] = spec.script
                run.seqs[seq.seq_id] = (spec, seq)
                if observer is not None and seq.status is SequenceStatus.WAITING:
                    observer.arrived(seq.seq_id)
            for seq_id, (spec, seq) in run.seqs.items():
                if spec.abort_step == t and not seq.is_finished:
                    run.aborted.add(seq_id)  # first: one the policy stopped mid-abort counts too
                    try:
                        core.abort(seq_id)
                    except PolicyError as exc:  # eviction_key ranks the blocks it frees
                        run.check(False, "policy", f"abort of seq {seq_id} at step {run.steps}: "
                                  f"{exc}")
                        raise Stop() from None
                    if observer is not None:
                        observer.aborted(seq_id)
            if next_request == len(requests) and not core.has_unfinished():
                break
            if t >= bound:
                run.check(False, "bounded", f"not drained after {t} steps (bound {bound})")
                break
            if observer is not None:
                if observer.step():
                    run.steps += 1
                continue
            try:
                if core.step() is not None:
                    run.steps += 1
            except (RuntimeError, PolicyError) as exc:
                run.check(False, step_failure(exc), f"step {run.steps}: {exc}")
                break
    except Stop:
        pass
    core.close()
    if observe:
        _check_outcome(run)
        stuck = any(run.violations.get(name) for name in STOPPED)
        report = check_events(run.sink.header, run.sink.tables, complete=not stuck)
        for v in report.violations:
            run.check(False, v.name, str(v))
        if replay and not stuck:
            _check_replay(run)
    return run


def _check_replay(run: Run) -> None:
    """The ``replay`` property: the recording re-drives the scheduler to the same decisions."""
    from engine.errors import ReplayLLMError
    from replay.verify import verify_events

    try:
        result = verify_events(run.sink.header, run.sink.tables)
    except ReplayLLMError as exc:  # the policy raised or answered wrongly in the replay only
        run.check(False, "replay", f"the recording cannot be replayed: {exc}")
        return
    if result.identical:
        return
    why = result.report().splitlines()[0]  # with where the replay stopped, if it did
    run.check(False, "replay",
              f"the recording does not replay identically ({why}): policy "
              f"{run.workload.config.policy!r} decided otherwise from the same requests and "
              "state (randomness, the clock, id(), the order of a set of sequences, or state "
              "kept across runs?)")


# The violations that stop a run early: its stream is checked as an incomplete one.
STOPPED = ("bounded", "progress", "policy")


def _check_outcome(run: Run) -> None:
    config, core, check = run.workload.config, run.core, run.check
    tables = run.sink.tables
    finished_rows: dict[int, list[tuple[str, int, int]]] = {}
    rf = tables["request_finished"]
    for sid, reason, n, h in zip(
        rf["seq_id"], rf["reason"], rf["num_completion_tokens"], rf["output_hash"]
    ):
        finished_rows.setdefault(sid, []).append((reason, n, h))
    sampled: dict[int, list[int]] = {}
    for sid, tok in zip(tables["token_sampled"]["seq_id"], tables["token_sampled"]["token_id"]):
        sampled.setdefault(sid, []).append(tok)
    stopped = any(run.violations.get(name) for name in STOPPED)
    for seq_id, (spec, seq) in run.seqs.items():
        admissible = is_admissible(config, len(spec.prompt), spec.max_tokens)
        if not admissible:
            check(
                seq.finish_reason == "rejected" and seq.seq_id in core.rejections,
                "admission",
                f"seq {seq_id} ({len(spec.prompt)} tokens, max_tokens {spec.max_tokens}) must be "
                f"rejected, finished {seq.finish_reason!r}",
            )
            check(
                not seq.completion_token_ids and seq_id not in sampled,
                "admission",
                f"rejected seq {seq_id} produced tokens",
            )
            continue
        check(
            seq.finish_reason != "rejected",
            "admission",
            f"admissible seq {seq_id} ({len(spec.prompt)} tokens, max_tokens {spec.max_tokens}) "
            f"was rejected: {core.rejections.get(seq_id)}",
        )
        tokens, reason = expected_completion(config, spec)
        if seq_id in run.aborted:
            # Aborted while unfinished: it keeps the tokens it had, a strict prefix of its output.
            n = len(seq.completion_token_ids)
            tokens, reason = tokens[:n], "aborted"
            check(
                n < len(expected_completion(config, spec)[0]),
                "completion",
                f"aborted seq {seq_id} has all of its tokens",
            )
        again = " (after preemption)" if seq_id in run.preempted else ""
        if stopped and not seq.is_finished:
            # The stop left it unfinished: its missing tokens and finish row are the stop's
            # consequence (they hid its cause in the report); the tokens it has are still checked.
            _check_prefix(run, seq_id, spec, seq, again)
            continue
        check(
            seq.status is SequenceStatus.FINISHED and seq.finish_reason == reason,
            "completion",
            f"seq {seq_id}{again}: status {seq.status.value}, reason {seq.finish_reason!r}, "
            f"expected {reason!r}",
        )
        check(
            list(seq.completion_token_ids) == tokens
            and list(seq.prompt_token_ids) == list(spec.prompt),
            "completion",
            f"seq {seq_id}{again}: completion {list(seq.completion_token_ids)}, "
            f"expected {tokens}",
        )
        check(
            sampled.get(seq_id, []) == tokens,
            "completion",
            f"seq {seq_id}: token_sampled events {sampled.get(seq_id)}, expected {tokens}",
        )
        check(
            finished_rows.get(seq_id) == [(reason, len(tokens), signed_xxh64_of_int32(tokens))],
            "completion",
            f"seq {seq_id}: request_finished rows {finished_rows.get(seq_id)}",
        )
    scheduler, bm = core.scheduler, core.scheduler.block_manager
    if not stopped:
        check(
            not scheduler.waiting and not scheduler.running,
            "drained",
            f"{len(scheduler.waiting)} waiting, {len(scheduler.running)} running at the end",
        )
        check(
            len(bm.free_block_ids) == bm.num_blocks == len(set(bm.free_block_ids)),
            "drained",
            f"{len(bm.free_block_ids)} of {bm.num_blocks} blocks free at the end",
        )
        held = [b for b in bm.blocks if b.ref_count != 0]
        check(not held, "drained", f"blocks with a refcount at the end: {held}")


def _check_prefix(run: Run, seq_id: int, spec: Any, seq: Any, again: str) -> None:
    """The ``completion`` check of a request a stopped run left unfinished: its prompt, and
    its tokens so far a prefix of its expected completion."""
    tokens = expected_completion(run.workload.config, spec)[0]
    got = list(seq.completion_token_ids)
    run.check(got == tokens[:len(got)] and list(seq.prompt_token_ids) == list(spec.prompt),
              "completion", f"seq {seq_id}{again} (unfinished when the run stopped): completion "
              f"{got}, expected a prefix of {tokens}")
