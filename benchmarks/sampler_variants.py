"""The GPU sampler's variants: the experiment that chose the engine's sampler.

The engine samples with one variant, ``engine.model.kernels.sampler`` (``SAMPLER_VARIANT``).
This module keeps the others, picked by name from :data:`SAMPLER_VARIANTS`, for
``python -m benchmarks.sampler`` (which checks and times them) and its tests. The measurements
are in docs/gpu-notes.md ("GPU sampler").

- ``ref``: the original kernel, a 2-D grid of (row, 4096-column chunk) programs, Philox-4x32-10
  noise, finished by three PyTorch kernels (argmax over chunks, gather, cast); ``chunk-p7`` is
  the same with 7 Philox rounds and ``chunk-floor`` the same without noise (greedy only: a
  floor, not a sampler);
- ``tiles-*``: a grid of (row, split) programs, each looping over tiles of its span of the
  vocabulary with a per-lane running best (one reduction per program, not four per 4096
  columns), skipping the noise of greedy rows, finished by a second tiny kernel (``kernel``),
  by the last program of each row (``atomic``: one launch) or by PyTorch (``torch``); with one
  split per row the program writes the token itself. Noise: Philox-4x32 with 10 or 7 rounds
  (7 passes BigCrush, Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") or an
  integer hash of (seed, row, column) (``hash1``: one lowbias32 finalizer per element,
  ``hash2``: two, keyed separately). ``prune`` skips the noise of a tile none of whose columns
  can win (its best logit plus the largest possible noise is not above the best score so far):
  the same tokens, less work when the distribution is peaked.

Every sampler variant draws exactly ``argmax(logits * log2(e) / T + G2)`` with ``G2 =
-log2(-log2 U)`` (a base-2 Gumbel), ``U`` a float in ``[2**-24, 1 - 2**-24]`` (Philox
``ref``/``chunk-p7``: ``[0, 1)``, clamped); ties go to the lowest column, greedy rows are the
plain argmax with the same tie rule. The kernels are in :mod:`benchmarks.sampler_variant_kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from benchmarks.sampler_variant_kernels import (
    FINISH_ATOMIC,
    FINISH_DIRECT,
    FINISH_KERNEL,
    FINISH_TORCH,
    INTERPRETING,
    NOISE_HASH,
    NOISE_NONE,
    NOISE_PHILOX,
    PROBE_MODES,
    _noise_kernel,
    _sample_chunk_kernel,
    _sample_tiles_kernel,
    gumbel_probe,
)
from engine.model.kernels.launch import pdl_options
from engine.model.kernels.sampler import (
    SAMPLE_BLOCK_V,
    SAMPLE_NUM_WARPS,
    SAMPLER_VARIANT,
    TILES_TARGET_PROGRAMS,
    _finish_kernel,
    seed_halves,
    split_plan,
)

__all__ = [
    "DEFAULT_SAMPLER_VARIANT",
    "PROBE_MODES",
    "SAMPLER_VARIANTS",
    "SamplerVariant",
    "gumbel_probe",
    "resolve_variant",
    "sample_tokens",
    "split_plan",
    "tiles_noise",
]

DEFAULT_SAMPLER_VARIANT = SAMPLER_VARIANT


@dataclass(frozen=True)
class SamplerVariant:
    """One way to run the sampler; see the module docstring."""

    name: str
    kernel: str = "tiles"  # "chunk" (the reference structure) or "tiles"
    noise: str = "philox"  # "philox", "hash" or "none" (greedy only: a floor, not a sampler)
    rounds: int = 7  # Philox rounds, or hash finalizer rounds (1 or 2)
    block_v: int = SAMPLE_BLOCK_V
    num_warps: int = SAMPLE_NUM_WARPS
    finish: str = "kernel"  # tiles: "kernel", "atomic" or "torch" (chunk: always torch)
    target_programs: int = TILES_TARGET_PROGRAMS  # tiles: splits per row = target / rows
    splits: int | None = None  # tiles: a fixed number of splits per row (1: one program a row)
    tail: bool = True  # tiles: series for -log2(u) near u = 1
    fast_log: bool = False  # tiles: libdevice fast_log2f (compiled only; the interpreter has none)
    prune: bool = False  # tiles: skip the noise of tiles that cannot win

    @property
    def is_sampler(self) -> bool:
        """False for the noiseless floors, which ignore the temperature."""
        return self.noise != "none"


_VARIANT_LIST = [
    SamplerVariant("ref", kernel="chunk", rounds=10, finish="torch", tail=False),
    SamplerVariant("chunk-p7", kernel="chunk", rounds=7, finish="torch", tail=False),
    SamplerVariant("chunk-floor", kernel="chunk", noise="none", finish="torch", tail=False),
    SamplerVariant("tiles-p10", rounds=10),
    SamplerVariant("tiles-p7"),
    SamplerVariant("tiles-hash1", noise="hash", rounds=1),
    SamplerVariant("tiles-hash2", noise="hash", rounds=2),
    SamplerVariant("tiles-p7-notail", tail=False),
    SamplerVariant("tiles-p7-fastlog", fast_log=True),
    SamplerVariant("tiles-p7-torchfin", finish="torch"),
    SamplerVariant("tiles-p7-prune", prune=True),
    SamplerVariant("tiles-p7-b2048w4", block_v=2048, num_warps=4),
    SamplerVariant("tiles-p7-b8192w8", block_v=8192),
    SamplerVariant("tiles-p7-b4096w4", num_warps=4),
    SamplerVariant("tiles-p7-t512", target_programs=512),
    SamplerVariant("tiles-p7-t4096", target_programs=4096),
    SamplerVariant("tiles-p7-rowloop", splits=1),
    SamplerVariant("tiles-hash1-prune", noise="hash", rounds=1, prune=True),
    SamplerVariant("tiles-floor", noise="none"),
    SamplerVariant("tiles-p7-atomic", finish="atomic"),
    SamplerVariant("tiles-hash1-atomic", noise="hash", rounds=1, finish="atomic"),
]
SAMPLER_VARIANTS: dict[str, SamplerVariant] = {v.name: v for v in _VARIANT_LIST}
assert SAMPLER_VARIANTS[DEFAULT_SAMPLER_VARIANT].is_sampler

_NOISE_CODES = {"none": NOISE_NONE, "philox": NOISE_PHILOX, "hash": NOISE_HASH}
_FINISH_CODES = {"torch": FINISH_TORCH, "kernel": FINISH_KERNEL, "atomic": FINISH_ATOMIC}
# Per device: a zeroed counter per row for the "atomic" finish (each row's last program resets
# its counter, so it stays zero between calls). Not safe for two concurrent streams.
_ARRIVALS: dict[torch.device, torch.Tensor] = {}
_MIN_ARRIVAL_ROWS = 4096


def resolve_variant(variant: str | SamplerVariant | None) -> SamplerVariant:
    if variant is None:
        variant = DEFAULT_SAMPLER_VARIANT
    if isinstance(variant, str):
        try:
            return SAMPLER_VARIANTS[variant]
        except KeyError:
            raise ValueError(
                f"unknown sampler variant {variant!r}; known: {', '.join(SAMPLER_VARIANTS)}"
            ) from None
    return variant


def _arrival_counters(device: torch.device, rows: int) -> torch.Tensor:
    counters = _ARRIVALS.get(device)
    if counters is None or counters.numel() < rows:
        counters = torch.zeros(max(rows, _MIN_ARRIVAL_ROWS), dtype=torch.int32, device=device)
        _ARRIVALS[device] = counters
    return counters


def sample_tokens(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seed: int,
    block_v: int | None = None,
    *,
    variant: str | SamplerVariant | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """One token id (int64) per row of ``logits`` ``[rows, vocab]``; ``temperatures`` float32.

    ``variant`` (a name in :data:`SAMPLER_VARIANTS`) defaults to the engine's; ``block_v`` and
    ``splits`` override the variant's tile width and splits per row (tests, benchmarks).
    """
    v = resolve_variant(variant)
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if temperatures.shape != (rows,):
        raise ValueError(f"{rows} rows of logits but temperatures {tuple(temperatures.shape)}")
    block_v = block_v or v.block_v
    if rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    if v.kernel == "chunk":
        return _sample_chunks(logits, temperatures, seed, block_v, v)
    return _sample_tiles(logits, temperatures, seed, block_v, v, splits)


def _sample_chunks(
    logits: torch.Tensor, temperatures: torch.Tensor, seed: int, block_v: int, v: SamplerVariant
) -> torch.Tensor:
    rows, vocab = logits.shape
    chunks = triton.cdiv(vocab, block_v)
    best_val = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    best_idx = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    _sample_chunk_kernel[(rows, chunks)](
        logits,
        temperatures,
        best_val,
        best_idx,
        seed,
        logits.stride(0),
        vocab,
        chunks,
        BLOCK_V=block_v,
        ROUNDS=v.rounds if v.is_sampler else 0,
        num_warps=v.num_warps,
    )
    winner = best_val.argmax(dim=1, keepdim=True)
    return best_idx.gather(1, winner).squeeze(1).to(torch.int64)


def _sample_tiles(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seed: int,
    block_v: int,
    v: SamplerVariant,
    splits: int | None,
) -> torch.Tensor:
    rows, vocab = logits.shape
    device = logits.device
    num_splits, span = split_plan(
        rows, vocab, block_v, v.target_programs, splits if splits is not None else v.splits
    )
    finish = FINISH_DIRECT if num_splits == 1 else _FINISH_CODES[v.finish]
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    if finish == FINISH_DIRECT:
        part_val = part_idx = tokens  # unused
    else:
        part_val = torch.empty(rows, num_splits, dtype=torch.float32, device=device)
        part_idx = torch.empty(rows, num_splits, dtype=torch.int32, device=device)
    counters = _arrival_counters(device, rows) if finish == FINISH_ATOMIC else tokens
    seed_lo, seed_hi = seed_halves(seed)
    # Only the atomic finish's last program reduces in the main kernel: other finishes keep one
    # compiled version whatever the number of splits.
    splits_pad = triton.next_power_of_2(num_splits) if finish == FINISH_ATOMIC else 1
    _sample_tiles_kernel[(rows, num_splits)](
        logits,
        temperatures,
        part_val,
        part_idx,
        tokens,
        counters,
        seed_lo,
        seed_hi,
        logits.stride(0),
        vocab,
        span,
        BLOCK_V=block_v,
        NOISE=_NOISE_CODES[v.noise],
        ROUNDS=v.rounds,
        TAIL=v.tail,
        FAST_LOG=v.fast_log and not INTERPRETING,
        PRUNE=v.prune,
        FINISH=finish,
        SPLITS_PAD=splits_pad,
        num_warps=v.num_warps,
    )
    if finish == FINISH_TORCH:
        winner = part_val.argmax(dim=1, keepdim=True)
        return part_idx.gather(1, winner).squeeze(1).to(torch.int64)
    if finish == FINISH_KERNEL:
        pad = triton.next_power_of_2(num_splits)
        _finish_kernel[(rows,)](
            part_val, part_idx, tokens, num_splits, SPLITS_PAD=pad, **pdl_options()
        )
    return tokens


def tiles_noise(
    rows: int,
    vocab: int,
    seed: int,
    variant: str | SamplerVariant,
    block_v: int | None = None,
    device: torch.device | str = "cpu",
    max_block: int = 8192,
) -> torch.Tensor:
    """The base-2 Gumbel noise a tiles variant adds at each (row, column): float32 ``[rows,
    vocab]`` (for tests: the sampler must equal ``argmax(logits * log2(e) / T + noise)``).

    One program draws a tile for up to ``max_block // (block_v / 4)`` rows at once.
    """
    v = resolve_variant(variant)
    if v.kernel != "tiles" or not v.is_sampler:
        raise ValueError(f"variant {v.name!r} has no tiles noise")
    block_v = block_v or v.block_v
    out = torch.empty(rows, vocab, dtype=torch.float32, device=device)
    seed_lo, seed_hi = seed_halves(seed)
    block_rows = max(1, min(triton.next_power_of_2(rows), max_block // (block_v // 4)))
    grid = (triton.cdiv(rows, block_rows), triton.cdiv(vocab, block_v))
    _noise_kernel[grid](
        out,
        seed_lo,
        seed_hi,
        rows,
        vocab,
        BLOCK_ROWS=block_rows,
        BLOCK_V=block_v,
        NOISE=_NOISE_CODES[v.noise],
        ROUNDS=v.rounds,
        TAIL=v.tail,
        FAST_LOG=v.fast_log and not INTERPRETING,
    )
    return out
