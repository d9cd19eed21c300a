"""Tensor-parallel group information, passed explicitly to every layer that shards.

Layers never read ranks from a hidden global (Nano-vLLM calls ``dist.get_rank()`` inside each
layer); a runner builds one :class:`ParallelGroup` and hands it down, so a single process can hold
layers of several ranks (as the sharding unit tests do) and a TP runner can pass its own group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ParallelGroup:
    """This process's place in a tensor-parallel group.

    ``process_group`` is the ``torch.distributed`` group the collectives run on (``None``: the
    default group). With ``world_size == 1`` every collective is the identity and
    ``torch.distributed`` is never touched.
    """

    rank: int = 0
    world_size: int = 1
    process_group: Any = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group, in place; returns it."""
        if self.is_parallel:
            torch.distributed.all_reduce(tensor, group=self.process_group)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along the last dimension, in rank order."""
        if not self.is_parallel:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, tensor.contiguous(), group=self.process_group)
        return torch.cat(parts, dim=-1)


SINGLE_PROCESS = ParallelGroup()


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """``numerator // denominator``, refusing a remainder (a shard must be whole)."""
    if numerator % denominator != 0:
        raise ValueError(
            f"{what} {numerator} is not divisible by the tensor-parallel size {denominator}"
        )
    return numerator // denominator
