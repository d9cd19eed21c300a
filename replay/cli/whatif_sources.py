"""Where ``whatif`` and ``tune`` get their workload and step times: TRACE's (or ``--workload``'s)
requests, and a step-time model fitted on a trace (``--timing-from``, TRACE's own with
``--profile``, ``--cost-option`` or ``--host-from``) or loaded from a saved one. Every user error
is a ``ReplayLLMError``, raised before the slow fitting where it can be known then."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.config import Config
from replay.cli.variants import WhatifError
from replay.whatif.compare import incomplete_source
from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import SimWorkload, load_source, load_timing, workload_from_requests


def cost_options(args: argparse.Namespace) -> Any:
    """``--cost-option``'s mechanisms (``CostOptions``), a bad one a ``WhatifError``."""
    from replay.whatif.cost.options import CostOptions

    try:
        return CostOptions.parse(getattr(args, "cost_options", []))
    except ValueError as exc:
        raise WhatifError(str(exc)) from None


def load_timing_trace(path: str, args: argparse.Namespace | None = None,
                      policy_needed: bool = True) -> tuple[CostModel, Config | None]:
    """A step-time model from a trace (with ``--profile`` and ``--cost-option``) or a saved
    model, and the trace's Config (if a trace). False ``policy_needed`` (the Config is unused,
    or every variant sets a policy): a user policy it was recorded with may be absent here, as
    for a source (``source_workload``); step times never need it."""
    from replay.recorded import from_trace
    from replay.whatif.notes import simulated_note
    from replay.whatif.source import source_config
    from tracing.reader import read_trace

    config = None
    host = getattr(args, "host_from", None)
    # Read before the fitting (slow on a long trace), so a bad --host-from fails at once.
    calibration = (read_trace(host).header.get("calibration") or []) if host else []
    if Path(path).suffix == ".json":
        refit = [flag for flag, given in (("--profile", getattr(args, "profile", None)),
                                          ("--cost-option", getattr(args, "cost_options", None)))
                 if given]
        if refit:  # never ignored in silence: a saved model is fitted already
            raise WhatifError(f"{' and '.join(refit)} shape the fit of a step-time model on a "
                              f"trace; {path} is a saved model, fitted already: give "
                              "--timing-from TRACE to refit, or drop them")
        model = CostModel.load(path)
    else:
        events = from_trace(read_trace(path))
        options = cost_options(args) if args is not None else None
        if host:  # a source on_host cannot price (no host times): said before the fitting
            CostModel.check_on_host(events, calibration, host, path, options)
        simulated = simulated_note(events.header, path, "timing source")
        # TRACE's own note is source_workload's.
        if simulated is not None and path != getattr(args, "trace", None):
            print(f"note: {simulated}")
        profile = getattr(args, "profile", None)
        model = CostModel.fit(events, source=path, profile=profile, options=options)
        config = source_config(events.header, path, policy_needed)
    if host:
        model = model.on_host(calibration, host)
    return model, config


def source_workload(args: argparse.Namespace, policy_needed: bool = True) -> SimWorkload | None:
    """TRACE's workload (None with --workload), warning when the recording is incomplete; plain
    whatif then covers the requests it finished only (``replay.whatif.compare``). False
    ``policy_needed``: every variant sets a policy, a recorded user policy's module may be gone."""
    if args.num_seqs is not None and args.workload is None:  # never ignored in silence
        raise WhatifError("--num-seqs takes --workload (a TRACE's requests are all re-run)")
    if args.trace is None:
        return None
    from replay.whatif.compare import restricts  # not --compare OTHER_TRACE's: its own scope
    from replay.whatif.notes import simulated_note

    workload = load_source(args.trace, policy_needed)
    warning = incomplete_source(workload, restrict=restricts(getattr(args, "compare", None)))
    if warning is not None:
        print(f"warning: {warning}")
    simulated = simulated_note(workload.header, args.trace, "source")
    if simulated is not None:
        print(f"note: {simulated}")
    return workload


def load(args: argparse.Namespace, workload: SimWorkload | None, policy_set: bool = False
         ) -> tuple[SimWorkload, CostModel | None, list[str], list[str]]:
    """The workload, its step-time model, the notes to print, and ``timing_notes`` (printed
    too, and whatif's recorded row's notes: worked out once, it may read --compare's file).
    ``policy_set``: every variant sets its policy."""
    timing_config: Config | None = None
    cost: CostModel | None = None
    if args.timing_from:  # its Config is the base of --workload's variants only
        cost, timing_config = load_timing_trace(
            args.timing_from, args, policy_needed=workload is None and not policy_set)
    elif args.trace is not None and (getattr(args, "profile", None)
                                     or getattr(args, "cost_options", None)
                                     or getattr(args, "host_from", None)):
        cost, _ = load_timing_trace(args.trace, args, policy_needed=False)
    if workload is not None:
        if cost is None:
            cost, notes = load_timing("auto", workload)
            return workload, cost, notes, []
        return workload, cost, [], timing_notes(args, workload, cost)
    from replay.cli.run import load_requests

    requests = load_requests(args.workload, args.num_seqs)
    base = timing_config or Config()
    workload = workload_from_requests(requests, base, name=args.workload)
    notes = []
    if cost is None:
        notes.append("no step-time model (--timing-from TRACE): decisions only, no times")
        if any(r.arrival_s > 0 for r in requests):
            notes.append("without times, arrivals cannot be honoured: every request joins at once")
    return workload, cost, notes, []


def timing_notes(args: argparse.Namespace, workload: SimWorkload, cost: CostModel | None
                 ) -> list[str]:
    """Where ``--timing-from`` ran another device or model than TRACE, whose recorded row the
    predictions stand beside (not with --compare OTHER_TRACE: ``device_note`` names OTHER's)."""
    from replay.whatif.compare import restricts
    from replay.whatif.notes import timing_note

    note = (timing_note(cost, workload.header, args.timing_from, workload.name)
            if args.timing_from else None)
    return [note] if note and restricts(getattr(args, "compare", None)) else []
