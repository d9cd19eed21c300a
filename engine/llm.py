"""The user-facing engine: a checkpoint, a tokenizer, a model runner and an optional trace."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence as SequenceABC
from typing import Any

from tqdm.auto import tqdm

from engine.config import Config
from engine.engine_core import EngineCore, StepResult
from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

log = logging.getLogger(__name__)

Prompt = str | list[int]


def _make_sink(trace_dir: str | None, config: Config) -> Any:
    if trace_dir is None:
        from tracing.sink import MemorySink

        return MemorySink()
    from tracing.recorder import ParquetRecorder

    return ParquetRecorder(
        trace_dir,
        flush_steps=config.trace_flush_steps,
        flush_seconds=config.trace_flush_seconds,
    )


def _run_header(config: Config, executor: Any) -> dict[str, Any]:
    from tracing.header import git_commit, package_versions, start_time

    described = executor.describe()
    return {
        "model": described.get("model", {}),
        "device": described.get("device", "unknown"),
        "attention_backend": described.get("attention_backend"),
        "versions": package_versions(),
        "git_commit": git_commit(),
        "start_time": start_time(),
        "model_path": config.model,
    }


# Engines this process has started: a first one pays one-off kernel compilation in its first
# steps (variants the start-up did not reach), later ones find them compiled. A fact about the
# process, recorded in each trace header (``engine_starts_before``).
_PROCESS_ENGINE_STARTS = itertools.count()


class LLMEngine:
    """Loads a Qwen3 checkpoint and serves batches of prompts, recording every decision.

    ``model`` is a checkpoint directory (None: the embedded tiny model, made on first use);
    ``trace_dir`` records a Parquet trace there; other keywords are ``Config`` fields.
    """

    def __init__(
        self,
        model: str | None = None,
        trace_dir: str | None = None,
        record_events: bool = True,
        **config_kwargs: Any,
    ) -> None:
        from engine.model.checkpoint import default_model_dir
        from engine.model.tokenizer import load_tokenizer
        from engine.runner.model_runner import ModelRunner

        model_dir = str(model) if model is not None else str(default_model_dir())
        config = Config(model=model_dir, **config_kwargs)
        self.tokenizer = load_tokenizer(model_dir)
        self.runner = ModelRunner(config)
        config = config.replace(
            num_kvcache_blocks=self.runner.num_kvcache_blocks, eos=self.runner.eos_token_id
        )
        self.config = config
        self.trace_dir = trace_dir
        header = _run_header(config, self.runner)
        header["engine_starts_before"] = next(_PROCESS_ENGINE_STARTS)
        if config.calibration_repeats:
            from engine.calibration import calibrate

            header["calibration"] = calibrate(self.runner, config, config.calibration_repeats)
        self.sink = _make_sink(trace_dir, config) if record_events else None
        self.core = EngineCore(
            config,
            self.runner,
            sink=self.sink,
            header=header,
            record_events=record_events,
        )
        self.vocab_size = self.runner.vocab_size

    # --- requests ---------------------------------------------------------------------------------
    def _token_ids(self, prompt: Prompt) -> tuple[list[int], str | None]:
        """Tokenize; return (token ids, rejection reason) without raising on a bad prompt."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False), None
        if not isinstance(prompt, SequenceABC) or not _all_int(prompt):
            raise InvalidRequestError(
                f"a prompt must be a str or a list of int token ids, got {type(prompt).__name__}"
            )
        token_ids = list(prompt)
        # min/max run in C: a per-token Python check cost ~60 us per 560-token prompt, which
        # delayed the first step of a 256-request batch by ~17 ms (docs/gpu-notes.md, session 4).
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= self.vocab_size):
            bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
            return token_ids, f"token id {bad} is outside the vocabulary [0, {self.vocab_size})"
        return token_ids, None

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams,
        arrival_s: float | None = None,
        priority: int = 0,
    ) -> Sequence:
        """Queue one request; a bad one is recorded as rejected (see ``rejection``).

        ``priority``: lower is served first under ``policy="priority"`` (or a policy reading it).
        """
        token_ids, error = self._token_ids(prompt)
        seq = self.core.add_request(
            token_ids, params, arrival_s=arrival_s, error=error, priority=priority
        )
        reason = self.core.rejections.get(seq.seq_id)
        if reason is not None:
            log.warning("request %d rejected: %s", seq.seq_id, reason)
        return seq

    def rejection(self, seq: Sequence) -> str | None:
        return self.core.rejections.get(seq.seq_id)

    def step(self) -> StepResult | None:
        return self.core.step()

    def is_finished(self) -> bool:
        return not self.core.has_unfinished()

    # --- batch generation -------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priorities: list[int] | None = None,
    ) -> list[dict[str, Any]]:
        """Generate for every prompt; returns, in input order, ``{"text", "token_ids", ...}``.

        Each output also has ``finish_reason`` and ``error`` (the rejection reason, or None).
        ``priorities``: one per prompt (lower first), for policies that read them.
        """
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise InvalidRequestError(
                    f"{len(prompts)} prompts but {len(params_list)} sampling params"
                )
        if priorities is not None and len(priorities) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(priorities)} priorities")
        ranks = priorities if priorities is not None else [0] * len(prompts)
        seqs = [
            self.add_request(p, sp, priority=r) for p, sp, r in zip(prompts, params_list, ranks)
        ]
        texts: dict[int, str] = {}
        self._run(len(seqs), use_tqdm, texts)
        return [self._output(seq, texts.get(seq.seq_id)) for seq in seqs]

    def _run(self, total: int, use_tqdm: bool, texts: dict[int, str]) -> None:
        """Step until done, detokenizing each sequence as it finishes (into ``texts``): with
        overlapped steps that runs while the device computes the next step, not after the run."""
        bar = tqdm(total=total, desc="generate", disable=not use_tqdm, dynamic_ncols=True)
        bar.update(len(self.core.rejections))
        prefill_rate = decode_rate = 0.0
        while self.core.has_unfinished():
            began = time.perf_counter()
            result = self.core.step()
            if result is None:  # a step launched, none completed yet (overlapped scheduling)
                continue
            elapsed = max(time.perf_counter() - began, 1e-9)
            if result.batch.kind == "decode":
                decode_rate = len(result.batch.seqs) / elapsed
            else:
                prefill_rate = result.batch.num_batched_tokens / elapsed
            bar.set_postfix(prefill=f"{prefill_rate:.0f}tok/s", decode=f"{decode_rate:.0f}tok/s")
            bar.update(len(result.finished))
            for seq in result.finished:
                texts[seq.seq_id] = self._text(seq)
        bar.close()

    def _text(self, seq: Sequence) -> str:
        completion = seq.completion_token_ids
        return self.tokenizer.decode(completion) if completion else ""

    def _output(self, seq: Sequence, text: str | None = None) -> dict[str, Any]:
        completion = seq.completion_token_ids
        return {
            "text": self._text(seq) if text is None else text,
            "token_ids": completion,
            "finish_reason": seq.finish_reason,
            "error": self.core.rejections.get(seq.seq_id),
        }

    # --- lifecycle --------------------------------------------------------------------------------
    def close(self) -> dict[str, Any]:
        """Finish the trace (summary, last segment) and release the model."""
        summary = self.core.close()
        self.runner.close()
        return summary

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LLM(LLMEngine):
    """``LLM(model_path, trace_dir=None, **config)``: the Nano-vLLM-style entry point."""


def _all_int(values: SequenceABC) -> bool:
    """Every value an int and none a bool (the common all-``int`` case checked in C)."""
    if set(map(type, values)) <= {int}:
        return True
    return all(isinstance(t, int) and not isinstance(t, bool) for t in values)
