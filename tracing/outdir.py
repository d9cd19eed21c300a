"""Output directories and files that replayllm writes, and the only ones it may replace.

A command replaces an output only when it can prove a replayllm command wrote it: the directory
holds ``OWNER_FILE`` (written when the output was made, naming its kind and, for a directory
written whole, its files), nothing else, is not the working directory or one of its parents, and
no process holds its ``LOCK_FILE``. A trace being recorded holds that lock until it is closed.
A complete trace is replaced only with ``force``; a whatif or tune result or a checkpoint is always
written into a fresh temporary sibling and renamed into place, so a crash or a full disk
never leaves a partial output under the final name.

Every file is created under a hidden temporary name with ``O_EXCL | O_NOFOLLOW`` (a symlink
planted there is never followed) and renamed over the final name (a rename replaces a planted
link itself, not what it points to).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracing.errors import TraceError, one_line

OWNER_FILE = ".replayllm-output.json"
# A trace's header and commit markers' directory (tracing.layout.HEADER_FILE, COMMITS_DIR).
TRACE_HEADER, TRACE_COMMITS = "run.json", "_commits"
LOCK_FILE = ".replayllm.lock"
OWNER_MAGIC = "replayllm-output"
FILE_MODE = 0o644
# Kinds of output; a trace's own entries are listed by the caller (tracing.layout).
TRACE, WHATIF, TUNE, CHECKPOINT = "trace", "whatif", "tune", "checkpoint"
FORCE_HINT = "pass --force (force=True to LLM in Python) to replace it"


class OutputDirError(TraceError):
    """An output path cannot be used or replaced; the message says why and what to do."""


def describe_os_error(exc: OSError) -> str:
    """``No space left on device`` and friends: the strerror, else the first line."""
    return exc.strerror or one_line(exc)


# --- files ----------------------------------------------------------------------------------------
def tmp_name(final: Path) -> Path:
    """The hidden name a file is written under before it is renamed to ``final``."""
    return final.with_name(f".{final.name}.tmp")


def create_exclusive(path: Path) -> int:
    """A new file at ``path`` opened for writing: an old file (or a planted symlink) there is
    unlinked first, and the open never follows a symlink."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file_atomic(path: Path, data: bytes, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary name and a rename; on any error the
    temporary file is removed and ``path`` is untouched (``OSError`` propagates)."""
    tmp = tmp_name(path)
    try:
        fd = create_exclusive(tmp)
        try:
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_dir_nofollow(path: Path) -> None:
    """``mkdir -p`` for a directory inside an output, refusing a symlink planted in its place."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    if path.is_symlink() or not path.is_dir():
        raise OutputDirError(f"{path}: not a directory replayllm made (a symlink or a file "
                             "was put there); refusing to write through it")


# --- ownership ------------------------------------------------------------------------------------
def read_owner(path: Path) -> dict[str, Any] | None:
    """The owner record of output directory ``path``, or None if it has none (or a bad one)."""
    owner = path / OWNER_FILE
    if owner.is_symlink() or not owner.is_file():
        return None
    try:
        data = json.loads(owner.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("magic") != OWNER_MAGIC:
        return None
    if not isinstance(data.get("kind"), str):
        return None
    return data


def write_owner(path: Path, kind: str, command: str, files: list[str] | None = None) -> None:
    record: dict[str, Any] = {"magic": OWNER_MAGIC, "kind": kind, "command": command}
    if files is not None:
        record["files"] = sorted(files)
    write_file_atomic(path / OWNER_FILE, (json.dumps(record, indent=2) + "\n").encode())


def output_dir_above(path: Path) -> Path | None:
    """The nearest directory above ``path`` that is a trace (holds ``run.json``) or another
    replayllm output (holds its owner record), or None: no output is written inside one."""
    try:
        parent = path.expanduser().resolve().parent
    except (OSError, RuntimeError):
        return None
    for directory in (parent, *parent.parents):
        # A header beside a commits directory: a trace, also one copied without its owner
        # record (a run.json alone may be anybody's).
        trace = (directory / TRACE_HEADER).is_file() and (directory / TRACE_COMMITS).is_dir()
        if trace or read_owner(directory) is not None:
            return directory
    return None


def check_creatable(path: Path) -> None:
    """Raise ``OutputDirError`` unless ``path``'s directory exists or can be made: its nearest
    existing ancestor must be a directory this process may write in. Checked before any work,
    so a long run's output is never lost at the end (``--out notes.txt/x``)."""
    ancestor = path.expanduser().absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputDirError(f"{path}: cannot be created: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        if _read_only_file_system(ancestor):  # access() says no there too, whoever asks
            raise OutputDirError(
                f"{path}: cannot be created: {ancestor} is on a read-only file system")
        raise OutputDirError(f"{path}: cannot be created: no permission to write in {ancestor}")


def _read_only_file_system(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _is_cwd_or_ancestor(path: Path) -> bool:
    try:
        here = Path.cwd().resolve()
    except OSError:
        return False
    target = path.resolve()
    return here == target or target in here.parents


def _allowed_entries(owner: dict[str, Any], trace_entries: frozenset[str]) -> frozenset[str]:
    if owner["kind"] == TRACE:
        return trace_entries | {OWNER_FILE, LOCK_FILE}
    files = owner.get("files")
    names = files if isinstance(files, list) else []
    return frozenset(str(n) for n in names) | {OWNER_FILE, LOCK_FILE}


def check_output_dir(
    path: Path, kind: str, force: bool, trace_entries: frozenset[str] = frozenset(),
    complete: Any = None,
) -> bool:
    """Raise ``OutputDirError`` unless a new ``kind`` output may be written at ``path``.

    Returns True when an older output of replayllm's is there and is to be replaced. ``complete``
    (``path -> bool``) says whether an old trace is complete: only ``force`` replaces one that
    is; for other kinds ``force`` is always needed. Nothing is changed on disk.
    """
    if path.is_symlink():
        raise OutputDirError(f"{path}: is a symbolic link; give the directory itself")
    if (above := output_dir_above(path)) is not None:
        raise OutputDirError(f"{path}: is inside {above}, a trace or replayllm output "
                             "directory; choose an output outside it")
    if not path.exists():
        check_creatable(path)
        return False
    if not path.is_dir():
        raise OutputDirError(f"{path}: exists and is not a directory; choose another output")
    try:
        entries = sorted(os.listdir(path))
    except OSError as exc:
        raise OutputDirError(f"{path}: cannot list ({describe_os_error(exc)})") from None
    if not entries:
        return False
    if _is_cwd_or_ancestor(path):
        raise OutputDirError(f"{path}: is the working directory or one of its parents; "
                             "replayllm never replaces it")
    owner = read_owner(path)
    if owner is None:
        raise OutputDirError(f"{path}: holds files replayllm did not write (no {OWNER_FILE}); "
                             "choose another output or empty it yourself")
    if owner["kind"] != kind:
        raise OutputDirError(f"{path}: holds a replayllm {owner['kind']}, not a {kind}; "
                             "choose another output")
    foreign = [e for e in entries if e not in _allowed_entries(owner, trace_entries)]
    if foreign:
        raise OutputDirError(f"{path}: holds {foreign[0]!r}, which replayllm did not write; "
                             "move it away or choose another output")
    if kind == TRACE:
        if holder := lock_holder(path):
            raise OutputDirError(being_recorded(path, holder))
        if not force and complete is not None and complete(path):
            raise OutputDirError(f"{path}: already holds a complete trace; {FORCE_HINT}")
    elif not force:
        raise OutputDirError(f"{path}: already holds a replayllm {kind}; {FORCE_HINT}")
    return True


def replace_dir(path: Path) -> None:
    """Remove the old output at ``path`` (checked by ``check_output_dir``): renamed aside first,
    so a failure half-way leaves either the old output whole or nothing under its name."""
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    try:
        os.replace(path, aside / path.name)
    except OSError as exc:
        os.rmdir(aside)
        raise OutputDirError(f"{path}: cannot replace ({describe_os_error(exc)}); "
                             "nothing was removed") from None
    _remove_aside(aside)


def _remove_aside(aside: Path) -> None:
    failed: list[str] = []
    shutil.rmtree(aside, onerror=lambda _f, p, _e: failed.append(p))
    if failed:
        print(f"replayllm: warning: could not remove all of the old output moved to {aside}",
              file=sys.stderr)


# --- locks ----------------------------------------------------------------------------------------
class DirLock:
    """An exclusive lock on an output directory, held until ``release`` (or process exit)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lock = path / LOCK_FILE
        try:
            self.fd: int | None = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        except OSError as exc:
            raise OutputDirError(f"{lock}: cannot lock ({describe_os_error(exc)})") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise OutputDirError(being_recorded(path, lock_holder(path))) from None
            raise OutputDirError(f"{lock}: cannot lock ({describe_os_error(exc)})") from None
        try:
            os.ftruncate(self.fd, 0)
            write_all(self.fd, f"pid {os.getpid()}\n".encode())
        except OSError as exc:  # a full disk: no lock held, one line
            self.abandon()
            raise OutputDirError(f"{lock}: cannot write ({describe_os_error(exc)})") from None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def abandon(self) -> None:
        """Release after a failed start (a full disk): with no owner record written, the lock
        file is this start's only trace, and is removed, so the directory can be used again
        rather than refused as holding files replayllm did not write."""
        self.release()
        if not (self.path / OWNER_FILE).exists():
            with contextlib.suppress(OSError):
                os.unlink(self.path / LOCK_FILE)


def being_recorded(path: Path, holder: str | None) -> str:
    """The refusal of a directory another recorder holds, naming it: an engine of this very
    process (not closed yet) is told apart from another process."""
    if holder == f"pid {os.getpid()}":
        return (f"{path}: is being recorded by another process ({holder}: this one, by an "
                "engine not closed yet; close() it first)")
    return f"{path}: is being recorded by another process ({holder or 'lock held'})"


def lock_holder(path: Path) -> str | None:
    """Who holds ``path``'s lock (``"pid N"``), or None when nobody does."""
    lock = path / LOCK_FILE
    if lock.is_symlink() or not lock.is_file():
        return None
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        try:
            text = os.read(fd, 64).decode("ascii", "replace").strip()
        except OSError:
            text = ""
        return text or "lock held"
    finally:
        os.close(fd)
    return None


# --- outputs written whole ------------------------------------------------------------------------
def _make_stage(final: Path) -> Path:
    """A fresh hidden sibling of ``final``, made by ``mkdir`` so that it gets a new directory's
    mode under the umask (``mkdtemp``'s is 0700: the output stayed private to its writer)."""
    for _ in range(100):
        stage = final.parent / f".{final.name}.tmp-{secrets.token_hex(4)}"
        try:
            os.mkdir(stage)
        except FileExistsError:
            continue
        return stage
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(final.parent))


@contextlib.contextmanager
def _commit_lock(directory: Path) -> Iterator[None]:
    """Held while an output is put in place in ``directory``: two replayllm commands finishing
    into one output at once take turns (the later one's output replaces the earlier's, as it
    would minutes later). Best effort where a file system has no ``flock`` on directories."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the flock


@contextlib.contextmanager
def staged_dir(path: str | Path, kind: str, command: str, force: bool) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``path`` to write a whole output into; on success it
    is renamed to ``path`` (an old output of the same kind replaced, as ``check_output_dir``
    allows), on any error it is removed and ``path`` is untouched.

    ``OSError`` while writing (a full disk) becomes one ``OutputDirError`` line.
    """
    final = Path(path).expanduser()
    check_output_dir(final, kind, force)  # before the work; again when it is put in place
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        stage = _make_stage(final)
    except OSError as exc:
        raise OutputDirError(f"{final}: cannot create ({describe_os_error(exc)})") from None
    try:
        yield stage
        write_owner(stage, kind, command, [p.name for p in stage.iterdir()])
        with _commit_lock(final.parent):
            # Checked again: another command may have written ``path`` during this one's work
            # (two whatifs into one --out); the check before it saw none, and the rename then
            # failed on the other's files, this command's output lost.
            if check_output_dir(final, kind, force):
                replace_dir(final)
            elif final.is_dir():
                os.rmdir(final)  # an empty directory was there
            os.rename(stage, final)
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        raise OutputDirError(f"{final}: cannot write ({describe_os_error(exc)}); "
                             "nothing was left there") from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
