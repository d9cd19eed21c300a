"""``inspect --json`` and both exports on traces whose header or step times are not the
engine's usual ones: a header giving the block size only in its engine config (the header's
``block_size`` is optional, ``tracing.validate``) or not at all, and a damaged step duration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.cli.main import main

DEMO = Path(__file__).resolve().parents[2] / "traces" / "cpu-tiny-demo"


def _copy(tmp_path: Path) -> Path:
    trace = tmp_path / "t"
    shutil.copytree(DEMO, trace)
    return trace


def _edit_header(trace: Path, drop: tuple[str, ...], drop_config: tuple[str, ...] = ()) -> None:
    header = json.loads((trace / "run.json").read_text())
    for key in drop:
        header.pop(key, None)
    for key in drop_config:
        header.get("config", {}).pop(key, None)
    (trace / "run.json").write_text(json.dumps(header))


def _kv_batches(trace: Path, out: Path) -> list[dict[str, Any]]:
    assert main(["export", str(trace), "--format", "vllm-kv-events", "--out", str(out)]) == 0
    with open(out, "rb") as handle:
        return list(msgpack.Unpacker(handle, raw=False))


def _request_spans(trace: Path, out: Path) -> dict[int, dict[str, Any]]:
    assert main(["export", str(trace), "--out", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    return {e["id"]: e["args"] for e in events if e["ph"] == "b"}


def test_a_header_with_the_block_size_only_in_its_config_exports_the_same(
        tmp_path: Path) -> None:
    """A header without ``block_size`` (and ``num_blocks``) but with the engine config's
    ``kvcache_block_size`` (``num_kvcache_blocks``) passes ``verify`` and ``inspect`` (which
    read the config); ``export --format vllm-kv-events`` was a ``KeyError: 'block_size'``
    traceback and the Perfetto spans lost their prefix-cache hit tokens. Both exports now read
    the block size by ``inspect``'s rule and equal the full header's exports."""
    full = _copy(tmp_path / "full")
    bare = _copy(tmp_path / "bare")
    _edit_header(bare, ("block_size", "num_blocks"))
    assert _kv_batches(bare, tmp_path / "bare.msgpack") == _kv_batches(
        full, tmp_path / "full.msgpack")
    full_spans = _request_spans(full, tmp_path / "full.json")
    assert any(args["prefix_cache_hit_tokens"] > 0 for args in full_spans.values())
    assert _request_spans(bare, tmp_path / "bare.json") == full_spans
    full_doc = json.loads((tmp_path / "full.json").read_text())["traceEvents"]
    bare_doc = json.loads((tmp_path / "bare.json").read_text())["traceEvents"]
    counters = [e for e in full_doc if e["ph"] == "C"]
    assert any(e["name"] == "free KV blocks" for e in counters)
    assert [e for e in bare_doc if e["ph"] == "C"] == counters


def test_a_header_with_no_block_size_is_one_line_for_the_kv_export(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With no block size anywhere in the header the KV events' token ids cannot be cut:
    one line naming the trace, exit 2, no file (not a traceback)."""
    trace = _copy(tmp_path)
    _edit_header(trace, ("block_size",), ("kvcache_block_size",))
    out = tmp_path / "kv.msgpack"
    assert main(["export", str(trace), "--format", "vllm-kv-events", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "block size" in err and str(trace) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def _reject_constant(name: str) -> None:
    raise AssertionError(f"not strict JSON: {name}")


def test_inspect_json_is_strict_json_for_a_damaged_step_duration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model step whose ``duration_s`` reads NaN (a damaged trace that ``verify`` still
    calls identical) made ``inspect --json`` print ``"model_time_s": NaN``, which ``jq`` and
    ``JSON.parse`` refuse; the figure is now null (unknown) and the text says ``model ? s``."""
    trace = _copy(tmp_path)
    path = sorted((trace / "model_step").glob("seg-*.parquet"))[0]
    table = pq.read_table(path)
    durations = table.column("duration_s").to_pylist()
    durations[1] = float("nan")
    index = table.schema.get_field_index("duration_s")
    pq.write_table(table.set_column(index, table.schema.field(index),
                                    pa.array(durations, pa.float64())), path)
    assert main(["inspect", str(trace), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out, parse_constant=_reject_constant)
    assert figures["model_time_s"] is None
    assert isinstance(figures["wall_time_s"], float)
    assert main(["inspect", str(trace)]) == 0
    assert "(model ? s)" in capsys.readouterr().out
