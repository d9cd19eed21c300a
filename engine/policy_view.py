"""Read-only views of the scheduler's sequences: what a user policy's hooks are handed.

``GuardedPolicy`` (engine/policy_guard.py) never gives a user policy a ``Sequence`` itself: it
gives a ``SequenceView``, through which every field, property and read-only method of
``engine.sequence.Sequence`` reads (``token_ids`` and ``block_table`` through a ``ReadOnlyList``,
no copy), while an assignment, ``append_token``/``extend_tokens`` and any change to those lists
are refused where they are attempted: the guard raises its ``PolicyError`` naming the policy, the
sequence, the field and the hook. A view costs one small object per sequence a hook touches
(``OfferedViews`` makes them as the policy reads the offered ones); the guard keeps one view per
sequence for a step, and a view equals (and hashes as) any other view of the same sequence.
``copy.copy``, ``copy.deepcopy`` and pickling a view give a detached ``Sequence``: a snapshot
of the policy's own (it was an AttributeError naming ``_guard``).
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Iterator
from collections.abc import Sequence as SequenceABC
from operator import attrgetter
from typing import Any, NoReturn, Protocol

from engine.sequence import Sequence

# What a view hands out through ``ReadOnlyList``; the other fields and properties read through.
LISTS = ("token_ids", "block_table")
# The methods of Sequence a view refuses (they change it); ``block`` and ``__len__`` read through.
MUTATORS = ("append_token", "extend_tokens")
READ_METHODS = ("block", "__len__", "__repr__")


class Refuser(Protocol):
    """The guard a view reports a change to (``GuardedPolicy._refuse``)."""

    def _refuse(self, seq: Sequence, field: str, how: str) -> NoReturn: ...


class SequenceView:
    """A read-only ``Sequence`` (see the module docstring)."""

    __slots__ = ("_seq", "_guard")

    def __init__(self, seq: Sequence, guard: Refuser) -> None:
        object.__setattr__(self, "_seq", seq)
        object.__setattr__(self, "_guard", guard)

    def __setattr__(self, name: str, value: Any) -> None:
        self._guard._refuse(self._seq, name, "assignment")

    def __delattr__(self, name: str) -> None:
        self._guard._refuse(self._seq, name, "del")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SequenceView):
            return self._seq is other._seq
        return NotImplemented

    def __hash__(self) -> int:
        # By the request's number, not the object's address: a set (or a dict built from one)
        # of views then iterates in the same order live and in a replay, whose Sequences are
        # other objects (hashing by address made ``for seq in set(waiting)`` decide by memory).
        return hash(self._seq.seq_id)

    def __len__(self) -> int:
        return self._seq.num_tokens

    def __repr__(self) -> str:
        return repr(self._seq)

    def __copy__(self) -> Sequence:
        """A detached snapshot (a ``Sequence`` of the policy's own, sharing no list with the
        engine's): a shallow copy would share ``token_ids`` and ``block_table``."""
        return copy.deepcopy(self._seq)

    def __deepcopy__(self, memo: dict[int, Any]) -> Sequence:
        return copy.deepcopy(self._seq, memo)

    def __reduce__(self) -> tuple[Any, tuple[Sequence]]:
        return copy.deepcopy, (self._seq,)  # pickled: the sequence's state, unpickled detached

    @property
    def token_ids(self) -> ReadOnlyList:
        return ReadOnlyList(self._seq.token_ids, self, "token_ids")

    @property
    def block_table(self) -> ReadOnlyList:
        return ReadOnlyList(self._seq.block_table, self, "block_table")

    def block(self, index: int, block_size: int) -> Any:
        """``Sequence.block``: a copy of the block's token ids, as a list."""
        return _listed(self._seq.block(index, block_size))

    def append_token(self, token_id: int) -> NoReturn:
        self._guard._refuse(self._seq, "token_ids", "append_token")

    def extend_tokens(self, token_ids: Any) -> NoReturn:
        self._guard._refuse(self._seq, "token_ids", "extend_tokens")


def _read_through() -> list[str]:
    """Sequence's fields (but the lists) and properties: each reads through a view unchanged."""
    props = [name for name, value in vars(Sequence).items() if isinstance(value, property)]
    return [name for name in (*Sequence.__slots__, *props) if name not in LISTS]


for _name in _read_through():  # a C-level getter per field: a read costs what a property does
    setattr(SequenceView, _name, property(attrgetter(f"_seq.{_name}")))


_new = object.__new__
_set_seq = SequenceView._seq.__set__  # type: ignore[attr-defined]
_set_guard = SequenceView._guard.__set__  # type: ignore[attr-defined]


def make_view(seq: Sequence, guard: Refuser) -> SequenceView:
    """``SequenceView(seq, guard)``, made without its ``__init__`` (a third of the cost)."""
    view = _new(SequenceView)
    _set_seq(view, seq)
    _set_guard(view, guard)
    return view


def real(value: Any) -> Any:
    """The sequence behind a view (anything else as it is)."""
    return value._seq if type(value) is SequenceView else value


class ReadOnlyList(SequenceABC):
    """A sequence's ``token_ids`` or ``block_table`` read in place: indexing, slicing (a copy),
    iteration, ``len``, ``in``, ``==``, ``+``; every way to change it is refused. A list to the
    policy whatever the engine holds (token ids are an int32 ``array``: engine/prompt_ids.py)."""

    __slots__ = ("_items", "_view", "_name")

    def __init__(self, items: Any, view: SequenceView, name: str) -> None:
        self._items = items
        self._view = view
        self._name = name

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return _listed(self._items[index])
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __contains__(self, value: object) -> bool:
        return value in self._items

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self._items)

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        return self._items.index(value, start, len(self._items) if stop is None else stop)

    def count(self, value: Any) -> int:
        return self._items.count(value)

    def __eq__(self, other: object) -> bool:
        items = other._items if isinstance(other, ReadOnlyList) else other
        return _listed(self._items) == _listed(items)

    __hash__ = None  # type: ignore[assignment]  # as a list

    def __add__(self, other: Any) -> Any:
        return _listed(self._items) + other

    def __radd__(self, other: Any) -> Any:
        return other + _listed(self._items)

    def __repr__(self) -> str:
        return repr(_listed(self._items))

    def _refused(self, how: str) -> NoReturn:
        view = self._view
        view._guard._refuse(view._seq, self._name, how)

    def __setitem__(self, index: Any, value: Any) -> NoReturn:
        self._refused("item assignment")

    def __delitem__(self, index: Any) -> NoReturn:
        self._refused("del")

    def __iadd__(self, other: Any) -> NoReturn:
        self._refused("+=")

    def __imul__(self, other: Any) -> NoReturn:
        self._refused("*=")


def _refusing(how: str) -> Any:
    def refuse(self: ReadOnlyList, *args: Any, **kwargs: Any) -> NoReturn:
        self._refused(how)

    refuse.__name__ = how
    return refuse


for _name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
              "fromlist", "frombytes", "byteswap"):
    setattr(ReadOnlyList, _name, _refusing(_name))


class OfferedViews(SequenceABC):
    """The sequences offered to a hook (``admit``'s waiting queue), each read as its view, made
    when the policy first reads it: a policy that looks at few of many costs few views."""

    __slots__ = ("_seqs", "_view")

    def __init__(self, seqs: tuple[Sequence, ...], view: Any) -> None:
        self._seqs = seqs
        self._view = view  # GuardedPolicy._view: the step's view of a sequence

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):  # a tuple, as the queue's own slice was
            return tuple(map(self._view, self._seqs[index]))
        return self._view(self._seqs[index])

    def __add__(self, other: Any) -> Any:
        return tuple(self) + other

    def __radd__(self, other: Any) -> Any:
        return other + tuple(self)

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator[SequenceView]:
        return map(self._view, self._seqs)

    def __reversed__(self) -> Iterator[SequenceView]:
        return map(self._view, reversed(self._seqs))

    def __contains__(self, value: object) -> bool:
        seq = real(value)
        return any(seq is s for s in self._seqs)

    def __repr__(self) -> str:
        return f"({', '.join(map(repr, self._seqs))})"

    def __getattr__(self, name: str) -> NoReturn:
        # Only a name the class lacks gets here (a read costs nothing more): a list's method
        # that changes it says why it is missing; any other keeps Python's own error (and so
        # its "Did you mean").
        text = f"{type(self).__name__!r} object has no attribute {name!r}"
        if name in _LIST_CHANGES:
            raise AttributeError(f"{text}: {_READ_ONLY}")
        raise AttributeError(text, name=name, obj=self)

    def __setitem__(self, index: Any, value: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__!r} object does not support item assignment: "
                        f"{_READ_ONLY}")

    def __delitem__(self, index: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__!r} object does not support item deletion: "
                        f"{_READ_ONLY}")


# What a list would let a policy do to the waiting queue it is offered, which is the scheduler's.
_LIST_CHANGES = frozenset(("sort", "reverse", "append", "extend", "insert", "pop", "remove",
                           "clear"))
_READ_ONLY = ("waiting is read-only (the scheduler's queue, offered in its order): for another "
              "order use sorted(waiting, key=...), for a list of your own list(waiting)")


def _listed(items: Any) -> Any:
    """``items`` as a list where the engine holds an ``array`` (a policy sees lists)."""
    return items.tolist() if isinstance(items, array) else items
