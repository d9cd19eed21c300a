"""An outside set of plausible bugs, written apart from ``tools/mutation_check.py``'s mutants.

The same runner (one exact substitution per mutant in a copy of the repository, the property
suite under the ``ci`` profile, killed when a test fails or times out), other bugs: config
switches not honoured, event fields that disagree with the state they report, boundaries,
maximality, the overlapped-step flags, budgets under chunking, the policy hooks.

    python tools/mutants_outside.py            # every mutant, table + score
    python tools/mutants_outside.py --list
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutation_check import BM, POLICY, SCHED, Mutant, main  # noqa: E402

CORE = "engine/engine_core.py"
OVERLAP = "engine/overlap_scheduler.py"

OUTSIDE: tuple[Mutant, ...] = (
    # --- block manager --------------------------------------------------------------------------
    Mutant("hashes_with_caching_off", BM,
           "        if not self.enable_prefix_caching:\n            return\n",
           "        if False:\n            return\n",
           "with prefix caching off, full blocks are still hashed and indexed"),
    Mutant("hits_with_caching_off", BM,
           "        if self.enable_prefix_caching:\n            while index < max_hits:",
           "        if True:\n            while index < max_hits:",
           "with prefix caching off, admission still takes prefix-cache hits"),
    Mutant("freed_refcount_recorded_before_decrement", BM,
           "            refcounts.append(block.ref_count)\n",
           "            refcounts.append(block.ref_count + 1)\n",
           "block_freed records the refcount before the release"),
    Mutant("freed_free_count_stale", BM,
           "            free_after.append(len(free))\n",
           "            free_after.append(len(free) - (block.ref_count == 0))\n",
           "block_freed records the free count before the block joined the free list"),
    Mutant("hit_free_count_stale", BM,
           "                    free_blocks=len(self.free_block_ids),\n                )\n"
           "                parent = block_hash",
           "                    free_blocks=len(self.free_block_ids) + 1,\n                )\n"
           "                parent = block_hash",
           "block_hit records the free count before the hit"),
    Mutant("allocated_index_off_by_one", BM,
           "block_ids, range(first, end), free_counts)",
           "block_ids, range(first + 1, end + 1), free_counts)",
           "block_allocated records the table length after the append as the logical index"),
    Mutant("registers_last_hashed_again", BM,
           "        index = seq.num_hashed_blocks\n        if index >= last_full:",
           "        index = max(0, seq.num_hashed_blocks - 1)\n        if index >= last_full:",
           "register_full_blocks re-hashes the last hashed block (duplicated block_hashed)"),
    Mutant("pending_hash_without_parent", BM,
           "                self.pending_hashes.append((seq, index, parent, row))",
           "                self.pending_hashes.append((seq, index, NO_HASH, row))",
           "a block completed by a pending token is hashed without its parent"),
    Mutant("cache_entry_moves_to_duplicate", BM,
           "        if held < 0 or blocks[held].ref_count == 0 or blocks[held].token_ids != chunk:",
           "        if True:",
           "a recomputed duplicate block takes over the cache entry of the live original"),
    Mutant("hits_one_block_short", BM,
           "        max_hits = num_full if num_full * block_size < seq.num_tokens else "
           "num_full - 1",
           "        max_hits = num_full - 1",
           "admission never serves the last full block of a prompt from the cache"),
    # --- scheduler ------------------------------------------------------------------------------
    Mutant("abort_leaves_waiting", SCHED,
           "        if seq in self.waiting:\n            self.waiting.remove(seq)",
           "        if seq in self.waiting:\n            pass",
           "an aborted waiting request stays queued"),
    Mutant("preempted_keeps_running_status", SCHED,
           "        seq.status = SequenceStatus.WAITING\n"
           "        self.prefilling.discard(seq.seq_id)\n        seq.num_preemptions += 1",
           "        self.prefilling.discard(seq.seq_id)\n        seq.num_preemptions += 1",
           "a preempted sequence keeps its running status"),
    Mutant("prompt_of_max_model_len_rejected", SCHED,
           "        if prompt_len > self.max_model_len:",
           "        if prompt_len >= self.max_model_len:",
           "a prompt of exactly max_model_len is rejected"),
    Mutant("cached_tokens_charged", SCHED,
           "            batch.prefill_tokens.append(query_len)\n"
           "            step._charge(query_len)",
           "            batch.prefill_tokens.append(query_len)\n"
           "            step._charge(query_len + seq.num_cached_tokens)",
           "admission counts cached prompt tokens against max_num_batched_tokens"),
    Mutant("running_count_wrong", SCHED,
           "            num_running=len(self.running),",
           "            num_running=len(seqs),",
           "batch_scheduled records the batch size as the number of running sequences"),
    Mutant("preempted_tokens_after_release", SCHED,
           "            num_tokens=seq.num_tokens,\n        )",
           "            num_tokens=seq.num_computed_tokens,\n        )",
           "preempted records the computed count (0 after the release) as its tokens"),
    Mutant("output_hash_over_prompt", SCHED,
           "        digest = output_hash(seq.completion_token_ids) if hashed else NO_HASH",
           "        digest = output_hash(seq.token_ids) if hashed else NO_HASH",
           "request_finished hashes the prompt with the completion"),
    Mutant("decode_cached_field_wrong", SCHED,
           "            cached = list(map((-1).__add__, context_lens))",
           "            cached = list(map((-2).__add__, context_lens))",
           "a decode's seq_scheduled under-reports its cached tokens"),
    Mutant("pending_token_checked_for_eos", SCHED,
           "            if token_id == eos and not seq.ignore_eos and token_id != PENDING_TOKEN:",
           "            if token_id == eos and not seq.ignore_eos:",
           "a placeholder token is compared with EOS (finishes as eos when eos is -1)"),
    # --- step and policies ----------------------------------------------------------------------
    Mutant("chunks_not_counted_as_sequences", POLICY,
           "        self._tokens_left -= tokens\n        self._seqs_left -= seqs",
           "        self._tokens_left -= tokens\n"
           "        self._seqs_left -= seqs if tokens == seqs else 0",
           "prompt chunks do not count against max_num_seqs (only decodes do)"),
    Mutant("priority_victim_best", POLICY,
           "        worst = max(range(len(candidates)),",
           "        worst = min(range(len(candidates)),",
           "priority preempts the best-priority request"),
    # --- engine core and overlapped steps -------------------------------------------------------
    Mutant("abort_keeps_overlap", CORE,
           "        self._deferred_last = False  # the next step's inputs come after this change",
           "        pass  # the next step's inputs come after this change",
           "the step after an abort is still flagged overlapped"),
    Mutant("forced_resolve_keeps_overlap", CORE,
           "        overlappable = self._deferred_last and not scheduler.schedule_needs_tokens()",
           "        overlappable = self._deferred_last",
           "a step that had to resolve its predecessor first is still flagged overlapped"),
    Mutant("idle_keeps_overlap", CORE,
           "        if batch is None:\n            self._deferred_last = False",
           "        if batch is None:\n            pass",
           "a step after an idle call is still flagged overlapped"),
    Mutant("defer_ignores_eos", OVERLAP,
           "        if self.eos >= 0 and not all(map(attrgetter(\"ignore_eos\"), "
           "batch.sampled_seqs)):",
           "        if False:",
           "a decode whose tokens may be EOS is deferred"),
    Mutant("claims_ignore_sampled_token", OVERLAP,
           "            seq.num_tokens + (seq.seq_id in sampled) > len(seq.block_table) * capacity",
           "            seq.num_tokens > len(seq.block_table) * capacity",
           "the deferral rule forgets the token the batch adds to each sampled sequence"),
    Mutant("needs_tokens_never", OVERLAP,
           "        return self.policy.mixed_batches and bool(self.waiting)",
           "        return False",
           "a mixed-batch policy admits from the prefix cache before pending hashes are in"),
)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], mutants_set=OUTSIDE))
