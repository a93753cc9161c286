"""Dense sentence embeddings: pooled token states (mean, cls or last), a sentence-transformers model's Dense layers,
optional L2 normalisation. The model's own stack (`modules.json`) sets the default pooling and normalisation; the
profile's and the request's options come before it. A profile's `dense_projection_path` picks which of the
checkpoint's Dense directories the stack's Dense module reads (stella's one per output width). A model whose config.json
says `is_mask_instruction` (NV-Embed) pools without the tokens of its instruction (`skips_prefix`). A public module
whose recipe writes each text into the checkpoint's chat template (Qwen3-VL-Embedding: `CHAT_PROMPT_MODULES`) gets
that prompt as its query and document template: the instruction (ending with a punctuation mark, a full stop added)
as the system turn, the text as the user's, the assistant's turn opened; its last token pooled unless the profile
says otherwise. On a GPU the token states stay on the device
and are pooled there (`device_pooling`); only the vectors come to the host."""

from __future__ import annotations

import unicodedata
from typing import ClassVar, Final

import numpy as np

from sie.catalog.adapters import DENSE
from sie.tokenization import INSTRUCTION_PLACEHOLDER, TEXT_PLACEHOLDER, PaddedBatch
from sie.worker.adapters.base import AdapterContext
from sie.worker.adapters.encoder import EncodeSpec, TextEncoderAdapter, check_width, first_output, output_width
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.device_pooling import DeviceTokenStates, device_pooling_for, pooled_rows
from sie.worker.outputs import l2_normalize, quantize
from sie.worker.sentence_modules import SentenceModules, read_sentence_modules

# Public modules whose recipe writes each text into the checkpoint's chat template, and the system turn they write
# when a request names no instruction.
CHAT_PROMPT_MODULES: Final = {"sie_server.adapters.qwen3_vl_embedding": "Represent the user's input."}


def full_stopped(instruction: str | None) -> str | None:
    """An instruction stripped, a full stop added unless it ends with a punctuation mark (Qwen3-VL-Embedding's
    `format_model_input`)."""
    if instruction is None:
        return None
    shaped = instruction.strip()
    if shaped and not unicodedata.category(shaped[-1]).startswith("P"):
        shaped += "."
    return shaped


class DenseAdapter(TextEncoderAdapter):
    """`sie.adapters.dense`: one vector per text; score is cosine similarity."""

    kind: ClassVar[str | None] = DENSE
    encode_outputs: ClassVar[tuple[str, ...]] = ("dense",)

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self._token_states = first_output(self.session, rank=3, preferred=("last_hidden_state", "token_embeddings"))
        # NV-Embed's recipe (its config's `is_mask_instruction`): the mean over the text's tokens, the instruction's
        # left out (right padding, as batches are here), whatever pooling its sentence-transformers files name
        config = context.model_config_json
        self.skips_prefix = bool(config.get("is_mask_instruction")) and config.get("padding_side", "right") == "right"
        if self.skips_prefix:
            self.runtime_options.setdefault("pooling", "mean")
        dense_path = context.profile.loadtime_options.get("dense_projection_path")
        if dense_path is not None and not isinstance(dense_path, str):
            raise ValueError(f"dense_projection_path must be a directory name, got {dense_path!r}")
        stack = read_sentence_modules(context.model_dir, dense_path) if context.model_dir is not None else None
        self._stack = stack or SentenceModules()  # no stack: pool, then normalise as the options say
        if stack is not None:
            if stack.pooling is not None:
                self.runtime_options.setdefault("pooling", stack.pooling)
            self.runtime_options.setdefault("normalize", stack.normalize)
        hidden = output_width(self.session, self._token_states)
        if self._stack.dense and hidden is not None and self._stack.dense[0].in_features != hidden:
            raise ValueError(
                f"the first Dense layer takes {self._stack.dense[0].in_features} inputs; the graph gives {hidden}"
            )
        check_width(self.model, "dense", None if hidden is None else self._stack.width(hidden), "the model gives")
        self._device_pooling = device_pooling_for(self.session, self._token_states, context.device_graphs)
        self._chat_prompt = self.profile.adapter_module in CHAT_PROMPT_MODULES
        if self._chat_prompt:
            self._write_into_chat_template(context, CHAT_PROMPT_MODULES[self.profile.adapter_module])

    def _write_into_chat_template(self, context: AdapterContext, default_instruction: str) -> None:
        """The query and document template of a chat-prompt recipe, from the checkpoint's own chat template."""
        source = context.tokenizer_config_json.get("chat_template")
        if not isinstance(source, str) or not source:
            raise ValueError(
                f"{self.profile.adapter_module} writes each text into the model's chat template; the checkpoint has "
                "none (tokenizer_config.json, chat_template.jinja, chat_template.json)"
            )
        # Jinja is imported with the first model that needs it, not by every process that imports the adapters.
        from sie.worker.generation.chat_template import ChatTemplate

        prompt = ChatTemplate(source).instructed_prompt(INSTRUCTION_PLACEHOLDER, TEXT_PLACEHOLDER)
        self.runtime_options.setdefault("query_template", prompt)
        self.runtime_options.setdefault("doc_template", prompt)
        self.runtime_options.setdefault("pooling", "last")  # the recipe's: the open assistant turn's last token
        shaped = full_stopped(str(self.runtime_options.get("default_instruction") or default_instruction))
        self.runtime_options["default_instruction"] = shaped

    def shaped_instruction(self, instruction: str | None) -> str | None:
        return full_stopped(instruction) if self._chat_prompt else instruction

    def forward(self, batch: PaddedBatch) -> list[np.ndarray | DeviceTokenStates]:
        """The batch's token states: a host array, or (on a GPU) left on the device to be pooled there."""
        return [self.run_token_states(bert_feeds(batch), self._token_states, self._device_pooling)]

    def _vectors(self, states: np.ndarray | DeviceTokenStates, mask: np.ndarray, options: dict,
                 rows: list[int] | None = None) -> np.ndarray:  # fmt: skip
        """The vectors of `rows` (every row when None), pooled under `mask` as `options` say."""
        vectors = self._stack.project(pooled_rows(states, mask, str(options.get("pooling") or "mean"), rows))
        return l2_normalize(vectors) if options.get("normalize", True) else vectors

    def represent(self, outputs: list, batch: PaddedBatch, specs: list[EncodeSpec]) -> list[dict]:
        states = outputs[0]
        groups: dict[tuple, list[int]] = {}
        for row, spec in enumerate(specs):
            key = (spec.options.get("pooling"), spec.options.get("normalize", True))
            groups.setdefault(key, []).append(row)
        if len(groups) == 1:  # the usual batch: one set of options, no row gathering and scattering
            vectors = self._vectors(states, batch.attention_mask, specs[0].options)
        else:
            parts = {tuple(rows): self._vectors(states, batch.attention_mask, specs[rows[0]].options, rows)
                     for rows in groups.values()}  # fmt: skip
            vectors = np.empty((len(specs), next(iter(parts.values())).shape[1]), dtype=np.float32)
            for rows, part in parts.items():
                vectors[list(rows)] = part
        return [
            {
                "dense": {
                    "dims": int(vectors.shape[1]),
                    "dtype": spec.output_dtype,
                    "values": quantize(vector, spec.output_dtype),
                }
            }
            for vector, spec in zip(vectors, specs, strict=True)
        ]

    def similarities(self, outputs: list, batch: PaddedBatch, query: int, docs: range) -> np.ndarray:
        options = {"pooling": self.runtime_options.get("pooling"), "normalize": True}
        vectors = self._vectors(outputs[0], batch.attention_mask, options, [query, *docs])
        return vectors[1:] @ vectors[0]
