"""The CPU proxy of a GPU: step times fitted to a GPU trace; the real engine core over it
records a trace that verifies."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.sampling_params import SamplingParams
from engine.server.proxy import ProxyEngine, ProxyStepTimes
from replay.verify import verify
from tracing import read_trace

ROOT = Path(__file__).resolve().parents[3]
H200 = ROOT / "traces" / "h200-reference-s4"


def test_fit_predicts_the_traces_decode_steps() -> None:
    times = ProxyStepTimes.fit(str(H200))
    assert times.prefill_token_s > 0 and times.decode_seq_s > 0
    steps = read_trace(H200).table("model_step").to_pandas()
    decode = steps[steps["kind"] == "decode"]
    predicted = times.base_s + times.decode_seq_s * decode["decode_seqs"].to_numpy()
    error = np.median(np.abs(predicted - decode["duration_s"]) / decode["duration_s"])
    assert error < 0.2


def test_proxy_engine_takes_the_model_times_and_its_trace_verifies(tmp_path: Path) -> None:
    times = ProxyStepTimes(base_s=0.002, prefill_token_s=1e-5, decode_seq_s=1e-4)
    engine = ProxyEngine(times, str(tmp_path / "t"))
    core = engine.core
    for i in range(6):
        core.add_request(list(range(5, 40 + 7 * i)), SamplingParams(max_tokens=5 + i,
                                                                    ignore_eos=True))
    core.run_until_idle()
    assert core.num_completion_tokens == sum(5 + i for i in range(6))
    engine.close()
    steps = read_trace(tmp_path / "t").table("model_step").to_pandas()
    expected = (times.base_s + times.prefill_token_s * steps["prefill_tokens"]
                + times.decode_seq_s * steps["decode_seqs"])
    assert np.allclose(steps["duration_s"], expected)
    assert verify(tmp_path / "t").identical
