"""Full-precision what-if metrics of ten variants of the committed traces, as JSON.

Run it on the tree before a change and after, and compare the two files byte for byte: a change
meant to keep every prediction (a refactor, a speed-up) must give the same file; one that moves
predictions says which and why (and bumps the cost model's MODEL_VERSION).

    PYTHONPATH=. python tools/whatif_golden.py OUT.json
"""

from __future__ import annotations

import json
import sys

from replay import simulate

CASES: tuple[tuple[str, dict, str | None], ...] = (
    ("traces/h200-reference-s4", {}, "auto"),
    ("traces/h200-reference-s4", {"max_num_seqs": 64, "num_kvcache_blocks": 300}, "auto"),
    ("traces/h200-reference-s4", {"policy": "chunked", "max_num_batched_tokens": 2048}, "auto"),
    ("traces/h200-reference-s4", {"enforce_eager": True}, "auto"),
    ("traces/h200-reference-s4", {"prefill_graph_tokens": 0}, "auto"),
    ("traces/h200-constrained", {}, "auto"),
    ("traces/h200-constrained", {"max_num_seqs": 256, "num_kvcache_blocks": 4000}, "auto"),
    ("traces/h200-constrained", {"async_scheduling": False}, "auto"),
    ("traces/cpu-tiny-demo", {}, None),
    ("traces/cpu-tiny-demo", {"num_kvcache_blocks": 20}, "auto"),
)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/whatif_golden.py OUT.json", file=sys.stderr)
        return 2
    out = {}
    for source, overrides, timing in CASES:
        result = simulate(source, overrides, timing=timing, keep_events=False)
        key = f"{source} {sorted(overrides.items())} {timing}"
        out[key] = {"status": result.status, "notes": result.notes,
                    "metrics": {k: repr(v) for k, v in sorted(result.metrics.items())}}
    with open(argv[0], "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(len(out), "cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
