"""A staging block: three typed views over one byte buffer, copied in one transfer."""

from __future__ import annotations

import torch

from engine.runner.staging import StagingBlock, StagingLayout


def test_the_three_views_share_one_buffer_and_one_upload_copies_them_all() -> None:
    """What the host writes through each typed view lands in the device block's same view after
    one ``upload``, and the views neither overlap nor leave a gap (the byte count is theirs)."""
    layout = StagingLayout(i64_rows=3, i64_cols=5, i32_len=7, f32_len=3)
    assert layout.nbytes == 3 * 5 * 8 + 7 * 4 + 3 * 4
    host, dev = StagingBlock(layout), StagingBlock(layout)
    assert host.i64.shape == (3, 5) and host.i32.shape == (7,) and host.f32.shape == (3,)
    host.i64.numpy()[:] = torch.arange(15).view(3, 5).numpy() - 7
    host.i32.numpy()[:] = [1 << 30, -1, 2, 3, 4, 5, 6]
    host.f32.numpy()[:] = [0.5, 1.0, -2.25]
    before = dev.i64.data_ptr(), dev.i32.data_ptr(), dev.f32.data_ptr()
    dev.upload(host)
    assert torch.equal(dev.i64, host.i64)
    assert torch.equal(dev.i32, host.i32)
    assert torch.equal(dev.f32, host.f32)
    # Captured graphs read these addresses: an upload must not move them.
    assert (dev.i64.data_ptr(), dev.i32.data_ptr(), dev.f32.data_ptr()) == before
    assert dev.i32.data_ptr() - dev.i64.data_ptr() == layout.i32_offset


def test_an_odd_int32_block_keeps_the_float_block_aligned() -> None:
    """The float32 block follows an int32 block of any length and stays addressable as floats;
    the int32 block follows the int64 block at a multiple of eight bytes."""
    layout = StagingLayout(i64_rows=1, i64_cols=3, i32_len=5, f32_len=2)
    block = StagingBlock(layout)
    assert layout.i32_offset % 8 == 0 and layout.f32_offset % 4 == 0
    block.f32[:] = torch.tensor([3.0, 4.0])
    block.i32[:] = 9
    assert block.f32.tolist() == [3.0, 4.0] and block.i32.tolist() == [9] * 5
