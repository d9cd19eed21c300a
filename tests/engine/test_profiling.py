"""The device profile: a grid within the configuration's limits, trimmed by level under a budget,
and a file keyed by device and model that the what-if reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import Config
from engine.profiling import (
    ProfileError,
    load_profile,
    profile_grid,
    save_profile,
)
from replay.cli.main import main
from replay.whatif.synthetic import StepLaw, law_profile

LARGE = Config(max_model_len=32768, max_num_seqs=512, max_num_batched_tokens=32768,
               num_kvcache_blocks=60000)


def test_grid_covers_every_kind_within_the_limits() -> None:
    """Decodes to 512 rows, uniform and spread; prefills to 32k tokens, many prompts and cached
    prefixes; mixed chunks; nothing beyond the pool, budget, max_num_seqs or max_model_len."""
    grid = profile_grid(LARGE)
    decodes = [p for p in grid if p.kind == "decode"]
    assert max(p.num_seqs for p in decodes) == 512
    assert any(len(set(p.decode_contexts)) > 1 for p in decodes)  # a spread of lengths
    prefills = [p for p in grid if p.kind == "prefill"]
    assert max(sum(n for n, _ in p.prompts) for p in prefills) == 32768
    assert any(c > 0 for p in prefills for _, c in p.prompts)  # cached prefixes
    assert max(len(p.prompts) for p in prefills) >= 64
    assert any(p.kind == "mixed" for p in grid)
    small = Config(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=512,
                   num_kvcache_blocks=64)
    for point in profile_grid(small):
        assert point.num_seqs <= 8
        assert point.blocks(small.kvcache_block_size) <= 64
        assert all(n + c <= 256 for n, c in point.prompts)
        assert max(point.decode_contexts, default=0) < 256
        batch = point.batch(small.kvcache_block_size)
        assert batch.num_batched_tokens <= 512 and all(s.seq_id < 0 for s in batch.seqs)


def test_levels_come_in_order_and_eager_copies_only_where_a_graph_runs() -> None:
    grid = profile_grid(LARGE, lambda p: p.kind == "decode")
    levels = [p.level for p in grid]
    assert levels == sorted(levels) and set(levels) == {0, 1, 2, 3, 4}
    eager = [p for p in grid if p.eager]
    assert eager and all(p.kind == "decode" and p.level == 3 for p in eager)
    assert not any(p.eager for p in profile_grid(LARGE))


def test_the_budget_drops_the_last_levels_first() -> None:
    """On a law-timed executor (simulated clock): the full grid without a budget; with one, every
    coarse point and fewer of the later ones, in under the budget."""
    config = Config(max_model_len=4096, max_num_seqs=512, max_num_batched_tokens=32768,
                    num_kvcache_blocks=20000)
    full = law_profile(config, StepLaw(flush_every=0))
    assert full["skipped"] == 0 and len(full["rows"]) == full["points"]
    budget = 0.4 * full["elapsed_s"]
    cut = law_profile(config, StepLaw(flush_every=0), budget_s=budget)
    one_point = max(r["interval_s"] for r in full["rows"]) * 2  # a warm-up and a repeat
    assert 0 < cut["skipped"] and cut["elapsed_s"] <= budget + one_point
    coarse = sum(r["level"] == 0 for r in full["rows"])
    assert sum(r["level"] == 0 for r in cut["rows"]) == coarse
    assert sum(r["level"] == 4 for r in cut["rows"]) < sum(r["level"] == 4 for r in full["rows"])


def test_profile_cli_on_the_tiny_model(tmp_path: Path) -> None:
    """``replayllm profile`` times the CPU runner over a tiny grid and writes a file keyed by
    device, architecture, dtype, TP, attention backend and engine version."""
    out = tmp_path / "p.json"
    assert main(["profile", "--out", str(out), "--budget-s", "4", "--repeats", "1", "--quiet",
                 "--set", "max_model_len=64", "--set", "max_num_seqs=4",
                 "--set", "max_num_batched_tokens=64", "--set", "num_kvcache_blocks=32"]) == 0
    profile = load_profile(out)
    assert set(profile["key"]) == {"device", "architecture", "dtype", "tensor_parallel_size",
                                   "attention_backend", "engine_version"}
    assert profile["key"]["device"] == "cpu" and profile["rows"]
    assert all(r["interval_s"] > 0 for r in profile["rows"])


def test_a_file_that_is_not_a_profile_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ProfileError, match="not a replayllm-profile"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.json")
    profile = law_profile(Config(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                                 num_kvcache_blocks=64))
    save_profile({**profile, "version": 99}, bad)
    with pytest.raises(ProfileError, match="version 99"):
        load_profile(bad)


def test_a_cuda_profile_key_names_the_kernels_its_steps_ran() -> None:
    """Two profiles of one GPU differ when their projections ran different kernels (split-K
    decode GEMMs or cuBLAS); a description from before the split-K GEMMs means cuBLAS."""
    from engine.profiling import profile_key

    cuda = {"device_name": "NVIDIA H200", "dtype": "bfloat16", "fused_kernels": True,
            "blas_library": "Cublas", "split_k_gemm": True}
    assert profile_key(cuda, "v")["kernels"] == {
        "fused_kernels": True, "blas_library": "Cublas", "split_k_gemm": True,
        "programmatic_launch": False,
    }  # fmt: skip
    older = {k: v for k, v in cuda.items() if k != "split_k_gemm"}
    assert profile_key(older, "v")["kernels"]["split_k_gemm"] is False
    assert "kernels" not in profile_key({"device": "cpu"}, "v")  # the CPU runner's steps
