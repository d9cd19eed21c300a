"""Building blocks of the model: tensor-parallel linears, attention, rotary, norm, sampler."""

from engine.model.layers.activation import SiluAndMul
from engine.model.layers.attention import (
    Attention,
    AttentionBackend,
    available_attention_backends,
    get_attention_backend,
    register_attention_backend,
)
from engine.model.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from engine.model.layers.layernorm import RMSNorm
from engine.model.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    default_weight_loader,
)
from engine.model.layers.parallel import SINGLE_PROCESS, ParallelGroup, divide
from engine.model.layers.rotary_embedding import RotaryEmbedding
from engine.model.layers.sampler import Sampler

__all__ = [
    "SINGLE_PROCESS",
    "Attention",
    "AttentionBackend",
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "ParallelGroup",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RMSNorm",
    "ReplicatedLinear",
    "RotaryEmbedding",
    "RowParallelLinear",
    "Sampler",
    "SiluAndMul",
    "VocabParallelEmbedding",
    "available_attention_backends",
    "default_weight_loader",
    "divide",
    "get_attention_backend",
    "register_attention_backend",
]
