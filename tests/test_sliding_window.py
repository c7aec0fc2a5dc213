"""Text models whose layers see a sliding window (Gemma 3, Gemma 2's family, Mistral): the packed forward with shared
prompts keeps the shared-prefix kernel while every sequence of a row fits in the window (the window then changes
nothing), and builds dense masks with the window otherwise (:func:`plugrl.attention.layer_masks`): per layer type for
a model with ``layer_types``, one mask for a model whose every layer slides. Both equal one plain transformers
forward per sequence. Tiny random models (tests/tiny_models.py::make_tiny_sliding)."""

from __future__ import annotations

import pytest
import torch

from plugrl.attention import RowMasks

WINDOW = 16


@pytest.fixture(scope="module", params=["gemma3_text", "mistral"])
def sliding_model(request, tmp_path_factory, smollm2_path):
    from tiny_models import make_tiny_sliding

    out = tmp_path_factory.mktemp("sliding") / request.param
    return make_tiny_sliding(out, smollm2_path, family=request.param, window=WINDOW), request.param


def _batch(prompt_lens, response_lens, owner, seed=0):
    from plugrl.actor import TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(20, 2000, (n,), generator=g).tolist() for n in prompt_lens]
    responses = [torch.randint(20, 2000, (n,), generator=g).tolist() for n in response_lens]
    batch = TrainBatch.from_sequences(
        [prompts[o] + r for o, r in zip(owner, responses, strict=True)],
        [len(prompts[o]) for o in owner],
        group_ids=owner,
    )
    return prompts, responses, batch


def _plain(model, ids, n_prompt):
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0]
    return torch.log_softmax(logits[n_prompt - 1 : -1].float(), -1).gather(1, x[0, n_prompt:, None])[:, 0]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("fits", [False, True], ids=["longer-than-the-window", "within-the-window"])
def test_shared_prompts_with_a_sliding_window_equal_one_plain_forward_per_sequence(sliding_model, attn, fits):
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    path, family = sliding_model
    policy = PolicyModel(
        str(path), ModelConfig(path=str(path), dtype="float32", attn_implementation=attn), ActorConfig(), "cpu"
    )
    assert policy.row_masks == RowMasks(None, WINDOW, family == "gemma3_text")
    if fits:  # prompt + response <= the window: the shared-prefix layout as it is
        prompts, responses, batch = _batch([5, 7], [9, 3, 8, 6], [0, 0, 1, 1])
    else:
        prompts, responses, batch = _batch([12, 20], [30, 5, 25, 8], [0, 0, 1, 1])
    groups = policy._layout(policy._pack(batch, list(range(len(batch)))))
    if fits:
        assert isinstance(groups, list) if attn == "sdpa" else groups.shape[-1] == groups.shape[-2]
    else:
        assert isinstance(groups, dict if family == "gemma3_text" else torch.Tensor)
    packed = policy.compute_logprobs(batch, temperature=1.0, token_budget=4096)
    owner = [0, 0, 1, 1]
    for i, (o, r) in enumerate(zip(owner, responses, strict=True)):
        expected = _plain(policy.model, prompts[o] + r, len(prompts[o]))
        torch.testing.assert_close(packed[i, : len(r)], expected, atol=1e-4, rtol=0)
    if not fits:  # the window matters here: the same model without it gives other log-probs
        from transformers import AutoModelForCausalLM

        unwindowed = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, sliding_window=10**6)
        o, r = owner[0], responses[0]
        assert (_plain(unwindowed, prompts[o] + r, len(prompts[o])) - packed[0, : len(r)]).abs().max() > 1e-4


def test_an_update_with_a_sliding_window_trains(sliding_model):
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    path, _ = sliding_model
    policy = PolicyModel(
        str(path), ModelConfig(path=str(path), dtype="float32"), ActorConfig(optim={"lr": 1e-3}), "cpu"
    )
    _, _, batch = _batch([12, 20], [30, 5, 25, 8], [0, 0, 1, 1])
    batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 4096)
    batch.advantages = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(1))
    m = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=30)
    assert m["actor/optimizer_steps"] == 1 and m["actor/grad_norm"] > 0


def test_the_kernel_takes_a_window_its_sequences_fit_in_and_refuses_one_they_do_not():
    """The shared-prefix kernel is exact for a sliding layer while every sequence of the row fits in the window (a
    row of many sequences may be far longer): it runs then, and refuses a window a sequence passes."""
    from plugrl.attention import PrefixGroup
    from plugrl_attention import attention_forward

    groups = [PrefixGroup(0, 4, (3, 5)), PrefixGroup(12, 6, (2,))]  # sequences of 7, 9 and 8 tokens; a row of 20
    q, k, v = (torch.randn(1, 2, 20, 8) for _ in range(3))
    out, _ = attention_forward(torch.nn.Module(), q, k, v, None, prefix_groups=groups, sliding_window=9)
    assert out.shape == (1, 20, 2, 8)
    with pytest.raises(ValueError, match=r"does not implement \{'sliding_window': 8\}"):
        attention_forward(torch.nn.Module(), q, k, v, None, prefix_groups=groups, sliding_window=8)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_flexattention_path_a_gpu_takes_lays_out_the_window_itself(sliding_model, monkeypatch):
    """Off the CPU, shared prompts go to FlexAttention with each layer's window (no dense masks, whatever the
    sequences' lengths). Run here on the CPU as a GPU would (eager FlexAttention): equal to one plain forward per
    sequence within 1e-4."""
    import torch.nn.attention.flex_attention as flex

    import plugrl_attention
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig

    monkeypatch.setattr(plugrl_attention, "uses_flex", lambda device_type: True)
    monkeypatch.setattr(flex, "_validate_device", lambda *args: None)
    path, _ = sliding_model
    policy = PolicyModel(str(path), ModelConfig(path=str(path), dtype="float32"), ActorConfig(), "cpu")
    prompts, responses, batch = _batch([12, 20], [30, 5, 25, 8], [0, 0, 1, 1])
    assert isinstance(policy._layout(policy._pack(batch, [0, 1, 2, 3])), list)
    packed = policy.compute_logprobs(batch, temperature=1.0, token_budget=4096)
    for i, (o, r) in enumerate(zip([0, 0, 1, 1], responses, strict=True)):
        expected = _plain(policy.model, prompts[o] + r, len(prompts[o]))
        torch.testing.assert_close(packed[i, : len(r)], expected, atol=1e-4, rtol=0)
