"""Answers of a user policy that cannot be ordered, and its read-only waiting queue.

What these tests prove:

- An ``eviction_key`` that returns NaN (alone or inside a tuple), None for every block, a value
  that does not compare with itself, or a type that does not compare with the keys of other
  blocks (a tuple whose second element is a str for some blocks and an int for others) was
  silent before: the free list's heap ordered them arbitrarily (NaN is neither smaller, larger
  nor equal), no error and every invariant passed (or, for the mixed tuple, a TypeError out of
  ``heapq`` in the block manager, through ``run_workload``). Each is now the ``policy``
  violation, one line naming the hook and the value; keys that order (numbers of any type,
  tuples of them) still run with no violation. By design a position's elements must compare in
  every key even where an earlier element always decides (``DecidedFirst``): the heap compares
  whichever keys it holds, and a check that waited for the tie missed it (``MixedSecond``).
- ``waiting.sort()`` (or ``.append``, ``.pop``, ``waiting[0] = ...``) in ``admit`` was
  ``AttributeError: 'OfferedViews' object has no attribute 'sort'``: it now says the queue is
  read-only and to use ``sorted(waiting, key=...)``; a misspelt read keeps its "Did you mean".
"""

from __future__ import annotations

import pytest
from _policy_runs import policy_violation

from engine.config import Config
from replay.testing import RequestSpec, Workload, run_workload

KEYS = """
    import math

    from engine.policy import Policy


    class NanWhenCached(Policy):
        def eviction_key(self, block):
            return float("nan") if block.cached else block.released


    class SameNanWhenCached(Policy):
        def eviction_key(self, block):
            return math.nan if block.cached else block.released


    class NanInTuple(Policy):
        def eviction_key(self, block):
            return (float("nan") if block.cached else 0, block.released)


    class AlwaysNone(Policy):
        def eviction_key(self, block):
            pass  # forgot the return


    class Unordered(Policy):
        def eviction_key(self, block):
            return {"released": block.released}


    class MixedSecond(Policy):
        def eviction_key(self, block):
            return (block.released % 3, "c" if block.cached else block.block_id)


    class Ordered(Policy):
        def eviction_key(self, block):
            return (not block.cached, -block.last_used, block.released * 0.5)


    class MixedNumbers(Policy):
        def eviction_key(self, block):
            return block.released * 0.5 if block.cached else block.released


    class DecidedFirst(Policy):
        '''Later elements differ in type only where the first element always differs.'''

        def eviction_key(self, block):
            return (0, "c%06d" % block.released) if block.cached else (1, block.released)
"""

VIEWS = """
    from engine.policy import Policy


    class SortsWaiting(Policy):
        def admit(self, waiting, step):
            waiting.sort(key=lambda s: s.num_tokens)  # line 7
            yield from super().admit(waiting, step)


    class PopsWaiting(Policy):
        def admit(self, waiting, step):
            yield waiting.pop(0)


    class AssignsWaiting(Policy):
        def admit(self, waiting, step):
            waiting[0] = waiting[1]
            yield from super().admit(waiting, step)


    class MisspeltRead(Policy):
        def admit(self, waiting, step):
            waiting.cont(waiting[0])
            yield from super().admit(waiting, step)
"""


def _cached_run(policy: str):
    """Two requests sharing a full prompt block, finishing at different steps: cached blocks
    enter the free list mid-run among uncached ones, and later requests take blocks from it."""
    config = Config(policy=policy, kvcache_block_size=2, num_kvcache_blocks=12, max_model_len=16,
                    max_num_batched_tokens=16, eos=-1, hash_seed=0)
    requests = tuple(RequestSpec(step, (1, 2, 3, 4, 5), tokens, True, (7,) * tokens)
                     for step, tokens in ((0, 2), (0, 5), (3, 3), (6, 4), (8, 2)))
    return run_workload(Workload(config, requests))


@pytest.fixture
def keys(policy_module) -> str:
    return policy_module("s38b_keys", KEYS)


@pytest.mark.parametrize(("cls", "shown"), [
    ("NanWhenCached", "nan (float)"),
    ("SameNanWhenCached", "nan (float)"),
    ("NanInTuple", "(nan, "),
    ("AlwaysNone", "None (NoneType)"),
    ("Unordered", "{'released': "),
])
def test_a_key_that_cannot_be_ordered_is_the_policy_violation(keys, cls, shown) -> None:
    run = _cached_run(f"{keys}:{cls}")
    (message,) = run.violations["policy"]  # was: no violation at all
    assert f"policy '{keys}:{cls}': eviction_key returned {shown}" in message, message
    assert "cannot be ordered" in message and "\n" not in message


@pytest.mark.parametrize("cls", ["MixedSecond", "DecidedFirst"])
def test_keys_whose_types_do_not_compare_with_each_other_are_the_policy_violation(
        keys, cls) -> None:
    run = _cached_run(f"{keys}:{cls}")  # MixedSecond was a TypeError out of heapq
    (message,) = run.violations["policy"]
    assert f"policy '{keys}:{cls}': eviction_key returned (" in message, message
    assert "which do not compare (TypeError: '<' not supported" in message, message
    assert "\n" not in message


@pytest.mark.parametrize("cls", ["Ordered", "MixedNumbers"])
def test_keys_that_order_run_with_no_violation(keys, cls) -> None:
    run = _cached_run(f"{keys}:{cls}")
    assert run.violations == {}


@pytest.fixture
def views(policy_module) -> str:
    return policy_module("s38b_views", VIEWS)


@pytest.mark.parametrize(("cls", "what"), [
    ("SortsWaiting", "has no attribute 'sort'"), ("PopsWaiting", "has no attribute 'pop'"),
    ("AssignsWaiting", "does not support item assignment")])
def test_changing_the_waiting_queue_says_it_is_read_only(views, cls, what) -> None:
    message = policy_violation(f"{views}:{cls}")
    assert what in message, message
    assert "waiting is read-only" in message and "sorted(waiting, key=...)" in message, message
    assert "(s38b_views.py:" in message and message.endswith("in admit")


def test_the_read_only_message_is_at_the_policys_line(views) -> None:
    assert "(s38b_views.py:7) in admit" in policy_violation(f"{views}:SortsWaiting")


def test_a_misspelt_read_of_waiting_still_says_what_was_meant(views) -> None:
    message = policy_violation(f"{views}:MisspeltRead")
    assert "has no attribute 'cont'. Did you mean: 'count'?" in message, message
    assert "read-only" not in message
