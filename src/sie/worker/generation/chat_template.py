"""Chat prompts: checking a request's chat messages and rendering them with a model's Jinja chat template (the
`chat_template` of its tokenizer_config.json), sandboxed the way Hugging Face renders them. Pure: no tokenizer,
no I/O; a bad message or a template that refuses it raises ChatTemplateError, which callers answer as
INVALID_INPUT.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES: Final = frozenset({"system", "user", "assistant", "developer"})
TEXT_PART_TYPES: Final = frozenset({"text", "input_text"})


class ChatTemplateError(ValueError):
    """Messages that cannot become a prompt, or a template that cannot render them; the message says why."""


def _raise_exception(message: str) -> NoReturn:
    # Templates call raise_exception("...") to refuse a conversation they cannot render (HF convention).
    raise TemplateError(message)


def normalize_messages(messages: Any) -> list[dict[str, str]]:
    """Chat turns as `{role, content}` with string content; list content (`[{type: text|input_text, text}]`)
    is joined with newlines and other keys of a turn are dropped. Anything else raises ChatTemplateError."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {role, content} objects")
    return [_turn(index, message) for index, message in enumerate(messages)]


def _turn(index: int, message: Any) -> dict[str, str]:
    if not isinstance(message, Mapping):
        raise ChatTemplateError(f"messages[{index}] must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in ROLES:
        raise ChatTemplateError(f"messages[{index}].role must be one of {sorted(ROLES)}, got {_shown(role)}")
    return {"role": role, "content": _content(index, message.get("content"))}


def _content(index: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(
            f"messages[{index}].content must be a string or a list of text parts, got {_shown(content)}"
        )
    texts = []
    for part_index, part in enumerate(content):
        where = f"messages[{index}].content[{part_index}]"
        if not isinstance(part, Mapping) or part.get("type") not in TEXT_PART_TYPES:
            raise ChatTemplateError(f"{where} must be a text part {{type: text, text}}, got {_shown(part)}")
        if not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"{where}.text must be a string, got {_shown(part.get('text'))}")
        texts.append(part["text"])
    return "\n".join(texts)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


class ChatTemplate:
    """One model's compiled chat template."""

    def __init__(self, source: str) -> None:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise_exception
        try:
            self._template = environment.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc

    def render(
        self, messages: Any, add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = ""
    ) -> str:
        """The prompt text of `messages` (checked by `normalize_messages`), ending with an open assistant turn
        when `add_generation_prompt`."""
        turns = normalize_messages(messages)
        try:
            return self._template.render(
                messages=turns, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
            )
        except (TemplateError, TypeError) as exc:  # TypeError: the template combined values it cannot
            raise ChatTemplateError(f"the model's chat template cannot render these messages: {exc}") from exc
