"""Model-level property on the CPU tiny model: batching does not change greedy outputs.

For generated batches of token-id prompts (with shared prefixes, so the prefix cache serves some of
their blocks), greedy decoding in float32 gives each prompt exactly the tokens it gets when it runs
alone, from scratch, in an engine without prefix caching. The batched engines are configured so
that batching, prefix-cache hits, chunked prefill (mixed batches) and preemption-with-recompute
all happen: a scheduler decision that fed the model the wrong KV blocks, positions or context
would change some prompt's output.

Slow-ish (it runs a real model), so it draws fewer examples than the scheduler properties; it is
skipped, saying why, where the model runner or the tiny checkpoint cannot be had.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from replay.testing.strategies import prompts_sharing_prefixes, scaled

engine = pytest.importorskip("engine", reason="the engine package does not import")
LLM = getattr(engine, "LLM", None)
SamplingParams = engine.SamplingParams
if LLM is None:
    pytest.skip("engine.LLM is not there yet", allow_module_level=True)
pytest.importorskip("engine.runner.model_runner", reason="engine/runner/model_runner.py missing")
checkpoint = pytest.importorskip(
    "engine.model.checkpoint", reason="engine/model/checkpoint.py missing"
)

# Token ids from a narrow band of the vocabulary: shared prefixes are frequent, outputs are not.
VOCAB_BAND = (1000, 1007)
BLOCK = 4
MAX_MODEL_LEN = 64

# name -> Config keywords of the engines a batch runs on.
BATCHED = {
    # Nano-vLLM's policy; a pool of 10 blocks of 4 slots (one request needs up to 9) cannot hold
    # a batch of long requests at once, so decoding preempts (and recomputes) the newest ones.
    "prefill_first": dict(policy="prefill_first", num_kvcache_blocks=10, max_num_seqs=8),
    # Chunked prefill with a budget of 12 tokens: prompts are split over steps and mixed with
    # decodes; 12 blocks: preemption here too.
    "chunked": dict(
        policy="chunked", num_kvcache_blocks=12, max_num_seqs=8, max_num_batched_tokens=12
    ),
}
REFERENCE = dict(enable_prefix_caching=False, num_kvcache_blocks=32, max_num_seqs=1)

_engines: dict[str, object] = {}


def get_engine(name: str) -> object:
    """One engine per configuration for the whole module (loading the model is the slow part)."""
    if name not in _engines:
        try:
            model_dir = checkpoint.default_model_dir()
        except Exception as exc:  # no tokenizer package, no disk: say why and skip
            pytest.skip(f"the tiny model cannot be made here: {exc}")
        keywords = REFERENCE if name == "reference" else BATCHED[name]
        settings_ = dict(
            dtype="float32",
            device="cpu",
            kvcache_block_size=BLOCK,
            max_model_len=MAX_MODEL_LEN,
            max_num_batched_tokens=MAX_MODEL_LEN,
        )
        settings_.update(keywords)
        _engines[name] = LLM(str(model_dir), **settings_)
    return _engines[name]


@pytest.fixture(scope="module", autouse=True)
def _close_engines():
    yield
    for llm in _engines.values():
        llm.close()
    _engines.clear()


@contextmanager
def bounded_steps(llm: object, prompts: list[list[int]], max_tokens: int) -> Iterator[None]:
    """Fail (instead of hanging) if ``generate`` takes more engine steps than the work allows:
    every step computes at least one token of some prompt or completion."""
    core = llm.core
    limit = sum(len(p) + max_tokens for p in prompts) + 2
    counter = itertools.count(1)
    step = type(core).step

    def guarded():  # shadows EngineCore.step on this instance only
        if next(counter) > limit:
            raise AssertionError(
                f"properties violated: bounded\n  generate took more than {limit} steps"
            )
        return step(core)

    core.step = guarded
    try:
        yield
    finally:
        del core.step


_solo_cache: dict[tuple[tuple[int, ...], int], list[int]] = {}


def run_alone(prompt: list[int], max_tokens: int) -> list[int]:
    key = (tuple(prompt), max_tokens)
    if key not in _solo_cache:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        reference = get_engine("reference")
        with bounded_steps(reference, [prompt], max_tokens):
            (out,) = reference.generate([prompt], params, use_tqdm=False)
        _solo_cache[key] = list(out["token_ids"])
    return _solo_cache[key]


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[list[int]], int]:
    count = draw(st.integers(2, 6))
    band = st.integers(*VOCAB_BAND)
    prompts = draw(prompts_sharing_prefixes(count, st.integers(1, 24), tokens=band))
    return prompts, draw(st.integers(1, 12))


@settings(
    max_examples=scaled(0.1, minimum=8),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batch=batches(), engine_name=st.sampled_from(sorted(BATCHED)))
def test_batched_greedy_output_equals_output_alone(
    batch: tuple[list[list[int]], int], engine_name: str
) -> None:
    """Each prompt of a batch gets, token for token, its greedy output when run alone (float32,
    ignore_eos, same max_tokens), under prefill-first with preemption and under chunked prefill,
    with prefix-cache hits between the prompts of the batch and of earlier batches; and generate
    finishes within a bound on steps."""
    prompts, max_tokens = batch
    llm = get_engine(engine_name)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    preemptions = llm.core.scheduler.num_preemptions
    with bounded_steps(llm, prompts, max_tokens):
        outputs = llm.generate(prompts, params, use_tqdm=False)
    if llm.core.scheduler.num_preemptions > preemptions:
        event(f"{engine_name}: preempted")
    assert len(outputs) == len(prompts)
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        alone = run_alone(prompt, max_tokens)
        assert len(alone) == max_tokens
        assert list(out["token_ids"]) == alone, (
            f"{engine_name}: prompt {i} of {len(prompts)} ({len(prompt)} tokens) gave "
            f"{list(out['token_ids'])} in the batch, {alone} alone"
        )
