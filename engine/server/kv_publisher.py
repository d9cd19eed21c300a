"""Live KV-cache events over ZMQ, as vLLM's ``ZmqEventPublisher`` sends them.

Each ``EventBatch`` (``tracing.kv_events``) goes out as three frames: the topic, an 8-byte
big-endian sequence number (0, 1, ...), the msgpack payload. As in vLLM, an endpoint with a
wildcard (``tcp://*:5557``) or an ipc/inproc one is bound, any other is connected to.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ReplayLLMError


class ZmqKVPublisher:
    """A ZMQ PUB socket publishing KV event batches (callable: ``publisher(batch)``)."""

    def __init__(self, endpoint: str, topic: str = "", hwm: int = 100_000) -> None:
        try:
            import msgpack
            import zmq
        except ImportError as exc:
            raise ReplayLLMError(f"--kv-events-endpoint needs pyzmq and msgpack: {exc}") from None
        self._pack = msgpack.Packer()
        self._zmq = zmq
        self._socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.set_hwm(hwm)
        try:
            if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://",
                                                                           "inproc://")):
                self._socket.bind(endpoint)
            else:
                self._socket.connect(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close(linger=0)
            raise ReplayLLMError(f"cannot open KV events endpoint {endpoint}: {exc}") from None
        self._topic = topic.encode("utf-8")
        self.sequence = 0

    def __call__(self, batch: dict[str, Any]) -> None:
        payload = self._pack.pack(batch)
        frames = (self._topic, self.sequence.to_bytes(8, "big"), payload)
        try:
            self._socket.send_multipart(frames, flags=self._zmq.NOBLOCK)
        except self._zmq.Again:  # no subscriber keeps up: PUB semantics, the batch is dropped
            pass
        self.sequence += 1

    def close(self) -> None:
        self._socket.close(linger=1000)
