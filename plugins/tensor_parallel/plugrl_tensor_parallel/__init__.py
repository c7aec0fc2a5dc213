"""Tensor parallelism of the trained models (``actor.tp_size`` > 1): what the kernel calls through its seam
:mod:`plugrl.parallel` (entry-point group ``plugrl.tensor_parallel``, this module).

- :func:`parallelize`: the policy, its reference or the critic split over the mesh's "tp" dimension, in place,
  before FSDP2 shards it over "dp" (:mod:`plugrl_tensor_parallel.plan`).
- :func:`vocab_parallel`: what the actor computes log-probs and entropy with (its ``vocab``) when the LM head's
  logits are vocabulary-sharded (:mod:`plugrl_tensor_parallel.vocab`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl_tensor_parallel.plan import check_model, parallelize
from plugrl_tensor_parallel.vocab import VocabParallel, vocab_parallel_entropy, vocab_parallel_logprobs

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "VocabParallel",
    "check_model",
    "parallelize",
    "vocab_parallel",
    "vocab_parallel_entropy",
    "vocab_parallel_logprobs",
]


def vocab_parallel(group: ProcessGroup) -> VocabParallel:
    """:mod:`plugrl.algorithms`' log-prob and entropy functions for logits sharded by vocabulary over ``group``."""
    return VocabParallel(group)
