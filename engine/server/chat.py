"""Chat messages to a prompt: the model's chat template, or ChatML where it ships none."""

from __future__ import annotations

from typing import Any

from engine.server.protocol import ApiError

# ChatML, the format Qwen's instruct models use; for checkpoints without a template (the tiny
# model's tokenizer files have none).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def chat_prompt_text(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """``messages`` under the tokenizer's template, ending with the opening of the assistant's
    turn: the text the prompt's token ids encode. A 400 ``ApiError`` naming ``messages`` where
    the template refuses them while rendering (``raise_exception``: roles that do not
    alternate, a system turn it has no place for): the client's to change. A template that
    does not compile is the server's fault and goes through (a 500)."""
    import jinja2

    template = getattr(tokenizer, "chat_template", None) or CHATML_TEMPLATE
    try:
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=True)
    except jinja2.TemplateSyntaxError:
        raise
    except jinja2.TemplateError as exc:
        raise ApiError(f"the model's chat template refuses these messages: {exc}",
                       "messages") from None


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of ``messages`` under the tokenizer's template (``chat_prompt_text``)."""
    return tokenizer.encode(chat_prompt_text(tokenizer, messages), add_special_tokens=False)
