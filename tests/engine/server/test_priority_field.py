"""A request's ``priority`` (vLLM's extension of the OpenAI API: lower is served first under
``--set policy=priority``) reaches the engine and its trace: through the frontend (stand-in
engine), and through both real engines into ``request_added.priority``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

pytest.importorskip("fastapi")

from fake_engine import MODEL, FakeEngine, app_client  # noqa: E402

from engine.sampling_params import INT32_MAX, INT32_MIN, SamplingParams  # noqa: E402
from engine.server.engine_loop import RequestStream  # noqa: E402
from engine.server.engine_proc import EngineSpec  # noqa: E402


def _post(engine: FakeEngine, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    with app_client(engine) as client:
        response = client.post(path, content=json.dumps(body))
        return response.status_code, response.json()


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 2}),
])
def test_a_requests_priority_reaches_the_engine(path: str, body: dict[str, Any]) -> None:
    """``priority`` was an unsupported field (a 400), so a workload's priorities could not be
    served: ``replayllm loadgen`` dropped them and the server ran every request at 0. It is
    taken now, as vLLM takes it, and handed to the engine with the request; the default is 0;
    one that is not an int32 is a 400 naming it."""
    engine = FakeEngine()
    for priority in (-7, 0, 12, INT32_MIN, INT32_MAX):
        status, answer = _post(engine, path, {**body, "model": MODEL, "priority": priority})
        assert status == 200, answer
        assert engine.submitted[-1].priority == priority
    status, answer = _post(engine, path, body)
    assert status == 200 and engine.submitted[-1].priority == 0
    submitted = len(engine.submitted)
    for bad in ("1", 1.5, True, INT32_MAX + 1, INT32_MIN - 1):
        status, answer = _post(engine, path, {**body, "priority": bad})
        assert status == 400 and answer["error"]["param"] == "priority", answer
    assert len(engine.submitted) == submitted


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_priorities_are_recorded_in_the_trace(mode: str, tmp_path: Path) -> None:
    """Each engine adds a request with the priority it was submitted with: the trace's
    ``request_added.priority`` holds them (it held 0 for every request served)."""
    spec = EngineSpec(None, str(tmp_path / "trace"),
                      {"max_model_len": 256, "calibration_repeats": -1})
    if mode == "process":
        from engine.server.engine_client import EngineProcess

        engine: Any = EngineProcess(spec)
    else:
        from engine.server.engine_loop import EngineLoop

        engine = EngineLoop(spec.build())
    priorities = [3, -2, 0]

    async def run() -> None:
        engine.start(asyncio.get_running_loop())
        streams = []
        for priority in priorities:
            stream = RequestStream([10, 11, 12], SamplingParams(max_tokens=2, ignore_eos=True),
                                   engine.now(), priority=priority)
            engine.submit(stream)
            streams.append(stream)
        for stream in streams:
            while (await stream.queue.get())[1] is None:
                pass
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, 5.0)

    asyncio.run(run())
    added = pq.read_table(tmp_path / "trace" / "request_added").to_pylist()
    assert [row["priority"] for row in sorted(added, key=lambda r: r["seq_id"])] == priorities
