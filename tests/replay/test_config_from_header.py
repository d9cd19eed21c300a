"""config_from_header fills the fields a header recorded before they existed."""

from __future__ import annotations

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


def test_headers_before_split_k_gemm_replay_with_cublas_projections() -> None:
    """A trace recorded before the split-K decode GEMMs ran every projection through cuBLAS."""
    recorded = Config().to_dict()
    assert recorded["split_k_gemm"] is True  # today's default
    del recorded["split_k_gemm"]
    assert config_from_header({"config": recorded}).split_k_gemm is False
    recorded["split_k_gemm"] = True
    assert config_from_header({"config": recorded}).split_k_gemm is True
