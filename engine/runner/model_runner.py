"""The real executor: runs a Hugging Face Qwen3 checkpoint over a paged KV cache.

``ModelRunner.execute(batch)`` computes, for every scheduled sequence, the tokens the scheduler
asked for, reading earlier KV through the sequence's block table, and samples one token for each
sequence that samples. The KV cache is one tensor ``[2, layers, blocks, block_size, kv_heads,
head_dim]``; each attention layer gets views of its K and V planes.

On CUDA (``engine/runner/cuda_setup.py``): the pool is sized after a warm-up at maximum load, every
Triton kernel is compiled before the first step, decode-only steps run through persistent input
buffers and CUDA graphs (``engine/runner/decode_graphs.py``), tokens are sampled on the GPU in one pass,
and each step's GPU time comes from CUDA events. With ``tensor_parallel_size > 1`` this runner
is rank 0: it starts the other ranks (``engine/runner/tp.py``) and broadcasts each step's inputs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from engine.batch import ScheduledBatch, StepOutput
from engine.config import AUTO_SIZED_BLOCKS, Config
from engine.errors import ConfigError
from engine.executor import DoneStep, PendingStep
from engine.model.attention_metadata import AttentionMetadata, build_attention_metadata
from engine.model.layers.attention import get_attention_backend
from engine.model.layers.parallel import SINGLE_PROCESS
from engine.model.layers.sampler import RowOptions, Sampler, row_options, sample_option_rows
from engine.model.loader import build_model
from engine.runner import cuda_setup as cuda_runner
from engine.runner import tp
from engine.runner.decode_graphs import NO_SOURCE, DecodeBuffers, DecodeGraphs
from engine.runner.prefill_graphs import PrefillGraphs
from engine.runner.runner_info import describe_runner
from engine.runner.step_inputs import check_batch
from engine.sequence import PENDING_TOKEN

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_PLANES = 2  # K and V
SEED_STRIDE = 1_000_003  # mixes the configured seed and the step number into a sampling seed
SEED_MODULUS = 2**31 - 1


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was requested but no CUDA device is available")
    return torch.device(name)


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def _token_values(previous: PendingStep) -> dict[int, int]:
    """seq_id -> token sampled by ``previous`` (waits for it)."""
    output = previous.result()
    seq_ids = getattr(previous, "seq_ids", None)
    if seq_ids is None:
        raise ValueError("the previous step does not say which sequences it sampled")
    return dict(zip(seq_ids, output.token_ids))


def _sources(seqs: list, previous: cuda_runner.LaunchedStep) -> list[int]:
    """Per sequence, the row of ``previous``'s output holding its pending input token."""
    out = []
    for seq in seqs:
        if seq.last_token == PENDING_TOKEN:
            row = previous.row_of.get(seq.seq_id)
            if row is None:
                raise ValueError(f"seq {seq.seq_id}: pending token not sampled by the last step")
            out.append(row)
        else:
            out.append(NO_SOURCE)
    return out


class ModelRunner:
    """Executor over a real model (see ``engine/batch.py`` for the step contract).

    ``rank``/``store_dir`` are for tensor-parallel workers, which ``engine.runner.tp`` starts.
    """

    def __init__(
        self,
        config: Config,
        model_dir: str | Path | None = None,
        rank: int = 0,
        store_dir: str | None = None,
    ) -> None:
        if model_dir is None:
            model_dir = config.model
        if model_dir is None:
            from engine.model.checkpoint import default_model_dir

            model_dir = default_model_dir()
        self.config = config
        self.model_dir = Path(model_dir)
        self.rank = rank
        self.device = _resolve_device(config.device)
        self.dtype = _resolve_dtype(config.dtype, self.device)
        self.block_size = config.kvcache_block_size
        self.attention_backend = get_attention_backend(config.attention_backend, self.device)
        self.dist: tp.Distributed | None = None
        self.buffers: DecodeBuffers | None = None
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.timer: cuda_runner.StepTimer | None = None
        self.tokens: cuda_runner.TokenBuffers | None = None
        self.kv_cache: torch.Tensor | None = None
        self.num_steps = 0
        world = config.tensor_parallel_size
        if world > 1:
            tp.check_divisible(self.model_dir, world)
            if self.device.type == "cuda":
                if torch.cuda.device_count() < world:
                    raise ConfigError(
                        f"tensor_parallel_size {world} needs {world} GPUs, "
                        f"{torch.cuda.device_count()} visible"
                    )
                self.device = torch.device("cuda", rank)
            if rank == 0:
                self.dist = tp.start(config, self.device)
            else:
                assert store_dir is not None, "a TP worker needs the rendezvous store"
                self.dist = tp.join(rank, world, store_dir, self.device)
        if self.device.type == "cuda":
            if self.device.index is None:  # "cuda": pin the current device, for set_device
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        self.group = self.dist.group if self.dist else SINGLE_PROCESS
        self.model = build_model(
            self.model_dir, self.attention_backend, self.device, self.dtype, self.group
        )
        self.spec = self.model.spec
        self.vocab_size: int = self.spec.vocab_size
        self.eos_token_id: int = (
            config.eos
            if config.eos >= 0
            else (self.spec.eos_token_id if self.spec.eos_token_id is not None else -1)
        )
        self.num_kv_heads = self.model.attention_layers[0].num_kv_heads
        self.sampler = Sampler(config.seed, self.device)
        if self.device.type == "cuda":
            blocks = cuda_runner.warm_up_and_size(self)
        else:
            blocks = self._kv_block_count()
        self.num_kvcache_blocks: int = tp.agree_min(blocks, self.dist) if self.dist else blocks
        self._allocate_kv_cache()
        if self.device.type == "cuda":
            cuda_runner.set_up_cuda(self)

    # --- set-up -----------------------------------------------------------------------------------
    @property
    def kv_block_bytes(self) -> int:
        """Bytes of K and V of one block over all layers on this rank."""
        per_token = KV_PLANES * self.spec.num_hidden_layers * self.num_kv_heads
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return per_token * self.spec.head_dim * self.block_size * itemsize

    @property
    def fused_kernels(self) -> bool:
        from engine.model.layers.cuda_kernels import fused_kernels

        probe = torch.empty(0, device=self.device)
        return fused_kernels(probe) is not None

    def _kv_block_count(self) -> int:
        if self.config.num_kvcache_blocks != AUTO_SIZED_BLOCKS:
            return self.config.num_kvcache_blocks
        budget = self.config.kv_cache_bytes
        blocks = budget // self.kv_block_bytes
        if blocks < 1:
            raise ConfigError(
                f"the KV cache budget ({budget} bytes) is smaller than one block "
                f"({self.kv_block_bytes} bytes); raise kv_cache_bytes or lower kvcache_block_size"
            )
        return blocks

    def _allocate_kv_cache(self) -> None:
        # Zeroed: the PyTorch backend masks padded keys, and masked values must be finite.
        self.kv_cache = torch.zeros(
            KV_PLANES,
            self.spec.num_hidden_layers,
            self.num_kvcache_blocks,
            self.block_size,
            self.num_kv_heads,
            self.spec.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        for i, layer in enumerate(self.model.attention_layers):
            layer.bind_kv_cache(self.kv_cache[0, i], self.kv_cache[1, i])

    # --- one step ---------------------------------------------------------------------------------
    def prepare(
        self, payload: tp.StepPayload
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat input ids, positions and attention metadata of a general (eager) step."""
        positions, metadata = build_attention_metadata(
            payload.query_lens,
            payload.context_lens,
            payload.block_tables,
            self.block_size,
            payload.num_prefill_seqs,
            self.device,
        )
        ids = torch.tensor(payload.input_ids, dtype=torch.int64).to(self.device)
        return ids, positions, metadata

    @property
    def supports_overlap(self) -> bool:
        """``launch`` may run ahead of the host (one process; TP steps stay in lock-step)."""
        return self.dist is None

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Run one step; one sampled token per sampling sequence, in batch order."""
        return self.launch(batch).result()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, previous: PendingStep | None = None) -> PendingStep:
        """Start one step and return without waiting for its tokens (on CUDA decode steps).

        Sequences whose last token is still pending take it from ``previous``: on the device for
        a staged CUDA decode, else from its host values (which waits for it).
        """
        if self.kv_cache is None:
            raise RuntimeError("ModelRunner.execute called after close()")
        if not batch.seqs:
            return DoneStep(StepOutput(token_ids=[]))
        pending = any(seq.last_token == PENDING_TOKEN for seq in batch.sampled_seqs)
        if pending and previous is None:
            raise ValueError("a sequence's last token is pending but no previous step was given")
        if batch.is_decode and self.buffers is not None and self.dist is None:
            return self._launch_decode(batch, previous if pending else None)
        values = _token_values(previous) if pending and previous is not None else None
        check_batch(batch, self.spec.max_position_embeddings, self.block_size,
                    self.num_kvcache_blocks)
        decode = batch.is_decode and self.buffers is not None
        payload = tp.payload_from_batch(batch, decode=decode, pending_values=values)
        if self.dist is not None:
            tp.broadcast_payload(payload, self.dist)
        began = time.perf_counter()
        output = self._run(payload)
        if output.duration_s is None:  # CPU: computed right here, so its wall time is the step's
            output.duration_s = time.perf_counter() - began
        return DoneStep(output, [seq.seq_id for seq in batch.sampled_seqs])

    def _launch_decode(self, batch: ScheduledBatch, previous: PendingStep | None) -> PendingStep:
        """A decode-only step on one GPU, staged straight from the sequences."""
        assert self.buffers is not None and self.tokens is not None
        seqs = batch.seqs
        num_seqs = len(seqs)
        size = self._graph_size(num_seqs, batch.eager)
        # Pending input tokens: read on the device from a step still in flight, else on the host.
        on_device = previous if isinstance(previous, cuda_runner.LaunchedStep) else None
        sources = _sources(seqs, on_device) if on_device is not None else None
        values = _token_values(previous) if previous is not None and on_device is None else None
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
        return cuda_runner.LaunchedStep(
            [seq.seq_id for seq in seqs], tokens, host_tokens, timer, padded, graph_used
        )

    def _run(self, payload: tp.StepPayload) -> StepOutput:
        """Forward (every rank) and sampling (rank 0) of one step from its payload."""
        num_seqs = len(payload.seq_ids)
        if not payload.decode and self.buffers is not None:
            self.buffers.invalidate()  # block tables may have been rebuilt (preemption)
        padded_tokens = self._prefill_graph_size(payload)
        if self.timer is not None and not padded_tokens:
            self.timer.begin()
        if padded_tokens:
            hidden = self._replay_prefill(payload, padded_tokens)
            padded, graph_used = num_seqs, True
        elif payload.decode:
            assert self.buffers is not None
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
            ids, positions, metadata = self.prepare(payload)
            hidden, padded, graph_used = self.model(ids, positions, metadata), num_seqs, False
        if not payload.sample_rows:
            self.num_steps += 1
            return StepOutput(token_ids=[], padded_batch_size=padded, graph_used=graph_used,
                              padded_tokens=padded_tokens)
        if padded_tokens:
            assert self.prefill_graphs is not None
            selected, temps = self.prefill_graphs.sampled(hidden, len(payload.sample_rows))
            output = self._sample_and_finish(selected, temps, padded, graph_used,
                                             payload.row_options)
            output.padded_tokens = padded_tokens
            return output
        if payload.decode and len(payload.sample_rows) == num_seqs:
            selected = hidden
        else:
            selected = hidden.index_select(0, self._upload(payload.sample_rows, torch.int64))
        if self.device.type == "cuda":
            temps = self._temperatures(payload)
            return self._sample_and_finish(selected, temps, padded, graph_used,
                                           payload.row_options)
        logits = self.model.compute_logits(selected)
        self.num_steps += 1
        if self.rank != 0:
            return StepOutput(token_ids=[], padded_batch_size=padded, graph_used=graph_used)
        tokens = self.sampler(logits, payload.temperatures, payload.row_options)
        return StepOutput(tokens.tolist(), padded_batch_size=padded, graph_used=graph_used)

    def _prefill_graph_size(self, payload: tp.StepPayload) -> int:
        """The captured token count this step's prefill pads to; 0: not a graph prefill."""
        graphs = self.prefill_graphs
        if graphs is None or payload.eager or payload.decode:
            return 0
        if payload.num_prefill_seqs != len(payload.seq_ids):  # a mixed step runs eager
            return 0
        return graphs.padded_size(len(payload.input_ids), len(payload.seq_ids))

    def _replay_prefill(self, payload: tp.StepPayload, padded_tokens: int) -> torch.Tensor:
        """Stage a prefill into the graph buffers and replay; hidden states of every row."""
        assert self.prefill_graphs is not None and self.timer is not None
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
        assert self.buffers is not None
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
        """CUDA: logits, GPU sampling, the one host sync, the step's GPU time."""
        logits = self.model.compute_logits(hidden)
        self.num_steps += 1
        if self.rank != 0:
            return StepOutput(token_ids=[], padded_batch_size=padded, graph_used=graph_used)
        tokens = self.sample(logits, temperatures, options)
        assert self.timer is not None
        self.timer.finish()
        began = time.perf_counter()
        token_ids = tokens.tolist()  # the step's one synchronisation
        waited = time.perf_counter() - began
        return StepOutput(token_ids, self.timer.seconds(), padded, graph_used, waited)

    def _temperatures(self, payload: tp.StepPayload) -> torch.Tensor:
        if payload.decode and len(payload.sample_rows) == len(payload.seq_ids):
            assert self.buffers is not None
            return self.buffers.temperatures[: len(payload.seq_ids)]  # staged with the inputs
        return self._upload(payload.temperatures, torch.float32)

    def _upload(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """A small host list on the device. On CUDA through pinned memory without blocking: a
        copy from pageable memory waits for the stream, so after a forward the host would sit
        idle until the device finished it, then leave the device idle while it launched on."""
        tensor = torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def sample(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        options: list[RowOptions | None] | None = None,
    ) -> torch.Tensor:
        """GPU sampling (one pass over the logits); the seed moves with every step. Rows with
        per-request options (top-p, top-k, own seed) are then redrawn on the PyTorch path."""
        from engine.model.kernels.sampler import sample_tokens

        seed = (self.config.seed * SEED_STRIDE + self.num_steps) % SEED_MODULUS
        tokens = sample_tokens(logits, temperatures, seed)
        if options is not None:
            sample_option_rows(logits, temperatures, options, tokens, self.sampler.generator)
        return tokens

    def worker_loop(self) -> None:
        """A TP worker: run every step rank 0 broadcasts until it sends ``None``."""
        assert self.dist is not None
        with torch.inference_mode():
            while (payload := tp.broadcast_payload(None, self.dist)) is not None:
                self._run(payload)

    # --- description and shutdown -----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What the trace header records: where and how the model runs, and its architecture."""
        return describe_runner(self)

    def close(self) -> None:
        """Release the KV cache, graphs and TP workers (idempotent)."""
        if self.kv_cache is None:
            return
        if self.dist is not None and self.rank == 0:
            tp.shutdown(self.dist)
        self.dist = None
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()
            self.prefill_graphs = None
        for layer in self.model.attention_layers:
            layer.bind_kv_cache(None, None)
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
