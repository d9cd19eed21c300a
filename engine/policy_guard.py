"""The guard around a user policy: every answer it gives is checked before the scheduler acts.

``make_policy`` (engine/policy.py) wraps a policy given by import path in ``GuardedPolicy``: an
exception the policy raises, an answer of the wrong type, a change to the step's budget and a
change to a sequence it is offered (its hooks get read-only views, engine/policy_view.py) each
become one ``PolicyError`` line naming the import path, the hook and the cause (its file and
line: engine/policy_where.py). The built-ins are never wrapped.
"""

from __future__ import annotations

import decimal
import numbers
import operator
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Sequence as SequenceABC
from typing import Any, NoReturn

from engine.errors import ReplayLLMError
from engine.policy_view import OfferedViews, SequenceView, make_view, real
from engine.policy_where import OWN_FILES, PolicyCode, caller, described
from engine.sequence import Sequence, SequenceStatus


class PolicyError(ReplayLLMError):
    """A policy gave an answer the scheduler cannot carry out (e.g. a sequence not offered), or
    a user policy raised (``GuardedPolicy``): one line naming the policy and what it did."""


class NoProgressError(PolicyError):
    """A user policy scheduled nothing while requests wait: the run cannot go on."""


class PolicySlowWarning(UserWarning):
    """A user policy's hook took longer than ``SLOW_HOOK_S`` in one call."""


# One hook call of a policy longer than this is reported (once per policy and hook in a
# process): a scheduler decides in microseconds, and a hook taking seconds stretches every step
# of a live run and every example of a property test without a word (the project's Hypothesis
# profiles set no deadline, as a workload runs an engine). A warning, never an error: the
# decisions stay the policy's, and a timing never fails a test.
SLOW_HOOK_S = 0.25
_warned_slow: set[tuple[str, str]] = set()
# A hook's own exceptions become PolicyError; SystemExit too (a leftover ``sys.exit()`` in a
# hook ended the process with no message). KeyboardInterrupt stays the user's Ctrl-C.
_POLICY_FAILURES = (Exception, SystemExit)


def _inherited(hook: Any) -> bool:
    """Whether a policy's bound hook is one engine/policy.py defines (not the user's own)."""
    return getattr(getattr(hook, "__func__", hook), "__module__", None) == "engine.policy"


def _what(value: Any) -> str:
    if isinstance(value, Sequence):
        # Hooks are offered views, never a Sequence: this is a copy (copy.copy, deepcopy or
        # pickling a view gives a detached Sequence), equal in seq_id to the one offered.
        return (f"a copy of seq {value.seq_id} (copying a view detaches it; answer with the "
                "sequence offered)")
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
        return self._step.can_allocate(_sequence(seq, "can_allocate"))

    def priority(self, seq: Sequence) -> int:
        return self._step.priority(_sequence(seq, "priority"))

    def _charge(self, tokens: int, seqs: int = 1) -> None:
        raise PolicyError(f"policy {self._owner!r} charged the step's budget: only the "
                          "scheduler may (a policy reads step, never changes it)")


def _sequence(value: Any, method: str) -> Sequence:
    """The sequence ``value`` is a view of; anything else (``step.priority(seq.seq_id)``) is the
    policy's TypeError here, not an AttributeError deep in the scheduler."""
    seq = real(value)
    if not isinstance(seq, Sequence):
        raise TypeError(f"step.{method}(seq) takes a sequence offered to the hook, got "
                        f"{_what(value)}")
    return seq


_UNSET = object()


class GuardedPolicy:
    """A user policy (``package.module:ClassName``) with every answer checked before the
    scheduler acts on it: an exception it raises, an answer of the wrong type (``admit``
    returning None or yielding what was not offered, a ``chunk`` that is not an int, a victim
    that is not a candidate, eviction keys that do not compare), a change to the step's budget
    and a change to a sequence it is offered become one ``PolicyError`` line naming the import
    path, the hook and the cause (the original exception is its ``__cause__``). Its hooks get
    read-only views of the sequences (``engine.policy_view``: one per sequence a step, made as
    the policy reads them), so a change is refused where it is attempted, and still stops the
    step when the policy catches that error. The built-ins are never wrapped; a correct user
    policy decides exactly as unwrapped."""

    def __init__(self, inner: Any, name: str, release_order: Callable[[Any], Any]) -> None:
        self.inner = inner
        self._code = PolicyCode(type(inner))
        self._release_order = release_order
        self.name = name
        self.config = inner.config
        self._hook = "__init__"
        self._refusal: PolicyError | None = None
        self._step: Any = None  # the scheduler's Step the views below belong to
        self._step_view: StepView | None = None
        self._views: dict[int, SequenceView] = {}  # id(sequence) -> its view, for this step
        mixed = self._call("mixed_batches", lambda: inner.mixed_batches)
        if not isinstance(mixed, bool):
            raise PolicyError(f"policy {name!r}: mixed_batches must be True or False, got "
                              f"{_what(mixed)}")
        self._mixed = mixed

    @property
    def mixed_batches(self) -> bool:  # read once: the step shape cannot change mid-run
        return self._mixed

    def _call(self, hook: str, fn: Callable[..., Any], *args: Any) -> Any:
        self._hook = hook
        started = time.perf_counter()
        try:
            answer = fn(*args)
        except PolicyError:
            self._refusal = None  # raised: nothing left to report
            raise
        except _POLICY_FAILURES as exc:
            raise PolicyError(f"policy {self.name!r} raised {described(exc, self._code)} in "
                             f"{hook}") from exc
        self._timed(hook, fn, started)
        if self._refusal is not None:
            self._check_refusal()
        return answer

    def _timed(self, hook: str, fn: Any, started: float) -> None:
        """Warn (once per policy and hook) when one call of ``hook`` took over SLOW_HOOK_S."""
        took = time.perf_counter() - started
        if took <= SLOW_HOOK_S or (self.name, hook) in _warned_slow:
            return
        _warned_slow.add((self.name, hook))
        code = getattr(fn, "__code__", None) or getattr(fn, "gi_code", None)
        path = os.path.abspath(code.co_filename) if code is not None else None
        if path in OWN_FILES:
            path = None
        where = f" ({os.path.basename(path)}:{code.co_firstlineno})" if path else ""
        warning = PolicySlowWarning(
            f"policy {self.name!r} took {took:.2f} s in one {hook} call{where}, over "
            f"{SLOW_HOOK_S} s: every step waits for it (reported once per hook)")
        if path:  # shown at the hook's own definition, not at this line of the guard
            warnings.warn_explicit(warning, PolicySlowWarning, path, code.co_firstlineno)
        else:
            warnings.warn(warning, stacklevel=2)

    def _check_refusal(self) -> None:
        """Raise the refusal of a change the policy caught and went on from."""
        refusal, self._refusal = self._refusal, None
        if refusal is not None:
            raise refusal

    def _refuse(self, seq: Sequence, field: str, how: str) -> NoReturn:
        """A view's report of an attempted change to ``seq``: the PolicyError, raised (and kept,
        for ``_check_refusal``)."""
        where = caller(self._code)
        self._refusal = PolicyError(
            f"policy {self.name!r} tried to change seq {seq.seq_id}'s {field} ({how}) in "
            f"{self._hook}{f' ({where})' if where else ''}: a policy reads the sequences it is "
            "offered, never changes them")
        raise self._refusal

    def _enter(self, step: Any) -> StepView:
        """The policy's view of ``step``; a new step starts new sequence views."""
        if self._step_view is None or step is not self._step:
            self._step, self._step_view = step, StepView(step, self.name)
            self._views = {}
        return self._step_view

    def _view(self, seq: Sequence) -> SequenceView:
        views = self._views
        view = views.get(id(seq))
        if view is None:
            view = views[id(seq)] = make_view(seq, self)
        return view

    def admit(self, waiting: SequenceABC[Sequence], step: Any) -> Iterable[Sequence]:
        seqs = tuple(waiting)
        if not seqs:
            # Nothing to decide: the policy is not asked. An engine's idle steps and a replay's
            # last step (neither schedules anything) then call it equally often, so a policy
            # that counts its calls decides the same live and in replay.
            return ()
        answer = self._call("admit", self.inner.admit, OfferedViews(seqs, self._view),
                            self._enter(step))
        try:
            items: Iterator[Any] = iter(answer)
        except TypeError:
            raise PolicyError(f"policy {self.name!r}: admit returned {_what(answer)}, not an "
                              "iterable of waiting sequences") from None
        return self._admitted(items, {id(seq) for seq in seqs})

    def _admitted(self, items: Iterator[Any], offered: set[int]) -> Iterator[Sequence]:
        admitted: set[int] = set()
        while True:
            self._hook = "admit"  # a generator admit resumes after the scheduler's chunk calls
            started = time.perf_counter()
            try:
                item = next(items)
            except StopIteration:
                self._timed("admit", items, started)
                self._check_refusal()
                return
            except PolicyError:
                self._refusal = None
                raise
            except _POLICY_FAILURES as exc:
                raise PolicyError(f"policy {self.name!r} raised {described(exc, self._code)} in "
                                  "admit") from exc
            self._timed("admit", items, started)
            if self._refusal is not None:
                self._check_refusal()
            seq = real(item)
            if id(seq) not in offered:
                already = id(seq) in admitted
                raise PolicyError(
                    f"policy {self.name!r} admitted {_what(item)} twice in one admit call"
                    if already else f"policy {self.name!r} admitted {_what(item)}, which is not "
                    "one of the waiting sequences offered")
            offered.discard(id(seq))  # admitted: a second answer of it is refused above
            admitted.add(id(seq))
            yield seq

    def chunk(self, seq: Sequence, remaining: int, step: Any) -> int:
        step_view = self._enter(step)  # first: a new step starts new views
        answer = self._call("chunk", self.inner.chunk, self._view(seq), remaining, step_view)
        try:
            if isinstance(answer, bool):
                raise TypeError
            tokens = operator.index(answer)
        except TypeError:
            raise PolicyError(f"policy {self.name!r} chose {_what(answer)} tokens for seq "
                              f"{seq.seq_id}: chunk must return an int") from None
        left = step.tokens_left
        if 1 <= tokens <= min(remaining, left):
            return tokens
        if tokens > left and seq.status is SequenceStatus.WAITING and _inherited(self.inner.chunk):
            # The policy's admit offered a prompt the step's budget cannot hold, and the chunk it
            # inherits (Policy's) computes whole prompts: admit is what went wrong, not chunk.
            raise PolicyError(
                f"policy {self.name!r} admitted seq {seq.seq_id} ({remaining} prompt tokens to "
                f"compute) with {left} left in the step's budget: the inherited Policy.chunk "
                "computes a whole prompt, so admit may yield a sequence only while its prompt "
                "fits step.tokens_left (as Policy.admit checks), or override chunk")
        raise PolicyError(
            f"policy {self.name!r} chose {tokens} tokens for seq {seq.seq_id} ({remaining} to "
            f"compute, {left} left in the step's budget): chunk must return at least 1 and at "
            "most min(remaining, step.tokens_left)")

    def victim(self, candidates: SequenceABC[Sequence], step: Any) -> Sequence:
        offered = tuple(candidates)
        step_view = self._enter(step)
        views = list(map(self._view, offered))  # a list of its own: the policy may reorder it
        answer = real(self._call("victim", self.inner.victim, views, step_view))
        if not any(answer is c for c in offered):
            raise PolicyError(f"policy {self.name!r} chose {_what(answer)} to preempt, which is "
                              "not one of the candidates")
        return answer

    def eviction_key(self, block: Any) -> Any:
        return self.inner.eviction_key(block)

    def block_eviction_key(self) -> Callable[[Any], Any]:
        rank = self._call("block_eviction_key", self.inner.block_eviction_key)
        return rank if rank is self._release_order else self._checked_key(rank)

    def _checked_key(self, rank: Callable[[Any], Any]) -> Callable[[Any], Any]:
        order = KeyOrder(self.name)

        def key(block: Any) -> Any:
            value = self._call("eviction_key", rank, block)
            order.check(value, block)
            return value

        return key


def _leaves(value: Any, path: tuple[int, ...] = ()) -> Iterator[tuple[tuple[int, ...], Any]]:
    """Each element a heap's comparison of ``value`` may reach, by its position (a tuple's or a
    list's elements, recursively, after the container itself)."""
    yield path, value
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))


def _unordered(value: Any) -> str | None:
    """Why ``value`` cannot be ordered even among keys like it, else None: NaN (neither smaller
    than, larger than nor equal to anything: the heap's order would be arbitrary, silently), or
    an element that is not orderable with itself (None, a dict: ``<`` raises)."""
    for _, item in _leaves(value):
        if isinstance(item, (tuple, list)):
            continue
        try:
            if item != item:
                return "NaN is neither smaller, larger nor equal to any key"
            item < item  # noqa: B015 (whether '<' is defined for it at all)
        except Exception as exc:  # noqa: BLE001 (a key's own comparison may raise anything)
            return f"{type(exc).__name__}: {exc}"
    return None


def _ordering(value: Any, other: Any) -> str | None:
    """Why ``value`` and ``other`` do not order as the free list's heap compares them (in a
    tuple: equal by identity or ==, else by <), else None."""
    a, b = (value,), (other,)
    try:
        if (a < b) + (b < a) + (a == b) == 1:
            return None
        return "neither is smaller and they are not equal"
    except Exception as exc:  # noqa: BLE001 (a key's own comparison may raise anything)
        return f"{type(exc).__name__}: {exc}"


class KeyOrder:
    """The eviction keys one policy returned, checked before the free list's heap holds them: a
    key that cannot be ordered (NaN, None) and keys that do not compare with each other (an int
    and a str, also at one position of a tuple) are a ``PolicyError`` naming the keys, where the
    heap would order them arbitrarily or raise ``TypeError`` later in the block manager. A
    position's elements must compare in every key, even where an earlier element happens to
    decide: the heap compares whichever keys it holds. Each key costs a set look-up per element
    once the types a policy returns are known."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._last: Any = _UNSET
        self._seen: set[tuple[tuple[int, ...], Any]] = set()  # (position, kind) met
        # Position -> (element, its key) of each kind met there.
        self._example: dict[tuple[int, ...], list[tuple[Any, Any]]] = {}

    def check(self, value: Any, block: Any) -> None:
        why = _unordered(value)
        if why is not None:
            raise PolicyError(
                f"policy {self._owner!r}: eviction_key returned {_shown(value)} for block "
                f"{getattr(block, 'block_id', '?')}, which cannot be ordered ({why}): return a "
                "number, or a tuple of numbers")
        for path, item in _leaves(value):
            kind = (path, _kind(item))
            if kind not in self._seen:  # a new type at this position: does it compare?
                examples = self._example.setdefault(path, [])
                for element, key in examples:
                    self._compare(value, key, _ordering(item, element))
                examples.append((item, value))
                self._seen.add(kind)
        if self._last is not _UNSET:
            self._compare(value, self._last, _ordering(value, self._last))
        self._last = value

    def _compare(self, value: Any, other: Any, why: str | None) -> None:
        if why is not None:
            raise PolicyError(
                f"policy {self._owner!r}: eviction_key returned {_shown(value)} and "
                f"{_shown(other)}, which do not compare ({why})")


def _kind(item: Any) -> Any:
    # Python's numbers compare with each other: one kind (bool, int, float, Fraction, Decimal).
    return "number" if isinstance(item, (numbers.Real, decimal.Decimal)) else type(item)


def _shown(value: Any) -> str:
    return f"{value!r:.60} ({type(value).__name__})"
