"""The Hypothesis profiles ship with ``replay.testing``: a user's own package, with none of the
project's conftest, selects ``ci``, ``deep`` or ``dev`` with ``--hypothesis-profile`` or
``HYPOTHESIS_PROFILE``, and ``strategies.scaled`` follows it (the profiles lived only in
tests/conftest.py: ``--hypothesis-profile=deep`` was "no such profile" and ``scaled`` fell back to
Hypothesis's defaults). The project's suite loads the same definitions."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from replay.testing import register_profiles

REPO = Path(__file__).resolve().parents[3]

USER_TEST = '''
from hypothesis import given, settings, strategies as st

from replay.testing.strategies import scaled


@given(st.integers())
def test_reads_the_profile(n):
    pass


def test_prints_the_profile():
    print("PROFILE", settings.get_current_profile_name(), settings.default.max_examples,
          scaled(0.5), settings.default.derandomize)
'''


def _user_pytest(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """pytest in a user's directory (no conftest of ours) on a test file of theirs."""
    (tmp_path / "test_my_policy.py").write_text(USER_TEST)
    installed = any(ep.value == "replay.testing.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "replay.testing.pytest_plugin"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *plugin, *args,
         "test_my_policy.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **(env or {})},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("args, env, line", [
    (["--hypothesis-profile=deep"], {}, "PROFILE deep 3000 1500 False"),
    (["--hypothesis-profile=ci"], {}, "PROFILE ci 100 50 True"),
    ([], {"HYPOTHESIS_PROFILE": "dev"}, "PROFILE dev 10 5 True"),
    (["--hypothesis-profile=ci"], {"HYPOTHESIS_PROFILE": "dev"}, "PROFILE ci 100 50 True"),
    ([], {}, "PROFILE default 100 50 False"),
])
def test_a_users_package_selects_a_shipped_profile(
    tmp_path: Path, args: list[str], env: dict[str, str], line: str
) -> None:
    out = _user_pytest(tmp_path, *args, env=env)
    assert line in out and "2 passed" in out, out[-3000:]


def test_the_projects_suite_loads_the_shipped_definitions() -> None:
    active = settings.get_current_profile_name().removesuffix("-noshrink")
    mine = settings.get_profile(active)
    register_profiles()  # again: the one definition, unchanged
    assert active in ("ci", "deep", "dev")
    assert settings.get_profile(active).max_examples == mine.max_examples
    assert settings.default.deadline is None
