"""A local, unpackaged plugin (loaded as `toy_plugin:`) whose rewards vary within a group even for a random model."""

import plugrl
from plugrl.rewards import trl_reward


@plugrl.reward("toy")
def parity(completion: str) -> float:
    return float(len(completion) % 2)


def short_answer(completions, **kwargs):
    """A TRL-style reward function, used unchanged: a batch in, one float per completion out."""
    return [1.0 if len(c) < 20 else 0.0 for c in completions]


short = trl_reward(short_answer, data_sources=["toy"], weight=0.5)
