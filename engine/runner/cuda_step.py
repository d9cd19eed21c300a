"""Steps on CUDA: staged decodes, graph replays, GPU sampling and steps in flight.

A :class:`CudaStepper` owns the CUDA state of one model runner: the decode input buffers, the
decode and prefill CUDA graphs, the step timer and the pinned token buffers. It is built once the
KV cache is bound (``engine/runner/cuda_setup.py``). Tokens are sampled on the GPU in one pass
(``engine.model.kernels.sampler``), seeded by the configured seed and the step number, and each
step's GPU time comes from two CUDA events. A decode step on one GPU, and a mixed step through
its graph, return a ``LaunchedStep`` (``engine/runner/launched_step.py``) without waiting.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from engine.batch import ScheduledBatch, StepOutput
from engine.executor import PendingStep
from engine.model.layers.sampler import RowOptions, row_options, sample_option_rows
from engine.runner.decode_graphs import NO_SOURCE, DecodeBuffers, DecodeGraphs
from engine.runner.launched_step import LaunchedStep, StepTimer, TokenBuffers
from engine.runner.mixed_graphs import MixedGraphs, MixedKey
from engine.runner.prefill_graphs import PrefillGraphs
from engine.runner.step_inputs import StepPayload, eager_inputs, token_values
from engine.sequence import PENDING_TOKEN

SEED_STRIDE = 1_000_003  # mixes the configured seed and the step number into a sampling seed
SEED_MODULUS = 2**31 - 1


def sampling_seed(seed: int, step: int) -> int:
    """The GPU sampler's seed for step number ``step`` of a run seeded with ``seed``."""
    return (seed * SEED_STRIDE + step) % SEED_MODULUS


def sample_on_gpu(logits: torch.Tensor, temperatures: torch.Tensor, seed: int) -> torch.Tensor:
    """One token per row of ``logits`` (the engine's GPU sampler, imported when first used)."""
    from engine.model.kernels.sampler import sample_tokens

    return sample_tokens(logits, temperatures, seed)


class CudaStepper:
    """Runs steps of one model on its CUDA device (every rank under tensor parallelism).

    ``model``: the forward (``model(ids, positions, metadata)``) and ``compute_logits``;
    ``buffers``: the decode inputs; ``graphs`` / ``prefill_graphs``: captured over them, or
    None (eager); ``num_kvcache_blocks``: the pool the block tables index; ``seed``: the run's
    sampling seed; ``rank``: only rank 0 samples; ``fused_kernels``: whether the model's
    layers run the fused Triton kernels (the trace header records it); ``mixed_graphs``: graphs
    for steps of prompt chunks and decodes together (``engine/runner/mixed_graphs.py``).
    """

    def __init__(
        self,
        model: Any,
        buffers: DecodeBuffers,
        graphs: DecodeGraphs | None,
        prefill_graphs: PrefillGraphs | None,
        block_size: int,
        num_kvcache_blocks: int,
        seed: int,
        rank: int = 0,
        fused_kernels: bool = False,
        mixed_graphs: MixedGraphs | None = None,
    ) -> None:
        self.model = model
        self.buffers = buffers
        self.graphs = graphs
        self.prefill_graphs = prefill_graphs
        self.mixed_graphs = mixed_graphs
        self.block_size = block_size
        self.num_kvcache_blocks = num_kvcache_blocks
        self.seed = seed
        self.rank = rank
        self.device = buffers.dev_i64.device
        self._option_generator: torch.Generator | None = None  # rows without a seed of their own
        self.timer = StepTimer()
        self.tokens = TokenBuffers(buffers.max_batch)
        self.num_steps = 0  # steps run, every kind: the sampling seed moves with it
        self.fused_kernels = fused_kernels

    # --- a decode on one GPU, staged straight from the sequences ----------------------------------
    def launch_decode(self, batch: ScheduledBatch, previous: PendingStep | None) -> LaunchedStep:
        """A decode-only step, launched without waiting for its tokens; pending input tokens
        come from ``previous``: on the device while it is in flight, else from its host values."""
        seqs = batch.seqs
        num_seqs = len(seqs)
        size = self._graph_size(num_seqs, batch.eager)
        on_device = previous if isinstance(previous, LaunchedStep) else None
        sources = self._sources(seqs, on_device) if on_device is not None else None
        values = token_values(previous) if previous is not None and on_device is None else None
        self.buffers.stage_sequences(
            seqs, batch.context_lens, size or num_seqs, self.num_kvcache_blocks, sources, values
        )
        if on_device is not None:
            self.buffers.take_sources(num_seqs, on_device.tokens)
        host_tokens, timer = self.tokens.next(num_seqs)
        timer.begin()
        hidden, padded, graph_used = self._forward_staged(num_seqs, size, batch.context_lens)
        logits = self.model.compute_logits(hidden)
        self.num_steps += 1
        tokens = self.sample(logits, self.buffers.temperatures[:num_seqs],
                             row_options(batch.sampled_seqs))
        timer.finish()
        return LaunchedStep(
            [seq.seq_id for seq in seqs], tokens, host_tokens, timer, padded, graph_used
        )

    # --- a mixed step through its graph, on one GPU --------------------------------------------
    def mixed_key(self, batch: ScheduledBatch) -> MixedKey | None:
        """The mixed graph ``batch`` replays; None: not a mixed step, or it runs eager."""
        return self._mixed_key(batch.eager, batch.num_new_tokens, batch.num_prefill_seqs,
                               len(batch.seqs))

    def launch_mixed(self, batch: ScheduledBatch, payload: StepPayload, key: MixedKey,
                     previous: LaunchedStep | None) -> LaunchedStep:
        """A mixed step (``key``: its graph) launched without waiting for its tokens. Decode
        rows whose input token is pending take it from ``previous`` on the device; the payload
        holds every other input (``PENDING_TOKEN`` where the device fills one in)."""
        assert self.mixed_graphs is not None
        self.buffers.invalidate()  # block tables may have been rebuilt (preemption)
        num_prefill = batch.num_prefill_seqs
        sources = self._sources(batch.seqs[num_prefill:], previous) if previous else None
        rows = len(payload.sample_rows)
        graphs = self.mixed_graphs
        graphs.stage(payload.input_ids, payload.query_lens, payload.context_lens,
                     payload.block_tables, num_prefill, key, payload.sample_rows,
                     payload.temperatures, sources, previous.tokens if previous else None)
        host_tokens, timer = self.tokens.next(rows)
        timer.begin()
        selected, temps = graphs.sampled(graphs.replay(key), rows)
        logits = self.model.compute_logits(selected)
        self.num_steps += 1
        tokens = self.sample(logits, temps, payload.row_options)
        timer.finish()
        return LaunchedStep([seq.seq_id for seq in batch.sampled_seqs], tokens, host_tokens,
                            timer, len(batch.seqs), True, graphs.rows(key))

    @staticmethod
    def _sources(seqs: list, previous: LaunchedStep) -> list[int]:
        """Per sequence, the row of ``previous``'s output holding its pending input token."""
        out = []
        for seq in seqs:
            if seq.last_token == PENDING_TOKEN:
                row = previous.row_of.get(seq.seq_id)
                if row is None:
                    raise ValueError(
                        f"seq {seq.seq_id}: pending token not sampled by the last step"
                    )
                out.append(row)
            else:
                out.append(NO_SOURCE)
        return out

    # --- a step from its payload (every rank) -----------------------------------------------------
    def run(self, payload: StepPayload) -> StepOutput:
        """Forward (every rank) and sampling (rank 0) of one step; waits for its tokens."""
        num_seqs = len(payload.seq_ids)
        if not payload.decode:
            self.buffers.invalidate()  # block tables may have been rebuilt (preemption)
        padded_tokens = self._prefill_graph_size(payload)
        mixed = None if padded_tokens else self._mixed_graph_key(payload)
        if not padded_tokens and mixed is None:
            self.timer.begin()
        if mixed is not None:
            hidden = self._replay_mixed(payload, mixed)
            padded, graph_used, padded_tokens = num_seqs, True, self.mixed_graphs_rows(mixed)
        elif padded_tokens:
            hidden = self._replay_prefill(payload, padded_tokens)
            padded, graph_used = num_seqs, True
        elif payload.decode:
            size = self._graph_size(num_seqs, payload.eager)
            self.buffers.stage(
                payload.seq_ids,
                payload.input_ids,
                payload.context_lens,
                payload.block_tables,
                payload.temperatures,
                size or num_seqs,
            )
            hidden, padded, graph_used = self._forward_staged(num_seqs, size, payload.context_lens)
        else:
            ids, positions, metadata = eager_inputs(payload, self.block_size, self.device,
                                                   align_decodes=True,
                                                   longest_first=self.buffers.longest_first)
            hidden, padded, graph_used = self.model(ids, positions, metadata), num_seqs, False
        if not payload.sample_rows:
            self.num_steps += 1
            return StepOutput(token_ids=[], padded_batch_size=padded, graph_used=graph_used,
                              padded_tokens=padded_tokens)
        if padded_tokens:
            graphs = self.mixed_graphs if mixed is not None else self.prefill_graphs
            assert graphs is not None
            selected, temps = graphs.sampled(hidden, len(payload.sample_rows))
            output = self._sample_and_finish(selected, temps, padded, graph_used,
                                             payload.row_options)
            output.padded_tokens = padded_tokens
            return output
        if payload.decode and len(payload.sample_rows) == num_seqs:
            selected = hidden
        else:
            selected = hidden.index_select(0, self.upload(payload.sample_rows, torch.int64))
        temps = self._temperatures(payload)
        return self._sample_and_finish(selected, temps, padded, graph_used, payload.row_options)

    def _prefill_graph_size(self, payload: StepPayload) -> int:
        """The captured token count this step's prefill pads to; 0: not a graph prefill."""
        graphs = self.prefill_graphs
        if graphs is None or payload.eager or payload.decode:
            return 0
        if payload.num_prefill_seqs != len(payload.seq_ids):  # a mixed step runs eager
            return 0
        return graphs.padded_size(len(payload.input_ids), len(payload.seq_ids))

    def _mixed_graph_key(self, payload: StepPayload) -> MixedKey | None:
        """The (prefill tokens, decode rows) graph this mixed step replays; None: eager."""
        if payload.decode:
            return None
        return self._mixed_key(payload.eager, payload.query_lens, payload.num_prefill_seqs,
                               len(payload.seq_ids))

    def _mixed_key(self, eager: bool, query_lens: list[int], num_prefill: int, num_seqs: int
                   ) -> MixedKey | None:
        graphs = self.mixed_graphs
        num_decodes = num_seqs - num_prefill
        if graphs is None or eager or not num_prefill or not num_decodes:
            return None
        return graphs.key(sum(query_lens[:num_prefill]), num_prefill, num_decodes)

    def mixed_graphs_rows(self, key: MixedKey) -> int:
        assert self.mixed_graphs is not None
        return self.mixed_graphs.rows(key)

    def _replay_mixed(self, payload: StepPayload, key: MixedKey) -> torch.Tensor:
        """Stage a mixed step into its graph's buffers and replay; hidden states of every row."""
        assert self.mixed_graphs is not None
        self.mixed_graphs.stage(payload.input_ids, payload.query_lens, payload.context_lens,
                                payload.block_tables, payload.num_prefill_seqs, key,
                                payload.sample_rows, payload.temperatures)
        self.timer.begin()
        return self.mixed_graphs.replay(key)

    def _replay_prefill(self, payload: StepPayload, padded_tokens: int) -> torch.Tensor:
        """Stage a prefill into the graph buffers and replay; hidden states of every row."""
        assert self.prefill_graphs is not None
        self.prefill_graphs.stage(payload.input_ids, payload.query_lens, payload.context_lens,
                                  payload.block_tables, padded_tokens, payload.sample_rows,
                                  payload.temperatures)
        self.timer.begin()
        return self.prefill_graphs.replay(padded_tokens)

    def _graph_size(self, num_seqs: int, eager: bool = False) -> int | None:
        if eager or self.graphs is None:
            return None
        return self.graphs.padded_size(num_seqs)

    def _forward_staged(
        self, num_seqs: int, size: int | None, context_lens: list[int]
    ) -> tuple[torch.Tensor, int, bool]:
        """Hidden states of a staged decode step: a graph replay, or eager when none fits."""
        if size is not None and self.graphs is not None:
            return self.graphs.replay(size)[:num_seqs], size, True
        metadata = self.buffers.metadata(num_seqs, max(context_lens), tuple(context_lens))
        ids = self.buffers.input_ids[:num_seqs]
        return self.model(ids, self.buffers.positions[:num_seqs], metadata), num_seqs, False

    def _sample_and_finish(
        self,
        hidden: torch.Tensor,
        temperatures: torch.Tensor,
        padded: int,
        graph_used: bool,
        options: list[RowOptions | None] | None = None,
    ) -> StepOutput:
        """Logits, GPU sampling, the one host sync, the step's GPU time."""
        logits = self.model.compute_logits(hidden)
        self.num_steps += 1
        if self.rank != 0:
            return StepOutput(token_ids=[], padded_batch_size=padded, graph_used=graph_used)
        tokens = self.sample(logits, temperatures, options)
        self.timer.finish()
        began = time.perf_counter()
        token_ids = tokens.tolist()  # the step's one synchronisation
        waited = time.perf_counter() - began
        return StepOutput(token_ids, self.timer.seconds(), padded, graph_used, waited)

    def _temperatures(self, payload: StepPayload) -> torch.Tensor:
        if payload.decode and len(payload.sample_rows) == len(payload.seq_ids):
            return self.buffers.temperatures[: len(payload.seq_ids)]  # staged with the inputs
        return self.upload(payload.temperatures, torch.float32)

    def upload(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """A small host list on the device, through pinned memory without blocking: a copy from
        pageable memory waits for the stream, so after a forward the host would sit idle until
        the device finished it, then leave the device idle while it launched on."""
        return torch.tensor(values, dtype=dtype).pin_memory().to(self.device, non_blocking=True)

    def sample(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        options: list[RowOptions | None] | None = None,
    ) -> torch.Tensor:
        """GPU sampling (one pass over the logits); the seed moves with every step. Rows with
        per-request options (top-p, top-k, own seed) are then redrawn on the PyTorch path."""
        tokens = sample_on_gpu(logits, temperatures, sampling_seed(self.seed, self.num_steps))
        if options is not None:
            if self._option_generator is None:
                self._option_generator = torch.Generator(device=self.device)
                self._option_generator.manual_seed(self.seed)
            sample_option_rows(logits, temperatures, options, tokens, self._option_generator)
        return tokens

    # --- description and shutdown -----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The CUDA part of the trace header's executor description."""
        from engine.model.kernels.sampler import SAMPLER_VARIANT

        graphs = self.graphs
        prefill = self.prefill_graphs.describe() if self.prefill_graphs is not None else {}
        if self.mixed_graphs is not None:
            prefill.update(self.mixed_graphs.describe())
        return {
            "cuda_graphs": graphs is not None,
            "graph_batch_sizes": graphs.sizes if graphs is not None else [],
            **prefill,
            "block_table_width": self.buffers.table_width,
            "fused_kernels": self.fused_kernels,
            "blas_library": str(torch.backends.cuda.preferred_blas_library()).removeprefix(
                "_BlasBackend."
            ),
            "sampler": SAMPLER_VARIANT,
        }

    def release(self) -> None:
        """Drop the captured graphs (and their memory pool)."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()
            self.prefill_graphs = None
        if self.mixed_graphs is not None:
            self.mixed_graphs.release()
            self.mixed_graphs = None
