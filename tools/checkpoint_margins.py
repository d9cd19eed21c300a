"""How robust a made checkpoint's greedy tokens are to bf16: transformers bf16 vs float32.

For each candidate (a preset, optionally with ModelPreset fields overridden and fewer layers)
it makes the checkpoint, loads it with ``transformers.Qwen3ForCausalLM`` once in float32 and
once in bfloat16, and prints one table row:

* agree: teacher-forced top-1 agreement of bf16 with float32 over every position of each prompt
  (random real-vocabulary ids) followed by float32's own greedy continuation;
* rel_l2: ||logits_bf16 - logits_fp32|| / ||logits_fp32|| over those positions;
* gap_p50 / gap_p1: median and 1st percentile of float32's (top1 - top2) / |top1|;
* copy: share of positions whose float32 argmax is the input token at that position;
* sigma: share whose argmax is the planted successor of the previous token (skip-bigram only);
* distinct / max_run: mean distinct tokens per greedy continuation, and its longest run of one
  repeated token (degenerate models loop on one token);
* ctx: mean share of distinct next tokens over prompts that differ but end with the same token;
* l0_gap: layer 0's previous-token score lead over any other offset (skip-bigram only);
* make_s: seconds to make the checkpoint.

Usage (repository root):
    python tools/checkpoint_margins.py                      # the qwen3-0.6b preset as shipped
    python tools/checkpoint_margins.py --layers 4 --prompts 2 --max-len 128 \\
        --candidate today:scaled_residual_init=0,skip_bigram_gain=0 \\
        --candidate shipped: --candidate gain2:skip_bigram_gain=2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.model.checkpoint import (  # noqa: E402
    EOS_TOKEN_ID,
    ModelPreset,
    get_preset,
    hf_config,
    make_model,
    random_weights,
    successor_permutation,
)

COLUMNS = (
    "candidate", "layers", "positions", "agree", "rel_l2", "gap_p50", "gap_p1", "copy", "sigma",
    "distinct", "max_run", "ctx", "l0_gap", "make_s",
)  # fmt: skip


def parse_candidate(text: str) -> tuple[str, dict[str, Any]]:
    """``label:field=value,field=value`` (values parsed as JSON, else kept as strings)."""
    label, _, rest = text.partition(":")
    fields = {f.name for f in dataclasses.fields(ModelPreset)}
    overrides: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"bad override {item!r}; ModelPreset fields: {sorted(fields)}")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw
    return label or "preset", overrides


def make_checkpoint(
    preset: str, overrides: dict[str, Any], layers: int | None, out: Path, seed: int
) -> tuple[ModelPreset, float]:
    """The shipped preset through make_model; a variant through the same two functions."""
    spec = dataclasses.replace(get_preset(preset), **overrides)
    if layers is not None:
        spec = dataclasses.replace(spec, num_hidden_layers=layers)
    start = time.perf_counter()
    if spec == get_preset(preset):
        make_model(preset, out, seed=seed)
    else:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(hf_config(spec)), encoding="utf-8")
        save_file(random_weights(spec, seed), str(out / "model.safetensors"))
    return spec, time.perf_counter() - start


def load(path: Path, dtype: torch.dtype) -> Any:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.Qwen3ForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.generation_config.eos_token_id = None  # greedy runs its full length
    return model.eval()


@torch.no_grad()
def greedy(model: Any, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """float32 greedy continuation (transformers' generate, KV cache)."""
    out = model.generate(prompt[None], max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt) :]


def layer0_prev_token_gap(path: Path, spec: ModelPreset) -> float:
    """Layer 0 head 0's score at offset 1 minus its best other offset (< max positions).

    q and k read one shared direction, so they are fixed vectors; their RoPE score depends on
    the offset alone and is computed exactly here from the stored weights."""
    from safetensors import safe_open

    hd = spec.head_dim
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        w = {n: f.get_tensor(f"model.layers.0.self_attn.{n}").double() for n in
             ("q_proj.weight", "k_proj.weight", "q_norm.weight", "k_norm.weight")}  # fmt: skip
        embed_row = f.get_slice("model.embed_tokens.weight")[0:1].double()[0]

    def fixed(proj: str, norm: str) -> torch.Tensor:
        x = w[proj][:hd] @ embed_row
        return x / x.pow(2).mean().sqrt() * w[norm]

    q, k = fixed("q_proj.weight", "q_norm.weight"), fixed("k_proj.weight", "k_norm.weight")
    theta = spec.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    offsets = torch.arange(spec.max_position_embeddings, dtype=torch.float64)
    zq, zk = torch.complex(q[: hd // 2], q[hd // 2 :]), torch.complex(k[: hd // 2], k[hd // 2 :])
    scores = torch.stack([
        (zq * zk.conj() * torch.exp(1j * chunk[:, None] * theta)).real.sum(1)
        for chunk in offsets.split(4096)
    ]).flatten() / math.sqrt(hd)  # fmt: skip
    others = torch.cat([scores[:1], scores[2:]])
    return float(scores[1] - others.max())


@torch.no_grad()
def measure(args: argparse.Namespace, label: str, overrides: dict[str, Any]) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(args.seed + 1)
    with tempfile.TemporaryDirectory(prefix="margins-") as tmp:
        path = Path(tmp) / "model"
        spec, make_s = make_checkpoint(args.preset, overrides, args.layers, path, args.seed)
        l0_gap = layer0_prev_token_gap(path, spec) if spec.skip_bigram_gain else float("nan")
        fp32, bf16 = load(path, torch.float32), load(path, torch.bfloat16)
    sigma = successor_permutation(args.seed) if spec.skip_bigram_gain else None
    vocab = EOS_TOKEN_ID  # real BPE tokens only: ids below the first special token
    lengths = torch.linspace(args.min_len, args.max_len, args.prompts).round().long().tolist()
    agree = positions = copies = planted = 0
    diff_sq = ref_sq = 0.0
    gaps, distinct, max_runs = [], [], []
    for length in lengths:
        prompt = torch.randint(0, vocab, (length,), generator=gen)
        continuation = greedy(fp32, prompt, args.new_tokens)
        distinct.append(len(set(continuation.tolist())))
        runs = torch.unique_consecutive(continuation, return_counts=True)[1]
        max_runs.append(int(runs.max()))
        ids = torch.cat([prompt, continuation])
        ref = fp32(ids[None]).logits[0].float()
        low = bf16(ids[None]).logits[0].float()
        top = ref.topk(2, dim=-1).values
        gaps.append((top[:, 0] - top[:, 1]) / top[:, 0].abs())
        argmax = ref.argmax(-1)
        agree += int((low.argmax(-1) == argmax).sum())
        positions += len(ids)
        copies += int((argmax == ids).sum())
        if sigma is not None:
            prev = torch.cat([ids[:1], ids[:-1]])  # position 0 attends to itself
            planted += int((argmax == sigma[prev]).sum())
        diff_sq += float((low - ref).double().pow(2).sum())
        ref_sq += float(ref.double().pow(2).sum())
        del ref, low
    ctx_shares = []
    for _ in range(args.ctx_tokens):
        last = torch.randint(0, vocab, (1,), generator=gen)
        batch = torch.randint(0, vocab, (args.ctx_prompts, args.ctx_len), generator=gen)
        batch[:, -1] = last
        nxt = fp32(batch, logits_to_keep=1).logits[:, -1].argmax(-1)
        ctx_shares.append(nxt.unique().numel() / args.ctx_prompts)
    gap = torch.cat(gaps)
    return {
        "candidate": label,
        "layers": spec.num_hidden_layers,
        "positions": positions,
        "agree": agree / positions,
        "rel_l2": math.sqrt(diff_sq / ref_sq),
        "gap_p50": float(gap.quantile(0.5)),
        "gap_p1": float(gap.quantile(0.01)),
        "copy": copies / positions,
        "sigma": planted / positions if sigma is not None else float("nan"),
        "distinct": sum(distinct) / len(distinct),
        "max_run": max(max_runs),
        "ctx": sum(ctx_shares) / len(ctx_shares),
        "l0_gap": l0_gap,
        "make_s": make_s,
    }


def format_row(row: dict[str, Any]) -> str:
    cells = []
    for name in COLUMNS:
        value = row[name]
        if isinstance(value, float):
            value = "-" if math.isnan(value) else f"{value:.4f}" if value < 10 else f"{value:.1f}"
        cells.append(str(value))
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument(
        "--candidate",
        action="append",
        help="LABEL:field=value,... ModelPreset overrides (repeatable; default: the preset)",
    )
    parser.add_argument("--layers", type=int, help="override num_hidden_layers (quick runs)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy float32 continuation")
    parser.add_argument("--ctx-tokens", type=int, default=4, help="last tokens for the ctx test")
    parser.add_argument("--ctx-prompts", type=int, default=8, help="prompts per last token")
    parser.add_argument("--ctx-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="checkpoint seed (prompts: seed+1)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    candidates = [parse_candidate(c) for c in args.candidate or ["preset:"]]
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS), flush=True)
    rows = []
    for label, overrides in candidates:
        rows.append(measure(args, label, overrides))
        print(format_row(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
