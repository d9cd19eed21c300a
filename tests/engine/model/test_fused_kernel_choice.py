"""Which fused kernels a model uses is the model's own state, chosen when it is built.

No Triton needed: a stand-in module records which layers call it.
"""

from __future__ import annotations

import types

import pytest
import torch

from engine.config import Config
from engine.model.layers import RMSNorm, SiluAndMul
from engine.model.layers.attention_torch import TorchAttentionBackend
from engine.model.layers.cuda_kernels import FusedKernels, kernels_for
from engine.model.qwen3 import Qwen3ForCausalLM, Qwen3Spec

SPEC = Qwen3Spec(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=8)


def recording_module() -> types.ModuleType:
    module = types.ModuleType("stand_in_fused")
    module.calls = []  # type: ignore[attr-defined]

    def rms_norm(
        x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> object:
        module.calls.append("rms_norm")  # type: ignore[attr-defined]
        return x if residual is None else (x, x + residual)

    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        module.calls.append("silu_and_mul")  # type: ignore[attr-defined]
        return x[..., : x.shape[-1] // 2]

    module.rms_norm = rms_norm  # type: ignore[attr-defined]
    module.silu_and_mul = silu_and_mul  # type: ignore[attr-defined]
    return module


def test_no_fused_kernels_off_cuda_whatever_the_config() -> None:
    for enabled in (True, False):
        assert kernels_for(Config(fused_kernels=enabled), "cpu").module is None
    assert kernels_for(Config(fused_kv_store=False), "cpu").kv_store is False


def test_a_model_built_without_a_runner_gets_the_configs_default_kernels() -> None:
    """``kernels_for`` reads every kernel setting of a Config, so ``build_model``'s default
    (``Config()``) asks for what the engine runs by default, the decode prologue included."""
    default, chosen = Config(), kernels_for(Config(), "cpu")
    assert chosen.kv_store is default.fused_kv_store
    assert chosen.decode_qk_prologue is default.decode_qk_prologue
    off = kernels_for(Config(decode_qk_prologue=not default.decode_qk_prologue), "cpu")
    assert off.decode_qk_prologue is not default.decode_qk_prologue


def test_one_kernels_state_reaches_every_layer_of_a_model() -> None:
    stand_in = recording_module()
    kernels = FusedKernels(stand_in, kv_store=False)
    model = Qwen3ForCausalLM(SPEC, TorchAttentionBackend(), kernels=kernels)
    assert model.kernels is kernels
    for layer in model.model.layers:
        assert layer.self_attn.kernels is kernels
        assert layer.self_attn.attn.fuse_kv_store is False
        assert layer.input_layernorm.fused is stand_in
        assert layer.post_attention_layernorm.fused is stand_in
        assert layer.mlp.act_fn.fused is stand_in
    assert model.model.norm.fused is stand_in
    # Another model in the same process keeps its own choice (nothing process-wide).
    plain = Qwen3ForCausalLM(SPEC, TorchAttentionBackend())
    assert plain.kernels.module is None and plain.model.norm.fused is None
    assert plain.model.layers[0].self_attn.attn.fuse_kv_store is True


def test_layers_call_the_module_they_were_given() -> None:
    stand_in = recording_module()
    x = torch.randn(3, 8)
    assert RMSNorm(8, fused=stand_in)(x) is x
    SiluAndMul(fused=stand_in)(x)
    assert stand_in.calls == ["rms_norm", "silu_and_mul"]  # type: ignore[attr-defined]
    torch.testing.assert_close(RMSNorm(8)(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                               + 1e-6))


def test_a_failed_fused_store_turns_it_off_for_that_model_only() -> None:
    first, second = FusedKernels(kv_store=True), FusedKernels(kv_store=True)
    with pytest.warns(RuntimeWarning, match="fused KV store unavailable"):
        first.store.failed(RuntimeError("no such kernel"))
    assert not first.store.usable and second.store.usable
