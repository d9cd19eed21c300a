"""Incremental detokenization with stop strings, outside the deterministic scheduler.

The text of a completion grows one token at a time. A token can end in the middle of a UTF-8
character (byte-level BPE), so a piece is emitted only once it decodes cleanly. A stop string
ends the text before it; the caller then finishes the request (``EngineCore.finish(seq_id,
"stop")``), an input to the scheduler like an abort, which the trace records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """The text of one completion, token by token (``add``), cut at the first stop string.

    ``add`` returns the text that became final: with stop strings, the last ``longest stop - 1``
    characters are held back until they cannot start a stop string (or until ``finish``).
    """

    def __init__(
        self, tokenizer: Any, stop: Iterable[str] = (), skip_special_tokens: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.skip_special_tokens = skip_special_tokens
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.tokens: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # decoded so far (cut at the stop string once stopped)
        self.emitted = 0  # characters of ``text`` returned by ``add`` / ``finish``
        self.stopped = False

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: Iterable[int]) -> str:
        """Append tokens; the new final text (empty after a stop)."""
        if self.stopped:
            return ""
        for token in token_ids:
            self.tokens.append(int(token))
            prefix = self._decode(self.tokens[self.prefix_offset : self.read_offset])
            full = self._decode(self.tokens[self.prefix_offset :])
            if len(full) <= len(prefix) or full.endswith(REPLACEMENT_CHAR):
                continue  # an incomplete character: wait for the next token
            searched_from = max(0, len(self.text) - self.holdback)
            self.text += full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
            if self._cut_at_stop(searched_from):
                break
        return self._emit(final=self.stopped)

    def finish(self) -> str:
        """The text still held back (and a trailing incomplete character) at the end."""
        if not self.stopped and self.read_offset < len(self.tokens):
            prefix = self._decode(self.tokens[self.prefix_offset : self.read_offset])
            full = self._decode(self.tokens[self.prefix_offset :])
            searched_from = max(0, len(self.text) - self.holdback)
            self.text += full[len(prefix) :]
            self.read_offset = len(self.tokens)
            self._cut_at_stop(searched_from)
        return self._emit(final=True)

    def _cut_at_stop(self, searched_from: int) -> bool:
        if not self.stop:
            return False
        hits = [i for i in (self.text.find(s, searched_from) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        self.stopped = True
        return True

    def _emit(self, final: bool) -> str:
        end = len(self.text) if final or not self.stop else len(self.text) - self.holdback
        if end <= self.emitted:
            return ""
        piece = self.text[self.emitted : end]
        self.emitted = end
        return piece
