"""A served run whose sampling values the trace's float32 columns round replays identically
(hardening round s37), over real HTTP with the official ``openai`` client."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from server_process import ServerProcess  # noqa: E402

from replay.verify import verify  # noqa: E402
from tracing import read_trace  # noqa: E402

MODEL = "replayllm-tiny"


def test_a_temperature_the_trace_rounds_below_greedy_replays_identically(
        tmp_path: Path) -> None:
    """Temperature 1e-5 ran sampled (it is not below ``GREEDY_BELOW``), but the trace's
    float32 column held 9.99999975e-06, which replayed greedy: ``replayllm verify`` of the
    served run diverged at its ``request_added``. Now the engine holds the value the trace
    records and compares the greedy cut-off in float32, so both sample and the run verifies;
    a temperature no float32 holds is a 400 and never reaches the trace."""
    trace_dir = tmp_path / "trace"
    server = ServerProcess(trace_dir)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        settings = [{"temperature": 1e-5}, {"temperature": 1.0, "top_p": 0.99999999},
                    {"temperature": 1.0}, {"temperature": 1.0}]

        def send(setting: dict[str, float]) -> None:
            client.completions.create(model=MODEL, prompt="Hello there", max_tokens=12,
                                      **setting)

        threads = [threading.Thread(target=send, args=(s,)) for s in settings]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=1e308)
        assert refused.value.body["param"] == "temperature"
        assert server.stop() == 0
    finally:
        server.kill()
    added = read_trace(trace_dir).table("request_added").to_pandas()
    assert len(added) == len(settings)
    assert 0.0 < sorted(added.temperature)[0] < 1e-5  # 1e-5 as float32, sampled
    result = verify(trace_dir)
    assert result.identical, result
