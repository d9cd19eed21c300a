"""Block hashes: the xxhash64 chain that keys the prefix cache, and the output hash of a
completion (signed 64-bit, the trace columns' type).

Token ids come as a list or an int32 ``array('i')`` (``engine.sequence.Sequence``); both hash
alike, as the bytes of a native int32 array.
"""

from __future__ import annotations

from array import array

import xxhash

from engine.sequence import TOKEN_TYPECODE
from tracing.schema import NO_HASH

_UINT64_SPAN = 1 << 64
_INT64_MAX = (1 << 63) - 1
_INT32 = TOKEN_TYPECODE  # a C int: 32 bits where this engine runs (checked below)
assert array(_INT32).itemsize == 4, "array('i') must hold 32-bit ints"
TokenIds = list[int] | array  # a sequence's tokens, or a block's: see ``Sequence``


def signed64(digest: int) -> int:
    """An unsigned 64-bit digest as the signed int64 the trace columns hold."""
    return digest - _UINT64_SPAN if digest > _INT64_MAX else digest


def int32_bytes(token_ids: TokenIds) -> bytes | array:
    """Token ids as the bytes of a native int32 array (``np.asarray(ids, np.int32).tobytes()``,
    made without numpy: several times faster for a block's few hundred ids), or an
    ``array('i')`` itself, whose buffer holds those bytes (xxhash reads any buffer: no copy)."""
    if type(token_ids) is array and token_ids.typecode == _INT32:
        return token_ids
    return array(_INT32, token_ids).tobytes()


def output_hash(token_ids: TokenIds) -> int:
    """xxhash64 of a completion's token ids (signed 64-bit), so replay notices a changed token."""
    return signed64(xxhash.xxh64_intdigest(int32_bytes(token_ids)))


def chain_hash(token_ids: TokenIds, parent_hash: int, seed: int) -> int:
    """xxhash64 of (parent hash, token ids) as a signed 64-bit integer (the trace column type)."""
    hasher = xxhash.xxh64(seed=seed)
    if parent_hash != NO_HASH:
        hasher.update(parent_hash.to_bytes(8, "little", signed=True))
    hasher.update(int32_bytes(token_ids))
    return signed64(hasher.intdigest())
