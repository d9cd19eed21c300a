"""Check and time the KV-cache store kernels on CUDA (a section of ``benchmarks.kernels``).

``store_kv`` scatters new K/V rows into shuffled cache slots (checked against indexing);
``qk_norm_rope`` storing K/V itself is compared with ``qk_norm_rope`` then ``store_kv``: the same
cache bytes (padding slots included), and the time of each. ``python -m benchmarks.kernels
--only store`` runs this section.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from benchmarks.gpu_timing import (
    BLOCK_SIZE,
    DTYPE,
    HEAD_DIM,
    NUM_HEADS,
    NUM_KV_HEADS,
    bench_ms,
    time_call,
)


def run_store() -> list[dict[str, Any]]:
    from engine.model.kernels.kv_store import store_kv

    rows = []
    for tokens in (256, 16384):
        k = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        v = torch.randn_like(k)
        shape = (tokens // BLOCK_SIZE + 4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        kc = torch.full(shape, float("nan"), device="cuda", dtype=DTYPE)
        vc = torch.full_like(kc, float("nan"))
        slots = torch.randperm(kc.shape[0] * BLOCK_SIZE, device="cuda")[:tokens]
        store_kv(k, v, kc, vc, slots)
        ok = bool(torch.equal(kc.view(-1, NUM_KV_HEADS, HEAD_DIM)[slots], k)) and bool(
            torch.equal(vc.view(-1, NUM_KV_HEADS, HEAD_DIM)[slots], v)
        )
        ms = bench_ms(lambda k=k, v=v, kc=kc, vc=vc, s=slots: store_kv(k, v, kc, vc, s))
        moved = 4 * k.numel() * k.element_size()  # read k, v; write both
        rows.append(
            {"case": f"store_kv {tokens} tokens", "ms": ms, "tb_s": moved / ms / 1e9, "ok": ok}
        )
    rows += run_fused_store()
    return rows


def run_fused_store() -> list[dict[str, Any]]:
    """qk_norm_rope then store_kv (two launches) against qk_norm_rope storing K/V itself: the
    same cache bytes (checked, padding slots included), and the time of each."""
    from engine.model.kernels.fused import qk_norm_rope
    from engine.model.kernels.kv_store import store_kv
    from engine.model.layers.rotary_embedding import RotaryEmbedding

    rows: list[dict[str, Any]] = []
    rope = RotaryEmbedding(HEAD_DIM, HEAD_DIM, 4096, 1e6)
    cos, sin = rope.cos_cache.cuda(), rope.sin_cache.cuda()
    q_w = torch.ones(HEAD_DIM, device="cuda", dtype=DTYPE)
    k_w = torch.ones(HEAD_DIM, device="cuda", dtype=DTYPE)
    meta = (NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, 1e-6)
    for tokens in (256, 8192):
        try:
            width = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
            qkv = torch.randn(tokens, width, device="cuda", dtype=DTYPE)
            pos = torch.randint(0, 4096, (tokens,), device="cuda")
            shape = (tokens // BLOCK_SIZE + 4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
            caches = [torch.full(shape, float("nan"), device="cuda", dtype=DTYPE) for _ in range(4)]
            slots = torch.randperm(shape[0] * BLOCK_SIZE, device="cuda")[:tokens]
            slots[::7] = -1  # padding rows
            args = (qkv, q_w, k_w, cos, sin, pos, *meta)

            def separate(
                c: list[torch.Tensor] = caches, s: torch.Tensor = slots, a: tuple = args
            ) -> None:
                _, k, v = qk_norm_rope(*a)
                store_kv(k, v, c[0], c[1], s)

            def fused(
                c: list[torch.Tensor] = caches, s: torch.Tensor = slots, a: tuple = args
            ) -> None:
                qk_norm_rope(*a, k_cache=c[2], v_cache=c[3], slot_mapping=s)

            separate()
            fused()
            torch.cuda.synchronize()
            ok = all(
                torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
                for a, b in ((caches[0], caches[2]), (caches[1], caches[3]))
            )
            for name, fn in (("qk_norm_rope+store_kv", separate), ("qk_norm_rope(store)", fused)):
                times = time_call(fn)  # CUDA-graph time: these kernels are shorter than a launch
                ms = times.get("us_graph", times["us_eager"]) / 1e3
                moved = 2 * qkv.numel() * qkv.element_size()  # about: read qkv, write q/k/v
                rows.append(
                    {
                        "case": f"{name} {tokens}",
                        "ms": ms,
                        "tb_s": moved / ms / 1e9,
                        "ok": ok,
                        **times,
                    }
                )
        except Exception as exc:  # noqa: BLE001 - report, keep the other sections
            print(f"fused store {tokens}: {type(exc).__name__}: {exc}", file=sys.stderr)
            rows.append(
                {"case": f"fused store {tokens} ERROR", "ms": 0.0, "tb_s": 0.0, "ok": False}
            )
    return rows
