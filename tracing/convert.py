"""Turning an ``EventBuffer``'s column lists into Arrow tables, fast.

``pa.array(list)`` is ~20x slower than numpy for ints and imports pandas on first use (~0.4 s),
so every column is assembled from numpy buffers instead: about 20-40 ns per value.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from tracing.errors import TraceError
from tracing.schema import arrow_schema, column_types, is_int32_array

_NUMPY_DTYPES = {
    "int64": np.int64,
    "int32": np.int32,
    "float64": np.float64,
    "float32": np.float32,
    "bool": np.bool_,
}
_LIST_OFFSET_LIMIT = 2**31 - 1


def _numbers(
    values: Iterable, dtype: type, arrow_type: pa.DataType, count: int | None = None
) -> pa.Array:
    n = len(values) if count is None else count  # type: ignore[arg-type]
    # np.fromiter raises OverflowError on an out-of-range int instead of wrapping it.
    array = np.fromiter(values, dtype=dtype, count=n)
    if dtype is np.bool_:
        array = np.packbits(array, bitorder="little")
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(array)])


def _strings(values: list[str]) -> pa.Array:
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), data])


def _to_arrow_array(values: list, type_name: str, arrow_type: pa.DataType) -> pa.Array:
    """One column list as an Arrow array, built from numpy buffers."""
    dtype = _NUMPY_DTYPES.get(type_name)
    if dtype is not None:
        return _numbers(values, dtype, arrow_type)
    if type_name == "string":
        return _strings(values)
    if type_name.startswith("list<"):
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total > _LIST_OFFSET_LIMIT:
            raise TraceError(f"{total} list items in one segment overflow list<int32> offsets")
        item_type = arrow_type.value_type
        item_dtype = _NUMPY_DTYPES[type_name[len("list<") : -1]]
        if item_dtype is np.int32 and all(is_int32_array(v) for v in values):
            # Prompts held as int32 arrays (engine/prompt_ids.py): their bytes, joined.
            flat = pa.Array.from_buffers(item_type, total, [None, pa.py_buffer(b"".join(values))])
        else:
            flat = _numbers(itertools.chain.from_iterable(values), item_dtype, item_type, total)
        return pa.ListArray.from_buffers(
            arrow_type, len(values), [None, pa.py_buffer(offsets.astype(np.int32))], children=[flat]
        )
    raise TraceError(f"no Arrow conversion for column type {type_name!r}")


def columns_to_table(kind: str, columns: dict[str, list]) -> pa.Table:
    """An ``EventBuffer`` table (column name -> list) as a ``pyarrow.Table`` of its schema."""
    schema = arrow_schema(kind)
    types = column_types(kind)
    arrays = [_to_arrow_array(columns[f.name], types[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _flat_values(chunk: pa.Array, dtype: type) -> np.ndarray:
    """A fixed-width, null-free chunk's values as numpy, straight from its data buffer.

    ``Array.to_numpy`` would do, but it imports pandas (~0.35 s) on first use; ``verify`` needs
    nothing from pandas, so reading the buffer keeps the command fast.
    """
    if chunk.null_count:
        raise TraceError(f"unexpected nulls in a {chunk.type} column")
    data = chunk.buffers()[1]
    if dtype is np.bool_:
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[chunk.offset : chunk.offset + len(chunk)].astype(np.bool_)
    width = np.dtype(dtype).itemsize
    return np.frombuffer(data, dtype=dtype, count=len(chunk), offset=chunk.offset * width)


def column_to_python(column: pa.ChunkedArray, type_name: str) -> np.ndarray | list:
    """One column of an event table as numpy (numbers, booleans), a numpy object array (strings)
    or a list of lists (``list<...>`` columns), without going through pandas."""
    chunks = column.chunks
    dtype = _NUMPY_DTYPES.get(type_name)
    if dtype is not None:
        parts = [_flat_values(c, dtype) for c in chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
    if type_name == "string":
        values = [v for c in chunks for v in c.to_pylist()]
        return np.asarray(values, dtype=object)
    if type_name.startswith("list<"):
        item_dtype = _NUMPY_DTYPES[type_name[len("list<") : -1]]
        out: list[list] = []
        for c in chunks:
            offsets = _flat_values(c.offsets, np.int32)
            flat = _flat_values(c.values, item_dtype)
            base = int(offsets[0]) if len(offsets) else 0
            out += [flat[a - base : b - base].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
        return out
    raise TraceError(f"no numpy conversion for column type {type_name!r}")
