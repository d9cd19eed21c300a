"""pytest plugin: every trace under a directory becomes a regression test case.

Registered as the ``replayllm`` entry point of ``pytest11`` (pyproject.toml), so it loads with
the installed package; without the option it does nothing.

    pytest --replayllm-traces traces/            # one test per trace: replays identically,
                                                 # and every invariant holds over its events
    pytest --replayllm-traces traces/ --replayllm-no-invariants   # replay only

A trace is a directory holding ``run.json``; its case's node id is ``DIR/run.json::replays``,
DIR the trace's path from the rootdir, as a test file's (``pytest --replayllm-traces traces/
traces/a/run.json::replays`` runs that one case, and so does ``traces/a``). A case fails with
``verify``'s report (the first divergence) or the invariant checker's, and says first when the
recorded user policy's source has changed since the recording; one that is no readable trace
fails in one line, and a killed recording passes on what it committed with an
``IncompleteTraceWarning``.

It also registers the Hypothesis profiles ``ci``, ``deep`` and ``dev`` (``replay.testing.profiles``)
where Hypothesis is installed: ``pytest --hypothesis-profile=deep`` or ``HYPOTHESIS_PROFILE=deep``
selects one for the property tests of your policy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

HEADER_FILE = "run.json"
ENTRY_POINT = "replayllm"  # pyproject.toml's pytest11 entry

try:  # Hypothesis is optional (the ``testing`` extra); the trace cases do not need it.
    from replay.testing import profiles as _profiles
except ImportError:  # pragma: no cover - depends on the environment
    _profiles = None  # type: ignore[assignment]
else:
    # At import, before any pytest_configure: Hypothesis's own plugin loads the profile named by
    # --hypothesis-profile there, and a conftest may load one at its import.
    _profiles.register_profiles()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Registered under one of its two names (the ``replayllm`` entry point, or this module's
    path from a conftest's ``pytest_plugins`` or ``-p``), the plugin blocks the other, so naming
    it both ways finds it already there instead of registering the module twice: pluggy's
    ``ValueError: Plugin already registered under a different name`` and a page of traceback,
    before any test ran."""
    name = pluginmanager.get_name(sys.modules[__name__])
    for other in (ENTRY_POINT, __name__):
        if name is not None and other != name and pluginmanager.get_plugin(other) is None:
            pluginmanager.set_blocked(other)


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's own, which loads --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    """``HYPOTHESIS_PROFILE=ci|deep|dev`` loads that profile (``--hypothesis-profile`` wins); a
    profile the user's conftest registered loads the same way, and a name no profile has is a
    usage error (it ran Hypothesis's ``default`` in silence: a "deep" run of 100 examples), by
    the variable or by the option (Hypothesis's plugin made that an INTERNALERROR and a page of
    traceback)."""
    if _profiles is None:
        return
    option = config.getoption("--hypothesis-profile", None)
    if option:
        from hypothesis import settings
        from hypothesis.errors import InvalidArgument

        try:
            settings.get_profile(option)
        except InvalidArgument:
            raise pytest.UsageError(_unknown_profile(f"--hypothesis-profile={option!r}")) \
                from None
        return  # Hypothesis's plugin loads it
    name = _profiles.profile_from_env()
    if name in _profiles.PROFILES:
        _profiles.load_profile(name, no_shrink=os.environ.get("HYPOTHESIS_NO_SHRINK") == "1")
    elif name:
        from hypothesis import settings
        from hypothesis.errors import InvalidArgument

        try:
            settings.load_profile(name)
        except InvalidArgument:
            raise pytest.UsageError(_unknown_profile(f"{_profiles.ENV}={name!r}")) from None


def _unknown_profile(given: str) -> str:
    known = ", ".join(_profiles.registered())
    return (f"{given} names no registered Hypothesis profile (registered: {known}; a conftest "
            "registers its own with settings.register_profile)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("replayllm")
    group.addoption(
        "--replayllm-traces",
        action="append",
        default=[],
        metavar="DIR",
        help="turn every trace under DIR into a test case (replays identically, invariants hold)",
    )
    group.addoption(
        "--replayllm-no-invariants",
        action="store_true",
        help="with --replayllm-traces: check only that each trace replays identically",
    )


def find_traces(root: Path) -> list[Path]:
    """Trace directories at or under ``root`` (those holding a run.json), sorted."""
    if (root / HEADER_FILE).is_file():
        return [root]
    # A directory named run.json is no header: it was a case failing "no run.json".
    return sorted(p.parent for p in root.rglob(HEADER_FILE) if p.is_file())


class TraceItem(pytest.Item):
    """One trace: ``assert_replays`` on it."""

    def __init__(self, *, trace: Path, invariants: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trace = trace
        self.invariants = invariants

    def runtest(self) -> None:
        from replay.testing.replays import assert_replays

        assert_replays(self.trace, invariants=self.invariants)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from replay.testing.replays import ReplayMismatch

        if isinstance(excinfo.value, ReplayMismatch):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.trace, 0, f"trace {self.trace}"


ITEM_NAME = "replays"


def _node_path(config: pytest.Config, path: Path) -> str:
    """A node id's path part: ``path`` relative to the rootdir, as pytest writes a test file's
    (absolute where it is outside the rootdir)."""
    try:
        return path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return path.as_posix()


class TraceFile(pytest.File):
    """A trace's ``run.json``: its one case, node id ``<trace dir>/run.json::replays`` (the
    trace's path from the rootdir, as a test file's), which ``pytest ID`` selects."""

    def collect(self) -> list[pytest.Item]:
        invariants = not self.config.getoption("--replayllm-no-invariants")
        return [TraceItem.from_parent(self, name=ITEM_NAME, trace=self.path.parent,
                                      invariants=invariants)]


def _trace_file(parent: pytest.Collector, path: Path) -> TraceFile:
    return TraceFile.from_parent(parent, path=path, nodeid=_node_path(parent.config, path))


class TraceDirectory(pytest.Directory):
    """The traces under one ``--replayllm-traces`` directory that no command-line argument
    reaches (node id: its path, as a test directory's)."""

    def collect(self) -> list[pytest.File]:
        traces = find_traces(self.path)
        if not traces:
            raise pytest.UsageError(_no_traces(self.path))
        return [_trace_file(self, t / HEADER_FILE) for t in traces]


def _no_traces(root: Path) -> str:
    """Why ``--replayllm-traces ROOT`` has no case, in one line: a missing path (a typo) was
    "no trace (run.json) under it", as if the directory were there and empty."""
    if not root.exists():
        return f"--replayllm-traces {root}: no such directory"
    if root.is_file():
        return f"--replayllm-traces {root}: a file; name the trace directory holding it"
    return f"--replayllm-traces {root}: no trace (run.json) under it"


def _roots(config: pytest.Config) -> list[Path]:
    """The ``--replayllm-traces`` directories, absolute, none inside another (counted once)."""
    roots = sorted({Path(d).resolve() for d in config.getoption("--replayllm-traces")})
    return [r for r in roots if not any(o in r.parents for o in roots)]


def _arguments_inside(session: pytest.Session, root: Path) -> bool:
    """Whether a command-line path is ``root`` or inside it (``pytest ID`` selecting a trace):
    then pytest's own collection reaches the traces it names (``pytest_collect_file``)."""
    initial = getattr(session, "_initialpaths", frozenset())  # the arguments' paths
    # Resolved as the roots are (``_roots``): through a symlinked directory, a selection inside
    # it was never seen inside, and every trace ran instead of the one asked for.
    resolved = (Path(p).resolve() for p in initial)
    return any(p == root or root in p.parents for p in resolved)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> TraceFile | None:
    """A trace's ``run.json`` reached by a command-line path inside a ``--replayllm-traces``
    directory (``pytest --replayllm-traces T T/a/run.json::replays``, or ``T/a``)."""
    if file_path.name != HEADER_FILE:
        return None
    resolved = file_path.resolve()
    for root in _roots(parent.config):
        if (resolved.parent == root or root in resolved.parents) and \
                _arguments_inside(parent.session, root):
            return _trace_file(parent, file_path)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """The session's collection also yields one ``TraceDirectory`` per ``--replayllm-traces``
    directory that no command-line path lies inside (those are collected from the paths).

    Added during collection proper (not to the item list afterwards), so the traces are collected,
    counted (``collected N items``, ``--collect-only``), selected (``-k``, ``--deselect``, node
    ids) and distributed like any test module's items.
    """
    report = yield
    if not isinstance(collector, pytest.Session) or not report.passed:
        return report
    config = collector.config
    for root in _roots(config):
        if not find_traces(root):
            raise pytest.UsageError(_no_traces(root))
        if not _arguments_inside(collector, root):
            report.result.append(TraceDirectory.from_parent(
                collector, path=root, nodeid=_node_path(config, root)))
    return report
