"""Session 32: the trace plugin in a project of its own, enabled from a conftest. Naming the
module there (``pytest_plugins = ["replay.testing.pytest_plugin"]``, or ``-p`` with it) while
the installed entry point had loaded it was pluggy's ``ValueError: Plugin already registered
under a different name`` and a page of traceback; a ``--replayllm-traces`` path that does not
exist read "no trace (run.json) under it", as if it were an empty directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "traces" / "cpu-tiny-demo"


def _project(root: Path, conftest: str) -> Path:
    shutil.copytree(DEMO, root / "traces" / "a")
    (root / "tests").mkdir()
    (root / "tests" / "conftest.py").write_text(conftest)
    (root / "tests" / "test_x.py").write_text("def test_ok():\n    pass\n")
    return root


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("conftest, args", [
    ('pytest_plugins = ["replay.testing.pytest_plugin"]\n', []),
    ('pytest_plugins = ["replayllm"]\n', []),
    ("", ["-p", "replay.testing.pytest_plugin"]),
])
def test_enabling_the_plugin_by_either_name_runs_the_traces(
        tmp_path: Path, conftest: str, args: list[str]) -> None:
    root = _project(tmp_path, conftest)
    done = _pytest(root, *args, "--replayllm-traces", "traces", "tests")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "2 passed" in out, out[-3000:]
    assert "Traceback" not in out and "already registered" not in out, out[-3000:]


@pytest.mark.parametrize("where, line", [
    ("nosuch", "--replayllm-traces {root}/nosuch: no such directory"),
    ("traces/a/run.json",
     "--replayllm-traces {root}/traces/a/run.json: a file; name the trace directory holding it"),
])
def test_a_missing_or_file_trace_root_says_what_it_is(tmp_path: Path, where: str,
                                                      line: str) -> None:
    root = _project(tmp_path, "")
    done = _pytest(root, "--replayllm-traces", where, "tests")
    out = done.stdout + done.stderr
    assert done.returncode == 4 and line.format(root=root.resolve()) in out, out[-3000:]
    assert "Traceback" not in out
