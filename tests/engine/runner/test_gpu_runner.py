"""The CUDA model runner against transformers on the same weights (Qwen3-0.6B architecture).

- float32: greedy tokens identical to ``transformers`` ``generate`` over 64 new tokens, for a
  mixed batch (prompt lengths 1..700), with prefix-cache hits and, in another run, preemptions;
- bfloat16: the engine's own greedy trajectory teacher-forced through transformers: logits at
  every generated position within ``BF16_LOGIT_REL_ERR_MAX`` (relative L2, mean below
  ``BF16_LOGIT_REL_ERR_MEAN``) and top-1 agreement with transformers' float32 run as good as
  transformers' own bf16 run achieves, on the all-random ``qwen3-0.6b`` (its near-tied top logits
  make even transformers' bf16 and float32 disagree on ~10% of positions); and top-1 agreement
  of at least ``BF16_TOP1_MIN`` with transformers' bf16 and float32 runs on
  ``qwen3-0.6b-confident``, the same architecture with a trained model's logit margins;
each with CUDA graphs on and off (on: decodes and prefills, the prefills padded to a captured
token count), with prefix-cache hits and with preemption, decode steps overlapped (async
scheduling); and the start-up calibration times each step a graph runs a second time without one
(``ScheduledBatch.eager``). Needs a CUDA GPU (the weights are made, not downloaded).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

NEW_TOKENS = 64
PROMPT_LENS = (1, 37, 255, 256, 300, 700)
SHARED_PREFIX = 512  # two full 256-token blocks: later prompts hit them in the prefix cache
PREEMPT_BLOCKS = 6  # too few blocks for every sequence at once: forces preemption
# Relative L2 error of a position's logits, |l - l_hf| / |l_hf|: bf16 rounding through 28 layers,
# summed in another order, lands at 0.03-0.06 (measured on the H200, docs/gpu-notes.md).
BF16_LOGIT_REL_ERR_MAX = 0.1
BF16_LOGIT_REL_ERR_MEAN = 0.05
BF16_TOP1_SLACK = 0.03  # measured: ours 87.7% vs float32, transformers' bf16 89.7%
BF16_TOP1_MIN = 0.99  # the bar, on the confident checkpoint
BASE_CONFIG = {"max_num_seqs": 16, "max_model_len": 2048, "max_num_batched_tokens": 4096}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.model.checkpoint import make_model

    return make_model("qwen3-0.6b", tmp_path_factory.mktemp("qwen3-0.6b"))


@pytest.fixture(scope="module")
def confident_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.model.checkpoint import make_model

    return make_model("qwen3-0.6b-confident", tmp_path_factory.mktemp("qwen3-0.6b-confident"))


def prompts() -> list[list[int]]:
    rng = random.Random(1)
    prefix = [rng.randrange(151000) for _ in range(SHARED_PREFIX)]
    out = [[rng.randrange(151000) for _ in range(n)] for n in PROMPT_LENS]
    out.append(prefix + [rng.randrange(151000) for _ in range(40)])
    out.append(prefix + [rng.randrange(151000) for _ in range(300)])
    return out


def hf_model(model_dir: Path, dtype: torch.dtype) -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).cuda()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def run_engine(
    model_dir: Path, dtype: str, eager: bool, preempt: bool, overlap: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Greedy run in two waves (the second hits the first's prefix blocks), logits recorded.

    ``overlap``: async scheduling (the default), so decode steps launch with their input tokens
    still on the device; the logits hook syncs, which changes timing, not results."""
    from engine import LLM, SamplingParams

    config = dict(BASE_CONFIG, dtype=dtype, enforce_eager=eager, async_scheduling=overlap,
                  **(extra or {}))
    if preempt:
        config["num_kvcache_blocks"] = PREEMPT_BLOCKS
    llm = LLM(str(model_dir), record_events=False, **config)
    runner = llm.runner
    logits: dict[tuple[int, int], torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}
    compute_logits, launch = runner.model.compute_logits, runner.launch

    def record_logits(hidden: torch.Tensor) -> torch.Tensor:
        out = compute_logits(hidden)
        last["logits"] = out.float().cpu()
        return out

    cached: dict[int, int] = {}
    prefill_graphs: list[bool] = []  # per prefill step: did it replay a CUDA graph
    mixed_graphs: list[bool] = []  # per mixed step (prompt chunks and decodes): the same

    def record_step(batch: Any, previous: Any = None) -> Any:
        # Prefix hits are known at admission (the block manager resets them when a seq ends).
        for seq in batch.seqs[: batch.num_prefill_seqs]:
            cached[seq.seq_id] = max(cached.get(seq.seq_id, 0), seq.num_cached_tokens)
        result = launch(batch, previous)
        if batch.num_prefill_seqs:  # a prefill resolves in launch: its output is at hand
            prefill_graphs.append(result.result().graph_used)
            if batch.num_prefill_seqs < len(batch.seqs):
                mixed_graphs.append(result.result().graph_used)
        rows = [s for i, s in enumerate(batch.seqs) if batch.sample is None or batch.sample[i]]
        for row, seq in enumerate(rows):
            logits[(seq.seq_id, len(seq.token_ids))] = last["logits"][row]
        return result

    runner.model.compute_logits = record_logits
    runner.launch = record_step  # execute() goes through launch() too
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    all_prompts = prompts()
    # Wave 1 holds one prompt with the shared prefix; wave 2's prompt hits its blocks.
    overlapped: list[int] = []
    launch_inner = runner.launch

    def count_overlap(batch: Any, previous: Any = None) -> Any:
        if previous is not None:
            overlapped.append(batch.step)
        return launch_inner(batch, previous)

    runner.launch = count_overlap
    first = llm.generate(all_prompts[:-1], params, use_tqdm=False)
    seqs = [llm.add_request(p, params) for p in all_prompts[-1:]]
    while not llm.is_finished():
        llm.step()
    result = {
        "tokens": [o["token_ids"] for o in first] + [list(s.completion_token_ids) for s in seqs],
        "cached": [cached.get(s.seq_id, 0) for s in seqs],
        "preemptions": llm.core.scheduler.num_preemptions,
        "graphs": runner.describe().get("cuda_graphs", False),
        "overlapped_steps": len(overlapped),
        "prefill_steps": len(prefill_graphs),
        "graph_prefill_steps": sum(prefill_graphs),
        "mixed_steps": len(mixed_graphs),
        "graph_mixed_steps": sum(mixed_graphs),
        "logits": logits,
        "seq_ids": list(range(len(all_prompts) - 1)) + [s.seq_id for s in seqs],
    }
    llm.close()
    return result


@pytest.fixture(scope="module")
def hf_fp32_tokens(model_dir: Path) -> list[list[int]]:
    model = hf_model(model_dir, torch.float32)
    out = []
    with torch.no_grad():
        for prompt in prompts():
            ids = torch.tensor([prompt], device="cuda")
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            out.append(gen[0, len(prompt) :].tolist())
    del model
    torch.cuda.empty_cache()
    return out


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("preempt", [False, True], ids=["roomy", "preempting"])
def test_float32_greedy_matches_transformers(
    model_dir: Path, hf_fp32_tokens: list[list[int]], eager: bool, preempt: bool
) -> None:
    run = run_engine(model_dir, "float32", eager, preempt)
    assert run["graphs"] == (not eager)
    assert run["overlapped_steps"] > 0, "decode steps must launch before the last one resolved"
    # Every prefill here fits a captured token count (<= 4096 tokens, <= 16 sequences).
    expected = 0 if eager else run["prefill_steps"]
    counts = (run["prefill_steps"], run["graph_prefill_steps"])
    assert counts[0] > 0 and counts[1] == expected, counts
    assert all(c >= SHARED_PREFIX for c in run["cached"]) or preempt, run["cached"]
    assert (run["preemptions"] > 0) == preempt
    for i, (ours, ref) in enumerate(zip(run["tokens"], hf_fp32_tokens)):
        assert ours == ref, f"prompt {i}: first difference at token " + str(
            next(j for j, (a, b) in enumerate(zip(ours, ref)) if a != b)
        )


def test_float32_greedy_matches_transformers_without_overlap(
    model_dir: Path, hf_fp32_tokens: list[list[int]]
) -> None:
    """The sequential loop (``async_scheduling=False``) gives the same tokens."""
    run = run_engine(model_dir, "float32", eager=False, preempt=False, overlap=False)
    assert run["overlapped_steps"] == 0
    assert run["tokens"] == hf_fp32_tokens


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_float32_greedy_matches_transformers_with_chunked_prefill(
    model_dir: Path, hf_fp32_tokens: list[list[int]], eager: bool
) -> None:
    """Under the chunked policy with a 512-token budget, prompt chunks share steps with
    decodes: through the mixed-step CUDA graphs, or eager with the decode part aligned."""
    run = run_engine(model_dir, "float32", eager, preempt=False,
                     extra={"policy": "chunked", "max_num_batched_tokens": 512})
    assert run["mixed_steps"] > 0
    assert run["graph_mixed_steps"] == (0 if eager else run["mixed_steps"]), run["mixed_steps"]
    for i, (ours, ref) in enumerate(zip(run["tokens"], hf_fp32_tokens)):
        assert ours == ref, f"prompt {i}: first difference at token " + str(
            next(j for j, (a, b) in enumerate(zip(ours, ref)) if a != b)
        )


def bf16_agreement(model_dir: Path, eager: bool, preempt: bool) -> dict[str, float]:
    """The engine's bf16 greedy run teacher-forced through transformers (bf16 and float32)."""
    run = run_engine(model_dir, "bfloat16", eager, preempt)
    assert (run["preemptions"] > 0) == preempt
    refs = {}
    for dtype in (torch.bfloat16, torch.float32):
        model = hf_model(model_dir, dtype)
        with torch.no_grad():
            for prompt, tokens, seq_id in zip(prompts(), run["tokens"], run["seq_ids"]):
                full = torch.tensor([prompt + tokens], device="cuda")
                refs[dtype, seq_id] = model(full).logits[0].float().cpu()
        del model
        torch.cuda.empty_cache()
    errors, agree, agree_fp32, hf_agree_fp32, total = [], 0, 0, 0, 0
    for prompt, tokens, seq_id in zip(prompts(), run["tokens"], run["seq_ids"]):
        for j in range(len(tokens)):
            position = len(prompt) + j  # tokens before the one predicted
            ours = run["logits"][(seq_id, position)]
            theirs = refs[torch.bfloat16, seq_id][position - 1]
            exact = refs[torch.float32, seq_id][position - 1]
            errors.append(float((ours - theirs).norm() / theirs.norm()))
            agree += int(ours.argmax() == theirs.argmax())
            agree_fp32 += int(ours.argmax() == exact.argmax())
            hf_agree_fp32 += int(theirs.argmax() == exact.argmax())
            total += 1
    result = {
        "max_err": max(errors),
        "mean_err": sum(errors) / len(errors),
        "top1_vs_hf_bf16": agree / total,
        "top1_vs_hf_fp32": agree_fp32 / total,
        "hf_bf16_vs_hf_fp32": hf_agree_fp32 / total,
        "positions": total,
    }
    # The float32 columns say how much of any disagreement is bf16 itself: transformers' own
    # bf16 run against its float32 run on the same tokens.
    print(f"bf16 {model_dir.name} eager={eager} preempt={preempt}: " + ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))
    return result


@pytest.mark.parametrize(
    "eager,preempt", [(False, False), (True, True)], ids=["graphs-roomy", "eager-preempting"]
)
def test_bfloat16_teacher_forced_logits(model_dir: Path, eager: bool, preempt: bool) -> None:
    """All-random weights: every layer moves the logits, so the error bounds check them all."""
    result = bf16_agreement(model_dir, eager, preempt)
    # Top-1 against float32 as good as transformers' own bf16 (within BF16_TOP1_SLACK): on this
    # checkpoint near-tied top logits make even transformers' bf16 and float32 runs disagree on
    # ~10% of positions (89.7% agreement, H200, 2026-11-29).
    assert result["top1_vs_hf_fp32"] >= result["hf_bf16_vs_hf_fp32"] - BF16_TOP1_SLACK
    assert result["mean_err"] < BF16_LOGIT_REL_ERR_MEAN
    assert result["max_err"] < BF16_LOGIT_REL_ERR_MAX


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("preempt", [False, True], ids=["roomy", "preempting"])
def test_bfloat16_top1_agreement_on_a_confident_checkpoint(
    confident_dir: Path, eager: bool, preempt: bool
) -> None:
    """Trained-like logit margins: top-1 agreement with transformers' bf16 and float32 >= 99%."""
    result = bf16_agreement(confident_dir, eager, preempt)
    assert result["top1_vs_hf_bf16"] >= BF16_TOP1_MIN
    assert result["top1_vs_hf_fp32"] >= BF16_TOP1_MIN
    assert result["mean_err"] < BF16_LOGIT_REL_ERR_MEAN
    assert result["max_err"] < BF16_LOGIT_REL_ERR_MAX


def test_calibration_times_graph_steps_eagerly_too(model_dir: Path) -> None:
    """The runner honours ``ScheduledBatch.eager``: each calibration step a graph runs is timed a
    second time without one (``graph_used`` false), so the header prices both ways."""
    from engine import LLM

    llm = LLM(str(model_dir), record_events=False, calibration_repeats=1, **BASE_CONFIG)
    rows = llm.core.header["calibration"]
    llm.close()

    def shape(row: dict[str, Any]) -> tuple[str, int, int]:
        return row["kind"], row["prefill_tokens"], row["decode_seqs"]

    graph = [shape(r) for r in rows if r["graph_used"]]
    eager = [shape(r) for r in rows if not r["graph_used"]]
    assert set(eager) <= set(graph)
    assert {("prefill", t, 0) for t in (1, 16, 128, 512, 2048)} <= set(eager)
    assert {("decode", 0, n) for n in (1, 16)} <= set(eager)
    assert all(r["duration_s"] > 0 for r in rows)
