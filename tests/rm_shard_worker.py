"""Run by tests/plugins/test_reward_model_sharded.py under torchrun (2 processes, gloo on CPU): the reward model
with ``shard: true``, scored through the kernel's reward runner in rounds where the ranks hold different numbers
of items, none included. Each rank writes what it scored, how many forward passes it ran in each round and the
size of its shard to ``OUT.rank_R.json``.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/rm_shard_worker.py RM_PATH OUT
"""

from __future__ import annotations

import json
import sys

from plugrl.config import RewardConfig
from plugrl.data import Sample
from plugrl.dist import exit_worker, init_distributed
from plugrl.rewards import RewardItem, RewardRunner
from plugrl.specs import Registry, RewardSpec
from plugrl_reward_model import Options, ShardedScorer, reward_model_spec, scorer, shard_numel

PROMPTS: list = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Write one sentence about the sea, please, in plain words."}],
    [{"role": "user", "content": "Name a prime number."}],
    "Plain text prompt without a chat template:",
    [{"role": "user", "content": "Say hello."}],
]
RESPONSES = [
    "4",
    "The sea is wide and grey, and it moves all day under the wind that comes from the west.",
    "Seven is a prime number, and so is eleven.",
    " an answer in plain text",
    "Hello there, and a good day to you.",
]
# the items each rank holds in each round (indices into PROMPTS/RESPONSES); "rule": items of a data source that
# only a rule reward scores, so the reward model gets none of that rank's items
ROUNDS: list[dict[int, dict[str, list[int]]]] = [
    {0: {"chat": [0, 1, 2, 3, 4]}, 1: {}},  # 5 and 0
    {0: {"chat": [0, 1, 2]}, 1: {"chat": [3, 4]}},  # 3 and 2
    {0: {"chat": [1, 4]}, 1: {"rule": [0, 2]}},  # 2 and 0 (rank 1 scores items, none of them the reward model's)
]
# tokens per forward pass (the texts have 14 to 66 tokens): rank 0 needs 3, 2 and 2 passes (some of two padded
# texts), rank 1 none, 1 (its two texts padded together) and none
BUDGET = 100


def rule(completion: str, ground_truth: str) -> float:
    return float(len(completion))


def items_of(share: dict[str, list[int]]) -> list[RewardItem]:
    out = []
    for ds, idxs in share.items():
        for i in idxs:
            p, r = PROMPTS[i], RESPONSES[i]
            out.append(RewardItem(Sample(p, ds, "", {}, {"prompt": p}, origin=f"item {i}"), str(p), r))
    return out


def main(rm_path: str, out: str) -> None:
    info = init_distributed("cpu", timeout_s=120)  # a rank left waiting fails the job in 2 minutes, not 30
    options = Options(path=rm_path, dtype="float32", shard=True, max_tokens_per_batch=BUDGET)
    cfg = RewardConfig(options={"reward_model": options.model_dump(mode="json")}, num_workers=0)
    registry = Registry(rewards=[reward_model_spec("chat"), RewardSpec("rule", rule, ("rule",))])
    loaded = scorer(options)  # as plugrl_run_start loads it: on every rank, a collective
    assert isinstance(loaded, ShardedScorer), type(loaded)
    local, whole = shard_numel(loaded.model)
    passes: list[int] = []
    count = {"passes": 0}
    logits = loaded._logits

    def counted(rows):
        count["passes"] += 1
        return logits(rows)

    loaded._logits = counted
    rounds = []
    with RewardRunner(registry, cfg) as runner:
        for share in ROUNDS:
            items = items_of(share.get(info.rank, {}))
            before = count["passes"]
            # as the trainer scores: a rank with no items skips score(); scoring_round makes it join the round
            with runner.scoring_round():
                scored = runner.score(items) if items else None
            passes.append(count["passes"] - before)
            rounds.append(
                {
                    "items": [[it.sample.data_source, RESPONSES.index(it.completion)] for it in items],
                    "scores": [] if scored is None else scored.scores,
                    "errors": 0 if scored is None else scored.metrics["reward/errors"],
                }
            )
        runs = runner.rounds
    with open(f"{out}.rank_{info.rank}.json", "w") as f:
        json.dump({"rounds": rounds, "passes": passes, "local": local, "whole": whole, "runner_rounds": runs}, f)
    exit_worker()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
