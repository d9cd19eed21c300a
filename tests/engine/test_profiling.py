"""The device profile: a grid within the configuration's limits, trimmed by level under a budget,
and a file keyed by device and model that the what-if reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import Config
from engine.profiling import (
    MAX_REPEATS,
    ProfileError,
    ProfilePoint,
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
                                   "attention_backend", "engine_version", "model"}
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
    ordered = profile_key({**cuda, "decode_longest_first": True}, "v")
    assert ordered["kernels"]["decode_longest_first"] is True  # the rows' order moves step times
    assert profile_key({**cuda, "decode_longest_first": False}, "v") == profile_key(cuda, "v")
    # Eager long prompts' attention kernel: named unless it is the Triton kernel of before.
    tma = profile_key({**cuda, "long_prefill_kernel": "tma"}, "v")
    assert tma["kernels"]["long_prefill_kernel"] == "tma"
    assert profile_key({**cuda, "long_prefill_kernel": "triton"}, "v") == profile_key(cuda, "v")
    assert "kernels" not in profile_key({"device": "cpu"}, "v")  # the CPU runner's steps


def test_shared_prefix_decodes_lay_out_blocks_as_the_prefix_cache_does() -> None:
    """Level 2 times decodes whose rows share a prefix: a group's rows hold the same physical
    blocks at the head of their tables (whole blocks), every other block (the last one too,
    where the new token's KV goes) is the row's own, and the pool counts a shared block once."""
    block = LARGE.kvcache_block_size
    shared = [p for p in profile_grid(LARGE) if p.prefix_groups]
    assert shared and all(p.kind == "decode" and p.level == 2 for p in shared)
    assert {p.prefix_groups for p in shared} == {1, 4}
    assert len({p.prefix_tokens / p.decode_contexts[0] for p in shared}) > 2  # several shares
    for point in shared:
        tables = point.block_tables(block)
        heads = point.prefix_tokens // block
        assert point.prefix_tokens % block == 0 and heads >= 1
        for row, table in enumerate(tables):
            assert len(table) == -(-point.decode_contexts[row] // block)
            same_group = tables[row % point.prefix_groups]
            assert table[:heads] == same_group[:heads]
            others = {b for i, t in enumerate(tables) if i != row for b in t}
            assert not set(table[heads:]) & others  # its own blocks, the last included
        rows = len(tables)
        assert point.blocks(block) == sum(map(len, tables)) - (rows - point.prefix_groups) * heads
        batch = point.batch(block)
        assert [s.block_table for s in batch.seqs] == tables
        assert all(s.num_computed_tokens == s.num_tokens - 1 for s in batch.seqs)


def test_a_shared_prefix_row_records_its_layout() -> None:
    """Each timed shared-prefix row says how many prefixes its rows fall into and how long
    each is, which the what-if reads as the KV its decode reads once; other rows say nothing."""
    config = Config(max_model_len=2048, max_num_seqs=64, max_num_batched_tokens=4096,
                    num_kvcache_blocks=4000)
    rows = law_profile(config)["rows"]
    shared = [r for r in rows if r.get("prefix_groups")]
    assert shared and all(r["kind"] == "decode" and r["prefix_tokens"] > 0 for r in shared)
    assert all("shared in" in r["label"] for r in shared)
    assert not any("prefix_tokens" in r for r in rows if "shared in" not in r["label"])


def test_the_cpu_runner_reads_a_shared_prefix_and_writes_only_its_own_blocks() -> None:
    """A shared-prefix point through the real model runner (CPU): each row's new KV lands in its
    own last block, none in the shared ones; and its tokens are those of the same decode over
    private copies of the prefix (the runner reads the shared blocks as each row's prefix)."""
    import dataclasses

    import torch

    from engine.model.checkpoint import default_model_dir
    from engine.runner.model_runner import ModelRunner

    block = 16
    config = Config(model=str(default_model_dir()), kvcache_block_size=block,
                    num_kvcache_blocks=64, max_model_len=256, max_num_batched_tokens=512)
    runner = ModelRunner(config)
    try:
        point = ProfilePoint("decode", 2, (40,) * 4, prefix_groups=2, prefix_tokens=32)
        shared = point.batch(block)
        cache = runner.kv_cache
        torch.manual_seed(0)
        cache.normal_()
        before = cache.clone()
        tokens = runner.execute(shared).token_ids
        written = (cache != before).flatten(0, 1).transpose(0, 1).flatten(1).any(dim=1)
        last_blocks = {s.block_table[-1] for s in shared.seqs}
        assert set(torch.nonzero(written).flatten().tolist()) == last_blocks
        private = dataclasses.replace(point, prefix_groups=0, prefix_tokens=0).batch(block)
        for own, seq in zip(private.seqs, shared.seqs):  # the prefix copied to private blocks
            for src, dst in zip(seq.block_table, own.block_table):
                cache[:, :, dst] = before[:, :, src]
        assert runner.execute(private).token_ids == tokens
    finally:
        runner.close()


def test_a_point_stops_repeating_at_the_budget() -> None:
    """`profile --repeats 10**20 --budget-s 1` ran for ever: the budget was checked between
    points only, and the first point of each kind (nothing to estimate it from) ran all its
    repeats. Now a point stops repeating at the budget (its row says how many ran)."""
    config = Config(max_model_len=4096, max_num_seqs=512, max_num_batched_tokens=32768,
                    num_kvcache_blocks=20000)
    step = max(r["interval_s"] for r in law_profile(config)["rows"])
    budget = 0.05
    cut = law_profile(config, budget_s=budget, repeats=MAX_REPEATS)
    assert cut["elapsed_s"] <= budget + 2 * step  # a warm-up and one repeat past it at most
    assert cut["rows"] and cut["rows"][0]["repeats"] < MAX_REPEATS
    assert law_profile(config, budget_s=10.0, repeats=2)["rows"][0]["repeats"] == 2


@pytest.mark.parametrize("argv, needle", [
    (["--repeats", str(10**20)], "--repeats must be an integer in [1, 1000], got 1000000"),
    (["--repeats", "0"], "--repeats must be an integer in [1, 1000], got 0"),
    (["--budget-s", "inf"], "--budget-s must be a finite number of seconds > 0, got inf"),
    (["--budget-s", "nan"], "--budget-s must be a finite number of seconds > 0, got nan"),
])
def test_profile_refuses_nonsense_settings_before_the_model_loads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(["profile", "--out", str(tmp_path / "p.json"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "start-up" not in err
    assert not list(tmp_path.iterdir())
    with pytest.raises(ProfileError, match="--repeats"):
        law_profile(Config(num_kvcache_blocks=64), repeats=MAX_REPEATS + 1)
