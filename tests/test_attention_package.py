"""The shared-prefix attention kernels are plugrl-attention's (plugins/attention), found through the entry-point group
plugrl.attention: the kernel's seam (plugrl.attention.prefix_kernels) finds them, a model with shared prompts runs
them under the attention name plugrl_sdpa, and without the package a packed row takes the dense mask, which is said
once, naming the package."""

from __future__ import annotations

import logging

import pytest
import torch

from plugrl import attention
from plugrl.actor import PolicyModel, TrainBatch
from plugrl.config import ActorConfig, ModelConfig

MISSING = (
    "shared-prefix attention kernels are in the package plugrl-attention, which is not installed: packed rows use "
    "a dense mask (slower, and L x L memory per row); pip install plugrl-attention (in a plugrl checkout: pip "
    "install -e plugins/attention)"
)


@pytest.fixture
def fresh_lookup():
    """The seam's lookup made again in this test, and again after it (it is cached per process)."""
    attention.prefix_kernels.cache_clear()
    yield
    attention.prefix_kernels.cache_clear()


@pytest.fixture
def without_the_package(hide_entry_points, fresh_lookup):
    """plugrl-attention's entry point gone, as where the package is not installed."""
    hide_entry_points(attention.GROUP)


def _policy(path, **actor) -> PolicyModel:
    return PolicyModel(
        str(path), ModelConfig(path=str(path), dtype="float32"), ActorConfig(**actor), torch.device("cpu")
    )


def _grouped_batch() -> TrainBatch:
    """Two prompts with 3 and 2 responses, as GRPO groups: a packed row shares each prompt."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 1000, (n,), generator=gen).tolist() for n in (5, 3)]
    groups = [0, 0, 0, 1, 1]
    seqs = [
        prompts[g] + torch.randint(5, 1000, (n,), generator=gen).tolist()
        for g, n in zip(groups, (4, 2, 6, 1, 3), strict=True)
    ]
    batch = TrainBatch.from_sequences(seqs, [len(prompts[g]) for g in groups])
    batch.group_ids = groups
    return batch


def test_the_kernels_are_plugrl_attentions_and_register_as_plugrl_sdpa(fresh_lookup):
    from transformers import AttentionInterface

    import plugrl_attention

    kernels = attention.prefix_kernels()
    assert kernels is plugrl_attention and attention.prefix_kernels() is kernels  # looked up once
    assert kernels.register() == "plugrl_sdpa"
    assert AttentionInterface()["plugrl_sdpa"] is plugrl_attention.attention_forward
    assert not kernels.uses_flex("cpu") and kernels.uses_flex("cuda")


def test_the_response_tiles_are_cut_once_per_group():
    """Every layer of a forward and the backward read a group's tiles: cut on the first read, found after (also by
    an equal group, as from a recomputation)."""
    from plugrl_attention import response_tiles

    group = attention.PrefixGroup(0, 4, (5, 130, 64), tile=64)
    tiles = response_tiles(group)
    assert response_tiles(group) is tiles and response_tiles(attention.PrefixGroup(0, 4, (5, 130, 64))) is tiles
    assert tiles.index.shape == (1 + 3 + 1, 64) and int(tiles.valid.sum()) == 5 + 130 + 64
    assert [rows.tolist() for rows, _ in tiles.bands] == [[2], [3]]  # the 2nd and 3rd tiles of the 130 tokens


def test_a_packed_row_without_the_package_uses_the_dense_mask_and_says_so_once(tiny_model, caplog, without_the_package):
    """A row that shares its prompts, through SDPA with a dense [1, 1, L, L] mask: the log-probs of one sequence per
    prompt copy (as the kernels give them, tests/test_actor.py); the line naming the package comes once per process,
    not once per model."""
    batch = _grouped_batch()
    with caplog.at_level(logging.WARNING, logger="plugrl.attention"):
        dense, again = _policy(tiny_model), _policy(tiny_model)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "plugrl.attention"]
    assert said == [(logging.WARNING, MISSING)]
    assert not dense.prefix_kernel and not again.prefix_kernel
    assert dense.model.config._attn_implementation == "sdpa"
    layout = dense._layout(dense._pack(batch, list(range(len(batch)))))
    assert isinstance(layout, torch.Tensor) and layout.dtype == torch.bool and layout.shape[:2] == (1, 1)
    got = dense.compute_logprobs(batch, temperature=1.0, token_budget=10_000)
    plain = _policy(tiny_model, share_prompt_prefix=False)
    expected = plain.compute_logprobs(batch, temperature=1.0, token_budget=10_000)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_without_the_package_a_run_without_shared_prompts_says_nothing(tiny_model, caplog, without_the_package):
    with caplog.at_level(logging.WARNING, logger="plugrl.attention"):
        policy = _policy(tiny_model, share_prompt_prefix=False)
    assert not policy.prefix_kernel
    assert not [r for r in caplog.records if r.name == "plugrl.attention"]
