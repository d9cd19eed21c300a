"""A user policy reads the sequences it is offered and never changes them: its hooks get
read-only views (``engine.policy_view``), so each way to change a sequence (its tokens, appended
or edited in place, its cached/computed counts, blocks, status, sampling fields) is one
``PolicyError`` line naming the import path, the sequence, the field and the hook, raised where it
is attempted and before anything changed; ``replay.testing`` reports it as the ``policy``
violation. A policy that only reads decides exactly as unwrapped; the built-ins get the sequences
themselves (never wrapped)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.policy import BUILTIN_POLICIES, PolicyError, make_policy
from engine.policy_guard import GuardedPolicy
from engine.policy_view import MUTATORS, READ_METHODS, SequenceView
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence, SequenceStatus
from replay.testing import RequestSpec, Workload, run_workload, workloads
from replay.testing.strategies import scaled
from tracing.sink import MemorySink

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
CONFIG = Config(kvcache_block_size=2, num_kvcache_blocks=6, max_model_len=16,
                max_num_batched_tokens=16, max_num_seqs=4)


def _core(policy: str, **config: object) -> EngineCore:
    cfg = CONFIG.replace(**{"policy": policy, "num_kvcache_blocks": 16, **config})
    return EngineCore(cfg, NullExecutor(cfg.num_kvcache_blocks, vocab_size=100), sink=MemorySink())


def _state(seq: Sequence) -> tuple[object, ...]:
    return tuple(list(v) if isinstance(v, list) else v
                 for v in (getattr(seq, name) for name in Sequence.__slots__))


_HEAD = "from engine.policy import Policy, Chunked\nclass Bad({base}):\n"

ADMIT_CHANGES = [
    ("seq.token_ids.append(7)", r"seq 0's token_ids \(append\) in admit \(bad.py:5\)"),
    ("seq.token_ids[0] = 9", r"seq 0's token_ids \(item assignment\) in admit"),
    ("seq.token_ids += [1]", r"seq 0's token_ids \(\+=\) in admit"),
    ("seq.token_ids.extend([1])", r"seq 0's token_ids \(extend\) in admit"),
    ("seq.append_token(7)", r"seq 0's token_ids \(append_token\) in admit"),
    ("seq.num_cached_tokens = 2", r"seq 0's num_cached_tokens \(assignment\) in admit"),
    ("seq.num_computed_tokens += 1", r"seq 0's num_computed_tokens \(assignment\) in admit"),
    ("seq.num_tokens = 1", r"seq 0's num_tokens \(assignment\) in admit"),
    ("seq.status = seq.status", r"seq 0's status \(assignment\) in admit"),
    ("seq.max_tokens = 1", r"seq 0's max_tokens \(assignment\) in admit"),
    ("seq.temperature = 1.0", r"seq 0's temperature \(assignment\) in admit"),
    ("del seq.seed", r"seq 0's seed \(del\) in admit"),
    ("seq.block_table.append(0)", r"seq 0's block_table \(append\) in admit"),
]


@pytest.mark.parametrize("change, message", ADMIT_CHANGES)
def test_admit_changing_a_waiting_sequence_is_one_policy_error(
    policy_module, change: str, message: str
) -> None:
    """Each change admit attempts to a waiting sequence (appending a token, editing one in place,
    its counts, status, sampling fields, blocks) is refused where it is written: a PolicyError
    naming the policy, the sequence, the field, the hook and the line; the sequence is as it
    was."""
    policy_module("bad", _HEAD.format(base="Policy") + "    def admit(self, waiting, step):\n"
                  "        for seq in waiting:\n            " + change + "\n"
                  "        yield from super().admit(waiting, step)\n")
    core = _core("bad:Bad")
    core.add_request([1, 2, 3], GREEDY)
    seq = core.scheduler.waiting[0]
    before = _state(seq)
    with pytest.raises(PolicyError, match=rf"policy 'bad:Bad' tried to change {message}"):
        core.step()
    assert _state(seq) == before and list(seq.token_ids) == [1, 2, 3]


@pytest.mark.parametrize("base, hook, change, message", [
    ("Chunked", "chunk(self, seq, remaining, step)", "seq.block_table[0] = 5",
     r"seq 0's block_table \(item assignment\) in chunk"),
    ("Chunked", "chunk(self, seq, remaining, step)", "seq.num_cached_tokens = 0",
     r"seq 0's num_cached_tokens \(assignment\) in chunk"),
    ("Policy", "victim(self, candidates, step)", "candidates[-1].token_ids[-1] = 0",
     r"seq 2's token_ids \(item assignment\) in victim"),
    ("Policy", "victim(self, candidates, step)", "candidates[0].num_preemptions = 5",
     r"seq \d's num_preemptions \(assignment\) in victim"),
])
def test_chunk_and_victim_changing_a_sequence_is_one_policy_error(
    policy_module, base: str, hook: str, change: str, message: str
) -> None:
    """chunk and victim get read-only views too: a running sequence's blocks, counts or tokens
    changed there stop the step naming the hook."""
    method = hook.partition("(")[0]
    policy_module("bad", _HEAD.format(base=base) + f"    def {hook}:\n        {change}\n"
                  f"        return super().{method}({hook.partition('(self, ')[2]}\n")
    core = _core("bad:Bad", num_kvcache_blocks=3)
    for prompt in ([1, 2], [3, 4], [5, 6]):
        core.add_request(prompt, GREEDY)
    with pytest.raises(PolicyError, match=rf"policy 'bad:Bad' tried to change {message}"):
        core.run_until_idle()


def test_a_policy_that_catches_the_refusal_still_stops_the_step(policy_module) -> None:
    """Catching the PolicyError and going on does not hide the attempt: the hook's answer is
    refused with the same line (and the sequence was never changed)."""
    policy_module("bad", _HEAD.format(base="Policy") + """\
    def admit(self, waiting, step):
        for seq in waiting:
            try:
                seq.token_ids.append(7)
            except Exception:
                pass
        return super().admit(waiting, step)
""")
    core = _core("bad:Bad")
    core.add_request([1, 2, 3], GREEDY)
    with pytest.raises(PolicyError, match=r"seq 0's token_ids \(append\) in admit \(bad.py:6\)"):
        core.step()
    assert list(core.scheduler.waiting[0].token_ids) == [1, 2, 3]


@pytest.mark.parametrize("change, field", [
    ("seq.token_ids.append(7)", "token_ids (append)"),
    ("seq.token_ids[0] = 9", "token_ids (item assignment)"),
    ("seq.num_cached_tokens = 2", "num_cached_tokens (assignment)"),
])
def test_replay_testing_reports_a_change_as_the_policy_violation(
    policy_module, change: str, field: str
) -> None:
    """run_workload reports the attempt as the ``policy`` property with its one line, as any
    other PolicyError (not as corrupted completions or hash chains found later)."""
    policy_module("bad", _HEAD.format(base="Policy") + "    def admit(self, waiting, step):\n"
                  "        for seq in waiting:\n            " + change + "\n"
                  "        yield from super().admit(waiting, step)\n")
    run = run_workload(Workload(CONFIG.replace(policy="bad:Bad"),
                                (RequestSpec(0, (1, 2, 3), 2, True, (3, 3)),)))
    assert run.violations["policy"] == [
        f"step 0: policy 'bad:Bad' tried to change seq 0's {field} in admit (bad.py:5): a policy"
        " reads the sequences it is offered, never changes them"]
    assert not {"hash_chains", "finish", "accounting"} & set(run.violations)


READER = """
    from engine.policy import Policy, Chunked


    def read_all(seq, step):
        '''Every read a policy may make of a sequence: fields, properties, lists, blocks.'''
        tokens = seq.token_ids
        assert len(tokens) == seq.num_tokens == len(seq) and list(tokens) == tokens
        assert tokens[-1] == seq.last_token and tokens[:1] + [0] == [tokens[0], 0]
        assert list(reversed(tokens))[0] == tokens[-1] and tokens.count(tokens[0]) >= 1
        assert tokens[0] in tokens and tokens.index(tokens[0]) == 0
        assert list(seq.prompt_token_ids) + list(seq.completion_token_ids) == list(tokens)
        assert seq.num_completion_tokens == seq.num_tokens - seq.num_prompt_tokens
        assert list(seq.block_table) == seq.block_table and seq.block_table[:] == seq.block_table
        assert list(seq.block(0, 2)) == list(tokens[:2]) and not seq.is_finished
        assert seq.status.value in ("waiting", "running") and seq.max_tokens >= 1
        assert isinstance(step.priority(seq), int) and step.can_allocate(seq) in (True, False)
        return repr(seq), hash(tuple(tokens[:4]))


    class Reader(Policy):
        '''prefill_first, reading everything and keeping sequences as dict keys.'''

        def __init__(self, config):
            super().__init__(config)
            self.seen = {}

        def admit(self, waiting, step):
            for seq in sorted(waiting, key=lambda s: self.seen.setdefault(s, len(self.seen))):
                read_all(seq, step)
            assert all(s in waiting for s in waiting) and waiting[:1] == tuple(waiting)[:1]
            assert waiting + () == tuple(waiting)
            yield from super().admit(waiting, step)

        def chunk(self, seq, remaining, step):
            read_all(seq, step)
            return super().chunk(seq, remaining, step)

        def victim(self, candidates, step):
            for seq in candidates:
                read_all(seq, step)
            order = list(candidates)
            candidates.sort(key=lambda s: -s.seq_id)  # its own list: reordering it is fine
            return order[-1]


    class ChunkedReader(Chunked):
        victim = Reader.victim

        def admit(self, waiting, step):
            for seq in waiting:
                read_all(seq, step)
            return super().admit(waiting, step)

        def chunk(self, seq, remaining, step):
            read_all(seq, step)
            return super().chunk(seq, remaining, step)
"""


def test_a_policy_that_only_reads_decides_exactly_as_unwrapped(policy_module) -> None:
    """Every read (fields, properties, token and block lists, slices, ``in``, ``==``, views as
    dict keys across steps, sorting its own candidate list) works through the views, and the
    recorded event streams equal prefill_first's and chunked's, preemptions included."""
    policy_module("reader", READER)
    requests = tuple(RequestSpec(i, (0, 1, 2, i % 2), 6, True, (3,) * 6) for i in range(4))
    for builtin, user in (("prefill_first", "reader:Reader"), ("chunked", "reader:ChunkedReader")):
        streams = []
        for policy in (builtin, user):
            run = run_workload(Workload(CONFIG.replace(policy=policy), requests))
            run.raise_violations()
            streams.append(run.sink.tables)
        assert streams[0]["preempted"]["seq_id"], "the workload must preempt"
        assert streams[1] == streams[0], user


def test_generated_workloads_decide_as_the_builtins_under_a_reading_policy(policy_module) -> None:
    """On generated workloads (priorities, aborts, prefix hits, preemptions), sequential and
    overlapped, the reading policies record the very event streams of the built-ins they
    defer to: the views change no decision."""
    policy_module("reader", READER)
    twin = {"reader:Reader": "prefill_first", "reader:ChunkedReader": "chunked"}

    @settings(max_examples=scaled(0.3), database=None, deadline=None)
    @given(workloads(policies=tuple(twin)))
    def test(workload: Workload) -> None:
        builtin = Workload(workload.config.replace(policy=twin[workload.config.policy]),
                           workload.requests)
        for overlap in (False, True):
            runs = [run_workload(w, observe=not overlap, overlap=overlap)
                    for w in (workload, builtin)]
            runs[0].raise_violations()
            assert runs[0].sink.tables == runs[1].sink.tables

    test()


def test_the_builtins_are_not_wrapped_and_get_the_sequences_themselves() -> None:
    """A built-in policy is the class itself (no guard, no views): its hot path and the
    committed traces are untouched; a user policy is the guarded one."""
    for name, cls in BUILTIN_POLICIES.items():
        assert type(make_policy(CONFIG.replace(policy=name))) is cls
    core = _core("prefill_first")
    seen = []
    core.scheduler.policy.chunk = lambda seq, remaining, step: seen.append(seq) or remaining
    core.add_request([1, 2, 3], GREEDY)
    core.step()
    assert type(seen[0]) is Sequence and seen[0].status is SequenceStatus.RUNNING


def test_every_member_of_sequence_is_read_through_or_refused() -> None:
    """Each field, property and method of Sequence is read by a view or refused by it: a new
    one must be classified here (a new method that changes the sequence must be refused)."""
    guard = make_policy(CONFIG.replace(policy="engine.policy:Chunked"))
    assert isinstance(guard, GuardedPolicy)
    seq = Sequence(0, [1, 2, 3], GREEDY)
    view = SequenceView(seq, guard)
    for name in [n for n in dir(Sequence) if not n.startswith("__")] + list(READ_METHODS):
        member = getattr(Sequence, name)
        if name in MUTATORS:
            with pytest.raises(PolicyError, match=f"seq 0's token_ids \\({name}\\)"):
                getattr(view, name)(4)
        elif callable(member) and name not in READ_METHODS:
            pytest.fail(f"Sequence.{name} is neither read through nor refused by SequenceView")
        elif name not in READ_METHODS:
            assert getattr(view, name) == getattr(seq, name), name
    assert len(view) == 3 and repr(view) == repr(seq) and view.block(0, 2) == [1, 2]
    assert view == SequenceView(seq, guard) and hash(view) == hash(SequenceView(seq, guard))
    assert seq.token_ids == [1, 2, 3]


def test_a_copied_view_is_a_detached_snapshot(policy_module) -> None:
    """A policy that snapshots what it is offered (``copy.copy``, ``copy.deepcopy``, pickle: a
    history of the queue) gets Sequences of its own, detached from the engine's, and decides as
    unwrapped; it was ``AttributeError: 'SequenceView' object has no attribute '_guard'``."""
    policy_module("snap", """\
import copy, pickle
from engine.policy import Policy
class Snap(Policy):
    def __init__(self, config):
        super().__init__(config)
        self.history = []
    def admit(self, waiting, step):
        first = waiting[0]
        shallow, deep = copy.copy(first), copy.deepcopy(list(waiting))
        again = pickle.loads(pickle.dumps(first))
        shallow.token_ids.append(99)
        deep[0].num_cached_tokens = 5
        self.history.append((shallow, deep, again))
        yield from super().admit(waiting, step)
""")
    core = _core("snap:Snap")
    core.add_request([1, 2, 3], GREEDY)
    seq = core.scheduler.waiting[0]
    core.step()
    shallow, deep, again = core.scheduler.policy.inner.history[0]
    assert type(shallow) is type(deep[0]) is type(again) is Sequence
    assert list(shallow.token_ids) == [1, 2, 3, 99] and list(again.token_ids) == [1, 2, 3]
    assert list(seq.token_ids[:3]) == [1, 2, 3] and 99 not in seq.token_ids
    assert seq.status is SequenceStatus.RUNNING


def test_a_policy_reads_an_array_held_prompt_as_a_list() -> None:
    """The engine holds token ids as an int32 array (engine/prompt_ids.py); a policy still reads
    a list: equal to one, sliced to one, added to one, shown as one, its blocks as lists."""
    from array import array

    guard = make_policy(CONFIG.replace(policy="engine.policy:Chunked"))
    view = SequenceView(Sequence(0, array("i", [1, 2, 3]), GREEDY), guard)
    ids = view.token_ids
    assert ids == [1, 2, 3] and ids == array("i", [1, 2, 3]) and ids != [1, 2]
    assert ids[:2] == [1, 2] and type(ids[:2]) is list and ids[1] == 2
    assert ids + [4] == [1, 2, 3, 4] and [0] + ids == [0, 1, 2, 3]
    assert repr(ids) == "[1, 2, 3]" and view.block(0, 2) == [1, 2]
