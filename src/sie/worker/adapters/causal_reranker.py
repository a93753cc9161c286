"""Decoder rerankers (Qwen3-Reranker, R3-rerank, mxbai-rerank-v2, zerank): each (query, document) pair is written
into the model's prompt, the decoder reads it (its hidden-state graph), and the pair's relevance comes from the output
head's logits at the last position: of two tokens, a "yes" and a "no" (`1`/`0` for mxbai), P(yes) of their softmax
(`score_mode: log_softmax`) or yes − no (`logit_diff`); or of one token, its raw logit (`logit`, zerank).

The prompt formats (`input_format`), as the models' cards build them, the prompt's parts tokenized one by one and
joined, so a part's first token never merges with the one before it:

- `qwen3`: `<|im_start|>system\\n{judge}<|im_end|>\\n<|im_start|>user\\n` + `<Instruct>: {instruction}\\n<Query>:
  {query}\\n<Document>: {document}` + `<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`; the
  instruction is the request's, else the profile's `default_instruction`, else the model card's. A pair longer than
  the context loses the end of its middle part, as the card's `truncation` does.
- `mxbai` (the default): a system turn, `query: {query}`, `\\n`, `document: {document}`, `\\n`, the relevance task
  prompt, and an open assistant turn. A pair longer than the context keeps its query and cuts its document.
- `qwen3_vl` (the default of the public `qwen3_vl_reranker` module: Qwen3-VL-Reranker, text only): the checkpoint's
  own chat template renders a system turn (the judge) and a user turn of text parts, `<Instruct>: {instruction}`,
  `<Query>:`, the query, `\n<Document>:`, the document (an empty text reads `NULL`), the assistant's turn opened, as
  the Qwen3-VL processor renders them; the prompt is tokenized whole, and a pair over the context loses the end of
  its document's tokens (the instruction, query and template kept whole, else the pair is refused). The instruction
  is the request's, else the profile's `default_instruction`, else "Retrieve relevant documents for the query.".
- `native` (the default of the public `native_causal_cross_encoder` module: zerank): the publisher's chat template
  with the query as the system turn and the document as the user turn, `<|im_start|>system\\n{query}<|im_end|>\\n
  <|im_start|>user\\n{document}<|im_end|>\\n<|im_start|>assistant\\n`, tokenized whole (as sentence-transformers'
  CrossEncoder renders and tokenizes it); the score is the raw logit of token `score_token_id` (9454, zerank's); a
  pair longer than the context is that item's refusal (invalid input), never cut.

The two tokens' rows of the output head (`lm_head.weight`, or the tied embeddings) are read from the checkpoint at
load, and nothing else of it. On a GPU the hidden states stay on the device: only each pair's last one comes to the
host (`device_pooling`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np
import tokenizers

from sie.catalog.adapters import CAUSAL_RERANKER
from sie.tokenization import pad_batch
from sie.wire.ipc_batch import OP_SCORE
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import IMAGES_NOT_SERVED, first_output, has_images, item_text, ranked_scores
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.safetensors_io import Checkpoint
from sie.worker.device_pooling import device_pooling_for, pooled_rows

QWEN3_JUDGE: Final = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the "
    'answer can only be "yes" or "no".'
)
QWEN3_DEFAULT_INSTRUCTION: Final = "Given a web search query, retrieve relevant passages that answer the query"
MXBAI_SYSTEM: Final = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
MXBAI_TASK: Final = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your binary "
    "relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)
QWEN3_VL_DEFAULT_INSTRUCTION: Final = "Retrieve relevant documents for the query."
INPUT_FORMATS: Final = ("mxbai", "qwen3", "qwen3_vl", "native")
SCORE_MODES: Final = ("logit_diff", "log_softmax", "logit")
# Per format: (yes token, no token, score mode) when the profile names none.
FORMAT_DEFAULTS: Final = {
    "qwen3": ("yes", "no", "log_softmax"),
    "qwen3_vl": ("yes", "no", "log_softmax"),  # the public adapter's sigmoid(yes − no): the same number
    "mxbai": ("1", "0", "logit_diff"),
    "native": ("", "", "logit"),
}
# The public module whose checkpoints (zerank) take the native format, and the token whose logit they score with.
NATIVE_MODULE: Final = "sie_server.adapters.native_causal_cross_encoder.adapter"
# The public modules whose checkpoints take a format of their own.
MODULE_FORMATS: Final = {NATIVE_MODULE: "native", "sie_server.adapters.qwen3_vl_reranker.adapter": "qwen3_vl"}
# Stand-ins for the instruction, query and document while the chat template renders a qwen3_vl prompt once.
QWEN3_VL_MARKS: Final = ("SIEMARKINSTRUCTION", "SIEMARKQUERY", "SIEMARKDOCUMENT")
NATIVE_TEMPLATE: Final = (
    "<|im_start|>system\n{query}<|im_end|>\n<|im_start|>user\n{document}<|im_end|>\n<|im_start|>assistant\n"
)
NATIVE_SCORE_TOKEN_ID: Final = 9454


class CausalRerankerAdapter(Adapter):
    """`qwen2_flash_cross_encoder`: score only."""

    kind: ClassVar[str | None] = CAUSAL_RERANKER
    supports_score: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        if context.tokenizer_path is None or context.model_dir is None:
            raise ValueError("a decoder reranker needs its tokenizer.json and checkpoint")
        self._hidden = first_output(self.session, rank=3, preferred=("last_hidden_state",))
        self._device_pooling = device_pooling_for(self.session, self._hidden, context.device_graphs)
        self._tokenizer = tokenizers.Tokenizer.from_file(str(context.tokenizer_path))
        options = {**context.profile.loadtime_options}
        default_format = MODULE_FORMATS.get(context.profile.adapter_module, "mxbai")
        self.input_format = str(options.get("input_format") or default_format)
        if self.input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format {self.input_format!r} is not one of {list(INPUT_FORMATS)}")
        yes, no, mode = FORMAT_DEFAULTS[self.input_format]
        self.score_mode = str(options.get("score_mode") or mode)
        if self.score_mode not in SCORE_MODES:
            raise ValueError(f"score_mode {self.score_mode!r} is not one of {list(SCORE_MODES)}")
        fallback = QWEN3_VL_DEFAULT_INSTRUCTION if self.input_format == "qwen3_vl" else QWEN3_DEFAULT_INSTRUCTION
        self.default_instruction = str(options.get("default_instruction") or fallback)
        if self.score_mode == "logit":  # one token, by id (the checkpoint's LogitScore true_token_id)
            self.token_ids = [int(options.get("score_token_id", NATIVE_SCORE_TOKEN_ID))]
        else:  # [no, yes] token ids: the first token of each word, as the models' cards take them
            self.token_ids = [self._first_token(str(options.get(key) or default)) for key, default in
                              (("no_token", no), ("yes_token", yes))]  # fmt: skip
        self._rows = _head_rows(context.model_dir, context.model_config_json, self.token_ids)
        self.max_length = self.tokenizer.max_length
        if self.input_format == "qwen3":
            prefix = f"<|im_start|>system\n{QWEN3_JUDGE}<|im_end|>\n<|im_start|>user\n"
            suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        else:
            prefix = f"<|im_start|>system\n{MXBAI_SYSTEM}<|im_end|>\n<|im_start|>user\n"
            suffix = "<|im_end|>\n<|im_start|>assistant\n"
        self._prefix, self._suffix = self._ids(prefix), self._ids(suffix)
        self._newline, self._task = self._ids("\n"), self._ids(MXBAI_TASK)
        self._vl_pieces = _qwen3_vl_pieces(context.tokenizer_config_json) if self.input_format == "qwen3_vl" else ()

    def _ids(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def _first_token(self, text: str) -> int:
        ids = self._ids(text)
        if not ids:
            raise ValueError(f"the score token {text!r} is no token of this tokenizer")
        return ids[0]

    def pair_ids(self, query: str, document: str, instruction: str | None) -> list[int]:
        """The prompt's token ids for one pair, cut to the model's context where the document ends (the native
        format refuses a pair that does not fit: ValueError)."""
        if self.input_format == "native":
            ids = self._ids(NATIVE_TEMPLATE.format(query=query, document=document))
            if len(ids) > self.max_length:
                raise ValueError(
                    f"the pair takes {len(ids)} tokens with its template, over the model's {self.max_length}"
                )
            return ids
        if self.input_format == "qwen3_vl":
            return self._qwen3_vl_ids(query, document, instruction or self.default_instruction)
        if self.input_format == "qwen3":
            middle = f"<Instruct>: {instruction or self.default_instruction}\n<Query>: {query}\n<Document>: {document}"
            head, body, tail = self._prefix, self._ids(middle), self._suffix
        else:
            head = self._prefix + self._ids(f"query: {query}") + self._newline
            body, tail = self._ids(f"document: {document}"), self._newline + self._task + self._suffix
        room = self.max_length - len(head) - len(tail)
        if room <= 0:
            raise ValueError(
                f"the query and the prompt take {len(head) + len(tail)} tokens of the model's {self.max_length}"
            )
        return head + body[:room] + tail

    def _qwen3_vl_ids(self, query: str, document: str, instruction: str) -> list[int]:
        """The rendered prompt tokenized whole; over the context, the document's last tokens (those wholly inside its
        text) are left out."""
        head, after_instruction, after_query, tail = self._vl_pieces
        before = head + instruction + after_instruction + (query or "NULL") + after_query
        shown = document or "NULL"
        encoding = self._tokenizer.encode(before + shown + tail, add_special_tokens=False)
        ids = encoding.ids
        if len(ids) <= self.max_length:
            return ids
        start, end = len(before), len(before) + len(shown)
        inside = [index for index, (first, last) in enumerate(encoding.offsets) if start <= first < last <= end]
        kept = self.max_length - (len(ids) - len(inside))
        if kept < 0:
            raise ValueError(f"the instruction, query and template take {len(ids) - len(inside)} tokens of the "
                             f"model's {self.max_length}")  # fmt: skip
        dropped = set(inside[kept:])
        return [token for index, token in enumerate(ids) if index not in dropped]

    def score(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        rows: list[list[int]] = []
        spans: list[range | None] = []
        results: list[ItemResult] = []
        with watch.stage("tokenization"):
            for item in items:
                refused = self.refused_options(item.options, OP_SCORE)
                query, docs = item_text(item.query_item), [item_text(doc) for doc in item.score_items]
                if not refused and has_images(item.query_item, *item.score_items):
                    refused = invalid(IMAGES_NOT_SERVED)
                if refused or query is None or not docs or any(doc is None for doc in docs):
                    spans.append(None)
                    results.append(refused or invalid("Score needs a text query and text items"))
                    continue
                instruction = item.instruction or self.options_for(item.options).get("instruction")
                try:
                    pairs = [self.pair_ids(query, doc, instruction) for doc in docs]
                except ValueError as exc:
                    spans.append(None)
                    results.append(invalid(str(exc)))
                    continue
                spans.append(range(len(rows), len(rows) + len(pairs)))
                rows.extend(pairs)
                results.append(ItemResult())  # its scores below
        if rows:
            with watch.stage("inference"):
                batch = pad_batch(rows, None, 0)
                last = self._last_states(batch.input_ids, batch.attention_mask)
            with watch.stage("postprocessing"):
                logits = last @ self._rows.T  # [pairs, (no, yes)], or [pairs, (token,)] for `logit`
                if self.score_mode == "logit":
                    scores = logits[:, 0]
                else:
                    difference = logits[:, 1] - logits[:, 0]
                    # P(yes) of the two tokens' softmax is the sigmoid of their difference
                    scores = 1.0 / (1.0 + np.exp(-difference)) if self.score_mode == "log_softmax" else difference
                for index, (item, span) in enumerate(zip(items, spans, strict=True)):
                    if span is not None:
                        n_tokens = sum(len(rows[i]) for i in span)
                        results[index] = ItemResult(
                            ranked_scores(scores[span], item.score_items), input_tokens=n_tokens
                        )
        return watch.finish(results)

    def _last_states(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Each row's hidden state at its last token (right padding), [rows, hidden] float32; on a GPU picked
        there, so the rest of the hidden states never leave the device."""
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        states = self.run_token_states(feeds, self._hidden, self._device_pooling)
        return pooled_rows(states, attention_mask, "last").astype(np.float32, copy=False)


def _qwen3_vl_pieces(tokenizer_config: Any) -> tuple[str, str, str, str]:
    """The qwen3_vl prompt around its instruction, query and document, rendered once by the checkpoint's chat
    template: (before the instruction, between it and the query, between the query and the document, after it)."""
    source = tokenizer_config.get("chat_template")
    if not isinstance(source, str) or not source:
        raise ValueError("the qwen3_vl format writes each pair into the model's chat template; the checkpoint has none "
                         "(tokenizer_config.json, chat_template.jinja, chat_template.json)")  # fmt: skip
    # Jinja is imported with the first model that needs it, not by every process that imports the adapters.
    from sie.worker.generation.chat_template import ChatTemplate

    instruction, query, document = QWEN3_VL_MARKS
    parts = [f"<Instruct>: {instruction}", "<Query>:", query, "\n<Document>:", document]
    prompt = ChatTemplate(source).render_parts([
        {"role": "system", "content": [{"type": "text", "text": QWEN3_JUDGE}]},
        {"role": "user", "content": [{"type": "text", "text": part} for part in parts]},
    ])  # fmt: skip
    if any(prompt.count(mark) != 1 for mark in QWEN3_VL_MARKS):
        raise ValueError("the model's chat template does not show a user turn's text parts once each")
    head, rest = prompt.split(instruction)
    after_instruction, rest = rest.split(query)
    after_query, tail = rest.split(document)
    return head, after_instruction, after_query, tail


def _head_rows(model_dir: Path, config_json: Any, token_ids: list[int]) -> np.ndarray:
    """The output head's rows of `token_ids`, [len, hidden] float32: `lm_head.weight`, or the input embeddings when
    the checkpoint ties them (or has no separate head)."""
    checkpoint = Checkpoint(model_dir)
    text_config = config_json.get("text_config") or {}
    tied = config_json.get("tie_word_embeddings", text_config.get("tie_word_embeddings"))
    # a causal LM's, a bare model's, a vision-language model's language model (Qwen3-VL)
    for name in ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight",
                 "model.language_model.embed_tokens.weight"):  # fmt: skip
        if name == "lm_head.weight" and tied:
            continue
        if name in checkpoint:
            try:
                return checkpoint.load_rows(name, token_ids)
            except ConversionError as exc:
                raise ValueError(str(exc)) from exc
    raise ValueError(f"the checkpoint in {model_dir} has no output head (lm_head.weight) or embeddings")
