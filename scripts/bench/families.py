"""Each converted encoder family under onnxruntime against transformers (torch) on the same checkpoint, side by side
in one run: a random MiniLM-sized model of the family (6 layers, hidden 384, 12 heads) saved by transformers and
converted by `sie.worker.convert`, both given the same threads, a batch of `--batch` × `--tokens` token ids, medians
of interleaved rounds. Prints milliseconds per batch and the speed-up (torch time / ours); the goal is ≥ 1.3×.

    .venv/bin/python scripts/bench/families.py [--families bert,roberta,...] [--rounds 5] [--threads 2] [--served]

With `--head seq-cls`, the same table for cross-encoders: each family's sequence classifier (one label) against
transformers' `AutoModelForSequenceClassification`; where it reads the first token alone our graph computes the last
layer there only (the test config's ModernBERT pools the mean, so its row computes every token's).

With `--served`, a second table: each family's checkpoint (with a word-level tokenizer) served by one
`sie run --role all` from a local `weights_path` catalogue, 32 wrk connections × one text of `--tokens` tokens, against
the same graph run in-process at batch 32 (tokens already made), interleaved rounds; the goal is ≥ 0.9.

With `--gliner`, a third table: a GLiNER span model (DeBERTa-v3-small-sized backbone, BiLSTM, spans of up to 12
words), a GLiNER2 span model and a GLiClass uni-encoder on the same backbone size, end to end, texts to results, as
the worker's adapters run them (prompt, tokens, graph, decoding) against the `gliner` package's `inference`,
`gliner2`'s `batch_extract_entities` and the `gliclass` pipeline on
the same checkpoints, a batch of `--batch` texts × 8 labels; the goal is ≥ 1.5×. With `--served` too, the GLiNER
served (`sie run --role all`, 32 wrk connections × one text and its 8 labels to `/v1/extract`) against its adapter
in-process at batch 32, interleaved rounds; the goal is ≥ 0.9.

With `--images` (or `--only-images`), image–text towers: a CLIP ViT-B/32-sized and a SigLIP base/16-sized vision tower
(random, 224 pixels) converted by `sie.worker.convert.clip`, `--image-batch` images per call, our vision graph against
transformers' `get_image_features` on the same pixel values (goal ≥ 1.3×), and the preprocessing of one 640×480 JPEG
(`sie.imaging` against transformers' PIL image processor) reported apart. With `--served` too, the CLIP served
(`sie run --role all`, 32 wrk connections × one JPEG each to `/v1/encode`) against the adapter in-process on 32 such
JPEGs (preprocessing included), interleaved rounds; the goal is ≥ 0.85.

Needs the test extra (torch, transformers; gliner for `--gliner`). The operators after onnxruntime's load-time
fusions are printed per family from the optimized graph (the BERT-like graphs carry the fused `Attention`
themselves, the rotary ones `RotaryEmbedding`; MatMul + bias become Gemm and the erf pattern Gelu at load).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import orjson
import torch
import transformers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "scripts" / "bench"))
from served_vs_raw import CONNECTIONS, measured_window, served_vs_raw, timed  # noqa: E402

from sie.catalog import dump_yaml  # noqa: E402
from sie.worker.convert import convert_encoder  # noqa: E402
from support.encoder_checkpoints import FAMILIES, WORDS, family_config, write_tokenizer  # noqa: E402

SIZE = {"hidden_size": 384, "num_attention_heads": 12, "num_hidden_layers": 6, "intermediate_size": 1536,
        "vocab_size": 30522, "max_position_embeddings": 514}  # fmt: skip
FUSED = ("Gemm", "Gelu", "FastGelu", "BiasGelu", "LayerNormalization", "SkipLayerNormalization", "Attention",
         "MultiHeadAttention", "RotaryEmbedding", "MatMul", "Softmax")  # fmt: skip


def sized_config(family: str) -> transformers.PretrainedConfig:
    """The family's test config grown to MiniLM size."""
    config = family_config(family)
    if family == "distilbert":
        config.dim, config.n_heads, config.n_layers, config.hidden_dim = 384, 12, 6, 1536
        config.vocab_size, config.max_position_embeddings = SIZE["vocab_size"], SIZE["max_position_embeddings"]
        return config
    for key, value in SIZE.items():
        setattr(config, key, value)
    if family == "modernbert":
        config.local_attention = 128
        config.layer_types = ["full_attention" if index % 3 == 0 else "sliding_attention" for index in range(6)]
    if family == "electra":
        config.embedding_size = 128
    return config


def fused_ops(path: Path, threads: int) -> str:
    """Operator counts of the graph onnxruntime runs, after its load-time fusions."""
    optimized = path.with_suffix(".optimized.onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    counts = Counter(node.op_type for node in onnx.load(str(optimized), load_external_data=False).graph.node)
    return ", ".join(f"{op} {counts[op]}" for op in FUSED if counts[op])


def served_id(family: str) -> str:
    return f"bench/{family}"


def write_served_yaml(models_dir: Path, family: str, weights: Path, tokens: int) -> None:
    """The family's catalogue entry: our dense adapter over `weights`, batches of up to 32 texts of `tokens`."""
    data = {
        "sie_id": served_id(family),
        "weights_path": str(weights),
        "max_sequence_length": tokens,
        "tasks": {"encode": {"dense": {"dim": SIZE["hidden_size"]}}},
        "profiles": {"default": {"adapter_path": "sie.adapters.dense:OnnxDenseAdapter",
                                 "max_batch_tokens": CONNECTIONS * tokens,
                                 "adapter_options": {"runtime": {"pooling": "mean", "normalize": True}}}},
    }  # fmt: skip
    models_dir.mkdir(exist_ok=True)
    (models_dir / f"bench__{family}.yaml").write_text(dump_yaml(data))


def run_raw(session: ort.InferenceSession, ids: np.ndarray) -> None:
    """The encoder graph on a batch of token ids (all real tokens, one token type)."""
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    session.run(None, {node.name: feeds[node.name] for node in session.get_inputs()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per round and side")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--head", choices=("none", "seq-cls"), default="none",
                        help="the graph timed: hidden states, or a cross-encoder's sequence classifier")  # fmt: skip
    parser.add_argument("--served", action="store_true", help="also the served-vs-raw table (needs wrk)")
    parser.add_argument("--served-seconds", type=int, default=6, help="measured wrk seconds per family and round")
    parser.add_argument("--gliner", action="store_true", help="also GLiNER and GLiClass against their packages")
    parser.add_argument("--only-gliner", action="store_true", help="GLiNER and GLiClass alone")
    parser.add_argument("--images", action="store_true", help="also CLIP and SigLIP image encode")
    parser.add_argument("--only-images", action="store_true", help="CLIP and SigLIP image encode alone")
    parser.add_argument("--image-batch", type=int, default=16)
    args = parser.parse_args(argv)
    if args.served and args.head != "none":
        parser.error("--served measures the dense encoders (--head none)")
    torch.set_num_threads(args.threads)
    if args.gliner or args.only_gliner:
        zero_shot_speed(args)
    if args.images or args.only_images:
        image_speed(args)
    return 0 if args.only_gliner or args.only_images else family_speeds(args)


def family_speeds(args: argparse.Namespace) -> int:
    """The encoder families' table (and with `--served` the served-vs-raw one)."""
    rng = np.random.default_rng(0)
    rows = []
    sessions: dict[str, ort.InferenceSession] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.families.split(","):
            torch.manual_seed(0)
            config = sized_config(family)
            if args.head == "seq-cls":
                config.num_labels = 1
                model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
            else:
                model = transformers.AutoModel.from_config(config).eval()
            directory = Path(scratch) / family
            model.save_pretrained(directory)
            if args.served:
                write_tokenizer(directory, family)
                write_served_yaml(Path(scratch) / "models", family, directory, args.tokens)
            graph = convert_encoder(directory, Path(scratch) / f"{family}.onnx", args.head).path
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
            ids = rng.integers(5, 1000, size=(args.batch, args.tokens)).astype(np.int64)
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
            inputs = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(feeds["attention_mask"])}

            def ours(session=session, feeds=feeds) -> None:  # noqa: ANN001
                session.run(None, feeds)

            def theirs(model=model, inputs=inputs) -> None:  # noqa: ANN001
                with torch.no_grad():
                    model(**inputs)

            ours(), theirs()  # warm up
            ours_ms, theirs_ms = [], []
            for _ in range(args.rounds):
                ours_ms.append(timed(ours, args.repeats))
                theirs_ms.append(timed(theirs, args.repeats))
            ours_median, theirs_median = statistics.median(ours_ms), statistics.median(theirs_ms)
            rows.append((family, theirs_median, ours_median, fused_ops(graph, args.threads)))
            sessions[family] = session
            print(f"{family}: torch {theirs_median:.1f} ms, ours {ours_median:.1f} ms", file=sys.stderr)
        print_speed_table(rows, args)
        if args.served:
            text = " ".join(WORDS[index % len(WORDS)] for index in range(args.tokens - 2))  # + the two specials
            runs = {family: functools.partial(run_raw, session) for family, session in sessions.items()}
            served_vs_raw(Path(scratch), runs, text, len(WORDS), args.tokens, args.rounds, args.served_seconds)
    return 0


# Sentences of about 40 words, each text of the batch a different pair of them.
GLINER_SENTENCES = [
    "Steve Jobs founded Apple in Cupertino California in 1976 with Steve Wozniak and Ronald Wayne, and the company "
    "later moved its headquarters to a ring-shaped campus that opened in 2017 near Interstate 280.",
    "Marie Curie won the Nobel Prize in Physics in 1903 and the Nobel Prize in Chemistry in 1911, the first person to "
    "win twice, after her research on radioactivity at the University of Paris.",
    "Barack Obama was born in Honolulu Hawaii in 1961, studied at Columbia University and Harvard Law School, and "
    "served as the 44th president of the United States from 2009 to 2017.",
]
GLINER_LABELS = ["person", "organization", "location", "date", "award", "university", "city", "country"]
GLINER_BACKBONE = {"hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 3072,
                   "position_buckets": 256, "max_relative_positions": -1}  # fmt: skip


def zero_shot_speed(args: argparse.Namespace) -> None:
    """GLiNER and GLiClass, ours (the adapter through the model loader) against their packages, texts to results."""
    texts = [f"{GLINER_SENTENCES[i % 3]} {GLINER_SENTENCES[(i + 1) % 3]}" for i in range(args.batch)]
    rows = []
    for family in ("gliner", "gliner2", "gliclass"):
        with tempfile.TemporaryDirectory() as scratch:
            ours, theirs = _zero_shot_pair(family, Path(scratch), texts, args)
            ours(), theirs()  # warm up
            ours_ms, theirs_ms = [], []
            for _ in range(args.rounds):
                ours_ms.append(timed(ours, args.repeats))
                theirs_ms.append(timed(theirs, args.repeats))
            if args.served and family in ZERO_SHOT_SERVED:
                zero_shot_served(family, Path(scratch), ours, texts[0], args)
        rows.append((family, statistics.median(theirs_ms), statistics.median(ours_ms)))
    print(f"{args.batch} texts of about 80 words x {len(GLINER_LABELS)} labels, DeBERTa-v3-small-sized backbones, "
          f"{args.threads} threads, medians of {args.rounds} interleaved rounds, texts to results")  # fmt: skip
    print("| model | reference package (torch) ms | ours (onnxruntime) ms | speed-up |")
    print("|---|---|---|---|")
    for family, theirs_median, ours_median in rows:
        shown = ZERO_SHOT_SHAPES[family]
        print(f"| {shown} | {theirs_median:.1f} | {ours_median:.1f} | {theirs_median / ours_median:.2f}x |")


ZERO_SHOT_SHAPES = {
    "gliner": "gliner span (BiLSTM, 12-word spans)",
    "gliner2": "gliner2 span (count_lstm_v2, 8-word spans)",
    "gliclass": "gliclass uni-encoder (first, dot)",
}


def _zero_shot_pair(
    family: str, scratch: Path, texts: list[str], args: argparse.Namespace
) -> tuple[Callable[[], None], Callable[[], None]]:
    """The `family` checkpoint saved in `scratch`, and two calls on `texts`: our adapter's and its package's."""
    from sie.catalog import parse_model_config
    from sie.wire.ipc_batch import ExtractBatchItem
    from sie.worker.artifacts import ArtifactResolver
    from sie.worker.loading import ModelLoader
    from sie.worker.session import SessionOptions
    from support.zero_shot_checkpoints import save_gliclass, save_gliner, save_gliner2

    # the tokenizer reads the texts' words whole (DeBERTa-v3's reads such prose at about 1.3 tokens a word)
    words = sorted(
        {word.strip(",.") for sentence in GLINER_SENTENCES for word in sentence.split()} | set(GLINER_LABELS)
    )
    if family == "gliner":
        model = save_gliner(scratch, size=GLINER_BACKBONE, words=words, hidden_size=512, max_width=12, max_len=384)
        weights, adapter_path = scratch / "gliner", "sie_server.adapters.gliner:GLiNERAdapter"

        def theirs() -> None:
            model.inference(texts, GLINER_LABELS, threshold=0.5, batch_size=args.batch)

    elif family == "gliner2":
        model = save_gliner2(scratch, size=GLINER_BACKBONE, words=words, max_width=8)
        weights, adapter_path = scratch / "gliner2", "sie_server.adapters.gliner2.adapter:GLiNER2Adapter"

        def theirs() -> None:
            model.batch_extract_entities(texts, GLINER_LABELS, threshold=0.5, batch_size=args.batch)

    else:
        from gliclass import ZeroShotClassificationPipeline

        model, tokenizer = save_gliclass(scratch, size=GLINER_BACKBONE, words=words)
        pipeline = ZeroShotClassificationPipeline(model, tokenizer, classification_type="multi-label", device="cpu",
                                                  progress_bar=False)  # fmt: skip
        weights, adapter_path = scratch, "sie_server.adapters.gliclass:GLiClassAdapter"

        def theirs() -> None:
            pipeline(texts, GLINER_LABELS, threshold=0.5, batch_size=args.batch)

    entry = parse_model_config({
        "sie_id": f"bench/{family}", "weights_path": str(weights), "tasks": {"extract": {}},
        "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 65536}},
    })  # fmt: skip
    resolver = ArtifactResolver(scratch / "cache", hf_offline=True)
    loader = ModelLoader(resolver, scratch / "converted", SessionOptions(intra_op_threads=args.threads))
    adapter = loader.load(entry, "default", entry.sie_id).adapter
    options = {"threshold": 0.5} | ({"classification_type": "multi-label"} if family == "gliclass" else {})
    items = [
        ExtractBatchItem(work_item_id=f"b.{i}", request_id="b", item_index=i, total_items=len(texts), timestamp=0.0,
                         item={"text": text}, labels=GLINER_LABELS, options=options)
        for i, text in enumerate(texts)
    ]  # fmt: skip

    def ours() -> None:
        adapter.extract(items)

    return ours, theirs


# The zero-shot models `--served` measures: where `_zero_shot_pair` saved the weights, their adapter, request options.
ZERO_SHOT_SERVED = {
    "gliner": ("gliner", "sie_server.adapters.gliner:GLiNERAdapter", {"threshold": 0.5}),
    "gliclass": (".", "sie_server.adapters.gliclass:GLiClassAdapter",
                 {"threshold": 0.5, "classification_type": "multi-label"}),
}  # fmt: skip


def zero_shot_served(family: str, scratch: Path, raw: Callable[[], None], text: str, args: argparse.Namespace) -> None:
    """The `family` checkpoint in `scratch` served to 32 wrk connections (one text and its labels per request)
    against `raw`, the adapter on a batch of 32 texts in-process; interleaved rounds."""

    from sie.catalog import dump_yaml

    weights, adapter_path, options = ZERO_SHOT_SERVED[family]
    models = scratch / "models"
    models.mkdir(exist_ok=True)
    data = {"sie_id": f"bench/{family}", "weights_path": str((scratch / weights).resolve()), "tasks": {"extract": {}},
            "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 65536}}}  # fmt: skip
    (models / f"bench__{family}.yaml").write_text(dump_yaml(data))
    body = orjson.dumps({"items": [{"text": text}], "params": {"labels": GLINER_LABELS, "options": options}})
    path = f"/v1/extract/bench/{family}"
    raw_rate, served_rate = served_rounds(scratch, models, f"bench/{family}", path, body, raw, args)
    print(f"{family} served (`sie run --role all`, uvicorn, {CONNECTIONS} connections x 1 text + "
          f"{len(GLINER_LABELS)} labels) against the adapter at batch {CONNECTIONS} in-process; medians of "
          f"{args.rounds} interleaved rounds")  # fmt: skip
    print("| model | raw texts/s | served texts/s | served / raw |")
    print("|---|---|---|---|")
    print(f"| {ZERO_SHOT_SHAPES[family]} | {raw_rate:.1f} | {served_rate:.1f} | {served_rate / raw_rate:.2f} |")


# Vision towers of the catalogue's sizes (224 pixels): CLIP ViT-B/32 and SigLIP base/16; small text towers.
IMAGE_TOWERS = {
    "clip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
             "image_size": 224, "patch_size": 32},
    "siglip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
               "image_size": 224, "patch_size": 16},
}  # fmt: skip
SMALL_TEXT = {"hidden_size": 768, "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 12,
              "vocab_size": 1000}  # fmt: skip


def image_speed(args: argparse.Namespace) -> None:
    """CLIP and SigLIP vision towers, ours against transformers on the same pixels; preprocessing apart."""
    import io

    from PIL import Image

    from sie.imaging import ImageLimits, ImageProcessor
    from sie.worker.convert.clip import convert_clip
    from sie.worker.convert.names import IMAGE_EMBEDS, PIXEL_VALUES, vision_graph_path

    rng = np.random.default_rng(0)
    photo = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(photo, format="JPEG", quality=90)
    data = photo.getvalue()
    rows, prep_rows = [], []
    for family in IMAGE_TOWERS:
        with tempfile.TemporaryDirectory() as scratch:
            model, settings, reference = _image_checkpoint(family, Path(scratch))
            graph = Path(scratch) / "text.onnx"
            convert_clip(Path(scratch), graph)
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            session = ort.InferenceSession(str(vision_graph_path(graph)), options, providers=["CPUExecutionProvider"])
            pixels = rng.standard_normal((args.image_batch, 3, 224, 224)).astype(np.float32)
            tensor = torch.from_numpy(pixels)
            processor = ImageProcessor.from_dict(settings)
            their_processor = reference(**{k: v for k, v in settings.items() if k != "image_processor_type"})

            def theirs(model=model, tensor=tensor) -> None:  # noqa: ANN001
                with torch.no_grad():
                    model.get_image_features(pixel_values=tensor)

            medians = _interleaved({
                "ours": lambda session=session, pixels=pixels: session.run([IMAGE_EMBEDS], {PIXEL_VALUES: pixels}),
                "theirs": theirs,
                "our_prep": lambda processor=processor: processor(data, ImageLimits()),
                "their_prep": lambda processor=their_processor: processor(Image.open(io.BytesIO(data)),
                                                                          return_tensors="np"),
            }, args)  # fmt: skip
            rows.append((family, medians["theirs"], medians["ours"]))
            prep_rows.append((family, medians["their_prep"], medians["our_prep"]))
            print(f"{family}: torch {medians['theirs']:.1f} ms, ours {medians['ours']:.1f} ms", file=sys.stderr)
            if args.served and family == "clip":
                image_served(Path(scratch), processor, session, data, settings, args)
    print(f"{args.image_batch} images of 224x224 per call, {args.threads} threads, medians of {args.rounds} "
          "interleaved rounds, pixels to vectors")  # fmt: skip
    print("| vision tower | transformers (torch) ms | ours (onnxruntime) ms | speed-up |")
    print("|---|---|---|---|")
    for family, theirs_ms, ours_ms in rows:
        print(f"| {IMAGE_SHAPES[family]} | {theirs_ms:.1f} | {ours_ms:.1f} | {theirs_ms / ours_ms:.2f}x |")
    print("Preprocessing one 640x480 JPEG (decode, resize, crop, normalise), ms per image")
    print("| processor | transformers PIL processor ms | ours (sie.imaging) ms |")
    print("|---|---|---|")
    for family, theirs_ms, ours_ms in prep_rows:
        print(f"| {family} | {theirs_ms:.2f} | {ours_ms:.2f} |")


def _image_checkpoint(family: str, scratch: Path) -> tuple[Any, dict, Any]:
    """A random `family` model of IMAGE_TOWERS' size saved in `scratch`, its processor settings at 224 pixels and
    transformers' PIL processor class."""
    from support.image_text_checkpoints import CLIP_PROCESSOR, SIGLIP_PROCESSOR

    torch.manual_seed(0)
    tower = IMAGE_TOWERS[family]
    if family == "clip":
        config = transformers.CLIPConfig(text_config=SMALL_TEXT | {"max_position_embeddings": 77},
                                         vision_config=tower, projection_dim=512)  # fmt: skip
        model = transformers.CLIPModel(config).eval()
        settings = CLIP_PROCESSOR | {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}}
        reference = transformers.CLIPImageProcessorPil
    else:
        config = transformers.SiglipConfig(text_config=SMALL_TEXT | {"max_position_embeddings": 64},
                                           vision_config=tower)  # fmt: skip
        model = transformers.SiglipModel(config).eval()
        settings = SIGLIP_PROCESSOR | {"size": {"height": 224, "width": 224}}
        reference = transformers.SiglipImageProcessorPil
    model.save_pretrained(scratch)
    return model, settings, reference


def _interleaved(calls: dict[str, Callable[[], Any]], args: argparse.Namespace) -> dict[str, float]:
    """Each call's median milliseconds over `args.rounds` rounds, the calls taking turns in each round."""
    for call in calls.values():
        call()  # warm up
    timings: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            timings[name].append(timed(call, args.repeats))
    return {name: statistics.median(values) for name, values in timings.items()}


IMAGE_SHAPES = {"clip": "CLIP ViT-B/32 (224)", "siglip": "SigLIP base/16 (224)"}


def image_served(  # noqa: PLR0913 - the checkpoint and its raw path
    scratch: Path, processor: Any, session: ort.InferenceSession, data: bytes, settings: dict, args: argparse.Namespace
) -> None:
    """The CLIP in `scratch` served to 32 wrk connections (one JPEG per request) against preprocessing + the vision
    graph on 32 JPEGs in-process; interleaved rounds."""
    import base64

    from sie.imaging import ImageLimits
    from sie.worker.convert.names import IMAGE_EMBEDS, PIXEL_VALUES
    from support.image_text_checkpoints import write_tokenizer

    write_tokenizer(scratch, "clip")
    (scratch / "preprocessor_config.json").write_text(orjson.dumps(settings).decode())
    models = scratch / "models"
    models.mkdir(exist_ok=True)
    entry = {"sie_id": "bench/clip", "weights_path": str(scratch), "inputs": {"text": True, "image": True},
             "max_sequence_length": 77, "tasks": {"encode": {"dense": {"dim": 512}}},
             "profiles": {"default": {"adapter_path": "sie_server.adapters.clip:CLIPAdapter",
                                      "max_batch_tokens": 65536}}}  # fmt: skip
    (models / "bench__clip.yaml").write_text(dump_yaml(entry))
    body = orjson.dumps({"items": [{"images": [{"data": base64.b64encode(data).decode(), "format": "jpeg"}]}]})

    def raw() -> None:
        pixels = np.stack([processor(data, ImageLimits()) for _ in range(CONNECTIONS)])
        session.run([IMAGE_EMBEDS], {PIXEL_VALUES: pixels})

    raw_rate, served_rate = served_rounds(scratch, models, "bench/clip", "/v1/encode/bench/clip", body, raw, args)
    print(
        f"CLIP served (`sie run --role all`, uvicorn, {CONNECTIONS} connections x one 640x480 JPEG) against "
        f"preprocessing + the vision graph at batch {CONNECTIONS} in-process; medians of {args.rounds} rounds"
    )
    print("| model | raw images/s | served images/s | served / raw |")
    print("|---|---|---|---|")
    print(f"| CLIP ViT-B/32 | {raw_rate:.1f} | {served_rate:.1f} | {served_rate / raw_rate:.2f} |")


def served_rounds(  # noqa: PLR0913 - the model served and the two sides measured
    scratch: Path, models: Path, model: str, path: str, body: bytes, raw: Callable[[], None], args: argparse.Namespace
) -> tuple[float, float]:
    """`model` of the catalogue `models` served by `sie run --role all` (uvicorn) to 32 wrk connections posting
    `body` to `path`, against `raw` (one batch of 32 in-process) in interleaved rounds: the medians of raw and served
    items per second."""
    from launcher import serving_all

    environment = {"SIE_MODELS_DIR": str(models), "SIE_MODEL_CACHE": str(scratch / "cache"),
                   "SIE_HTTP_SERVER": "uvicorn"}  # fmt: skip
    arguments = ["--bundles-dir", str(REPO / "config" / "bundles"), "--preload", model]
    raw_rates, served_rates = [], []
    with serving_all(scratch / "server.log", arguments, environment) as url:
        httpx.post(f"{url}{path}", content=body, timeout=600, headers={"content-type": "application/json"})
        for round_index in range(args.rounds):
            print(f"served round {round_index + 1}/{args.rounds}", file=sys.stderr)
            raw_rates.append(CONNECTIONS * 1000.0 / timed(raw, 1))
            stats = measured_window(url, path, [body], CONNECTIONS / raw_rates[-1], args.served_seconds)
            if stats.failures:
                raise SystemExit(f"{stats.failures} failed requests; see {scratch / 'server.log'}")
            served_rates.append(stats.items_per_second)
    return statistics.median(raw_rates), statistics.median(served_rates)


def print_speed_table(rows: list[tuple[str, float, float, str]], args: argparse.Namespace) -> None:
    print(f"batch {args.batch} x {args.tokens} tokens, {args.threads} threads, MiniLM-sized random models "
          f"({'hidden states' if args.head == 'none' else 'sequence classifiers'}), medians of {args.rounds} "
          "interleaved rounds")  # fmt: skip
    print("| family | transformers (torch) ms | ours (onnxruntime) ms | speed-up | operators after fusions |")
    print("|---|---|---|---|---|")
    for family, theirs_ms, ours_ms, ops in rows:
        print(f"| {family} | {theirs_ms:.1f} | {ours_ms:.1f} | {theirs_ms / ours_ms:.2f}x | {ops} |")


if __name__ == "__main__":
    raise SystemExit(main())
