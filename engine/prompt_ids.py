"""A prompt given as token ids, checked and turned into the list of ints a ``Sequence`` holds."""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from typing import Any

import numpy as np

from engine.errors import InvalidRequestError


def token_id_list(prompt: Any) -> tuple[list[int], tuple[int, int] | None]:
    """A token-id prompt (ints, numpy's included) as a list of ints and its smallest and largest
    id (None: empty), or ``InvalidRequestError`` saying what it holds instead.

    The all-``int`` list, the common case, is checked, copied and bounded in C (``min``/``max``:
    a per-token Python check cost ~60 us per 560-token prompt, docs/gpu-notes.md, session 4);
    its ids stay the caller's objects (new ones cost more than the passes: benchmarks/intake.py).
    """
    what = "a prompt must be a str or a list of int token ids, got"
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or prompt.dtype.kind not in "iu":
            raise InvalidRequestError(f"{what} a {prompt.ndim}-D array of {prompt.dtype}")
        prompt = prompt.tolist()
    elif isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, SequenceABC):
        raise InvalidRequestError(f"{what} {type(prompt).__name__}")  # bytes: ints, not ids
    if set(map(type, prompt)) <= {int}:
        token_ids = list(prompt)
    else:
        bad = next((t for t in prompt
                    if isinstance(t, bool) or not isinstance(t, (int, np.integer))), None)
        if bad is not None:
            raise InvalidRequestError(f"{what} a {type(prompt).__name__} holding "
                                      f"{type(bad).__name__} {bad!r:.40}")
        token_ids = list(map(int, prompt))  # numpy's integers and int subclasses as ints
    return token_ids, (min(token_ids), max(token_ids)) if token_ids else None
