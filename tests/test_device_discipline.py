"""Device discipline: no op of a training step mixes host tensors with the model's device.

There is no GPU here, and a fake CUDA device aborts the CPU build of torch (shared/notes/gpu-checks-on-cpu.md).
So the models live on the ``meta`` device, which stands for the accelerator: the trainer's batch is built on
the host by the real code path, and a ``TorchDispatchMode`` fails the test on any aten op whose tensor arguments
(0-dim ones aside, which real PyTorch accepts beside CUDA tensors) sit on more than one device type; host index
tensors are let through where CUDA accepts them (``x[idx]``, ``x[idx] = y``). Values on meta mean nothing:
the mode answers ``.item()`` / ``float()`` of a meta tensor and a meta-to-host copy with stand-ins, so each
pass runs to its end. What this proves is placement, not numbers (the CPU tests prove those).

Shared prefixes through FlexAttention (the non-CPU attention) cannot run here: eager FlexAttention refuses the
meta device and compiles a wrapper that no dispatch mode may watch. Its block mask is built on the query's
device from host-made bounds (plugrl_attention.prefix_block_mask); tests/test_attention.py checks it on the CPU.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from plugrl import algorithms
from plugrl.actor import PolicyModel, TrainBatch
from plugrl.config import ActorConfig, CriticConfig, ModelConfig
from plugrl.plugins import load_plugins
from plugrl_advantages.estimators.gae import gae_advantages

aten = torch.ops.aten
META = torch.device("meta")
# ops that take host index tensors for a device tensor on CUDA too
_HOST_INDEX_OK = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


class DeviceMixError(AssertionError):
    pass


class DeviceDiscipline(TorchDispatchMode):
    """Raise on any op mixing device types; stand-ins for reading meta values back to the host."""

    def __init__(self):
        super().__init__()
        self.meta_ops = 0
        self.host_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func is aten._local_scalar_dense.default and first is not None and first.is_meta:
            self.host_reads += 1
            return 1.0 if first.is_floating_point() else 1
        if func is aten._to_copy.default and first is not None and first.is_meta:
            target = kwargs.get("device")
            if target is not None and torch.device(target).type == "cpu":  # device -> host: a stand-in
                self.host_reads += 1
                return torch.zeros(first.shape, dtype=kwargs.get("dtype") or first.dtype)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        kinds = {t.device.type for t in tensors if t.dim() > 0}
        if len(kinds) > 1:
            if func in _HOST_INDEX_OK and first is not None and first.device.type != "cpu":
                kinds = {first.device.type} | {t.device.type for t in tensors if t.dim() > 0 and t.is_floating_point()}
            if len(kinds) > 1:
                shapes = [(t.device.type, tuple(t.shape)) for t in tensors]
                raise DeviceMixError(f"{func} mixes devices: {shapes}")
        if any(t.is_meta for t in tensors):
            self.meta_ops += 1
        return func(*args, **kwargs)


def test_the_mode_catches_a_mix_and_lets_legal_ones_through():
    """The checker itself: it must fail on what CUDA refuses and pass what CUDA accepts."""
    x = torch.zeros(4, 3, device=META)
    with DeviceDiscipline() as mode:
        with pytest.raises(DeviceMixError, match="mixes devices"):
            x * torch.ones(4, 3)
        with pytest.raises(DeviceMixError):
            torch.where(torch.ones(4, 3, dtype=torch.bool), x, torch.zeros(4, 3))
        with pytest.raises(DeviceMixError):  # silently passes without the mode (shared/notes)
            x @ torch.ones(3, 2)
        x * torch.tensor(2.0)  # a 0-dim host scalar: fine on CUDA
        x[torch.tensor([0, 2])]  # a host index: fine on CUDA
        x[[1, 3]] = torch.ones(2, 3, device=META)
        assert float(x.sum()) == 1.0  # the stand-in
        assert x.to("cpu").shape == (4, 3)
    assert mode.meta_ops >= 3 and mode.host_reads == 2


def _host_batch(vocab: int, n_groups: int = 3, n: int = 2, seed: int = 0, multi_turn: bool = False) -> TrainBatch:
    """A trainer-shaped batch, built where the trainer builds it: on the host. ``multi_turn``: every response
    has environment tokens in its middle (policy masks), as a multi-turn episode's does."""
    g = torch.Generator().manual_seed(seed)
    seqs, plens, groups, masks = [], [], [], []
    for gi in range(n_groups):
        prompt = torch.randint(5, vocab, (4 + gi,), generator=g).tolist()
        for k in range(n):
            r = 3 + gi + 2 * k
            seqs.append(prompt + torch.randint(5, vocab, (r,), generator=g).tolist())
            plens.append(len(prompt))
            groups.append(gi)
            masks.append([0 if 1 <= j < r // 2 + 1 else 1 for j in range(r)] if multi_turn else None)
    return TrainBatch.from_sequences(seqs, plens, policy_masks=masks, group_ids=groups)


def _models(path, *, attn: str, share: bool, actor: dict | None = None, critic: bool = False):
    model_cfg = ModelConfig(path=str(path), dtype="float32", attn_implementation=attn)
    actor_cfg = ActorConfig(
        share_prompt_prefix=share, ppo_max_token_len_per_gpu=24, optim={"lr": 1e-3}, **(actor or {})
    )
    policy = PolicyModel(str(path), model_cfg, actor_cfg, META)
    ref = PolicyModel(str(path), model_cfg, actor_cfg, META, trainable=False)
    value = None
    if critic:
        from plugrl.critic import ValueModel

        value = ValueModel(
            str(path),
            model_cfg,
            CriticConfig(ppo_max_token_len_per_gpu=24, optim={"lr": 1e-3}),
            META,
            share_prompt_prefix=share,
        )
    return policy, ref, value


@pytest.mark.parametrize(
    ("attn", "share", "actor", "multi_turn"),
    [
        ("sdpa", False, {}, False),
        ("eager", True, {"use_kl_loss": True, "entropy_coeff": 0.01}, False),  # the dense prefix mask
        ("sdpa", False, {"loss_mode": "gspo", "use_kl_loss": True, "loss_agg_mode": "seq-mean-token-mean"}, False),
        ("eager", True, {"use_kl_loss": True}, True),  # multi-turn: environment tokens masked out mid-response
    ],
)
def test_a_training_step_keeps_host_and_device_apart(tiny_model, attn, share, actor, multi_turn):
    """The steps of ``Trainer.train_step`` after the rollouts, in its order: old, reference and critic passes,
    the advantages on the host, the critic and policy updates, and the weight gather for the engine."""
    policy, ref, value = _models(tiny_model, attn=attn, share=share, actor=actor, critic=True)
    assert next(policy.model.parameters()).is_meta
    batch = _host_batch(policy.model.config.vocab_size, multi_turn=multi_turn)
    if multi_turn:
        assert 0 < batch.response_mask.sum() < sum(batch.response_lens)  # some response tokens are not trained
    loss = load_plugins(["advantages"]).policy_losses[policy.cfg.loss_mode].fn  # gspo: plugrl-advantages'
    with DeviceDiscipline() as mode:
        batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 24)
        batch.ref_logprobs = ref.compute_logprobs(batch, 1.0, 24)
        batch.old_values = value.compute_values(batch)
        # what the models hand back is the trainer's: on the host, beside its batch
        for t in (batch.old_logprobs, batch.ref_logprobs, batch.old_values):
            assert t.device.type == "cpu" and t.shape == batch.response_mask.shape
        kl = algorithms.kl_penalty(batch.old_logprobs, batch.ref_logprobs, "low_var_kl") * batch.response_mask
        rewards = torch.zeros_like(batch.response_mask) - 0.1 * kl
        batch.advantages, batch.returns = gae_advantages(
            rewards, batch.old_values, batch.response_mask, gamma=1.0, lam=1.0
        )
        kept = batch.select([0, 1, 3, 4, 5])  # mask_truncated_completions drops some rows
        cm = value.update(kept, num_mini_batches=2, epochs=1, norm_length=16)
        pm = policy.update(kept, num_mini_batches=2, temperature=0.7, norm_length=16, policy_loss=loss)
        weights = dict(policy.named_full_parameters(torch.bfloat16))
    assert mode.meta_ops > 500  # the model passes ran on the stand-in device
    assert pm["actor/optimizer_steps"] == 2.0 and cm["critic/optimizer_steps"] == 2.0
    assert all(w.is_meta and w.dtype == torch.bfloat16 for w in weights.values())
    assert all(p.is_meta for p in policy.model.parameters())
    for group in policy.optimizer.state.values():
        assert all(v.is_meta for v in group.values() if isinstance(v, torch.Tensor) and v.dim() > 0)


def test_the_old_placement_would_have_failed(tiny_model):
    """The guard: a host batch fed straight into the loss against device log-probs is what the mode refuses
    (the bug this file exists for: advantages and masks built on the host, log-probs on the GPU)."""
    policy, _, _ = _models(tiny_model, attn="sdpa", share=False)
    batch = _host_batch(policy.model.config.vocab_size)
    batch.advantages = torch.ones_like(batch.response_mask)
    with DeviceDiscipline(), pytest.raises(DeviceMixError):
        lp, _ = policy._forward(batch.to(META), list(range(len(batch))), 1.0, with_entropy=False)
        algorithms.policy_loss(
            lp,
            lp.detach(),
            batch.advantages,
            batch.response_mask,
            clip_low=0.2,
            clip_high=0.2,
            clip_c=3.0,
            agg_mode="token-mean",
            num_tokens=1.0,
            num_seqs=1.0,
            norm_length=16,
        )


def test_a_lora_step_keeps_host_and_device_apart(tiny_model):
    """actor.lora: the policy pass, the reference pass with the adapters off (the same model), the update of the
    adapters alone, and the merged weights for the engine (W + scale * B @ A, gathered per layer)."""
    model_cfg = ModelConfig(path=str(tiny_model), dtype="float32", attn_implementation="sdpa")
    actor_cfg = ActorConfig(
        share_prompt_prefix=False,
        ppo_max_token_len_per_gpu=24,
        optim={"lr": 1e-3},
        use_kl_loss=True,
        lora={"r": 4, "alpha": 8},
    )
    policy = PolicyModel(str(tiny_model), model_cfg, actor_cfg, META)
    assert next(policy.model.parameters()).is_meta
    batch = _host_batch(policy.model.config.vocab_size)
    with DeviceDiscipline() as mode:
        batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 24)
        batch.ref_logprobs = policy.compute_logprobs(batch, 1.0, 24, adapters=False)
        for t in (batch.old_logprobs, batch.ref_logprobs):
            assert t.device.type == "cpu" and t.shape == batch.response_mask.shape
        batch.advantages = torch.ones_like(batch.response_mask)
        pm = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
        weights = dict(policy.named_full_parameters(torch.bfloat16))
    assert mode.meta_ops > 200 and pm["actor/optimizer_steps"] == 1.0
    assert all(w.is_meta and w.dtype == torch.bfloat16 for w in weights.values())
    assert not any("lora" in name for name in weights)  # merged under the base names, as the engine expects


@pytest.mark.slow
def test_a_vision_language_step_keeps_host_and_device_apart(test_vlm):
    """Image prompts: the pixel values are made on the host with the prompts (PixelInputs) and packed beside the
    token ids; the policy and reference passes, the update, the weight gather and a VLM critic's values and update
    keep them on the device."""
    from PIL import Image

    from plugrl_vision import VisionProcessor

    processor = VisionProcessor.load(str(test_vlm))
    text = processor.render([{"role": "user", "content": "<image>How many?"}])
    prompts = [processor.encode(text, [Image.new("RGB", (30 + 10 * i, 40), "red")]) for i in range(2)]
    seqs, plens, groups, pixels = [], [], [], []
    for gi, (_, ids, px) in enumerate(prompts):
        for r in (3, 5):
            seqs.append(ids + [28] * r)
            plens.append(len(ids))
            groups.append(gi)
            pixels.append(px)
    batch = TrainBatch.from_sequences(seqs, plens, group_ids=groups, pixels=pixels)
    model_cfg = ModelConfig(path=str(test_vlm), dtype="float32", attn_implementation="eager")
    actor_cfg = ActorConfig(ppo_max_token_len_per_gpu=256, optim={"lr": 1e-3}, use_kl_loss=True)
    policy = PolicyModel(str(test_vlm), model_cfg, actor_cfg, META)
    ref = PolicyModel(str(test_vlm), model_cfg, actor_cfg, META, trainable=False)
    from plugrl.critic import ValueModel

    critic = ValueModel(str(test_vlm), model_cfg, CriticConfig(ppo_max_token_len_per_gpu=256, optim={"lr": 1e-3}), META)
    import torch.fx.experimental._config as fx_config

    # the model selects real images and image tokens by boolean masks, whose size meta tensors cannot know
    with DeviceDiscipline() as mode, fx_config.patch(meta_nonzero_assume_all_nonzero=True):
        batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 256)
        batch.ref_logprobs = ref.compute_logprobs(batch, 1.0, 256)
        assert batch.old_logprobs.device.type == "cpu"
        batch.advantages = torch.ones_like(batch.response_mask)
        pm = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
        weights = dict(policy.named_full_parameters(torch.bfloat16))
        batch.old_values = critic.compute_values(batch)  # a VLM critic: the same pixels, a value head
        assert batch.old_values.device.type == "cpu"
        batch.returns = torch.ones_like(batch.response_mask)
        cm = critic.update(batch, num_mini_batches=1, epochs=1, norm_length=16)
    assert mode.meta_ops > 500 and pm["actor/optimizer_steps"] == 1.0 and cm["critic/optimizer_steps"] == 1.0
    assert all(w.is_meta for w in weights.values())


def test_a_qwen_vl_step_moves_its_3d_positions_to_the_device(tmp_path, smollm2_path):
    """Qwen-VL's 3-D rotary position ids ([4, 1, L]) are built on the host with the packed row and moved with it.
    Text prompts only: the Qwen vision encoder sizes its work from the values of the image grids, which meta
    tensors do not hold (its pixel inputs move as the Idefics3 test's do, by PixelInputs.model_kwargs)."""
    from tiny_models import make_tiny_qwen_vl

    path = str(make_tiny_qwen_vl(tmp_path / "qwen_vl", smollm2_path))
    batch = TrainBatch.from_sequences([[5, 6, 7, 8, 9], [5, 6, 7, 10], [11, 12, 13]], [3, 3, 2], group_ids=[0, 0, 1])
    model_cfg = ModelConfig(path=path, dtype="float32", attn_implementation="eager")
    policy = PolicyModel(path, model_cfg, ActorConfig(ppo_max_token_len_per_gpu=256, optim={"lr": 1e-3}), META)
    assert policy.mrope is not None
    positions = policy._pack(batch, [0, 1, 2]).position_ids()
    assert positions.shape == (4, 1, 9) and positions.device.type == "cpu"
    with DeviceDiscipline() as mode:
        batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 256)
        batch.advantages = torch.ones_like(batch.response_mask)
        pm = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=4)
    assert batch.old_logprobs.device.type == "cpu"
    assert mode.meta_ops > 100 and pm["actor/optimizer_steps"] == 1.0


def test_a_gemma3_step_moves_its_image_block_masks_to_the_device(tmp_path, smollm2_path, monkeypatch):
    """Gemma 3's masks per layer type (both-ways image blocks, a sliding window) are built on the host with the packed
    row and moved with it; its pixel inputs (no batch axis) and the blank image of a row without images too.
    (transformers checks the count of image tokens against the features by value, which meta tensors do not hold:
    that check is skipped here; the CPU tests run it.)"""
    from PIL import Image
    from transformers.models.gemma3 import modeling_gemma3

    from plugrl_vision import VisionProcessor
    from tiny_models import make_tiny_gemma3

    path = str(make_tiny_gemma3(tmp_path / "gemma3", smollm2_path))
    processor = VisionProcessor.load(path)
    text = processor.render([{"role": "user", "content": "<image>How many?"}])
    _, ids, pixels = processor.encode(text, [Image.new("RGB", (30, 40), "red")])
    plain = processor.tokenizer(processor.render([{"role": "user", "content": "Hi"}]))["input_ids"]
    batch = TrainBatch.from_sequences(
        [ids + [28, 29], ids + [30], plain + [31, 32]],
        [len(ids), len(ids), len(plain)],
        group_ids=[0, 0, 1],
        pixels=[pixels, pixels, None],
    )
    model_cfg = ModelConfig(path=path, dtype="float32", attn_implementation="eager")
    policy = PolicyModel(path, model_cfg, ActorConfig(ppo_max_token_len_per_gpu=64, optim={"lr": 1e-3}), META)
    assert policy.row_masks is not None and policy.row_masks.image_token_id is not None
    layout = policy._layout(policy._pack(batch, [0, 1, 2]))
    assert set(layout) == {"full_attention", "sliding_attention"} and layout["full_attention"].is_meta
    import torch.fx.experimental._config as fx_config

    monkeypatch.setattr(modeling_gemma3, "torch_compilable_check", lambda cond, msg: None)
    with DeviceDiscipline() as mode, fx_config.patch(meta_nonzero_assume_all_nonzero=True):
        batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 64)
        batch.advantages = torch.ones_like(batch.response_mask)
        pm = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=4)
    assert batch.old_logprobs.device.type == "cpu"
    assert mode.meta_ops > 100 and pm["actor/optimizer_steps"] == 1.0
