"""The start-up status line of ``LLMEngine``, and the rule of when any progress is drawn.

``progress_wanted`` is the one rule: the engine's start-up line follows it here, and the
commands' bars (``replay.cli.progress``) are to import it from here, as ``engine`` must not
import from ``replay`` (tracing <- engine <- replay)."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def progress_wanted() -> bool:
    """Whether to draw progress: only when stderr is a terminal. A redirected or captured
    stderr (a log file, a CI job, a pipe) gets none, so it holds the command's own lines and
    not the carriage-return frames of a line redrawn many times a second. Asked at each call:
    a redirect made after import counts."""
    return sys.stderr.isatty()


class StartupProgress:
    """One transient status line on stderr while the engine starts (loading, calibrating): a
    start-up can take a while and says what it is doing; the line is erased when it is done.
    Nothing at all is written where ``progress_wanted()`` says no (``replayllm run 2> log``:
    each phase was a ``\\rstart-up: ...`` frame in the log)."""

    def __init__(self) -> None:
        self.bar = tqdm(total=None, desc="start-up", bar_format="{desc} [{elapsed}]",
                        leave=False, dynamic_ncols=True, disable=not progress_wanted())

    def phase(self, text: str) -> None:
        self.bar.set_description_str(f"start-up: {text}")

    def counter(self, done: int, total: int) -> None:
        self.bar.set_description_str(f"start-up: calibrating step times ({done}/{total})")

    def close(self) -> None:
        self.bar.close()
