"""benchmarks/policies.py: the priority rule the H200 recording and the what-if share, and the
what-if rows' class split."""

from __future__ import annotations

from benchmarks import policies
from replay.testing.scripted import decision_columns
from replay.whatif.simulate import load_source, run_variant
from replay.workloads.store import WorkloadWriter, load_workload
from tracing.schema import EVENT_KINDS


def test_a_third_high_priority_by_a_seeded_rule() -> None:
    ranks = policies.priorities(256)
    assert ranks == policies.priorities(256)
    assert ranks.count(policies.HIGH) == 85 and ranks.count(policies.LOW) == 171
    assert ranks[:12] != sorted(ranks[:12]) or ranks[12:24] != sorted(ranks[12:24])


def test_the_workload_file_carries_the_priorities(tmp_path) -> None:
    """What the device records from is the reference workload with the rule's priorities."""
    path = tmp_path / "priority.jsonl"
    writer = WorkloadWriter(path)
    writer.write_all(policies.priority_workload())
    writer.close()
    requests = load_workload(str(path))
    assert [r.priority for r in requests] == policies.priorities(256)
    assert sum(len(r.prompt) for r in requests) == 142827


def test_prefill_first_ignores_the_priorities_and_priority_serves_them() -> None:
    """The baseline rows carry the priorities: ``prefill_first`` decides as on the trace;
    under ``priority`` the high class gets its first tokens earlier on average."""
    source = load_source("traces/cpu-tiny-demo")
    tagged = policies.prioritised(source)
    assert [r.priority for r in tagged.requests] == policies.priorities(len(source.requests))
    plain = run_variant(source, {}, None)
    same = run_variant(tagged, {}, None)
    for kind in EVENT_KINDS:
        if kind != "request_added":  # the input, priorities included, differs
            assert (decision_columns(kind, plain.events.tables[kind])
                    == decision_columns(kind, same.events.tables[kind])), kind
    # Two sequences at a time, so that admission order shows in the first tokens.
    fcfs = run_variant(tagged, {"max_num_seqs": 2}, None)
    served = run_variant(tagged, {"policy": "priority", "max_num_seqs": 2}, None)
    assert fcfs.ok and served.ok
    steps = {}
    for name, result in (("fcfs", fcfs), ("priority", served)):
        added = result.events.tables["request_added"]
        first = {}
        for seq, step in zip(result.events.tables["token_sampled"]["seq_id"],
                             result.events.tables["token_sampled"]["step"]):
            first.setdefault(int(seq), int(step))
        high = [first[int(s)] for row, s in enumerate(added["seq_id"])
                if result.events.request_priority(row) == policies.HIGH]
        steps[name] = sum(high) / len(high)
    assert steps["priority"] < steps["fcfs"], steps
