"""LoRA on a vision-language policy (actor.lora with an image-text-to-text model): adapters on the language model
and the connector, none on the frozen vision encoder; the reference policy is the model with its adapters off; the
adapter is a PEFT file that transformers + peft load beside the processor; vLLM gets merged weights (its LoRA
support would drop the connector's adapter, so rollout.lora_sync=adapter is refused by name).

The model is the 2-text-layer cut of `plugrl prepare-model Idefics3-SmolLM2-135M-test` (``tiny_vlm``), for tests.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from plugrl.actor import PolicyModel, TrainBatch
from plugrl.config import ActorConfig, ConfigError, ModelConfig, build_config
from plugrl_lora import adapters as lora
from plugrl_vision import PixelInputs
from test_vision import _image, _image_prompts


def _lora_policy(path, **actor) -> PolicyModel:
    """A float32 VLM policy with rank-8 adapters, each lora_B drawn away from PEFT's zero start (the connector's
    strongly, so that dropping its adapter would show)."""
    torch.manual_seed(0)
    cfg = ActorConfig(lora={"r": 8, "alpha": 16}, **actor)
    policy = PolicyModel(str(path), ModelConfig(path=str(path), dtype="float32"), cfg, torch.device("cpu"))
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.5 if ".connector." in name else 0.05)
    return policy


@pytest.fixture(scope="module")
def vlm_lora_policy(tiny_vlm):
    return _lora_policy(tiny_vlm)


@pytest.fixture(scope="module")
def image_batch(tiny_vlm):
    """Two image prompts (red, green) with two responses each."""
    _, prompts = _image_prompts(tiny_vlm, [_image("red"), _image("green", (20, 50))])
    responses, owner = [[28, 339, 1230], [504, 17], [2, 11, 42, 7], [19]], [0, 0, 1, 1]
    batch = TrainBatch.from_sequences(
        [prompts[o].ids + r for o, r in zip(owner, responses, strict=True)],
        [len(prompts[o].ids) for o in owner],
        group_ids=owner,
        pixels=[prompts[o].pixels for o in owner],
    )
    return prompts, responses, owner, batch


def _logprobs(model, prompt, response) -> torch.Tensor:
    """Log-probs of ``response`` after an image prompt from one plain forward of ``model`` (transformers or peft)."""
    ids = torch.tensor([prompt.ids + response])
    with torch.no_grad():
        logits = model(input_ids=ids, **PixelInputs.model_kwargs([prompt.pixels], torch.device("cpu"))).logits[0]
    return torch.log_softmax(logits[len(prompt.ids) - 1 : -1].float(), -1).gather(1, torch.tensor(response)[:, None])[
        :, 0
    ]


def test_adapters_go_on_the_language_model_and_connector_not_the_frozen_vision_encoder(tiny_vlm, vlm_lora_policy):
    layers = set(lora.lora_layers(vlm_lora_policy.model))
    assert layers and not any(".vision_model." in n for n in layers)
    assert "model.connector.modality_projection.proj" in layers
    assert any(".text_model.layers." in n for n in layers)
    assert "lm_head" not in layers
    # only the adapters train; the tower, the text weights and the connector's own weight are frozen
    trained = {id(p) for g in vlm_lora_policy.optimizer.param_groups for p in g["params"]}
    names = [n for n, p in vlm_lora_policy.model.named_parameters() if id(p) in trained]
    assert names and all(lora.is_adapter_param(n) for n in names)
    # the adapter's config says the encoder is left out, so PEFT leaves out its q_proj/k_proj/... too when loading
    config = vlm_lora_policy.adapters.peft.peft_config[lora.ADAPTER]
    assert config.exclude_modules == r"model\.vision_model\..*" and "q_proj" in config.target_modules

    # actor.freeze_vision_tower=false: the encoder's linear layers get adapters as well
    unfrozen = _lora_policy(tiny_vlm, freeze_vision_tower=False)
    assert any(n.startswith("model.vision_model.") for n in lora.lora_layers(unfrozen.model))
    assert unfrozen.adapters.peft.peft_config[lora.ADAPTER].exclude_modules is None


def test_naming_only_the_frozen_encoders_layers_is_an_error_naming_the_key(tiny_vlm):
    torch.manual_seed(0)
    cfg = ActorConfig(lora={"r": 8, "target_modules": ["fc1"]})  # the encoder's MLP only: nothing left to adapt
    with pytest.raises(ConfigError, match=r"actor.lora.target_modules: \['fc1'\] match no linear layer.*frozen model"):
        PolicyModel(str(tiny_vlm), ModelConfig(path=str(tiny_vlm), dtype="float32"), cfg, torch.device("cpu"))


def test_the_reference_is_the_base_vlm_and_the_adapter_loads_with_peft(
    tiny_vlm, vlm_lora_policy, image_batch, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    prompts, responses, owner, batch = image_batch
    policy = vlm_lora_policy
    mine = policy.compute_logprobs(batch, 1.0, 1024)
    reference = policy.compute_logprobs(batch, 1.0, 1024, adapters=False)
    base = AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32).eval()
    for i, (o, r) in enumerate(zip(owner, responses, strict=True)):
        # adapters off: the base model's own log-probs (float32), no second copy of it
        torch.testing.assert_close(reference[i, : len(r)], _logprobs(base, prompts[o], r), atol=1e-4, rtol=0)
    assert (mine - reference).abs().max() > 1e-2, "the adapters changed nothing"

    # the checkpoint's adapter (PEFT format): peft puts it on a freshly loaded base model and gets the policy back
    folder = tmp_path / "policy_adapter"
    lora.save_adapter(policy.adapters.peft, lora.adapter_state(policy.model, policy.device), folder)
    saved = json.loads((folder / "adapter_config.json").read_text())
    assert saved["exclude_modules"] == r"model\.vision_model\..*"
    AutoProcessor.from_pretrained(tiny_vlm).save_pretrained(folder)  # as the checkpoint writes it
    fresh = AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(fresh, str(folder)).eval()
    assert not any(".vision_model." in n for n in lora.lora_layers(loaded))
    for i, (o, r) in enumerate(zip(owner, responses, strict=True)):
        torch.testing.assert_close(mine[i, : len(r)], _logprobs(loaded, prompts[o], r), atol=1e-4, rtol=0)

    # merged into a plain VLM folder with its processor: what `plugrl eval` of the checkpoint and `plugrl export
    # --merge` write
    merged_dir = lora.merge_to_folder(tiny_vlm, folder, tmp_path / "merged")
    assert (merged_dir / "processor_config.json").is_file()
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir, dtype=torch.float32).eval()
    for i, (o, r) in enumerate(zip(owner, responses, strict=True)):
        torch.testing.assert_close(mine[i, : len(r)], _logprobs(merged, prompts[o], r), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_vllm_serves_the_vlm_lora_policy_as_merged_weights(tiny_vlm, vlm_lora_policy):
    """The weight sync of a LoRA VLM: merged weights (W + alpha / r * B @ A) under the base names, the tower's as
    they are; vLLM then samples image prompts with the policy's own log-probs (float32)."""
    from plugrl.rollout import SamplingSettings
    from test_vllm_engine import _vllm as small_vllm_engine

    _, prompts = _image_prompts(tiny_vlm, [_image("red"), _image("green", (20, 50))])
    engine = small_vllm_engine(tiny_vlm)
    greedy = SamplingSettings(n=1, max_tokens=6, temperature=0.0)
    try:
        before = [g[0] for g in engine.generate([p.engine_prompt for p in prompts], greedy)]
        engine.load_weights(vlm_lora_policy.named_full_parameters(torch.float32))
        outs = [g[0] for g in engine.generate([p.engine_prompt for p in prompts], greedy)]
    finally:
        engine.close()
    # the first token's log-prob (the same prompt either way) moved: the engine serves the adapted policy now
    moved = [abs(a.logprobs[0] - b.logprobs[0]) for a, b in zip(outs, before, strict=True)]
    assert max(moved) > 1e-2, f"the merged adapters did not change the engine's log-probs: {moved}"
    batch = TrainBatch.from_sequences(
        [p.ids + o.response_ids for p, o in zip(prompts, outs, strict=True)],
        [len(p.ids) for p in prompts],
        pixels=[p.pixels for p in prompts],
    )
    mine = vlm_lora_policy.compute_logprobs(batch, 1.0, 1024)
    for i, o in enumerate(outs):
        torch.testing.assert_close(mine[i, : len(o.response_ids)], torch.tensor(o.logprobs), atol=1e-4, rtol=0)


def test_the_adapter_sync_is_refused_for_a_vlm_naming_the_fix(tiny_vlm):
    """vLLM applies LoRA to a multimodal model's language layers only: the connector's adapter would be dropped
    (measured: sampled log-probs 0.1-0.3 away from the policy's), so the engine would sample another policy."""
    from plugrl_vision.checks import check_config

    base = {"model": {"path": str(tiny_vlm)}, "data": {"train_files": ["train.parquet"]}}
    lora_run = {**copy.deepcopy(base), "actor": {"lora": {"r": 8}}}
    check_config(build_config(copy.deepcopy(lora_run)))  # merged (the default): accepted
    with pytest.raises(ConfigError, match=r"language model: rollout.lora_sync=adapter .* set rollout.lora_sync=merged"):
        check_config(build_config({**lora_run, "rollout": {"lora_sync": "adapter"}}))


@pytest.mark.slow
def test_grpo_with_lora_on_images_checkpoints_the_adapter_with_its_processor_and_evaluates(tiny_vlm, tmp_path):
    """`plugrl train examples/vlm_grpo.yaml actor.lora.r=8` with vLLM for 2 steps, a resume to step 3, then `plugrl
    eval` of the adapter checkpoint (merged into the base VLM) and `plugrl export --merge`."""
    import re

    from test_e2e import metrics, run_plugrl

    args = [
        "train",
        "examples/vlm_grpo.yaml",
        f"model.path={tiny_vlm}",
        "model.dtype=float32",
        "actor.lora.r=8",
        "actor.lora.alpha=16",
        "actor.optim.lr=1e-3",
        "actor.entropy_coeff=0.01",  # the adapters move even when every reward of a group agrees
        "data.train_batch_size=2",
        "rollout.n=4",
        "rollout.cpu_kv_cache_gb=0.25",
        "trainer.save_freq=2",
        f"trainer.output_dir={tmp_path}",
        "trainer.experiment_name=vlm_lora",
    ]
    run_plugrl([*args, "trainer.total_steps=2"])
    out = run_plugrl([*args, "trainer.total_steps=3"])
    run = tmp_path / "vlm_lora"
    assert "resumed from" in out.stdout + out.stderr
    m = metrics(run)
    assert [x["step"] for x in m] == [1, 2, 3] and all(x["actor/optimizer_steps"] == 1 for x in m)
    ckpt = run / "checkpoints" / "step_000002"
    adapter = ckpt / "policy_adapter"
    assert not (ckpt / "policy").exists()
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "processor_config.json").is_file()
    out = run_plugrl(["eval", str(ckpt), "data.dataset_options.size=4", "--split", "test"])
    assert re.search(r"val/all/prompts\s+4\.0000", out.stdout), out.stdout[-2000:]
    run_plugrl(["export", str(ckpt), str(tmp_path / "merged"), "--merge"])
    assert (tmp_path / "merged" / "processor_config.json").is_file()
    assert (tmp_path / "merged" / "model.safetensors").is_file()


@pytest.mark.slow
def test_two_fsdp2_ranks_train_vlm_adapters(tiny_vlm, tmp_path):
    """torchrun with 2 gloo ranks: peft wraps the architecture before FSDP2 shards it, rank 0 alone builds the full
    copy (base weights and the seeded adapters) and broadcasts it; both ranks train the adapters on their images."""
    from safetensors.torch import load_file

    from test_vision import train_on_two_ranks

    train_on_two_ranks(tiny_vlm, tmp_path, "actor.lora.r=8", "actor.optim.lr=1e-3")
    adapter = tmp_path / "e2e" / "checkpoints" / "step_000002" / "policy_adapter"
    weights = load_file(adapter / "adapter_model.safetensors")
    assert weights and not any(".vision_model." in k for k in weights)
    assert any(".lora_B." in k and w.abs().max() > 0 for k, w in weights.items()), "no adapter trained"
