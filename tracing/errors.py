"""Errors of the tracing package.

tracing never imports engine, so ``TraceError`` is a plain ``Exception``: callers that also handle
engine errors catch ``(ReplayLLMError, TraceError)``.
"""


class TraceError(Exception):
    """A trace cannot be written or read. The message is one line and names the file at fault."""
