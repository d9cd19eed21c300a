"""A prompt token's host path through the engine, stage by stage, on the CPU.

Each prompt token is handled on the engine's thread several times before its first step ends:
``LLM.add_request`` checks it and the ``Sequence`` and its ``request_added`` event copy it
(``add``); the recorder hands the event to Arrow every few steps (``stage``); its prefill
gathers it into the step's inputs and writes it to the device's staging buffer (``prefill``);
and while its request waits or runs, every full pass of Python's garbage collector visits
whatever holds it (``young_gc``: the young-generation pass that first meets what the adds
allocated, the kind a burst of adds triggers; ``full_gc``: one full pass with all of them
queued, less the pass without them). Under arrivals all of it delays the next step; ``sum``
adds the first four, what one token costs once (docs/BENCHMARKS.md 7ae).

This times each stage on the embedded tiny model (no step run; the prefill part is the host
side of ``engine.runner.step_inputs`` and a numpy staging buffer shaped like the CUDA graphs').
``--compare REV`` runs the same measurement on the engine of git revision REV in a child
process (``git archive`` of its ``engine`` and ``tracing``), alternating with this tree's, so
the two are measured in one run on one machine.

    python -m benchmarks.prompt_path [--lengths 300,2000,6000] [--requests 120] [--rounds 2]
        [--compare REV] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BATCH_TOKENS = 16384  # a prefill's token budget: the H200 matrix's max_num_batched_tokens


def _seconds(run: Any, repeats: int = 3) -> float:
    """The median of ``repeats`` timings of ``run()``."""
    out = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        out.append(time.perf_counter() - began)
    return statistics.median(out)


def time_prompt_path(length: int, requests: int, seed: int = 0) -> dict[str, Any]:
    """Per prompt token, nanoseconds of each stage of ``length``-token prompts (random ids,
    given as lists of ints as a tokenizer or a JSON workload gives them), ``requests`` of
    them queued on a fresh engine."""
    import numpy as np

    from engine import LLM, SamplingParams
    from engine.model.checkpoint import default_model_dir
    from engine.runner.step_inputs import payload_from_batch
    from tracing.convert import columns_to_table
    from tracing.events import EventBuffer

    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 10000) for _ in range(length)] for _ in range(requests)]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    tokens = length * requests
    with tempfile.TemporaryDirectory() as out:
        llm = LLM(str(default_model_dir()), trace_dir=f"{out}/trace",
                  max_model_len=max(length + 1, 4096),
                  max_num_batched_tokens=max(length, BATCH_TOKENS), max_num_seqs=512,
                  kvcache_block_size=256, num_kvcache_blocks=requests * (-(-length // 256)) + 8)
        gc.collect()
        empty_pass = _seconds(gc.collect)
        gc.disable()  # what the adds allocate stays young for one timed young pass
        try:
            began = time.perf_counter()
            for prompt in prompts:
                llm.add_request(prompt, params)
            added = time.perf_counter() - began
            began = time.perf_counter()
            gc.collect(0)
            young_pass = time.perf_counter() - began
        finally:
            gc.enable()
        full_pass = _seconds(gc.collect)
        waiting = list(llm.core.scheduler.waiting)
        events = EventBuffer()
        for seq in waiting:
            events.emit_request_added(seq.seq_id, 0.0, seq.token_ids, 0.0, 1, True)
        table = events.drain()["request_added"]
        stage = _seconds(lambda: columns_to_table("request_added", table))
        batch = llm.core.scheduler.schedule()
        staging = np.zeros((2, max(length, BATCH_TOKENS)), dtype=np.int64)

        def prefill() -> None:
            payload = payload_from_batch(batch, decode=False)
            staging[0, : len(payload.input_ids)] = payload.input_ids

        batch_tokens = sum(batch.num_new_tokens)
        prefill_s = _seconds(prefill)
        llm.close()
    per = 1e9 / tokens
    return {"prompt_tokens": length, "requests": requests,
            "add_ns": added * per, "stage_ns": stage * per,
            "prefill_ns": prefill_s * 1e9 / batch_tokens,
            "young_gc_ns": young_pass * per,
            "full_gc_ns": max(full_pass - empty_pass, 0.0) * per}


def _rows_of(tree: Path | None, lengths: list[int], requests: int) -> list[dict[str, Any]]:
    """This tree's rows, or (``tree``) those of the engine archived there, in a child."""
    if tree is None:
        return [time_prompt_path(n, requests) for n in lengths]
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT}")
    code = (f"import json, sys; sys.path.insert(0, {str(tree)!r}); "
            "from benchmarks.prompt_path import time_prompt_path as t; "
            f"print(json.dumps([t(n, {requests}) for n in {lengths!r}]))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _archive(rev: str, into: Path) -> Path:
    """``engine`` and ``tracing`` of git revision ``rev``, with this benchmark beside them."""
    archive = subprocess.run(["git", "archive", rev, "engine", "tracing"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", str(into)], input=archive, check=True)
    (into / "benchmarks").mkdir()
    (into / "benchmarks" / "__init__.py").write_text("")
    (into / "benchmarks" / "prompt_path.py").write_text(Path(__file__).read_text())
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="300,2000,6000", help="prompt lengths, comma-joined")
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=2, help="alternations with --compare")
    parser.add_argument("--compare", metavar="REV", help="also the engine of this git revision")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",") if n]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        other = _archive(args.compare, Path(scratch)) if args.compare else None
        trees = [("this tree", None), (args.compare, other)] if other else [("this tree", None)]
        for round_ in range(max(args.rounds, 1) if other else 1):
            for name, tree in trees:
                for row in _rows_of(tree, lengths, args.requests):
                    rows.append({"engine": name, "round": round_, **row})
    names = ["add", "stage", "prefill", "young_gc", "full_gc"]
    print("| engine | round | prompt tokens | " + " | ".join(f"{n} ns/token" for n in names)
          + " | sum ns/token |")
    print("|---" * (len(names) + 4) + "|")
    for row in rows:
        values = [row[f"{n}_ns"] for n in names]
        print(f"| {row['engine']} | {row['round']} | {row['prompt_tokens']:,} | "
              + " | ".join(f"{v:.1f}" for v in values) + f" | {sum(values[:4]):.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
