"""Chat prompts: checking a request's chat messages and rendering them with a model's Jinja chat template (the
`chat_template` of its tokenizer_config.json), sandboxed the way Hugging Face renders them. Pure: no tokenizer,
no I/O; a bad message or a template that refuses it raises ChatTemplateError, which callers answer as
INVALID_INPUT.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, NoReturn

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES: Final = frozenset({"system", "user", "assistant", "developer"})
TEXT_PART_TYPES: Final = frozenset({"text", "input_text"})


class ChatTemplateError(ValueError):
    """Messages that cannot become a prompt, or a template that cannot render them; the message says why."""


def _raise_exception(message: str) -> NoReturn:
    # Templates call raise_exception("...") to refuse a conversation they cannot render (HF convention).
    raise TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Hugging Face's `tojson`: plain JSON, where Jinja's own escapes <, >, & and ' for HTML
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format_string: str) -> str:
    # Templates date their system turn with it (Llama 3.1: "Today Date: 26 Jul 2024")
    return datetime.now().strftime(format_string)


class _GenerationBlock(Extension):
    """`{% generation %}…{% endgeneration %}`: Hugging Face's marker of the assistant's text in training templates,
    rendered as its body (a template that uses it must compile here as it does there)."""

    tags = {"generation"}  # noqa: RUF012 - Jinja's Extension API: a class attribute

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


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
        # Hugging Face's environment: loop controls ({% break %}), its `tojson`, `strftime_now`, `{% generation %}`
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationBlock]
        )
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        environment.filters["tojson"] = _tojson
        try:
            self._template = environment.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc

    def render(  # noqa: PLR0913 - the template's variables
        self,
        messages: Any,
        add_generation_prompt: bool = True,
        bos_token: str = "",
        eos_token: str = "",
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of `messages` (checked by `normalize_messages`), ending with an open assistant turn
        when `add_generation_prompt`; `variables` are the template's own switches (`apply_chat_template`'s extra
        keyword arguments: Qwen3's `enable_thinking`, granite-guardian's `guardian_config`)."""
        turns = normalize_messages(messages)
        try:
            return self._template.render(
                **dict(variables or {}), messages=turns, add_generation_prompt=add_generation_prompt,
                bos_token=bos_token, eos_token=eos_token,
            )  # fmt: skip
        except (TemplateError, TypeError) as exc:  # TypeError: the template combined values it cannot
            raise ChatTemplateError(f"the model's chat template cannot render these messages: {exc}") from exc

    def render_parts(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt of a recipe's own turns, whose content may be a list of text parts (`{type: text, text}`),
        passed to the template as they are: each template joins the parts its own way, as the Qwen-VL processors'
        templates do (the request path's `render` joins them with newlines first, as OpenAI's chat reads them)."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token="", eos_token="")  # fmt: skip
        except (TemplateError, TypeError) as exc:
            raise ChatTemplateError(f"the model's chat template cannot render these messages: {exc}") from exc

    def instructed_prompt(self, instruction: str, text: str) -> str:
        """The prompt of a system turn `instruction` and a user turn `text`, the assistant's turn opened, with the two
        left as the placeholders given (an embedder's recipe that writes each text into its chat template, as
        Qwen3-VL-Embedding's does); ChatTemplateError when the template does not show each turn's text once."""
        marks = {instruction: "SIEMARKINSTRUCTION", text: "SIEMARKTEXT"}
        prompt = self.render([{"role": "system", "content": marks[instruction]},
                              {"role": "user", "content": marks[text]}])  # fmt: skip
        for placeholder, mark in marks.items():
            if prompt.count(mark) != 1:
                raise ChatTemplateError("the model's chat template does not show a system turn's and a user turn's "
                                        "text once each")  # fmt: skip
            prompt = prompt.replace(mark, placeholder)
        return prompt
