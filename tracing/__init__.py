"""Event schema, sinks, the Parquet recorder and the trace reader.

``from tracing import read_trace`` is the entry point for analysis. The Parquet parts (recorder,
reader) load on first use, so the engine importing ``tracing.events`` does not pay for pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracing.errors import TraceError
from tracing.events import EventBuffer
from tracing.schema import SCHEMA_VERSION
from tracing.sink import EventSink, MemorySink

if TYPE_CHECKING:
    from tracing.reader import Trace, read_trace
    from tracing.recorder import ParquetRecorder

__all__ = [
    "SCHEMA_VERSION",
    "EventBuffer",
    "EventSink",
    "MemorySink",
    "ParquetRecorder",
    "Trace",
    "TraceError",
    "read_trace",
]

_LAZY = {
    "read_trace": "tracing.reader",
    "Trace": "tracing.reader",
    "ParquetRecorder": "tracing.recorder",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracing' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
