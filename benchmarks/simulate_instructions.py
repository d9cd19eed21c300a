"""Instructions per simulated request: the streaming simulator's cost where load cannot reach it.

Run: ``python -m benchmarks.simulate_instructions --requests 1000`` (from a tree's root, with
valgrind installed). It runs ``python -m benchmarks.simulate_scale --mode stream --one N`` under
``valgrind --tool=callgrind`` for N = 1 and N = ``--requests`` (the workload files must exist:
``python -m benchmarks.simulate_scale --mode stream --sizes 1,1000`` writes them) and prints the
instructions executed per request, ``(I(N) - I(1)) / (N - 1)``: imports, the cost-model fit and
the final tables cancel. The count is exact and repeats to the digit for one tree
(``PYTHONHASHSEED`` is fixed, so set and dict orders repeat); it is not time (a numpy call's
instructions are cheap next to its cache misses), but unlike CPU seconds on a shared machine it
does not move with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(requests: int) -> int:
    """Instructions callgrind counts for a streamed run of ``requests`` requests."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
               "-m", "benchmarks.simulate_scale", "--mode", "stream", "--one", str(requests)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    found = COLLECTED.search(done.stderr)
    if found is None:
        raise SystemExit(f"no callgrind total in: {done.stderr[-500:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args(argv)
    one, many = instructions(1), instructions(args.requests)
    print(json.dumps({"requests": args.requests, "instructions_1": one,
                      f"instructions_{args.requests}": many,
                      "per_request": round((many - one) / (args.requests - 1))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
