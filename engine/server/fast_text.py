"""The frontend's per-token work, made lean: it runs for every token of every stream.

``StreamDetokenizer``: ``IncrementalDetokenizer`` decoding through the tokenizer's Rust backend
(``tokenizers.Tokenizer.decode``, the same text without ``transformers``' Python wrapper) and
reusing the last decodes (the next token's prefix is usually the text just decoded).
``ChunkWriter``: a streamed answer's content chunks from a per-request template, so one
``json.dumps`` of the text is all a chunk costs.
"""

from __future__ import annotations

import json
from typing import Any

from engine.detokenizer import IncrementalDetokenizer


def backend_decoder(tokenizer: Any) -> Any:
    """The tokenizer's Rust ``decode`` where it is the same function as its ``decode`` (a
    ``tokenizers``-backed tokenizer that cleans up no spaces); None otherwise."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "decode"):
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return backend.decode


class StreamDetokenizer(IncrementalDetokenizer):
    """``IncrementalDetokenizer`` with a faster ``_decode`` (same text)."""

    def __init__(self, tokenizer: Any, stop: Any = (), skip_special_tokens: bool = False,
                 decoder: Any = None) -> None:
        super().__init__(tokenizer, stop, skip_special_tokens)
        self._fast = decoder
        self._memo: list[tuple[list[int], str]] = []

    def _decode(self, token_ids: list[int]) -> str:
        for ids, text in self._memo:
            if ids == token_ids:
                return text
        if self._fast is not None:
            text = self._fast(token_ids, skip_special_tokens=self.skip_special_tokens)
        else:
            text = super()._decode(token_ids)
        self._memo = [self._memo[-1], (token_ids, text)] if self._memo else [(token_ids, text)]
        return text


class ChunkWriter:
    """The server-sent events of one streamed answer's content (``piece``): exactly
    ``generation.chunk``'s text for a chunk with text and no finish reason."""

    def __init__(self, chat: bool, request_id: str, model: str, created: int,
                 include_usage: bool) -> None:
        from engine.server.generation import chunk

        marker = "\x00"
        sample = chunk(chat, request_id, model, created, marker, None,
                                         include_usage)
        quoted = json.dumps(marker)
        head, tail = sample.split(quoted)
        self.head, self.tail = head, tail

    def piece(self, text: str) -> str:
        return self.head + json.dumps(text, ensure_ascii=False) + self.tail
