"""Context pruning (the public `stablebridge_pruner` module: sugiv/stablebridge-pruner-highlighter on
BAAI/bge-reranker-v2-m3): a cross-encoder scores a (query, passage) pair, and a head trained apart from it reads the
pair's last hidden states and gives each passage token the probability that it is worth keeping.

- score: the cross-encoder's, as `cross_encoder` computes it (sigmoid of the logit; the instruction before the
  query).
- extract: the item's text is the passage and the request's instruction the query (an empty one without it). The
  pair runs once; the pruning head (Linear, exact GELU, Linear to one logit, sigmoid) gives each passage token its
  probability, which is `highlight` from `highlight_threshold` (0.9) up, `kept` from `prune_threshold` (0.6) up,
  else `pruned`; neighbouring tokens of one label (no more than one character apart) join into a span, scored by
  their mean probability. The result's entities are a `summary` first (the pair's rerank score, the share of spans
  pruned: `rerank=0.8731 compression=33.33% kept=2/3`), then the spans in passage order, as the public adapter
  returns them. The passage's tokens are those after the pair's second separator, their character offsets those of
  the passage tokenized alone; the pair's special tokens and padding are passed over.

The head's file is fetched from where the profile's `pruning_head_path` says (a Hub repository, a directory or a
file; `pruning_head_file` in it) and read without torch (`torch_zip`): a state dict whose `classifier.0` and
`classifier.3` are the two layers, at the top or under `pruning_head.`, `model_state_dict.pruning_head.`,
`model_state_dict.` or `state_dict.`, as the public adapter looks for them; `hidden_size` and `intermediate_size`
are checked against them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Final

import attrs
import numpy as np
import tokenizers

from sie.catalog.adapters import CONTEXT_PRUNER
from sie.wire.ipc_batch import OP_EXTRACT
from sie.worker.adapters.base import AdapterContext, BatchResult, ItemResult, Stopwatch, entity_result, invalid
from sie.worker.adapters.cross_encoder import CrossEncoderAdapter
from sie.worker.adapters.encoder import IMAGES_NOT_SERVED, first_output, has_images, item_text
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.torch_zip import TorchZipFile

DEFAULT_PRUNE_THRESHOLD: Final = 0.6
DEFAULT_HIGHLIGHT_THRESHOLD: Final = 0.9
# Where a training checkpoint keeps the head's layers, in the order the public adapter looks.
HEAD_PREFIXES: Final = ("pruning_head.", "model_state_dict.pruning_head.", "model_state_dict.", "state_dict.", "")
# The tokenizer_config.json entries whose tokens are not passage text (the public adapter's set).
SPECIAL_TOKEN_KEYS: Final = ("pad_token", "sep_token", "cls_token", "bos_token")
DEFAULT_SEPARATOR_ID: Final = 2  # XLM-RoBERTa's </s>, the public adapter's fallback


@attrs.frozen
class PruningHead:
    """Two linear layers with an exact GELU between them, to one logit per token."""

    inner: np.ndarray  # [intermediate, hidden]
    inner_bias: np.ndarray
    outer: np.ndarray  # [intermediate]
    outer_bias: float

    @classmethod
    def read(cls, path: Path, hidden_size: int, intermediate_size: int) -> PruningHead:
        """The head of a torch.save checkpoint; ValueError naming what is missing or mis-shaped."""
        try:
            state = TorchZipFile(path)
        except ConversionError as exc:
            raise ValueError(f"the pruning head {path}: {exc}") from exc
        prefix = next((p for p in HEAD_PREFIXES if f"{p}classifier.0.weight" in state), None)
        if prefix is None:
            places = ", ".join(p.rstrip(".") for p in HEAD_PREFIXES if p)
            raise ValueError(f"the pruning head {path} has no classifier.0.weight (at the top or under {places}); "
                             f"it holds {state.names()[:8]}")  # fmt: skip
        shapes = {"classifier.0.weight": (intermediate_size, hidden_size), "classifier.0.bias": (intermediate_size,),
                  "classifier.3.weight": (1, intermediate_size), "classifier.3.bias": (1,)}  # fmt: skip
        arrays = {}
        for name, shape in shapes.items():
            if f"{prefix}{name}" not in state:
                raise ValueError(f"the pruning head {path} has no {prefix}{name}")
            array = state.load(f"{prefix}{name}")
            if array.shape != shape:
                raise ValueError(f"the pruning head's {name} is {list(array.shape)}, not {list(shape)} (the profile's "
                                 "hidden_size and intermediate_size)")  # fmt: skip
            arrays[name] = array
        return cls(arrays["classifier.0.weight"], arrays["classifier.0.bias"], arrays["classifier.3.weight"][0],
                   float(arrays["classifier.3.bias"][0]))  # fmt: skip

    def probabilities(self, states: np.ndarray) -> np.ndarray:
        """Each token's keep probability, [..., hidden] -> [...]."""
        inner = states.astype(np.float32, copy=False) @ self.inner.T + self.inner_bias
        logits = _gelu(inner) @ self.outer + self.outer_bias
        return 0.5 * (1.0 + np.tanh(0.5 * logits))  # the sigmoid, without exp's overflow


def _gelu(x: np.ndarray) -> np.ndarray:
    """torch's exact GELU, x·Φ(x), with erf by Abramowitz and Stegun's 7.1.26 (absolute error under 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return 0.5 * x * (1.0 + erf)


@attrs.define
class _Span:
    start: int
    end: int
    label: str
    probabilities: list[float]


class ContextPrunerAdapter(CrossEncoderAdapter):
    """`stablebridge_pruner`: score as a cross-encoder, extract the passage's kept and pruned spans."""

    kind: ClassVar[str | None] = CONTEXT_PRUNER
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        if context.head_file is None or context.tokenizer_path is None:
            raise ValueError("a context pruner needs its pruning head (loadtime pruning_head_path) and tokenizer.json")
        self._states = first_output(self.session, rank=3, preferred=("last_hidden_state",))
        options = context.profile.loadtime_options
        self._head = PruningHead.read(context.head_file, int(options.get("hidden_size", 1024)),
                                      int(options.get("intermediate_size", 512)))  # fmt: skip
        self._passage_tokenizer = tokenizers.Tokenizer.from_file(str(context.tokenizer_path))
        self._special_ids = _special_ids(self._passage_tokenizer, context.tokenizer_config_json)
        separator = _token_id(self._passage_tokenizer, context.tokenizer_config_json.get("sep_token"))
        self._separator = separator if separator is not None else DEFAULT_SEPARATOR_ID

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results: list[ItemResult] = []
        pairs: list[tuple[str, str]] = []
        rows: list[int] = []
        for index, item in enumerate(items):
            refused = self.refused_options(item.options, OP_EXTRACT)
            text = item_text(item.item)
            if refused is None and has_images(item.item):
                refused = invalid(IMAGES_NOT_SERVED)
            if refused is None and text is None:
                refused = invalid("Item has no text; a context pruner reads a text passage")
            results.append(refused or ItemResult())
            if refused is None:
                pairs.append((item.instruction or "", text))
                rows.append(index)
        if pairs:
            with watch.stage("tokenization"):
                tokens, batch = self.pair_batch(pairs)
            with watch.stage("inference"):
                states, logits = self.run_session(bert_feeds(batch), [self._states, self._logits])
            with watch.stage("postprocessing"):
                rerank = 0.5 * (1.0 + np.tanh(0.5 * logits.astype(np.float32)[:, -1]))
                keep = self._head.probabilities(states) * batch.attention_mask
                for row, index in enumerate(rows):
                    options = self.options_for(items[index].options)
                    passage = pairs[row][1]
                    spans = self._spans(batch.input_ids[row], keep[row], batch.attention_mask[row], passage, options)
                    entities = [_summary(float(rerank[row]), spans)] + [
                        {"text": passage[s.start : s.end], "label": s.label, "score": float(np.mean(s.probabilities)),
                         "start": s.start, "end": s.end, "bbox": None}
                        for s in spans
                    ]  # fmt: skip
                    results[index] = ItemResult(entity_result(entities), input_tokens=len(tokens[row]))
        return watch.finish(results)

    def _spans(
        self, ids: np.ndarray, keep: np.ndarray, mask: np.ndarray, passage: str, options: Mapping[str, Any]
    ) -> list[_Span]:
        """The passage's runs of one label, as the public adapter joins them."""
        prune = float(options.get("prune_threshold", DEFAULT_PRUNE_THRESHOLD))
        highlight = float(options.get("highlight_threshold", DEFAULT_HIGHLIGHT_THRESHOLD))
        separators = np.flatnonzero(ids == self._separator)
        start = int(separators[1]) + 1 if len(separators) >= 2 else max(1, len(ids) // 10)
        offsets = self._passage_tokenizer.encode(passage, add_special_tokens=False).offsets
        spans: list[_Span] = []
        for j, (token, probability, real) in enumerate(zip(ids[start:], keep[start:], mask[start:], strict=True)):
            if not real or int(token) in self._special_ids or j >= len(offsets):
                continue
            first, last = offsets[j]
            if first == last == 0:
                continue
            value = float(probability)
            label = "highlight" if value >= highlight else "kept" if value >= prune else "pruned"
            current = spans[-1] if spans else None
            if current is not None and first <= current.end + 1 and current.label == label:
                current.end = max(current.end, last)
                current.probabilities.append(value)
            else:
                spans.append(_Span(first, last, label, [value]))
        return spans


def _summary(rerank: float, spans: Sequence[_Span]) -> dict[str, Any]:
    kept = sum(span.label != "pruned" for span in spans)
    compression = 1.0 - kept / max(len(spans), 1)
    return {"text": f"rerank={rerank:.4f} compression={compression:.2%} kept={kept}/{len(spans)}",
            "label": "summary", "score": rerank, "start": None, "end": None, "bbox": None}  # fmt: skip


def _token_id(tokenizer: tokenizers.Tokenizer, token: Any) -> int | None:
    """The id of a tokenizer_config.json special token (a string, or an AddedToken's `content`)."""
    if isinstance(token, Mapping):
        token = token.get("content")
    return tokenizer.token_to_id(token) if isinstance(token, str) and token else None


def _special_ids(tokenizer: tokenizers.Tokenizer, config: Mapping[str, Any]) -> frozenset[int]:
    ids = (_token_id(tokenizer, config.get(key)) for key in SPECIAL_TOKEN_KEYS)
    return frozenset(token_id for token_id in ids if token_id is not None)
