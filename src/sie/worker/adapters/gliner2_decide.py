"""Typed decisions with a GLiNER2.5-Decide span model (`sie_server.adapters.gliner2.decide`): a request's tasks —
typed questions, label groups or labels (`sie.catalog.decisions`) — are classification schemas read together in
each item's one row, `( [P] task: prompt [DESCRIPTION] label: description … ( [L] label … ) ) [SEP_STRUCT] … [SEP_TEXT]
words`, as gliner2's processor writes them (the rows are built and run as `Gliner2Adapter` builds and runs its own);
every label of every task gets a probability from its `[L]` marker's logit: a softmax over a single-label task's
labels, a sigmoid each for a multi-label task. A task's probabilities therefore depend on the other tasks sent with
it, as they do in the public server. The text is read in one row: the whole words that fit beside the tasks.

Answers, as the public server gives them: a question's in `data[question_id]` — `choice` (the best label, every
label's probability, a confidence of 1 - H(p) / log k), `score` (the expected level Σ i·p(i), its legend, the
probabilities, the confidence), `noul` (p(true), true when above p(false), max(p, 1 - p)); a label group's in
`data[group]` (as a choice, or a multi-label group's labels at or above the threshold — 0.5 where none is set — with
the probabilities) and as `group.label` classifications; plain labels as classifications only. Classifications are
every label at or above the request's `threshold` (0 by default), best first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final

import numpy as np

from sie.catalog.adapters import GLINER2_DECIDE
from sie.catalog.decisions import DecisionRequest, DecisionTask, confidence, read_decisions
from sie.wire import codes
from sie.worker.adapters.base import BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import item_text
from sie.worker.adapters.gliner2 import Gliner2Adapter, Gliner2Request, Settings, model_text, split_words
from sie.worker.adapters.zero_shot import split_requests, zero_shot_refusal

# A multi-label group's labels are those at or above the request's threshold, or this where it sets none.
DEFAULT_MULTI_LABEL_THRESHOLD: Final = 0.5


class Gliner2DecideAdapter(Gliner2Adapter):
    """`sie.adapters.gliner2_decide`: extract only; typed questions, label groups or labels, each item in one row."""

    kind: ClassVar[str | None] = GLINER2_DECIDE

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results, requests = split_requests(items, self._decision_request)
        if requests:
            with watch.stage("tokenization"):
                rows = self._rows(requests, results)
                firsts = {}
                for row in rows:  # the words of the first window: the whole words that fit beside the tasks
                    firsts.setdefault(row.item, row)
                rows = list(firsts.values())
            if rows:
                with watch.stage("inference"):
                    _, _, classes = self._run(rows, 1)
                decisions = {index: request.decision for index, request in requests.items() if request.decision}
                with watch.stage("postprocessing"):
                    for number, row in enumerate(rows):
                        results[row.item] = _answered(decisions[row.item], classes[number], len(row.ids))
        return watch.finish(results)

    def _decision_request(self, item: Any) -> Gliner2Request | ItemResult:
        refused = zero_shot_refusal(self, item)
        if refused is not None:
            return refused
        try:
            decision = read_decisions(item.labels, item.output_schema, item.instruction,
                                      self.options_for(item.options))  # fmt: skip
        except ValueError as exc:
            return invalid(str(exc))
        text = item_text(item.item) or ""
        read = model_text(text)
        # No more words than the row has tokens can be read: the rest is not split into windows only to be dropped.
        words = split_words(read)[: self.tokenizer.max_length]
        labels = [label for task in decision.tasks for label in task.labels]
        return Gliner2Request(text, read, words, labels, decision.tasks[0].key, Settings(), decision=decision)


def probabilities(task: DecisionTask, logits: np.ndarray) -> np.ndarray:
    """A single-label task's softmax over its labels' logits, or a multi-label task's sigmoid of each (float64)."""
    z = np.asarray(logits, dtype=np.float64)
    if task.multi_label:
        return np.exp(-np.logaddexp(0.0, -z))
    shifted = np.exp(z - z.max())
    return shifted / shifted.sum()


def answer(task: DecisionTask, p: np.ndarray, threshold: float) -> dict[str, Any]:
    """One task's answer in `data` (see the module's docstring)."""
    scored = {key: float(value) for key, value in zip(task.keys, p, strict=True)}
    if task.kind == "score":
        return {"type": "score", "score": float(np.dot(np.arange(len(p), dtype=np.float64), p)),
                "legend": {str(index): level for index, level in enumerate(task.legend)}, "probabilities": scored,
                "confidence": confidence(p.tolist())}  # fmt: skip
    if task.kind == "noul":
        true, false = float(p[0]), float(p[1])
        return {"type": "noul", "noul": true, "answer": true > false, "confidence": max(true, 1.0 - true)}
    if task.multi_label:
        bar = threshold if threshold > 0.0 else DEFAULT_MULTI_LABEL_THRESHOLD
        return {"labels": [key for key, value in scored.items() if value >= bar], "probabilities": scored}
    return {"type": "choice", "choice": task.keys[int(np.argmax(p))], "probabilities": scored,
            "confidence": confidence(p.tolist())}  # fmt: skip


def _answered(decision: DecisionRequest, logits: np.ndarray, tokens: int) -> ItemResult:
    """One item's result from its row's class logits [schemas, fields]."""
    per_task = [probabilities(task, logits[index, : len(task.labels)]) for index, task in enumerate(decision.tasks)]
    if not all(np.isfinite(p).all() for p in per_task):
        return invalid("The model's scores for this item are not finite", codes.INFERENCE_ERROR)
    data = {}
    if decision.mode != "labels":
        data = {task.key: answer(task, p, decision.threshold) for task, p in zip(decision.tasks, per_task, strict=True)}
    classifications = []
    if decision.mode != "questions":
        for task, p in zip(decision.tasks, per_task, strict=True):
            for key, value in zip(task.keys, p.tolist(), strict=True):
                if value >= decision.threshold:
                    label = f"{task.key}.{key}" if decision.mode == "groups" else key
                    classifications.append({"label": label, "score": value})
        classifications.sort(key=lambda one: -one["score"])
    result = {"entities": [], "relations": [], "classifications": classifications, "objects": [], "data": data}
    return ItemResult(result, input_tokens=tokens)
