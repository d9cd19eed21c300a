"""Where a user policy went wrong: the file and line of the user's code in a failure.

``GuardedPolicy`` (engine/policy_guard.py) reports a hook's exception, and a refused change to a
sequence, as one ``PolicyError`` line; this module finds the line to name in it. ``PolicyCode``
knows which files are the policy's (its class's and bases' modules, even where installed);
``described`` turns an exception into ``TypeName: text (file.py:line)`` at the innermost frame of
that code, else of the user's, never the engine's or a library's it called into; ``caller`` does
the same for the frame running now.
"""

from __future__ import annotations

import builtins
import difflib
import inspect
import os
import sys
import sysconfig
from collections.abc import Iterable

# The guard, its views, engine/policy.py and this module: a failure's location is outside them.
OWN_FILES = frozenset(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    for name in ("policy.py", "policy_guard.py", "policy_view.py", "policy_where.py"))


# Code that is not a policy's: the engine package (a view reads through to engine/sequence.py,
# step to the scheduler) and the installed libraries (the standard library, site-packages).
_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARY_DIRS = tuple(sorted({
    os.path.abspath(path) + os.sep
    for path in (*(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib",
                                                          "platlib")), os.path.dirname(os.__file__))
    if path}))


class PolicyCode:
    """Where a user's code lives, to locate a policy's failure at its innermost frame there:
    not the engine, not a library it called into (``scheduler.py:161``, ``statistics.py:432``
    made the engine or the library look broken), but the policy, its helpers, and the files (a
    package: the directories) of the policy's class and bases even where installed."""

    def __init__(self, cls: type | None = None) -> None:
        files, dirs = set(), set()
        for klass in getattr(cls, "__mro__", ()):
            module = sys.modules.get(klass.__module__)
            if module is None or klass.__module__ in ("builtins", "engine.policy"):
                continue
            paths = getattr(sys.modules.get(klass.__module__.partition(".")[0]), "__path__", ())
            dirs.update(os.path.abspath(p) + os.sep for p in paths)
            if not paths and getattr(module, "__file__", None):
                files.add(os.path.abspath(module.__file__))
        self.files, self.dirs = frozenset(files), tuple(sorted(dirs))

    def users(self, filename: str) -> bool:
        path = os.path.abspath(filename)
        if path in self.files or path.startswith(self.dirs):
            return True
        return not (filename.startswith("<") or path.startswith((_ENGINE_DIR, *_LIBRARY_DIRS)))


_NO_CODE = PolicyCode()


def _located(frames: Iterable[tuple[str, int]], code: PolicyCode) -> str | None:
    """``file.py:line`` of the innermost of ``frames`` (outermost first) in the user's code,
    else outside this guard and its views."""
    users = outside = None
    for name, line in frames:
        if os.path.abspath(name) not in OWN_FILES:
            outside = f"{os.path.basename(name)}:{line}"
            users = outside if code.users(name) else users
    return users or outside


def _meant(exc: BaseException) -> str:
    """Python's "Did you mean" for a misspelt attribute or name (its traceback shows it; the
    exception's text lacks it), found among the object's public names or the frame's names."""
    name = getattr(exc, "name", None)
    if not isinstance(name, str):
        return ""
    if isinstance(exc, AttributeError) and getattr(exc, "obj", None) is not None:
        names = [n for n in dir(exc.obj) if not n.startswith("_")]  # type: ignore[attr-defined]
    elif isinstance(exc, NameError) and exc.__traceback__ is not None:
        tb = exc.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        frame = tb.tb_frame
        names = [*frame.f_locals, *frame.f_globals, *vars(builtins)]
    else:
        return ""
    close = difflib.get_close_matches(name, names, n=1)
    return f". Did you mean: {close[0]!r}?" if close else ""


def described(exc: BaseException, code: PolicyCode = _NO_CODE) -> str:
    """``TypeName: first line (file.py:line)``, at the innermost frame of the policy's code
    (``code``), else of the user's, else outside this guard and engine/policy.py (none when it
    failed in the call itself)."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}{_meant(exc)}" if lines else type(exc).__name__
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    where = _located(frames, code)
    return f"{text} ({where})" if where else text


def caller(code: PolicyCode = _NO_CODE) -> str | None:
    """``file.py:line`` of the frame now running that ``_located`` picks."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back  # type: ignore[assignment]
    return _located(reversed(frames), code)


def not_a_method(policy: object, base: type, hooks: Iterable[str]) -> str | None:
    """What is wrong with the first of ``hooks`` that ``policy`` holds as something not
    callable (``eviction_key = 3``: a typo, or a setting given a hook's name): its value, where
    it was set and the ``def`` it needs (``base``'s signature); None when every hook is
    callable. Checked when the policy is built: the hook's call said only "TypeError: 'int'
    object is not callable in eviction_key", as if the hook's code had failed, and only when
    the scheduler first called it (mid-run, or never in a run that needed no ``victim``)."""
    for hook in hooks:
        try:
            value = getattr(policy, hook)
        except Exception as exc:  # a property that raises: the policy's code, located
            return f"reading {hook} raised {described(exc, PolicyCode(type(policy)))}"
        if callable(value):
            continue
        if hook in getattr(policy, "__dict__", {}):
            where = "set on the instance (in __init__)"
        else:
            owner = next(k for k in type(policy).__mro__ if hook in vars(k))
            kind = "a property" if isinstance(vars(owner)[hook], property) else \
                "a class attribute"
            where = f"{kind} of {owner.__qualname__}"
        params = ", ".join(inspect.signature(getattr(base, hook)).parameters)
        return (f"{hook} is {value!r:.60} ({type(value).__name__}), {where}, not a method: a "
                f"hook is defined as def {hook}({params}) (a setting needs a name of its own)")
    return None
