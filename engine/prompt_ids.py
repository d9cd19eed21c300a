"""A prompt given as token ids, checked and turned into the int32 array a ``Sequence`` holds.

A prompt's ids travel as one ``array('i')`` from the frontend to the trace: the ``Sequence``
copies its bytes, the ``request_added`` event copies them again, the recorder hands them to
Arrow, a prefill stages them for the device and the prefix cache hashes them, each a copy of a
buffer. A list of Python ints instead costs a Python object per token at each of those steps
and a pointer the garbage collector visits at every full pass while the request lives
(docs/BENCHMARKS.md 7ae).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence as SequenceABC
from typing import Any

import numpy as np

from engine.errors import InvalidRequestError
from engine.sampling_params import INT32_MAX, INT32_MIN
from engine.sequence import TOKEN_TYPECODE
from tracing.schema import is_int32_array

Bounds = tuple[int, int]


def id_bounds(ids: array) -> Bounds | None:
    """The smallest and largest id of an int32 array (None: empty), in C."""
    if not ids:
        return None
    values = np.frombuffer(ids, dtype=np.int32)
    return int(values.min()), int(values.max())


def int32_ids(ids: SequenceABC[int]) -> array | list[int]:
    """Ids already known to be ints (a tokenizer's, a checked list) as an int32 array: one
    pass in C; a list where a value is not an int32 (the engine then refuses it with its own
    message, ``check_recordable``)."""
    if is_int32_array(ids):
        return ids
    if isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype.kind in "iu":
        return prompt_token_ids(ids)[0]  # from its buffer, not an int at a time
    try:
        return array(TOKEN_TYPECODE, ids)
    except (OverflowError, TypeError):
        return list(ids)


def prompt_token_ids(prompt: Any) -> tuple[array | list[int], Bounds | None]:
    """A token-id prompt (ints, numpy's included; a list, a tuple, a numpy array or an
    ``array``) as the engine holds it, with its smallest and largest id (None: empty), or
    ``InvalidRequestError`` saying what it holds instead.

    An int32 array where every id fits one, else the list of ints (the engine refuses it then).
    The common case, ints only, is converted and bounded in C; only the 0s and 1s are looked
    at again, for ``True``/``False`` (bools are ints to ``array``, never token ids here)."""
    what = "a prompt must be a str or a list of int token ids, got"
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or prompt.dtype.kind not in "iu":
            raise InvalidRequestError(f"{what} a {prompt.ndim}-D array of {prompt.dtype}")
        if not len(prompt):
            return array(TOKEN_TYPECODE), None
        bounds = int(prompt.min()), int(prompt.max())
        if bounds[0] < INT32_MIN or bounds[1] > INT32_MAX:
            return prompt.tolist(), bounds
        return array(TOKEN_TYPECODE, prompt.astype(np.int32, copy=False).tobytes()), bounds
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, SequenceABC):
        raise InvalidRequestError(f"{what} {type(prompt).__name__}")  # bytes: ints, not ids
    if is_int32_array(prompt):
        return prompt, id_bounds(prompt)
    try:
        ids = array(TOKEN_TYPECODE, prompt)
    except (TypeError, OverflowError):
        return _checked_list(prompt, what)
    bounds = id_bounds(ids)
    if bounds is not None and bounds[0] <= 1 and bounds[1] >= 0:
        values = np.frombuffer(ids, dtype=np.int32)
        # Only a 0 or a 1 can have been a bool: those positions alone are looked at.
        if any(type(prompt[i]) is bool for i in np.flatnonzero((values >= 0) & (values <= 1))):
            _checked_list(prompt, what)  # raises, naming the bool
    return ids, bounds


def _checked_list(prompt: SequenceABC[Any], what: str) -> tuple[list[int], Bounds | None]:
    """The slow path: the prompt's ids as a list of ints (any size: the engine refuses one past
    int32), or ``InvalidRequestError`` naming the first element that is not a token id."""
    bad = next((t for t in prompt
                if isinstance(t, bool) or not isinstance(t, (int, np.integer))), None)
    if bad is not None:
        raise InvalidRequestError(f"{what} a {type(prompt).__name__} holding "
                                  f"{type(bad).__name__} {bad!r:.40}")
    token_ids = list(map(int, prompt))  # numpy's integers and int subclasses as ints
    return token_ids, (min(token_ids), max(token_ids)) if token_ids else None
