"""Test-wide setup: Hypothesis profiles.

The profiles are defined once, in ``replay.testing.profiles`` (shipped to users' policy tests by
the pytest plugin); this file loads one for the project's suite. Profiles (select with
``HYPOTHESIS_PROFILE=<name>`` or ``--hypothesis-profile=<name>``; ``ci`` is the default, used by
``make test``):

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
import textwrap
from pathlib import Path

import pytest

# pytest puts tests/ first on sys.path for this conftest; tests/engine, tests/tracing and
# tests/replay would then shadow the real packages (as namespace packages) wherever the repository
# root is not importable by other means (a bare `pytest` without an installed project). The root
# goes first instead.
_ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)

from replay.testing.profiles import load_profile, profile_from_env  # noqa: E402

# ci unless HYPOTHESIS_PROFILE names another; `--hypothesis-profile NAME` (Hypothesis's plugin)
# loads NAME after this, at pytest_configure.
load_profile(profile_from_env("ci"), no_shrink=os.environ.get("HYPOTHESIS_NO_SHRINK") == "1")


@pytest.fixture
def policy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a user policy module under tmp_path (importable by name); returns a writer,
    ``write(name, body) -> name`` (the policy tests' modules, engine and replay.testing alike)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        sys.modules.pop(name, None)
        return name

    yield write
