"""The public Qwen3-VL-Embedding and Qwen3-VL-Reranker recipes for text, run with transformers on a Qwen3-VL model:
the conversation each writes (content as text parts), rendered by the checkpoint's chat template through
transformers' tokenizer, then the last token's state (normalised) or sigmoid(yes − no) of the last position's logits.
Shared by the integration tests (in-process adapters) and the HTTP tests. torch and transformers (the test extra) are
imported when a recipe runs, not when this module is imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# a Qwen-VL-like chat template: a turn's content is a string or a list of text parts, joined as they are
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }} {% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
)
RERANK_INSTRUCTION = "Retrieve relevant documents for the query."  # the public YAML's default_instruction
JUDGE = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the "
    'answer can only be "yes" or "no".'
)


def reference_tokenizer(directory: Path) -> Any:
    """transformers' tokenizer over the checkpoint's tokenizer.json, with the VL chat template."""
    import transformers

    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                                chat_template=VL_CHAT_TEMPLATE)  # fmt: skip


def _prompt_ids(tokenizer: Any, conversation: list[dict[str, Any]]) -> list[int]:
    prompt = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return tokenizer(prompt)["input_ids"]


def embedding(model: Any, tokenizer: Any, text: str, instruction: str) -> np.ndarray:
    """Qwen3-VL-Embedding: the instruction as the system turn, the text as the user turn; the last token's state,
    normalised."""
    import torch

    conversation = [{"role": "system", "content": [{"type": "text", "text": instruction}]},
                    {"role": "user", "content": [{"type": "text", "text": text}]}]  # fmt: skip
    with torch.no_grad():
        ids = torch.tensor([_prompt_ids(tokenizer, conversation)])
        hidden = model.model(input_ids=ids).last_hidden_state[0, -1]
    return (hidden / hidden.norm()).numpy()


def rerank_score(model: Any, tokenizer: Any, query: str, document: str, instruction: str = RERANK_INSTRUCTION) -> float:
    """Qwen3-VL-Reranker: the judge as the system turn, the instruction, query and document as text parts of the user
    turn; sigmoid(yes − no) at the last position."""
    import torch

    parts = [f"<Instruct>: {instruction}", "<Query>:", query, "\n<Document>:", document]
    conversation = [{"role": "system", "content": [{"type": "text", "text": JUDGE}]},
                    {"role": "user", "content": [{"type": "text", "text": part} for part in parts]}]  # fmt: skip
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([_prompt_ids(tokenizer, conversation)])).logits[0, -1]
    return torch.sigmoid(logits[yes] - logits[no]).item()


def save_qwen3_vl(directory: Path, seed: int = 5) -> Any:
    """A tiny random Qwen3-VL (its language model a Qwen3, a one-layer vision tower) saved with the test tokenizer and
    the VL chat template in tokenizer_config.json; returns the model (the reference)."""
    import json

    import torch
    import transformers

    from support.decoder_checkpoints import perturb, qwen3_vl_config, write_tokenizer

    torch.manual_seed(seed)
    model = transformers.Qwen3VLForConditionalGeneration(qwen3_vl_config()).eval()
    perturb(model)
    model.save_pretrained(directory)
    write_tokenizer(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": VL_CHAT_TEMPLATE}))
    return model
