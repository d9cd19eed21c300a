"""The user-facing engine: a checkpoint, a tokenizer, a model runner and an optional trace."""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from array import array
from typing import Any

from tqdm.auto import tqdm

from engine.config import AUTO_CALIBRATION, GPU_CALIBRATION_REPEATS, Config
from engine.detokenizer import IncrementalDetokenizer
from engine.engine_core import EngineCore, StepResult
from engine.errors import ConfigError, EngineClosedError, InvalidRequestError
from engine.gc_heap import freeze_startup_heap, release_heap
from engine.prompt_ids import prompt_token_ids
from engine.sampling_params import SamplingParams, check_recordable, is_valid_text
from engine.sequence import Sequence
from engine.startup_progress import StartupProgress

log = logging.getLogger(__name__)

Prompt = str | list[int]  # or any sequence of int token ids, a numpy array's included


def _make_sink(trace_dir: str | None, config: Config, force: bool, command: str) -> Any:
    if trace_dir is None:
        from tracing.sink import MemorySink

        return MemorySink()
    from tracing.recorder import ParquetRecorder

    return ParquetRecorder(
        trace_dir,
        flush_steps=config.trace_flush_steps,
        flush_seconds=config.trace_flush_seconds,
        writer=config.trace_segment_writer,
        overwrite=force,
        command=command,
    )


def _calibration_repeats(config: Config, device: str) -> int:
    """``config.calibration_repeats`` with ``AUTO_CALIBRATION`` resolved for ``device``."""
    if config.calibration_repeats != AUTO_CALIBRATION:
        return config.calibration_repeats
    return GPU_CALIBRATION_REPEATS if str(device).startswith("cuda") else 0


def _run_header(config: Config, executor: Any) -> dict[str, Any]:
    from tracing.header import provenance

    described = executor.describe()
    return {
        "model": described.get("model", {}),
        "device": described.get("device", "unknown"),
        "attention_backend": described.get("attention_backend"),
        **provenance(),
        "model_path": config.model,
    }


# Engines this process has started: a first one pays one-off kernel compilation in its first
# steps (variants the start-up did not reach), later ones find them compiled. A fact about the
# process, recorded in each trace header (``engine_starts_before``).
_PROCESS_ENGINE_STARTS = itertools.count()
# Engines started and not yet closed: a process that starts several in turn (a test session)
# closes the ones left open, so the next engine sizes its KV cache from memory really free.
_OPEN_ENGINES: weakref.WeakSet[LLMEngine] = weakref.WeakSet()


def open_engines() -> list[LLMEngine]:
    """The engines of this process that were started and not closed yet."""
    return list(_OPEN_ENGINES)


class LLMEngine:
    """Loads a Qwen3 checkpoint and serves batches of prompts, recording every decision.

    ``model`` is a checkpoint directory (None: the embedded tiny model, made on first use);
    ``trace_dir`` records a Parquet trace there; ``wrap_sink(sink)`` returns the sink the
    engine uses instead (it sees every step's events; ``sink`` is None when not recording);
    other keywords are ``Config`` fields.
    """

    _generate_cut = False  # a generate() call left by an exception

    def __init__(
        self,
        model: str | None = None,
        trace_dir: str | None = None,
        record_events: bool = True,
        force: bool = False,
        trace_writer: str = "api",
        wrap_sink: Any = None,
        **config_kwargs: Any,
    ) -> None:
        """``force``: replace a complete trace already in ``trace_dir`` (``--force`` on the
        command line); an old trace is removed only once the model is loaded, and only one a
        replayllm recorder wrote (``tracing.outdir``). ``trace_writer`` names the command in
        the trace directory's owner record."""
        from engine.model.checkpoint import default_model_dir
        from engine.model.tokenizer import load_tokenizer
        from engine.runner.model_runner import ModelRunner

        if "model" in config_kwargs:
            raise ConfigError("model is LLM's first argument (--model on the command line), "
                              "not a config keyword")
        if trace_dir is not None:
            from tracing.recorder import check_trace_dir

            check_trace_dir(trace_dir, force)  # fail before the slow start-up, remove nothing
        startup = StartupProgress()
        try:
            if model is None:
                startup.phase("preparing the embedded tiny model")
            model_dir = str(model) if model is not None else str(default_model_dir())
            config = Config(model=model_dir, **config_kwargs)
            startup.phase(f"loading tokenizer from {model_dir}")
            self.tokenizer = load_tokenizer(model_dir)
            startup.phase(f"loading model {model_dir}")
            self.runner = ModelRunner(config)
            header_device = self.runner.describe().get("device", "unknown")
            config = config.replace(
                num_kvcache_blocks=self.runner.num_kvcache_blocks, eos=self.runner.eos_token_id,
                calibration_repeats=_calibration_repeats(config, header_device),
            )
            self.config = config
            self.trace_dir = trace_dir
            header = _run_header(config, self.runner)
            header["engine_starts_before"] = next(_PROCESS_ENGINE_STARTS)
            if config.calibration_repeats:
                from engine.calibration import calibrate

                header["calibration"] = calibrate(self.runner, config, config.calibration_repeats,
                                                  progress=startup.counter)
            startup.phase("opening the trace")
            self.sink = (_make_sink(trace_dir, config, force, trace_writer)
                         if record_events else None)
            if wrap_sink is not None:  # e.g. a KV-event tap in front of the recorder (or none)
                self.sink = wrap_sink(self.sink)
                record_events = True
            self.core = EngineCore(
                config,
                self.runner,
                sink=self.sink,
                header=header,
                record_events=record_events,
            )
        except BaseException:
            # A start-up that fails after the model loaded (a user policy's constructor, the
            # trace directory) gives its device memory back before the error goes on.
            runner = getattr(self, "runner", None)
            if runner is not None:
                runner.close()
            raise
        finally:
            startup.close()
        _OPEN_ENGINES.add(self)
        self.vocab_size = self.runner.vocab_size
        if config.freeze_gc_heap:
            freeze_startup_heap()

    # --- requests ---------------------------------------------------------------------------------
    def _token_ids(self, prompt: Prompt) -> tuple[array | list[int], str | None,
                                                  tuple[int, int] | None]:
        """Tokenize; return (token ids, rejection reason, the smallest and largest id where
        computed) without raising on a bad prompt."""
        if isinstance(prompt, str):
            try:
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
            except (TypeError, UnicodeError):
                if is_valid_text(prompt):
                    raise
                raise InvalidRequestError(  # the tokenizer's own error was a TypeError
                    "a prompt is not valid Unicode text (it holds a lone surrogate)") from None
            token_ids, bounds = prompt_token_ids(ids)  # bounded once, here
            return token_ids, None, bounds
        token_ids, bounds = prompt_token_ids(prompt)
        if bounds is None:
            return token_ids, None, None
        if bounds[0] < 0 or bounds[1] >= self.vocab_size:
            bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
            return (token_ids, f"token id {bad} is outside the vocabulary [0, {self.vocab_size})",
                    bounds)
        return token_ids, None, bounds

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams,
        arrival_s: float | None = None,
        priority: int = 0,
    ) -> Sequence:
        """Queue one request; a bad one is recorded as rejected (see ``rejection``).

        ``priority``: lower is served first under ``policy="priority"`` (or a policy reading it).
        ``arrival_s``: when it arrived, in seconds on the engine's clock (since it started:
        ``self.core.now()``; None: now), never ``time.time()``; NaN, an infinity or a negative
        time raises ``InvalidRequestError`` and records nothing.
        """
        self._check_open()
        token_ids, error, bounds = self._token_ids(prompt)
        return self._add(token_ids, error, bounds, params, arrival_s, priority)

    def _add(self, token_ids: array | list[int], error: str | None, bounds: tuple[int, int] | None,
             params: SamplingParams, arrival_s: float | None, priority: int) -> Sequence:
        seq = self.core.add_request(
            token_ids, params, arrival_s=arrival_s, error=error, priority=priority,
            token_bounds=bounds,
        )
        reason = self.core.rejections.get(seq.seq_id)
        if reason is not None:
            log.warning("request %d rejected: %s", seq.seq_id, reason)
        return seq

    def rejection(self, seq: Sequence) -> str | None:
        return self.core.rejections.get(seq.seq_id)

    def step(self) -> StepResult | None:
        self._check_open()
        return self.core.step()

    def _check_open(self) -> None:
        if self.core.closed:
            raise EngineClosedError("this engine is closed (close() was called): start a new LLM")

    def is_finished(self) -> bool:
        return not self.core.has_unfinished()

    # --- batch generation -------------------------------------------------------------------------
    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priorities: list[int] | None = None,
    ) -> list[dict[str, Any]]:
        """Generate for every prompt; returns, in input order, ``{"text", "token_ids", ...}``.

        Each output also has ``finish_reason`` and ``error`` (the rejection reason, or None).
        ``priorities``: one per prompt (lower first), for policies that read them. A single
        str is one prompt (as in vLLM). The whole batch is checked before any request is queued.
        """
        self._check_open()
        if not hasattr(prompts, "__iter__"):
            raise InvalidRequestError(f"prompts must be a list, got {type(prompts).__name__}")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = _params_list(sampling_params)
            if len(params_list) != len(prompts):
                raise InvalidRequestError(f"{len(prompts)} prompts but {len(params_list)} "
                                          "sampling params")
        if priorities is not None and len(priorities) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(priorities)} priorities")
        ranks = list(priorities) if priorities is not None else [0] * len(prompts)
        prepared = [self._token_ids(p) for p in prompts]
        for (token_ids, _, bounds), sp, rank in zip(prepared, params_list, ranks):
            check_recordable(token_ids, sp, bounds, rank)  # refuse before any request is queued
        self._generate_cut = True  # until this call returns: see close()
        seqs = [self._add(*ids, sp, None, r) for ids, sp, r in zip(prepared, params_list, ranks)]
        texts: dict[int, str] = {}
        stops = {
            seq.seq_id: IncrementalDetokenizer(self.tokenizer, seq.stop)
            for seq in seqs
            if seq.stop and not seq.is_finished
        }
        self._run(seqs, use_tqdm, texts, stops)
        self._generate_cut = False
        outputs = [self._output(seq, texts.get(seq.seq_id)) for seq in seqs]
        for seq, output in zip(seqs, outputs):
            detok = stops.get(seq.seq_id)
            if detok is not None and detok.stopped:  # token ids through the stop (vLLM's)
                kept = output["token_ids"][: len(detok.tokens)]  # not a later overlapped one
                output.update(finish_reason="stop", token_ids=kept)
        return outputs

    def check_stops(self, result: StepResult, stops: dict[int, IncrementalDetokenizer]) -> None:
        """Feed a step's tokens to the stop-string detokenizers; finish a request whose text
        reached a stop string (recorded as finished with reason ``stop``)."""
        for seq, token in zip(result.batch.sampled_seqs, result.output.token_ids):
            detok = stops.get(seq.seq_id)
            if detok is None or detok.stopped:
                continue
            detok.add((token,))
            if detok.stopped:
                detok.finish()
                self.core.finish(seq.seq_id, "stop")

    def _run(
        self,
        seqs: list[Sequence],
        use_tqdm: bool,
        texts: dict[int, str],
        stops: dict[int, IncrementalDetokenizer] | None = None,
    ) -> None:
        """Step until done, detokenizing each sequence as it finishes (into ``texts``): with
        overlapped steps that runs while the device computes the next step, not after the run.
        A sequence with stop strings is detokenized as it goes (``stops``) and ends at one."""
        bar = tqdm(total=len(seqs), desc="generate", disable=not use_tqdm, dynamic_ncols=True)
        bar.update(sum(seq.is_finished for seq in seqs))  # this call's rejected requests
        prefill_rate = decode_rate = 0.0
        watching = set(stops or ())  # requests still looking for a stop string
        while self.core.has_unfinished():
            began = time.perf_counter()
            # Stop strings are checked between steps, as in the sequential loop: while a request
            # looks for one, the step in flight comes back before the next decision, so no token
            # past its stop is sampled (the trace would count it, the answer would not).
            result = (self.core.step(decide=False) if watching else None) or self.core.step()
            if result is None:  # a step launched, none completed yet (overlapped scheduling)
                continue
            elapsed = max(time.perf_counter() - began, 1e-9)
            if result.batch.kind == "decode":
                decode_rate = len(result.batch.seqs) / elapsed
            else:
                prefill_rate = result.batch.num_batched_tokens / elapsed
            bar.set_postfix(prefill=f"{prefill_rate:.0f}tok/s", decode=f"{decode_rate:.0f}tok/s")
            finished = list(result.finished)
            if stops:
                self.check_stops(result, stops)
                finished += [s for s in result.batch.sampled_seqs
                             if s.finish_reason == "stop" and s.seq_id not in texts]
            bar.update(len(finished))
            for seq in finished:
                watching.discard(seq.seq_id)
                detok = stops.get(seq.seq_id) if stops else None
                texts[seq.seq_id] = detok.text if detok is not None and detok.stopped \
                    else self._text(seq)
        bar.close()

    def _text(self, seq: Sequence) -> str:
        completion = list(seq.completion_token_ids)
        return self.tokenizer.decode(completion) if completion else ""

    def _output(self, seq: Sequence, text: str | None = None) -> dict[str, Any]:
        completion = list(seq.completion_token_ids)  # the caller's list, not the engine's buffer
        return {
            "text": self._text(seq) if text is None else text,
            "token_ids": completion,
            "finish_reason": seq.finish_reason,
            "error": self.core.rejections.get(seq.seq_id),
        }

    # --- lifecycle --------------------------------------------------------------------------------
    def close(self, interrupted: bool = False) -> dict[str, Any]:
        """Finish the trace (``interrupted``: leave it incomplete) and release the model.

        After a ``generate`` an exception left (Ctrl-C), the trace is left incomplete whatever
        ``interrupted`` says: every step taken before it is committed, a step it cut is not."""
        _OPEN_ENGINES.discard(self)
        summary = self.core.close(interrupted or self._generate_cut)
        self.runner.close()
        if self.config.freeze_gc_heap:
            release_heap()
        return summary

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        """An exception leaving the block (Ctrl-C's ``KeyboardInterrupt``, ``SystemExit``, any
        error) means the run did not finish: the trace is left incomplete (``close``)."""
        self.close(interrupted=exc_type is not None)


class LLM(LLMEngine):
    """``LLM(model_path, trace_dir=None, **config)``: the Nano-vLLM-style entry point."""


def _params_list(sampling_params: Any) -> list[SamplingParams]:
    """``sampling_params`` as a list, each a ``SamplingParams``, or ``InvalidRequestError``."""
    odd = isinstance(sampling_params, (str, bytes, dict)) or not hasattr(sampling_params,
                                                                         "__iter__")
    items = [] if odd else list(sampling_params)
    bad = sampling_params if odd else next(
        (p for p in items if not isinstance(p, SamplingParams)), None)
    if bad is not None:
        raise InvalidRequestError("sampling_params must be a SamplingParams or a list of them, "
                                  f"got {type(bad).__name__}")
    return items
