"""The causal-LM adapter (kind `causal_lm`): a decoder graph converted by `sie.worker.convert` serving generation.

It turns a work item's GenerateParams into prompt token ids and SamplingParams (chat template, tokenizer, context
length, stop tokens) and hands the sequence to its BatchingDecoder, which decodes it beside the model's other
sequences on the model's own thread. Encode, score and extract stay refused (the base class).

A profile's runtime options may set what a request leaves out, as the public catalogue's generation YAMLs do:
`default_sampling` (`temperature`, `top_p`, `top_k`, `seed`: Qwen3Guard and granite-guardian decode greedily unless
asked otherwise) and `stop_tokens` (vocabulary tokens that end a generation besides the end-of-sequence ids:
translategemma's `<end_of_turn>`; one that is not a single token of the vocabulary stops as a stop string). A
default this engine does not apply (`repetition_penalty`, `min_p`) fails the load naming it. The catalogue entry's
`tasks.generate.chat_template_kwargs`, with a profile's own `chat_template_kwargs` over them, are the chat template's
switches (Qwen3's `enable_thinking`, granite-guardian's `guardian_config.risk_name`; no other keys, as the public
server accepts none); a model whose thinking they switch answers without its `<think>` block (Gemma 4: without its
thought channel, `<|channel>thought…<channel|>`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import tokenizers

from sie.catalog.adapters import CAUSAL_LM
from sie.catalog.options import chat_template_problem
from sie.wire import codes
from sie.wire.queue import GenerateParams
from sie.worker.adapters.base import Adapter, AdapterContext
from sie.worker.generation.batching_decoder import BatchingDecoder, SequenceStream
from sie.worker.generation.kv_cache import CacheShape
from sie.worker.generation.reasoning import ReasoningMarkers, answer_text, decoded_with_markers
from sie.worker.generation.sampling import MAX_REQUEST_STOP_STRINGS, SamplingParams

if TYPE_CHECKING:
    from sie.worker.generation.chat_template import ChatTemplate

# Limits of a model whose catalogue entry names none (tasks.generate, max_sequence_length, config.json).
DEFAULT_CONTEXT_LENGTH: Final = 2048
DEFAULT_MAX_OUTPUT_TOKENS: Final = 512
# A profile's `default_sampling` keys this engine applies, as SamplingParams fields.
DEFAULT_SAMPLING_FIELDS: Final = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
                                  "sampling_seed": "seed", "presence_penalty": "presence_penalty",
                                  "frequency_penalty": "frequency_penalty", "min_new_tokens": "min_tokens"}  # fmt: skip

# The GenerateParams fields a request may set over the profile's defaults, as SamplingParams fields of the same name.
REQUEST_SAMPLING_FIELDS: Final = ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty")


class GenerationInputError(ValueError):
    """A generation request this model cannot run as asked; `code` is its `sie.wire.codes` code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> GenerationInputError:
    return GenerationInputError(codes.INVALID_INPUT, message)


@attrs.frozen
class PreparedGeneration:
    """A generation ready to decode: the prompt's token ids and how to sample and stop."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams


def _token_text(value: Any) -> str:
    """A special token of tokenizer_config.json: a string, or HF's `{"content": ...}` form."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _chat_template_kwargs(value: Any, where: str) -> dict[str, Any]:
    """`chat_template_kwargs` of a catalogue entry (`where` it is written), checked; ValueError naming what is not
    one of the switches SIE passes to a chat template (`sie.catalog.options`)."""
    problem = chat_template_problem(value, f"{where}.chat_template_kwargs")
    if problem is not None:
        raise ValueError(problem)
    return dict(value or {})


def _default_sampling(value: Any) -> dict[str, Any]:
    """A profile's `default_sampling` as SamplingParams fields; ValueError naming what this engine does not apply."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"default_sampling must be a mapping, got {value!r}")
    unknown = sorted(set(value) - set(DEFAULT_SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"default_sampling {unknown} are not applied by this engine; it applies "
                         f"{sorted(DEFAULT_SAMPLING_FIELDS)}")  # fmt: skip
    fields = {DEFAULT_SAMPLING_FIELDS[key]: setting for key, setting in value.items()}
    try:
        SamplingParams(**fields)  # each value checked once, here, rather than blamed on every request
    except (TypeError, ValueError) as exc:
        raise ValueError(f"default_sampling: {exc}") from exc
    return fields


def _profile_stops(tokenizer: tokenizers.Tokenizer, value: Any) -> tuple[frozenset[int], tuple[str, ...]]:
    """A profile's `stop_tokens`: the ids of those that are one token of the vocabulary, and the others as stop
    strings (the public server's engine matches them as text: Gemma 4's YAMLs name Gemma 3's `<end_of_turn>`);
    ValueError for a value that is not a list of non-empty strings."""
    if value is None:
        return frozenset(), ()
    if not isinstance(value, list) or not all(isinstance(token, str) and token for token in value):
        raise ValueError(f"stop_tokens must be a list of non-empty strings, got {value!r}")
    ids = {token: tokenizer.token_to_id(token) for token in value}
    strings = tuple(token for token, token_id in ids.items() if token_id is None)
    if len(strings) > MAX_REQUEST_STOP_STRINGS:
        raise ValueError(f"stop_tokens {list(strings)} are not tokens of the model's vocabulary, and at most "
                         f"{MAX_REQUEST_STOP_STRINGS} stop strings may take their place")  # fmt: skip
    return frozenset(token_id for token_id in ids.values() if token_id is not None), strings


class CausalLMAdapter(Adapter):
    """Generation on a converted decoder (`sie.adapters.causal_lm`)."""

    kind = CAUSAL_LM

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        if context.tokenizer_path is None:
            raise ValueError("a causal LM needs its tokenizer.json")
        self._tokenizer = tokenizers.Tokenizer.from_file(str(context.tokenizer_path))
        config = context.tokenizer_config_json
        source = config.get("chat_template")
        self._template: ChatTemplate | None = None
        if isinstance(source, str) and source:
            # Jinja is imported with the first model that chats, not by every process that imports the adapters.
            from sie.worker.generation.chat_template import ChatTemplate

            self._template = ChatTemplate(source)
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        # The tokenizer's end-of-sequence token and every id config.json lists (a chat model's end of turn and
        # its end of text): any of them ends a generation.
        configured = context.model_config_json.get("eos_token_id")
        end_ids = {_id for _id in (configured if isinstance(configured, list) else [configured]) if _is_id(_id)}
        tokenizer_end = self._tokenizer.token_to_id(self.eos_token) if self.eos_token else None
        if tokenizer_end is not None:
            end_ids.add(tokenizer_end)
        self.eos_token_ids = frozenset(end_ids)
        generate = (self.model.raw.get("tasks") or {}).get("generate") or {}
        self.template_variables = {**_chat_template_kwargs(generate.get("chat_template_kwargs"), "tasks.generate"),
                                   **_chat_template_kwargs(self.profile.extra.get("chat_template_kwargs"),
                                                           f"profiles.{self.profile.name}")}  # fmt: skip
        # A model whose thinking the entry switches (on or off) is a thinking model: its `<think>` block (Gemma 4's
        # thought channel) is not part of the answer, as the public server returns none
        # (`sie.worker.generation.reasoning`).
        self.hides_reasoning = "enable_thinking" in self.template_variables
        self.reasoning = ReasoningMarkers.of(self._tokenizer)
        self.context_length = (
            _positive(generate.get("context_length"))
            or _positive(self.model.max_sequence_length)
            or _positive(context.model_config_json.get("max_position_embeddings"))
            or DEFAULT_CONTEXT_LENGTH
        )
        self.max_output_tokens = self.model.tasks.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS
        self.default_sampling = _default_sampling(self.runtime_options.get("default_sampling"))
        stop_tokens = self.runtime_options.get("stop_tokens")
        self.profile_stop_ids, self.profile_stops = _profile_stops(self._tokenizer, stop_tokens)
        self.engine = BatchingDecoder(
            self.session,
            CacheShape.from_config(context.model_config_json),
            self.decode_text,
            context.generation_limits,
            name=f"Model '{self.model.sie_id}'",
        )

    def generation_sequences(self) -> tuple[int, int]:
        return self.engine.active, self.engine.waiting

    def decode_text(self, token_ids: Any) -> str:
        """The text of generated ids, special tokens left out, and for a thinking model its reasoning block."""
        if not self.hides_reasoning:
            return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return answer_text(decoded_with_markers(self._tokenizer, token_ids, self.reasoning), self.reasoning)

    def prompt_text(self, params: GenerateParams) -> str:
        """The raw prompt as is, or the chat messages rendered with the model's template and an open assistant
        turn; exactly one of them must be set."""
        if (params.prompt is None) == (params.messages is None):
            raise _invalid("a generation needs exactly one of 'prompt' and 'messages'")
        if params.prompt is not None:
            return params.prompt
        if self._template is None:
            raise _invalid(f"Model '{self.model.sie_id}' has no chat template; send a 'prompt' instead")
        from sie.worker.generation.chat_template import ChatTemplateError  # loaded with the template

        try:
            return self._template.render(params.messages, bos_token=self.bos_token, eos_token=self.eos_token,
                                         variables=self._switches(params))  # fmt: skip
        except ChatTemplateError as exc:
            raise _invalid(str(exc)) from exc

    def _switches(self, params: GenerateParams) -> dict[str, Any]:
        """The chat template's switches: the request's, the catalogue entry's over them (as the public server)."""
        problem = chat_template_problem(params.chat_template_kwargs)
        if problem is not None:
            raise _invalid(problem)
        return {**(params.chat_template_kwargs or {}), **self.template_variables}

    def prepare(self, params: GenerateParams) -> PreparedGeneration:
        """Render and tokenize the prompt and check the sampling settings and the context length; a request it
        cannot run raises GenerationInputError. Blocking (tokenization): run it in an executor."""
        text = self.prompt_text(params)
        # A raw prompt gets what the tokenizer adds around a text (Gemma's and Llama's BOS), as transformers and
        # OpenAI-compatible servers tokenize it; a chat template writes those tokens itself.
        raw = params.prompt is not None
        prompt_ids = tuple(self._tokenizer.encode(text, add_special_tokens=raw).ids)
        if not prompt_ids:
            raise _invalid("the prompt is empty")
        return PreparedGeneration(prompt_ids, self._sampling(params, len(prompt_ids)))

    def _sampling(self, params: GenerateParams, prompt_tokens: int) -> SamplingParams:
        room = self.context_length - prompt_tokens
        max_new = params.max_new_tokens
        if max_new is not None and not 1 <= max_new <= self.max_output_tokens:
            raise _invalid(f"max_new_tokens must be from 1 to {self.max_output_tokens}, got {max_new}")
        if max_new is None:
            max_new = min(self.max_output_tokens, room)
        if max_new > room or max_new < 1:
            raise GenerationInputError(
                codes.INPUT_TOO_LONG,
                f"the prompt has {prompt_tokens} tokens; with {max_new} new tokens it exceeds Model "
                f"'{self.model.sie_id}''s context of {self.context_length} tokens",
            )
        stop_ids = set(params.stop_token_ids or ())
        stop_ids.update(self.eos_token_ids, self.profile_stop_ids)
        chosen = {name: getattr(params, name) for name in REQUEST_SAMPLING_FIELDS}
        try:
            return SamplingParams(
                **{**self.default_sampling, **{name: value for name, value in chosen.items() if value is not None}},
                max_tokens=max_new,
                stop=(*(params.stop or ()), *self.profile_stops),
                stop_token_ids=frozenset(stop_ids),
            )
        except (TypeError, ValueError) as exc:
            raise _invalid(str(exc)) from exc

    def start(self, prepared: PreparedGeneration, request_id: str, sequence_id: str) -> SequenceStream:
        """Queue the generation on the decode thread (call on the event loop that reads the stream)."""
        return self.engine.submit(prepared.prompt_ids, prepared.params, request_id, sequence_id)

    def close(self) -> None:
        self.engine.close()
