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
