"""The policy model: packed log-probs equal per-sequence ones, micro-batching, and an update that learns."""

from __future__ import annotations

import torch

from plugrl.actor import PolicyModel, TrainBatch, split_micro_batches
from plugrl.config import ActorConfig, ModelConfig


def _batch(seqs, plens):
    rlens = [len(s) - p for s, p in zip(seqs, plens, strict=True)]
    mask = torch.zeros(len(seqs), max(rlens))
    for i, n in enumerate(rlens):
        mask[i, :n] = 1
    return TrainBatch(sequences=seqs, prompt_lens=plens, response_lens=rlens, response_mask=mask)


def _policy(path, **actor):
    return PolicyModel(str(path), ModelConfig(path=str(path)), ActorConfig(**actor), torch.device("cpu"))


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
