"""CUDA start-up of the model runner: KV sizing after a warm-up at maximum load, the BLAS
library, kernel pre-compilation and graph capture, ending in a ``CudaStepper``.

Plain functions of plain values and the model's callables; none of them keeps state.

KV sizing follows Nano-vLLM: run the largest batch the scheduler may ever build (as many
``max_model_len`` prompts as ``max_num_batched_tokens`` allows) plus logits and sampling for
``max_num_seqs`` rows, with no KV cache bound, and read the allocator's peak. Then

    blocks = (total * gpu_memory_utilization - used - (peak - current)) // block_bytes

where ``used`` is what the process holds now (CUDA context, weights, allocator cache) and
``peak - current`` the transient activations a step can need on top of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.config import BLAS_LIBRARIES, Config, cap_blocks
from engine.errors import ConfigError
from engine.graph_sizes import (
    MAX_GRAPH_BATCH,
    mixed_graph_decode_sizes,
    mixed_prefill_sizes,
    prefill_graph_limit,
    prefill_graph_prompts,
    prefill_graph_sizes,
)
from engine.model.attention_metadata import build_attention_metadata
from engine.model.kernels.launch import set_long_prefill_kernel, set_programmatic_launch
from engine.model.layers.decode_gemm import decode_tilings, split_k_batches
from engine.runner.cuda_step import CudaStepper
from engine.runner.decode_graphs import DecodeBuffers, DecodeGraphs
from engine.runner.graph_capture import NO_SOURCE, ModelFn, take_sources
from engine.runner.mixed_graphs import MixedGraphs
from engine.runner.prefill_graphs import PrefillGraphs

# Kept out of the KV pool for the decode CUDA graphs' shared pool and the step buffers; their
# activations are about max_batch x intermediate x 2 bytes (a few MiB), so this is ample.
CUDA_GRAPH_RESERVE_BYTES = 256 << 20
# Query tokens of the dummy prefill that compiles the paged-prefill kernel before serving.
PRECOMPILE_QUERY_TOKENS = 3

LogitsFn = Callable[[torch.Tensor], torch.Tensor]
SampleFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _dummy_tables(num_seqs: int, tokens: int, block_size: int) -> list[list[int]]:
    """Block tables that cover ``tokens``; ids are arbitrary (no cache is bound, or the blocks
    are still free, so whatever the kernels write there is overwritten before it is read)."""
    return [[0] * ((tokens + block_size - 1) // block_size) for _ in range(num_seqs)]


@torch.inference_mode()
def warm_up_and_size(
    forward: ModelFn,
    compute_logits: LogitsFn,
    sample: SampleFn,
    config: Config,
    max_positions: int,
    device: torch.device,
    block_size: int,
    kv_block_bytes: int,
    max_prefill_graph_tokens: int,
) -> int:
    """Run a maximum-load step without a KV cache (and compile the sampler's variants); return
    how many KV blocks fit afterwards.

    ``max_prefill_graph_tokens``: the largest prefill graph to be captured (0: none); its share
    of the step's activations is kept out of the pool too.
    """
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    seq_len = min(config.max_model_len, max_positions)
    num_seqs = max(1, min(config.max_num_batched_tokens // seq_len, config.max_num_seqs))
    lens = [seq_len] * num_seqs
    positions, metadata = build_attention_metadata(
        lens, lens, _dummy_tables(num_seqs, seq_len, block_size), block_size, num_seqs, device
    )
    ids = torch.zeros(num_seqs * seq_len, dtype=torch.int64, device=device)
    hidden = forward(ids, positions, metadata)
    rows = min(config.max_num_seqs, hidden.shape[0])
    _warm_up_first_uses(hidden, compute_logits, rows, device)
    logits = compute_logits(hidden[:rows])
    temps = torch.ones(rows, dtype=torch.float32, device=device)
    sample(logits, temps)
    from engine.model.kernels.sampler import warm_up_sampler  # Triton: imported when used

    warm_up_sampler(logits.shape[-1], device)  # the sampler's other variants: none compile mid-run
    del hidden, logits
    torch.cuda.synchronize(device)
    if config.num_kvcache_blocks > 0:
        return config.num_kvcache_blocks
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    transient = stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]
    # The prefill graphs' pool holds the activations of the largest captured prefill, apart from
    # the allocator's cache: a share of the maximum-load step's, pro rata to its tokens.
    step_tokens = len(lens) * seq_len
    prefill_reserve = transient * min(max_prefill_graph_tokens, step_tokens) // step_tokens
    budget = (
        int(total * config.gpu_memory_utilization)
        - (total - free)
        - transient
        - CUDA_GRAPH_RESERVE_BYTES
        - prefill_reserve
    )
    blocks = budget // kv_block_bytes
    if blocks < 1:
        raise ConfigError(
            f"no GPU memory left for the KV cache: {budget / 2**30:.2f} GiB after the model and "
            f"a maximum-load step (gpu_memory_utilization {config.gpu_memory_utilization}); "
            "raise gpu_memory_utilization or lower max_num_batched_tokens"
        )
    return cap_blocks(int(blocks))


def _warm_up_first_uses(hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], Any],
                        max_rows: int, device: torch.device) -> None:
    """Run once, before the pool is sized, what a run's first steps would otherwise load mid-run:
    the LM head at every row count from 1 to ``max_rows``, and the decode graphs' input gather
    (``take_sources``). The LM head runs eagerly over a step's sampled rows (a prefill's
    prompts, a decode's sequences, not its padded batch), and its GEMM picks a kernel by row
    count whose first use loads its module (CUDA lazy loading): 10-35 ms on the engine thread
    mid-run otherwise, at decodes of 70-280 rows (docs/gpu-notes.md, session 37). One result is
    alive at a time, none larger than the maximum-load step's logits, so the measured peak does
    not move."""
    for count in range(1, max_rows + 1):
        compute_logits(hidden[:count])  # dropped at once: one result alive at a time
    ids = torch.zeros(2, dtype=torch.int64, device=device)
    take_sources(ids, torch.tensor([0, NO_SOURCE], device=device), ids.clone())


def uses_cuda_graphs(config: Config, attention_backend: Any) -> bool:
    """Decode graphs are captured unless ``enforce_eager`` or the backend cannot be captured."""
    return not config.enforce_eager and getattr(attention_backend, "supports_cuda_graphs", False)


def planned_prefill_graph_sizes(config: Config, attention_backend: Any) -> list[int]:
    """The prefill token counts to capture: none without graphs, with tensor parallelism (every
    rank would have to replay in lock-step) or with a backend that cannot read prefill keys
    through the block table (``supports_prefill_graphs``)."""
    if not uses_cuda_graphs(config, attention_backend) or config.tensor_parallel_size > 1:
        return []
    if not getattr(attention_backend, "supports_prefill_graphs", False):
        return []
    return prefill_graph_sizes(prefill_graph_limit(config))


def build_stepper(
    model: Any,
    config: Config,
    max_positions: int,
    hidden_size: int,
    device: torch.device,
    dtype: torch.dtype,
    block_size: int,
    num_kvcache_blocks: int,
    attention_backend: Any,
    num_kv_heads: int,
    rank: int,
    fused_kernels: bool,
) -> CudaStepper:
    """Decode buffers, kernel pre-compilation, then the CUDA graphs (decode, and prefill where
    planned) captured over the bound KV cache: the runner's ``CudaStepper``.

    ``model``: the forward (``model(ids, positions, metadata)``) and ``compute_logits``.
    """
    if config.max_model_len > max_positions:
        raise ConfigError(
            f"max_model_len {config.max_model_len} exceeds the model's "
            f"max_position_embeddings {max_positions}"
        )
    choose_blas_library(config.blas_library)
    set_programmatic_launch(config.programmatic_launch, torch.cuda.get_device_capability(device))
    set_long_prefill_kernel(config.long_prefill_kernel)
    max_batch = min(config.max_num_seqs, MAX_GRAPH_BATCH)
    width = -(-config.max_model_len // block_size)
    buffers = DecodeBuffers(max_batch, width, block_size, device, config.decode_longest_first)
    stepper_args = (block_size, num_kvcache_blocks, config.seed, rank, fused_kernels)
    sizes = split_variants(max_batch, num_kv_heads) if attention_backend.name == "triton" else [1]
    # ... and one per split-K GEMM tiling, which compiles on its first batch too.
    table = decode_tilings(config.decode_gemm_prefetch)
    sizes = sorted(set(sizes) | {b for b in split_k_batches(table) if b <= max_batch})
    precompile(model, device, block_size, num_kvcache_blocks, max_positions, sizes,
               config.decode_longest_first)
    if not uses_cuda_graphs(config, attention_backend):
        return CudaStepper(model, buffers, None, None, *stepper_args)
    graphs = DecodeGraphs(buffers, hidden_size, dtype, config.max_model_len)
    graphs.capture(model)
    prefill_graphs = None
    prefill_sizes = planned_prefill_graph_sizes(config, attention_backend)
    if prefill_sizes:
        prefill_graphs = PrefillGraphs(prefill_sizes, width, block_size, hidden_size, dtype, device,
                                       prefill_graph_prompts(config))
        prefill_graphs.capture(model)
    mixed_graphs = None
    mixed_rows = mixed_graph_decode_sizes(config)
    if prefill_graphs is not None and mixed_rows:
        # The mixed graphs share the prefill graphs' pool (captured after them, never replayed
        # at once).
        mixed_graphs = MixedGraphs(mixed_prefill_sizes(prefill_sizes), mixed_rows, width,
                                   block_size, hidden_size, dtype, device,
                                   longest_first=config.decode_longest_first)
        mixed_graphs.capture(model, prefill_graphs.pool)
    return CudaStepper(model, buffers, graphs, prefill_graphs, *stepper_args,
                       mixed_graphs=mixed_graphs)


@torch.inference_mode()
def precompile(
    forward: ModelFn,
    device: torch.device,
    block_size: int,
    num_kvcache_blocks: int,
    max_positions: int,
    decode_batch_sizes: list[int],
    longest_first: bool = False,
) -> None:
    """Compile every Triton kernel variant a run can hit before the first real step.

    Runs, over blocks that no sequence owns yet: a prefill with cached context (the paged
    prefill kernel and the KV store) and eager decodes at each batch size whose split count
    differs (the decode kernel is specialised on it), their rows ordered as ``longest_first``
    says (``Config.decode_longest_first``: the kernel is specialised on that too).
    """
    num_blocks = min(2, num_kvcache_blocks)
    ctx = min(num_blocks * block_size, max_positions)
    query = min(PRECOMPILE_QUERY_TOKENS, ctx)
    table = [list(range(num_blocks))]
    positions, metadata = build_attention_metadata([query], [ctx], table, block_size, 1, device)
    ids = torch.zeros(query, dtype=torch.int64, device=device)
    forward(ids, positions, metadata)
    for batch in decode_batch_sizes:
        positions, metadata = build_attention_metadata(
            [1] * batch, [ctx] * batch, table * batch, block_size, 0, device, longest_first
        )
        forward(torch.zeros(batch, dtype=torch.int64, device=device), positions, metadata)
    torch.cuda.synchronize(device)


def split_variants(max_batch: int, num_kv_heads: int) -> list[int]:
    """One batch size per distinct decode split count in ``[1, max_batch]``."""
    from engine.model.kernels.paged_attention import choose_num_splits

    seen: dict[int, int] = {}
    for batch in range(1, max_batch + 1):
        seen.setdefault(choose_num_splits(batch, num_kv_heads), batch)
    return sorted(seen.values())


def choose_blas_library(name: str) -> str:
    """Apply ``Config.blas_library`` (before graphs are captured); returns its name."""
    if name not in BLAS_LIBRARIES:
        raise ConfigError(f"blas_library {name!r}: choose {', '.join(BLAS_LIBRARIES)}")
    torch.backends.cuda.preferred_blas_library(name)
    return name
