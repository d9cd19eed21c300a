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
(``report_failure``) and is raised there, in one line. A worker that dies later (killed, crashed)
makes rank 0's next collective or broadcast fail: rank 0 then raises one line naming the rank
and how it ended (``WatchedGroup``), not gloo's multi-line error.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
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
# How long rank 0 waits, after a collective failed, for the worker whose connection closed to be
# seen as exited (its sockets close as it dies, a moment before its exit status is ready).
DEATH_WAIT_S = 5.0


@dataclass
class Distributed:
    """This process's place in the TP world and the groups it talks over."""

    group: ParallelGroup
    control: Any  # gloo group for step payloads (and for agreeing on the KV pool size)
    store_dir: str | None  # rank 0 removes it at shutdown
    workers: list[Any]


class WorkerDiedError(ReplayLLMError, RuntimeError):
    """A tensor-parallel worker died after joining the group (one line: its rank, how it ended);
    a RuntimeError too, as the collective's own failure was."""


@dataclass(frozen=True)
class WatchedGroup(ParallelGroup):
    """Rank 0's group: a collective that fails because a worker died raises one line naming the
    worker and how it ended (``died_worker``); any other failure keeps its own error."""

    store_dir: str = ""
    workers: list[Any] = field(default_factory=list, compare=False, repr=False)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        with self.deaths_named():
            return super().all_reduce(tensor)

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        with self.deaths_named():
            return super().all_gather_last_dim(tensor)

    @contextmanager
    def deaths_named(self) -> Iterator[None]:
        """Around a collective or broadcast: a ``RuntimeError`` because a rank died becomes
        that death's one line (``raise_if_died``); any other failure keeps its own error."""
        try:
            yield
        except RuntimeError:
            self.raise_if_died()
            raise

    def raise_if_died(self) -> None:
        """Rank 0: raise the one-line error of a worker that died, if one did. A worker: exit
        with one line if rank 0 died (a worker lives for rank 0 alone). Waits up to
        ``DEATH_WAIT_S`` for the death to show."""
        if self.rank != 0:
            parent = multiprocessing.parent_process()
            if parent is not None:
                parent.join(DEATH_WAIT_S)
                if not parent.is_alive():
                    raise SystemExit(f"tensor-parallel rank {self.rank}: rank 0 (process "
                                     f"{parent.pid}) died; this worker exits") from None
            return
        error = died_worker(self.store_dir, self.workers, DEATH_WAIT_S)
        if error is not None:
            raise error from None


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
    # Rank 0's workers: the list start() fills, where a collective that fails looks for the dead.
    group = WatchedGroup(rank, world, None, store_dir, workers if rank == 0 and workers else [])
    return Distributed(group, control, store_dir if rank == 0 else None, [])


def _wait_for_workers(store: Any, store_dir: str, workers: list[Any]) -> None:
    keys = [JOINED_KEY.format(rank=rank) for rank in range(1, len(workers) + 1)]
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT.total_seconds()
    while not store.check(keys):
        for rank, proc in enumerate(workers, start=1):
            if not proc.is_alive():
                raise worker_failure(store_dir, rank, proc, joined=False) from None
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"tensor-parallel workers did not start within {RENDEZVOUS_TIMEOUT}"
            )
        time.sleep(POLL_S)


def worker_failure(store_dir: str, rank: int, proc: Any, joined: bool = True) -> ReplayLLMError:
    """The error of worker ``rank`` that exited: the one it reported, else how it ended
    (``joined``: whether it had entered the group)."""
    return _failure(rank, proc, _reported(store_dir, rank), joined)


def _reported(store_dir: str | None, rank: int) -> str | None:
    """The error worker ``rank`` left for rank 0 (at start-up or in a step), read once; None if
    there is none."""
    if not store_dir:
        return None
    try:
        return (Path(store_dir) / ERROR_FILE.format(rank=rank)).read_text().strip()
    except OSError:  # none written (or the directory is gone)
        return None


def _failure(rank: int, proc: Any, reported: str | None, joined: bool) -> ReplayLLMError:
    if reported is not None:
        return ReplayLLMError(f"tensor-parallel rank {rank}: {reported}")
    ended = _how_it_ended(proc.exitcode)
    if joined:
        return WorkerDiedError(
            f"tensor-parallel worker rank {rank} died ({ended}): the engine cannot run a step "
            "without its shard"
        )
    return ReplayLLMError(
        f"tensor-parallel worker rank {rank} exited ({ended}) before joining "
        "the group; a script that starts an engine with tensor_parallel_size > 1 must do it "
        "under `if __name__ == '__main__':`"
    )


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def report_failure(store_dir: str, rank: int, error: BaseException) -> None:
    """A worker's error (at start-up or in a step), left for rank 0 (``worker_failure``,
    ``died_worker``) to raise in one line."""
    path = Path(store_dir) / ERROR_FILE.format(rank=rank)
    try:
        path.write_text(" ".join(str(error).split()) or type(error).__name__)
    except OSError:  # rank 0 already removed the directory: it is going down anyway
        pass


def failed_worker(state: Distributed) -> ReplayLLMError | None:
    """The error of the first worker that reported one or died, if any (rank 0)."""
    for rank, proc in enumerate(state.workers, start=1):
        reported = _reported(state.store_dir, rank)  # one read: the same text is raised
        if reported is not None or proc.exitcode not in (None, 0):
            return _failure(rank, proc, reported, joined=True)
    return None


def died_worker(store_dir: str, workers: list[Any], wait_s: float) -> ReplayLLMError | None:
    """Rank 0, after a collective failed: the error of a worker that exited, waiting up to
    ``wait_s`` for one to (its connection closes a moment before its exit is seen); None if
    every worker still runs then (the failure is not a death)."""
    if workers and all(proc.exitcode is None for proc in workers):
        multiprocessing.connection.wait([proc.sentinel for proc in workers], timeout=wait_s)
    for rank, proc in enumerate(workers, start=1):
        if proc.exitcode is not None:
            return _failure(rank, proc, _reported(store_dir, rank), joined=True)
    return None


def broadcast_payload(payload: StepPayload | None, state: Distributed) -> StepPayload | None:
    """Rank 0 sends ``payload``; the other ranks receive it (``None``: shut down)."""
    box = [payload]
    group = state.group  # a rank that died is named, in one line (a WatchedGroup's)
    with group.deaths_named() if isinstance(group, WatchedGroup) else nullcontext():
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
    except (RuntimeError, ReplayLLMError):  # gloo: the connection to a dead worker is closed
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
