"""config_from_header fills the fields a header recorded before they existed."""

from __future__ import annotations

import pytest

from engine.config import Config
from replay.replayer import config_from_header


def test_headers_without_the_kernel_fields_get_the_old_behaviour() -> None:
    recorded = Config().to_dict()
    for name in ("fused_kernels", "fused_kv_store", "blas_library"):
        del recorded[name]
    config = config_from_header({"config": recorded})
    assert (config.fused_kernels, config.fused_kv_store, config.blas_library) == (
        True, True, "default",
    )  # fmt: skip


def test_recorded_kernel_fields_are_kept() -> None:
    recorded = Config(fused_kernels=False, blas_library="cublaslt").to_dict()
    config = config_from_header({"config": recorded})
    assert not config.fused_kernels and config.blas_library == "cublaslt"


@pytest.mark.parametrize("name", ["split_k_gemm", "programmatic_launch"])
def test_headers_before_a_kernel_speed_field_replay_without_it(name: str) -> None:
    """A trace recorded before the split-K decode GEMMs (or programmatic launch) existed ran
    every projection through cuBLAS (launched every kernel plainly)."""
    recorded = Config().to_dict()
    assert recorded[name] is True  # today's default
    del recorded[name]
    assert getattr(config_from_header({"config": recorded}), name) is False
    recorded[name] = True
    assert getattr(config_from_header({"config": recorded}), name) is True


def test_headers_before_prefill_graph_seqs_took_sixteen_prompts_a_graph() -> None:
    """The engine's prefill graphs took 16 prompts before the count became a setting; a trace
    of that engine replays (and what-ifs) with 16, today's default is larger."""
    recorded = Config().to_dict()
    assert recorded["prefill_graph_seqs"] > 16
    del recorded["prefill_graph_seqs"]
    assert config_from_header({"config": recorded}).prefill_graph_seqs == 16
    recorded["prefill_graph_seqs"] = 40
    assert config_from_header({"config": recorded}).prefill_graph_seqs == 40


def test_headers_before_the_long_prefill_kernel_ran_the_triton_kernel() -> None:
    """Eager long prompts took the Triton kernel before ``long_prefill_kernel`` existed; today's
    default is the TMA kernel, and a recorded choice is kept."""
    recorded = Config().to_dict()
    assert recorded["long_prefill_kernel"] == "tma"
    del recorded["long_prefill_kernel"]
    assert config_from_header({"config": recorded}).long_prefill_kernel == "triton"
    recorded["long_prefill_kernel"] = "flash_sdpa"
    assert config_from_header({"config": recorded}).long_prefill_kernel == "flash_sdpa"


def test_headers_before_the_heap_freeze_left_the_heap_to_the_collector() -> None:
    """``freeze_gc_heap`` is on by default; a header recorded before the field existed says its
    engine left the start-up heap to the collector's full passes."""
    recorded = Config().to_dict()
    assert recorded["freeze_gc_heap"] is True
    del recorded["freeze_gc_heap"]
    assert config_from_header({"config": recorded}).freeze_gc_heap is False


def test_headers_before_duplicates_were_kept_replay_one_block_per_hash() -> None:
    """``prefix_cache_duplicates`` is on by default; a header recorded before the field existed
    replays (and what-ifs) the rule its engine had, one block per cached hash; a recorded
    choice is kept."""
    recorded = Config().to_dict()
    assert recorded["prefix_cache_duplicates"] is True
    del recorded["prefix_cache_duplicates"]
    assert config_from_header({"config": recorded}).prefix_cache_duplicates is False
    recorded["prefix_cache_duplicates"] = True
    assert config_from_header({"config": recorded}).prefix_cache_duplicates is True
