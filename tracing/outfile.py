"""Output files (an export, a report, a workload file, a plot): the one rule for where one may go.

A command writes a file output only where it cannot lose anything: never through a symbolic
link, never over a directory, never inside a trace or another replayllm output directory (a
file added there is one its owner did not write; the trace's own exports excepted), and over an
existing file only when it is an earlier output of the same kind (``is_earlier``) or, for the
commands that have the flag, with ``--force``. The check runs before any work, so a mistake is
one line at once, not after a long run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from tracing.outdir import (
    FORCE_HINT,
    OutputDirError,
    check_creatable,
    describe_os_error,
    output_dir_above,
    tmp_name,
)


def check_output_file(
    path: str | Path, what: str, is_earlier: Callable[[Path], bool], force: bool | None = None,
    own_dir: Path | None = None, own_names: frozenset[str] = frozenset(),
) -> Path:
    """Raise ``OutputDirError`` unless a new ``what`` may be written at ``path``; return it.

    ``force`` is None for a command without ``--force`` (an existing file that is not an
    earlier ``what`` is then always refused). ``own_dir`` with ``own_names``: the names this
    output may take inside that output directory (``export``'s files inside its own trace).
    Nothing is changed on disk.
    """
    if str(path) == "-":  # the shell's name for standard output, which no such file is
        raise OutputDirError(f"-: the {what} is written to a file (whole, through a temporary "
                             "sibling), not to standard output; give a file name")
    out = Path(path).expanduser()
    try:  # what keeps the checks below from answering (a name too long) is said here, once
        os.lstat(out)
    except (FileNotFoundError, NotADirectoryError):
        pass  # a new file (a parent that is a file: check_creatable says so)
    except OSError as exc:
        raise OutputDirError(f"{out}: cannot be used ({describe_os_error(exc)})") from None
    if out.is_symlink():
        raise OutputDirError(f"{out}: is a symbolic link; give the file itself")
    if out.exists() and not out.is_file():
        raise OutputDirError(f"{out}: exists and is not a regular file; choose a file name")
    check_creatable(out)  # written via a temporary sibling: its directory must take files
    above = output_dir_above(out)
    if above is not None:
        own = own_dir is not None and above == own_dir.expanduser().resolve()
        if not (own and out.resolve().parent == above and out.name in own_names):
            allowed = f" (only {', '.join(sorted(own_names))} may be written there)" if own else ""
            raise OutputDirError(f"{out}: is inside {above}, a trace or replayllm output "
                                 f"directory{allowed}; write the {what} elsewhere")
    if out.exists() and not force and not is_earlier(out):
        hint = FORCE_HINT if force is not None else "choose another name or remove it yourself"
        raise OutputDirError(f"{out}: exists and is not an earlier {what}; {hint}")
    return out


def starts_with(prefix: bytes) -> Callable[[Path], bool]:
    """An ``is_earlier`` test: the file's first bytes are ``prefix``."""

    def test(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                return f.read(len(prefix)) == prefix
        except OSError:
            return False

    return test


def holds(marker: bytes, within: int = 4096) -> Callable[[Path], bool]:
    """An ``is_earlier`` test: ``marker`` is in the file's first ``within`` bytes."""

    def test(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                return marker in f.read(within)
        except OSError:
            return False

    return test


def write_via_temporary(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` for a hidden temporary sibling of ``path``, then rename it over
    ``path``: a failure leaves ``path`` as it was and no temporary behind (one line for an
    ``OSError``, such as a full disk)."""
    out = Path(path).expanduser()
    tmp = tmp_name(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a leftover, or a symlink planted there: never written through
        write(tmp)
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputDirError(f"{out}: cannot write ({describe_os_error(exc)}); "
                             "nothing was left there") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out
