"""The guard around a user policy: every answer it gives is checked before the scheduler acts.

``make_policy`` (engine/policy.py) wraps a policy given by import path in ``GuardedPolicy``: an
exception the policy raises, an answer of the wrong type and a change to the step's budget each
become one ``PolicyError`` line naming the import path, the hook and the cause. The built-ins are
never wrapped.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Sequence as SequenceABC
from typing import TYPE_CHECKING, Any

from engine.errors import ReplayLLMError

if TYPE_CHECKING:
    from engine.sequence import Sequence

# This guard and engine/policy.py (which imports it): a failure's location is outside them.
_OWN_FILES = {os.path.abspath(__file__),
              os.path.join(os.path.dirname(os.path.abspath(__file__)), "policy.py")}


class PolicyError(ReplayLLMError):
    """A policy gave an answer the scheduler cannot carry out (e.g. a sequence not offered), or
    a user policy raised (``GuardedPolicy``): one line naming the policy and what it did."""


class NoProgressError(PolicyError):
    """A user policy scheduled nothing while requests wait: the run cannot go on."""


def described(exc: BaseException) -> str:
    """``TypeName: first line (file.py:line)``, at the innermost frame outside this guard and
    engine/policy.py (the policy's own code; none when it failed in the call itself)."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    where = None
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if os.path.abspath(name) not in _OWN_FILES:
            where = f"{os.path.basename(name)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return f"{text} ({where})" if where else text


def _what(value: Any) -> str:
    seq_id = getattr(value, "seq_id", None)
    return f"seq {seq_id}" if isinstance(seq_id, int) else f"{value!r:.60} ({type(value).__name__})"


class StepView:
    """What a user policy gets as ``step``: the scheduler's ``engine.policy.Step`` read through,
    its budget out of reach (``_charge`` raises: only the scheduler spends the budget)."""

    __slots__ = ("_step", "_owner")

    def __init__(self, step: Any, owner: str) -> None:
        self._step = step
        self._owner = owner

    @property
    def tokens_left(self) -> int:
        return self._step.tokens_left

    @property
    def seqs_left(self) -> int:
        return self._step.seqs_left

    @property
    def free_blocks(self) -> int:
        return self._step.free_blocks

    def can_allocate(self, seq: Sequence) -> bool:
        return self._step.can_allocate(seq)

    def priority(self, seq: Sequence) -> int:
        return self._step.priority(seq)

    def _charge(self, tokens: int, seqs: int = 1) -> None:
        raise PolicyError(f"policy {self._owner!r} charged the step's budget: only the "
                          "scheduler may (a policy reads step, never changes it)")


_UNSET = object()


class GuardedPolicy:
    """A user policy (``package.module:ClassName``) with every answer checked before the
    scheduler acts on it: an exception it raises, an answer of the wrong type (``admit``
    returning None or yielding what was not offered, a ``chunk`` that is not an int, a victim
    that is not a candidate, eviction keys that do not compare) and a change to the step's
    budget become one ``PolicyError`` line naming the import path, the hook and the cause (the
    original exception is its ``__cause__``). The built-ins are never wrapped; a correct user
    policy decides exactly as unwrapped."""

    def __init__(self, inner: Any, name: str, release_order: Callable[[Any], Any]) -> None:
        self.inner = inner
        self._release_order = release_order
        self.name = name
        self.config = inner.config
        mixed = self._call("mixed_batches", lambda: inner.mixed_batches)
        if not isinstance(mixed, bool):
            raise PolicyError(f"policy {name!r}: mixed_batches must be True or False, got "
                              f"{_what(mixed)}")
        self._mixed = mixed
        self._last_key: Any = _UNSET

    @property
    def mixed_batches(self) -> bool:  # read once: the step shape cannot change mid-run
        return self._mixed

    def _call(self, hook: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"policy {self.name!r} raised {described(exc)} in {hook}") from exc

    def admit(self, waiting: SequenceABC[Sequence], step: Any) -> Iterable[Sequence]:
        answer = self._call("admit", self.inner.admit, waiting, StepView(step, self.name))
        try:
            items: Iterator[Any] = iter(answer)
        except TypeError:
            raise PolicyError(f"policy {self.name!r}: admit returned {_what(answer)}, not an "
                              "iterable of waiting sequences") from None
        return self._admitted(items, {id(seq) for seq in waiting})

    def _admitted(self, items: Iterator[Any], offered: set[int]) -> Iterator[Sequence]:
        while True:
            try:
                seq = next(items)
            except StopIteration:
                return
            except PolicyError:
                raise
            except Exception as exc:
                raise PolicyError(f"policy {self.name!r} raised {described(exc)} in admit") \
                    from exc
            if id(seq) not in offered:
                raise PolicyError(f"policy {self.name!r} admitted {_what(seq)}, which is not "
                                  "one of the waiting sequences offered")
            yield seq

    def chunk(self, seq: Sequence, remaining: int, step: Any) -> int:
        answer = self._call("chunk", self.inner.chunk, seq, remaining, StepView(step, self.name))
        try:
            if isinstance(answer, bool):
                raise TypeError
            return operator.index(answer)
        except TypeError:
            raise PolicyError(f"policy {self.name!r} chose {_what(answer)} tokens for seq "
                              f"{seq.seq_id}: chunk must return an int") from None

    def victim(self, candidates: SequenceABC[Sequence], step: Any) -> Sequence:
        answer = self._call("victim", self.inner.victim, candidates, StepView(step, self.name))
        if not any(answer is c for c in candidates):
            raise PolicyError(f"policy {self.name!r} chose {_what(answer)} to preempt, which is "
                              "not one of the candidates")
        return answer

    def eviction_key(self, block: Any) -> Any:
        return self.inner.eviction_key(block)

    def block_eviction_key(self) -> Callable[[Any], Any]:
        rank = self._call("block_eviction_key", self.inner.block_eviction_key)
        return rank if rank is self._release_order else self._checked_key(rank)

    def _checked_key(self, rank: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def key(block: Any) -> Any:
            value = self._call("eviction_key", rank, block)
            last = self._last_key
            if last is not _UNSET:
                try:
                    (value,) < (last,)  # noqa: B015 (the free list's heap compares them so)
                except TypeError:
                    raise PolicyError(
                        f"policy {self.name!r}: eviction_key returned {value!r:.40} and "
                        f"{last!r:.40}, which do not compare") from None
            self._last_key = value
            return value

        return key
