"""Prompt recipes: a prompt described by prefix-block ids and a length instead of its tokens.

A recipe's tokens follow one rule, so a recipe is as good as its tokens for prefix caching:
token ``j`` of a prompt lies in recipe block ``k = j // block_size``; where the recipe names an id
for that block (``hash_ids[k]``), the token depends only on ``(hash_ids[k], j % block_size)``, so
equal ids give identical token blocks in any prompt; past the named blocks it depends only on
``(salt, j)``, unique to the request when its salt is. Whatever block size the engine runs with,
its blocks then share contents exactly where the recipe's ids say (Mooncake's ``hash_ids`` are
chained like prefix hashes: equal ids mean equal prefixes, hence equal engine-block hashes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Every recipe token lies in [0, RECIPE_TOKEN_RANGE): below the vocabulary of every model here
# (the engine checks the vocabulary; the reference workload draws from the same range).
RECIPE_TOKEN_RANGE = 10000
_NAMED, _TAIL = np.uint64(0x5851F42D4C957F2D), np.uint64(0x14057B7EF767814F)
_POSITION = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    return _mix_in_place(np.array(x, dtype=np.uint64))


def _mix_in_place(x: np.ndarray) -> np.ndarray:
    """``_mix`` written into ``x`` (a uint64 array), which it returns."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


_MASK = (1 << 64) - 1
_POSITION_INT, _M1_INT, _M2_INT = int(_POSITION), int(_M1), int(_M2)


def _mix_int(x: int) -> int:
    """``_mix`` on one plain int."""
    x = ((x ^ (x >> 30)) * _M1_INT) & _MASK
    x = ((x ^ (x >> 27)) * _M2_INT) & _MASK
    return x ^ (x >> 31)


@dataclass(frozen=True)
class PromptRecipe:
    """A prompt of ``length`` tokens: blocks named by ``hash_ids`` of ``block_size`` tokens
    each, then tokens unique to ``salt``."""

    hash_ids: tuple[int, ...]
    block_size: int
    length: int
    salt: int = 0

    def __len__(self) -> int:
        return self.length

    def clipped(self, length: int) -> PromptRecipe:
        """The first ``length`` tokens (the same tokens as this recipe's first ``length``)."""
        if length >= self.length:
            return self
        keep = -(-length // self.block_size)
        return PromptRecipe(self.hash_ids[:keep], self.block_size, length, self.salt)

    def token_ids(self) -> list[int]:
        """The prompt's token ids (the module rule)."""
        return self.tokens().tolist()

    def tokens(self) -> np.ndarray:
        """The prompt's token ids as an int32 array."""
        return recipe_tokens([self])[0]

    def block_keys(self, block_size: int) -> np.ndarray:
        """One key per full block of ``block_size`` tokens, equal exactly where the chained
        contents (the block and every token before it) are: by the module rule they are fixed by
        the ids of the recipe blocks up to the block's end, the salt once it reaches past them,
        and where it ends. (Two prompts' blocks share a key iff their engine hashes agree.)"""
        ends = np.arange(block_size, self.length + 1, block_size, dtype=np.int64)
        chained = [0]  # chained[k]: of ids[:k] (plain ints: a scalar numpy op costs more)
        for h in self.hash_ids:
            chained.append(_mix_int((chained[-1] * _POSITION_INT ^ h) & _MASK))
        chain = np.asarray(chained, dtype=np.uint64)
        with np.errstate(over="ignore"):
            named = min(len(self.hash_ids) * self.block_size, self.length)
            covering = np.minimum((ends - 1) // self.block_size + 1, len(self.hash_ids))
            salt = np.uint64(self.salt & 0xFFFFFFFFFFFFFFFF)
            tail = np.where(ends > named, _mix(np.asarray([salt ^ _TAIL]))[0], np.uint64(0))
            return _mix(chain[covering] ^ (ends.astype(np.uint64) * _POSITION) ^ tail)


def recipe_tokens(recipes: list[PromptRecipe]) -> list[np.ndarray]:
    """Each recipe's token ids as an int32 array (the module rule), computed for all of them
    in one pass over their concatenated positions (a numpy call per batch, not per prompt)."""
    if not recipes:
        return []
    lengths = np.fromiter((r.length for r in recipes), np.int64, len(recipes))
    num_ids = np.fromiter((len(r.hash_ids) for r in recipes), np.int64, len(recipes))
    if not num_ids.any():  # no named blocks: every token is a tail token
        return _tail_tokens(recipes, lengths)
    block = np.fromiter((r.block_size for r in recipes), np.int64, len(recipes))
    named = np.minimum(num_ids * block, lengths)
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    row_of = np.repeat(np.arange(len(recipes)), lengths)
    positions = np.arange(total, dtype=np.int64) - starts[row_of]
    head = positions < named[row_of]
    out = np.empty(total, dtype=np.uint64)
    with np.errstate(over="ignore"):
        if head.any():
            ids = np.asarray([h for r in recipes for h in r.hash_ids],
                             dtype=np.int64).astype(np.uint64)
            id_start = np.cumsum(num_ids) - num_ids
            rows, where = row_of[head], positions[head]
            index = id_start[rows] + where // block[rows]
            offsets = (where % block[rows]).astype(np.uint64)
            out[head] = _mix((ids[index] * _POSITION + offsets) ^ _NAMED)
        tail = ~head
        if tail.any():
            salts = np.asarray([r.salt & 0xFFFFFFFFFFFFFFFF for r in recipes], dtype=np.uint64)
            salt = salts[row_of[tail]]
            where = positions[tail].astype(np.uint64)
            out[tail] = _mix(((where + salt * _POSITION) * _POSITION) ^ _TAIL ^ salt)
        tokens = (out % np.uint64(RECIPE_TOKEN_RANGE)).astype(np.int32)
    return np.split(tokens, np.cumsum(lengths)[:-1])


def _tail_tokens(recipes: list[PromptRecipe], lengths: np.ndarray) -> list[np.ndarray]:
    """``recipe_tokens`` of recipes that name no blocks: the tail rule,
    ``_mix(((position + salt * P) * P) ^ TAIL ^ salt) % RECIPE_TOKEN_RANGE``, in place over the
    concatenated positions. Wrapping uint64 arithmetic is exact modulo 2**64, so ``position +
    salt * P`` is taken as ``index + (salt * P - start)``, the per-prompt terms repeated once
    each rather than computed per token, and ``_mix`` reuses one scratch array."""
    ends = np.cumsum(lengths)
    salts = np.fromiter((r.salt & 0xFFFFFFFFFFFFFFFF for r in recipes), np.uint64, len(recipes))
    with np.errstate(over="ignore"):
        x = np.arange(int(ends[-1]), dtype=np.uint64)
        x += np.repeat(salts * _POSITION - (ends - lengths).astype(np.uint64), lengths)
        x *= _POSITION
        x ^= np.repeat(salts ^ _TAIL, lengths)
        scratch = np.empty_like(x)
        for shift, factor in ((30, _M1), (27, _M2), (31, None)):  # ``_mix_in_place``'s steps
            np.right_shift(x, np.uint64(shift), out=scratch)
            x ^= scratch
            if factor is not None:
                x *= factor
        x %= np.uint64(RECIPE_TOKEN_RANGE)
    return np.split(x.astype(np.int32), ends[:-1])
