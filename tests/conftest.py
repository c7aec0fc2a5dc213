"""Shared fixtures: the real SmolLM2-135M-Instruct and tiny random models built from its tokenizer."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# test processes side by side (xdist) share the cores: each, and every process it starts, gets its share of torch
# threads. Two processes of 2 threads each on 2 cores spin-wait for each other: a tiny model's training step took
# 2.35 s that way and 0.85 s with 1 thread each (two runs of examples/countdown_grpo.yaml at once, 2-core EPYC)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # helper modules beside the tests


def pytest_collection_modifyitems(config, items):
    """Files with slow tests first, the most slow tests first; then the rest, the largest files first. Under
    xdist (--dist loadfile --no-loadscope-reorder, the Makefile) files are handed out in this order, so the
    long end-to-end files start early and the many short files fill both processes' last minutes; handed out
    last, one long file kept one process busy alone (CI ran out of time)."""
    slow: dict[str, int] = {}
    every: dict[str, int] = {}
    for item in items:
        every[item.path] = every.get(item.path, 0) + 1
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: (-slow[item.path], -every[item.path]))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct as safetensors (prepared by `make`, or here on first use)."""
    from plugrl_commands.local_models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="session")
def test_vlm(smollm2_path) -> Path:
    """The vision-language model for tests (`plugrl prepare-model Idefics3-SmolLM2-135M-test`): SmolLM2-135M's
    text weights with a small random vision encoder, built once into the cache."""
    from plugrl_vision.test_model import prepare_test_vlm

    return prepare_test_vlm()


@pytest.fixture(scope="session")
def tiny_rm(tmp_path_factory, tiny_model) -> Path:
    """A reward model for tests: the tiny llama with a random one-output score head (its scores mean nothing)."""
    from tiny_models import make_reward_model

    return make_reward_model(tmp_path_factory.mktemp("reward_model") / "tiny_rm", tiny_model)


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory, test_vlm) -> Path:
    """The test VLM with 2 text layers: fast enough for training-loop tests."""
    from tiny_models import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("tiny") / "vlm", test_vlm)


@pytest.fixture(scope="session")
def smol_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, smollm2_path) -> Path:
    """A 2-layer random llama with SmolLM2's real tokenizer: fast enough for training-loop tests."""
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", smollm2_path, arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory, smollm2_path) -> Path:
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2", smollm2_path, arch="qwen2")


@pytest.fixture
def local_plugin(tmp_path, monkeypatch):
    """Write a plugin module into tmp_path (on sys.path); returns its module name. Unimported afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


@pytest.fixture
def hide_entry_points(monkeypatch):
    """``hide_entry_points(group, ...)``: those entry-point groups empty for the rest of the test, as where the
    packages that implement them are not installed."""
    import importlib.metadata

    real = importlib.metadata.entry_points

    def hide(*groups: str) -> None:
        monkeypatch.setattr(
            importlib.metadata, "entry_points", lambda **kw: [] if kw.get("group") in groups else real(**kw)
        )

    return hide


@pytest.fixture
def without_config_fields(monkeypatch):
    """``without_config_fields(package, ...)``: the run config built without the keys those packages add (entry-point
    group plugrl.config_fields) for the rest of the test, as where they are not installed."""
    from plugrl import config

    installed = config.installed_fields()

    def hide(*packages: str) -> None:
        assert set(packages) <= set(installed), f"not installed here: {set(packages) - set(installed)}"
        kept = {p: f for p, f in installed.items() if p not in packages}
        monkeypatch.setattr(config, "installed_fields", lambda: kept)
        monkeypatch.setattr(config, "_built", {})

    return hide
