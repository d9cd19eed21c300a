"""The frontend's lean per-token path gives exactly the text and events of the plain one."""

from __future__ import annotations

import numpy as np
import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.model.checkpoint import default_model_dir
from engine.model.tokenizer import load_tokenizer
from engine.server.fast_text import StreamDetokenizer, backend_decoder
from engine.server.generation import ChunkWriter, chunk


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201
    return load_tokenizer(str(default_model_dir()))


@pytest.mark.parametrize("stop", [(), ("e",), ("the", "\n")])
def test_stream_detokenizer_equals_the_plain_one(tokenizer, stop: tuple[str, ...]) -> None:  # noqa: ANN001
    assert backend_decoder(tokenizer) is not None  # the fast path is the one under test
    ids = np.random.default_rng(1).integers(0, len(tokenizer), 600).tolist()
    plain = IncrementalDetokenizer(tokenizer, stop, skip_special_tokens=True)
    fast = StreamDetokenizer(tokenizer, stop, skip_special_tokens=True,
                             decoder=backend_decoder(tokenizer))
    for i in range(0, len(ids), 3):
        assert fast.add(ids[i:i + 3]) == plain.add(ids[i:i + 3])
    assert fast.finish() == plain.finish()
    assert (fast.text, fast.stopped) == (plain.text, plain.stopped)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("usage", [False, True])
def test_chunk_writer_equals_chunk(chat: bool, usage: bool) -> None:
    writer = ChunkWriter(chat, "cmpl-1", "a \"model\"", 7, usage)
    for text in ["", "plain", "quote \" backslash \\ newline \n", "中文 \x01 \u2028"]:
        assert writer.piece(text) == chunk(chat, "cmpl-1", "a \"model\"", 7, text, None, usage)
