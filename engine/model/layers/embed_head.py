"""Vocabulary-parallel embedding and LM head (rows of the vocabulary split across ranks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.layers.linear import check_shape, shard_along
from engine.model.layers.parallel import SINGLE_PROCESS, ParallelGroup, divide

VOCAB_DIM = 0


class VocabParallelEmbedding(nn.Module):
    """Token embedding whose table is split by vocabulary rows.

    Each rank looks up the ids it owns, writes zeros for the others, and an all-reduce assembles
    the full embedding on every rank.
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, group: ParallelGroup = SINGLE_PROCESS
    ) -> None:
        super().__init__()
        self.group = group
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_partition = divide(
            num_embeddings, group.world_size, "vocabulary size"
        )
        self.vocab_start_idx = self.num_embeddings_per_partition * group.rank
        self.vocab_end_idx = self.vocab_start_idx + self.num_embeddings_per_partition
        self.weight = nn.Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        check_shape((self.num_embeddings, self.embedding_dim), loaded_weight, "embedding table")
        shard = shard_along(loaded_weight, VOCAB_DIM, self.num_embeddings_per_partition, self.group)
        param.data.copy_(shard)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.group.is_parallel:
            return F.embedding(input_ids, self.weight)
        owned = (input_ids >= self.vocab_start_idx) & (input_ids < self.vocab_end_idx)
        local_ids = torch.where(owned, input_ids - self.vocab_start_idx, 0)
        y = F.embedding(local_ids, self.weight) * owned.unsqueeze(-1).to(self.weight.dtype)
        return self.group.all_reduce(y)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, "
            f"rows=[{self.vocab_start_idx}, {self.vocab_end_idx})"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states -> logits over the whole vocabulary.

    The caller passes only the rows it needs logits for (the last token of each sampled
    sequence); with tensor parallelism every rank computes its vocabulary slice and the slices
    are gathered, so every rank ends with full logits.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        bias: bool = False,
        group: ParallelGroup = SINGLE_PROCESS,
    ) -> None:
        if bias:
            raise ValueError("ParallelLMHead does not support a bias")
        super().__init__(num_embeddings, embedding_dim, group)

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        """Share the embedding table (``tie_word_embeddings``): one tensor, loaded once."""
        if embedding.weight.shape != self.weight.shape:
            raise ValueError(
                f"cannot tie LM head {tuple(self.weight.shape)} to embedding "
                f"{tuple(embedding.weight.shape)}"
            )
        self.weight = embedding.weight

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden_states, self.weight)
        return self.group.all_gather_last_dim(logits)
