"""Tiny random causal LMs for tests, built around SmolLM2's real tokenizer (test-only; not part of the kernel)."""

from __future__ import annotations

from pathlib import Path

import torch


def make_tiny_model(
    out: Path,
    tokenizer_dir: Path,
    arch: str = "llama",
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    kv_heads: int = 1,
) -> Path:
    """A small random causal LM (llama, qwen2 or qwen3) with a real tokenizer, saved as safetensors.

    Heads of 64 dimensions (hidden // 64 of them) and ``kv_heads`` key/value heads.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config, Qwen3Config

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    common = dict(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,  # head_dim 64: vLLM CPU needs it
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    if arch == "qwen3":  # its head_dim is a config key (default 128)
        config = Qwen3Config(**common, head_dim=64)
    else:
        config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def make_reward_model(out: Path, base: Path, seed: int = 0) -> Path:
    """A reward model for tests only: ``base`` (SmolLM2-135M-Instruct) with a randomly initialised score head of one
    output (``AutoModelForSequenceClassification``, num_labels 1), saved with its tokenizer as safetensors. Its
    scores mean nothing; the tests check that plugrl computes them as transformers does."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)  # the head's initial weights
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def make_tiny_vlm(out: Path, test_vlm: Path, layers: int = 2) -> Path:
    """The test VLM (`Idefics3-SmolLM2-135M-test`) cut to its first ``layers`` text layers, with its processor:
    a fast vision-language model for training-loop tests (its outputs are not SmolLM2's)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    config = AutoConfig.from_pretrained(test_vlm)
    config.text_config.num_hidden_layers = layers
    full = AutoModelForImageTextToText.from_pretrained(test_vlm, dtype=torch.float32)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    missing, _ = model.load_state_dict(full.state_dict(), strict=False)
    assert not missing, missing
    model.save_pretrained(out, safe_serialization=True)
    AutoProcessor.from_pretrained(test_vlm).save_pretrained(out)
    return out
