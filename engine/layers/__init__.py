"""Building blocks of the model: tensor-parallel linears, attention, rotary, norm, sampler."""

from engine.layers.activation import SiluAndMul
from engine.layers.attention import (
    Attention,
    AttentionBackend,
    available_attention_backends,
    get_attention_backend,
    register_attention_backend,
)
from engine.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from engine.layers.layernorm import RMSNorm
from engine.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    default_weight_loader,
)
from engine.layers.parallel import SINGLE_PROCESS, ParallelGroup, divide
from engine.layers.rotary_embedding import RotaryEmbedding
from engine.layers.sampler import Sampler

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
