"""``replayllm workload generate``: synthetic workloads from an arrival process and distributions.

A generated request's prompt is a recipe (``replay.workloads.recipe``): an optional shared
system prompt (one of ``system_prompts``, picked by a Zipf popularity over their ranks; its
blocks named by ids, so every request that picks it shares its tokens) and then tokens of its
own. With more than one turn a conversation's later turns add new user tokens to the previous
prompt and answer (``replay.workloads.inputs``). Generation streams in chunks: any number of
requests in bounded memory. The same spec and seed give the same workload.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from engine.errors import InvalidRequestError
from replay.workloads.arrivals import ArrivalProcess
from replay.workloads.distributions import Distribution, IntDraws, parse
from replay.workloads.fields import MAX_TOKENS_LIMIT, check_request, check_temperature
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import REFERENCE_TEMPERATURE, Request

SALT_STRIDE = 1 << 40  # salts: seed * SALT_STRIDE + request number + 1 (unique per request)
SYSTEM_ID_STRIDE = 1 << 32  # system prompt s names blocks s * SYSTEM_ID_STRIDE + k
# System prompts are all made before the first request (their ids and popularity): at most this.
MAX_SYSTEM_PROMPTS = 1 << 16
# Their block ids are built then too, one Python int each: at most this many in all (~0.6 GB).
MAX_SYSTEM_PROMPT_BLOCKS = 1 << 24
# First turns at most: generation streams in bounded memory, but the file grows ~100 bytes a
# request (10**12, a typo, filled the disk for hours); 10**9 is 100x the largest public trace.
MAX_NUM_REQUESTS = 10**9
# A chunk's later turns (of its CHUNK conversations) are drawn together, ~100 bytes each in
# memory: at most this many (~2 GB, a mean of 256 turns a conversation); --turns fixed:65536
# drew 4.3 billion. With MAX_NUM_REQUESTS it also keeps every request number (hence salt)
# below SALT_STRIDE: (10**9 / CHUNK) * (CHUNK + 2**24) < 2**40.
MAX_LATER_TURNS_PER_CHUNK = 1 << 24


@dataclass
class GenerateSpec:
    """What to generate (docs/workloads.md, "Generating"). Lengths are token counts."""

    num_requests: int
    arrivals: ArrivalProcess = field(default_factory=ArrivalProcess)
    prompt_len: Distribution = field(default_factory=lambda: parse("fixed:256"))
    output_len: Distribution = field(default_factory=lambda: parse("fixed:128"))
    system_prompts: int = 0
    # The system prompts' options: None is the default (fixed:512, 1.0, 16), set by
    # __post_init__; a value given without system_prompts is an error (it would change nothing).
    system_prompt_len: Distribution | None = None
    popularity: float | None = None  # Zipf exponent over system prompts' ranks (0: uniform)
    turns: Distribution = field(default_factory=lambda: parse("fixed:1"))
    # Later turns' options: given with single-turn conversations, an error (see above).
    think_time_s: Distribution = field(default_factory=lambda: parse("fixed:0"))
    user_len: Distribution | None = None  # later turns' new tokens (None: prompt_len)
    temperature: float = REFERENCE_TEMPERATURE
    ignore_eos: bool = True
    hash_block_size: int | None = None  # tokens per named block of a system prompt
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise InvalidRequestError(f"--num-requests must be >= 1, got {self.num_requests}")
        if self.num_requests > MAX_NUM_REQUESTS:
            raise InvalidRequestError(f"--num-requests must be at most {MAX_NUM_REQUESTS:,}, "
                                      f"got {self.num_requests:,}")
        self._refuse_options_that_cannot_apply()
        if self.system_prompt_len is None:
            self.system_prompt_len = parse("fixed:512")
        if self.popularity is None:
            self.popularity = 1.0
        if self.hash_block_size is None:
            self.hash_block_size = 16
        if self.system_prompts < 0 or not (math.isfinite(self.popularity)
                                           and self.popularity >= 0):
            raise InvalidRequestError(f"--system-prompts and --popularity must be finite and "
                                      f">= 0, got {self.system_prompts} and {self.popularity}")
        if self.system_prompts > MAX_SYSTEM_PROMPTS:
            raise InvalidRequestError(f"--system-prompts must be at most {MAX_SYSTEM_PROMPTS:,}, "
                                      f"got {self.system_prompts:,}")
        check_temperature(self.temperature)
        if not 1 <= self.hash_block_size <= MAX_TOKENS_LIMIT:
            raise InvalidRequestError(f"--hash-block-size must be in [1, {MAX_TOKENS_LIMIT}], "
                                      f"got {self.hash_block_size}")
        if not 0 <= self.seed < 1 << 20:
            raise InvalidRequestError(f"--seed must be in [0, {1 << 20}), got {self.seed}")


    def _refuse_options_that_cannot_apply(self) -> None:
        """The one rule of options that only some workloads use (as the importer refuses an
        option of another format): given where it would change nothing, one line, never
        silently ignored. Later-turn options need conversations that can have a second turn;
        system-prompt options need system prompts."""
        high = self.turns.support[1]
        if np.rint(high) < 2:  # every conversation has one turn (turns clip into [1, ...])
            if self.user_len is not None:
                raise InvalidRequestError(f"--user-len applies to later turns only, and --turns "
                                          f"{self.turns.text or self.turns.kind} gives every "
                                          "conversation one turn")
            if self.think_time_s.support != (0.0, 0.0):
                raise InvalidRequestError(f"--think-time applies to later turns only, and "
                                          f"--turns {self.turns.text or self.turns.kind} gives "
                                          "every conversation one turn")
        if not self.system_prompts:
            for flag, value in (("--system-prompt-len", self.system_prompt_len),
                                ("--popularity", self.popularity),
                                ("--hash-block-size", self.hash_block_size)):
                if value is not None:
                    raise InvalidRequestError(f"{flag} applies to system prompts only: give "
                                              "--system-prompts N (N >= 1) too")


@dataclass
class GenerateCounts:
    """What generation clipped (every clipped value counted, by distribution)."""

    requests: int = 0
    conversations: int = 0
    clipped: dict[str, int] = field(default_factory=dict)


class Generator:
    """Streams a GenerateSpec's requests; ``counts`` is complete once the stream is."""

    def __init__(self, spec: GenerateSpec) -> None:
        self.spec = spec
        self.counts = GenerateCounts()
        self.draws = {
            "prompt_len": IntDraws(spec.prompt_len, MAX_TOKENS_LIMIT, "--prompt-len"),
            "output_len": IntDraws(spec.output_len, MAX_TOKENS_LIMIT, "--output-len"),
            "turns": IntDraws(spec.turns, 1 << 16, "--turns"),
            "system_prompt_len": IntDraws(spec.system_prompt_len, MAX_TOKENS_LIMIT,
                                          "--system-prompt-len"),
        }
        # A later turn's new tokens: from --user-len, else from --prompt-len, whose draws (and
        # their clips, counted under its name) they then are.
        self.user_draws = self.draws["prompt_len"]
        if spec.user_len is not None:
            self.user_draws = self.draws["user_len"] = IntDraws(spec.user_len, MAX_TOKENS_LIMIT,
                                                                "--user-len")
        # Clipped after the draws: a system prompt and the request's own tokens together over
        # MAX_TOKENS_LIMIT (clipped to it), a think time drawn below 0 (raised to 0).
        self.clipped_after = {"prompt_len (with its system prompt)": 0, "think_time_s": 0}

    def _system_prompts(self, rng: np.random.Generator) -> tuple[list[tuple[int, ...]],
                                                                 np.ndarray]:
        spec = self.spec
        if not spec.system_prompts:
            return [], np.zeros(0)
        block = spec.hash_block_size
        lengths = self.draws["system_prompt_len"].sample(rng, spec.system_prompts)
        blocks = [-(-int(n) // block) for n in lengths]  # whole blocks: the user part follows
        if sum(blocks) > MAX_SYSTEM_PROMPT_BLOCKS:  # checked before any id is built
            raise InvalidRequestError(
                f"--system-prompts {spec.system_prompts:,} of --system-prompt-len "
                f"{spec.system_prompt_len.text or spec.system_prompt_len.kind} in "
                f"--hash-block-size {block} blocks name {sum(blocks):,} blocks, all held in "
                f"memory; at most {MAX_SYSTEM_PROMPT_BLOCKS:,}")
        ids = [tuple(s * SYSTEM_ID_STRIDE + k for k in range(b)) for s, b in enumerate(blocks)]
        weights = np.arange(1, spec.system_prompts + 1, dtype=float) ** -spec.popularity
        return ids, weights / weights.sum()

    def __iter__(self) -> Iterator[Request]:
        spec = self.spec
        rng = np.random.default_rng(spec.seed)
        systems, popularity = self._system_prompts(rng)
        block = spec.hash_block_size
        number = 0
        for times in spec.arrivals.times(spec.num_requests, rng):
            n = len(times)
            prompt = self.draws["prompt_len"].sample(rng, n).tolist()
            output = self.draws["output_len"].sample(rng, n).tolist()
            turns = self.draws["turns"].sample(rng, n).tolist()
            picks = rng.choice(len(systems), n, p=popularity).tolist() if systems else None
            later = sum(turns) - n
            if later > MAX_LATER_TURNS_PER_CHUNK:  # before they are drawn
                raise InvalidRequestError(
                    f"--turns {spec.turns.text or spec.turns.kind}: {later:,} later turns for "
                    f"{n:,} conversations, drawn together in memory; at most "
                    f"{MAX_LATER_TURNS_PER_CHUNK:,} (fewer turns a conversation)")
            user = self.user_draws.sample(rng, later).tolist()
            later_output = self.draws["output_len"].sample(rng, later).tolist()
            think_raw = spec.think_time_s.sample(rng, later)
            self.clipped_after["think_time_s"] += int((think_raw < 0).sum())
            think = np.maximum(think_raw, 0.0).tolist()
            arrival = times.tolist()
            cursor = 0
            for i in range(n):
                ids = systems[picks[i]] if picks is not None else ()
                conversation = str(self.counts.conversations) if turns[i] > 1 else None
                number += 1
                yield self._request(self._first_prompt(ids, prompt[i], number), output[i],
                                    arrival[i], conversation)
                for turn in range(1, turns[i]):
                    number += 1
                    yield self._request(
                        PromptRecipe((), block, user[cursor], self._salt(number)),
                        later_output[cursor], 0.0, conversation, turn, think[cursor])
                    cursor += 1
                self.counts.conversations += 1
        clipped = {name: d.clipped_low + d.clipped_high for name, d in self.draws.items()}
        self.counts.clipped = {name: n for name, n in {**clipped, **self.clipped_after}.items()
                               if n}

    def _first_prompt(self, ids: tuple[int, ...], own: int, number: int) -> PromptRecipe:
        """A first turn's prompt: its system prompt's blocks, then ``own`` tokens; clipped to
        MAX_TOKENS_LIMIT (the format's limit) and counted where the two exceed it."""
        block = self.spec.hash_block_size
        recipe = PromptRecipe(ids, block, len(ids) * block + own, self._salt(number))
        if recipe.length > MAX_TOKENS_LIMIT:
            self.clipped_after["prompt_len (with its system prompt)"] += 1
            recipe = recipe.clipped(MAX_TOKENS_LIMIT)
        return recipe

    def _salt(self, number: int) -> int:
        return self.spec.seed * SALT_STRIDE + number

    def _request(self, prompt: PromptRecipe, max_tokens: int, arrival_s: float,
                 conversation_id: str | None, turn: int = 0, think_time_s: float = 0.0,
                 ) -> Request:
        self.counts.requests += 1
        request = Request(prompt, max_tokens, self.spec.temperature, self.spec.ignore_eos,
                          arrival_s, conversation_id, turn, think_time_s)
        try:  # the rule run, whatif and loadgen hold it to: never write what they refuse
            check_request(request, f"generated request {self.counts.requests}")
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"{exc} (run and whatif would refuse it: a higher --rate, "
                                      "earlier --schedule times, fewer --num-requests or a "
                                      "shorter --think-time)") from None
        return request
