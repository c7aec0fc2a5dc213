"""The policy model: packed log-probs equal per-sequence ones, micro-batching, and an update that learns."""

from __future__ import annotations

import pytest
import torch

from plugrl.actor import PolicyModel, TrainBatch, split_micro_batches
from plugrl.config import ActorConfig, ModelConfig


def _batch(seqs, plens):
    return TrainBatch.from_sequences(seqs, plens)


def _policy(path, **actor):
    return PolicyModel(
        str(path), ModelConfig(path=str(path), dtype="float32"), ActorConfig(**actor), torch.device("cpu")
    )


def test_split_micro_batches_respects_budget_and_covers_all():
    lengths = [50, 10, 40, 30, 30, 5, 100]
    parts = split_micro_batches(lengths, token_budget=100)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= 100 for p in parts)
    # 265 tokens need at least 3 bins of 100
    assert len(parts) >= 3
    # a sequence over the budget gets its own micro-batch; min_count pads with empty bins
    parts = split_micro_batches([150, 20], token_budget=100, min_count=4)
    assert [0] in parts and len(parts) == 4


def test_packed_logprobs_equal_unpacked(tiny_model):
    torch.manual_seed(0)
    policy = _policy(tiny_model)
    seqs = [torch.randint(5, 1000, (n,)).tolist() for n in (7, 12, 5)]
    plens = [3, 8, 2]
    batch = _batch(seqs, plens)
    packed = policy.compute_logprobs(batch, temperature=1.0, token_budget=10_000)
    model = policy.model
    for i, (s, p) in enumerate(zip(seqs, plens, strict=True)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([s])).logits[0].float()
        expected = torch.log_softmax(logits, -1)[p - 1 : len(s) - 1].gather(-1, torch.tensor(s[p:])[:, None])[:, 0]
        torch.testing.assert_close(packed[i, : len(s) - p], expected, atol=1e-5, rtol=1e-5)
        assert torch.all(packed[i, len(s) - p :] == 0)
    # a tight budget (one sequence per micro-batch) gives the same numbers
    tight = policy.compute_logprobs(batch, temperature=1.0, token_budget=12)
    torch.testing.assert_close(tight, packed, atol=1e-5, rtol=1e-5)
    # temperature divides the logits, as verl does
    hot = policy.compute_logprobs(batch, temperature=2.0, token_budget=10_000)
    assert not torch.allclose(hot, packed)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")  # the gradient probe
def test_the_lm_head_runs_only_at_the_policys_tokens(tiny_model):
    """Multi-turn rows (environment tokens inside the response): the LM head and log-softmax run only where
    the policy wrote, the log-probs there equal a pass over every token, and the rest are 0. Also with
    shared prompts and in the update, whose gradient is the same as with the full head."""
    torch.manual_seed(0)
    policy = _policy(tiny_model, optim={"lr": 1e-3})
    prompt = torch.randint(5, 1000, (4,)).tolist()
    seqs = [prompt + torch.randint(5, 1000, (n,)).tolist() for n in (9, 6, 3)]
    masks = [[1, 1, 0, 0, 0, 1, 1, 0, 1], None, [0, 1, 1]]  # row 1: a single-turn row in the same batch
    full = TrainBatch.from_sequences(seqs, [4, 4, 4], group_ids=[0, 0, 0])
    multi = TrainBatch.from_sequences(seqs, [4, 4, 4], policy_masks=masks, group_ids=[0, 0, 0])
    rows_seen: list[int] = []
    hook = policy.model.lm_head.register_forward_hook(lambda m, i, o: rows_seen.append(o.shape[-2]))
    try:
        everywhere = policy.compute_logprobs(full, 1.0, 10_000)
        at_policy = policy.compute_logprobs(multi, 1.0, 10_000)
    finally:
        hook.remove()
    assert rows_seen == [9 + 6 + 3, 5 + 6 + 2]  # 13 policy tokens of 18
    trained = multi.response_mask.bool()
    torch.testing.assert_close(at_policy[trained], everywhere[trained], atol=1e-5, rtol=1e-5)
    assert torch.all(at_policy[~trained] == 0) and torch.all(everywhere[~trained][:3] != 0)
    # the update's gradient is the full head's under the same mask
    grads = []
    params = [p for p in policy.model.parameters() if p.requires_grad]
    policy.optimizer.step = lambda *a, **k: grads.append([p.grad.clone() for p in params])  # the weights stay
    for with_masks in (False, True):
        b = TrainBatch.from_sequences(seqs, [4, 4, 4], policy_masks=masks if with_masks else None, group_ids=[0] * 3)
        b.response_mask = multi.response_mask.clone()  # both train the same tokens
        b.advantages = torch.tensor([1.0, -1.0, 0.5])[:, None] * b.response_mask
        b.old_logprobs = at_policy.clone()
        policy.update(b, num_mini_batches=1, temperature=1.0, norm_length=9)
    assert len(grads) == 2 and any(g.abs().sum() > 0 for g in grads[1])
    for full_head, policy_head in zip(*grads, strict=True):
        torch.testing.assert_close(policy_head, full_head, atol=1e-6, rtol=1e-4)


def test_update_raises_logprob_of_advantaged_response(tiny_model):
    torch.manual_seed(0)
    policy = _policy(tiny_model, optim={"lr": 1e-3})
    prompt = [10, 11, 12]
    good, bad = [40, 41, 42], [50, 51, 52]
    batch = _batch([prompt + good, prompt + bad], [3, 3])
    before = policy.compute_logprobs(batch, 1.0, 1000)
    batch.advantages = torch.tensor([[1.0] * 3, [-1.0] * 3])
    metrics = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=3)
    after = policy.compute_logprobs(batch, 1.0, 1000)
    assert metrics["actor/optimizer_steps"] == 1 and metrics["actor/grad_norm"] > 0
    assert after[0].sum() > before[0].sum()  # the positive-advantage response got likelier
    assert after[1].sum() < before[1].sum()
    # on-policy first pass: ratio 1, nothing clipped
    assert metrics["actor/pg_clipfrac"] == 0.0


def _grouped_batch():
    """Two prompts (5 and 3 tokens) with 3 and 2 responses of different lengths, as GRPO groups."""
    torch.manual_seed(1)
    prompts = [torch.randint(5, 1000, (5,)).tolist(), torch.randint(5, 1000, (3,)).tolist()]
    groups = [0, 0, 0, 1, 1]
    seqs = [prompts[g] + torch.randint(5, 1000, (n,)).tolist() for g, n in zip(groups, (4, 2, 6, 1, 3), strict=True)]
    batch = _batch(seqs, [len(prompts[g]) for g in groups])
    batch.group_ids = groups
    return batch


def test_shared_prompt_prefix_gives_the_same_logprobs_and_gradients(tiny_model):
    batch = _grouped_batch()
    shared = _policy(tiny_model)
    plain = _policy(tiny_model, share_prompt_prefix=False)
    assert shared.prefix_kernel  # plugrl-attention's kernels, against plain per-sequence causal SDPA
    idx = list(range(len(batch)))
    packed_shared = shared._pack(batch, idx).ids
    packed_plain = plain._pack(batch, idx).ids
    assert len(packed_shared) == 5 + 3 + (4 + 2 + 6 + 1 + 3)  # each prompt once
    assert len(packed_plain) == 3 * 5 + 2 * 3 + (4 + 2 + 6 + 1 + 3)

    weights = torch.randn(batch.response_mask.shape)
    results = []
    for policy in (shared, plain):
        lp, _ = policy._forward(batch, idx, 1.0, with_entropy=False)
        (lp * weights * batch.response_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters()}
        results.append((lp.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    for name, g in results[0][1].items():
        torch.testing.assert_close(g, results[1][1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_shared_prefix_micro_batches_keep_groups_and_split_big_ones(tiny_model):
    batch = _grouped_batch()
    policy = _policy(tiny_model)
    units, costs = policy._units(batch, list(range(len(batch))), budget=100)
    assert units == [[0, 1, 2], [3, 4]] and costs == [5 + 12, 3 + 4]
    # a budget smaller than a group splits it, each part paying for its own prompt copy
    units, costs = policy._units(batch, list(range(len(batch))), budget=10)
    assert units == [[0], [1], [2], [3, 4]] and costs == [5 + 4, 5 + 2, 5 + 6, 3 + 4]  # 5+4+2 > 10
    lp_small = policy.compute_logprobs(batch, 1.0, token_budget=10)
    lp_big = policy.compute_logprobs(batch, 1.0, token_budget=1000)
    torch.testing.assert_close(lp_small, lp_big, atol=1e-5, rtol=1e-5)


class _OOMAbove:
    """Wraps a model's forward: raises the out-of-memory error a GPU raises when a packed row has
    more than ``limit`` tokens, or at the forward calls numbered in ``at_calls`` (from 1). A fake,
    because this machine has no GPU memory to exhaust; the retry runs through the same code path as
    a real ``torch.OutOfMemoryError``."""

    def __init__(self, model, limit: int | None = None, at_calls: tuple[int, ...] = ()):
        self.forward, self.limit, self.at_calls = model.forward, limit, at_calls
        self.calls = self.raised = 0
        model.forward = self

    def __call__(self, *args, input_ids, **kwargs):
        self.calls += 1
        if (self.limit is not None and input_ids.shape[1] > self.limit) or self.calls in self.at_calls:
            self.raised += 1
            raise torch.OutOfMemoryError(f"CUDA out of memory (test: call {self.calls}, {input_ids.shape[1]} tokens)")
        return self.forward(*args, input_ids=input_ids, **kwargs)


def test_out_of_memory_halves_the_token_budget_and_retries(tiny_model, caplog):
    """A forward that fails above 17 tokens: compute_logprobs at budget 64 fails twice (64 and 32
    pack a 24-token row) and goes on at 16 (each prompt group alone), and so does the update after it.
    The results equal those of a run configured with 16 from the start."""
    batch = _grouped_batch()  # packed units of 17 and 7 tokens
    batch.advantages = torch.randn(batch.response_mask.shape)
    results = []
    for budget, limit in ((16, None), (64, 17)):
        torch.manual_seed(0)
        policy = _policy(tiny_model, optim={"lr": 1e-3}, ppo_max_token_len_per_gpu=8192 if limit else 16)
        oom = _OOMAbove(policy.model, limit) if limit else None
        lp = policy.compute_logprobs(batch, 1.0, token_budget=budget)
        metrics = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=4)
        weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        results.append((lp, metrics, weights, policy, oom))
    (lp0, m0, w0, _, _), (lp1, m1, w1, policy, oom) = results
    assert oom.raised == 2 and policy.budget_cap == 16 and m1["actor/oom_retries"] == 2
    assert m0["actor/oom_retries"] == 0
    assert "out of memory in a micro-batch of at most 64 tokens: retrying with 32" in caplog.text
    # the retried passes compute the same numbers: nothing of the failed attempts leaked into them
    torch.testing.assert_close(lp1, lp0, atol=0, rtol=0)
    assert m1["actor/pg_loss"] == m0["actor/pg_loss"]
    for name, w in w0.items():
        torch.testing.assert_close(w1[name], w, atol=0, rtol=0)


def test_out_of_memory_in_the_update_discards_the_partial_gradient(tiny_model):
    """At budget 16 the update runs 3 micro-batches; the second forward fails after the first one's
    backward ran. Its gradient must not reach the optimizer: the retry at 8 tokens gives the weights
    of an update run at 8 from the start."""
    batch = _grouped_batch()
    batch.advantages = torch.randn(batch.response_mask.shape)
    weights = []
    for budget, fail in ((8, ()), (16, (2,))):
        torch.manual_seed(0)
        policy = _policy(tiny_model, optim={"lr": 1e-3}, ppo_max_token_len_per_gpu=budget)
        oom = _OOMAbove(policy.model, at_calls=fail)
        m = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=4)
        weights.append({n: p.detach().clone() for n, p in policy.model.named_parameters()})
    assert oom.raised == 1 and m["actor/oom_retries"] == 1 and m["actor/optimizer_steps"] == 1
    assert policy.budget_cap == 8 and oom.calls == 1 + 1 + 4  # a good micro-batch, the failed one, 4 at 8
    for name, w in weights[0].items():
        torch.testing.assert_close(weights[1][name], w, atol=0, rtol=0)


def test_out_of_memory_that_no_budget_fixes_stops_with_a_clear_error(tiny_model):
    import pytest

    from plugrl.actor import TrainingError

    batch = _grouped_batch()
    policy = _policy(tiny_model)
    _OOMAbove(policy.model, 1)
    with pytest.raises(TrainingError, match="micro-batches of 1 token"):
        policy.compute_logprobs(batch, 1.0, token_budget=64)


def test_critic_values_are_deterministic(tiny_model):
    """The value head has no dropout (token-classification heads default to 0.1): the values GAE uses at
    rollout time must not change between two calls on the same batch."""
    from plugrl.config import CriticConfig
    from plugrl.critic import ValueModel

    critic = ValueModel(
        str(tiny_model), ModelConfig(path=str(tiny_model), dtype="float32"), CriticConfig(), torch.device("cpu")
    )
    assert critic.model.training  # trainable, in train mode: dropout would be active if it existed
    batch = _batch([list(range(10, 22)), list(range(30, 39))], [5, 4])
    torch.testing.assert_close(critic.compute_values(batch), critic.compute_values(batch), rtol=0, atol=0)
