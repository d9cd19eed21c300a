"""Config fields for the kernel and BLAS choices: validated, and part of what a header records."""

from __future__ import annotations

import pytest

from engine.config import BLAS_LIBRARIES, Config, parse_override
from engine.errors import ConfigError


def test_kernel_choices_default_to_the_fused_kernels_and_torchs_blas() -> None:
    config = Config()
    assert (config.fused_kernels, config.fused_kv_store, config.blas_library) == (
        True, True, "default",
    )  # fmt: skip
    recorded = config.to_dict()  # what the trace header stores
    assert {"fused_kernels", "fused_kv_store", "blas_library"} <= set(recorded)


@pytest.mark.parametrize("name", BLAS_LIBRARIES)
def test_every_blas_library_is_accepted(name: str) -> None:
    assert Config(blas_library=name).blas_library == name


def test_bad_kernel_choices_fail_in_one_line() -> None:
    with pytest.raises(ConfigError, match="blas_library must be one of"):
        Config(blas_library="mkl")
    with pytest.raises(ConfigError, match="fused_kernels must be bool"):
        Config(fused_kernels=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="long_prefill_kernel must be one of"):
        Config(long_prefill_kernel="fa3")
    assert Config().replace(long_prefill_kernel="triton").long_prefill_kernel == "triton"
    assert parse_override("fused_kv_store", "off") is False
    assert Config().replace(fused_kernels=False).fused_kernels is False


def test_a_pool_no_trace_could_describe_is_refused() -> None:
    """`--set num_kvcache_blocks=2000000000` passed the int32 bound and a what-if spent minutes
    building two billion blocks; over 2^22 (the largest pool a trace may describe) it is a
    ConfigError, and a pool sized from memory is capped there."""
    from engine.config import MAX_KV_BLOCKS, cap_blocks
    from tracing.validate import MAX_TRACE_BLOCKS

    assert MAX_KV_BLOCKS == MAX_TRACE_BLOCKS == 2**22
    assert Config(num_kvcache_blocks=MAX_KV_BLOCKS).num_kvcache_blocks == MAX_KV_BLOCKS
    for blocks in (MAX_KV_BLOCKS + 1, 2_000_000_000, 2**31 - 1):
        with pytest.raises(ConfigError, match=r"num_kvcache_blocks must be int in \[1, 4194304\] "
                           r"or -1 \(the largest pool a trace may describe"):
            Config().replace(num_kvcache_blocks=blocks)
    assert cap_blocks(10**12) == MAX_KV_BLOCKS and cap_blocks(7) == 7


def test_a_memory_sized_pool_is_capped() -> None:
    """`kv_cache_bytes` of a petabyte on the CPU sized a pool past any trace's bound."""
    from engine.config import MAX_KV_BLOCKS
    from engine.runner.model_runner import ModelRunner

    class Sized(ModelRunner):
        kv_block_bytes = 1024  # type: ignore[assignment]

    runner = object.__new__(Sized)
    runner.config = Config(kv_cache_bytes=2**50)
    assert runner._kv_block_count() == MAX_KV_BLOCKS
    runner.config = Config(kv_cache_bytes=4096)
    assert runner._kv_block_count() == 4
