"""The machine's own stalls, as a process that only reads the clock sees them.

A probe process pinned to one CPU reads ``time.perf_counter`` in a tight loop (an iteration
takes well under a microsecond) and keeps every gap longer than ``--gap-ms``: a time the OS or
the hypervisor did not run it. Stalls of an engine's steps that coincide with the probe's gaps
are the machine's, not the engine's (``benchmarks.gc_pauses`` attributes them).
``perf_counter`` is CLOCK_MONOTONIC on Linux, the same clock in every process, so the probe's
gaps line up with the engine's step times.

    python -m benchmarks.host_probe OUT.json [--gap-ms 1.0] [--cpu N]

Runs until SIGTERM or SIGINT, then writes ``{"gaps": [[start, seconds], ...], "loops": N}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def probe(out: Path, gap_s: float, cpu: int | None) -> None:
    """Read the clock until told to stop; write the gaps longer than ``gap_s`` to ``out``."""
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    stop = False

    def on_signal(_signum: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    gaps: list[list[float]] = []
    loops = 0
    ready_file(out).touch()  # the loop starts now: HostProbe waits for this
    last = time.perf_counter()
    while not stop:
        now = time.perf_counter()
        if now - last > gap_s:
            gaps.append([last, now - last])
        last = now
        loops += 1
    out.write_text(json.dumps({"gaps": gaps, "loops": loops}))


def ready_file(out: Path) -> Path:
    """The file a probe writing to ``out`` creates as it enters its loop."""
    return out.with_name(out.name + ".ready")


class HostProbe:
    """A probe process for the span of a ``with`` block (entered once the probe's loop runs);
    ``gaps`` holds its gaps after it."""

    def __init__(self, out: Path, gap_s: float = 0.001, cpu: int | None = None) -> None:
        self.out = out
        self.gap_s = gap_s
        self.cpu = (os.cpu_count() or 1) - 1 if cpu is None else cpu
        self.gaps: list[tuple[float, float]] = []
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> HostProbe:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.host_probe", str(self.out),
             "--gap-ms", str(self.gap_s * 1e3), "--cpu", str(self.cpu)])
        deadline = time.monotonic() + 60
        while not ready_file(self.out).exists():  # a run before the loop would go unwatched
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("benchmarks.host_probe did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGTERM)
        self._process.wait(timeout=30)
        if self.out.exists():
            self.gaps = [(start, seconds) for start, seconds in
                         json.loads(self.out.read_text())["gaps"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_probe",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--cpu", type=int, default=None)
    args = parser.parse_args(argv)
    probe(args.out, args.gap_ms / 1e3, args.cpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
