"""The tensor-parallel process group: rank 0 schedules, every rank runs its shard of the model.

Rank 0 (the engine's own process) starts ``tensor_parallel_size - 1`` worker processes (spawn)
running the function it is given (``engine.runner.model_runner.worker_main``). All ranks join
one ``torch.distributed`` group (NCCL on GPUs, gloo on CPU) through a ``FileStore`` in a fresh
temporary directory: no port and no shared-memory name is fixed, so several engines can run side
by side. Each step rank 0 broadcasts the step's inputs (a small picklable ``StepPayload``) over
a gloo group, then every rank runs the forward; the model's own collectives (all-reduce after
row-parallel layers, all-gather of the logits) keep the shards in step, and rank 0 alone
samples. A ``None`` payload tells workers to exit.

A start-up that fails on any rank takes the whole group down (``abort``): no worker, process
group or store directory outlives it, so the same process can start another engine. A worker
that exits before joining (a script whose top level starts the engine without
``if __name__ == "__main__":`` re-runs it in every spawned worker) is noticed at once, not after
``RENDEZVOUS_TIMEOUT``; a worker's own start-up error reaches rank 0 through the store directory
(``report_failure``) and is raised there, in one line.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.config import Config
from engine.errors import ConfigError, ReplayLLMError
from engine.model.layers.parallel import ParallelGroup
from engine.runner.step_inputs import StepPayload

STORE_FILE = "store"
# How long a rank waits for the others at start-up (model loading included) or for a step.
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)
WORKER_JOIN_TIMEOUT_S = 30.0
JOINED_KEY = "joined/{rank}"  # a worker sets it in the store as it enters the rendezvous
ERROR_FILE = "error-rank{rank}"  # a worker's start-up error, for rank 0 to raise
POLL_S = 0.05


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


# A worker process's whole life: target(config, rank, store_dir) builds its shard and runs steps.
WorkerMain = Callable[[Config, int, str], None]


def start(config: Config, device: torch.device, target: WorkerMain) -> Distributed:
    """On rank 0: start ``tensor_parallel_size - 1`` processes running ``target`` (a module-level
    function: spawn pickles it by name) and join the group with them."""
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise ConfigError(
            "tensor_parallel_size > 1 starts worker processes, each of which imports your main "
            "module: start the engine under `if __name__ == '__main__':`"
        )
    world = config.tensor_parallel_size
    store_dir = tempfile.mkdtemp(prefix="replayllm-tp-")
    context = multiprocessing.get_context("spawn")
    workers: list[Any] = []
    try:
        for rank in range(1, world):
            # Daemonic: if rank 0 dies, its workers die with it instead of waiting on a broadcast.
            proc = context.Process(
                target=target,
                args=(config, rank, store_dir),
                name=f"replayllm-tp{rank}",
                daemon=True,
            )
            proc.start()
            workers.append(proc)
        dist_state = join(rank=0, world=world, store_dir=store_dir, device=device,
                          workers=workers)
    except BaseException:
        abort(Distributed(ParallelGroup(0, world, None), None, store_dir, workers))
        raise
    dist_state.workers = workers
    return dist_state


def join(rank: int, world: int, store_dir: str, device: torch.device,
         workers: list[Any] | None = None) -> Distributed:
    """Join the default group (model collectives) and a gloo group (step payloads).

    Rank 0 passes its ``workers``: it waits for each to enter the rendezvous and fails at once,
    naming it, if one exits first.
    """
    store = dist.FileStore(str(Path(store_dir) / STORE_FILE), world)
    if rank == 0:
        _wait_for_workers(store, store_dir, workers or [])
    else:
        store.set(JOINED_KEY.format(rank=rank), "1")
    dist.init_process_group(
        _backend(device), store=store, rank=rank, world_size=world, timeout=RENDEZVOUS_TIMEOUT
    )
    control = dist.new_group(backend="gloo") if device.type == "cuda" else None
    return Distributed(
        ParallelGroup(rank, world, None), control, store_dir if rank == 0 else None, []
    )


def _wait_for_workers(store: Any, store_dir: str, workers: list[Any]) -> None:
    keys = [JOINED_KEY.format(rank=rank) for rank in range(1, len(workers) + 1)]
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT.total_seconds()
    while not store.check(keys):
        for rank, proc in enumerate(workers, start=1):
            if not proc.is_alive():
                raise worker_failure(store_dir, rank, proc) from None
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"tensor-parallel workers did not start within {RENDEZVOUS_TIMEOUT}"
            )
        time.sleep(POLL_S)


def worker_failure(store_dir: str, rank: int, proc: Any) -> ReplayLLMError:
    """The error of worker ``rank`` that exited: the one it reported, else its exit code."""
    reported = Path(store_dir) / ERROR_FILE.format(rank=rank)
    if reported.is_file():
        return ReplayLLMError(f"tensor-parallel rank {rank}: {reported.read_text().strip()}")
    return ReplayLLMError(
        f"tensor-parallel worker rank {rank} exited (exit code {proc.exitcode}) before joining "
        "the group; a script that starts an engine with tensor_parallel_size > 1 must do it "
        "under `if __name__ == '__main__':`"
    )


def report_failure(store_dir: str, rank: int, error: BaseException) -> None:
    """A worker's start-up error, left for rank 0 (``worker_failure``) to raise in one line."""
    path = Path(store_dir) / ERROR_FILE.format(rank=rank)
    try:
        path.write_text(" ".join(str(error).split()) or type(error).__name__)
    except OSError:  # rank 0 already removed the directory: it is going down anyway
        pass


def failed_worker(state: Distributed) -> ReplayLLMError | None:
    """The error of the first worker that reported one or died, if any (rank 0)."""
    for rank, proc in enumerate(state.workers, start=1):
        reported = state.store_dir and (Path(state.store_dir) / ERROR_FILE.format(rank=rank))
        if (reported and reported.is_file()) or (proc.exitcode not in (None, 0)):
            return worker_failure(state.store_dir or "", rank, proc)
    return None


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
    """Rank 0: stop the workers, wait for them, leave the group, remove the store. A worker
    that died (killed, crashed) cannot take the last broadcast: the rest still happens."""
    try:
        broadcast_payload(None, state)
    except RuntimeError:  # gloo: the connection to a dead worker is closed
        abort(state)
        return
    for proc in state.workers:
        proc.join(WORKER_JOIN_TIMEOUT_S)
    abort(state)


def abort(state: Distributed) -> None:
    """Rank 0: end the workers still running, leave the group, remove the store (idempotent)."""
    for proc in state.workers:
        if proc.is_alive():  # a stuck worker must not outlive the engine
            proc.terminate()
            proc.join(WORKER_JOIN_TIMEOUT_S)
    state.workers = []
    if dist.is_initialized():
        dist.destroy_process_group()
    if state.store_dir:
        shutil.rmtree(state.store_dir, ignore_errors=True)
