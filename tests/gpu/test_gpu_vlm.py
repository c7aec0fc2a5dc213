"""In this process: a vision-language policy (the test VLM, `plugrl prepare-model Idefics3-SmolLM2-135M-test`) on the
GPU in bf16: log-probs of image prompts against float32 on the host, and an update, with the batch and its pixel
values built on the host as the trainer builds them."""

from __future__ import annotations

import time


def _on_cuda_beside_the_host(path: str, batch, *, lr: float, budget: int):
    """The policy at ``path`` on the GPU in bf16, its log-probs of ``batch`` (built on the host) checked against a
    float32 forward on the host and set as the batch's old log-probs; returns the policy and when its build began
    (the wall time the tests record leaves the host reference out)."""
    import torch

    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    cpu = PolicyModel(path, ModelConfig(path=path, dtype="float32"), ActorConfig(), torch.device("cpu"))
    reference = cpu.compute_logprobs(batch, 1.0, budget)
    del cpu
    device = torch.device("cuda", 0)
    start = time.perf_counter()
    policy = PolicyModel(path, ModelConfig(path=path, dtype="bfloat16"), ActorConfig(optim={"lr": lr}), device)
    old = policy.compute_logprobs(batch, 1.0, budget)
    torch.cuda.synchronize(device)
    assert old.device.type == "cpu" and old.shape == batch.response_mask.shape
    mask = batch.response_mask.bool()
    # bf16 autocast against float32: the same tokens, close log-probs
    assert (old[mask] - reference[mask]).abs().max() < 0.5, (old[mask], reference[mask])
    batch.old_logprobs = old
    return policy, start


def _update(policy, batch) -> set[str]:
    """One update of ``policy`` on ``batch`` (its old log-probs set): the names of the parameters it moved."""
    import torch

    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    m = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=8)
    torch.cuda.synchronize(policy.device)
    assert m["actor/optimizer_steps"] == 1 and m["actor/grad_norm"] > 0, m
    return {n for n, p in policy.model.named_parameters() if not torch.equal(before[n], p.detach())}


def test_a_vlm_policy_on_cuda_reads_the_host_pixels_and_updates(gpu_model, record_timing):
    import torch
    from PIL import Image

    from plugrl.actor import TrainBatch
    from plugrl_vision import VisionProcessor
    from plugrl_vision.test_model import prepare_test_vlm

    path = str(prepare_test_vlm())  # built from gpu_model's SmolLM2 weights
    processor = VisionProcessor.load(path)
    text = processor.render([{"role": "user", "content": "<image>How many red squares are there?"}])
    prompts = [processor.encode(text, [Image.new("RGB", (40 + 10 * i, 40), "red")]) for i in range(2)]
    seqs, plens, groups, pixels = [], [], [], []
    for g, (_, ids, px) in enumerate(prompts):
        for r in ([28, 339, 1230], [504, 17, 2]):
            seqs.append(ids + r)
            plens.append(len(ids))
            groups.append(g)
            pixels.append(px)
    batch = TrainBatch.from_sequences(seqs, plens, group_ids=groups, pixels=pixels)
    assert pixels[0].pixel_values.device.type == "cpu"

    policy, start = _on_cuda_beside_the_host(path, batch, lr=1e-4, budget=1024)
    device = policy.device
    batch.advantages = torch.ones_like(batch.response_mask)
    proj = dict(policy.model.named_parameters())["model.connector.modality_projection.proj.weight"]
    before = proj.detach().clone()
    m = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
    torch.cuda.synchronize(device)
    assert m["actor/optimizer_steps"] == 1 and m["actor/grad_norm"] > 0, m
    assert not torch.equal(before, proj.detach()), "the connector did not train"
    frozen = [p for n, p in policy.model.named_parameters() if ".vision_model." in n]
    assert frozen and not any(p.requires_grad for p in frozen)
    record_timing("vlm policy: build + log-probs + update", time.perf_counter() - start, dtype="bfloat16")


def test_a_qwen_vl_policy_on_cuda_places_its_3d_positions_and_updates(gpu_model, tmp_path, record_timing):
    """A tiny random Qwen2.5-VL (tests/tiny_models.py, SmolLM2's tokenizer) on the GPU in bf16: the patch-layout
    pixel inputs and the 3-D rotary positions are built on the host and moved with the row; log-probs against
    float32 on the host, an update of the language model (the encoder frozen)."""
    from pathlib import Path

    from tiny_models import make_tiny_qwen_vl, qwen_vl_batch  # tests/ (tests/conftest.py puts it on the path)

    path = str(make_tiny_qwen_vl(tmp_path / "qwen_vl", gpu_model))
    batch = qwen_vl_batch(Path(path))
    policy, start = _on_cuda_beside_the_host(path, batch, lr=1e-3, budget=4096)
    moved = _update(policy, batch)
    assert moved and not any(n.startswith("model.visual.") for n in moved)
    record_timing("qwen-vl policy: build + log-probs + update", time.perf_counter() - start, dtype="bfloat16")


def test_a_gemma3_policy_on_cuda_builds_its_image_masks_and_updates(gpu_model, tmp_path, record_timing):
    """A tiny random Gemma 3 (tests/tiny_models.py, SmolLM2's tokenizer, its real processor) on the GPU in bf16: the
    shared prompts go to compiled FlexAttention, whose block masks lay out the both-ways image runs and the sliding
    window shorter than the rows (the host reference takes dense masks), the pixel inputs move with the row;
    log-probs against float32 on the host, an update of the language model and connector (the encoder frozen)."""

    from plugrl_vision import VisionProcessor
    from tiny_models import gemma3_batch, make_tiny_gemma3  # tests/ (tests/conftest.py puts it on the path)

    path = str(make_tiny_gemma3(tmp_path / "gemma3", gpu_model))
    _, _, _, batch = gemma3_batch(VisionProcessor.load(path))
    policy, start = _on_cuda_beside_the_host(path, batch, lr=1e-3, budget=4096)
    moved = _update(policy, batch)
    assert not any(".vision_tower." in n for n in moved)
    assert any(".multi_modal_projector." in n for n in moved)
    record_timing("gemma3 policy: build + log-probs + update", time.perf_counter() - start, dtype="bfloat16")
