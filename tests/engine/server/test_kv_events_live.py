"""``serve --kv-events-endpoint``: vLLM's ZMQ framing (topic, 8-byte big-endian sequence
number, msgpack EventBatch) with the events the trace's export gives."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
pytest.importorskip("fastapi")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tracing"))

import httpx  # noqa: E402
from server_process import ServerProcess, free_port  # noqa: E402
from test_kv_events import check_vllm_batch  # noqa: E402

from tracing import read_trace  # noqa: E402
from tracing.kv_events import trace_kv_batches  # noqa: E402


def test_live_events_over_zmq(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(tmp_path / "t", "--kv-events-endpoint", f"tcp://*:{port}")
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    time.sleep(1.0)  # PUB drops what is sent before a subscriber has joined
    try:
        prefix = " ".join(["shared system prompt"] * 120)  # > one 256-token block
        for i in range(4):
            response = httpx.post(server.url + "/v1/completions", timeout=60,
                                  json={"prompt": f"{prefix} question {i}", "max_tokens": 20,
                                        "ignore_eos": True})
            assert response.status_code == 200
    finally:
        server.terminate()
    messages = []
    while sub.poll(2000):
        messages.append(sub.recv_multipart())
    sub.close(linger=0)
    assert messages
    sequence = []
    batches = []
    for frames in messages:
        assert len(frames) == 3
        topic, seq, payload = frames
        assert topic == b"" and len(seq) == 8
        sequence.append(int.from_bytes(seq, "big"))
        batch = msgpack.unpackb(payload, raw=False)
        check_vllm_batch(batch)
        batches.append(batch)
    assert sequence == list(range(sequence[0], sequence[0] + len(sequence)))
    live = [e for b in batches for e in b["events"] if e["type"] != "AllBlocksCleared"]
    exported = [e for b in trace_kv_batches(read_trace(tmp_path / "t")) for e in b["events"]
                if e["type"] != "AllBlocksCleared"]
    assert live == exported
    assert any(e["type"] == "BlockStored" for e in live)
