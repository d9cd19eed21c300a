"""The policy interface: how a policy is selected and checked, and the built-ins' decisions on
hand-made cases (priority admission and victim, the two eviction orders)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.config import Config
from engine.engine_core import EngineCore
from engine.errors import ConfigError
from engine.executor import NullExecutor
from engine.policy import Chunked, Policy, PolicyError, policy_change_note, policy_source
from engine.sampling_params import SamplingParams
from replay.testing import RequestSpec, Workload, run_workload
from tracing.sink import MemorySink

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _core(policy: str, **config: object) -> tuple[EngineCore, MemorySink]:
    settings = dict(kvcache_block_size=2, num_kvcache_blocks=16, max_model_len=16,
                    max_num_batched_tokens=16, max_num_seqs=4, policy=policy)
    settings.update(config)
    sink = MemorySink()
    cfg = Config(**settings)
    return EngineCore(cfg, NullExecutor(cfg.num_kvcache_blocks, vocab_size=100), sink=sink), sink


def test_an_import_path_is_validated_by_importing_it(policy_module) -> None:
    """A missing module, a missing class and a class that is not a Policy are each refused in
    one line naming the path; a Policy subclass is accepted."""
    policy_module("good", """
        from engine.policy import Policy
        class Mine(Policy):
            pass
        class NotAPolicy:
            pass
    """)
    assert Config(policy="good:Mine").policy == "good:Mine"
    with pytest.raises(ConfigError, match="cannot import nowhere"):
        Config(policy="nowhere:Mine")
    with pytest.raises(ConfigError, match="defines no Missing; its Policy subclasses: Mine"):
        Config(policy="good:Missing")
    with pytest.raises(ConfigError, match="NotAPolicy is not a subclass"):
        Config(policy="good:NotAPolicy")
    with pytest.raises(ConfigError, match="or an import path package.module:ClassName"):
        Config(policy="good")


def test_a_policy_module_in_the_working_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sjf.py`` beside the user, as docs/policies.md writes it, is found by its import path
    from the ``replayllm`` script, whose ``sys.path`` holds its own folder, not the working
    directory (was: ``cannot import sjf: No module named 'sjf'``, the README's own
    ``whatif --set policy=mypkg.sched:ShortestJobFirst``); the folder goes last, and a module
    found nowhere is still refused."""
    package = tmp_path / "cwdpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sched.py").write_text("from engine.policy import Policy\n\n\n"
                                      "class Mine(Policy):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    cwd = str(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", cwd)])
    for name in ("cwdpkg", "cwdpkg.sched"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert Config(policy="cwdpkg.sched:Mine").policy == "cwdpkg.sched:Mine"
    assert sys.path[-1] == cwd
    assert policy_source("cwdpkg.sched:Mine")["sha256"]
    with pytest.raises(ConfigError, match="cannot import cwdpkg.missing"):
        Config(policy="cwdpkg.missing:Mine")
    with pytest.raises(ConfigError, match="cannot import elsewhere"):
        Config(policy="elsewhere:Mine")


@pytest.mark.parametrize("body, message, budget, prompt_len", [
    ("def chunk(self, seq, remaining, step):\n        return remaining + 1",
     "chose 4 tokens for seq 0", 16, 3),
    ("def admit(self, waiting, step):\n        yield from waiting\n        yield from waiting",
     "admitted seq 0 twice in one admit call", 16, 3),
    ("def admit(self, waiting, step):\n        yield from waiting\n"
     "    def chunk(self, seq, remaining, step):\n"
     "        return min(remaining, step.tokens_left + 1)",
     "chose 5 tokens for seq 0 .* 4 left in the step's budget", 4, 6),
])
def test_an_answer_the_scheduler_cannot_carry_out_raises_policy_error(
    policy_module, body: str, message: str, budget: int, prompt_len: int
) -> None:
    """A chunk larger than what is left to compute or to spend, or admitting a sequence twice,
    stops the step with a PolicyError naming the policy."""
    policy_module("bad", "from engine.policy import Policy\nclass Bad(Policy):\n    name = 'bad'\n"
                  "    " + body + "\n")
    core, _ = _core("bad:Bad", max_num_batched_tokens=budget)
    core.add_request(list(range(1, prompt_len + 1)), GREEDY)
    with pytest.raises(PolicyError, match=message):
        core.step()


@pytest.mark.parametrize("steps_before", [0, 1], ids=["admission", "continued_chunk"])
def test_the_scheduler_itself_refuses_a_chunk_over_the_budget(
    monkeypatch: pytest.MonkeyPatch, steps_before: int
) -> None:
    """A built-in policy runs unguarded (only a user policy's answers pass ``GuardedPolicy``,
    which refuses an over-budget chunk first), so the scheduler's own check is what stops
    ``chunked`` asking one token more than the budget left, at admission and for a prompt's
    next chunk (mutant ``chunk_overruns_budget``; the test above meets the guard's check)."""
    core, _ = _core("chunked", max_num_batched_tokens=4)
    core.add_request(list(range(1, 11)), GREEDY)
    for _ in range(steps_before):
        core.step()  # a first chunk of 4 tokens, 6 left to compute
    policy = core.scheduler.policy
    assert isinstance(policy, Chunked)  # not wrapped in a GuardedPolicy
    monkeypatch.setattr(policy, "chunk",
                        lambda seq, remaining, step: min(remaining, step.tokens_left + 1))
    left = 10 - 4 * steps_before
    message = rf"'chunked' chose 5 tokens for seq 0 \({left} to compute, 4 left in the step's "
    message += r"budget\)$"
    with pytest.raises(PolicyError, match=message):
        core.step()


def test_the_header_records_a_user_policy_and_a_hash_of_its_source(policy_module) -> None:
    """The header holds the import path and the sha256 of the policy's module; editing the
    module makes policy_change_note say so (a built-in records nothing)."""
    policy_module("recorded", "from engine.policy import Policy\nclass P(Policy):\n    pass\n")
    core, sink = _core("recorded:P")
    core.close()
    header = sink.header
    assert header["policy"] == "recorded:P" and header["eviction"] == "release"
    assert header["policy_source"] == policy_source("recorded:P")
    assert policy_change_note(header) is None
    policy_module("recorded", "from engine.policy import Policy\nclass P(Policy):\n    x = 1\n")
    note = policy_change_note(header)
    assert note is not None and "source changed since the recording" in note
    assert "policy_source" not in _core("chunked")[0].header


def test_priority_admits_the_better_priority_first_and_preempts_the_worst() -> None:
    """Under ``priority`` the request added last with a better (lower) priority is admitted
    first; when a decode needs a block the running request of the worst priority is preempted,
    although it is not the newest."""
    core, sink = _core("priority", num_kvcache_blocks=6, max_num_seqs=1)
    core.add_request([1, 2, 3], GREEDY, priority=2)
    core.add_request([4, 5, 6], GREEDY, priority=0)
    first = core.step()
    assert first is not None and [s.seq_id for s in first.batch.seqs] == [1]
    core.close()
    assert sink.tables["request_added"]["priority"] == [2, 0]

    core, sink = _core("priority", num_kvcache_blocks=3, max_num_seqs=4)
    for prompt, priority in (([1, 2], 0), ([3, 4], 5), ([5, 6], 1)):  # admitted in this order
        core.add_request(prompt, GREEDY, priority=priority)
        core.step()
    core.run_until_idle()  # seq 0's first decode needs a block: none is free
    core.close()
    preempted = sink.tables["preempted"]
    assert preempted["seq_id"][:1] == [1] and preempted["for_seq_id"][:1] == [0], preempted
    assert _core("prefill_first")[0].scheduler.policy.victim([0, 1, 2], None) == 2  # the newest


def test_lru_eviction_hands_out_the_block_unused_longest() -> None:
    """Seq 1 sits unscheduled (max_num_seqs=1) and is aborted: its blocks are released after
    seq 2's, but were used before them. Release order hands out seq 2's first, LRU seq 1's;
    both runs pass every property and the invariant checker (which re-derives each order)."""
    config = Config(kvcache_block_size=2, num_kvcache_blocks=5, max_model_len=12,
                    max_num_batched_tokens=12, max_num_seqs=1)
    requests = (
        RequestSpec(1, (0, 2, 0), 5, True, (2,) * 8),
        RequestSpec(2, (0, 2), 8, True, (2,) * 8, abort_step=5),
        RequestSpec(4, (1, 3, 1, 0), 1, True, (2,) * 8),
    )
    handed_out = {}
    for eviction in ("release", "lru"):
        run = run_workload(Workload(config.replace(eviction=eviction), requests))
        run.raise_violations()
        handed_out[eviction] = run.sink.tables["block_allocated"]["block_id"]
    assert handed_out == {"release": [0, 1, 2, 3, 4, 4, 3], "lru": [0, 1, 2, 3, 4, 2, 4]}


def test_a_policy_subclass_overriding_one_hook_keeps_the_others() -> None:
    """The base class is prefill_first: a subclass changing only ``victim`` still admits FCFS."""

    class OldestVictim(Policy):
        def victim(self, candidates, step):
            return candidates[1] if len(candidates) > 1 else candidates[0]

    policy = OldestVictim(Config())
    assert policy.name == "prefill_first" and not policy.mixed_batches


# --- a buggy user policy: one PolicyError line naming its import path -----------------------------

_HEAD = "from engine.policy import Policy, Chunked\nclass Bad({base}):\n"


@pytest.mark.parametrize("base, body, message", [
    ("Policy", "def __init__(self, config, extra):\n        super().__init__(config)",
     r"policy 'bad:Bad': Bad\(config\) raised TypeError: .*missing 1 required positional"),
    ("Policy", "def __init__(self, config):\n        raise ValueError('no config')",
     r"policy 'bad:Bad': Bad\(config\) raised ValueError: no config \(bad.py:4\)"),
    ("Policy", "def __init__(self, config):\n        self.config = config",
     r"Bad.__init__ must call super\(\).__init__\(config\)"),
    ("Policy", "mixed_batches = 'yes'", "mixed_batches must be True or False, got 'yes'"),
    ("Policy", "def eviction_key(self, block):\n        raise KeyError(block.block_id)",
     r"policy 'bad:Bad' raised KeyError: 0 \(bad.py:4\) in eviction_key"),
])
def test_a_policy_that_cannot_be_built_is_one_policy_error(
    policy_module, base: str, body: str, message: str
) -> None:
    """A class whose __init__ takes other arguments, raises or skips Policy.__init__, a
    mixed_batches that is not a bool and an eviction key that raises on the first free block are
    refused when the engine starts, as a PolicyError naming the import path (not a raw
    TypeError/ValueError with a traceback)."""
    policy_module("bad", _HEAD.format(base=base) + "    " + body + "\n")
    with pytest.raises(PolicyError, match=message):
        _core("bad:Bad")


def test_an_llm_whose_policy_cannot_be_built_gives_its_model_back(
    policy_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LLM(...) with a policy whose constructor raises closes the model runner it had already
    loaded (its KV cache, on a GPU its memory) before the PolicyError goes on."""
    from engine.llm import LLM
    from engine.runner.model_runner import ModelRunner

    closed = []
    close = ModelRunner.close
    monkeypatch.setattr(ModelRunner, "close", lambda self: (closed.append(self), close(self)))
    policy_module("bad", _HEAD.format(base="Policy")
                  + "    def __init__(self, config):\n        raise ValueError('no')\n")
    with pytest.raises(PolicyError, match="raised ValueError: no"):
        LLM(None, record_events=False, calibration_repeats=0, policy="bad:Bad")
    assert len(closed) == 1 and closed[0].kv_cache is None


def test_a_module_that_exits_on_import_is_a_config_error(policy_module) -> None:
    """A policy module calling sys.exit on import is a ConfigError, not a SystemExit that ends
    the process."""
    policy_module("exits", "raise SystemExit(3)\n")
    with pytest.raises(ConfigError, match=r"cannot import exits: it raised SystemExit\(3\)"):
        Config(policy="exits:P")


@pytest.mark.parametrize("base, body, message", [
    ("Policy", "def admit(self, waiting, step):\n        raise KeyError('oops')",
     r"policy 'bad:Bad' raised KeyError: 'oops' \(bad.py:4\) in admit"),
    ("Policy", "def admit(self, waiting, step):\n        yield waiting[0]\n        1 / 0",
     r"raised ZeroDivisionError: division by zero \(bad.py:5\) in admit"),
    ("Policy", "def admit(self, waiting, step):\n        return None",
     r"policy 'bad:Bad': admit returned None \(NoneType\), not an iterable"),
    ("Policy", "def admit(self, waiting, step):\n        return [0]",
     r"policy 'bad:Bad' admitted 0 \(int\), which is not one of the waiting sequences offered"),
    ("Policy", "def admit(self, waiting, step):\n        yield from waiting\n"
     "        yield from waiting",
     "policy 'bad:Bad' admitted seq 0 twice in one admit call"),
    ("Policy", "def admit(self, waiting, step):\n        step._charge(-100, -100)\n"
     "        yield from waiting", "policy 'bad:Bad' charged the step's budget"),
    ("Policy", "def admit(self, waiting, step):\n        return ()",
     "policy 'bad:Bad': scheduler made no progress with 1 waiting and 0 running sequences"),
    ("Chunked", "def chunk(self, seq, remaining, step):\n        return None",
     r"policy 'bad:Bad' chose None \(NoneType\) tokens for seq 0: chunk must return an int"),
    ("Chunked", "def chunk(self, seq, remaining, step):\n        return 1.5",
     r"chose 1.5 \(float\) tokens for seq 0: chunk must return an int"),
    ("Chunked", "def chunk(self, seq, remaining, step):\n        raise RuntimeError('chunk')",
     r"policy 'bad:Bad' raised RuntimeError: chunk \(bad.py:4\) in chunk"),
])
def test_a_policy_that_raises_or_answers_the_wrong_type_is_one_policy_error(
    policy_module, base: str, body: str, message: str
) -> None:
    """An exception in a hook, None or the wrong objects from admit, a non-int chunk, a change
    to the step's budget and never admitting anything each stop the step with a PolicyError
    naming the import path (the class inherits name 'prefill_first'), the hook and the cause,
    with the user's file and line; never a raw TypeError/AttributeError or an endless loop."""
    policy_module("bad", _HEAD.format(base=base) + "    " + body + "\n")
    core, _ = _core("bad:Bad", max_num_seqs=1)
    core.add_request([1, 2, 3], GREEDY)
    with pytest.raises(PolicyError, match=message):
        core.step()


@pytest.mark.parametrize("body, message", [
    ("raise ZeroDivisionError('victim')",
     r"policy 'bad:Bad' raised ZeroDivisionError: victim \(bad.py:4\) in victim"),
    ("return None", r"policy 'bad:Bad' chose None \(NoneType\) to preempt, which is not one"),
])
def test_a_victim_that_raises_or_is_not_a_candidate_is_one_policy_error(
    policy_module, body: str, message: str
) -> None:
    """When a decode needs a block and none is free, a victim hook that raises or returns None
    is a PolicyError naming the policy."""
    policy_module("bad", _HEAD.format(base="Policy")
                  + "    def victim(self, candidates, step):\n        " + body + "\n")
    core, _ = _core("bad:Bad", num_kvcache_blocks=3)
    for prompt in ([1, 2], [3, 4], [5, 6]):
        core.add_request(prompt, GREEDY)
    with pytest.raises(PolicyError, match=message):
        core.run_until_idle()


def test_a_correct_user_policy_decides_exactly_as_unwrapped(policy_module) -> None:
    """The guard around a user policy changes no decision: a subclass overriding nothing (and
    one re-yielding the default admissions) records the very event stream of prefill_first,
    preemptions and prefix hits included."""
    policy_module("same", """
        from engine.policy import Policy
        class Same(Policy):
            pass
        class Relay(Policy):
            def admit(self, waiting, step):
                yield from super().admit(waiting, step)
            def victim(self, candidates, step):
                return super().victim(candidates, step)
    """)
    config = Config(kvcache_block_size=2, num_kvcache_blocks=6, max_model_len=16,
                    max_num_batched_tokens=16, max_num_seqs=4)
    requests = tuple(RequestSpec(i, (0, 1, 2, i % 2), 6, True, (3,) * 6) for i in range(4))
    streams = []
    for policy in ("prefill_first", "same:Same", "same:Relay"):
        run = run_workload(Workload(config.replace(policy=policy), requests))
        run.raise_violations()
        streams.append(run.sink.tables)
    assert streams[0]["preempted"]["seq_id"], "the workload must preempt"
    assert streams[1] == streams[0] and streams[2] == streams[0]
