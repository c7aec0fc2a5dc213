"""A collective batch reward, and the reward model sharded with FSDP2 over the ranks (``shard: true``).

The kernel part runs in this process: the reward runner calls a collective batch reward (``plugrl_collective``) in
every scoring round, with none of the round's items where none is routed to it, and
``RewardRunner.scoring_round`` makes a rank whose caller scored nothing take part. The plugin part runs two
processes under torchrun (gloo on CPU, ``tests/rm_shard_worker.py``): a reward model built here (a tiny random
llama with a one-output score head, ``tests/tiny_models.make_reward_model``) is sharded over both, the ranks
score rounds of 5 and 0, 3 and 2, 2 and 0 items (the last rank's items all for another reward), and the scores
equal those of the whole model in one process.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plugrl.config import RewardConfig
from plugrl.data import Sample
from plugrl.rewards import RewardError, RewardItem, RewardRunner, trl_reward
from plugrl.specs import Registry, RewardSpec
from plugrl_reward_model import Options, parse, release, reset_stats, reward_model, reward_model_spec
from rm_shard_worker import BUDGET, RESPONSES, ROUNDS, items_of

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory, tiny_model) -> Path:
    from tiny_models import make_reward_model

    return make_reward_model(tmp_path_factory.mktemp("reward_model") / "rm", tiny_model)


@pytest.fixture(autouse=True)
def _fresh():
    release()
    reset_stats()
    yield
    release()
    reset_stats()


# --------------------------------------------------------------------------- the kernel: collective batch rewards


def item(ds: str, completion: str = "an answer") -> RewardItem:
    return RewardItem(Sample("a prompt", ds, "gt", {}, {}, origin="test"), "a prompt", completion)


def recording(calls: list, name: str, *, collective: bool):
    def fn(prompts, completions, **columns):
        calls.append((name, list(completions)))
        return [1.0] * len(completions)

    fn.plugrl_batch = True
    fn.plugrl_collective = collective
    return fn


def rule(completion: str, ground_truth: str) -> float:
    return 0.5


def runner_of(*specs: RewardSpec) -> RewardRunner:
    return RewardRunner(Registry(rewards=list(specs)), RewardConfig(num_workers=0))


def test_a_collective_batch_reward_is_called_with_none_where_no_item_is_routed_to_it():
    calls: list = []
    with runner_of(
        RewardSpec("model", recording(calls, "model", collective=True), ("model",)),
        RewardSpec("plain", recording(calls, "plain", collective=False), ("plain",)),
        RewardSpec("rule", rule, ("rule",)),
    ) as runner:
        assert runner.collective
        out = runner.score([item("rule"), item("rule")])  # nothing here for either batch reward
        assert out.scores == [0.5, 0.5] and out.details[0] == {"error": False, "timeout": False, "rule": 0.5}
        assert calls == [("model", [])]  # the collective one is called with none; the plain one is not called
        calls.clear()
        runner.score([])
        assert calls == [("model", [])]
        calls.clear()
        out = runner.score([item("model", "x"), item("plain", "y")])
        assert calls == [("model", ["x"]), ("plain", ["y"])] and out.scores == [1.0, 1.0]
        assert runner.rounds == 3


def test_a_scoring_round_that_scored_nothing_joins_the_collective_rewards_with_none():
    calls: list = []
    with runner_of(RewardSpec("model", recording(calls, "model", collective=True), ("model",))) as runner:
        with runner.scoring_round():  # a rank with no items: its caller skips score()
            pass
        assert calls == [("model", [])] and runner.rounds == 1
        calls.clear()
        with runner.scoring_round():  # a rank with items: scored once, not again at the round's end
            runner.score([item("model", "x")])
        assert calls == [("model", ["x"])] and runner.rounds == 2


def test_without_a_collective_reward_nothing_changes():
    calls: list = []
    with runner_of(RewardSpec("plain", recording(calls, "plain", collective=False), ("plain",))) as runner:
        assert not runner.collective
        with runner.scoring_round():
            pass
        runner.score([])
        runner.score([item("plain", "x")])
        assert calls == [("plain", ["x"])]


def test_collective_rewards_run_in_registry_order_whatever_the_items_order():
    calls: list = []
    with runner_of(
        RewardSpec("a", recording(calls, "a", collective=True), ("a",)),
        RewardSpec("b", recording(calls, "b", collective=True), ("b",)),
    ) as runner:
        runner.score([item("b", "first"), item("a", "second")])
        runner.score([item("b", "only b")])
    assert calls == [("a", ["second"]), ("b", ["first"]), ("a", []), ("b", ["only b"])]


def test_a_collective_reward_that_fails_on_an_empty_round_is_logged(caplog):
    def broken(prompts, completions, **columns):
        raise RuntimeError("no model")

    broken.plugrl_batch = broken.plugrl_collective = True
    with runner_of(RewardSpec("broken", broken, ("broken",)), RewardSpec("rule", rule, ("rule",))) as runner:
        with caplog.at_level(logging.WARNING, logger="plugrl.rewards"):
            out = runner.score([item("rule")])
    assert out.scores == [0.5]
    assert "reward 'broken' failed on a round with no items for it on this rank: RuntimeError: no model" in caplog.text


def test_collective_on_a_reward_that_is_not_a_batch_reward_is_refused():
    def per_item(completion, ground_truth):
        return 1.0

    per_item.plugrl_collective = True
    with pytest.raises(RewardError) as e:
        runner_of(RewardSpec("per_item", per_item, ("x",)))
    assert "reward 'per_item'" in str(e.value) and "sets plugrl_collective but is not a batch reward" in str(e.value)
    assert "trl_reward(fn, collective=True)" in str(e.value)


def test_trl_reward_takes_collective():
    def fn(prompts, completions):
        return [0.0] * len(completions)

    assert trl_reward(fn, data_sources=["x"], collective=True).fn.plugrl_collective is True
    assert trl_reward(fn, data_sources=["x"]).fn.plugrl_collective is False
    calls: list = []

    def tracked(prompts, completions):
        calls.append(list(completions))
        return [0.0] * len(completions)

    with RewardRunner(
        Registry(rewards=[trl_reward(tracked, data_sources=["x"], collective=True)]), RewardConfig(num_workers=0)
    ) as runner:
        runner.score([])
    assert calls == [[]]


# --------------------------------------------------------------------------- the plugin in one process


def test_the_reward_model_is_a_collective_batch_reward():
    assert reward_model.plugrl_batch is True and reward_model.plugrl_collective is True


def test_no_items_unsharded_loads_nothing_and_scores_nothing(tiny_rm):
    from plugrl_reward_model import scoring

    assert reward_model([], []) == []  # not even configured (an unrouted round)
    assert reward_model([], [], path=str(tiny_rm), shard=True) == []  # one process: nothing to join
    assert scoring._SCORERS == {}


def test_shard_in_one_process_is_said_once_and_scores_as_the_whole_model(tiny_rm, caplog):
    prompts = [[{"role": "user", "content": "What is 2 + 2?"}], "Plain text:"]
    completions = [[{"role": "assistant", "content": "4"}], " plain"]
    whole = [r["raw"] for r in reward_model(prompts, completions, path=str(tiny_rm), dtype="float32")]
    with caplog.at_level(logging.WARNING, logger="plugrl.reward_model"):
        for _ in range(2):
            got = reward_model(prompts, completions, path=str(tiny_rm), dtype="float32", shard=True)
            assert [r["raw"] for r in got] == whole
    said = [r for r in caplog.records if "shard: true has no effect in a single process" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "reward.options.reward_model.shard" in said[0].getMessage() and "torchrun" in said[0].getMessage()


def test_shard_with_a_separate_process_is_refused_naming_the_keys(tiny_rm):
    with pytest.raises(ValueError) as e:
        parse({"path": str(tiny_rm), "shard": True, "process": "separate"})
    assert str(e.value).startswith("reward.options.reward_model: shard: true shards the model over the trainer's")
    assert "set process: trainer, or shard: false" in str(e.value)
    assert Options(path="x").shard is False


# --------------------------------------------------------------------------- the plugin sharded over two processes


def unsharded_scores(rm_path: Path, budget: int) -> list[float]:
    """The whole model in this process scoring every item of the worker, through the runner."""
    opts = Options(path=str(rm_path), dtype="float32", max_tokens_per_batch=budget).model_dump(mode="json")
    with RewardRunner(
        Registry(rewards=[reward_model_spec("chat")]), RewardConfig(options={"reward_model": opts}, num_workers=0)
    ) as runner:
        return runner.score(items_of({"chat": [0, 1, 2, 3, 4]})).scores


@pytest.mark.slow
def test_two_ranks_score_uneven_rounds_with_a_sharded_reward_model(tiny_rm, tmp_path):
    out = tmp_path / "scores"
    cmd = [*TORCHRUN, str(ROOT / "tests" / "rm_shard_worker.py"), str(tiny_rm), str(out)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)  # a deadlock fails, not hangs
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads(Path(f"{out}.rank_{r}.json").read_text()) for r in (0, 1)]
    want = unsharded_scores(tiny_rm, BUDGET)
    for rank, got in enumerate(ranks):
        assert got["runner_rounds"] == len(ROUNDS)  # every round scored on every rank, an empty one included
        for share, done in zip(ROUNDS, got["rounds"], strict=True):
            held = [[ds, i] for ds, idxs in share.get(rank, {}).items() for i in idxs]
            assert done["items"] == held and done["errors"] == 0
            expected = [want[i] if ds == "chat" else float(len(RESPONSES[i])) for ds, i in held]
            assert done["scores"] == pytest.approx(expected, abs=1e-5), (rank, share)
    # the same forward passes on both ranks in every round (rank 1's are dummies where it has fewer)
    assert ranks[0]["passes"] == ranks[1]["passes"], ranks
    assert ranks[0]["passes"] == [3, 2, 2]  # rank 1: 3 and 2 dummies with no items of its own, 1 beside its own
    # each rank holds about half of the model's parameters (FSDP2 shards every tensor's rows)
    whole = ranks[0]["whole"]
    assert ranks[1]["whole"] == whole and ranks[0]["local"] + ranks[1]["local"] == whole
    for got in ranks:
        assert abs(got["local"] - whole / 2) <= 0.01 * whole, (got["local"], whole)
    print(f"2-rank sharded reward model: {elapsed:.1f}s, shards {ranks[0]['local']} + {ranks[1]['local']} of {whole}")


@pytest.mark.slow
def test_two_rank_grpo_trains_on_a_sharded_reward_model(tiny_model, tiny_rm, tmp_path):
    """`plugrl train` under torchrun, 2 ranks, 2 steps, the reward model sharded over them beside countdown's rule
    reward, scoring every round: the training rounds, ReMax's greedy baselines and validation, where rank 1's share
    of the one validation prompt is empty (it validates nothing, and joins the reward model's collectives)."""
    from plugrl_countdown.problems import countdown_dataset
    from test_e2e import tiny_overrides

    val = tmp_path / "val.jsonl"
    rows = countdown_dataset("test", size=1, min_numbers=2, max_numbers=2, max_number=10, max_target=20, ops="+-")
    val.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [
        *TORCHRUN,
        "-m",
        "plugrl.cli",
        "train",
        "examples/countdown_grpo.yaml",
        *tiny_overrides(tiny_model, tmp_path, 2),
        "plugins=[countdown,reward_model,advantages]",
        "reward.extra=[reward_model]",
        f"reward.options.reward_model={{path: {tiny_rm}, dtype: float32, shard: true}}",
        "algorithm.adv_estimator=remax",  # a greedy baseline: one more scoring round a step
        "data.train_batch_size=4",
        f"data.val_files=[{val}]",
        "trainer.val_before_train=true",
        "trainer.test_freq=2",
        "rollout.val_kwargs.n=1",
        "trainer.save_freq=0",
        "trainer.dist_timeout_s=120",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    run_dir = tmp_path / "e2e"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]  # step 0: validation before training
    assert all("reward/reward_model/mean" in m and m["reward/errors"] == 0 for m in lines[1:])
    assert "val/countdown/score_mean" in lines[0] and "val/countdown/score_mean" in lines[2]
    assert len((run_dir / "validation" / "step_000002.jsonl").read_text().splitlines()) == 1  # rank 0's, gathered
    assert "sharded with FSDP2 over 2 ranks" in proc.stderr + proc.stdout
