"""The invariant checker over event streams: it passes the committed CPU trace and real runs, and
it names the violation when one event field disagrees with the state it reports: a wrong
refcount in ``block_freed``, a duplicated ``block_hashed``, an under-counted block claim, a hash
with prefix caching off (the bugs the committed traces once caught and no property did)."""

from __future__ import annotations

import copy
import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.config import Config
from replay.testing import RequestSpec, Workload, check_events, check_trace, run_workload

REPO = Path(__file__).resolve().parents[3]


def _recorded() -> tuple[dict, dict]:
    """A run that hits the prefix cache, hashes decode-filled blocks and preempts."""
    config = Config(kvcache_block_size=2, num_kvcache_blocks=6, max_model_len=16,
                    max_num_batched_tokens=16, max_num_seqs=4)
    requests = (
        RequestSpec(0, (2, 3, 4, 5), 6, True, (2, 3, 4, 5, 2, 3)),
        RequestSpec(0, (2, 3, 4, 5, 4), 6, True, (3, 3, 3, 3, 3, 3)),
        RequestSpec(2, (2, 3, 5), 4, True, (5, 5, 5, 5)),
    )
    run = run_workload(Workload(config, requests))
    run.raise_violations()
    tables = run.sink.tables
    assert tables["preempted"]["seq_id"] and tables["block_hit"]["seq_id"]
    return run.sink.header, tables


def _names(header: dict, tables: dict) -> list[str]:
    return check_events(header, tables).names()


def test_the_committed_cpu_trace_and_a_real_run_keep_every_invariant() -> None:
    report = check_trace(REPO / "traces" / "cpu-tiny-demo")
    assert report.ok, report.report()
    header, tables = _recorded()
    assert check_events(header, tables).ok


def test_a_wrong_refcount_in_block_freed_is_caught() -> None:
    header, tables = _recorded()
    bad = copy.deepcopy(tables)
    bad["block_freed"]["refcount"][0] += 1
    assert "refcounts" in _names(header, bad)


def test_a_duplicated_block_hashed_is_caught() -> None:
    header, tables = _recorded()
    bad = copy.deepcopy(tables)
    cols = bad["block_hashed"]
    for name, values in cols.items():  # the same event once more, right after the first
        values.insert(1, values[0] + 0.5 if name == "event_id" else values[0])
    assert "hash_chains" in _names(header, bad)


def test_an_under_counted_block_claim_is_caught() -> None:
    """The last block_allocated row of a sequence is dropped: its context no longer has a slot
    for every token, and the pool's free counts stop adding up."""
    header, tables = _recorded()
    bad = copy.deepcopy(tables)
    cols = bad["block_allocated"]
    last = max(i for i, s in enumerate(cols["seq_id"]) if s == cols["seq_id"][0]
               and cols["step"][i] == cols["step"][0])
    for values in cols.values():
        del values[last]
    names = _names(header, bad)
    assert "batch_fields" in names and "accounting" in names


def test_hashing_with_prefix_caching_off_is_caught() -> None:
    header, tables = _recorded()
    off = copy.deepcopy(header)
    off["config"]["enable_prefix_caching"] = False
    assert "hash_chains" in _names(off, tables)


def test_a_stream_that_never_finishes_a_request_is_caught() -> None:
    header, tables = _recorded()
    bad = copy.deepcopy(tables)
    for values in bad["request_finished"].values():
        del values[-1]
    assert "completion" in _names(header, bad)


POLICY = """
from engine.policy import Policy

class Sjf(Policy):
    def admit(self, waiting, step):
        for seq in sorted(waiting, key=lambda s: -s.num_tokens if {flip} else s.num_tokens):
            if seq.num_tokens > step.tokens_left:
                return
            yield seq
"""


def test_the_pytest_plugin_turns_each_trace_into_a_case(tmp_path: Path) -> None:
    """``--replayllm-traces DIR``: one case per trace under DIR; it passes while the trace
    replays, and fails with the note on the changed policy and the first divergence once the
    policy recorded in it decides otherwise."""
    from tracing.recorder import ParquetRecorder

    (tmp_path / "plug_sjf.py").write_text(textwrap.dedent(POLICY.format(flip=False)))
    sys.path.insert(0, str(tmp_path))
    try:
        config = Config(kvcache_block_size=2, num_kvcache_blocks=32, max_model_len=16,
                        max_num_batched_tokens=16, max_num_seqs=4, policy="plug_sjf:Sjf")
        requests = tuple(RequestSpec(0, tuple(range(n)), 2, True, (2, 2)) for n in (5, 2, 3))
        for name in ("a", "b"):
            sink = ParquetRecorder(tmp_path / "traces" / name, background=False, fsync=False)
            run_workload(Workload(config, requests), sink=sink, observe=False)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("plug_sjf", None)

    # Installed (make test installs the package), the plugin loads through its entry point;
    # from a bare checkout it is named on the command line.
    installed = any(ep.value == "replay.testing.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "replay.testing.pytest_plugin"]

    def pytest_run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             *plugin, "--replayllm-traces",
             str(tmp_path / "traces"), str(tmp_path / "empty_test.py")],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={"PYTHONPATH": f"{REPO}:{tmp_path}", "PATH": "/usr/bin:/bin"},
        )

    (tmp_path / "empty_test.py").write_text("")
    passing = pytest_run()
    assert passing.returncode == 0 and "2 passed" in passing.stdout, passing.stdout[-2000:]
    (tmp_path / "plug_sjf.py").write_text(textwrap.dedent(POLICY.format(flip=True)))
    failing = pytest_run()
    assert failing.returncode == 1 and "2 failed" in failing.stdout, failing.stdout[-2000:]
    assert "source changed since the recording" in failing.stdout
    assert "diverged at event" in failing.stdout


def test_the_plugin_is_registered_as_a_pytest_entry_point() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\nreplayllm = "replay.testing.pytest_plugin"' in text


@pytest.mark.parametrize("missing", ["nothing-here"])
def test_the_plugin_refuses_a_directory_without_traces(tmp_path: Path, missing: str) -> None:
    from replay.testing.pytest_plugin import find_traces

    assert find_traces(tmp_path) == []
    assert find_traces(REPO / "traces")[0].name == "cpu-tiny-demo"
