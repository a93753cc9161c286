"""Multi-vector embeddings (ColBERT): one L2-normalised vector per returned token, projected to the model's token
width; scoring is MaxSim. Markers, query expansion, token limits and the skiplist follow ColBERT's conventions
(`sie.worker.late_interaction`), set by the profile's options (`query_prefix`, `doc_prefix`, `query_expansion`,
`query_max_length`, `doc_max_length`, `max_seq_length`, `skip_special_tokens`, `doc_punctuation_skiplist`,
`normalize`). With the `muvera: {}` option an item may also ask for `dense`: the MUVERA encoding of its token vectors
(`sie.worker.muvera`, settings from the load-time `muvera_config`). On a GPU the token states stay on the device and
the projection runs there (`device_pooling`): the host gets the projected vectors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

import numpy as np

from sie.catalog.adapters import MULTIVECTOR
from sie.catalog.options import muvera_on
from sie.tokenization import PaddedBatch, TokenizedText
from sie.worker.adapters.base import AdapterContext
from sie.worker.adapters.encoder import EncodeSpec, TextEncoderAdapter, check_width, first_output, output_width
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.device_pooling import DeviceTokenStates, device_pooling_for, head_rows
from sie.worker.late_interaction import LateInteraction, checkpoint_recipe, read_projection
from sie.worker.muvera import Muvera, MuveraConfig
from sie.worker.outputs import l2_normalize, quantize

# Public modules whose adapter expands queries when the YAML does not say (its generic ColBERT adapter: ColBERT v2
# checkpoints were trained with query augmentation); the others, ours included, do not.
EXPANDING_MODULES: Final = frozenset({"sie_server.adapters.colbert"})
# Load-time options that requests may also set per call: the load-time value is the default.
PER_REQUEST: Final = ("query_max_length", "max_seq_length", "normalize")
# The projection's name where it runs on the device (`device_pooling`).
PROJECTION: Final = "projection"


class MultivectorAdapter(TextEncoderAdapter):
    """`sie.adapters.multivector`: token vectors per text; score is MaxSim (sum over query tokens of the best match)."""

    kind: ClassVar[str | None] = MULTIVECTOR
    encode_outputs: ClassVar[tuple[str, ...]] = ("multivector",)

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        # a TopK-Embed checkpoint's own recipe, under the profile's options
        loadtime = {**checkpoint_recipe(context.model_config_json, context.model_dir),
                    **context.profile.loadtime_options}  # fmt: skip
        self.runtime_options = {key: loadtime[key] for key in PER_REQUEST if key in loadtime} | self.runtime_options
        self._doc_max_length = _doc_max_length(loadtime)
        self._token_states = first_output(self.session, rank=3, preferred=("last_hidden_state", "token_embeddings"))
        projection = read_projection(context.model_dir, context.model_config_json.get("output_dim"))
        hidden = output_width(self.session, self._token_states)
        if projection and hidden is not None and projection[0].in_features != hidden:
            raise ValueError(
                f"the ColBERT projection takes {projection[0].in_features} inputs; the graph gives {hidden}"
            )
        self._late = LateInteraction(
            self.tokenizer,
            {**loadtime, **self.runtime_options},
            projection,
            expands_queries=self.profile.adapter_module in EXPANDING_MODULES,
        )
        # A ColBERT checkpoint served without its projection gives hidden-size token vectors: refused, not served.
        width = None if hidden is None else self._late.width(hidden)
        check_width(self.model, "multivector", width, "the model gives")
        self._muvera_config = MuveraConfig.read(loadtime.get("muvera_config"))
        token_width = width or self.model.tasks.encode.get("multivector")
        # Checked here when the token width is known, else at the first use; its random structures are drawn then.
        self._muvera = Muvera(int(token_width), self._muvera_config) if token_width else None
        # On a GPU the projection runs beside the model; without one, the states are the vectors (`session.run`).
        projection = {PROJECTION: self._late.projection}
        self._device = (
            device_pooling_for(self.session, self._token_states, context.device_graphs, projection)
            if self._late.projection
            else None
        )

    def supported_outputs(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        return ("multivector", "dense") if muvera_on(options.get("muvera")) else self.encode_outputs

    def token_limit(self, is_query: bool, options: Mapping[str, Any]) -> int:
        limit = options.get("query_max_length") if is_query else None
        if limit:
            return min(int(limit), self.tokenizer.max_length)
        limit = super().token_limit(is_query, options)
        return limit if is_query or self._doc_max_length is None else min(limit, self._doc_max_length)

    def marked_text(self, text: str, is_query: bool) -> str:
        return self._late.marked_text(text, is_query)

    def fit(self, tokenized: TokenizedText, is_query: bool, options: Mapping[str, Any]) -> TokenizedText:
        return self._late.fit(tokenized, is_query, self.token_limit(is_query, options))

    def pad(self, tokens: Sequence[TokenizedText], roles: Sequence[tuple[bool, Mapping[str, Any]]]) -> PaddedBatch:
        expand_to = [
            self.token_limit(is_query, options) if is_query and self._late.expands_queries else 0
            for is_query, options in roles
        ]
        return self._late.pad(tokens, expand_to)

    def forward(self, batch: PaddedBatch) -> list[np.ndarray | DeviceTokenStates]:
        """The batch's token states: a host array, or (on a GPU, for a model with a projection) left on the device,
        where the projection runs."""
        return [self.run_token_states(bert_feeds(batch), self._token_states, self._device)]

    def _token_vectors(
        self, states: np.ndarray | DeviceTokenStates, batch: PaddedBatch, row: int, is_query: bool, normalize: bool
    ) -> np.ndarray:
        kept = self._late.kept(batch, row, is_query)
        vectors = head_rows(states, PROJECTION, self._late.projection, row, kept)
        return l2_normalize(vectors) if normalize else vectors

    def represent(self, outputs: list, batch: PaddedBatch, specs: list[EncodeSpec]) -> list[dict]:
        results = []
        for row, spec in enumerate(specs):
            vectors = self._token_vectors(outputs[0], batch, row, spec.is_query, spec.options.get("normalize", True))
            result = {}
            if "multivector" in spec.output_types:
                result["multivector"] = {
                    "token_dims": int(vectors.shape[1]),
                    "num_tokens": int(vectors.shape[0]),
                    "dtype": spec.output_dtype,
                    "values": quantize(vectors, spec.output_dtype),
                }
            if "dense" in spec.output_types:  # MUVERA's encoding (supported_outputs allowed it)
                if self._muvera is None:
                    self._muvera = Muvera(int(vectors.shape[1]), self._muvera_config)
                encoding = self._muvera.encode(vectors, spec.is_query)
                result["dense"] = {"dims": self._muvera.dim, "dtype": spec.output_dtype,
                                   "values": quantize(encoding, spec.output_dtype)}  # fmt: skip
            results.append(result)
        return results

    def similarities(self, outputs: list, batch: PaddedBatch, query: int, docs: range) -> np.ndarray:
        query_vectors = self._token_vectors(outputs[0], batch, query, True, True)
        scores = []
        for row in docs:
            doc_vectors = self._token_vectors(outputs[0], batch, row, False, True)
            best = (query_vectors @ doc_vectors.T).max(axis=1) if doc_vectors.size else np.zeros(len(query_vectors))
            scores.append(float(best.sum()))
        return np.asarray(scores, dtype=np.float32)


def _doc_max_length(loadtime: Mapping[str, Any]) -> int | None:
    """The documents' own token limit (PyLate's `document_length`: mxbai-colbert-large-v1 keeps 256 of its 512
    tokens), None when the profile sets none; ValueError for anything but a positive whole number."""
    limit = loadtime.get("doc_max_length")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"doc_max_length must be a whole number of tokens (at least 1), got {limit!r}")
    return limit
