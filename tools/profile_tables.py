"""Which block tables a device profile's decodes ran over: its points replayed, in the order it
timed them, through the runner's decode staging (``DecodeBuffers``, on the CPU), each point's
sequences numbered as the profiler numbered them before synthetic ids were made unique (every
point's rows ``FIRST_CALIBRATION_SEQ_ID - i``; ``--unique-ids``: as it numbers them now).

The buffers keep a decode row's block table by sequence id and write only the blocks added
since, so a point reusing the last point's ids ran over that point's tables. Prints, per decode
row of the profile, whether the staged tables were its own, and the KV tokens its rows claim to
re-read (``prefix_groups``, ``prefix_tokens``) against those the staged tables re-read (a block
in k rows' tables read k - 1 more times). docs/BENCHMARKS.md §7h.

    PYTHONPATH=. .venv/bin/python tools/profile_tables.py PROFILE.json [--unique-ids] [--all]
"""

from __future__ import annotations

import argparse
import collections
import sys
from types import SimpleNamespace

import torch

from engine.calibration import FIRST_CALIBRATION_SEQ_ID
from engine.graph_sizes import MAX_GRAPH_BATCH, decode_graph_sizes, padded_decode_size
from engine.profiling import load_profile, profile_grid
from engine.runner.decode_graphs import DecodeBuffers


def rereads(tables: list[list[int]], block_size: int) -> int:
    """KV tokens read again: each block's reads after its first, over the rows' tables."""
    blocks = [block for table in tables for block in table]
    return (len(blocks) - len(set(blocks))) * block_size


def staged_rows(profile: dict, unique_ids: bool) -> list[dict]:
    """Per timed decode row of ``profile``: label, whether every timed run staged its own
    tables, and the claimed and staged re-reads (tokens). A prefill or mixed point clears the
    buffers' tables, as the runner does."""
    config = SimpleNamespace(**profile["config"])
    block = config.kvcache_block_size
    points = collections.defaultdict(list)
    for point in profile_grid(config, lambda point: True):  # every eager copy, by label
        points[(point.label, point.eager)].append(point)
    max_batch = min(config.max_num_seqs, MAX_GRAPH_BATCH)
    buffers = DecodeBuffers(max_batch, -(-config.max_model_len // block), block,
                            torch.device("cpu"))
    sizes = decode_graph_sizes(max_batch)
    out = []
    for row in profile["rows"]:
        point = points[(row["label"], row["eager"])][0]
        if point.kind != "decode":
            buffers.invalidate()
            continue
        batch = point.batch(block)
        if not unique_ids:
            for i, seq in enumerate(batch.seqs):
                seq.seq_id = FIRST_CALIBRATION_SEQ_ID - i
        own = point.block_tables(block)
        padded = len(own) if point.eager else padded_decode_size(sizes, len(own)) or len(own)
        staged = []
        for _ in range(profile["repeats"] + 1):  # the untimed run, then the timed ones
            buffers.stage_sequences(batch.seqs, batch.context_lens, padded,
                                    config.num_kvcache_blocks)
            staged.append([buffers.block_tables[i, : len(t)].tolist() for i, t in enumerate(own)])
        timed = staged[1:]
        out.append({"label": row["label"], "eager": row["eager"],
                    "own": all(tables == own for tables in timed),
                    "claimed": rereads(own, block), "staged": rereads(timed[-1], block),
                    "context": row["decode_context_tokens"], "duration_s": row["duration_s"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--unique-ids", action="store_true",
                        help="number each point's sequences as the profiler does now")
    parser.add_argument("--all", action="store_true", help="every decode row, not a summary")
    args = parser.parse_args(argv)
    rows = staged_rows(load_profile(args.profile), args.unique_ids)
    for name, subset in (("graph", [r for r in rows if not r["eager"]]),
                         ("eager", [r for r in rows if r["eager"]])):
        print(f"{name} decodes: {len(subset)}, over tables not their own: "
              f"{sum(not r['own'] for r in subset)}, re-reading KV: "
              f"{sum(r['staged'] > 0 for r in subset)}")
    print("| decode row | own tables | claimed re-read share | staged re-read share | ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        if args.all or r["claimed"]:
            print(f"| {r['label']} | {'yes' if r['own'] else 'no'} | "
                  f"{r['claimed'] / r['context']:.3f} | {r['staged'] / r['context']:.3f} | "
                  f"{1e3 * r['duration_s']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
