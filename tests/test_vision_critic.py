"""A critic on a vision-language model (PPO with GAE on images): the VLM with its LM head replaced by a scalar value
head, so the values come from the same forward as the policy's log-probs (pixels, image masks, 3-D positions).

Models: the tiny Idefics3 test VLM (SmolLM2-135M's first 2 text layers, a random vision encoder) and a tiny random
Gemma 3 (tests/tiny_models.py)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from plugrl_vision import VisionProcessor
from tiny_models import gemma3_prompt, noise_image


def _critic(path: str, **critic):
    from plugrl.config import CriticConfig, ModelConfig
    from plugrl.critic import ValueModel

    cfg = CriticConfig(optim={"lr": 1e-5}, **critic)
    return ValueModel(path, ModelConfig(path=path, dtype="float32"), cfg, torch.device("cpu"))


def _image_batch(processor, images):
    from plugrl.actor import TrainBatch

    prompts = [gemma3_prompt(processor, "How many squares?", [im]) for im in images]
    return TrainBatch.from_sequences(
        [ids + [28, 339, 1230] for _, ids, _ in prompts],
        [len(ids) for _, ids, _ in prompts],
        group_ids=list(range(len(prompts))),
        pixels=[px for _, _, px in prompts],
    )


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory, smollm2_path):
    from tiny_models import make_tiny_gemma3

    return make_tiny_gemma3(tmp_path_factory.mktemp("tiny") / "gemma3", smollm2_path)


@pytest.mark.parametrize("family", ["idefics3", "gemma3"])
def test_a_vlm_critic_reads_the_pixels_and_regresses_onto_returns(family, tiny_vlm, tiny_gemma3):
    """The value head is a fresh [1, hidden] linear layer tied to nothing; values depend on the image (the pixels reach
    the critic); one update moves the values toward the returns and trains the head, the language model and the
    connector, not the frozen encoder."""
    path = str(tiny_vlm if family == "idefics3" else tiny_gemma3)
    critic = _critic(path)
    head = critic.model.lm_head
    assert head.weight.shape == (1, critic.model.config.get_text_config().hidden_size) and head.bias is not None
    assert head.weight.data_ptr() != critic.model.get_input_embeddings().weight.data_ptr()
    processor = VisionProcessor.load(path)
    batch = _image_batch(processor, [noise_image(0, (40, 30)), noise_image(1, (40, 30))])
    values = critic.compute_values(batch)
    assert values.shape == batch.response_mask.shape and values.device.type == "cpu"
    swapped = _image_batch(processor, [noise_image(1, (40, 30)), noise_image(0, (40, 30))])
    assert (critic.compute_values(swapped)[0] - values[0]).abs().max() > 1e-4
    batch.old_values = values
    batch.returns = torch.ones_like(values) * batch.response_mask
    before = {n: p.detach().clone() for n, p in critic.model.named_parameters()}
    critic.update(batch, num_mini_batches=1, epochs=1, norm_length=3)
    after = critic.compute_values(batch)
    mask = batch.response_mask.bool()
    assert (after[mask] - 1).abs().mean() < (values[mask] - 1).abs().mean()
    moved = {n for n, p in critic.model.named_parameters() if not torch.equal(p, before[n])}
    assert {"lm_head.weight", "lm_head.bias"} <= moved
    tower = ".vision_model." if family == "idefics3" else ".vision_tower."
    connector = ".connector." if family == "idefics3" else ".multi_modal_projector."
    assert not any(tower in n for n in moved) and any(connector in n for n in moved)


def test_a_vlm_critic_with_lora_trains_its_adapters_and_head(tiny_vlm):
    """critic.lora on a VLM: adapters on the language model and connector, none on the encoder; the value head
    (``lm_head``) trains whole beside them."""
    critic = _critic(str(tiny_vlm), lora={"r": 4, "alpha": 8})
    trained = {n for n, p in critic.model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n and ".text_model." in n for n in trained)
    assert not any(".vision_model." in n for n in trained)
    assert any("lm_head" in n and "lora" not in n for n in trained)


@pytest.mark.slow
def test_ppo_with_a_vlm_critic_trains_on_images_checkpoints_and_resumes(tiny_vlm, tmp_path):
    """`plugrl train examples/vlm_grpo.yaml` with algorithm.adv_estimator=gae: the critic is the VLM with a value
    head; 2 steps (the first warms the critic up), the checkpoint holds the critic, and a resume goes on to step 3."""
    from test_e2e import metrics, run_plugrl, tiny_overrides

    common = [
        "examples/vlm_grpo.yaml",
        *tiny_overrides(tiny_vlm, tmp_path, 2),
        "algorithm.adv_estimator=gae",
        "trainer.critic_warmup=1",
    ]
    run_plugrl(["train", *common])
    m = metrics(tmp_path / "e2e")
    assert "actor/optimizer_steps" not in m[0] and m[0]["critic/optimizer_steps"] == 1
    assert m[1]["actor/optimizer_steps"] == 1 and m[1]["critic/optimizer_steps"] == 1
    ckpt = tmp_path / "e2e" / "checkpoints" / "step_000002"
    assert (ckpt / "critic" / "config.json").is_file() and (ckpt / "critic_optimizer.pt").is_file()
    again = [c for c in common if not c.startswith("trainer.total_steps")]
    proc = run_plugrl(["train", *again, "trainer.total_steps=3"])
    assert "at step 2" in proc.stderr
    assert [x["step"] for x in metrics(tmp_path / "e2e")] == [1, 2, 3]


def test_image_prompts_reach_the_critic_through_the_trainer_batch(tiny_vlm):
    """The critic gets the batch the trainer builds for the policy: an image-free text prompt is scored too (the
    blank image keeps the connector in the gradient)."""
    from plugrl.actor import TrainBatch

    critic = _critic(str(tiny_vlm))
    processor = VisionProcessor.load(str(tiny_vlm))
    text = processor.render([{"role": "user", "content": "<image>How many?"}])
    _, ids, pixels = processor.encode(text, [Image.new("RGB", (40, 30), "red")])
    plain = processor.tokenizer("What is 2 + 2?")["input_ids"]
    batch = TrainBatch.from_sequences(
        [ids + [28, 339], plain + [17]], [len(ids), len(plain)], group_ids=[0, 1], pixels=[pixels, None]
    )
    batch.old_values = critic.compute_values(batch)
    batch.returns = torch.ones_like(batch.old_values) * batch.response_mask
    metrics = critic.update(batch, num_mini_batches=1, epochs=1, norm_length=2)
    assert metrics["critic/optimizer_steps"] == 1 and metrics["critic/grad_norm"] > 0


@pytest.mark.slow
def test_ppo_with_a_vlm_critic_on_two_fsdp2_ranks(tiny_vlm, tmp_path):
    """The same under torchrun with 2 gloo ranks: the critic is built without weights on every rank (its value head
    too), filled from rank 0's, and sharded like the policy."""
    from test_vision import train_on_two_ranks

    m = train_on_two_ranks(tiny_vlm, tmp_path, "algorithm.adv_estimator=gae")
    assert all(x["critic/optimizer_steps"] == 1 for x in m)
