"""Session 33: ``HYPOTHESIS_PROFILE`` in a user's project names a profile that exists.

What these tests prove: a misspelt ``HYPOTHESIS_PROFILE`` (``Deep``, ``nightly`` never
registered) is one line naming it and the registered profiles, exit status 4 (pytest's usage
error), no test run; it silently ran Hypothesis's ``default`` profile (100 examples where 3000
were asked for: a deep run that passed without being deep). A profile of the user's own,
registered in their conftest, is loaded by the variable as ``ci``/``deep``/``dev`` are.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

USER_TEST = '''
from hypothesis import given, settings, strategies as st


@given(st.integers())
def test_reads_the_profile(n):
    pass


def test_prints_the_profile():
    print("PROFILE", settings.get_current_profile_name(), settings.default.max_examples)
'''

CONFTEST = '''
from hypothesis import settings

settings.register_profile("nightly", max_examples=7, deadline=None)
'''


def user_pytest(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                conftest: str | None = None) -> subprocess.CompletedProcess[str]:
    """A user's pytest run of ``USER_TEST`` (and ``conftest``) in ``tmp_path``, with the
    project's plugin, command-line ``args`` and environment ``env``."""
    (tmp_path / "test_my_policy.py").write_text(USER_TEST)
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(conftest)
    installed = any(ep.value == "replay.testing.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "replay.testing.pytest_plugin"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *plugin, *args,
         "test_my_policy.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **(env or {})},
    )


def test_a_misspelt_profile_is_a_usage_error_naming_the_profiles(tmp_path: Path) -> None:
    done = user_pytest(tmp_path, env={"HYPOTHESIS_PROFILE": "Deep"})
    output = done.stdout + done.stderr
    assert done.returncode == 4, output[-2000:]
    assert "HYPOTHESIS_PROFILE='Deep' names no registered Hypothesis profile" in output
    assert "(registered: ci, deep, default, dev;" in output and "Traceback" not in output
    assert "PROFILE" not in done.stdout  # no test ran


def test_a_profile_registered_in_the_users_conftest_is_loaded(tmp_path: Path) -> None:
    done = user_pytest(tmp_path, env={"HYPOTHESIS_PROFILE": "nightly"}, conftest=CONFTEST)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    assert "PROFILE nightly 7" in done.stdout
