"""Tensor parallelism across processes: rank 0 schedules, every rank runs its shard of the model.

Rank 0 (the engine's own process) starts ``tensor_parallel_size - 1`` worker processes (spawn).
All ranks join one ``torch.distributed`` group (NCCL on GPUs, gloo on CPU) through a
``FileStore`` in a fresh temporary directory: no port and no shared-memory name is fixed, so
several engines can run side by side. Each step rank 0 broadcasts the step's prepared inputs
(a small picklable :class:`StepPayload`) over a gloo group, then every rank runs the forward;
the model's own collectives (all-reduce after row-parallel layers, all-gather of the logits)
keep the shards in step, and rank 0 alone samples. A ``None`` payload tells workers to exit.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.errors import ConfigError
from engine.model.layers.parallel import ParallelGroup
from engine.model.layers.sampler import RowOptions, row_options
from engine.sequence import PENDING_TOKEN

STORE_FILE = "store"
# How long a rank waits for the others at start-up (model loading included) or for a step.
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)
WORKER_JOIN_TIMEOUT_S = 30.0


@dataclass
class StepPayload:
    """One step's inputs, identical on every rank (see ``ModelRunner._payload``)."""

    decode: bool  # True: a decode-only batch (the graph path)
    seq_ids: list[int]
    input_ids: list[int]
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    num_prefill_seqs: int
    sample_rows: list[int]
    temperatures: list[float]
    eager: bool = False  # no CUDA graph, whatever the batch (ScheduledBatch.eager)
    # Per sampled row: top-p/top-k/seed options (engine/model/layers/sampler.row_options);
    # None: no row has any.
    row_options: list[RowOptions | None] | None = None


def payload_from_batch(
    batch: ScheduledBatch, decode: bool, pending_values: dict[int, int] | None = None
) -> StepPayload:
    """The step's inputs as plain lists: what every rank needs to run it.

    ``decode``: a decode-only batch that will run through the staged (graph) path.
    ``pending_values``: seq_id -> value of a last token still pending in ``seq.token_ids``.
    """
    seqs, ctx = batch.seqs, batch.context_lens
    if decode:  # one query token per sequence: its last token
        input_ids = [seq.token_ids[c - 1] for seq, c in zip(seqs, ctx)]
    else:
        input_ids = []
        for seq, new, c in zip(seqs, batch.num_new_tokens, ctx):
            input_ids.extend(seq.token_ids[c - new : c])
    if pending_values:
        # Only the last token of a sequence can be pending, and only in a decode row.
        offset = 0
        for seq, new in zip(seqs, batch.num_new_tokens):
            offset += 1 if decode else new
            if seq.seq_id in pending_values and input_ids[offset - 1] == PENDING_TOKEN:
                input_ids[offset - 1] = pending_values[seq.seq_id]
    sample = batch.sample
    last = _last_rows(batch.num_new_tokens)
    if sample is None:
        rows = list(range(len(seqs))) if decode else last
    else:
        rows = [last[i] for i in range(len(seqs)) if sample[i]]
    sampled = [s for i, s in enumerate(seqs) if sample is None or sample[i]]
    temps = [s.temperature for s in sampled]
    return StepPayload(
        decode=decode,
        seq_ids=[seq.seq_id for seq in seqs],
        input_ids=input_ids,
        query_lens=batch.num_new_tokens,
        context_lens=ctx,
        block_tables=[seq.block_table for seq in seqs],
        num_prefill_seqs=batch.num_prefill_seqs,
        sample_rows=rows,
        temperatures=temps,
        eager=batch.eager,
        row_options=row_options(sampled),
    )


def _last_rows(query_lens: list[int]) -> list[int]:
    """Row of each sequence's last new token in the flat batch."""
    rows, offset = [], 0
    for n in query_lens:
        offset += n
        rows.append(offset - 1)
    return rows


@dataclass
class Distributed:
    """This process's place in the TP world and the groups it talks over."""

    group: ParallelGroup
    control: Any  # gloo group for step payloads (and for agreeing on the KV pool size)
    store_dir: str | None  # rank 0 removes it at shutdown
    workers: list[Any]


def check_divisible(model_dir: Path, world: int) -> None:
    """Refuse, in one clear line, a TP size that does not split the model's heads and widths."""
    from engine.model.loader import read_hf_config
    from engine.model.registry import get_model_class, resolve_architecture

    hf_config = read_hf_config(Path(model_dir))
    spec = get_model_class(resolve_architecture(hf_config)).spec_class.from_hf_config(hf_config)
    sizes = {
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
    }
    bad = [f"{name} {value}" for name, value in sizes.items() if value % world]
    if bad:
        raise ConfigError(f"tensor_parallel_size {world} must divide the model's " + ", ".join(bad))


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def start(config: Config, device: torch.device) -> Distributed:
    """On rank 0: start the workers and join the group with them."""
    world = config.tensor_parallel_size
    store_dir = tempfile.mkdtemp(prefix="replayllm-tp-")
    context = multiprocessing.get_context("spawn")
    workers = []
    for rank in range(1, world):
        # Daemonic: if rank 0 dies, its workers die with it instead of waiting on a broadcast.
        proc = context.Process(
            target=worker_main,
            args=(config, rank, store_dir),
            name=f"replayllm-tp{rank}",
            daemon=True,
        )
        proc.start()
        workers.append(proc)
    dist_state = join(rank=0, world=world, store_dir=store_dir, device=device)
    dist_state.workers = workers
    return dist_state


def join(rank: int, world: int, store_dir: str, device: torch.device) -> Distributed:
    """Join the default group (model collectives) and a gloo group (step payloads)."""
    store = dist.FileStore(str(Path(store_dir) / STORE_FILE), world)
    dist.init_process_group(
        _backend(device), store=store, rank=rank, world_size=world, timeout=RENDEZVOUS_TIMEOUT
    )
    control = dist.new_group(backend="gloo") if device.type == "cuda" else None
    return Distributed(
        ParallelGroup(rank, world, None), control, store_dir if rank == 0 else None, []
    )


def broadcast_payload(payload: StepPayload | None, state: Distributed) -> StepPayload | None:
    """Rank 0 sends ``payload``; the other ranks receive it (``None``: shut down)."""
    box = [payload]
    dist.broadcast_object_list(box, src=0, group=state.control)
    return box[0]


def agree_min(value: int, state: Distributed) -> int:
    """The smallest ``value`` over all ranks (each rank sizes its own KV pool)."""
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=state.control)
    return int(tensor.item())


def shutdown(state: Distributed) -> None:
    """Rank 0: stop the workers, wait for them, leave the group, remove the store."""
    broadcast_payload(None, state)
    for proc in state.workers:
        proc.join(WORKER_JOIN_TIMEOUT_S)
        if proc.is_alive():  # a stuck worker must not outlive the engine
            proc.terminate()
            proc.join(WORKER_JOIN_TIMEOUT_S)
    state.workers = []
    if dist.is_initialized():
        dist.destroy_process_group()
    if state.store_dir:
        shutil.rmtree(state.store_dir, ignore_errors=True)


def worker_main(config: Config, rank: int, store_dir: str) -> None:
    """A worker's whole life: build its shard, then run every step rank 0 broadcasts."""
    from engine.runner.model_runner import ModelRunner

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
    runner = ModelRunner(config, rank=rank, store_dir=store_dir)
    try:
        runner.worker_loop()
    finally:
        runner.close()
