"""Scheduling policies: the decisions of a step, apart from the bookkeeping of making them.

A policy answers four questions: which waiting requests to admit this step (``admit``), how many
prompt tokens of a sequence to compute this step (``chunk``), which sequence to preempt when a
decode needs a KV block and none is free (``victim``), and which cached free block to evict first
(``eviction_key``). It may read a request's priority (``Step.priority``). The ``Scheduler`` and
``BlockManager`` do everything else: they check each answer against the budgets and the pool,
allocate, hash, free and emit every event, so a policy cannot break accounting or the trace.

Write one by subclassing ``Policy`` (its defaults are Nano-vLLM's ``prefill_first``) and select it
with ``Config(policy="package.module:ClassName")`` or ``--set policy=package.module:ClassName``;
docs/policies.md shows one and how to test it with ``replay.testing``. A policy given by import
path runs inside ``engine.policy_guard.GuardedPolicy``: an exception, a wrong answer or a change
to a sequence it is offered (its hooks get read-only views) is one ``PolicyError`` line naming it.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import ConfigError
from engine.policy_guard import GuardedPolicy, NoProgressError, PolicyError
from engine.policy_where import PolicyCode, described, not_a_method

if TYPE_CHECKING:
    from engine.sequence import Sequence

# The engine's Config (engine/config.py imports this module to validate Config.policy, so the
# type is named, not imported: no import cycle, not even for type checking).
EngineConfig = Any


class Step:
    """What a policy may read while the scheduler builds one step. Read-only.

    ``tokens_left`` / ``seqs_left``: what remains of ``max_num_batched_tokens`` and
    ``max_num_seqs`` for this step; ``free_blocks``: free KV blocks now; ``can_allocate(seq)``:
    whether the pool can give a waiting sequence its blocks now; ``priority(seq)``: the priority
    the request was added with (lower is served first, default 0).
    """

    __slots__ = ("_tokens_left", "_seqs_left", "_free", "_can_allocate", "_priority")

    def __init__(
        self,
        tokens: int,
        seqs: int,
        free_blocks: Callable[[], int],
        can_allocate: Callable[[Sequence], bool],
        priority: Callable[[Sequence], int],
    ) -> None:
        self._tokens_left = tokens
        self._seqs_left = seqs
        self._free = free_blocks
        self._can_allocate = can_allocate
        self._priority = priority

    @property
    def tokens_left(self) -> int:
        return self._tokens_left

    @property
    def seqs_left(self) -> int:
        return self._seqs_left

    @property
    def free_blocks(self) -> int:
        return self._free()

    def can_allocate(self, seq: Sequence) -> bool:
        return self._can_allocate(seq)

    def priority(self, seq: Sequence) -> int:
        return self._priority(seq)

    def _charge(self, tokens: int, seqs: int = 1) -> None:
        """The scheduler's bookkeeping: ``seqs`` sequences and ``tokens`` tokens taken."""
        self._tokens_left -= tokens
        self._seqs_left -= seqs


@dataclass(frozen=True)
class FreeBlock:
    """A block as it enters the free list: what an eviction order may rank it by.

    ``released``: a counter of releases (larger = later); ``last_used``: the last step a
    scheduled sequence held the block (-1: never); ``cached``: it holds a hashed full block.
    """

    block_id: int
    released: int
    last_used: int
    cached: bool


def release_order(block: FreeBlock) -> Any:
    """Evict the block released longest ago (a sequence releases its last block first): the
    order of vLLM's free block queue, and this engine's since its first trace."""
    return block.released


def lru_order(block: FreeBlock) -> Any:
    """Evict the block unused for longest: the last step a scheduled sequence held it, then
    release order. Differs from ``release_order`` when a holder sat unscheduled before it let go
    (beyond ``max_num_seqs`` or the token budget, or preempted while waiting its turn)."""
    return (block.last_used, block.released)


EVICTION_ORDERS: dict[str, Callable[[FreeBlock], Any]] = {
    "release": release_order,
    "lru": lru_order,
}


class Policy:
    """Nano-vLLM's policy (``prefill_first``); subclass it and override what you change.

    ``mixed_batches`` False: a step either admits (a prefill step) or, when nothing is admitted,
    runs the running sequences; True: running sequences first (prompt chunks and decodes), then
    admissions fill what is left of the budget, in one step.
    """

    name = "prefill_first"
    mixed_batches = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._eviction = EVICTION_ORDERS[config.eviction]

    def admit(self, waiting: SequenceABC[Sequence], step: Step) -> Iterable[Sequence]:
        """The waiting sequences to admit this step, in order (a generator sees ``step`` after
        each admission). ``waiting`` is the queue: arrival order, preempted ones at the front.

        The scheduler stops admitting at the first one that finds no room (blocks, a sequence
        slot, a token); under the inherited whole-prompt ``chunk`` a prompt yielded past
        ``step.tokens_left`` is a ``PolicyError``. Default: first come first served while the
        whole prompt fits the token budget (cached tokens count, as in Nano-vLLM).
        """
        for seq in waiting:
            if seq.num_tokens > step.tokens_left:
                return
            yield seq

    def chunk(self, seq: Sequence, remaining: int, step: Step) -> int:
        """How many of the ``remaining`` uncomputed prompt tokens of ``seq`` to compute this step
        (at least 1, at most ``min(remaining, step.tokens_left)``). Default: all of them."""
        return remaining

    def victim(self, candidates: SequenceABC[Sequence], step: Step) -> Sequence:
        """The sequence to preempt when a decode needs a block and none is free.

        ``candidates``: the sequence that needs the block, then the running sequences not yet
        scheduled this step, oldest admitted first. Choosing the first gives up its own place.
        Default: the newest (Nano-vLLM).
        """
        return candidates[-1]

    def eviction_key(self, block: FreeBlock) -> Any:
        """Rank of a block entering the free list: the smallest key is evicted (handed out
        fresh) first; ties go to the earlier release. Default: ``Config.eviction``'s order."""
        return self._eviction(block)

    def block_eviction_key(self) -> Callable[[FreeBlock], Any]:
        """What the block manager ranks free blocks by: ``release_order`` itself where this
        policy ranks by it (``eviction_key`` not overridden; the manager then keeps the free
        list's own order and no heap), else ``eviction_key``."""
        if type(self).eviction_key is Policy.eviction_key and self._eviction is release_order:
            return release_order
        return self.eviction_key


class Chunked(Policy):
    """Decodes first, then prompt chunks under the token budget (vLLM v1, Sarathi)."""

    name = "chunked"
    mixed_batches = True

    def admit(self, waiting: SequenceABC[Sequence], step: Step) -> Iterable[Sequence]:
        """First come first served while a token is left (a prompt may start with one chunk)."""
        for seq in waiting:
            if step.tokens_left <= 0:
                return
            yield seq

    def chunk(self, seq: Sequence, remaining: int, step: Step) -> int:
        return min(remaining, step.tokens_left)


class PriorityPolicy(Policy):
    """``prefill_first`` by request priority (lower first, then arrival); preempts the lowest
    priority, newest first (vLLM's priority scheduling)."""

    name = "priority"

    def admit(self, waiting: SequenceABC[Sequence], step: Step) -> Iterable[Sequence]:
        order = sorted(range(len(waiting)), key=lambda i: (step.priority(waiting[i]), i))
        return super().admit([waiting[i] for i in order], step)

    def victim(self, candidates: SequenceABC[Sequence], step: Step) -> Sequence:
        worst = max(range(len(candidates)), key=lambda i: (step.priority(candidates[i]), i))
        return candidates[worst]


# The methods a policy answers the scheduler with (checked callable when a user's is built).
HOOKS = ("admit", "chunk", "victim", "eviction_key")

BUILTIN_POLICIES: dict[str, type[Policy]] = {
    "prefill_first": Policy,
    "chunked": Chunked,
    "priority": PriorityPolicy,
}
# Built-ins that admit whole prompts: the token budget must hold the longest one.
WHOLE_PROMPT_POLICIES = ("prefill_first", "priority")


def is_import_path(name: str) -> bool:
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr)


def policy_class(name: str) -> type[Policy]:
    """The class a ``Config.policy`` names: a built-in or ``package.module:ClassName``."""
    if not isinstance(name, str):
        # The class itself (``workloads(policies=(MyPolicy,))``) where its path belongs: a
        # trace header, verify and the what-if rebuild a policy from its import path alone.
        cls = name if isinstance(name, type) else type(name)
        if issubclass(cls, Policy):
            raise ConfigError(f"policy {name!r}: give a policy by its import path as a string, "
                              f"'{cls.__module__}:{cls.__qualname__}', not the class")
        raise ConfigError(f"policy must be a built-in's name or an import path "
                          f"package.module:ClassName, a string; got {name!r:.60}")
    if name in BUILTIN_POLICIES:
        return BUILTIN_POLICIES[name]
    if not is_import_path(name):
        raise ConfigError(_dotted(name) or (
            "policy must be one of " + ", ".join(repr(p) for p in BUILTIN_POLICIES)
            + f" or an import path package.module:ClassName, got {name!r}"))
    module_name, _, attr = name.partition(":")
    if "(" in attr:
        raise ConfigError(
            f"policy {name!r}: a policy takes no arguments (it is built with the engine Config "
            "alone): give a setting as a class attribute of a subclass and name that subclass "
            "(docs/policies.md)")
    try:
        module = _import_policy_module(module_name)
    except (Exception, SystemExit) as exc:  # any import failure is the user's to fix: one line
        why = f"it raised SystemExit({exc.code!r})" if isinstance(exc, SystemExit) else exc
        if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
            # A file path where the import path wants a module (``sjf.py:X``, ``./sjf.py:X``):
            # Python's own error speaks of packages and relative imports.
            module = os.path.splitext(os.path.basename(module_name))[0]
            raise ConfigError(
                f"policy {name!r}: name the module, not its file: {module}:{attr} (its "
                "directory on PYTHONPATH or the working directory)") from None
        if isinstance(exc, ModuleNotFoundError) and (
                exc.name == module_name or module_name.startswith(f"{exc.name}.")):
            # The policy's own module (not one it imports) was not found: say where it was
            # looked for, as verify of a trace recorded in another directory meets it.
            why = (f"{exc} (looked for on sys.path and in the working directory "
                   f"{os.getcwd()}; put the directory holding it on PYTHONPATH)")
        raise ConfigError(f"policy {name!r}: cannot import {module_name}: {why}") from None
    cls = getattr(module, attr, None)
    if cls is None and not hasattr(module, attr):
        where = getattr(module, "__file__", None)
        found = sorted(k for k, v in vars(module).items()
                       if isinstance(v, type) and issubclass(v, Policy) and v.__module__ ==
                       module.__name__)
        close = difflib.get_close_matches(attr, found, n=3)
        shown = close or found[:6]  # the likeliest first; a long module is not listed whole
        more = f" and {len(found) - len(shown)} more" if len(found) > len(shown) else ""
        raise ConfigError(
            f"policy {name!r}: {module_name}{f' ({where})' if where else ''} defines no {attr}; "
            + (f"its Policy subclasses: {', '.join(shown)}{more}" if found else
               "it defines no Policy subclass"))
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        # The file imported, named: a module of the same name earlier on sys.path (the standard
        # library's random for ./random.py) shadows the user's.
        where = getattr(module, "__file__", None)
        raise ConfigError(
            f"policy {name!r}: {attr} is not a subclass of engine.policy.Policy in {module_name}"
            + (f" ({where})" if where else "")
        )
    return cls


def _dotted(name: str) -> str | None:
    """For a dotted name (``sjf.ShortestJobFirst``: a dot where the colon belongs), the import
    path it likely means, resolved; None for anything else (a misspelt built-in, ``sjf.py``)."""
    module, _, attr = name.rpartition(".")
    if (not module or attr == "py" or not all(p.isidentifier() for p in name.split("."))
            or difflib.get_close_matches(name, BUILTIN_POLICIES, n=1, cutoff=0.8)):
        return None
    meant = f"{module}:{attr}"
    text = f"policy {name!r}: an import path names the class after a colon"
    try:
        policy_class(meant)
    except ConfigError as exc:
        return f"{text}, as {meant!r}, which fails too: " + str(exc).removeprefix(
            f"policy {meant!r}: ")
    return f"{text}: give {meant!r}"


def _import_policy_module(module_name: str) -> Any:
    """Import a policy's module; one not found on ``sys.path`` is looked up in the working
    directory too, as ``python -m`` would (the ``replayllm`` script's path holds only its own
    folder): ``sjf.py`` beside the user runs with ``--set policy=sjf:ShortestJobFirst``.
    The directory goes last, so it never shadows an installed module."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top, cwd = module_name.partition(".")[0], os.getcwd()
        beside = os.path.isfile(os.path.join(cwd, top + ".py")) or os.path.isdir(
            os.path.join(cwd, top))
        if exc.name != top or not beside or "" in sys.path or cwd in sys.path:
            raise
    sys.path.append(cwd)
    importlib.invalidate_caches()
    return importlib.import_module(module_name)


def make_policy(config: EngineConfig) -> Policy | GuardedPolicy:
    """The policy ``config.policy`` names; a user policy comes wrapped in ``GuardedPolicy``."""
    cls = policy_class(config.policy)
    if config.policy in BUILTIN_POLICIES:
        return cls(config)
    name = config.policy
    try:
        inner = cls(config)
    except Exception as exc:
        raise PolicyError(f"policy {name!r}: {cls.__name__}(config) raised "
                          f"{described(exc, PolicyCode(cls))} "
                          "(a policy is constructed with the engine Config alone)") from exc
    if not hasattr(inner, "_eviction"):
        raise PolicyError(f"policy {name!r}: {cls.__name__}.__init__ must call "
                          "super().__init__(config)")
    if (wrong := not_a_method(inner, Policy, HOOKS)) is not None:
        raise PolicyError(f"policy {name!r}: {wrong}")
    return GuardedPolicy(inner, name, release_order)


def no_progress_error(policy: str, waiting: int, running: int) -> Exception:
    """What the engine raises when a step schedules nothing while sequences wait: under a user
    policy a ``NoProgressError`` naming it (it admitted none of them), under a built-in a
    ``RuntimeError`` (admission guarantees every queued request fits an empty pool: a bug)."""
    text = f"scheduler made no progress with {waiting} waiting and {running} running sequences"
    if policy in BUILTIN_POLICIES:
        return RuntimeError(text)
    return NoProgressError(f"policy {policy!r}: {text} (it scheduled nothing this step; "
                           "an engine step must admit or run something)")


def policy_source(name: str) -> dict[str, str] | None:
    """For a user policy, the header record of its code: import path and the sha256 of its
    module's source (None for a built-in, whose code is the engine's)."""
    if name in BUILTIN_POLICIES:
        return None
    module = inspect.getmodule(policy_class(name))
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        source = ""
    return {"policy": name, "sha256": hashlib.sha256(source.encode()).hexdigest()}


def policy_change_note(header: dict[str, Any]) -> str | None:
    """Why a trace's user policy may decide otherwise today: its source changed; None when the
    header records no user policy, the code is unchanged, or it cannot be imported (the replay
    builds the recorded Config, whose import error then says so: a note said it twice)."""
    recorded = header.get("policy_source")
    if not isinstance(recorded, dict):
        return None
    name = recorded.get("policy", "?")
    try:
        now = policy_source(name)
    except ConfigError:
        return None
    if now is None or now.get("sha256") == recorded.get("sha256"):
        return None
    return (
        f"policy {name}: its source changed since the recording (sha256 "
        f"{str(recorded.get('sha256'))[:12]} recorded, {now['sha256'][:12]} now); "
        "decisions may differ"
    )
