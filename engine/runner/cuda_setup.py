"""CUDA specifics of the model runner: KV sizing after a warm-up at maximum load, kernel
pre-compilation, step timing with CUDA events, and steps in flight (``LaunchedStep``): the
sampled tokens go to pinned host memory asynchronously, so the engine can launch the next step
before it waits for them.

KV sizing follows Nano-vLLM: run the largest batch the scheduler may ever build (as many
``max_model_len`` prompts as ``max_num_batched_tokens`` allows) plus logits and sampling for
``max_num_seqs`` rows, with no KV cache bound, and read the allocator's peak. Then

    blocks = (total * gpu_memory_utilization - used - (peak - current)) // block_bytes

where ``used`` is what the process holds now (CUDA context, weights, allocator cache) and
``peak - current`` the transient activations a step can need on top of it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import torch

from engine.batch import StepOutput
from engine.errors import ConfigError
from engine.graph_sizes import MAX_GRAPH_BATCH, prefill_graph_limit, prefill_graph_sizes
from engine.model.attention_metadata import build_attention_metadata
from engine.runner.decode_graphs import DecodeBuffers, DecodeGraphs
from engine.runner.prefill_graphs import PrefillGraphs

if TYPE_CHECKING:
    from engine.runner.model_runner import ModelRunner

# Kept out of the KV pool for the decode CUDA graphs' shared pool and the step buffers; their
# activations are ~max_batch x intermediate x 2 bytes (a few MiB at 512 rows), so this is ample.
CUDA_GRAPH_RESERVE_BYTES = 256 << 20
# Query tokens of the dummy prefill that compiles the paged-prefill kernel before serving.
PRECOMPILE_QUERY_TOKENS = 3


def _dummy_tables(num_seqs: int, tokens: int, block_size: int) -> list[list[int]]:
    """Block tables that cover ``tokens``; ids are arbitrary (no cache is bound, or the blocks
    are still free, so whatever the kernels write there is overwritten before it is read)."""
    return [[0] * ((tokens + block_size - 1) // block_size) for _ in range(num_seqs)]


@torch.inference_mode()
def warm_up_and_size(runner: ModelRunner) -> int:
    """Run a maximum-load step without a KV cache; return how many KV blocks fit afterwards."""
    config, spec, device = runner.config, runner.spec, runner.device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    seq_len = min(config.max_model_len, spec.max_position_embeddings)
    num_seqs = max(1, min(config.max_num_batched_tokens // seq_len, config.max_num_seqs))
    lens = [seq_len] * num_seqs
    positions, metadata = build_attention_metadata(
        lens, lens, _dummy_tables(num_seqs, seq_len, runner.block_size), runner.block_size,
        num_seqs, device,
    )  # fmt: skip
    ids = torch.zeros(num_seqs * seq_len, dtype=torch.int64, device=device)
    hidden = runner.model(ids, positions, metadata)
    rows = min(config.max_num_seqs, hidden.shape[0])
    logits = runner.model.compute_logits(hidden[:rows])
    temps = torch.ones(rows, dtype=torch.float32, device=device)
    runner.sample(logits, temps)
    del hidden, logits
    torch.cuda.synchronize(device)
    if config.num_kvcache_blocks > 0:
        return config.num_kvcache_blocks
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    transient = stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]
    # The prefill graphs' pool holds the activations of the largest captured prefill, apart from
    # the allocator's cache: a share of the maximum-load step's, pro rata to its tokens.
    graph_tokens = max(planned_prefill_graph_sizes(runner), default=0)
    prefill_reserve = transient * min(graph_tokens, len(lens) * seq_len) // (len(lens) * seq_len)
    budget = (
        int(total * config.gpu_memory_utilization)
        - (total - free)
        - transient
        - CUDA_GRAPH_RESERVE_BYTES
        - prefill_reserve
    )
    blocks = budget // runner.kv_block_bytes
    if blocks < 1:
        raise ConfigError(
            f"no GPU memory left for the KV cache: {budget / 2**30:.2f} GiB after the model and "
            f"a maximum-load step (gpu_memory_utilization {config.gpu_memory_utilization}); "
            "raise gpu_memory_utilization or lower max_num_batched_tokens"
        )
    return int(blocks)


def uses_cuda_graphs(runner: ModelRunner) -> bool:
    return not runner.config.enforce_eager and getattr(
        runner.attention_backend, "supports_cuda_graphs", False
    )


def planned_prefill_graph_sizes(runner: ModelRunner) -> list[int]:
    """The prefill token counts to capture: none without graphs, with tensor parallelism (every
    rank would have to replay in lock-step) or with a backend that cannot read prefill keys
    through the block table (``supports_prefill_graphs``)."""
    if not uses_cuda_graphs(runner) or runner.config.tensor_parallel_size > 1:
        return []
    if not getattr(runner.attention_backend, "supports_prefill_graphs", False):
        return []
    return prefill_graph_sizes(prefill_graph_limit(runner.config))


def set_up_cuda(runner: ModelRunner) -> None:
    """Decode buffers, step timer, token buffers, kernel pre-compilation, then the CUDA graphs
    (decode, and prefill where planned), captured over the bound KV cache."""
    config, spec = runner.config, runner.spec
    if config.max_model_len > spec.max_position_embeddings:
        raise ConfigError(
            f"max_model_len {config.max_model_len} exceeds the model's "
            f"max_position_embeddings {spec.max_position_embeddings}"
        )
    choose_blas_library()
    max_batch = min(config.max_num_seqs, MAX_GRAPH_BATCH)
    width = -(-config.max_model_len // runner.block_size)
    runner.buffers = DecodeBuffers(max_batch, width, runner.block_size, runner.device)
    runner.timer = StepTimer()
    runner.tokens = TokenBuffers(max_batch)
    sizes = (
        split_variants(max_batch, runner.num_kv_heads)
        if runner.attention_backend.name == "triton"
        else [1]
    )
    precompile(runner, sizes)
    if not uses_cuda_graphs(runner):
        return
    runner.graphs = DecodeGraphs(runner.buffers, spec.hidden_size, runner.dtype,
                                 config.max_model_len)
    runner.graphs.capture(runner.model)
    prefill_sizes = planned_prefill_graph_sizes(runner)
    if prefill_sizes:
        runner.prefill_graphs = PrefillGraphs(prefill_sizes, width, runner.block_size,
                                              spec.hidden_size, runner.dtype, runner.device)
        runner.prefill_graphs.capture(runner.model)


@torch.inference_mode()
def precompile(runner: ModelRunner, decode_batch_sizes: list[int]) -> None:
    """Compile every Triton kernel variant a run can hit before the first real step.

    Runs, over blocks that no sequence owns yet: a prefill with cached context (the paged
    prefill kernel and the KV store) and eager decodes at each batch size whose split count
    differs (the decode kernel is specialised on it).
    """
    device, block_size = runner.device, runner.block_size
    num_blocks = min(2, runner.num_kvcache_blocks)
    ctx = min(num_blocks * block_size, runner.spec.max_position_embeddings)
    query = min(PRECOMPILE_QUERY_TOKENS, ctx)
    table = [list(range(num_blocks))]
    positions, metadata = build_attention_metadata([query], [ctx], table, block_size, 1, device)
    ids = torch.zeros(query, dtype=torch.int64, device=device)
    runner.model(ids, positions, metadata)
    for batch in decode_batch_sizes:
        positions, metadata = build_attention_metadata(
            [1] * batch, [ctx] * batch, table * batch, block_size, 0, device
        )
        runner.model(torch.zeros(batch, dtype=torch.int64, device=device), positions, metadata)
    torch.cuda.synchronize(device)


def split_variants(max_batch: int, num_kv_heads: int) -> list[int]:
    """One batch size per distinct decode split count in ``[1, max_batch]``."""
    from engine.model.kernels.paged_attention import choose_num_splits

    seen: dict[int, int] = {}
    for batch in range(1, max_batch + 1):
        seen.setdefault(choose_num_splits(batch, num_kv_heads), batch)
    return sorted(seen.values())


# BLAS library for the projections (torch.backends.cuda.preferred_blas_library): "default"
# leaves torch's choice; REPLAYLLM_BLAS overrides it for A/B runs (benchmarks/gemm.py).
BLAS_ENV = "REPLAYLLM_BLAS"
DEFAULT_BLAS = "default"


def choose_blas_library() -> str:
    """Apply the BLAS library choice (before graphs are captured); returns its name."""
    choice = os.environ.get(BLAS_ENV, DEFAULT_BLAS)
    if choice not in ("default", "cublas", "cublaslt"):
        raise ConfigError(f"{BLAS_ENV}={choice!r}: choose default, cublas or cublaslt")
    torch.backends.cuda.preferred_blas_library(choice)
    return choice


class LaunchedStep:
    """A CUDA step in flight: its sampled tokens on the device, their copy to pinned host memory
    and the step's timing events. ``result`` waits for the copy alone, not the whole device."""

    def __init__(
        self,
        seq_ids: list[int],
        tokens: torch.Tensor,
        host_tokens: torch.Tensor,
        timer: StepTimer,
        padded: int,
        graph_used: bool,
    ) -> None:
        self.seq_ids = seq_ids
        self.tokens = tokens
        self.row_of = {seq_id: row for row, seq_id in enumerate(seq_ids)}
        self._host = host_tokens
        self._timer = timer
        self._copied = torch.cuda.Event()
        host_tokens.copy_(tokens, non_blocking=True)
        self._copied.record()
        self._launched = StepOutput(token_ids=[], padded_batch_size=padded, graph_used=graph_used)
        self._output: StepOutput | None = None

    def launch_wait_s(self) -> float:
        return 0.0  # launching queued the work; ``result`` waits

    def launched_output(self) -> StepOutput:
        return self._launched

    def result(self) -> StepOutput:
        if self._output is None:
            began = time.perf_counter()
            self._copied.synchronize()
            waited = time.perf_counter() - began
            launched = self._launched
            self._output = StepOutput(
                self._host.tolist(),
                self._timer.seconds(),
                launched.padded_batch_size,
                launched.graph_used,
                waited,
            )
        return self._output


class TokenBuffers:
    """Pinned host buffers for sampled tokens and timers, one per step that can be in flight."""

    def __init__(self, max_rows: int, slots: int = 2) -> None:
        self.host = [
            torch.empty(max_rows, dtype=torch.int64, pin_memory=True) for _ in range(slots)
        ]
        self.timers = [StepTimer() for _ in range(slots)]
        self.turn = 0

    def next(self, rows: int) -> tuple[torch.Tensor, StepTimer]:
        self.turn = (self.turn + 1) % len(self.host)
        if rows > self.host[self.turn].numel():
            self.host[self.turn] = torch.empty(rows, dtype=torch.int64, pin_memory=True)
        return self.host[self.turn][:rows], self.timers[self.turn]


class StepTimer:
    """GPU time of one step from two CUDA events; read after the step's tokens reached the host
    (that copy already synchronised, so reading the events costs no extra sync)."""

    def __init__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def begin(self) -> None:
        self.start.record()

    def finish(self) -> None:
        self.end.record()

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3


def describe_cuda(runner: ModelRunner) -> dict[str, Any]:
    graphs = runner.graphs
    prefill = runner.prefill_graphs.describe() if runner.prefill_graphs is not None else {}
    return {
        "cuda_graphs": graphs is not None,
        "graph_batch_sizes": graphs.sizes if graphs is not None else [],
        **prefill,
        "block_table_width": runner.buffers.table_width if runner.buffers else 0,
        "fused_kernels": runner.fused_kernels,
        "blas_library": str(torch.backends.cuda.preferred_blas_library()).removeprefix(
            "_BlasBackend."
        ),
    }
