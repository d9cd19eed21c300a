"""An imported Mooncake window run on the CPU tiny model: prefix-cache hits (block_hit events)
exactly where the trace shares ``hash_ids``, none where it does not; the importer's 512-token
ids re-chunked into the engine's 16-token blocks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from engine import LLM
from replay.cli.live import run_workload
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

MOONCAKE = Path(__file__).parents[3] / "traces/workloads/mooncake_synthetic_trace.jsonl"
WINDOW = (315.0, 317.9)  # seconds: 8 prompts of 64+ tokens, 2 of them sharing a first block
CLIP = 64  # the first 64 tokens of each prompt's first 512-token block: a short CPU run
BLOCK = 16


def expected_sharing() -> list[bool]:
    """Per prompt of CLIP+ tokens in the window (read here from the raw JSON): whether its first
    block's id appeared in an earlier such prompt of the window."""
    seen: set[int] = set()
    out = []
    for line in MOONCAKE.read_text().splitlines():
        row = json.loads(line)
        if WINDOW[0] <= row["timestamp"] / 1000 < WINDOW[1] and row["input_length"] >= CLIP:
            out.append(row["hash_ids"][0] in seen)
            seen.add(row["hash_ids"][0])
    return out


def test_an_imported_mooncake_window_hits_the_prefix_cache_where_hash_ids_repeat() -> None:
    counts = ImportCounts()
    options = ImportOptions(start_s=WINDOW[0], end_s=WINDOW[1], time_scale=0.0,
                            max_prompt_len=CLIP, over_length="clip", temperature=0.0)
    # Answers shortened to one token: the test is about prompts, and one sequence at a time
    # (max_num_seqs=1) makes each prefill finish before the next request is scheduled.
    # Shorter prompts are left out: they would share only part of a block.
    imported = list(import_workload(MOONCAKE, "mooncake", options, counts))
    requests = [dataclasses.replace(r, max_tokens=1) for r in imported if r.prompt_len == CLIP]
    sharing = expected_sharing()
    assert len(requests) == len(sharing) == counts.changed[f"prompt clipped to {CLIP} tokens"]
    assert sum(sharing) == 2 and len(sharing) == 8
    llm = LLM(None, kvcache_block_size=BLOCK, num_kvcache_blocks=len(requests) * CLIP // BLOCK,
              max_model_len=CLIP + BLOCK, max_num_batched_tokens=CLIP + BLOCK, max_num_seqs=1)
    try:
        seqs = run_workload(llm, requests, use_tqdm=False)
        hit_seqs = llm.core.events.tables["block_hit"]["seq_id"]
    finally:
        llm.close()
    hits = [0] * len(seqs)
    index_of = {seq.seq_id: i for i, seq in enumerate(seqs)}
    for seq_id in hit_seqs:
        hits[index_of[int(seq_id)]] += 1
    for index, shares in enumerate(sharing):
        if shares:  # the whole prompt is cached but its last block (its last token is recomputed)
            assert hits[index] >= CLIP // BLOCK - 1, (index, hits[index])
        else:
            assert hits[index] == 0, (index, hits[index])
