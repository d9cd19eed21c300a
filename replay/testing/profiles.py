"""The Hypothesis profiles of replayllm's property tests, for your policy's tests too.

- ``ci``: 100 examples per property, 40 state-machine steps, derandomized (every run tries the
  same examples), no example database: CI, mutation checks.
- ``deep``: 3000 examples, 80 steps, random seeds and the example database (``.hypothesis/``), so
  a failure found once is replayed first next time: before a release, after a scheduler change.
- ``dev``: 10 examples, 20 steps, derandomized: a smoke run while editing.

All three have no deadline and let slow or large examples through (a workload runs an engine).
``replay.testing.strategies.scaled(f)`` scales the active profile's ``max_examples``, so a test
written with it deepens with the profile.

The pytest plugin (``replay.testing.pytest_plugin``) registers them when pytest starts; select one
with ``pytest --hypothesis-profile=deep`` (Hypothesis's own option) or ``HYPOTHESIS_PROFILE=deep``.
Without either, Hypothesis's ``default`` profile stays active. Outside pytest, call
``register_profiles()`` then ``hypothesis.settings.load_profile(name)``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("ci", "deep", "dev")
# The environment variable naming the profile to load (the project's own tests default to ci).
ENV = "HYPOTHESIS_PROFILE"

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def register_profiles() -> None:
    """Register ``ci``, ``deep`` and ``dev`` with Hypothesis (loads none; safe to call again)."""
    settings.register_profile(
        "ci",
        max_examples=100,
        stateful_step_count=40,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        "deep",
        max_examples=3000,
        stateful_step_count=80,
        deadline=None,
        print_blob=True,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        "dev",
        max_examples=10,
        stateful_step_count=20,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=_SLOW_OK,
    )


def load_profile(name: str, *, no_shrink: bool = False) -> str:
    """Register the profiles and load ``name``; returns the name of the profile now active.

    ``no_shrink``: the same examples as ``name``, but a failure is reported as found, without
    shrinking (``<name>-noshrink``; a mutation check only needs to know that a test fails).
    """
    register_profiles()
    if no_shrink:
        settings.register_profile(
            f"{name}-noshrink",
            parent=settings.get_profile(name),
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
        )
        name = f"{name}-noshrink"
    settings.load_profile(name)
    return name


def registered() -> list[str]:
    """The names of the Hypothesis profiles registered now (ours, Hypothesis's own, a
    conftest's), for a message naming the choices. Hypothesis keeps them in a private mapping
    and has no public list; without it, ours and ``default``."""
    names = getattr(settings, "_profiles", None)
    return sorted(names) if isinstance(names, dict) else [*PROFILES, "default"]


def profile_from_env(default: str | None = None) -> str | None:
    """The profile ``HYPOTHESIS_PROFILE`` names, else ``default``."""
    return os.environ.get(ENV) or default
