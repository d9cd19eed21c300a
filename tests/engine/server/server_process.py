"""The tests' ``replayllm serve`` subprocess: the benchmarks' ``Server`` (one harness) with the
tests' defaults: the tiny model, no start-up calibration, output kept in a log file that a
failing test shows."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.serve_server import Server, free_port

__all__ = ["ServerProcess", "free_port"]

START_TIMEOUT_S = 120.0


class ServerProcess(Server):
    """``replayllm serve`` recording to ``trace_dir`` (None: no trace) with ``extra`` arguments
    and ``settings`` (``--set``), on a free loopback port, its engine the server's default."""

    def __init__(self, trace_dir: Path | None, *extra: str, settings: tuple[str, ...] = ()) -> None:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-{os.getpid()}-{id(self)}.log"
        super().__init__(trace_dir, settings=("calibration_repeats=0", *settings), engine=None,
                         extra=extra, log=log_path, start_timeout_s=START_TIMEOUT_S)
