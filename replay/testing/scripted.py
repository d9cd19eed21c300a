"""The scripted model of the scheduler property tests: an executor that returns each request's
scripted tokens and simulates the paged KV cache, and the record of one run (``Run``).

``ScriptedExecutor`` checks, on every step, that each token a step computes has a slot and that
every token it attends to is in its slot with the right prefix, and (prefix caching on) that every
full block whose KV is computed is entered in the prefix cache with its chain hash. With
``overlap`` it also accepts ``launch``, so EngineCore overlaps steps where it can.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from engine.batch import ScheduledBatch, StepOutput
from engine.block_hash import chain_hash
from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import DoneStep
from engine.sequence import PENDING_TOKEN, Sequence
from replay.testing.strategies import (
    RequestSpec,
    Workload,
)
from tracing.schema import EVENT_KINDS, MEASURED_COLUMNS, NO_HASH


class PropertyViolations(AssertionError):
    """One or more named properties failed on a workload."""


def signed_xxh64_of_int32(tokens: list[int]) -> int:
    digest = xxhash.xxh64_intdigest(np.asarray(tokens, dtype=np.int32).tobytes())
    return digest - (1 << 64) if digest >= 1 << 63 else digest


class ScriptedExecutor:
    """The model, simulated: scripted tokens per completion position and a simulated KV cache."""

    def __init__(self, config: Config, run: Run, overlap: bool = False) -> None:
        self.num_kvcache_blocks = config.num_kvcache_blocks
        self.block_size = config.kvcache_block_size
        self.run = run
        self.scripts: dict[int, tuple[int, ...]] = {}
        self.kv: dict[tuple[int, int], tuple[int, int]] = {}
        self.digests: dict[int, list[int]] = {}
        # ``overlap``: accept launch(), as a GPU runner does; EngineCore then overlaps steps.
        self.supports_overlap = overlap
        self._pending_values: dict[int, int] = {}

    def launch(self, batch: ScheduledBatch, previous: Any = None) -> DoneStep:
        """Like a runner: a pending input token is read from the step that samples it."""
        if previous is not None:
            tokens = previous.result().token_ids
            self._pending_values = dict(zip(previous.seq_ids, tokens))
        try:
            output = self.execute(batch)
        finally:
            self._pending_values = {}
        return DoneStep(output, [seq.seq_id for seq in batch.sampled_seqs])

    def _digests(self, seq: Sequence) -> list[int]:
        """digest[p] identifies the token prefix [0, p] of ``seq`` (what the KV at p depends on)."""
        known = self.digests.setdefault(seq.seq_id, [])
        for pos in range(len(known), seq.num_tokens):
            token = seq.token_ids[pos]
            if token == PENDING_TOKEN:
                token = self._pending_values[seq.seq_id]
            known.append(hash((known[-1] if known else 0, token)))
        return known

    def _check_registered(self, seq: Sequence, ctx: int) -> None:
        """Every full block of the first ``ctx`` tokens (KV computed by the end of this step) is
        hashed (entered in the prefix cache) with the chain hash of the sequence's own tokens."""
        bm = self.run.core.scheduler.block_manager
        bs, parent = self.block_size, NO_HASH
        if ctx and seq.token_ids[ctx - 1] == PENDING_TOKEN:
            ctx -= 1  # a block completed by a pending token is hashed when its value is in
        # Under hold_decode_blocks a schedule's held blocks all wait for resolve_pending while
        # any of them still has its value on the device (BlockManager.settle_held): the same
        # moment for the cache, as only this launch comes between.
        held = {index for owner, index, _, _ in bm.pending_hashes if owner is seq}
        for i in range(ctx // bs):
            parent = chain_hash(seq.token_ids[i * bs : (i + 1) * bs], parent, bm.hash_seed)
            block = bm.blocks[seq.block_table[i]]
            if block.hash != parent and i not in held:
                self.run.check(
                    False,
                    "prefix_index",
                    f"seq {seq.seq_id}: block {i} ({block}) of its computed tokens is not hashed "
                    f"as {parent}",
                )
                return

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        check, bs = self.run.check, self.block_size
        scheduler = self.run.core.scheduler
        # The state Scheduler.can_defer sees (after the schedule, before the tokens are in).
        self.run.at_launch = (
            len(scheduler.block_manager.free_block_ids),
            [(s.seq_id, s.num_tokens, len(s.block_table)) for s in scheduler.running],
        )
        work = list(zip(batch.seqs, batch.num_new_tokens, batch.context_lens))
        if self.run.workload.config.enable_prefix_caching:
            for seq, _, ctx in work:
                self._check_registered(seq, min(ctx, len(seq.block_table) * bs))
        for seq, new, ctx in work:
            check(
                1 <= new <= ctx <= seq.num_tokens,
                "kv",
                f"seq {seq.seq_id}: computes {new} tokens ending at {ctx} of {seq.num_tokens}",
            )
            check(
                ctx - new == seq.num_computed_tokens,
                "kv",
                f"seq {seq.seq_id}: starts at {ctx - new}, computed {seq.num_computed_tokens}",
            )
            check(
                len(seq.block_table) * bs >= ctx,
                "kv",
                f"seq {seq.seq_id}: {ctx} tokens of context in {len(seq.block_table)} blocks",
            )
            digests = self._digests(seq)
            for pos in range(max(0, ctx - new), min(ctx, len(seq.block_table) * bs)):
                self.kv[(seq.block_table[pos // bs], pos % bs)] = (pos, digests[pos])
        for seq, _, ctx in work:
            digests = self._digests(seq)
            for pos in range(min(ctx, len(seq.block_table) * bs)):
                slot = (seq.block_table[pos // bs], pos % bs)
                if self.kv.get(slot) != (pos, digests[pos]):
                    check(
                        False,
                        "kv",
                        f"seq {seq.seq_id} attends to token {pos} in block {slot[0]} slot "
                        f"{slot[1]}, which holds {self.kv.get(slot)} (another prefix)",
                    )
                    break
        tokens = []
        for seq in batch.sampled_seqs:
            position = seq.num_tokens - seq.num_prompt_tokens
            script = self.scripts[seq.seq_id]
            check(position < len(script), "completion", f"seq {seq.seq_id} sampled past max_tokens")
            tokens.append(script[min(position, len(script) - 1)])
        return StepOutput(token_ids=tokens, duration_s=0.0, padded_batch_size=len(batch.seqs))

    def describe(self) -> dict[str, Any]:
        return {"executor": "scripted-test", "device": "none"}

    def close(self) -> None:
        pass


# What the ``rebuild it:`` code needs, so a failure pastes as a test that runs as it is.
REBUILD_IMPORTS = ("from engine import Config; "
                   "from replay.testing import RequestSpec, Workload, run_workload")


@dataclass
class Run:
    """One workload run: the engine, what the test observed, and the violations it found."""

    workload: Workload
    core: EngineCore | None = None
    sink: Any = None
    seqs: dict[int, tuple[RequestSpec, Sequence]] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=dict)
    steps: int = 0
    preempted: set[int] = field(default_factory=set)
    aborted: set[int] = field(default_factory=set)
    # (free blocks, [(seq id, tokens, blocks) of each running sequence]) when the last step
    # launched: what decides whether the next step may overlap it.
    at_launch: tuple[int, list[tuple[int, int, int]]] | None = None

    def check(self, ok: bool, prop: str, message: str) -> None:
        if not ok:
            self.violations.setdefault(prop, []).append(message)

    def decisions(self) -> dict[str, dict[str, list]]:
        """The recorded event stream without its measured columns (times, durations), by kind:
        what two runs of one workload must agree on (``run_workload(w, overlap=True,
        observe=False).decisions() == run_workload(w).decisions()``)."""
        tables = self.sink.tables
        return {kind: decision_columns(kind, tables[kind]) for kind in EVENT_KINDS}

    def raise_violations(self) -> None:
        if self.violations:
            lines = [f"properties violated: {', '.join(sorted(self.violations))}"]
            lines.append(f"  workload: {self.workload.describe()}")
            for prop, messages in sorted(self.violations.items()):
                lines += [f"  {prop}: {m}" for m in messages[:3]]
            lines.append("  rebuild it: " + self.workload.code().replace("\n", "\n  "))
            lines.append(f"  with: {REBUILD_IMPORTS}")
            raise PropertyViolations("\n".join(lines))


def decision_columns(kind: str, cols: dict[str, list]) -> dict[str, list]:
    """A recorded table without its measured columns (what replay must reproduce)."""
    measured = MEASURED_COLUMNS.get(kind, frozenset())
    return {
        name: [list(v) if isinstance(v, (list, tuple, np.ndarray, array)) else v for v in values]
        for name, values in cols.items()
        if name not in measured
    }
