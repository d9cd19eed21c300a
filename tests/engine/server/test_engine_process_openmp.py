"""The engine process's OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``) unless the
user chose a policy. Before, its intra-op threads, alone in their process, spun at each
barrier; on a loaded 2-core machine a tiny-model step took ~2.8x as long as with ``--engine
thread`` (124 vs 45 ms, ``benchmarks/serve_modes.py``), and TTFT 4.5x."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.connection import Connection

import pytest

from engine.server import engine_proc


def _report(conn: Connection) -> None:
    conn.send({name: os.environ.get(name) for name in engine_proc.OPENMP_SPIN_VARIABLES})
    conn.close()


def _child_environment() -> dict:
    """What a process spawned as ``spawn_engine`` spawns the engine sees of the variables."""
    context = multiprocessing.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_report, args=(writer,))
    with engine_proc._engine_environment():
        process.start()
    writer.close()
    try:
        return reader.recv()
    finally:
        process.join(60)


def test_the_engine_process_starts_with_passive_openmp_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned with ``OMP_WAIT_POLICY=PASSIVE`` (in its environment from the start: the OpenMP
    runtime reads it when torch loads); this process's environment is as it was after."""
    for name in engine_proc.OPENMP_SPIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    seen = _child_environment()
    assert seen["OMP_WAIT_POLICY"] == "PASSIVE"
    assert all(name not in os.environ for name in engine_proc.OPENMP_SPIN_VARIABLES)


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "ACTIVE"),
                                         ("GOMP_SPINCOUNT", "1000")])
def test_a_users_openmp_wait_setting_is_kept(monkeypatch: pytest.MonkeyPatch, name: str,
                                             value: str) -> None:
    """A wait policy or spin count the user set reaches the engine as set, nothing added."""
    for other in engine_proc.OPENMP_SPIN_VARIABLES:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, value)
    seen = _child_environment()
    assert seen[name] == value
    assert {k: v for k, v in seen.items() if v is not None} == {name: value}
