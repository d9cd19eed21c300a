"""A workload as the engine's inputs (``engine.drive.Inputs``), conversations included.

First turns (and requests outside conversations) fall due at their ``arrival_s``. A later turn
depends on the server: it falls due ``think_time_s`` after the previous turn of its
conversation finished, with the previous prompt, the previous answer and its own new tokens as
its prompt (so the prefix cache can serve everything before its new tokens). The live runner
and the simulator both feed workloads through this one class; only how a request is submitted
(``submit``) and what "now" is differ.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Sequence

from engine.engine_core import EngineCore, StepResult
from engine.errors import InvalidRequestError
from engine.prompt_ids import prompt_token_ids
from engine.sequence import Sequence as EngineSequence
from replay.workloads.recipe import PromptRecipe, recipe_tokens
from replay.workloads.request import Request

# submit(index of the request in the workload, its prompt, when it fell due) -> the sequence.
Submit = Callable[[int, "list[int] | str", float], EngineSequence]
FINISHED_NORMALLY = ("length", "eos", "stop")
PREPARE_BATCH_TOKENS = 2**20  # recipe tokens built per numpy pass by ``prepare``


class WorkloadInputs:
    """Feeds ``requests`` into an engine: first turns at their arrival, later turns a think
    time after the previous turn finished (``timed``; untimed: at once, no clock to wait on).

    ``encode`` tokenizes a later turn given as text (None: such a turn is an error). A turn
    whose previous turn was rejected or aborted is not sent; ``skipped_turns`` counts them.
    """

    def __init__(self, requests: Sequence[Request], submit: Submit, timed: bool = True,
                 encode: Callable[[str], list[int]] | None = None) -> None:
        self.requests, self.submit, self.timed, self.encode = requests, submit, timed, encode
        self.next_turn: dict[int, int] = {}
        last_of: dict[str, int] = {}
        firsts = []
        for index, request in enumerate(requests):
            conversation = request.conversation_id
            if request.follows_previous_turn:
                previous = last_of.get(conversation)  # type: ignore[arg-type]
                if previous is None or requests[previous].turn != request.turn - 1:
                    raise InvalidRequestError(
                        f"request {index}: turn {request.turn} of conversation "
                        f"{conversation!r} does not follow its turn {request.turn - 1}")
                self.next_turn[previous] = index
            else:
                firsts.append(index)
            if conversation is not None:
                last_of[conversation] = index
        self.arrivals = sorted(firsts, key=lambda i: (self._arrival(i), i))
        self.cursor = 0
        self.released: list[tuple[float, int, list[int]]] = []  # (due, index, prompt) heap
        self.seqs: list[EngineSequence | None] = [None] * len(requests)
        self.index_of: dict[int, int] = {}  # seq_id -> request index
        self.due_s: dict[int, float] = {}  # request index -> when it fell due
        self.skipped_turns = 0
        # request index -> its prompt, built ahead (an int32 array: engine/prompt_ids.py)
        self.prepared: dict[int, list[int] | array] = {}

    def prepare(self, max_tokens: int) -> int:
        """Build the token-id prompts (recipes materialised, all in one pass) of the first turns
        in arrival order, then of the later turns' own tokens, before the run, until they hold
        ``max_tokens`` tokens; the rest are built as they fall due. A live run then spends none
        of its loop's time between steps building them (clients send prompts ready; building a
        long recipe prompt costs about as much as adding it, docs/BENCHMARKS.md 7k). Text
        prompts are left to the engine's tokenizer. Returns the tokens prepared."""
        later = sorted(set(range(len(self.requests))) - set(self.arrivals))
        chosen, held = [], 0
        for index in [*self.arrivals, *later]:
            length = self.requests[index].prompt_len
            if length is None:  # text
                continue
            if held + length > max_tokens:
                break
            chosen.append(index)
            held += length
        recipes = [i for i in chosen if isinstance(self.requests[i].prompt, PromptRecipe)]
        batch: list[int] = []
        tokens_in_batch = 0
        for position, index in enumerate(recipes):  # in batches: bounded numpy temporaries
            batch.append(index)
            tokens_in_batch += len(self.requests[index].prompt)  # type: ignore[arg-type]
            if position == len(recipes) - 1 or tokens_in_batch >= PREPARE_BATCH_TOKENS:
                built = recipe_tokens([self.requests[i].prompt for i in batch])  # type: ignore
                self.prepared.update((i, prompt_token_ids(tokens)[0])
                                     for i, tokens in zip(batch, built))
                batch, tokens_in_batch = [], 0
        for index in chosen:
            if index not in self.prepared:
                self.prepared[index] = _as_array(self.requests[index].prompt)  # type: ignore
        return held

    def _arrival(self, index: int) -> float:
        return self.requests[index].arrival_s if self.timed else 0.0

    def _prompt(self, index: int) -> list[int] | str:
        prepared = self.prepared.pop(index, None)
        return prepared if prepared is not None else self.requests[index].prompt_token_ids()

    def _user_tokens(self, index: int) -> list[int]:
        prompt = self._prompt(index)
        if not isinstance(prompt, str):
            return list(prompt)
        if self.encode is None:
            raise InvalidRequestError(f"request {index}: a later turn given as text needs a "
                                      "tokenizer (give prompt_token_ids or a recipe)")
        return self.encode(prompt)

    def _send(self, index: int, prompt: list[int] | str, due: float) -> None:
        seq = self.submit(index, prompt, due)
        self.seqs[index] = seq
        self.index_of[seq.seq_id] = index
        self.due_s[index] = due
        if seq.is_finished:  # rejected on arrival: its conversation cannot go on
            self._skip_after(index)

    def _skip_after(self, index: int) -> None:
        following = self.next_turn.get(index)
        while following is not None:
            self.skipped_turns += 1
            following = self.next_turn.get(following)

    def feed(self, core: EngineCore, now: float) -> None:
        """Submit every first turn and released later turn due by ``now``, in due order."""
        while True:
            arrival = (self._arrival(self.arrivals[self.cursor])
                       if self.cursor < len(self.arrivals) else None)
            turn = self.released[0][0] if self.released else None
            if turn is not None and turn <= now and (arrival is None or turn <= arrival):
                due, index, prompt = heapq.heappop(self.released)
                self._send(index, prompt, due)
            elif arrival is not None and arrival <= now:
                index = self.arrivals[self.cursor]
                self.cursor += 1
                self._send(index, self._prompt(index), arrival)
            else:
                return

    def next_due(self) -> float | None:
        arrival = (self._arrival(self.arrivals[self.cursor])
                   if self.cursor < len(self.arrivals) else None)
        turn = self.released[0][0] if self.released else None
        dues = [d for d in (arrival, turn) if d is not None]
        return min(dues) if dues else None

    def on_result(self, result: StepResult, now: float) -> None:
        """Release the next turn of each conversation whose turn finished in this step."""
        for seq in result.finished:
            index = self.index_of.get(seq.seq_id)
            following = self.next_turn.get(index) if index is not None else None
            if following is None:
                continue
            if seq.finish_reason not in FINISHED_NORMALLY:
                self._skip_after(index)  # type: ignore[arg-type]
                continue
            prompt = seq.token_ids[:]  # the previous prompt and answer, then the new tokens
            prompt.extend(self._user_tokens(following))
            think = self.requests[following].think_time_s if self.timed else 0.0
            heapq.heappush(self.released, (now + think, following, prompt))


def _as_array(prompt: list[int]) -> list[int] | array:
    """A workload's token-id prompt as the engine holds it (``prompt_token_ids``); one that is
    not token ids stays as given, for the engine to refuse when it falls due."""
    try:
        return prompt_token_ids(prompt)[0]
    except InvalidRequestError:
        return prompt
