"""Hypothesis strategies for scheduler workloads, and the expectations computed from a config.

Workloads are generated small (a handful of requests, prompts of tens of tokens, a few KV blocks
of 1 to 8 slots) and over a small token alphabet, so that the interesting situations are common:
prompts sharing prefixes (prefix-cache hits), conversations (a later turn repeats an earlier
prompt and its output), a pool too small for everyone (preemption), prompts exactly as long as
``max_model_len`` or the token budget, requests that can never fit (rejection), EOS sampled
mid-run, aborts, and request priorities.

``workloads(policies=("my.module:MyPolicy",))`` draws workloads for any policy; run one with
``replay.testing.run_workload`` and check it with ``replay.testing.check_events``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from engine.config import Config
from engine.policy import WHOLE_PROMPT_POLICIES, policy_class

# Token ids of prompts and of sampled outputs. Small, so that shared prefixes and EOS are frequent.
ALPHABET_SIZE = 6
TOKENS = st.integers(0, ALPHABET_SIZE - 1)
# EOS ids are drawn from {-1 (none), 0, 1}; scripted outputs use 2.. except where EOS is placed.
NO_EOS = -1
EOS_IDS = (NO_EOS, 0, 1)
OUTPUT_TOKENS = st.integers(2, ALPHABET_SIZE - 1)
# Most requests run to completion; about one in eight is aborted at some driver step.
ABORT_STEPS = st.one_of(*[st.none()] * 7, st.integers(0, 30))
# Request priorities (lower first): mostly the default, a few better or worse.
PRIORITIES = st.sampled_from([0, 0, 0, 1, 2, -1])
BUILTIN = ("prefill_first", "chunked", "priority")


def scaled(factor: float, minimum: int = 1) -> int:
    """``factor`` times the active Hypothesis profile's ``max_examples`` (at least ``minimum``)."""
    return max(minimum, int(settings.default.max_examples * factor))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@st.composite
def prompts_sharing_prefixes(
    draw: st.DrawFn,
    count: int,
    lengths: st.SearchStrategy[int],
    tokens: st.SearchStrategy[int] = TOKENS,
) -> list[list[int]]:
    """``count`` prompts whose lengths come from ``lengths``; most start with a prefix of another.

    A few "base" token lists are drawn first; each prompt copies a prefix of a base (or of an
    earlier prompt) of random length and fills up with random tokens.
    """
    bases = draw(st.lists(st.lists(tokens, min_size=1, max_size=48), min_size=1, max_size=3))
    prompts: list[list[int]] = []
    for _ in range(count):
        length = draw(lengths)
        sources = bases + prompts
        source = draw(st.sampled_from(sources))
        most = min(length, len(source))
        shared = draw(st.one_of(st.just(most), st.integers(0, most)))
        fill = draw(st.lists(tokens, min_size=length - shared, max_size=length - shared))
        prompts.append(source[:shared] + fill)
    return prompts


@dataclass(frozen=True)
class RequestSpec:
    """One generated request and the tokens the simulated model returns for it.

    ``script[k]`` is the token sampled at completion position ``k`` whenever that position is
    computed, so recomputation after a preemption samples the same tokens (as greedy decoding
    would). ``abort_step``: the driver step at which the request is aborted (if still unfinished).
    ``priority``: lower is served first by the ``priority`` policy.
    """

    arrival_step: int
    prompt: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool
    script: tuple[int, ...]
    abort_step: int | None = None
    priority: int = 0


@dataclass(frozen=True)
class Workload:
    config: Config
    requests: tuple[RequestSpec, ...]

    def describe(self) -> str:
        c = self.config
        return (
            f"policy={c.policy} eviction={c.eviction} "
            f"blocks={c.num_kvcache_blocks}x{c.kvcache_block_size} "
            f"max_model_len={c.max_model_len} max_batched={c.max_num_batched_tokens} "
            f"max_seqs={c.max_num_seqs} eos={c.eos} prefix_caching={c.enable_prefix_caching} "
            f"requests={len(self.requests)}"
        )

    def code(self) -> str:
        """Python that rebuilds this workload (for a failure report): the fields the strategies
        draw, then any other Config field off its default (a user's own strategy may set it)."""
        c = self.config
        default = _default_config()
        names = list(_DRAWN_FIELDS) + [
            k for k in Config.field_names()
            if k not in _DRAWN_FIELDS and getattr(c, k) != getattr(default, k)]
        fields = ", ".join(f"{k}={getattr(c, k)!r}" for k in names)
        lines = [f"Workload(Config({fields}), ("]
        lines += [f"    {r!r}," for r in self.requests]
        return "\n".join(lines + ["))"])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How Hypothesis prints a failing workload: ``code()``, not the dataclass dump of every
        Config field (kernels, GC, the model: tens of lines no policy test sets)."""
        printer.text(self.code())


# The Config fields the strategies draw, in the order ``Workload.code`` writes them.
_DRAWN_FIELDS = ("policy", "eviction", "num_kvcache_blocks", "kvcache_block_size",
                 "max_model_len", "max_num_batched_tokens", "max_num_seqs", "eos",
                 "enable_prefix_caching", "hash_seed")


@functools.cache
def _default_config() -> Config:
    return Config()


def _as_tuple(names: tuple[str, ...] | str) -> tuple[str, ...]:
    """One policy or eviction order given as a string (``policies=("my:P")``, the tuple's
    comma forgotten) is that name, not its characters; a class given alone is one too (the
    Config refuses it, saying which import path to give)."""
    return (names,) if isinstance(names, (str, type)) else tuple(names)


def _whole_prompts(policy: str) -> bool:
    """Whether ``policy`` admits whole prompts (its token budget must hold the longest)."""
    return policy in WHOLE_PROMPT_POLICIES or not policy_class(policy).mixed_batches


@st.composite
def engine_configs(
    draw: st.DrawFn,
    policies: tuple[str, ...] | str = BUILTIN,
    num_blocks: st.SearchStrategy[int] | None = None,
    evictions: tuple[str, ...] | str = ("release", "lru"),
) -> Config:
    """A small engine Config: small budgets, edge values drawn often.

    ``policies``: built-in names or import paths; ``num_blocks`` defaults to a pool of about one
    to two of the longest possible requests.
    """
    policy = draw(st.sampled_from(_as_tuple(policies)))
    block_size = draw(st.sampled_from([1, 2, 2, 3, 4, 4, 8]))
    max_model_len = draw(st.one_of(st.sampled_from([12, 16, 24, 32]), st.integers(1, 40)))
    if num_blocks is None:
        longest = ceil_div(max_model_len, block_size)
        num_blocks = st.integers(max(1, longest // 2), 2 * longest + 2)
    if _whole_prompts(policy):
        # The config requires max_num_batched_tokens >= max_model_len; equality is the edge case.
        extra = draw(st.sampled_from([0, 0, 1, 5, 64]))
        max_num_batched_tokens = max_model_len + extra
    else:
        max_num_batched_tokens = draw(st.one_of(st.integers(1, 48), st.sampled_from([1, 2, 3])))
    return Config(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=draw(st.integers(1, 6)),
        max_model_len=max_model_len,
        kvcache_block_size=block_size,
        num_kvcache_blocks=draw(num_blocks),
        policy=policy,
        enable_prefix_caching=draw(st.booleans() | st.just(True)),
        hash_seed=draw(st.integers(0, 2**64 - 1)),
        eos=draw(st.sampled_from(EOS_IDS)),
        eviction=draw(st.sampled_from(_as_tuple(evictions))),
    )


@st.composite
def workloads(
    draw: st.DrawFn,
    policies: tuple[str, ...] | str = BUILTIN,
    max_requests: int = 10,
    max_arrival_step: int = 6,
    evictions: tuple[str, ...] | str = ("release", "lru"),
) -> Workload:
    """A config plus requests arriving at different steps, with shared prefixes and edge lengths.

    Prompt lengths include 0 (rejected), ``max_model_len`` exactly, ``max_model_len + 1``
    (rejected), short prompts with room to grow, and (through the pool size) requests that need
    more blocks than the pool has (rejected). The pool is drawn last, mostly between the largest
    single request and half of what all requests need together, so that they compete for it and
    preemption is common.
    """
    shape = draw(engine_configs(policies, num_blocks=st.just(1), evictions=evictions))
    mml, bs = shape.max_model_len, shape.kvcache_block_size
    count = draw(st.integers(1, max_requests))
    lengths = st.one_of(
        st.integers(1, mml),
        st.integers(1, max(1, mml // 3)),
        st.integers(1, mml),
        st.sampled_from([mml, mml + 1, 0]),
    )
    prompts = draw(prompts_sharing_prefixes(count, lengths))
    requests = []
    needs = []
    for prompt in prompts:
        max_tokens = draw(
            st.one_of(st.integers(1, 24), st.integers(8, 40), st.sampled_from([1, 2]))
        )
        # Scripted outputs avoid the EOS id except, for some requests, at one drawn position.
        script = draw(st.lists(OUTPUT_TOKENS, min_size=max_tokens, max_size=max_tokens))
        eos_at = draw(st.one_of(st.none(), st.integers(0, max_tokens - 1)))
        if eos_at is not None and shape.eos != NO_EOS:
            script[eos_at] = shape.eos
        requests.append(
            RequestSpec(
                arrival_step=draw(st.one_of(st.just(0), st.integers(0, max_arrival_step))),
                prompt=tuple(prompt),
                max_tokens=max_tokens,
                ignore_eos=draw(st.booleans()),
                script=tuple(script),
                abort_step=draw(ABORT_STEPS),
                priority=draw(PRIORITIES),
            )
        )
        if 0 < len(prompt) <= mml:
            needs.append(
                ceil_div(len(prompt) + completion_cap(shape, len(prompt), max_tokens) - 1, bs)
            )
    first_turns = len(requests)
    requests += draw(conversation_turns(requests, mml, max_arrival_step))
    for request in requests[first_turns:]:
        if 0 < len(request.prompt) <= mml:
            needs.append(ceil_div(
                len(request.prompt) + completion_cap(shape, len(request.prompt),
                                                     request.max_tokens) - 1, bs))
    largest = max(needs, default=1)
    contended = st.integers(largest, max(largest, sum(needs) // 2))
    num_blocks = draw(st.one_of(contended, contended, contended, st.integers(1, largest + 2)))
    return Workload(config=shape.replace(num_kvcache_blocks=num_blocks), requests=tuple(requests))


@st.composite
def conversation_turns(
    draw: st.DrawFn, requests: list[RequestSpec], max_model_len: int, max_arrival_step: int
) -> list[RequestSpec]:
    """Up to two later turns of earlier requests: the earlier prompt, a prefix of its scripted
    output (what it answered), and a few new tokens, arriving after it (prefix-cache hits on
    blocks completed by decoding)."""
    turns = []
    for _ in range(draw(st.integers(0, 2))):
        if not requests:
            break
        first = draw(st.sampled_from(requests))
        answer = list(first.script[: draw(st.integers(0, len(first.script)))])
        follow = draw(st.lists(TOKENS, min_size=1, max_size=4))
        prompt = (list(first.prompt) + answer + follow)[: max(1, max_model_len)]
        max_tokens = draw(st.integers(1, 8))
        turns.append(RequestSpec(
            arrival_step=first.arrival_step + draw(st.integers(1, max_arrival_step + 4)),
            prompt=tuple(prompt),
            max_tokens=max_tokens,
            ignore_eos=True,
            script=tuple(draw(st.lists(OUTPUT_TOKENS, min_size=max_tokens, max_size=max_tokens))),
            priority=draw(PRIORITIES),
        ))
    return turns


# --- expectations computed from the config alone (independently of the Scheduler) ---------------
def completion_cap(config: Config, prompt_len: int, max_tokens: int) -> int:
    """How many tokens a request may produce: max_tokens, cut at max_model_len (at least one)."""
    return min(max_tokens, max(1, config.max_model_len - prompt_len))


def is_admissible(config: Config, prompt_len: int, max_tokens: int) -> bool:
    """Whether the request can ever be served under ``config``.

    Not empty, not longer than max_model_len, and the KV of every token it ever feeds (all but the
    last sampled one) fits in the whole pool.
    """
    if prompt_len == 0 or prompt_len > config.max_model_len:
        return False
    fed = prompt_len + completion_cap(config, prompt_len, max_tokens) - 1
    return math.ceil(fed / config.kvcache_block_size) <= config.num_kvcache_blocks


def expected_completion(config: Config, request: RequestSpec) -> tuple[list[int], str]:
    """The tokens an admissible request must finish with, and the finish reason."""
    cap = completion_cap(config, len(request.prompt), request.max_tokens)
    out: list[int] = []
    for token in request.script[:cap]:
        out.append(token)
        if token == config.eos and not request.ignore_eos:
            return out, "eos"
    return out, "length"
