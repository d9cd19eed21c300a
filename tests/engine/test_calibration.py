"""The start-up calibration: timed synthetic steps in the header, and a run it leaves untouched."""

from __future__ import annotations

from pathlib import Path

from engine import LLM, SamplingParams
from engine.calibration import PREFILL_TOKENS, calibration_batches
from engine.config import Config
from replay.verify import verify
from tracing.reader import read_trace

SETTINGS = {"kvcache_block_size": 16, "num_kvcache_blocks": 40, "max_model_len": 256}
PROMPTS = [[7, 8, 9] * 12, [3] * 40]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_calibration_steps_fit_the_pool_and_the_token_budget() -> None:
    """Only steps the configuration can hold are timed (here: up to the pool's 640 tokens), a
    prefill beyond max_model_len (256) as several prompts."""
    batches = calibration_batches(Config(**SETTINGS))
    prefill = [b for b in batches if b.kind == "prefill"]
    assert [b.num_batched_tokens for b in prefill] == [t for t in PREFILL_TOKENS if t <= 640]
    assert [len(b.seqs[-1].token_ids) for b in prefill] == [1, 16, 128, 256]
    assert all(b.num_prefill_seqs == len(b.seqs) == len(b.sampled_seqs) for b in prefill)
    for batch in batches:
        for seq in batch.seqs:
            assert max(seq.block_table) < SETTINGS["num_kvcache_blocks"]
            assert seq.seq_id < 0  # never a request's id


def test_captured_prefill_graph_sizes_join_the_ladder() -> None:
    """Each captured prefill token count is timed as one prompt (where the pool holds it), once
    even where it is on the ladder already."""
    batches = calibration_batches(Config(**SETTINGS), [16, 32, 64, 1024])
    tokens = [b.num_batched_tokens for b in batches if b.kind == "prefill" and not b.eager]
    assert tokens == sorted({t for t in (*PREFILL_TOKENS, 16, 32, 64) if t <= 640})


def test_steps_a_graph_runs_are_timed_eagerly_too() -> None:
    """With graphs captured, each ladder prefill up to the largest captured size and each decode
    follow once more flagged ``eager`` (what a configuration without graphs pays); a captured
    size off the ladder and a prefill above every captured size are timed once."""
    batches = calibration_batches(Config(**SETTINGS), [16, 32, 128], decode_graphs=True)
    eager = [(b.kind, b.num_batched_tokens) for b in batches if b.eager]
    # (the pool holds one 256-token decode sequence, not 16)
    assert eager == [("prefill", 1), ("prefill", 16), ("prefill", 128), ("decode", 1)]
    timed = [(b.kind, b.num_batched_tokens) for b in batches if not b.eager]
    assert set(eager) < set(timed) and ("prefill", 32) in timed and ("prefill", 512) in timed
    assert not any(b.eager for b in calibration_batches(Config(**SETTINGS)))


def test_calibration_is_recorded_and_leaves_the_run_unchanged(tmp_path: Path) -> None:
    """The header carries one timed row per step shape; outputs and the trace's decisions are
    the same as without calibration, and the trace still verifies."""
    llm = LLM(None, trace_dir=str(tmp_path / "t"), calibration_repeats=2, **SETTINGS)
    calibrated = [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm.close()
    plain_llm = LLM(None, calibration_repeats=0, **SETTINGS)
    plain = [o["token_ids"] for o in plain_llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    plain_llm.close()
    assert calibrated == plain
    rows = read_trace(tmp_path / "t").header["calibration"]
    assert [r["prefill_tokens"] for r in rows if r["kind"] == "prefill"] == [1, 16, 128, 512]
    assert all(r["interval_s"] > 0 and r["repeats"] == 2 for r in rows)
    assert verify(tmp_path / "t").identical
    # The second engine of the process starts warm, and its header says so.
    first = read_trace(tmp_path / "t").header["engine_starts_before"]
    assert plain_llm.core.header["engine_starts_before"] == first + 1
