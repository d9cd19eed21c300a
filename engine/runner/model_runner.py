"""The real executor: runs a Hugging Face Qwen3 checkpoint over a paged KV cache.

``ModelRunner.execute(batch)`` computes, for every scheduled sequence, the tokens the scheduler
asked for, reading earlier KV through the sequence's block table, and samples one token for each
sequence that samples. The KV cache is one tensor ``[2, layers, blocks, block_size, kv_heads,
head_dim]``; each attention layer gets views of its K and V planes.

On CUDA the pool is sized after a warm-up at maximum load and every Triton kernel is compiled
before the first step (``engine/runner/cuda_setup.py``); then a ``CudaStepper``
(``engine/runner/cuda_step.py``) runs the steps: decode-only steps through persistent input
buffers and CUDA graphs, tokens sampled on the GPU in one pass, each step's GPU time from CUDA
events. On CPU the runner runs the model eagerly and samples with ``Sampler``. With
``tensor_parallel_size > 1`` this runner is rank 0: it starts the other ranks
(``engine/runner/tp.py``, each running :func:`worker_main`) and broadcasts each step's inputs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from engine.batch import ScheduledBatch, StepOutput
from engine.config import AUTO_SIZED_BLOCKS, Config, cap_blocks
from engine.errors import ConfigError, ReplayLLMError
from engine.executor import DoneStep, PendingStep
from engine.model.kernels.launch import long_prefill_kernel, programmatic_launch
from engine.model.layers.attention import get_attention_backend
from engine.model.layers.cuda_kernels import kernels_for
from engine.model.layers.linear import runs_split_k
from engine.model.layers.parallel import SINGLE_PROCESS
from engine.model.layers.sampler import Sampler
from engine.model.loader import build_model
from engine.runner import cuda_setup, tp
from engine.runner.cuda_step import CudaStepper, sample_on_gpu, sampling_seed
from engine.runner.launched_step import LaunchedStep
from engine.runner.step_inputs import (
    StepPayload,
    check_batch,
    eager_inputs,
    payload_from_batch,
    token_values,
)
from engine.sequence import PENDING_TOKEN

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_PLANES = 2  # K and V


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


def rank_device(device: torch.device, rank: int) -> torch.device:
    """The device of tensor-parallel rank ``rank``: GPU ``rank`` on CUDA, else ``device``."""
    return torch.device("cuda", rank) if device.type == "cuda" else device


class ModelRunner:
    """Executor over a real model (see ``engine/batch.py`` for the step contract).

    ``rank``/``store_dir`` are for tensor-parallel workers, which :func:`worker_main` builds.
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
        self.cuda: CudaStepper | None = None
        self.kv_cache: torch.Tensor | None = None
        world = config.tensor_parallel_size
        if world > 1:
            tp.check_divisible(self.model_dir, world)
            if self.device.type == "cuda":
                if torch.cuda.device_count() < world:
                    raise ConfigError(
                        f"tensor_parallel_size {world} needs {world} GPUs, "
                        f"{torch.cuda.device_count()} visible"
                    )
                self.device = rank_device(self.device, rank)
            if rank == 0:
                self.dist = tp.start(config, self.device, worker_main)
            else:
                assert store_dir is not None, "a TP worker needs the rendezvous store"
                self.dist = tp.join(rank, world, store_dir, self.device)
        try:
            self._build(config)
        except BaseException as exc:
            if self.dist is not None and rank == 0:  # no worker, group or store outlives it
                worker_error = None if isinstance(exc, ReplayLLMError) else \
                    tp.failed_worker(self.dist)
                tp.abort(self.dist)
                self.dist = None
                if worker_error is not None:  # rank 0's own error is the worker's vanishing
                    raise worker_error from None
            raise

    def _build(self, config: Config) -> None:
        """Load the model and allocate the KV cache (and on CUDA warm up and capture)."""
        rank = self.rank
        if self.device.type == "cuda":
            if self.device.index is None:  # "cuda": pin the current device, for set_device
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        self.group = self.dist.group if self.dist else SINGLE_PROCESS
        self.kernels = kernels_for(config, self.device)
        self.model = build_model(
            self.model_dir, self.attention_backend, self.device, self.dtype, self.group,
            self.kernels, max_positions=config.max_model_len,
        )  # fmt: skip
        self.spec = self.model.spec
        max_positions = self.spec.max_position_embeddings
        if config.max_model_len > max_positions:
            raise ConfigError(
                f"max_model_len {config.max_model_len} exceeds the model's "
                f"max_position_embeddings {max_positions} ({self.model_dir / 'config.json'}); "
                f"set max_model_len <= {max_positions}"
            )
        self.max_positions = config.max_model_len  # the rotary table's length (build_model)
        self.vocab_size: int = self.spec.vocab_size
        if config.eos >= self.vocab_size:  # no token would ever end a request
            raise ConfigError(
                f"eos {config.eos} is no token of the model's vocabulary ({self.vocab_size} "
                f"tokens, {self.model_dir / 'config.json'}); set eos below {self.vocab_size}"
            )
        self.eos_token_id: int = (
            config.eos
            if config.eos >= 0
            else (self.spec.eos_token_id if self.spec.eos_token_id is not None else -1)
        )
        self.num_kv_heads = self.model.attention_layers[0].num_kv_heads
        self.sampler = Sampler(config.seed, self.device)
        if self.device.type == "cuda":
            blocks = self._warm_up_and_size()
        else:
            blocks = self._kv_block_count()
        self.num_kvcache_blocks: int = tp.agree_min(blocks, self.dist) if self.dist else blocks
        self._allocate_kv_cache()
        if self.device.type == "cuda":
            self.cuda = cuda_setup.build_stepper(
                self.model, config, self.spec.max_position_embeddings, self.spec.hidden_size,
                self.device, self.dtype, self.block_size, self.num_kvcache_blocks,
                self.attention_backend, self.num_kv_heads, rank, self.fused_kernels,
            )  # fmt: skip

    # --- set-up -----------------------------------------------------------------------------------
    @property
    def kv_block_bytes(self) -> int:
        """Bytes of K and V of one block over all layers on this rank."""
        per_token = KV_PLANES * self.spec.num_hidden_layers * self.num_kv_heads
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return per_token * self.spec.head_dim * self.block_size * itemsize

    @property
    def fused_kernels(self) -> bool:
        """Whether the model's layers run the fused Triton kernels (CUDA only)."""
        return self.kernels.module is not None

    def _warm_up_and_size(self) -> int:
        """CUDA: KV blocks that fit after a maximum-load step (sampled as step 0 would be)."""
        seed = sampling_seed(self.config.seed, 0)
        graph_sizes = cuda_setup.planned_prefill_graph_sizes(self.config, self.attention_backend)
        return cuda_setup.warm_up_and_size(
            self.model, self.model.compute_logits,
            lambda logits, temps: sample_on_gpu(logits, temps, seed),
            self.config, self.spec.max_position_embeddings, self.device, self.block_size,
            self.kv_block_bytes, max(graph_sizes, default=0),
        )  # fmt: skip

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
        return cap_blocks(blocks)

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
        """Start one step and return without waiting for its tokens (on one GPU: decode steps
        and mixed steps through their graphs).

        Sequences whose last token is still pending take it from ``previous``: on the device for
        those two, else from its host values (which waits for it).
        """
        if self.kv_cache is None:
            raise RuntimeError("ModelRunner.execute called after close()")
        if not batch.seqs:
            return DoneStep(StepOutput(token_ids=[]))
        pending = any(seq.last_token == PENDING_TOKEN for seq in batch.sampled_seqs)
        if pending and previous is None:
            raise ValueError("a sequence's last token is pending but no previous step was given")
        single_gpu = self.cuda is not None and self.dist is None
        if batch.is_decode and single_gpu:
            return self.cuda.launch_decode(batch, previous if pending else None)
        mixed = self.cuda.mixed_key(batch) if single_gpu else None
        # A mixed graph step takes pending inputs on the device; the eager path from the host.
        on_device = previous if mixed is not None and pending and \
            isinstance(previous, LaunchedStep) else None
        values = token_values(previous) if pending and on_device is None else None
        check_batch(batch, self.max_positions, self.block_size,
                    self.num_kvcache_blocks)
        if mixed is not None:
            payload = payload_from_batch(batch, decode=False, pending_values=values)
            return self.cuda.launch_mixed(batch, payload, mixed, on_device)
        decode = batch.is_decode and self.cuda is not None
        payload = payload_from_batch(batch, decode=decode, pending_values=values)
        if self.dist is not None:
            tp.broadcast_payload(payload, self.dist)
        began = time.perf_counter()
        output = self._run(payload)
        if output.duration_s is None:  # CPU: computed right here, so its wall time is the step's
            output.duration_s = time.perf_counter() - began
        return DoneStep(output, [seq.seq_id for seq in batch.sampled_seqs])

    def _run(self, payload: StepPayload) -> StepOutput:
        """Forward (every rank) and sampling (rank 0) of one step from its payload."""
        if self.cuda is not None:
            return self.cuda.run(payload)
        num_seqs = len(payload.seq_ids)
        ids, positions, metadata = eager_inputs(payload, self.block_size, self.device)
        hidden = self.model(ids, positions, metadata)
        if not payload.sample_rows:
            return StepOutput(token_ids=[], padded_batch_size=num_seqs)
        rows = torch.tensor(payload.sample_rows, dtype=torch.int64)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        if self.rank != 0:
            return StepOutput(token_ids=[], padded_batch_size=num_seqs)
        tokens = self.sampler(logits, payload.temperatures, payload.row_options)
        return StepOutput(tokens.tolist(), padded_batch_size=num_seqs)

    def worker_loop(self) -> None:
        """A TP worker: run every step rank 0 broadcasts until it sends ``None``."""
        assert self.dist is not None
        with torch.inference_mode():
            while (payload := tp.broadcast_payload(None, self.dist)) is not None:
                self._run(payload)

    # --- description and shutdown -----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What the trace header records: where and how the model runs, and its architecture."""
        dtype = str(self.dtype).removeprefix("torch.")
        cuda = self.device.type == "cuda"
        world = self.group.world_size
        info: dict[str, Any] = {
            "executor": "model_runner",
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if cuda else "cpu",
            "dtype": dtype,
            "attention_backend": self.attention_backend.name,
            "tensor_parallel_size": world,
            "block_size": self.block_size,
            "num_kvcache_blocks": self.num_kvcache_blocks,
            "kv_cache_bytes": self.num_kvcache_blocks * self.kv_block_bytes,
            "eos_token_id": self.eos_token_id,
            "model": {
                "architecture": type(self.model).__name__,
                "path": str(self.model_dir),
                **self.spec.describe(),
                "num_params": sum(p.numel() for p in self.model.parameters()),
                "dtype": dtype,
            },
        }
        if world > 1:
            info["rank_devices"] = [str(rank_device(self.device, r)) for r in range(world)]
        info.update(self.cuda.describe() if self.cuda is not None else {"sampler": "torch"})
        if self.cuda is not None:  # whether the model's decode projections run split-K
            info["split_k_gemm"] = runs_split_k(self.model, self.dtype)
            info["decode_gemm_prefetch"] = (
                info["split_k_gemm"] and self.config.decode_gemm_prefetch
            )
            # Whether decode-only steps start their attention from the QKV rows.
            info["decode_qk_prologue"] = self.kernels.decodes_from_qkv(
                self.model.attention_layers[0]
            )
            info["programmatic_launch"] = programmatic_launch()
            info["decode_longest_first"] = self.cuda.buffers.longest_first
            info["long_prefill_kernel"] = long_prefill_kernel()
        return info

    def close(self) -> None:
        """Release the KV cache, graphs and TP workers (idempotent)."""
        if self.kv_cache is None:
            return
        if self.dist is not None and self.rank == 0:
            tp.shutdown(self.dist)
        self.dist = None
        if self.cuda is not None:
            self.cuda.release()
        for layer in self.model.attention_layers:
            layer.bind_kv_cache(None, None)
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def worker_main(config: Config, rank: int, store_dir: str) -> None:
    """A TP worker process's whole life: build its shard, then run every step rank 0 broadcasts."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
    try:
        runner = ModelRunner(config, rank=rank, store_dir=store_dir)
    except ReplayLLMError as exc:  # rank 0 raises it, in one line: no traceback here
        tp.report_failure(store_dir, rank, exc)
        raise SystemExit(1) from None
    except Exception as exc:  # a crash: rank 0 names it, and its traceback shows here
        tp.report_failure(store_dir, rank, exc)
        raise
    try:
        runner.worker_loop()
    except Exception as exc:  # a step failed on this rank: rank 0 names it in its one line
        tp.report_failure(store_dir, rank, exc)
        raise
    finally:
        runner.close()
