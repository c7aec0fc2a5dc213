"""In this process: plugrl.actor.PolicyModel on the GPU in bf16, log-probs and updates on a small TrainBatch built on
the host (as the trainer builds it, tests/dp_worker.py's fixed batch), and its peak GPU memory."""

from __future__ import annotations

import math
import time


def test_policy_update_on_cuda_keeps_the_batch_on_the_host(gpu_model, record_timing):
    import torch

    from dp_worker import global_batch
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    device = torch.device("cuda", 0)
    torch.cuda.init()  # before this the allocator has no stats: reset_peak_memory_stats says "Invalid device argument"
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    policy = PolicyModel(
        str(gpu_model),
        ModelConfig(path=str(gpu_model), dtype="bfloat16"),
        ActorConfig(optim={"lr": 1e-4}),
        device,
    )
    built = time.perf_counter() - start
    try:
        batch = global_batch()  # 4 prompts x 2 responses, random advantages, all on the host
        assert batch.response_mask.device.type == "cpu"
        mask = batch.response_mask.bool()

        start = time.perf_counter()
        old = policy.compute_logprobs(batch, 1.0, 1024)
        torch.cuda.synchronize(device)
        logprob_s = time.perf_counter() - start
        # the trainer's batch lives on the host: the model hands its results back there
        assert old.device.type == "cpu" and old.shape == batch.response_mask.shape, (old.device, old.shape)
        assert torch.isfinite(old).all() and (old[mask] <= 1e-4).all() and (old[~mask] == 0).all()
        batch.old_logprobs = old

        name, param = next((n, p) for n, p in policy.model.named_parameters() if "layers.0." in n)
        before = param.detach().clone()
        times = []
        for _ in range(2):  # the first update also creates the AdamW state; the second is steady state
            start = time.perf_counter()
            m = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
            assert all(isinstance(v, float) and math.isfinite(v) for v in m.values()), m
            assert m["actor/optimizer_steps"] == 1 and m["actor/skipped_updates"] == 0 and m["actor/grad_norm"] > 0, m
        # the caller's batch is still on the host, untouched by the model's copy to the GPU
        assert batch.response_mask.device.type == "cpu" and batch.advantages.device.type == "cpu"
        assert batch.old_logprobs is old
        assert not torch.equal(before, param.detach()), f"{name} did not change in two updates"
        new = policy.compute_logprobs(batch, 1.0, 1024)
        assert new.device.type == "cpu" and not torch.equal(new, old), "the log-probs did not move"

        # fp32 master weights and every AdamW state tensor on the GPU
        off = [n for n, p in policy.model.named_parameters() if p.device.type != "cuda" or p.dtype != torch.float32]
        assert not off, f"parameters not fp32 on cuda: {off[:5]}"
        state = [(k, v) for s in policy.optimizer.state.values() for k, v in s.items() if torch.is_tensor(v)]
        assert state, "AdamW has no state after two updates"
        moments = [(k, v) for k, v in state if v.dim()]  # exp_avg, exp_avg_sq; `step` may be a host scalar
        assert moments and all(v.device.type == "cuda" for _, v in moments), {v.device for _, v in moments}

        # peak: fp32 weights + gradients + two AdamW moments = 4 x the parameter bytes, plus bf16 casts and
        # activations of 8 short sequences; 5x + 1 GiB leaves room, a stray full copy of the model does not fit
        param_bytes = sum(p.numel() * p.element_size() for p in policy.model.parameters())
        peak = torch.cuda.max_memory_allocated(device)
        assert peak < 5 * param_bytes + 2**30, f"peak {peak / 2**30:.2f} GiB for {param_bytes / 2**30:.2f} GiB"
        record_timing(
            "PolicyModel in process (bf16): build + log-probs + 2 updates",
            built + logprob_s + sum(times),
            build_s=round(built, 2),
            logprobs_s=round(logprob_s, 3),
            first_update_s=round(times[0], 3),
            second_update_s=round(times[1], 3),
            peak_gpu_mem_gib=round(peak / 2**30, 2),
            param_gib=round(param_bytes / 2**30, 2),
        )
    finally:
        del policy
        torch.cuda.empty_cache()


def test_a_sliding_window_policy_on_cuda_masks_rows_past_the_window(gpu_model, tmp_path, record_timing):
    """A tiny random Gemma 3 text model (a sliding layer of 16 tokens, then a global one; SmolLM2's tokenizer) on the
    GPU in bf16: shared prompts with sequences past the window go to compiled FlexAttention, whose block mask lays
    out the window (the host reference takes dense masks); log-probs against float32 on the host, and an update."""
    import torch
    from test_gpu_vlm import _on_cuda_beside_the_host, _update

    from plugrl.actor import TrainBatch
    from tiny_models import make_tiny_sliding

    path = str(make_tiny_sliding(tmp_path / "gemma3_text", gpu_model, window=16))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(20, 2000, (n,), generator=g).tolist() for n in (12, 20)]
    responses = [torch.randint(20, 2000, (n,), generator=g).tolist() for n in (30, 5, 25, 8)]
    owner = [0, 0, 1, 1]
    batch = TrainBatch.from_sequences(
        [prompts[o] + r for o, r in zip(owner, responses, strict=True)],
        [len(prompts[o]) for o in owner],
        group_ids=owner,
    )
    batch.advantages = torch.randn(batch.response_mask.shape, generator=g) * batch.response_mask
    policy, start = _on_cuda_beside_the_host(path, batch, lr=1e-3, budget=4096)
    layout = policy._layout(policy._pack(batch, [0, 1, 2, 3]))
    assert isinstance(layout, list)  # the prefix groups: FlexAttention, windowed
    assert _update(policy, batch)
    record_timing("sliding-window policy: build + log-probs + update", time.perf_counter() - start, dtype="bfloat16")
