"""Qwen's tokenizer through the ``tokenizers`` library alone, without importing transformers.

Importing transformers and building its tokenizer object takes seconds, most of the start-up
of a small CPU run. For a Qwen2-class checkpoint (Qwen2/2.5/3 all name ``Qwen2Tokenizer``)
transformers' fast tokenizer is a thin layer over the same ``tokenizers.Tokenizer``: ``encode``
and ``decode`` call it directly (``clean_up_tokenization_spaces`` is off for BPE), and
``apply_chat_template`` renders the template with Jinja in a sandbox configured as
transformers configures it, passing the named special tokens. ``FastTokenizer`` does the same
from ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``;
``tests/engine/model/test_fast_tokenizer.py`` compares it with ``AutoTokenizer``.

Anything this does not read (added_tokens.json, special_tokens_map.json, several named chat
templates, another tokenizer class) makes :meth:`FastTokenizer.from_dir` return None, and the
caller loads the directory with transformers.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

QWEN2_TOKENIZER_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")
# transformers' ``Qwen2Tokenizer`` defaults for special tokens tokenizer_config.json omits.
_QWEN2_DEFAULT_SPECIAL = {"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                          "pad_token": "<|endoftext|>"}
SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                            "cls_token", "mask_token")
# Files transformers would also read; where one is present, transformers loads the directory.
_UNREAD_FILES = ("added_tokens.json", "special_tokens_map.json", "chat_template.json",
                 "additional_chat_templates")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or a serialized AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class FastTokenizer:
    """``encode``/``decode``/``apply_chat_template`` of a Qwen2-class checkpoint, as
    ``transformers.AutoTokenizer`` gives them, from the ``tokenizers`` backend alone."""

    def __init__(self, backend: Any, config: dict[str, Any], chat_template: str | None,
                 name_or_path: str) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.name_or_path = name_or_path
        self.special_tokens_map: dict[str, str] = {}
        for attr in SPECIAL_TOKEN_ATTRIBUTES:
            default = _QWEN2_DEFAULT_SPECIAL.get(attr)
            value = _token_text(config[attr]) if attr in config else default
            if value is not None:
                self.special_tokens_map[attr] = value
        self.eos_token = self.special_tokens_map.get("eos_token")
        self.eos_token_id = self.backend.token_to_id(self.eos_token) if self.eos_token else None

    @classmethod
    def from_dir(cls, path: Path) -> FastTokenizer | None:
        """The tokenizer of checkpoint directory ``path``, or None where transformers must load it
        (no tokenizer.json, another tokenizer class, files this does not read)."""
        tokenizer_json = path / "tokenizer.json"
        config_file = path / "tokenizer_config.json"
        if not tokenizer_json.is_file() or not config_file.is_file():
            return None
        if any((path / name).exists() for name in _UNREAD_FILES):
            return None
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if not isinstance(config, dict) or config.get("tokenizer_class") not in (
            QWEN2_TOKENIZER_CLASSES
        ):
            return None
        template = config.get("chat_template")
        template_file = path / "chat_template.jinja"
        if template_file.is_file():  # transformers prefers the file to the config's entry
            template = template_file.read_text(encoding="utf-8")
        if template is not None and not isinstance(template, str):
            return None  # several named templates
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(tokenizer_json))
        if not _added_tokens_agree(backend, config):
            return None
        return cls(backend, config, template, str(path))

    def __len__(self) -> int:
        """The vocabulary size with the added tokens (``len`` of transformers' tokenizer)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """The base vocabulary size without the added tokens (transformers' ``vocab_size``)."""
        return self.backend.get_vocab_size(with_added_tokens=False)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The id of the token string ``token`` (None where it is not in the vocabulary)."""
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text`` (special-token strings in it become their ids)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: int | Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``token_ids``; ``skip_special_tokens`` leaves out the special ones."""
        ids = [int(token_ids)] if isinstance(token_ids, int) else [int(t) for t in token_ids]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        chat_template: str | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """``conversation`` (one list of role/content messages) under the chat template; the
        text, or with ``tokenize`` its token ids."""
        template = chat_template if chat_template is not None else self.chat_template
        if template is None:
            raise ValueError("the tokenizer has no chat template: pass chat_template")
        text = _compiled_template(template).render(
            messages=[dict(m) for m in conversation],
            tools=kwargs.pop("tools", None),
            documents=kwargs.pop("documents", None),
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _added_tokens_agree(backend: Any, config: dict[str, Any]) -> bool:
    """Whether tokenizer_config.json's added tokens are tokenizer.json's (transformers applies
    the config's; where they differ, transformers loads the directory)."""
    declared = config.get("added_tokens_decoder") or {}
    present = backend.get_added_tokens_decoder()
    for key, entry in declared.items():
        token = present.get(int(key))
        if token is None or not isinstance(entry, dict) or token.content != entry.get("content"):
            return False
        if bool(entry.get("special")) != token.special:
            return False
    return True


class _TemplateDict:
    """``dict`` in a template: calling and ``fromkeys`` only, no type attributes to climb."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


@functools.lru_cache(maxsize=16)
def _compiled_template(template: str) -> Any:
    """``template`` compiled in a Jinja sandbox set up as transformers sets up its own (block
    trimming, loop controls, ``tojson`` without HTML escaping, ``raise_exception``,
    ``strftime_now``, a namespace that refuses underscore names, ``{% generation %}``)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses the
        marks to find assistant tokens, which nothing here asks for)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace.check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes: {name!r}")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)
