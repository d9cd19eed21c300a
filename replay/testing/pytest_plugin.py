"""pytest plugin: every trace under a directory becomes a regression test case.

Registered as the ``replayllm`` entry point of ``pytest11`` (pyproject.toml), so it loads with
the installed package; without the option it does nothing.

    pytest --replayllm-traces traces/            # one test per trace: replays identically,
                                                 # and every invariant holds over its events
    pytest --replayllm-traces traces/ --replayllm-no-invariants   # replay only

A trace is a directory holding ``run.json``. A case fails with ``verify``'s report (the first
divergence) or the invariant checker's, and says first when the recorded user policy's source
has changed since the recording; one that is no readable trace fails in one line, and a killed
recording passes on what it committed with an ``IncompleteTraceWarning``.

It also registers the Hypothesis profiles ``ci``, ``deep`` and ``dev`` (``replay.testing.profiles``)
where Hypothesis is installed: ``pytest --hypothesis-profile=deep`` or ``HYPOTHESIS_PROFILE=deep``
selects one for the property tests of your policy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

HEADER_FILE = "run.json"

try:  # Hypothesis is optional (the ``testing`` extra); the trace cases do not need it.
    from replay.testing import profiles as _profiles
except ImportError:  # pragma: no cover - depends on the environment
    _profiles = None  # type: ignore[assignment]
else:
    # At import, before any pytest_configure: Hypothesis's own plugin loads the profile named by
    # --hypothesis-profile there, and a conftest may load one at its import.
    _profiles.register_profiles()


def pytest_configure(config: pytest.Config) -> None:
    """``HYPOTHESIS_PROFILE=ci|deep|dev`` loads that profile (``--hypothesis-profile`` wins)."""
    if _profiles is None or config.getoption("--hypothesis-profile", None):
        return
    name = _profiles.profile_from_env()
    if name in _profiles.PROFILES:
        _profiles.load_profile(name, no_shrink=os.environ.get("HYPOTHESIS_NO_SHRINK") == "1")


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
    return sorted(p.parent for p in root.rglob(HEADER_FILE))


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


class TraceDirectory(pytest.Collector):
    """The traces under one ``--replayllm-traces`` directory."""

    def __init__(self, *, root: Path, invariants: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root = root
        self.invariants = invariants

    def collect(self) -> list[pytest.Item]:
        traces = find_traces(self.root)
        if not traces:
            raise pytest.UsageError(f"--replayllm-traces {self.root}: no trace (run.json) under it")
        return [
            TraceItem.from_parent(self, name=str(t.relative_to(self.root)) if t != self.root
                                  else t.name, trace=t, invariants=self.invariants)
            for t in traces
        ]


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """The session's collection also yields one ``TraceDirectory`` per ``--replayllm-traces``.

    Added during collection proper (not to the item list afterwards), so the traces are collected,
    counted (``collected N items``, ``--collect-only``), selected (``-k``, ``--deselect``) and
    distributed like any test module's items.
    """
    report = yield
    if not isinstance(collector, pytest.Session) or not report.passed:
        return report
    config = collector.config
    invariants = not config.getoption("--replayllm-no-invariants")
    for directory in config.getoption("--replayllm-traces"):
        root = Path(directory).resolve()
        if not find_traces(root):
            raise pytest.UsageError(f"--replayllm-traces {root}: no trace (run.json) under it")
        report.result.append(TraceDirectory.from_parent(
            collector, name=f"replayllm-traces[{directory}]", root=root, invariants=invariants
        ))
    return report
