"""A step's staged inputs as one block: pinned host bytes, a device twin, one copy per step.

Graph steps read their inputs from fixed device buffers (``decode_graphs``, ``prefill_graphs``,
``mixed_graphs``): an int64 block of rows (ids, positions, slots, ...), an int32 block
(sequence lengths, then block tables) and one float32 temperature per sampled row. Each lives
here as a typed view into one byte buffer, so the host fills three numpy views and a step pays
one host-to-device transfer instead of three: each ``copy_`` costs the host tens of
microseconds whatever its size, a one-row decode step's whole budget is about a millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_I64, _I32, _F32 = 8, 4, 4  # bytes per element of the three blocks


@dataclass(frozen=True, slots=True)
class StagingLayout:
    """The shapes of a staging block: int64 ``[i64_rows, i64_cols]``, int32 ``[i32_len]``,
    float32 ``[f32_len]``, laid out in that order (each offset aligned for its type)."""

    i64_rows: int
    i64_cols: int
    i32_len: int
    f32_len: int

    @property
    def i32_offset(self) -> int:
        return self.i64_rows * self.i64_cols * _I64

    @property
    def f32_offset(self) -> int:
        return self.i32_offset + self.i32_len * _I32

    @property
    def nbytes(self) -> int:
        return self.f32_offset + self.f32_len * _F32


class StagingBlock:
    """One staging block on a device (or pinned on the host): ``raw`` bytes and the typed views
    ``i64``, ``i32`` and ``f32`` into it, zero-filled. Addresses never change, so CUDA graphs
    captured over the device views stay valid."""

    def __init__(self, layout: StagingLayout, device: torch.device | str = "cpu",
                 pin: bool = False) -> None:
        self.layout = layout
        self.raw = torch.zeros(layout.nbytes, dtype=torch.uint8, device=device, pin_memory=pin)
        self.i64 = self.raw[: layout.i32_offset].view(torch.int64).view(
            layout.i64_rows, layout.i64_cols)
        self.i32 = self.raw[layout.i32_offset : layout.f32_offset].view(torch.int32)
        self.f32 = self.raw[layout.f32_offset :].view(torch.float32)

    def upload(self, host: StagingBlock) -> None:
        """Copy ``host`` (same layout; pinned, so the copy does not block) into this block in one
        transfer, ordered on the current stream before the kernels launched after it."""
        self.raw.copy_(host.raw, non_blocking=True)
