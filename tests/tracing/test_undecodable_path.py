"""A trace in a directory whose name is not UTF-8 (bytes a Linux file name may hold) reads,
exports and verifies like any other. Before, pyarrow could not take the path as text and every
reader called each committed file "not a readable Parquet file, truncated or corrupted"."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from replay.verify import verify
from tests.tracing._trace_helpers import record, reference_like
from tracing import read_trace
from tracing.inspect import summarize

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file names of raw bytes")


def test_trace_under_an_undecodable_name_reads(tmp_path: Path) -> None:
    """Tables, counts, summary and verify agree with the same trace under a plain name."""
    plain = tmp_path / "plain"
    record(reference_like(6), plain, flush_steps=3)
    odd = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/tr\xffce"))
    shutil.copytree(plain, odd)
    want, got = read_trace(plain), read_trace(odd)
    assert got.counts() == want.counts() and got.complete
    for kind in ("request_added", "model_step", "token_sampled"):
        assert got.table(kind).equals(want.table(kind))
    assert summarize(got)["num_events"] == summarize(want)["num_events"]
    assert verify(odd).identical
