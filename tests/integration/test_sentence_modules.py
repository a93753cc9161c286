"""sentence-transformers models served as sentence-transformers itself encodes them (and a CrossEncoder scores
them): a tiny random model saved by `SentenceTransformer.save` (its `modules.json`, Pooling config, Dense weights,
Normalize), loaded by our model loader (safetensors converted to ONNX) and encoded by the dense adapter, compared with
`SentenceTransformer.encode` on the same texts (≤ 1e-4). What cannot be applied, or a width the YAML does not declare,
fails the load with a message that names it — never a vector of another meaning or width. torch and
sentence-transformers are imported by the tests that use them, not at collection (every pytest-xdist worker collects
every module)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.errors import ModelLoadError
from support.encoder_checkpoints import save_checkpoint
from support.worker_items import encode_items

TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11", "w12 w13"]


def save_stack(directory: Path, model_type: str, pooling: str, dense: list[tuple[int, str]]) -> None:
    """Transformer + Pooling (+ Dense layers, each `(out_features, torch.nn activation name)`) + Normalize, saved by
    sentence-transformers."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    save_checkpoint(directory / "base", model_type, "none")
    torch.manual_seed(1)
    stack = [models.Transformer(str(directory / "base")), models.Pooling(32, pooling_mode=pooling)]
    width = 32
    for out_features, activation in dense:
        stack.append(models.Dense(width, out_features, activation_function=getattr(torch.nn, activation)()))
        width = out_features
    stack.append(models.Normalize())
    SentenceTransformer(modules=stack, device="cpu").save(str(directory / "st"))


def model_yaml(directory: Path, dim: int) -> dict:
    return {
        "sie_id": "acme/st-stack",
        "weights_path": str(directory),
        "max_sequence_length": 32,
        "tasks": {"encode": {"dense": {"dim": dim}}},
        "profiles": {"default": {"adapter_path": "sie.adapters.dense:X", "max_batch_tokens": 256}},
    }


@pytest.mark.parametrize(
    ("model_type", "pooling", "dense"),
    [
        pytest.param("bert", "mean", [(16, "Tanh")], id="bert-mean-dense-tanh"),
        pytest.param("roberta", "cls", [(24, "Identity"), (8, "ReLU")], id="roberta-cls-2-dense"),
        pytest.param("bert", "lasttoken", [], id="bert-last-no-dense"),
    ],
)
def test_a_saved_sentence_transformer_encodes_as_sentence_transformers_does(
    model_loader, tmp_path: Path, model_type: str, pooling: str, dense: list
) -> None:
    from sentence_transformers import SentenceTransformer

    save_stack(tmp_path, model_type, pooling, dense)
    reference = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_numpy=True)
    width = dense[-1][0] if dense else 32
    model = parse_model_config(model_yaml(tmp_path / "st", width))
    loaded = model_loader.load(model, "default", model.sie_id)
    results = loaded.adapter.encode(encode_items(TEXTS)).items
    ours = np.stack([np.asarray(result.result["dense"]["values"]) for result in results])
    assert ours.shape == reference.shape == (len(TEXTS), width)
    assert float(np.abs(ours - reference).max()) <= 1e-4


@pytest.fixture(scope="module")
def dense_stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT + mean + Dense(16, tanh) + Normalize stack, saved once; each test changes a copy."""
    directory = tmp_path_factory.mktemp("stack")
    save_stack(directory, "bert", "mean", [(16, "Tanh")])
    return directory


@pytest.fixture
def stack_copy(dense_stack: Path, tmp_path: Path) -> Path:
    shutil.copytree(dense_stack, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_a_profiles_dense_projection_path_picks_the_dense_layer(model_loader, stack_copy: Path) -> None:
    """stella's layout: Dense directories of several widths beside the one modules.json names; the profile's
    `dense_projection_path` (stella_en_1.5B_v5's YAML) picks one, and the vectors are what sentence-transformers
    gives with that directory in its modules.json. A stack without exactly one Dense module refuses it."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    tmp_path = stack_copy
    torch.manual_seed(7)
    (tmp_path / "st" / "2_Dense_8").mkdir()
    models.Dense(32, 8, activation_function=torch.nn.Identity()).save(str(tmp_path / "st" / "2_Dense_8"))
    yaml = model_yaml(tmp_path / "st", 8)
    yaml["profiles"]["default"]["adapter_options"] = {"loadtime": {"dense_projection_path": "2_Dense_8"}}
    model = parse_model_config(yaml)
    loaded = model_loader.load(model, "default", model.sie_id)
    ours = np.stack(
        [np.asarray(item.result["dense"]["values"]) for item in loaded.adapter.encode(encode_items(TEXTS)).items]
    )
    modules_file = tmp_path / "st" / "modules.json"
    modules = json.loads(modules_file.read_text())
    (dense,) = [module for module in modules if module["type"].endswith("Dense")]
    dense["path"] = "2_Dense_8"
    modules_file.write_text(json.dumps(modules))
    reference = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert ours.shape == reference.shape == (len(TEXTS), 8)
    assert float(np.abs(ours - reference).max()) <= 1e-4
    modules_file.write_text(json.dumps([module for module in modules if not module["type"].endswith("Dense")]))
    with pytest.raises(ModelLoadError, match=r"dense_projection_path '2_Dense_8' replaces one Dense module; the stack"):
        model_loader.load(parse_model_config(yaml), "default", model.sie_id)


def test_a_width_the_yaml_does_not_declare_fails_the_load_naming_both(model_loader, stack_copy: Path) -> None:
    tmp_path = stack_copy
    model = parse_model_config(model_yaml(tmp_path / "st", 32))  # the Dense layer makes it 16
    with pytest.raises(ModelLoadError, match=r"16-dimensional dense vectors, but the model's YAML declares dim 32"):
        model_loader.load(model, "default", model.sie_id)


def test_a_module_sie_cannot_apply_fails_the_load_naming_it(model_loader, stack_copy: Path) -> None:
    tmp_path = stack_copy
    modules_file = tmp_path / "st" / "modules.json"
    modules = json.loads(modules_file.read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
    modules_file.write_text(json.dumps(modules))
    model = parse_model_config(model_yaml(tmp_path / "st", 16))
    with pytest.raises(ModelLoadError, match=r"module 'sentence_transformers.models.LayerNorm' is not one SIE applies"):
        model_loader.load(model, "default", model.sie_id)


def test_dense_weights_only_in_a_pickle_fail_the_load_naming_the_files(model_loader, stack_copy: Path) -> None:
    tmp_path = stack_copy
    dense_dir = tmp_path / "st" / "2_Dense"
    (dense_dir / "model.safetensors").rename(dense_dir / "pytorch_model.bin")
    model = parse_model_config(model_yaml(tmp_path / "st", 16))
    with pytest.raises(ModelLoadError, match=r"no model.safetensors for the Dense layer \(found \['config.json', "):
        model_loader.load(model, "default", model.sie_id)


@pytest.mark.parametrize("activation", ["relu", "log1p_relu"])
@pytest.mark.parametrize("strategy", ["max", "sum"])
def test_a_sparse_encoder_is_served_by_the_sparse_adapter_as_sentence_transformers_encodes_it(
    model_loader, tmp_path: Path, strategy: str, activation: str
) -> None:
    """The public catalogue's `sentence_transformer:SentenceTransformerSparseAdapter` (MLMTransformer + SpladePooling,
    as prithivida/Splade_PP_en_v2 is saved) routes to the sparse adapter: its weights equal `SparseEncoder.encode`'s,
    except on the special tokens' own vocabulary entries, which SIE's sparse output leaves out by design. Pooling by
    max or by sum, with either activation."""
    from sentence_transformers.sparse_encoder import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    save_checkpoint(tmp_path / "base", "bert", "mlm-splade")
    stack = [MLMTransformer(str(tmp_path / "base")), SpladePooling(strategy, activation_function=activation)]
    SparseEncoder(modules=stack, device="cpu").save(str(tmp_path / "sparse"))
    reference = SparseEncoder(str(tmp_path / "sparse"), device="cpu").encode(TEXTS, convert_to_tensor=True)
    reference = reference.to_dense().numpy()
    model = parse_model_config(
        {
            "sie_id": "acme/sparse-stack",
            "weights_path": str(tmp_path / "sparse"),
            "max_sequence_length": 32,
            "tasks": {"encode": {"sparse": {"dim": reference.shape[1]}}},
            "profiles": {"default": {"adapter_path": "sie_server.adapters.sentence_transformer:"
                                     "SentenceTransformerSparseAdapter", "max_batch_tokens": 256}},
        }
    )  # fmt: skip
    loaded = model_loader.load(model, "default", model.sie_id)
    results = loaded.adapter.encode(encode_items(TEXTS)).items
    reference[:, sorted(loaded.tokenizer.special_ids)] = 0.0
    for row, result in enumerate(results):
        sparse = result.result["sparse"]
        ours = np.zeros(reference.shape[1], dtype=np.float32)
        ours[np.asarray(sparse["indices"])] = np.asarray(sparse["values"], dtype=np.float32)
        assert np.count_nonzero(ours) > 10
        assert float(np.abs(ours - reference[row]).max()) <= 1e-4, row


def test_a_sparse_encoder_pooling_another_way_fails_the_load_naming_it(model_loader, tmp_path: Path) -> None:
    from sentence_transformers.sparse_encoder import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    save_checkpoint(tmp_path / "base", "bert", "mlm-splade")
    stack = [MLMTransformer(str(tmp_path / "base")), SpladePooling("sum")]
    SparseEncoder(modules=stack, device="cpu").save(str(tmp_path / "sparse"))
    (pooling_config,) = (tmp_path / "sparse").glob("*SpladePooling/config.json")
    pooling_config.write_text(json.dumps({**json.loads(pooling_config.read_text()), "pooling_strategy": "mean"}))
    model = parse_model_config(
        {
            "sie_id": "acme/sparse-mean",
            "weights_path": str(tmp_path / "sparse"),
            "max_sequence_length": 32,
            "tasks": {"encode": {"sparse": {"dim": 99}}},
            "profiles": {"default": {"adapter_path": "sie.adapters.sparse:X", "max_batch_tokens": 256}},
        }
    )
    with pytest.raises(ModelLoadError, match=r"pooling_strategy 'mean' is not built \(max or sum\)"):
        model_loader.load(model, "default", model.sie_id)


PAIRS = [("w1 w2", "w3 w4 w5"), ("w1 w2", "w6"), ("w1 w2", "w7 w8 w9 w10")]


@pytest.mark.parametrize(
    ("labels", "activation"),
    [pytest.param(1, "Identity", id="one-label-identity"), pytest.param(1, None, id="one-label-default-sigmoid"),
     pytest.param(3, "Tanh", id="three-labels-tanh")],
)  # fmt: skip
def test_a_saved_cross_encoder_scores_as_sentence_transformers_predicts(
    model_loader, tmp_path: Path, labels: int, activation: str | None
) -> None:
    """The activation the cross-encoder was saved with (or sentence-transformers' default) gives the score; with more
    labels, the last label's activated value."""
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    save_checkpoint(tmp_path / "base", "bert", "seq-cls", num_labels=labels)
    function = getattr(torch.nn, activation)() if activation else None
    CrossEncoder(str(tmp_path / "base"), activation_fn=function, device="cpu").save(str(tmp_path / "ce"))
    reference = CrossEncoder(str(tmp_path / "ce"), device="cpu").predict(PAIRS, convert_to_numpy=True)
    reference = reference.reshape(len(PAIRS), -1)[:, -1]
    model = parse_model_config(
        {
            "sie_id": "acme/ce",
            "weights_path": str(tmp_path / "ce"),
            "max_sequence_length": 32,
            "tasks": {"score": {}},
            "profiles": {"default": {"adapter_path": "sie.adapters.cross_encoder:X", "max_batch_tokens": 256}},
        }
    )
    loaded = model_loader.load(model, "default", model.sie_id)
    docs = [{"text": doc} for _, doc in PAIRS]
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": PAIRS[0][0]}, score_items=docs)  # fmt: skip
    (result,) = loaded.adapter.score([item]).items
    ours = {row["item_id"]: row["score"] for row in result.result}
    assert [ours[f"item-{index}"] for index in range(len(PAIRS))] == pytest.approx(list(reference), abs=1e-4)


def test_a_cross_encoder_activation_sie_does_not_apply_fails_the_load_naming_it(model_loader, tmp_path: Path) -> None:
    save_checkpoint(tmp_path, "bert", "seq-cls", num_labels=1)
    config = json.loads((tmp_path / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": "acme.layers.Swish"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = parse_model_config(
        {
            "sie_id": "acme/ce",
            "weights_path": str(tmp_path),
            "max_sequence_length": 32,
            "tasks": {"score": {}},
            "profiles": {"default": {"adapter_path": "sie.adapters.cross_encoder:X", "max_batch_tokens": 256}},
        }
    )
    with pytest.raises(ModelLoadError, match=r"activation 'acme.layers.Swish' is not one SIE applies"):
        model_loader.load(model, "default", model.sie_id)
