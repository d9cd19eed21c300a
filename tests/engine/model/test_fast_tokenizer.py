"""The tokenizers-only tokenizer gives what transformers.AutoTokenizer gives: the same ids for
varied text with special tokens, the same text back, the same chat-template text; directories
it does not read fully go to transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.model.checkpoint import default_model_dir
from engine.model.fast_tokenizer import FastTokenizer
from engine.model.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
            "<tool_call>", "<|fim_prefix|>", "<|vision_pad|>")
TEXTS = (
    "", " ", "\n\n", "Hello", " Hello world!", "I'm sure they'll say WE'RE done; don't.",
    "数字 1234567 与中文，emoji 😀🎉 and Кириллица, 日本語, 한국어",
    "def f(x):\n    return x ** 2  # comment\n\n\n\tTabs  and   spaces   ",
    "café cafe\u0301 naïve Å Å",  # NFC normalization: composed and decomposed forms
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>",
    "<think>\nplan</think>answer<|endoftext|>tail", "<|im_start", "|im_end|>", "<|<|im_end|>|>",
    "<tool_call>{\"name\": \"f\"}</tool_call>", "a<|endoftext|><|endoftext|>b",
)
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Exercises what Qwen3's template uses: namespace, loop controls, tojson, raise_exception,
# whitespace trimming, the special-token variables and extra keywords.
RICH = """{%- set ns = namespace(last_user=0) %}
{%- for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('bad role ' + message.role) }}
    {%- endif %}
    {%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- if tools %}{{ tools | tojson }}{% endif %}
{%- for message in messages %}
    {%- if message.content == 'skip' %}{% continue %}{% endif %}
    <|im_start|>{{ message.role }}
    {{ message.content | trim }}{{ eos_token if loop.index0 == ns.last_user else '' }}
    {{ {'role': message.role, 'n': loop.length} | tojson }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>
{% endif %}{% endif %}"""
MESSAGES = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief. é 😀"}, {"role": "user", "content": "  2+2?  "},
     {"role": "assistant", "content": "skip"}, {"role": "user", "content": "<think>x</think>"}],
]


@pytest.fixture(scope="module")
def tiny() -> Path:
    return default_model_dir()


@pytest.fixture(scope="module")
def pair(tiny: Path) -> tuple[FastTokenizer, object]:
    fast = load_tokenizer(tiny)
    assert isinstance(fast, FastTokenizer)  # the model dir the README example uses
    return fast, transformers.AutoTokenizer.from_pretrained(str(tiny), local_files_only=True)


def test_encode_and_decode_match_transformers(pair: tuple[FastTokenizer, object]) -> None:
    fast, hf = pair
    assert len(fast) == len(hf) and fast.eos_token_id == hf.eos_token_id
    assert fast.vocab_size == hf.vocab_size
    for text in TEXTS:
        for add in (False, True):
            ids = fast.encode(text, add_special_tokens=add)
            assert ids == hf.encode(text, add_special_tokens=add), text
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip), text
    for name in SPECIALS:
        assert fast.convert_tokens_to_ids(name) == hf.convert_tokens_to_ids(name)


text_pieces = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(SPECIALS)), max_size=8)


@given(pieces=text_pieces)
def test_generated_text_matches_transformers(pair: tuple[FastTokenizer, object],
                                             pieces: list[str]) -> None:
    fast, hf = pair
    text = "".join(pieces)
    ids = fast.encode(text, add_special_tokens=False)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert fast.decode(ids) == hf.decode(ids)


@given(ids=st.lists(st.integers(0, 151668), max_size=12), skip=st.booleans())
def test_decoding_any_ids_matches_transformers(pair: tuple[FastTokenizer, object],
                                               ids: list[int], skip: bool) -> None:
    """Also ids that end inside a UTF-8 character and special ids, skipped or kept."""
    fast, hf = pair
    assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("template", [CHATML, RICH])
def test_chat_template_matches_transformers(pair: tuple[FastTokenizer, object],
                                            template: str) -> None:
    fast, hf = pair
    tools = [{"type": "function", "function": {"name": "f", "description": "<é>"}}]
    for messages in MESSAGES:
        for extra in ({}, {"enable_thinking": False}, {"tools": tools}):
            for prompt in (False, True):
                ours = fast.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                add_generation_prompt=prompt, **extra)
                theirs = hf.apply_chat_template(messages, chat_template=template,
                                                tokenize=False, add_generation_prompt=prompt,
                                                **extra)
                assert ours == theirs
    bad = [{"role": "tool", "content": "x"}]
    with pytest.raises(Exception, match="bad role tool"):
        fast.apply_chat_template(bad, chat_template=RICH)


def test_ignore_merges_flag_is_immaterial_for_qwen_vocab(tiny: Path) -> None:
    """tokenizer.json sets BPE ignore_merges, transformers' Qwen2Tokenizer rebuilds BPE without
    it; that can differ only for a vocabulary token BPE does not rebuild, and there is none."""
    from tokenizers import Tokenizer

    spec = json.loads((tiny / "tokenizer.json").read_text(encoding="utf-8"))
    model = dict(spec["model"], ignore_merges=False)
    bare = Tokenizer.from_str(json.dumps({"version": "1.0", "model": model}))
    tokens = list(model["vocab"])
    encoded = bare.encode_batch([[t] for t in tokens], is_pretokenized=True)
    assert [e.ids for e in encoded] == [[model["vocab"][t]] for t in tokens]


def _copy_tokenizer(tiny: Path, dst: Path, **config: object) -> Path:
    dst.mkdir()
    shutil.copy(tiny / "tokenizer.json", dst / "tokenizer.json")
    spec = json.loads((tiny / "tokenizer_config.json").read_text(encoding="utf-8"))
    (dst / "tokenizer_config.json").write_text(json.dumps({**spec, **config}), encoding="utf-8")
    return dst


def test_chat_template_from_config_and_file(tiny: Path, tmp_path: Path) -> None:
    in_config = _copy_tokenizer(tiny, tmp_path / "config", chat_template=CHATML)
    assert load_tokenizer(in_config).chat_template == CHATML
    in_file = _copy_tokenizer(tiny, tmp_path / "file", chat_template=CHATML)
    (in_file / "chat_template.jinja").write_text(RICH, encoding="utf-8")
    fast = load_tokenizer(in_file)
    hf = transformers.AutoTokenizer.from_pretrained(str(in_file), local_files_only=True)
    assert fast.chat_template == hf.chat_template == RICH
    messages = MESSAGES[1]
    assert fast.apply_chat_template(messages, add_generation_prompt=True) == (
        hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_directories_it_does_not_read_go_to_transformers(tiny: Path, tmp_path: Path) -> None:
    other_class = _copy_tokenizer(tiny, tmp_path / "class", tokenizer_class="GPT2Tokenizer")
    named = _copy_tokenizer(tiny, tmp_path / "named",
                            chat_template=[{"name": "default", "template": CHATML}])
    legacy = _copy_tokenizer(tiny, tmp_path / "legacy")
    (legacy / "special_tokens_map.json").write_text("{}", encoding="utf-8")
    disagree = _copy_tokenizer(tiny, tmp_path / "disagree")
    spec = json.loads((disagree / "tokenizer_config.json").read_text(encoding="utf-8"))
    spec["added_tokens_decoder"]["151667"]["special"] = True
    (disagree / "tokenizer_config.json").write_text(json.dumps(spec), encoding="utf-8")
    for path in (other_class, named, legacy, disagree):
        assert FastTokenizer.from_dir(path) is None, path.name
    assert not isinstance(load_tokenizer(legacy), FastTokenizer)
