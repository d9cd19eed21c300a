"""The frontend's per-token work, made lean: it runs for every token of every stream.

``StreamDetokenizer``: ``IncrementalDetokenizer`` decoding through the tokenizer's Rust backend
(``tokenizers.Tokenizer.decode``, the same text without ``transformers``' Python wrapper) and
reusing the last decodes (the next token's prefix is usually the text just decoded).
(``generation.ChunkWriter`` is the other half: a chunk from a per-request template.)
"""

from __future__ import annotations

from typing import Any

from engine.detokenizer import IncrementalDetokenizer


def backend_decoder(tokenizer: Any) -> Any:
    """The tokenizer's Rust ``decode`` where it is the same function as its ``decode`` (our
    ``FastTokenizer``, or a ``tokenizers``-backed transformers tokenizer that cleans up no
    spaces); None otherwise."""
    from engine.model.fast_tokenizer import FastTokenizer

    if isinstance(tokenizer, FastTokenizer):  # its decode is the backend's, unwrapped
        return tokenizer.backend.decode
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
