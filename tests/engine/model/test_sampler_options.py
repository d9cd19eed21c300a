"""Per-request sampling options on the PyTorch path: top-k, top-p and a request's own seed."""

from __future__ import annotations

import pytest
import torch

from engine.model.layers.sampler import NO_SEED, Sampler, sample_option_rows

VOCAB = 64


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_top_k_keeps_only_the_k_most_likely_tokens() -> None:
    """Over many seeded draws at a high temperature, every token is among the top 3."""
    logits = _logits(1)
    allowed = set(torch.topk(logits[0], 3).indices.tolist())
    drawn = set()
    for seed in range(200):
        tokens = Sampler(0)(logits, [5.0], [(1.0, 3, seed, 0)])
        drawn.add(int(tokens[0]))
    assert drawn <= allowed
    assert len(drawn) == 3  # the temperature is high enough that all three get drawn


def test_top_p_keeps_the_nucleus() -> None:
    """The kept set is the smallest prefix of the ranking whose mass reaches top_p."""
    logits = _logits(1, seed=3)
    probs = torch.softmax(logits[0], dim=-1)
    ordered = torch.sort(probs, descending=True)
    cum = torch.cumsum(ordered.values, dim=0)
    size = int((cum < 0.5).sum()) + 1
    nucleus = set(ordered.indices[:size].tolist())
    drawn = {int(Sampler(0)(logits, [1.0], [(0.5, 0, seed, 0)])[0]) for seed in range(300)}
    assert drawn <= nucleus
    assert len(drawn) == len(nucleus)


def test_a_tiny_top_p_is_greedy() -> None:
    logits = _logits(4)
    tokens = Sampler(0)(logits, [1.0] * 4, [(1e-6, 0, NO_SEED, 0)] * 4)
    assert tokens.tolist() == logits.argmax(dim=-1).tolist()


def test_a_seeded_row_depends_only_on_its_seed_and_token_index() -> None:
    """The same row (logits, seed, index) gets the same token whatever its neighbours, its
    position in the batch and the sampler's own generator state; another index draws anew."""
    logits = _logits(8)
    row = logits[2:3]
    alone = Sampler(7)(row, [1.0], [(1.0, 0, 42, 5)])
    mixed = torch.cat([logits[:2], row, logits[3:]])
    options = [None, (0.9, 0, NO_SEED, 0), (1.0, 0, 42, 5)] + [None] * 5
    batched = Sampler(123)(mixed, [1.0] * 8, options)
    assert int(batched[2]) == int(alone[0])
    draws = {int(Sampler(0)(row, [1.0], [(1.0, 0, 42, i)])[0]) for i in range(40)}
    assert len(draws) > 1


def test_rows_without_options_keep_the_batched_path() -> None:
    """No options: the same tokens as before options existed (the generator's draws for the
    other rows do not move when an option row is present)."""
    logits = _logits(3)
    plain = Sampler(5)(logits[[0, 2]], [1.0, 1.0])
    with_option = Sampler(5)(logits, [1.0, 1.0, 1.0], [None, (1.0, 0, 9, 0), None])
    assert with_option[[0, 2]].tolist() == plain.tolist()


def test_option_rows_are_overwritten_in_place() -> None:
    logits = _logits(2)
    tokens = torch.tensor([-1, -1])
    sample_option_rows(logits, torch.tensor([1.0, 1.0]), [None, (1.0, 1, 3, 0)], tokens,
                       torch.Generator())
    assert tokens.tolist() == [-1, int(logits[1].argmax())]


def test_row_options_must_match_the_rows() -> None:
    with pytest.raises(ValueError, match="row options"):
        Sampler(0)(_logits(2), [1.0, 1.0], [None])
