"""KV-cache events in vLLM's map form: from any trace (``export --format vllm-kv-events``),
checked against vLLM's published field lists and against the trace's own block events."""

from __future__ import annotations

from pathlib import Path

import pytest

msgpack = pytest.importorskip("msgpack")

from _trace_helpers import Req, Workload, run_engine  # noqa: E402

from replay.cli.main import main  # noqa: E402
from tracing import read_trace  # noqa: E402
from tracing.kv_events import KVEventTap, trace_kv_batches  # noqa: E402
from tracing.recorder import ParquetRecorder  # noqa: E402

TRACES = Path(__file__).resolve().parents[2] / "traces"

# vLLM's structs (vllm/distributed/kv_events.py, vllm-project/vllm at 0181ea3): msgspec with
# tag=True (the "type" key) and omit_defaults=True, so fields without a default are always
# present and those with one may be left out.
VLLM_FIELDS = {
    "BlockStored": ({"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                     "medium", "lora_name"},
                    {"extra_keys", "group_idx", "kv_cache_spec_kind",
                     "kv_cache_spec_sliding_window"}),
    "BlockRemoved": ({"block_hashes", "medium"}, {"group_idx"}),
    "AllBlocksCleared": (set(), set()),
}
VLLM_BATCH_FIELDS = ({"ts", "events"}, {"data_parallel_rank"})


def check_vllm_batch(batch: dict) -> None:
    """A decoded EventBatch has exactly vLLM's fields, each event those of its type."""
    required, optional = VLLM_BATCH_FIELDS
    assert required <= set(batch) <= required | optional
    assert isinstance(batch["ts"], float)
    for event in batch["events"]:
        required, optional = VLLM_FIELDS[event["type"]]
        assert required <= set(event) - {"type"} <= required | optional, event
        for h in event.get("block_hashes", []):
            assert isinstance(h, int) and 0 <= h < 2**64
        if event["type"] == "BlockStored":
            assert event["medium"] == "GPU"
            assert len(event["token_ids"]) == event["block_size"]


def decode(path: Path) -> list[dict]:
    with open(path, "rb") as handle:
        return list(msgpack.Unpacker(handle, raw=False))


# Distinct prompts through a small pool: blocks are cached, shared (a repeated prompt) and
# evicted when their free block is taken for another prompt.
EVICTING = Workload(
    [Req([100 * (i % 7) + t for t in range(12)], max_tokens=5) for i in range(20)],
    num_blocks=16, block_size=4, max_num_seqs=2)


@pytest.fixture(scope="module")
def evicting_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A trace of EVICTING, and the batches a KV-event tap published live while recording it."""
    path = tmp_path_factory.mktemp("kv") / "t"
    published: list[dict] = []
    run_engine(EVICTING, KVEventTap(ParquetRecorder(path, flush_steps=3), published.append))
    return path, published


@pytest.mark.parametrize("source", ["demo", "evicting"])
def test_export_writes_vllm_batches_consistent_with_the_trace(
        tmp_path: Path, evicting_trace: tuple[Path, list[dict]], source: str) -> None:
    """From the committed demo trace (prefix sharing, preemptions) and a run that evicts:
    vLLM's fields only; the pool starts cleared; a hash is removed only while stored, a parent
    is stored before its child (it may have left the cache since: the engine of the demo trace,
    recorded before ``prefix_cache_duplicates``, dropped a hash when its indexed block was handed
    out, though a duplicate still held it, and cached a child of that duplicate all the same),
    never more hashes stored than the pool has blocks; every stored hash is one the trace
    hashed."""
    src = TRACES / "cpu-tiny-demo" if source == "demo" else evicting_trace[0]
    out = tmp_path / "kv.msgpack"
    assert main(["export", str(src), "--format", "vllm-kv-events", "--out", str(out)]) == 0
    batches = decode(out)
    for batch in batches:
        check_vllm_batch(batch)
    assert batches[0]["events"] == [{"type": "AllBlocksCleared"}]
    trace = read_trace(src)
    hashed = {h & (2**64 - 1) for h in trace.columns("block_hashed")["hash"].tolist()}
    stored: set[int] = set()
    ever_stored: set[int] = set()
    kinds = {"BlockStored": 0, "BlockRemoved": 0}
    for batch in batches[1:]:
        for event in batch["events"]:
            kinds[event["type"]] += 1
            (h,) = event["block_hashes"]
            if event["type"] == "BlockStored":
                assert h in hashed and h not in stored
                parent = event["parent_block_hash"]
                assert parent is None or parent in ever_stored
                stored.add(h)
                ever_stored.add(h)
            else:
                assert h in stored
                stored.discard(h)
            assert len(stored) <= trace.header["num_blocks"]
    assert kinds["BlockStored"] > 0
    if source == "evicting":
        assert kinds["BlockRemoved"] > 0
    assert [b["ts"] for b in batches] == sorted(b["ts"] for b in batches)


def test_the_live_tap_publishes_what_the_export_writes(
        evicting_trace: tuple[Path, list[dict]]) -> None:
    """Step by step while recording (segments drained every 3 steps) the tap publishes the
    same events, in the same order, as the export of the finished trace."""
    path, published = evicting_trace
    for batch in published:
        check_vllm_batch(batch)
    live = [e for b in published for e in b["events"]]
    exported = [e for b in trace_kv_batches(read_trace(path)) for e in b["events"]]
    assert live == exported
    assert any(e["type"] == "BlockRemoved" for e in live)


@pytest.mark.parametrize("source", ["demo", "evicting"])
def test_stored_tokens_rebuild_the_hash_chain(evicting_trace: tuple[Path, list[dict]],
                                              source: str) -> None:
    """A BlockStored's tokens and parent hash give its hash under the trace's hash seed (what
    a router that rehashes does)."""
    from engine.block_hash import chain_hash

    trace = read_trace(TRACES / "cpu-tiny-demo" if source == "demo" else evicting_trace[0])
    seed = trace.header["hash_seed"]
    for batch in trace_kv_batches(trace):
        for event in batch["events"]:
            if event["type"] != "BlockStored":
                continue
            parent = event["parent_block_hash"]
            signed = -1 if parent is None else (parent - 2**64 if parent >= 2**63 else parent)
            expected = chain_hash(event["token_ids"], signed, seed) & (2**64 - 1)
            assert event["block_hashes"] == [expected]


def _view_after(batches: list[dict], view: set[int]) -> None:
    """Apply published batches to a router's view of the cached hashes."""
    for batch in batches:
        for event in batch["events"]:
            if event["type"] == "AllBlocksCleared":
                view.clear()
            elif event["type"] == "BlockStored":
                view.update(event["block_hashes"])
            else:
                view.difference_update(event["block_hashes"])


# Two identical prompts: the second hits the first's blocks but its last, which it recomputes (a
# duplicate); the first finishes early and its blocks are handed to new prompts, which (without
# ``prefix_cache_duplicates``) drops the hash though the second sequence still holds the copy.
DUPLICATES = Workload(
    [Req(list(range(1, 13)), max_tokens=1), Req(list(range(1, 13)), max_tokens=12)]
    + [Req([200 + 20 * i + t for t in range(12)], max_tokens=3) for i in range(6)],
    num_blocks=14, block_size=4, max_num_seqs=2)


@pytest.mark.parametrize("keep", [True, False], ids=["duplicates-kept", "one-block-per-hash"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("workload", ["duplicates", "evicting", "reference_like"])
def test_published_view_is_the_engines_prefix_cache(workload: str, overlap: bool,
                                                    keep: bool) -> None:
    """After every step, the hashes a router holds from the published KV events are exactly
    those the engine's prefix cache can hit (``BlockManager.hash_to_block_id``). With
    ``prefix_cache_duplicates`` a hash that a block in use holds is always among them; without
    it (traces recorded before the field) a hash leaves the cache when its indexed block is
    handed out, even while a duplicate still holds the tokens, and the stream says so then."""
    from _trace_helpers import reference_like

    from engine.engine_core import EngineCore
    from engine.executor import NullExecutor
    from tracing.schema import NO_HASH
    from tracing.sink import MemorySink

    chosen = {"duplicates": DUPLICATES, "evicting": EVICTING,
              "reference_like": reference_like(num_seqs=24)}[workload]
    published: list[dict] = []
    mismatches: list[tuple[int, set[int], set[int]]] = []
    lost: list[int] = []  # steps where a block in use held a hash the cache no longer had
    view: set[int] = set()
    cores: list[EngineCore] = []

    class Checking(KVEventTap):
        def on_step_end(self, buffer):  # type: ignore[no-untyped-def]
            super().on_step_end(buffer)
            _view_after(published, view)
            published.clear()
            core = cores[0]
            bm = core.scheduler.block_manager
            cached = {h & (2**64 - 1) for h in bm.hash_to_block_id}
            if cached != view:
                mismatches.append((core.step_index, view - cached, cached - view))
            in_use = {b.hash & (2**64 - 1) for b in bm.blocks
                      if b.ref_count and b.hash != NO_HASH}
            if not in_use <= cached:
                lost.append(core.step_index)

    config = chosen.config().replace(prefix_cache_duplicates=keep)
    core = EngineCore(config, NullExecutor(chosen.num_blocks, vocab_size=1000, overlap=overlap),
                      sink=Checking(MemorySink(), published.append),
                      header={"model": {"architecture": "null"}, "device": "cpu: test"})
    cores.append(core)
    for req in chosen.requests:
        core.add_request(req.prompt, _sampling(req))
    core.run_until_idle()
    core.close()
    assert mismatches == []
    if keep:
        assert lost == []
    elif workload == "duplicates":
        assert lost, "the workload no longer makes a live duplicate lose its hash"


def _sampling(req: Req):  # type: ignore[no-untyped-def]
    from engine.sampling_params import SamplingParams

    return SamplingParams(temperature=req.temperature, max_tokens=req.max_tokens,
                          ignore_eos=True)
