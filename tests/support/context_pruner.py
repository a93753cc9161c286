"""A tiny context pruner (the public stablebridge recipe): a random XLM-RoBERTa cross-encoder with one label and its
tokenizer, a pruning head saved by torch.save as a training checkpoint, and the public adapter's recipe run with
transformers and torch on them (`Reference`). torch and transformers (the test extra) are imported when a model is
built, not when this module is imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
from tokenizers import Tokenizer, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from support.encoder_checkpoints import WORDS, random_model

HIDDEN, INTERMEDIATE = 32, 16  # the tiny encoder's width; the pruning head's inner width


def write_xlm_roberta_tokenizer(directory: Path) -> None:
    """A word-level tokenizer with XLM-RoBERTa's specials and its pair template, `<s> A </s></s> B </s>`."""
    import transformers

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = {token: index for index, token in enumerate([*specials, *WORDS])}
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(directory / "tokenizer.json"))
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), pad_token="<pad>", unk_token="<unk>", cls_token="<s>",
        sep_token="</s>", bos_token="<s>", eos_token="</s>", model_input_names=["input_ids", "attention_mask"],
    ).save_pretrained(directory)  # fmt: skip


@attrs.frozen
class Reference:
    """The public adapter's recipe: transformers' cross-encoder and tokenizer, the torch pruning head."""

    model: Any
    head: Any
    tokenizer: Any

    def tokenized(self, pairs: list[tuple[str, str]]) -> Any:
        return self.tokenizer([p[0] for p in pairs], [p[1] for p in pairs], padding=True, truncation=True,
                              max_length=8192, return_tensors="pt")  # fmt: skip

    def scores(self, query: str, documents: list[str]) -> list[float]:
        import torch

        with torch.no_grad():
            logits = self.model(**self.tokenized([(query, document) for document in documents])).logits
        return torch.sigmoid(logits.squeeze(-1)).tolist()

    def entities(self, query: str, passage: str, prune: float, highlight: float) -> list[dict[str, Any]]:
        """The public adapter's extract of one passage, transcribed: the pair's hidden states through the head, the
        passage's tokens from after the second </s>, offsets of the passage tokenized alone, runs of one label."""
        import torch

        inputs = self.tokenized([(query, passage)])
        with torch.no_grad():
            outputs = self.model(**inputs, output_hidden_states=True)
            rerank = torch.sigmoid(outputs.logits.squeeze(-1))[0].item()
            probabilities = torch.sigmoid(self.head(outputs.hidden_states[-1]).squeeze(-1))[0]
        ids = inputs["input_ids"][0].tolist()
        start = [index for index, token in enumerate(ids) if token == self.tokenizer.sep_token_id][1] + 1
        offsets = self.tokenizer(passage, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
        special = {self.tokenizer.pad_token_id, self.tokenizer.sep_token_id, self.tokenizer.cls_token_id,
                   self.tokenizer.bos_token_id}  # fmt: skip
        spans: list[list[Any]] = []  # [start, end, label, probabilities]
        for j, (token, probability) in enumerate(zip(ids[start:], probabilities[start:].tolist(), strict=True)):
            if token in special or j >= len(offsets):
                continue
            first, last = offsets[j]
            label = "highlight" if probability >= highlight else "kept" if probability >= prune else "pruned"
            if spans and first <= spans[-1][1] + 1 and spans[-1][2] == label:
                spans[-1][1] = max(spans[-1][1], last)
                spans[-1][3].append(probability)
            else:
                spans.append([first, last, label, [probability]])
        kept = sum(span[2] != "pruned" for span in spans)
        summary = {"label": "summary", "score": rerank, "start": None, "end": None,
                   "text": f"rerank={rerank:.4f} compression={1 - kept / max(len(spans), 1):.2%} "
                           f"kept={kept}/{len(spans)}"}  # fmt: skip
        return [summary] + [{"text": passage[s:e], "label": label, "score": float(np.mean(p)), "start": s, "end": e}
                            for s, e, label, p in spans]  # fmt: skip


def save_pruner(root: Path) -> Reference:
    """The cross-encoder (one label) and its tokenizer under `root/model`, the head as a training checkpoint
    (`{"pruning_head": state_dict, "epoch": …}`) at `root/head/best.pt`."""
    import torch
    import transformers

    model = random_model("xlm-roberta", "seq-cls", num_labels=1)
    model.save_pretrained(root / "model")
    write_xlm_roberta_tokenizer(root / "model")

    class PruningHead(torch.nn.Module):  # the public adapter's module, by its layer names
        def __init__(self) -> None:
            super().__init__()
            self.classifier = torch.nn.Sequential(torch.nn.Linear(HIDDEN, INTERMEDIATE), torch.nn.GELU(),
                                                  torch.nn.Dropout(0.2), torch.nn.Linear(INTERMEDIATE, 1))  # fmt: skip

        def forward(self, states: torch.Tensor) -> torch.Tensor:
            return self.classifier(states)

    torch.manual_seed(4)
    head = PruningHead().eval()
    with torch.no_grad():  # probabilities spread over the three labels
        head.classifier[0].weight.mul_(3.0)
        head.classifier[3].weight.mul_(3.0)
        head.classifier[3].bias.fill_(-3.0)
    (root / "head").mkdir()
    torch.save({"pruning_head": head.state_dict(), "epoch": 3, "best_f1": 0.5}, root / "head" / "best.pt")
    tokenizer = transformers.AutoTokenizer.from_pretrained(root / "model")
    return Reference(model, head, tokenizer)
