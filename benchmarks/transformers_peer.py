"""The transformers peer of the engine benchmark: its continuous batching (paged SDPA, CUDA
graphs) on the same requests, run in a process of its own (``run_transformers_apart``) so that
each side has the whole GPU.

    python -m benchmarks.transformers_peer --model-dir DIR --json OUT [--num-seqs N]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HF_MAX_MEMORY_PERCENT = 0.8  # what transformers' own examples use; 0.9 ran out of memory


def run_transformers(model_dir: Path, requests: list[Any]) -> dict[str, Any]:
    """transformers' continuous batching (paged SDPA, CUDA graphs) on the same requests."""
    import torch
    import transformers
    from transformers import ContinuousBatchingConfig, GenerationConfig

    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.bfloat16, attn_implementation="paged|sdpa"
    ).cuda()
    gen = GenerationConfig(
        do_sample=True,
        temperature=requests[0].temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max(r.max_tokens for r in requests),
        eos_token_id=-1,
        pad_token_id=0,
    )
    cb = ContinuousBatchingConfig(use_cuda_graph=True, max_memory_percent=HF_MAX_MEMORY_PERCENT)
    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb, block=True, timeout=5
    ) as manager:
        torch.cuda.synchronize()
        began = time.perf_counter()
        for i, r in enumerate(requests):
            manager.add_request(
                list(r.prompt), request_id=f"r{i}", max_new_tokens=r.max_tokens, eos_token_id=-1
            )
        tokens = finished = 0
        while finished < len(requests):
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' generation thread stopped early")
                continue
            if result.is_finished():
                finished += 1
                tokens += len(result.generated_tokens)
        elapsed = time.perf_counter() - began
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {
        "output_tokens": tokens,
        "seconds": elapsed,
        "tok_s": tokens / elapsed,
        "transformers": transformers.__version__,
        "config": "paged|sdpa, use_cuda_graph=True, max_memory_percent=0.8",
    }


def run_transformers_apart(model_dir: Path, num_seqs: int | None) -> dict[str, Any]:
    """The transformers peer in a process of its own, before any engine holds GPU memory, so
    each side has the whole GPU (run in this process after the engine, the peer's CUDA-graph
    warm-up ran out of memory)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="replayllm-peer-") as work:
        out = Path(work) / "peer.json"
        command = [sys.executable, "-m", "benchmarks.transformers_peer", "--model-dir",
                   str(model_dir), "--json", str(out)]
        if num_seqs:
            command += ["--num-seqs", str(num_seqs)]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"peer process exited {proc.returncode}: {' | '.join(tail)}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transformers_peer",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--num-seqs", type=int, default=None)
    args = parser.parse_args(argv)
    from benchmarks.engine import _requests, ensure_model

    result = run_transformers(ensure_model(Path(args.model_dir)), _requests(args.num_seqs))
    Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
