"""Property-based testing for scheduling policies: the project's own suite, for your policy too.

- ``replay.testing.strategies``: Hypothesis strategies for workloads (``workloads``,
  ``engine_configs``; arrivals, shared prefixes, conversations, aborts, EOS, priorities) and the
  expectations computed from a config alone.
- ``run_workload(workload)``: drive one through ``EngineCore`` with a scripted model that
  simulates the paged KV cache; the ``Run`` it returns holds every violated property by name.
- ``check_events(header, tables)`` / ``check_trace(path)``: the invariant checker over any event
  stream (``replay.testing.invariants`` lists the invariants).
- ``assert_replays(trace_dir)``: the trace verifies identically and every invariant holds.
- ``register_profiles()``: the Hypothesis profiles ``ci``, ``deep`` and ``dev``
  (``replay.testing.profiles``; the pytest plugin registers them).
- The pytest plugin (``replay.testing.pytest_plugin``, registered as an entry point):
  ``pytest --replayllm-traces DIR`` turns every trace under DIR into a regression test case.

docs/policies.md walks through writing a policy and testing it with these.
"""

from __future__ import annotations

from replay.testing.invariants import (
    InvariantReport,
    InvariantViolations,
    Violation,
    assert_invariants,
    check_events,
    check_trace,
)
from replay.testing.profiles import register_profiles
from replay.testing.replays import assert_replays
from replay.testing.run import run_workload
from replay.testing.scripted import PropertyViolations, Run
from replay.testing.strategies import RequestSpec, Workload, engine_configs, workloads

__all__ = [
    "InvariantReport",
    "InvariantViolations",
    "PropertyViolations",
    "RequestSpec",
    "Run",
    "Violation",
    "Workload",
    "assert_invariants",
    "assert_replays",
    "check_events",
    "check_trace",
    "engine_configs",
    "register_profiles",
    "run_workload",
    "workloads",
]
