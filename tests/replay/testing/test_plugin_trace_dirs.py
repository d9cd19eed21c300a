"""``assert_replays`` and ``pytest --replayllm-traces`` on a directory as users keep one: besides
good traces, a foreign or damaged ``run.json``, a recording killed before its first commit and
one killed later. Each unreadable one is a failed case of one line (it was a page of traceback
through tracing/reader.py); a killed recording that replays passes with a warning saying only
its committed steps were checked (it passed silently)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replay.testing.replays import IncompleteTraceWarning, ReplayMismatch, assert_replays

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "traces" / "cpu-tiny-demo"


def _traces(root: Path) -> Path:
    """good, foreign (run.json not ours), badjson, zero (killed before a commit), mid (killed
    after the first of its two segments)."""
    shutil.copytree(DEMO, root / "good")
    (root / "foreign").mkdir(parents=True)
    (root / "foreign" / "run.json").write_text('{"hello": 1}')
    (root / "badjson").mkdir()
    (root / "badjson" / "run.json").write_text("not json")
    (root / "zero").mkdir()
    shutil.copy(DEMO / "run.json", root / "zero" / "run.json")
    shutil.copytree(DEMO, root / "mid")
    (root / "mid" / "summary.json").unlink()
    (root / "mid" / "_commits" / "seg-000001.json").unlink()
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("not a trace")
    return root


@pytest.mark.parametrize("name, line", [
    ("foreign", "cannot read the trace: {t}/run.json: no schema_version"),
    ("badjson", "cannot read the trace: {t}/run.json: trace header is not valid JSON"),
    ("zero", "{t}: cannot replay: incomplete trace with no committed step"),
])
def test_an_unreadable_trace_is_a_one_line_mismatch(tmp_path: Path, name: str, line: str) -> None:
    trace = _traces(tmp_path) / name
    with pytest.raises(ReplayMismatch) as failure:
        assert_replays(trace)
    text = str(failure.value)
    assert text.startswith(line.format(t=trace)) and "\n" not in text, text


def test_a_killed_trace_passes_with_a_warning(tmp_path: Path) -> None:
    trace = _traces(tmp_path) / "mid"
    with pytest.warns(IncompleteTraceWarning, match="mid is incomplete .* through step 63"):
        assert assert_replays(trace).identical


def test_the_plugin_reports_each_bad_trace_in_one_line(tmp_path: Path) -> None:
    root = _traces(tmp_path / "traces")
    (tmp_path / "empty_test.py").write_text("")
    installed = any(ep.value == "replay.testing.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "replay.testing.pytest_plugin"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *plugin, "--replayllm-traces", str(root),
         str(tmp_path / "empty_test.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    out = done.stdout
    assert done.returncode == 1 and "3 failed, 2 passed, 1 warning" in out, out[-3000:]
    assert "Traceback" not in out and "tracing/reader.py" not in out, out[-3000:]
    assert "IncompleteTraceWarning" in out


def test_trace_cases_are_collected_counted_and_selected(tmp_path: Path) -> None:
    """The cases are made during collection, not added to the items afterwards: ``--collect-only``
    counts them and ``-k`` selects among them (it was "no tests collected" while listing every
    trace, and ``-k`` ran them all)."""
    root = tmp_path / "traces"
    shutil.copytree(DEMO, root / "a" / "one")
    shutil.copytree(DEMO, root / "two")
    (tmp_path / "empty_test.py").write_text("")
    installed = any(ep.value == "replay.testing.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "replay.testing.pytest_plugin"]

    def collect(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
             *plugin, "--replayllm-traces", str(root), *args, str(tmp_path / "empty_test.py")],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    out = collect()
    assert "traces/a/one/run.json::replays" in out and "traces/two/run.json::replays" in out, out
    assert "2 tests collected" in out, out
    out = collect("-k", "two")
    assert "a/one" not in out and "1/2 tests collected (1 deselected)" in out, out


def _ids(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "::" in line]


def test_trace_cases_have_node_ids_rooted_at_their_trace_and_are_selected_by_them(
        pytester: pytest.Pytester) -> None:
    """A case's node id was ``::replayllm-traces[DIR]::a/one``: rooted nowhere (a leading
    ``::``) and no argument could select it. It is now its trace's ``run.json`` path from the
    rootdir, as a test file's, and ``pytest ID`` runs that case alone."""
    root = pytester.path / "traces"
    shutil.copytree(DEMO, root / "a" / "one")
    shutil.copytree(DEMO, root / "two")
    pytester.makepyfile(test_empty="")
    want = ["traces/a/one/run.json::replays", "traces/two/run.json::replays"]
    for traces in ("traces", str(root)):  # relative or absolute: the same ids
        result = pytester.runpytest("--collect-only", "-q", "--replayllm-traces", traces,
                                    "test_empty.py")
        assert _ids(result) == want, result.outlines
    # The default arguments (the rootdir) hold the traces: each is still collected once.
    result = pytester.runpytest("--collect-only", "-q", "--replayllm-traces", "traces")
    assert _ids(result) == want, result.outlines
    # Selected by its node id, or by its directory: that case alone.
    for selection in (want[1], "traces/two", "traces/two/run.json"):
        result = pytester.runpytest("--collect-only", "-q", "--replayllm-traces", "traces",
                                    selection)
        assert _ids(result) == [want[1]], (selection, result.outlines)
    result = pytester.runpytest("-q", "-p", "no:cacheprovider", "--replayllm-traces", "traces",
                                want[0], "--replayllm-no-invariants")
    result.assert_outcomes(passed=1)


def test_a_trace_selected_through_a_symlinked_directory_runs_alone(
        pytester: pytest.Pytester) -> None:
    """``traces`` a symlink to the directory that holds them (as a checkout's link to a shared
    store): ``pytest --replayllm-traces traces traces/two`` collects that case alone. Before,
    the plugin resolved the link for its roots but not for the command-line paths, never saw
    the selection inside them, and ran every trace (333 cases, about ten minutes, for one)."""
    store = pytester.path / "store"
    shutil.copytree(DEMO, store / "a" / "one")
    shutil.copytree(DEMO, store / "two")
    (pytester.path / "traces").symlink_to(store, target_is_directory=True)
    for selection in ("traces/two", "traces/two/run.json"):
        result = pytester.runpytest("--collect-only", "-q", "--replayllm-traces", "traces",
                                    selection)
        ids = _ids(result)
        assert len(ids) == 1 and "two/run.json::replays" in ids[0], (selection, result.outlines)
    result = pytester.runpytest("--collect-only", "-q", "--replayllm-traces", "traces")
    assert len(_ids(result)) == 2, result.outlines
