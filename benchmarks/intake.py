"""Request intake: the host time ``LLM.add_request`` takes per prompt, by prompt length.

Under arrivals the live loop adds each request between two steps, outside any step's host time,
so the step after it is longer by that much (docs/BENCHMARKS.md 7j: about 0.5 ms a long prompt
on the H200's host). This times the add alone (token checks, the ``Sequence``, its
``request_added`` event) on the embedded tiny model, recording to a temporary trace, no step run.

    python -m benchmarks.intake [--lengths 300,4000] [--requests 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from typing import Any


def time_intake(length: int, requests: int, seed: int = 0) -> dict[str, Any]:
    """Median and mean seconds of ``add_request`` over ``requests`` prompts of ``length``
    random token ids, each added to a fresh engine's queue."""
    from engine import LLM, SamplingParams
    from engine.model.checkpoint import default_model_dir

    rng = random.Random(seed)
    prompts = [[rng.randrange(10000) for _ in range(length)] for _ in range(requests)]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    with tempfile.TemporaryDirectory() as out:
        llm = LLM(str(default_model_dir()), trace_dir=f"{out}/trace",
                  max_model_len=max(length + 1, 4096),
                  max_num_batched_tokens=max(length + 1, 16384),  # prefill_first takes it whole
                  kvcache_block_size=256, num_kvcache_blocks=max(8, -(-length // 256) + 1))
        seconds = []
        for prompt in prompts:
            began = time.perf_counter()
            llm.add_request(prompt, params)
            seconds.append(time.perf_counter() - began)
        llm.close()
    return {"prompt_tokens": length, "requests": requests,
            "median_s": statistics.median(seconds), "mean_s": statistics.mean(seconds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="300,4000", help="prompt lengths, comma-separated")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = [time_intake(int(n), args.requests) for n in args.lengths.split(",") if n]
    for row in rows:
        print(f"{row['prompt_tokens']:>6} tokens: median {row['median_s'] * 1e6:7.1f} us, "
              f"mean {row['mean_s'] * 1e6:7.1f} us ({row['requests']} requests)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
