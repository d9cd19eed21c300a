"""The simulated executor: recorded tokens by position, step times from the cost model.

Under another configuration the steps are different, so tokens cannot be looked up by step (as
``TraceExecutor`` does for replay). Each sequence instead gets, at every sampling, the recorded
token at its own next completion position: the k-th token it ever sampled in the recording. A
sequence preempted and recomputed keeps its tokens, so each position is sampled exactly once here
too. A sequence asking for more tokens than were recorded (an incomplete trace, a workload file)
gets deterministic synthetic tokens, never EOS.

Time: each step advances a ``SimClock`` by the interval the cost model predicts for it
(``CostModel.predict``: its device time, host time and how they combine, by whether the engine
launched the batch overlapped, ``ScheduledBatch.overlapped``), and ``EngineCore(clock=...)`` reads
it, so ``model_step.wall_time_s`` holds simulated time. The step reports the device time as its
duration, and the rest of the interval beyond its host work as time waited for the device (so the
engine records the predicted host time as ``host_s``; in interval mode the host time is 0).

CUDA graphs: with graphs on (not ``enforce_eager``), a decode pads to the source's captured batch
sizes, and a prefill step of few enough prompts to the smallest of the source's captured prefill
token counts that holds it (``engine.graph_sizes``), among those the target config captures
(``prefill_graph_tokens``: its ``prefill_graph_limit``): class ``prefill_graph``, priced on the
padded tokens. Any other prefill runs eager (class ``prefill``). A mixed step (prompt chunks
beside decodes) runs from a graph where the target config's runner captures one for it
(``engine.graph_sizes.mixed_graph_key`` over the same prefill token counts and
``mixed_decode_sizes``): class ``mixed_graph``, priced on its padded rows.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.batch import ScheduledBatch, StepOutput, batch_features
from engine.decode_stretch import MAX_STRETCH_STEPS, DecodePrices
from engine.graph_sizes import mixed_graph_key, padded_decode_size, padded_prefill_tokens
from engine.sequence import TOKEN_TYPECODE
from replay.whatif.cost.decode_attention import decode_features, longest_program_tokens
from replay.whatif.cost.features import StepFeatures, computed_tokens, step_class
from replay.whatif.cost.linear import causal_work
from replay.whatif.cost.model import CostModel, StepTime

# Synthetic tokens: a fixed affine walk over a small range of ids past every vocabulary
# (int32, as a trace column holds them): no real token equals one, so a KV block holding one
# never matches a prompt's block in the prefix cache (a hit no real run has) and never EOS.
SYNTHETIC_BASE = 2**30
SYNTHETIC_RANGE = 10000
SYNTHETIC_STRIDE = 7919


def synthetic_ids(eos: int) -> np.ndarray:
    """Every synthetic token id in the walk's order (the token at walk ``w`` is the id at
    ``w % SYNTHETIC_RANGE``): ``SYNTHETIC_BASE + i``, except that an EOS set among them is never
    sampled (its id moves up by one). The one rule every synthetic token comes from."""
    ids = SYNTHETIC_BASE + np.arange(SYNTHETIC_RANGE, dtype=np.int64)
    return ids + (ids == eos)


def step_features(num_seqs: int, prefill_tokens: int, work: int, decode_seqs: int,
                  context: int, padded: int, padded_tokens: int, kv_tokens: float,
                  longest_context: int, longest_prefill: int, kv_heads: int) -> StepFeatures:
    """A step's features for ``CostModel.predict``, positional in ``FEATURES``' order: its rows
    (``padded`` where a graph runs it, ``padded_tokens`` of a graph's prompt part), ``kv_tokens``
    and ``longest_context`` of its decode rows, ``longest_prefill`` of its prompts."""
    return StepFeatures(
        num_seqs, prefill_tokens, work, decode_seqs, context, padded,
        computed_tokens(padded_tokens, prefill_tokens, decode_seqs), kv_tokens,
        longest_program_tokens(longest_context, padded, kv_heads) if decode_seqs else 0.0,
        longest_prefill)


def launch_wait_s(time: StepTime) -> float:
    """How long a step's launch waits on the device: its interval less its host work."""
    return max(time.interval_s - time.host_s, 0.0)


class SimClock:
    """A clock that moves only when told: ``clock()`` reads it, the executor advances it."""

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class SimExecutor:
    """Answers each batch with recorded tokens by sequence position, advancing a simulated clock.

    ``cost`` None: times are not predicted (the clock stays put; every duration is 0).
    ``one_off_costs``: charge the source's one-off first-step costs (kernel compilation in a
    fresh process) once, as a run that starts cold pays them; False: a warm start.
    ``use_graphs``: decodes pad to the cost model's CUDA-graph sizes, as the source run did, and
    so do prefills, among the source's captured token counts up to ``prefill_graph_tokens``
    (the target config's ``min(prefill_graph_tokens, max_num_batched_tokens)``; 0: none) and of
    at most as many prompts as the source's graphs took and ``prefill_graph_seqs`` (the target
    config's; None: no bound of its own).
    """

    def __init__(
        self,
        num_kvcache_blocks: int,
        clock: SimClock,
        cost: CostModel | None = None,
        use_graphs: bool = False,
        eos: int = -1,
        prefill_graph_tokens: int = 0,
        one_off_costs: bool = True,
        mixed_decode_sizes: Sequence[int] = (),
        block_size: int = 0,
        prefill_graph_seqs: int | None = None,
    ) -> None:
        self.num_kvcache_blocks = num_kvcache_blocks
        self.clock = clock
        self.cost = cost
        self.eos = eos
        # Recorded completions of the sequences not yet released, by the engine's seq_id.
        self.tokens: dict[int, Sequence[int]] = {}
        self._next_seq_id = 0
        self.synthesized = 0
        self._graph_sizes = cost.graph_sizes if cost is not None and use_graphs else []
        self._padded: dict[int, int] = {}
        # The source's captured prefill token counts that the target config captures too.
        self._prefill_sizes = ([size for size in cost.prefill_graph_sizes
                                if size <= prefill_graph_tokens] if use_graphs and cost else [])
        self._prefill_max_seqs = cost.prefill_graph_max_seqs if cost is not None else 0
        if prefill_graph_seqs is not None:
            self._prefill_max_seqs = min(self._prefill_max_seqs, prefill_graph_seqs)
        # The decode capacities of the target's mixed graphs (empty: mixed steps run eager).
        self._mixed_decode_sizes = list(mixed_decode_sizes) if self._prefill_sizes else []
        # Classes that ran a step: the first of each pays the source's one-off costs (JIT
        # compilation) where the run starts cold.
        self._seen_classes: set[str] = set()
        self._one_off_costs = one_off_costs
        self.steps = 0
        self.overlapped_steps = 0  # batches the engine launched overlapped
        # Of the KV cache: the tokens of a block shared by several decode rows, read once (0:
        # every row's context counted, ``CostOptions.shared_kv`` off).
        self._block_size = block_size if cost is not None and cost.shared_kv else 0
        self._causal = bool(getattr(cost, "causal_work", False))  # ``CostOptions.causal_work``
        self._kv_heads = cost.kv_heads if cost is not None else 1
        self.last_interval_s = 0.0  # the last step's simulated interval
        self._decode_interval_s = 0.0  # the last decode step's (the pace of a decode stretch)
        self._synthetic_cycle: array | None = None  # ``sequence_tokens``' (made on first use)
        # ``synthetic_ids``: an array for a decode stretch, a list for a token at a time.
        self._synthetic_ids = synthetic_ids(eos)
        self._synthetic_list: list[int] = self._synthetic_ids.tolist()

    def bind(self, seq_id: int, tokens: Sequence[int] | None) -> None:
        """Give sequence ``seq_id`` (ids are handed out in order) its recorded completion (a list
        or an array of token ids; None: synthetic tokens)."""
        if seq_id != self._next_seq_id:
            raise RuntimeError(f"sequence ids must be bound in order: got {seq_id}")
        self._next_seq_id += 1
        if tokens is not None and len(tokens):
            self.tokens[seq_id] = tokens

    def admit(self, prompt_tokens: int, arrival_s: float) -> None:
        """Advance the clock by the host time the live loop takes to add a request of
        ``prompt_tokens`` that arrived at ``arrival_s`` (``CostModel.add``): the adds of a batch
        follow one another, each starting at its arrival at the earliest."""
        if self.cost is not None:
            self.clock.now = max(self.clock.now, arrival_s) + self.cost.add.seconds(prompt_tokens)

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence's recorded tokens (it samples no more)."""
        self.tokens.pop(seq_id, None)

    def _token(self, seq_id: int, position: int) -> int:
        recorded = self.tokens.get(seq_id, ())
        if position < len(recorded):
            return int(recorded[position])
        self.synthesized += 1
        return self._synthetic(seq_id, position)

    def _synthetic(self, seq_id: int, position: int) -> int:
        return self._synthetic_list[(seq_id * SYNTHETIC_STRIDE + position) % SYNTHETIC_RANGE]

    def _sample(self, sampled: list) -> list[int]:
        """The token each sampled sequence samples now: its recorded one, else synthetic."""
        tokens = self.tokens
        if not tokens:  # nothing recorded (a workload without answers): all synthetic
            self.synthesized += len(sampled)
            ids = self._synthetic_list
            return [ids[(s.seq_id * SYNTHETIC_STRIDE + s.num_tokens - s.num_prompt_tokens)
                        % SYNTHETIC_RANGE] for s in sampled]
        return [self._token(s.seq_id, s.num_tokens - s.num_prompt_tokens) for s in sampled]

    def decode_tokens(self, seq_ids: np.ndarray, completions: np.ndarray,
                      steps: int) -> np.ndarray:
        """The tokens of ``steps`` samplings of each sequence (``completions``: the tokens each
        has sampled so far), sequences by row: what ``_sample`` would give them one by one (a
        decode stretch, ``engine.decode_stretch``). Counts nothing: see ``count_sampled``."""
        tokens = self._synthetic_ids[(seq_ids[:, None] * SYNTHETIC_STRIDE + completions[:, None]
                                      + np.arange(steps)) % SYNTHETIC_RANGE]
        recorded = self.tokens
        if recorded:
            for row, seq_id in enumerate(seq_ids.tolist()):
                mine = recorded.get(seq_id, ())
                start = int(completions[row])
                if start < len(mine):
                    head = np.asarray(mine[start:start + steps], dtype=np.int64)
                    tokens[row, :len(head)] = head
        return tokens

    def sequence_tokens(self, seq_id: int, completion: int, count: int) -> array | list[int]:
        """``decode_tokens``' row for one sequence (``count`` samplings after its first
        ``completion``): the tokens a decode stretch left a sequence owing (``engine
        .running_columns``). Synthetic tokens run up by one modulo the range: they are slices
        of one cycle of them, made once. Counts nothing."""
        recorded = self.tokens.get(seq_id, ())
        if completion < len(recorded):
            return self.decode_tokens(np.array([seq_id]), np.array([completion]),
                                      count)[0].tolist()
        cycle = self._synthetic_cycle
        if cycle is None:  # every synthetic token in order, as ``_synthetic`` gives them
            cycle = self._synthetic_cycle = array(TOKEN_TYPECODE, self._synthetic_list)
        start = (seq_id * SYNTHETIC_STRIDE + completion) % SYNTHETIC_RANGE
        tokens = cycle[start:start + count]
        while len(tokens) < count:
            tokens += cycle[:count - len(tokens)]
        return tokens

    def count_sampled(self, seq_ids: np.ndarray, completions: np.ndarray,
                      sampled: np.ndarray, total: int | None = None) -> None:
        """Count the synthetic ones among ``decode_tokens``' tokens that were sampled (the first
        ``sampled`` of each sequence; ``total``: their sum, where the caller has it), as
        ``_sample`` counts them."""
        if not self.tokens:
            self.synthesized += int(sampled.sum()) if total is None else total
            return
        have = np.fromiter((len(self.tokens.get(s, ())) for s in seq_ids.tolist()), np.int64,
                           len(seq_ids))
        self.synthesized += int(np.maximum(completions + sampled - np.maximum(completions, have),
                                           0).sum())

    def steps_within(self, until: float) -> int:
        """About how many steps fit before ``until`` on the clock at the last decode step's
        pace, with room to spare (how far ahead a decode stretch plans; it stops at ``until``
        whatever the guess)."""
        ahead, pace = until - self.clock.now, self._decode_interval_s
        if ahead <= 0:
            return 1
        if pace <= 0 or ahead == float("inf"):
            return MAX_STRETCH_STEPS
        return min(int(ahead / pace * 1.5) + 2, MAX_STRETCH_STEPS)

    @property
    def prices_stretches(self) -> bool:
        """Whether ``price_decode`` prices a decode step as ``execute`` would: not where shared
        KV blocks are counted (that needs each step's block tables)."""
        return not self._block_size

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        out = self._sample(batch.sampled_seqs)
        prefill_tokens, work, decode_seqs, context = batch_features(batch)
        first_decode = len(batch.seqs) - decode_seqs
        if self._causal:
            work = causal_work(work, sum(q * q for q in batch.num_new_tokens[:first_decode]))
        contexts = batch.context_lens[first_decode:]
        kv_tokens = float(context)  # every row's context (``context`` is their sum)
        if self._block_size:  # shared blocks read once: only then are the tables looked at
            kv_tokens, _ = decode_features(
                contexts, [s.block_table for s in batch.seqs[first_decode:]], self._block_size,
                1, self._kv_heads)
        return self._price(out, batch.kind, len(batch.seqs), prefill_tokens, work, decode_seqs,
                           context, batch.overlapped, kv_tokens,
                           max(contexts) if decode_seqs else 0,
                           max(batch.context_lens[:first_decode]) if first_decode else 0)

    def price_decode(self, num_seqs: int, context_tokens: int, overlapped: bool,
                     longest_context: int) -> StepOutput:
        """``execute`` of a decode step of ``num_seqs`` sequences holding ``context_tokens``
        tokens in all, the longest ``longest_context``, its tokens left out (a decode
        stretch's: ``decode_tokens``; only where ``prices_stretches``)."""
        return self._price([], "decode", num_seqs, 0, 0, num_seqs, context_tokens, overlapped,
                           float(context_tokens), longest_context)

    def price_decodes(self, num_seqs: list[int], contexts: list[int], longest: list[int],
                      overlapped: bool, defer: bool, until: float) -> DecodePrices | None:
        """``price_decode`` of a decode stretch's steps in turn (``num_seqs``, ``contexts`` and
        ``longest`` contexts of each; the first launched ``overlapped``, every later one
        ``defer``), stopping before a step that would start at or after ``until`` on the clock
        (at least one), in one call: the same features, ``CostModel.predict`` calls and clock
        as step by step, without a ``StepOutput`` per step. None (price them one by one) where
        no model prices, there is no step, or a step would be the first of its class (one-off
        costs)."""
        cost = self.cost
        if cost is None or not num_seqs:
            return None
        padding = [self._decode_padding(n) for n in num_seqs]
        if self._one_off_costs and not self._seen_classes.issuperset(
                step_class("decode", graph) for _, graph in padding):
            return None
        clock, kv_heads, predict = self.clock, self._kv_heads, cost.predict
        priced = DecodePrices([], [], [], [], [], [], [], None)  # type: ignore[arg-type]
        began, durations, waits = priced.began, priced.duration_s, priced.wait_s
        flag = overlapped
        for n, context, longest_context, (padded, graph) in zip(num_seqs, contexts, longest,
                                                                padding):
            if began and clock.now >= until:
                break
            features = step_features(n, 0, 0, n, context, padded, 0, float(context),
                                     longest_context, 0, kv_heads)
            time = predict(features, step_class("decode", graph), flag, False)
            began.append(clock.now)
            clock.now += time.interval_s
            durations.append(time.device_s)
            waits.append(launch_wait_s(time))
            priced.padded.append(padded)
            priced.graph_used.append(graph)
            flag = defer
        count = len(began)
        priced.ended = began[1:] + [clock.now]
        priced.padded_tokens = [0] * count
        self.steps += count
        self.overlapped_steps += overlapped + defer * (count - 1)
        self.last_interval_s = self._decode_interval_s = time.interval_s
        priced.last = StepOutput(token_ids=[], duration_s=durations[-1],
                                 padded_batch_size=priced.padded[-1],
                                 graph_used=priced.graph_used[-1], wait_s=waits[-1])
        return priced

    def _decode_padding(self, num_seqs: int) -> tuple[int, bool]:
        """The rows a decode step of ``num_seqs`` runs (its CUDA-graph size, else its own) and
        whether a graph runs it."""
        if self._graph_sizes:
            size = self._padded.get(num_seqs)
            if size is None:
                size = self._padded[num_seqs] = padded_decode_size(self._graph_sizes, num_seqs)
            if size:
                return size, True
        return num_seqs, False

    def _price(self, out: list[int], kind: str, num_seqs: int, prefill_tokens: int, work: int,
               decode_seqs: int, context: int, overlapped: bool, kv_tokens: float,
               longest_context: int, longest_prefill: int = 0) -> StepOutput:
        """Time a step (its batch features given: ``kv_tokens`` and ``longest_context`` of its
        decode rows as ``cost.decode_attention`` counts them, ``longest_prefill`` of its prompt
        rows) and advance the clock by its interval."""
        self.steps += 1
        self.overlapped_steps += overlapped
        self.last_interval_s = 0.0
        cost = self.cost
        if cost is None:
            return StepOutput(token_ids=out, duration_s=0.0, padded_batch_size=num_seqs)
        padded, graph, padded_tokens = num_seqs, False, 0
        if kind == "decode":
            padded, graph = self._decode_padding(num_seqs)
        elif self._prefill_sizes and kind == "prefill":
            padded_tokens = padded_prefill_tokens(self._prefill_sizes, prefill_tokens, num_seqs,
                                                  self._prefill_max_seqs)
            graph = padded_tokens > 0
        elif self._mixed_decode_sizes and kind == "mixed":
            key = mixed_graph_key(self._prefill_sizes, self._mixed_decode_sizes, prefill_tokens,
                                  num_seqs - decode_seqs, decode_seqs)
            if key is not None:
                graph, padded_tokens = True, key[0] + key[1]
        cls = step_class(kind, graph)
        first = self._one_off_costs and cls not in self._seen_classes
        if first:
            self._seen_classes.add(cls)
        features = step_features(num_seqs, prefill_tokens, work, decode_seqs, context, padded,
                                 padded_tokens, kv_tokens, longest_context, longest_prefill,
                                 self._kv_heads)
        time = cost.predict(features, cls, overlapped, first)
        self.clock.now += time.interval_s
        self.last_interval_s = time.interval_s
        if kind == "decode":
            self._decode_interval_s = time.interval_s
        return StepOutput(token_ids=out, duration_s=time.device_s, padded_batch_size=padded,
                          graph_used=graph, wait_s=launch_wait_s(time),
                          padded_tokens=padded_tokens)

    def describe(self) -> dict[str, Any]:
        out = {
            "executor": "sim",
            "device": "none",
            "timed": self.cost is not None,
            "cost_model": self.cost.source if self.cost is not None else None,
            "cost_mode": self.cost.mode if self.cost is not None else None,
        }
        if self._prefill_sizes:  # as a real executor that captured prefill graphs says
            out.update(prefill_graph_tokens=list(self._prefill_sizes),
                       prefill_graph_max_seqs=self._prefill_max_seqs)
        return out

    def close(self) -> None:
        pass
