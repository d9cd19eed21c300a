"""Errors of the tracing package.

tracing never imports engine, so ``TraceError`` is a plain ``Exception``: callers that also handle
engine errors catch ``(ReplayLLMError, TraceError)``.
"""


class TraceError(Exception):
    """A trace cannot be written or read. The message is one line and names the file at fault."""


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class UnfinishedFile(TraceError):
    """A committed segment file that is missing or holds no Parquet footer: what a copy of a
    trace taken while it was being recorded can catch (a marker copied after its files'
    directory was). A reader of an incomplete trace reads the segments before it
    (``tracing.commits.UnreadTail``); anywhere else it is damage, reported as a ``TraceError``."""
