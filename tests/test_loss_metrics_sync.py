"""The update's metrics leave the device once per mini-batch, not with a host sync per metric per micro-batch, and
are the same numbers bit for bit as when every loss metric was a Python float.

On a GPU each ``.item()`` / ``float()`` of a device tensor waits for the queue to drain; here (CPU) the reads are
counted instead: the number of tensor-to-Python reads an update makes does not grow with its micro-batches."""

from __future__ import annotations

import pytest
import torch

from plugrl import algorithms
from plugrl.actor import PolicyModel, TrainBatch
from plugrl.config import ActorConfig, CriticConfig, ModelConfig
from plugrl.policy_losses import builtin_loss


def _batch() -> TrainBatch:
    """Two prompts with 3 and 2 responses of different lengths (GRPO groups), advantages and old log-probs."""
    torch.manual_seed(1)
    prompts = [torch.randint(5, 1000, (5,)).tolist(), torch.randint(5, 1000, (3,)).tolist()]
    groups = [0, 0, 0, 1, 1]
    seqs = [prompts[g] + torch.randint(5, 1000, (n,)).tolist() for g, n in zip(groups, (4, 2, 6, 1, 3), strict=True)]
    batch = TrainBatch.from_sequences(seqs, [len(prompts[g]) for g in groups])
    batch.group_ids = groups
    batch.advantages = torch.randn(batch.response_mask.shape)
    batch.old_logprobs = -torch.rand(batch.response_mask.shape)  # a ratio away from 1: clipping happens
    batch.ref_logprobs = -torch.rand(batch.response_mask.shape)
    return batch


def _policy(path, budget: int) -> PolicyModel:
    torch.manual_seed(0)
    actor = ActorConfig(
        optim={"lr": 1e-3}, ppo_max_token_len_per_gpu=budget, entropy_coeff=0.01, use_kl_loss=True, clip_ratio=0.1
    )
    return PolicyModel(str(path), ModelConfig(path=str(path), dtype="float32"), actor, torch.device("cpu"))


def _update(policy: PolicyModel, loss=None) -> dict[str, float]:
    return policy.update(_batch(), num_mini_batches=2, temperature=1.0, norm_length=6, policy_loss=loss)


def _as_floats(loss):
    """A registered loss as plugins wrote them before: every metric a Python float (a host sync each)."""

    def floats(*args, **kwargs):
        value, metrics = loss(*args, **kwargs)
        return value, {k: float(v) for k, v in metrics.items()}

    return floats


def test_metrics_equal_those_of_float_metrics_bit_for_bit(tiny_model):
    kernel = _update(policy := _policy(tiny_model, 16))
    old_way = _update(other := _policy(tiny_model, 16), _as_floats(builtin_loss("vanilla")))
    assert kernel == old_way  # every metric, exactly
    assert kernel["actor/pg_clipfrac"] > 0 and kernel["actor/kl_loss"] != 0
    for (name, p), q in zip(policy.model.named_parameters(), other.model.parameters(), strict=True):
        assert torch.equal(p, q), name


class _Reads:
    """Counts tensor-to-Python reads (.item(), float(), .tolist()): the host syncs of a device tensor."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("item", "tolist", "__float__"):
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _original=original, **k):
                self.count += 1
                return _original(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)


def _reads_of_one_update(path, what: str, budget: int, monkeypatch) -> int:
    """Tensor-to-Python reads made by one update of the policy or the critic at micro-batch token ``budget``."""
    if what == "actor":
        policy = _policy(path, budget)
        with monkeypatch.context() as m:
            reads = _Reads(m)
            _update(policy)
        return reads.count
    from plugrl.critic import ValueModel

    torch.manual_seed(0)
    cfg = CriticConfig(optim={"lr": 1e-3}, ppo_max_token_len_per_gpu=budget)
    critic = ValueModel(str(path), ModelConfig(path=str(path), dtype="float32"), cfg, torch.device("cpu"))
    batch = _batch()
    batch.returns, batch.old_values = torch.randn(batch.response_mask.shape), torch.zeros(batch.response_mask.shape)
    with monkeypatch.context() as m:
        reads = _Reads(m)
        critic.update(batch, num_mini_batches=2, epochs=1, norm_length=6)
    return reads.count


@pytest.mark.parametrize("what", ["actor", "critic"])
def test_the_host_reads_the_metrics_once_per_mini_batch_however_many_micro_batches(tiny_model, monkeypatch, what):
    counts = {budget: _reads_of_one_update(tiny_model, what, budget, monkeypatch) for budget in (64, 8)}
    assert counts[8] == counts[64], f"tensor reads grew with the micro-batches (budget: reads): {counts}"


def test_a_loss_outside_the_update_still_returns_floats():
    mask = torch.ones(2, 3)
    _, metrics = algorithms.policy_loss(
        -torch.rand(2, 3), -torch.rand(2, 3), torch.randn(2, 3), mask, clip_low=0.2, clip_high=0.2
    )
    assert all(type(v) is float for v in metrics.values()), metrics
    with algorithms.metrics_as_tensors():
        _, metrics = algorithms.policy_loss(
            -torch.rand(2, 3), -torch.rand(2, 3), torch.randn(2, 3), mask, clip_low=0.2, clip_high=0.2
        )
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values()), metrics
