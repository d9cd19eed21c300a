"""Linear layers that know how they are sharded over a tensor-parallel group.

Every parameter carries a ``weight_loader(param, loaded_weight, shard_id=None)`` that takes the
*full* checkpoint tensor and copies this rank's slice into the parameter; packed layers (q/k/v,
gate/up) take one checkpoint tensor at a time, named by ``shard_id``. Loaders check shapes and
raise ``ValueError`` naming both shapes; the checkpoint loader turns that into a ModelLoadError.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.layers.decode_gemm import DecodeGemm, SplitKParts, serves_dtype
from engine.model.layers.parallel import SINGLE_PROCESS, ParallelGroup, divide

# Dimension of a [out, in] weight that is split across ranks.
OUTPUT_DIM = 0
INPUT_DIM = 1


def check_shape(expected: tuple[int, ...] | torch.Size, got: torch.Tensor, what: str) -> None:
    """Raise ``ValueError`` when a checkpoint tensor has the wrong shape for ``what``."""
    if tuple(expected) != tuple(got.shape):
        raise ValueError(
            f"shape mismatch for {what}: expected {tuple(expected)}, got {tuple(got.shape)}"
        )


def shard_along(
    loaded: torch.Tensor, dim: int, shard_size: int, group: ParallelGroup
) -> torch.Tensor:
    """This rank's slice of ``loaded`` along ``dim`` (shards are equal and in rank order)."""
    return loaded.narrow(dim, group.rank * shard_size, shard_size)


def default_weight_loader(
    param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
) -> None:
    """Copy an unsharded tensor whole (norm weights, replicated layers)."""
    check_shape(param.shape, loaded_weight, "parameter")
    param.data.copy_(loaded_weight)


class LinearBase(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` of shape ``[output_size, input_size]`` on this rank."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp_dim: int | None = None,
        group: ParallelGroup = SINGLE_PROCESS,
    ) -> None:
        super().__init__()
        self.group = group
        self.tp_dim = tp_dim
        self.input_size = input_size
        self.output_size = output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}, "
            f"tp={self.group.rank}/{self.group.world_size}"
        )


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole weight."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        group: ParallelGroup = SINGLE_PROCESS,
    ) -> None:
        super().__init__(input_size, output_size, bias, None, group)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        default_weight_loader(param, loaded_weight)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank returns its slice of ``y``."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        group: ParallelGroup = SINGLE_PROCESS,
    ) -> None:
        super().__init__(
            input_size,
            divide(output_size, group.world_size, "output size"),
            bias,
            OUTPUT_DIM,
            group,
        )
        self.decode_gemm: DecodeGemm | None = None  # use_decode_gemm sets it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.decode_gemm is not None:  # a decode-sized batch a Triton tiling serves
            out = self.decode_gemm.project(x, self.weight)
            if out is not None:
                assert isinstance(out, torch.Tensor), "a column projection takes one split"
                return out
        return F.linear(x, self.weight, self.bias)

    def use_decode_gemm(self, decode_gemm: DecodeGemm | None) -> None:
        """Run decode-sized batches through ``decode_gemm``'s one-split tilings (no bias: the
        kernel adds none), each rank over its own slice of the output."""
        self.decode_gemm = decode_gemm if self.bias is None else None

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        shard = param.size(OUTPUT_DIM)
        full = list(param.shape)
        full[OUTPUT_DIM] = shard * self.group.world_size
        check_shape(tuple(full), loaded_weight, "column-parallel weight")
        param.data.copy_(shard_along(loaded_weight, OUTPUT_DIM, shard, self.group))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul.

    Each rank's weight is ``[slice of part 0 | slice of part 1 | ...]`` so that after the matmul
    every part can be split off locally (gate/up of the SwiGLU MLP).
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        group: ParallelGroup = SINGLE_PROCESS,
    ) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, group)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"merged linear expects a part index in [0, {len(self.output_sizes)}), "
                f"got {shard_id!r}"
            )
        tp = self.group.world_size
        offset = sum(self.output_sizes[:shard_id]) // tp
        size = self.output_sizes[shard_id] // tp
        full = list(param.shape)
        full[OUTPUT_DIM] = self.output_sizes[shard_id]
        check_shape(tuple(full), loaded_weight, f"merged part {shard_id}")
        target = param.data.narrow(OUTPUT_DIM, offset, size)
        target.copy_(shard_along(loaded_weight, OUTPUT_DIM, size, self.group))


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections fused; heads are split across ranks (KV heads too)."""

    SHARD_IDS = ("q", "k", "v")

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
        group: ParallelGroup = SINGLE_PROCESS,
    ) -> None:
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, group.world_size, "number of attention heads")
        self.num_kv_heads = divide(total_num_kv_heads, group.world_size, "number of KV heads")
        output_size = (total_num_heads + 2 * total_num_kv_heads) * head_size
        super().__init__(hidden_size, output_size, bias, group)

    def _offset_and_size(self, shard_id: object) -> tuple[int, int, int]:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        layout = {
            "q": (0, q_size, self.total_num_heads),
            "k": (q_size, kv_size, self.total_num_kv_heads),
            "v": (q_size + kv_size, kv_size, self.total_num_kv_heads),
        }
        if shard_id not in layout:
            raise ValueError(f"QKV linear expects shard id 'q', 'k' or 'v', got {shard_id!r}")
        offset, size, total_heads = layout[shard_id]
        return offset, size, total_heads * self.head_size

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        offset, size, full_size = self._offset_and_size(shard_id)
        full = list(param.shape)
        full[OUTPUT_DIM] = full_size
        check_shape(tuple(full), loaded_weight, f"{shard_id}_proj")
        target = param.data.narrow(OUTPUT_DIM, offset, size)
        target.copy_(shard_along(loaded_weight, OUTPUT_DIM, size, self.group))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs are summed over the group.

    The bias is added once (on rank 0) so the all-reduce does not count it ``world_size`` times.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        group: ParallelGroup = SINGLE_PROCESS,
    ) -> None:
        super().__init__(
            divide(input_size, group.world_size, "input size"),
            output_size,
            bias,
            INPUT_DIM,
            group,
        )
        self.decode_gemm: DecodeGemm | None = None  # use_split_k sets it

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if param.dim() == 1:  # the bias is replicated
            default_weight_loader(param, loaded_weight)
            return
        shard = param.size(INPUT_DIM)
        full = list(param.shape)
        full[INPUT_DIM] = shard * self.group.world_size
        check_shape(tuple(full), loaded_weight, "row-parallel weight")
        param.data.copy_(shard_along(loaded_weight, INPUT_DIM, shard, self.group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.group.rank == 0 else None
        return self.group.all_reduce(F.linear(x, self.weight, bias))

    def use_split_k(self, decode_gemm: DecodeGemm | None) -> None:
        """Let :meth:`split_k` run decode-sized batches through ``decode_gemm`` (single rank,
        no bias: the partials are summed by the following norm, never all-reduced)."""
        single = self.group.world_size == 1 and self.bias is None
        self.decode_gemm = decode_gemm if single else None

    def split_k(
        self, x: torch.Tensor, silu_mul: bool = False
    ) -> SplitKParts | torch.Tensor | None:
        """This projection of ``x`` (of ``silu(gate) * up`` with ``silu_mul``) where a decode
        tiling serves its batch (split-K partials, or the output of a one-split tiling), else
        None (call :meth:`forward`)."""
        if self.decode_gemm is None:
            return None
        return self.decode_gemm.project(x, self.weight, silu_mul)


def runs_split_k(model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether ``model``'s decode projections of ``dtype`` run through the split-K kernel: some
    projection took a :class:`DecodeGemm` (:meth:`RowParallelLinear.use_split_k`,
    :meth:`ColumnParallelLinear.use_decode_gemm`)."""
    return serves_dtype(dtype) and any(
        isinstance(m, RowParallelLinear | ColumnParallelLinear) and m.decode_gemm is not None
        for m in model.modules()
    )
