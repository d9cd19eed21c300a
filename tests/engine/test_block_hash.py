"""Block and output hashes are the same for a block given as a list or as an ``array('i')``.

What this proves: ``chain_hash`` and ``output_hash`` of an int32 array (hashed from its own
buffer, no copy) equal those of the same ids as a list (converted), and those of
``np.asarray(ids, np.int32).tobytes()`` hashed directly, with and without a parent hash.
"""

from __future__ import annotations

from array import array

import numpy as np
import xxhash

from engine.block_hash import chain_hash, output_hash, signed64
from tracing.schema import NO_HASH


def test_array_and_list_blocks_hash_alike() -> None:
    ids = np.random.default_rng(3).integers(-2**31, 2**31 - 1, 256).tolist()
    raw = np.asarray(ids, np.int32).tobytes()
    for parent in (NO_HASH, -5, 2**62):
        assert chain_hash(array("i", ids), parent, 7) == chain_hash(ids, parent, 7)
    expected = xxhash.xxh64(seed=7)
    expected.update(raw)
    assert chain_hash(array("i", ids), NO_HASH, 7) == signed64(expected.intdigest())
    assert output_hash(array("i", ids)) == output_hash(ids) == signed64(xxhash.xxh64_intdigest(raw))
    assert output_hash(array("i")) == output_hash([])
