"""The generation request shapes parsed into one GenerateCall: SIE-native `POST /v1/generate/{model}` and
OpenAI's `POST /v1/chat/completions`, `POST /v1/completions` and `POST /v1/responses` (their text subset). Every
refusal names the field the caller wrote (OpenAI `param`); fields that ask for something this server does not do are
refused, fields that ask for nothing are accepted. Pure: builds plain data from decoded JSON.
"""

from __future__ import annotations

import math
from typing import Any, Final

from sie.catalog.options import chat_template_problem
from sie.gateway.errors import InvalidRequestError
from sie.gateway.generation import GenerateCall
from sie.wire.queue import GenerateParams

MAX_STOP_STRINGS: Final = 4  # as OpenAI allows (the worker adds a model profile's own to them)
CHAT_ROLES: Final = frozenset({"system", "user", "assistant", "developer"})
COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16  # OpenAI's default for /v1/completions
_INT64: Final = 2**63

# Fields a surface accepts and ignores (routing hints of hosted deployments, end-user ids, OpenAI bookkeeping).
_IGNORED_NATIVE: Final = frozenset({"routing_key", "prompt_cache_key", "safety_identifier"})
_IGNORED_OPENAI: Final = frozenset(
    {"user", "safety_identifier", "prompt_cache_key", "routing_key", "metadata", "store", "service_tier",
     "parallel_tool_calls"}
)  # fmt: skip


# The values of fields SIE does not serve that ask for nothing (OpenAI's defaults); an empty list or map, and
# None, ask for nothing either.
_NEUTRAL: Final[dict[str, tuple[Any, ...]]] = {
    "repetition_penalty": (1,), "n": (1,), "best_of": (1,),
    "logprobs": (False, 0), "top_logprobs": (0,), "echo": (False,), "include_reasoning": (False,),
    "tool_choice": ("none", "auto"), "function_call": ("none", "auto"), "modalities": (["text"],),
    "response_format": ({"type": "text"},),
}  # fmt: skip


def _unsupported(name: str, value: Any, neutral: dict[str, tuple[Any, ...]] = _NEUTRAL) -> bool:
    """Whether a field SIE does not serve asks for something (grammar, lora_adapter, suffix: any value does)."""
    if value is None or (type(value) in (list, dict) and not value):
        return False
    return value not in neutral.get(name, ())


_UNSUPPORTED_NATIVE: Final = frozenset({"images", "grammar", "logit_bias", "lora_adapter", "logprobs", "top_logprobs"})
_UNSUPPORTED_CHAT: Final = frozenset(
    {"tools", "tool_choice", "functions", "function_call", "response_format", "logprobs",
     "top_logprobs", "logit_bias", "repetition_penalty", "best_of",
     "lora_adapter", "audio", "modalities", "prediction", "include_reasoning"}
)  # fmt: skip
_UNSUPPORTED_COMPLETIONS: Final = frozenset({"echo", "suffix", "best_of", "logprobs", "logit_bias", "lora_adapter"})
_PENALTIES: Final = ("presence_penalty", "frequency_penalty")  # OpenAI's, from -2 to 2
_SAMPLING: Final = frozenset({"temperature", "top_p", "top_k", "stop", "seed", "stream", *_PENALTIES})
_NATIVE_FIELDS: Final = _SAMPLING | {"prompt", "max_new_tokens", "options"}
_CHAT_FIELDS: Final = _SAMPLING | {"model", "messages", "max_tokens", "max_completion_tokens", "n", "stream_options",
                                    "chat_template_kwargs"}  # fmt: skip
_COMPLETIONS_FIELDS: Final = _SAMPLING | {"model", "prompt", "max_tokens", "n", "stream_options"}
_RESPONSES_FIELDS: Final = frozenset({"model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
                                      "stream"})  # fmt: skip
# Responses fields that ask for state or tools this server does not keep or run; their empty values are accepted.
_UNSUPPORTED_RESPONSES: Final = frozenset(
    {"previous_response_id", "conversation", "tools", "tool_choice", "reasoning", "text", "include", "background",
     "prompt", "max_tool_calls", "top_logprobs", "truncation", "stream_options"}
)  # fmt: skip
_NEUTRAL_RESPONSES: Final[dict[str, tuple[Any, ...]]] = {
    "tool_choice": ("none", "auto"), "text": ({"format": {"type": "text"}},), "truncation": ("disabled",),
    "top_logprobs": (0,), "background": (False,),
}  # fmt: skip


def _check_fields(
    data: dict[str, Any],
    known: frozenset[str],
    ignored: frozenset[str],
    refused: frozenset[str],
    neutral: dict[str, tuple[Any, ...]] = _NEUTRAL,
) -> None:
    for name, value in data.items():
        if name in known or name in ignored:
            continue
        if name in refused:
            if _unsupported(name, value, neutral):
                raise InvalidRequestError(f"Field '{name}' is not supported by this server", param=name)
            continue
        raise InvalidRequestError(f"Unknown field '{name}'", param=name)


def _object(data: Any) -> dict[str, Any]:
    if type(data) is not dict:
        raise InvalidRequestError("Request body must be a JSON object")
    return data


def _int(data: dict[str, Any], name: str, minimum: int, default: int | None = None) -> int | None:
    value = data.get(name)
    if value is None:
        return default
    if type(value) is not int or value < minimum:
        raise InvalidRequestError(f"Field '{name}' must be an integer >= {minimum}, got {value!r}", param=name)
    return value


def _number(data: dict[str, Any], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise InvalidRequestError(f"Field '{name}' must be a number, got {value!r}", param=name)
    return float(value)


def _sampling(data: dict[str, Any], max_tokens: int | None, **prompt: Any) -> GenerateParams:
    """The sampling fields every surface shares, checked as the worker would check them (SamplingParams)."""
    temperature, top_p = _number(data, "temperature"), _number(data, "top_p")
    if temperature is not None and temperature < 0:
        raise InvalidRequestError(f"Field 'temperature' must be >= 0, got {temperature!r}", param="temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise InvalidRequestError(f"Field 'top_p' must be in (0, 1], got {top_p!r}", param="top_p")
    seed = data.get("seed")
    if seed is not None and (type(seed) is not int or not -_INT64 <= seed < _INT64):
        raise InvalidRequestError(f"Field 'seed' must be a 64-bit integer, got {seed!r}", param="seed")
    penalties = {name: _number(data, name) for name in _PENALTIES}
    for name, penalty in penalties.items():
        if penalty is not None and not -2 <= penalty <= 2:
            raise InvalidRequestError(f"Field '{name}' must be from -2 to 2, got {penalty!r}", param=name)
    return GenerateParams(
        max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=_int(data, "top_k", 0),
        seed=seed, stop=_stop(data.get("stop")), **penalties, **prompt,
    )  # fmt: skip


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if type(value) is str else value
    if type(stops) is not list or not all(type(stop) is str and stop for stop in stops):
        raise InvalidRequestError("Field 'stop' must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"Field 'stop' holds at most {MAX_STOP_STRINGS} strings", param="stop")
    return stops or None


def _stream(data: dict[str, Any]) -> bool:
    value = data.get("stream")
    if value is not None and type(value) is not bool:
        raise InvalidRequestError("Field 'stream' must be a boolean", param="stream")
    return value is True


def _include_usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if type(options) is not dict:
        raise InvalidRequestError("Field 'stream_options' must be an object", param="stream_options")
    return options.get("include_usage") is True


def _model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if type(model) is not str or not model:
        raise InvalidRequestError("Field 'model' is required and must be a string", param="model")
    return model


def parse_native(model: str, data: Any) -> GenerateCall:
    """`POST /v1/generate/{model}`: `{prompt, max_new_tokens, temperature?, top_p?, top_k?, stop?, seed?,
    presence_penalty?, frequency_penalty?, stream?, options?}`; each refusal names its field."""
    data = _object(data)
    _check_fields(data, _NATIVE_FIELDS, _IGNORED_NATIVE, _UNSUPPORTED_NATIVE)
    prompt = data.get("prompt")
    if type(prompt) is not str:
        raise InvalidRequestError("Field 'prompt' is required and must be a string", param="prompt")
    if data.get("max_new_tokens") is None:
        raise InvalidRequestError("Field 'max_new_tokens' is required", param="max_new_tokens")
    options = data.get("options")
    if options is not None and type(options) is not dict:
        raise InvalidRequestError("Field 'options' must be an object", param="options")
    profile = options.get("profile") if options else None
    params = _sampling(data, _int(data, "max_new_tokens", 1), prompt=prompt)
    return GenerateCall(model, params, _stream(data), profile=profile)


def parse_chat(data: Any) -> GenerateCall:
    """`POST /v1/chat/completions` (the text subset of OpenAI's): messages rendered with the model's chat template."""
    data = _object(data)
    _check_fields(data, _CHAT_FIELDS, _IGNORED_OPENAI, _UNSUPPORTED_CHAT)
    model = _model(data)
    _int(data, "n", 1)
    if data.get("n") not in (None, 1):
        raise InvalidRequestError("Only n=1 is supported", param="n")
    field = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    switches = data.get("chat_template_kwargs")
    problem = chat_template_problem(switches)
    if problem is not None:
        raise InvalidRequestError(problem, param="chat_template_kwargs")
    params = _sampling(data, _int(data, field, 1), messages=_messages(data.get("messages")),
                       chat_template_kwargs=dict(switches) if switches else None)  # fmt: skip
    return GenerateCall(model, params, _stream(data), _include_usage(data), max_tokens_field=field)


def _messages(value: Any) -> list[dict[str, Any]]:
    if type(value) is not list or not value:
        raise InvalidRequestError("Field 'messages' must be a non-empty list", param="messages")
    return [_message(index, message) for index, message in enumerate(value)]


def _message(index: int, message: Any, field: str = "messages") -> dict[str, Any]:
    where = f"{field}[{index}]"
    if type(message) is not dict:
        raise InvalidRequestError(f"Field '{where}' must be an object with 'role' and 'content'", param=where)
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise InvalidRequestError(
            f"Field '{where}.role' must be one of {sorted(CHAT_ROLES)}, got {role!r}", param=f"{where}.role"
        )
    content = message.get("content")
    if type(content) is list:  # content parts: only text ones
        if not all(type(part) is dict and part.get("type") == "text" and type(part.get("text")) is str
                   for part in content):  # fmt: skip
            raise InvalidRequestError(f"Field '{where}.content' may hold text parts only", param=f"{where}.content")
        content = "".join(part["text"] for part in content)
    if type(content) is not str:
        raise InvalidRequestError(f"Field '{where}.content' must be a string", param=f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": content}


def parse_completion(data: Any) -> GenerateCall:
    """`POST /v1/completions`: one raw prompt continued (`max_tokens` defaults to 16, as OpenAI's)."""
    data = _object(data)
    _check_fields(data, _COMPLETIONS_FIELDS, _IGNORED_OPENAI, _UNSUPPORTED_COMPLETIONS)
    model = _model(data)
    if data.get("n") not in (None, 1):
        raise InvalidRequestError("Only n=1 is supported", param="n")
    prompt = data.get("prompt")
    if type(prompt) is list and len(prompt) == 1:
        prompt = prompt[0]
    if type(prompt) is not str:
        raise InvalidRequestError("Field 'prompt' must be a string or a list of exactly one string", param="prompt")
    max_tokens = _int(data, "max_tokens", 1, COMPLETIONS_DEFAULT_MAX_TOKENS)
    params = _sampling(data, max_tokens, prompt=prompt)
    return GenerateCall(model, params, _stream(data), _include_usage(data), max_tokens_field="max_tokens")


def parse_responses(data: Any) -> GenerateCall:
    """`POST /v1/responses` (the text subset of OpenAI's Responses API, stateless): `input` is a string (one user
    message) or a list of messages whose content is a string or `input_text`/`output_text` parts; `instructions`
    becomes a system message before them. State (`previous_response_id`, `conversation`), tools and reasoning
    settings are refused by name."""
    data = _object(data)
    _check_fields(data, _RESPONSES_FIELDS, _IGNORED_OPENAI, _UNSUPPORTED_RESPONSES, _NEUTRAL_RESPONSES)
    model = _model(data)
    messages = _input_messages(data.get("input"))
    instructions = data.get("instructions")
    if instructions is not None:
        if type(instructions) is not str:
            raise InvalidRequestError("Field 'instructions' must be a string", param="instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    params = _sampling(data, _int(data, "max_output_tokens", 1), messages=messages)
    return GenerateCall(model, params, _stream(data), max_tokens_field="max_output_tokens")


_INPUT_PART_TYPES: Final = frozenset({"input_text", "output_text", "text"})


def _input_messages(value: Any) -> list[dict[str, Any]]:
    if type(value) is str:
        return [{"role": "user", "content": value}]
    if type(value) is not list or not value:
        raise InvalidRequestError("Field 'input' must be a string or a non-empty list of messages", param="input")
    messages = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if type(item) is not dict or item.get("type", "message") != "message":
            raise InvalidRequestError(f"Field '{where}' must be a message (role and content)", param=where)
        content = item.get("content")
        if type(content) is list:
            if not all(type(part) is dict and part.get("type") in _INPUT_PART_TYPES and type(part.get("text")) is str
                       for part in content):  # fmt: skip
                raise InvalidRequestError(f"Field '{where}.content' may hold text parts only", param=f"{where}.content")
            item = {**item, "content": "".join(part["text"] for part in content)}
        messages.append(_message(index, {"role": item.get("role"), "content": item.get("content")}, "input"))
    return messages
