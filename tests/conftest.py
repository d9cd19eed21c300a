"""Test-wide setup: Hypothesis profiles.

Profiles (select with ``HYPOTHESIS_PROFILE=<name>``; ``ci`` is the default, used by ``make test``):

- ``ci``: the whole property suite in well under 3 minutes on a 2-core machine. Derandomized, so a
  run explores the same examples every time (no flaky CI, stable mutation scores) and needs no
  example database.
- ``deep``: thousands of examples per property, longer state-machine runs, random seeds and the
  example database (``.hypothesis/``, kept out of git) so failures found once are replayed first.
- ``dev``: a quick smoke run while editing (a few examples per property).

``HYPOTHESIS_NO_SHRINK=1`` keeps the selected profile but skips shrinking (the mutation check uses
it: the examples tried are the same, a failure is just reported unshrunk).

Property tests take their example counts from the profile; a test that needs fewer or more
examples than its neighbours scales the profile's ``max_examples`` (``strategies.scaled``) rather
than fixing a number, so ``deep`` deepens every property.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings

# pytest puts tests/ first on sys.path for this conftest; tests/engine, tests/tracing and
# tests/replay would then shadow the real packages (as namespace packages) wherever the repository
# root is not importable by other means (a bare `pytest` without an installed project). The root
# goes first instead.
_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

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

_profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if os.environ.get("HYPOTHESIS_NO_SHRINK") == "1":
    # Used by tools/mutation_check.py: the same examples as the profile, but a failure is reported
    # as found, without spending time shrinking it (a mutant only needs to be caught).
    settings.register_profile(
        f"{_profile}-noshrink",
        parent=settings.get_profile(_profile),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
    )
    _profile = f"{_profile}-noshrink"
settings.load_profile(_profile)
