"""The README's Python example as a user runs it: a fresh process, after ``make demo``.

Extracts the first ``python`` block of README.md, makes sure the embedded tiny model is cached
(as ``make demo`` leaves it; not timed), then runs the example ``--runs`` times, each in a new
interpreter in an empty directory, and prints whole-process wall time and CPU time (user+sys of
the child, from ``wait4``; on a loaded machine read the CPU time). With ``--old COMMIT`` the
same example also runs on that commit's tree (``git archive``), interleaved with this tree's
runs, so the ratio comes from one session.

    .venv/bin/python benchmarks/readme_example.py --runs 5 --old 4385d3f
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def readme_example(readme: Path) -> str:
    """The first ``python`` code block of ``readme``."""
    found = _PYTHON_BLOCK.search(readme.read_text(encoding="utf-8"))
    if found is None:
        raise SystemExit(f"no ```python block in {readme}")
    return found.group(1)


def export_tree(commit: str, into: Path) -> Path:
    """``commit``'s tree (``git archive``) unpacked under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_once(python: str, tree: Path, script: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh process running ``script`` with ``tree`` importable."""
    with tempfile.TemporaryDirectory(prefix="readme-example-") as cwd:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        began = time.perf_counter()
        child = subprocess.Popen([python, str(script)], cwd=cwd, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - began
        stderr = child.stderr.read().decode(errors="replace") if child.stderr else ""
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise SystemExit(f"the example failed in {tree} (exit {child.returncode}):\n{stderr}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--old", help="a commit to time as well (its tree via git archive)")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="readme-bench-") as work:
        script = Path(work) / "readme_example.py"
        script.write_text(readme_example(ROOT / "README.md"), encoding="utf-8")
        trees = {"new": ROOT}
        if args.old:
            trees["old"] = export_tree(args.old, Path(work) / "old")
        for tree in trees.values():  # the tiny model, as `make demo` leaves it (not timed)
            subprocess.run([args.python, "-c", "from engine.model.checkpoint import "
                            "default_model_dir; default_model_dir()"],
                           env={**os.environ, "PYTHONPATH": str(tree)}, check=True)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, tree in trees.items():
                times[name].append(run_once(args.python, tree, script))
    with open("/proc/loadavg") if Path("/proc/loadavg").exists() else open(os.devnull) as f:
        load = f.read().split()[:3]
    print(f"README example, {args.runs} fresh processes per tree, {os.cpu_count()} CPUs, "
          f"load average {' '.join(load) or 'n/a'}")
    print(f"{'tree':<5} {'wall median':>12} {'wall min':>9} {'CPU median':>11} {'CPU min':>8}")
    for name, runs in times.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"{name:<5} {statistics.median(walls):>11.2f}s {min(walls):>8.2f}s "
              f"{statistics.median(cpus):>10.2f}s {min(cpus):>7.2f}s")
    if "old" in times:
        cpu = {n: statistics.median(c for _, c in r) for n, r in times.items()}
        print(f"CPU time old/new: {cpu['old'] / cpu['new']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
