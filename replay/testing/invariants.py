"""An invariant checker over any event stream: a recording, a replay, a simulation, a test run.

``check_events(header, tables)`` replays the events in ``event_id`` order into a shadow of the
engine's state (each block's refcount and holders, the free list, each sequence's tokens, block
table and computed count, the queues) and checks, naming each violation:

- ``accounting``: every ``free_blocks`` field equals the shadow's free count; a block is free
  exactly when no sequence holds it; ``block_allocated`` takes a free block.
- ``refcounts``: each ``refcount`` field equals the number of block tables holding the block.
- ``double_free``: a sequence releases only blocks it holds, each once, at their logical index.
- ``hash_chains``: ``block_hashed`` and ``block_hit`` carry the xxhash64 chain of the sequence's
  own tokens (parent = the previous block's hash); a hit is on a block holding that hash; a block
  is hashed once per holding (no duplicated ``block_hashed``), and only once its KV is computed;
  with prefix caching off nothing is hashed or hit.
- ``budgets``: at most ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens a step.
- ``batch_fields``: ``batch_scheduled`` agrees with its ``seq_scheduled`` rows and with the
  queues; each scheduled sequence is running, starts at its computed count, has a block for
  every token of its context (no under-counted claim), and the kind label fits the work.
- ``preemption``: ``preempted`` follows the release of every block the sequence held and
  reports its token count; the sequence goes back to waiting. A preemption is needed: the
  sequence it makes room for (the victim itself when ``for_seq_id`` is none) has a next token
  that starts a new block, and no block was free before the victim's release.
- ``sampling``: tokens are sampled only for scheduled sequences whose context reaches their end.
- ``finish``: ``request_finished`` reports the sampled count, the output hash of the sampled
  tokens and a reason that fits them; a finished request holds no block; it finishes once.
- ``completion`` (complete streams): every request finishes, or is aborted or rejected.
- ``starvation`` (``bounded=True``): every request finishes within the work bound of the stream
  (last arrival + 2 + the prompt and completion tokens of every admitted request, in steps).
- ``priorities`` (policy ``priority``): no request is admitted while one of a better priority
  stays waiting, and a preemption never takes a better request than the one needing the room.
- ``eviction`` (built-in policies): a fresh block is the free block its eviction order
  (``Config.eviction``) ranks first.

These are the checks "every event field agrees with the state it reports": a wrong refcount in
``block_freed``, a duplicated ``block_hashed`` or an under-counted block claim all fail here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.config import Config
from engine.policy import BUILTIN_POLICIES, release_order
from engine.policy import EVICTION_ORDERS as _ORDERS
from engine.scheduler import output_hash
from replay.testing.block_ledger import BlockLedger
from replay.testing.report import InvariantReport, InvariantViolations, Violation
from replay.testing.shadow import ShadowSeq
from tracing.schema import EVENT_KINDS, NO_HASH, NO_SEQ


def _stream(tables: dict[str, dict[str, Any]]) -> list[tuple[int, str, int]]:
    """(event id, kind, row) of every event, in emission order."""
    order = []
    for kind in EVENT_KINDS:
        ids = np.asarray(tables[kind]["event_id"]).tolist()
        order += [(eid, kind, row) for row, eid in enumerate(ids)]
    order.sort()
    return order


class _Checker:
    def __init__(self, header: dict[str, Any], tables: dict[str, dict[str, Any]]) -> None:
        from replay.replayer import config_from_header

        self.config: Config = config_from_header(header)
        c = self.config
        self.bs, self.seed, self.eos = c.kvcache_block_size, c.hash_seed, c.eos
        self.tables = {k: {n: list(np.asarray(v).tolist()) if not isinstance(v, list) else v
                           for n, v in cols.items()} for k, cols in tables.items()}
        self.report = InvariantReport()
        builtin = c.policy in BUILTIN_POLICIES
        order = _ORDERS.get(c.eviction, release_order) if builtin else None
        self.pool = BlockLedger(c.num_kvcache_blocks, order)
        self.last_seen: dict[int, int] = {}  # seq -> the last step it was scheduled
        self.seqs: dict[int, ShadowSeq] = {}
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.step_batch: dict[int, tuple[int, int]] = {}  # seq -> (new, context) this step
        self.step_admitted: list[int] = []
        self.step_victims: list[tuple[int, int]] = []
        self.waiting_at_start: list[int] = []
        self.current_step = -1
        self.eid = self.step = 0

    def fail(self, ok: bool, name: str, message: str) -> None:
        if not ok:
            self.report.violations.append(Violation(name, self.eid, self.step, message))

    def row(self, kind: str, row: int) -> dict[str, Any]:
        return {name: values[row] for name, values in self.tables[kind].items()}

    def run(self, complete: bool, bounded: bool) -> InvariantReport:
        stream = _stream(self.tables)
        self.report.num_events = len(stream)
        for eid, kind, index in stream:
            r = self.row(kind, index)
            self.eid, self.step = eid, int(r["step"])
            if self.step != self.current_step:
                self.current_step = self.step
                self.waiting_at_start = list(self.waiting)
                self.step_admitted, self.step_victims = [], []
            getattr(self, f"on_{kind}")(r)
        if complete:
            self.at_end(bounded)
        return self.report

    # --- requests -----------------------------------------------------------------------------
    def on_request_added(self, r: dict[str, Any]) -> None:
        sid = int(r["seq_id"])
        self.fail(sid not in self.seqs, "finish", f"seq {sid} added twice")
        self.seqs[sid] = ShadowSeq(sid, list(r["prompt_token_ids"]), int(r["prompt_len"]),
                              int(r["max_tokens"]), bool(r["ignore_eos"]),
                              int(r.get("priority", 0)), self.step)
        self.waiting.append(sid)

    def on_request_finished(self, r: dict[str, Any]) -> None:
        sid, reason = int(r["seq_id"]), r["reason"]
        seq = self.seqs[sid]
        self.fail(seq.status != "finished", "finish", f"seq {sid} finished twice")
        self.fail(not seq.table, "finish", f"seq {sid} finished holding blocks {seq.table}")
        completion = seq.tokens[seq.prompt_len:]
        self.fail(int(r["num_completion_tokens"]) == len(completion) == seq.sampled, "finish",
                  f"seq {sid}: {r['num_completion_tokens']} completion tokens reported, "
                  f"{seq.sampled} sampled")
        if r["output_hash"] != NO_HASH or completion:
            self.fail(int(r["output_hash"]) == output_hash(completion), "finish",
                      f"seq {sid}: output hash is not the hash of its sampled tokens")
        if reason == "eos":
            self.fail(bool(completion) and completion[-1] == self.eos and not seq.ignore_eos,
                      "finish", f"seq {sid} finished eos on {completion[-1:]}")
        elif reason == "length":
            long = len(completion) >= seq.max_tokens or len(seq.tokens) >= self.config.max_model_len
            self.fail(long, "finish", f"seq {sid} finished length after {len(completion)} tokens")
        for queue in (self.waiting, self.running):
            if sid in queue:
                queue.remove(sid)
        seq.status, seq.released, seq.freed, seq.reason = "finished", 0, 0, reason

    # --- blocks -------------------------------------------------------------------------------
    def _free_count(self, r: dict[str, Any], what: str) -> None:
        free = len(self.pool.free)
        self.fail(int(r["free_blocks"]) == free, "accounting",
                  f"{what} reports {r['free_blocks']} free blocks, {free} are free")

    def _take(self, seq: ShadowSeq, r: dict[str, Any], what: str) -> int:
        block, index = int(r["block_id"]), int(r["logical_index"])
        self.fail(index == len(seq.table), "batch_fields",
                  f"seq {seq.seq_id} {what} block {block} at index {index}, holds {len(seq.table)}")
        seq.table.append(block)
        if seq.status == "waiting" and index == 0:
            self._admitted(seq)
        return block

    def _admitted(self, seq: ShadowSeq) -> None:
        seq.status = "running"
        if seq.seq_id in self.waiting:
            self.waiting.remove(seq.seq_id)
        self.running.append(seq.seq_id)
        self.step_admitted.append(seq.seq_id)

    def on_block_allocated(self, r: dict[str, Any]) -> None:
        seq = self.seqs[int(r["seq_id"])]
        block, pool = int(r["block_id"]), self.pool
        self.fail(block in pool.free and pool.refs[block] == 0, "accounting",
                  f"seq {seq.seq_id} allocated block {block}, which is in use")
        best = pool.next_evicted()
        self.fail(best is None or block == best, "eviction",
                  f"block {block} handed out; {self.config.eviction} order ranks {best} first")
        pool.take(block)
        pool.block_hash[block] = NO_HASH  # a reused cached block forgets its contents
        self._take(seq, r, "allocated")
        self.fail(int(r["refcount"]) == pool.refs[block] == 1, "refcounts",
                  f"block {block} allocated, refcount {r['refcount']}, holders {pool.refs[block]}")
        self._free_count(r, "block_allocated")

    def on_block_hit(self, r: dict[str, Any]) -> None:
        seq = self.seqs[int(r["seq_id"])]
        block, index = int(r["block_id"]), int(r["logical_index"])
        self.fail(self.config.enable_prefix_caching, "hash_chains",
                  "a prefix-cache hit with prefix caching off")
        want = seq.block_hash(index, self.bs, self.seed) if (index + 1) * self.bs <= len(
            seq.tokens) else None
        pool = self.pool
        self.fail(int(r["hash"]) == want == pool.block_hash[block], "hash_chains",
                  f"seq {seq.seq_id} hit block {block} (hash {pool.block_hash[block]}) as "
                  f"{r['hash']}; its tokens hash to {want}")
        pool.take(block)
        self._take(seq, r, "hit")
        seq.hashed.add(index)
        seq.computed = (index + 1) * self.bs
        self.fail(int(r["refcount"]) == pool.refs[block], "refcounts",
                  f"hit on block {block}: refcount {r['refcount']}, holders {pool.refs[block]}")
        self._free_count(r, "block_hit")

    def on_block_hashed(self, r: dict[str, Any]) -> None:
        seq = self.seqs[int(r["seq_id"])]
        block, index = int(r["block_id"]), int(r["logical_index"])
        self.fail(self.config.enable_prefix_caching, "hash_chains",
                  f"seq {seq.seq_id} hashed block {block} with prefix caching off")
        self.fail(index not in seq.hashed, "hash_chains",
                  f"seq {seq.seq_id} block {index} hashed twice (duplicated block_hashed)")
        seq.hashed.add(index)
        self.fail(index < len(seq.table) and seq.table[index] == block, "hash_chains",
                  f"seq {seq.seq_id} hashed block {block} at index {index} of {seq.table}")
        full = (index + 1) * self.bs <= len(seq.tokens)
        want = seq.block_hash(index, self.bs, self.seed) if full else None
        parent = seq.block_hash(index - 1, self.bs, self.seed) if index else NO_HASH
        self.fail(int(r["hash"]) == want and int(r["parent_hash"]) == parent, "hash_chains",
                  f"seq {seq.seq_id} block {index} hashed {r['hash']} (parent {r['parent_hash']});"
                  f" its tokens chain to {want} (parent {parent})")
        self.pool.block_hash[block] = int(r["hash"])

    def on_block_freed(self, r: dict[str, Any]) -> None:
        seq = self.seqs[int(r["seq_id"])]
        block, index = int(r["block_id"]), int(r["logical_index"])
        held = 0 <= index < len(seq.table) and seq.table[index] == block
        self.fail(held, "double_free",
                  f"seq {seq.seq_id} released block {block} at index {index}, holds {seq.table}")
        pool = self.pool
        if held:
            seq.table[index] = -1
            pool.release(block, self.last_seen.get(seq.seq_id, -1))
            seq.freed += pool.refs[block] == 0
        seq.released += 1
        self.fail(pool.refs[block] >= 0, "double_free", f"block {block} released below 0")
        self.fail(int(r["refcount"]) == pool.refs[block], "refcounts",
                  f"block {block} freed with refcount {r['refcount']}, holders {pool.refs[block]}")
        self._free_count(r, "block_freed")
        if all(b < 0 for b in seq.table):
            seq.table, seq.hashed, seq.computed = [], set(), 0

    def on_preempted(self, r: dict[str, Any]) -> None:
        seq = self.seqs[int(r["seq_id"])]
        self.fail(not seq.table and int(r["blocks_released"]) == seq.released, "preemption",
                  f"seq {seq.seq_id} preempted reporting {r['blocks_released']} blocks, released "
                  f"{seq.released}, still holds {seq.table}")
        self.fail(int(r["num_tokens"]) == len(seq.tokens), "preemption",
                  f"seq {seq.seq_id} preempted at {r['num_tokens']} tokens, has {len(seq.tokens)}")
        for_seq = int(r["for_seq_id"])
        self._needed(seq, for_seq)
        self.step_victims.append((seq.seq_id, for_seq))
        if seq.seq_id in self.running:
            self.running.remove(seq.seq_id)
        self.waiting.insert(0, seq.seq_id)
        seq.status, seq.released, seq.freed, seq.computed = "waiting", 0, 0, 0

    def _needed(self, victim: ShadowSeq, for_seq: int) -> None:
        """A decode preempts only when its next token starts a block and none is free."""
        needy = victim if for_seq == NO_SEQ else self.seqs[for_seq]
        blocks = victim.released if needy is victim else len(needy.table)
        free = len(self.pool.free) - victim.freed  # before the victim's release
        self.fail(len(needy.tokens) > blocks * self.bs and free == 0, "preemption",
                  f"seq {victim.seq_id} preempted for seq {needy.seq_id} ({len(needy.tokens)} "
                  f"tokens in {blocks} blocks of {self.bs}) with {free} blocks free")

    # --- steps --------------------------------------------------------------------------------
    def on_batch_scheduled(self, r: dict[str, Any]) -> None:
        c = self.config
        self.batch = r
        self.step_batch = {}
        self.fail(int(r["num_seqs"]) <= c.max_num_seqs, "budgets",
                  f"{r['num_seqs']} sequences, max_num_seqs={c.max_num_seqs}")
        self.fail(int(r["num_batched_tokens"]) <= c.max_num_batched_tokens, "budgets",
                  f"{r['num_batched_tokens']} tokens, max_num_batched_tokens="
                  f"{c.max_num_batched_tokens}")
        self.fail((int(r["num_waiting"]), int(r["num_running"])) == (len(self.waiting),
                  len(self.running)), "batch_fields",
                  f"reports {r['num_waiting']} waiting / {r['num_running']} running, the queues "
                  f"hold {len(self.waiting)} / {len(self.running)}")
        self._free_count(r, "batch_scheduled")
        self._check_priorities()

    def on_seq_scheduled(self, r: dict[str, Any]) -> None:
        seq = self.seqs[int(r["seq_id"])]
        new, cached, ctx = int(r["num_new_tokens"]), int(r["num_cached_tokens"]), int(
            r["context_len"])
        self.fail(seq.status == "running" and seq.seq_id not in self.step_batch, "batch_fields",
                  f"seq {seq.seq_id} scheduled while {seq.status} (or twice)")
        self.fail(cached == seq.computed and ctx == cached + new and 1 <= new and ctx <= len(
            seq.tokens), "batch_fields",
                  f"seq {seq.seq_id}: cached {cached} + new {new} = context {ctx}; computed "
                  f"{seq.computed} of {len(seq.tokens)} tokens")
        self.fail(len(seq.table) * self.bs >= ctx, "batch_fields",
                  f"seq {seq.seq_id}: context {ctx} in {len(seq.table)} blocks of {self.bs}")
        for index in seq.hashed:
            self.fail((index + 1) * self.bs <= ctx, "hash_chains",
                      f"seq {seq.seq_id} block {index} hashed before its KV is computed ({ctx})")
        self.step_batch[seq.seq_id] = (new, ctx)
        self.last_seen[seq.seq_id] = self.step
        seq.computed = ctx
        if len(self.step_batch) == int(self.batch["num_seqs"]):
            self._end_of_batch()

    def _end_of_batch(self) -> None:
        r, work = self.batch, self.step_batch.values()
        self.fail(sum(n for n, _ in work) == int(r["num_batched_tokens"]), "batch_fields",
                  f"seq_scheduled rows sum to {sum(n for n, _ in work)} tokens, batch says "
                  f"{r['num_batched_tokens']}")
        if r["kind"] == "decode":
            decodes = all(n == 1 and ctx == len(self.seqs[s].tokens) and s not in
                          self.step_admitted for s, (n, ctx) in self.step_batch.items())
            self.fail(decodes, "batch_fields", f"a decode batch of {dict(self.step_batch)}")

    def on_model_step(self, r: dict[str, Any]) -> None:
        pass

    def on_token_sampled(self, r: dict[str, Any]) -> None:
        seq = self.seqs[int(r["seq_id"])]
        work = self.step_batch.pop(seq.seq_id, None)
        self.fail(work is not None and work[1] == len(seq.tokens), "sampling",
                  f"seq {seq.seq_id} sampled a token, scheduled as {work} with {len(seq.tokens)}")
        seq.tokens.append(int(r["token_id"]))
        seq.sampled += 1

    def _check_priorities(self) -> None:
        if self.config.policy != "priority":
            return
        prio = {s: self.seqs[s].priority for s in self.seqs}
        left = [s for s in self.waiting_at_start if s in self.waiting]
        for sid in self.step_admitted:
            better = [s for s in left if prio[s] < prio[sid]]
            self.fail(not better, "priorities",
                      f"seq {sid} (priority {prio[sid]}) admitted while {better} wait")
        for victim, for_seq in self.step_victims:
            if for_seq != NO_SEQ:
                self.fail(prio[victim] >= prio[for_seq], "priorities",
                          f"seq {victim} (priority {prio[victim]}) preempted for seq {for_seq} "
                          f"(priority {prio[for_seq]})")

    def at_end(self, bounded: bool) -> None:
        c = self.config
        unfinished = [s for s, q in self.seqs.items() if q.status != "finished"]
        self.fail(not unfinished, "completion", f"requests never finished: {unfinished[:8]}")
        if not bounded or not self.seqs:
            return
        last = max(q.arrival_step for q in self.seqs.values())
        bound = last + 2 + sum(q.prompt_len + min(q.max_tokens, max(1, c.max_model_len
                                                                     - q.prompt_len))
                               for q in self.seqs.values() if q.reason != "rejected")
        finish_steps = {int(s): int(st) for s, st in zip(self.tables["request_finished"]["seq_id"],
                                                          self.tables["request_finished"]["step"])}
        late = [s for s, st in finish_steps.items() if st > bound]
        self.fail(not late, "starvation", f"requests finished after step {bound}: {late[:8]}")


def check_events(
    header: dict[str, Any],
    tables: dict[str, dict[str, Any]],
    complete: bool = True,
    bounded: bool = True,
) -> InvariantReport:
    """Check every invariant of the module docstring over one event stream.

    ``header`` and ``tables``: a ``MemorySink``'s, or a trace's (``check_trace``). ``complete``:
    the stream holds the whole run (checks that every request finished); ``bounded``: its
    arrivals were bounded, so every request must finish within the work bound.
    """
    checker = _Checker(header, tables)
    return checker.run(complete, bounded)


def check_trace(trace: Any, bounded: bool = False) -> InvariantReport:
    """``check_events`` over a trace directory (or a trace opened with ``read_trace``)."""
    from replay.recorded import from_trace
    from tracing.reader import read_trace

    if isinstance(trace, (str, bytes)) or hasattr(trace, "__fspath__"):
        trace = read_trace(trace)
    events = from_trace(trace)
    return check_events(events.header, events.tables, events.complete, bounded)


def assert_invariants(header: dict[str, Any], tables: dict[str, dict[str, Any]],
                      **kwargs: Any) -> InvariantReport:
    """``check_events``, raising ``InvariantViolations`` with the report when one fails."""
    report = check_events(header, tables, **kwargs)
    if not report.ok:
        raise InvariantViolations(report.report())
    return report
