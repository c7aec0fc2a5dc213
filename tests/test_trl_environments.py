"""TRL's ``environment_factory`` classes train unchanged (plugrl.rollout.adapters.trl_environment), on the
kernel parts they need: tools that are methods of the episode's environment (run in the trainer's process,
where its state lives), a first observation added to the prompt, and an environment's ``reward()`` that
scores every episode however it ended, so its data source needs no reward function.

The TRL-style classes are written here as TRL's docs describe them (``reset(**row)``, public methods as
tools, ``get_reward()``); TRL itself is not imported, as the adapter needs none of it."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
import time

import pytest

from episode_helpers import tool_call
from plugrl.data import Sample
from plugrl.rollout.adapters import trl_environment
from plugrl.rollout.environment import Environment, EnvStart, EnvStep
from plugrl.rollout.tools import ToolCall
from plugrl.rollout.types import Rollout
from plugrl.specs import EnvironmentSpec
from plugrl_tools.authoring import is_importable, make_tool
from plugrl_tools.executor import call_in_process
from test_multiturn import SAMPLING, _runner, _sample, _start
from tiny_runs import train_two_steps


class Wallet:
    """A TRL environment: the model deposits until the balance is the row's target."""

    def reset(self, **row):
        self.target = row["target"]
        self.balance = 0
        return f" Reach {self.target}."

    def deposit(self, amount: int) -> int:
        """Put money in the wallet.

        Args:
            amount: How much to add; must be positive.
        """
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount
        return self.balance

    def _audit(self) -> None:  # private: not a tool
        raise AssertionError("never offered")

    def get_reward(self) -> float:
        return 1.0 if self.balance == self.target else 0.0


def _wallet_sample(i: int, target: int) -> Sample:
    return Sample(
        prompt=[{"role": "user", "content": f"Wallet {i}."}],
        data_source="wallet",
        ground_truth="",
        row={"prompt": [{"role": "user", "content": f"Wallet {i}."}], "target": target},
        origin=f"row {i}",
    )


def _scripted(tok, replies: dict[str, list[str]]):
    """An engine that answers each episode (found by the text of its first message) with its next reply."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(prompts, sampling):
        out = []
        for p in prompts:
            key = next(k for k in replies if k in tok.decode(p))
            ids = tok(replies[key].pop(0), add_special_tokens=False)["input_ids"] + [eos]
            out.append([Rollout(list(p), ids[: sampling.max_tokens], None, "stop")])
        return out

    return type("Engine", (), {"generate": staticmethod(generate)})()


def test_a_trl_environment_trains_through_the_kernels_contract(smol_tokenizer):
    """Two episodes of one TRL class at once: each has its own instance and state, reset with its row; the
    public methods are the tools (not reset, get_reward, _audit); an exception is the tool's answer; the
    episode ends at the first reply without a call; get_reward() is its score."""
    tok = smol_tokenizer
    spec = trl_environment(Wallet)
    assert spec.name == "Wallet" and spec.scores_episodes
    engine = _scripted(
        tok,
        {
            "Wallet 0": [tool_call("deposit", amount=2), tool_call("deposit", amount=1), "Done."],
            "Wallet 1": [tool_call("deposit", amount=-5) + tool_call("deposit", amount=4), "Done."],
        },
    )
    runner, _, _ = _runner(engine, tok, turn_tokens=64, max_turns=4)
    starts = [_start(tok, _wallet_sample(0, 3), spec.factory), _start(tok, _wallet_sample(1, 3), spec.factory)]
    (r0, c0), (r1, c1) = runner.run(starts, SAMPLING)
    assert (c0.finish, c0.error, c1.finish, c1.error) == ("done", None, "done", None)
    assert c0.messages[1]["content"] == "Wallet 0. Reach 3."  # reset()'s observation ends the prompt
    assert "Reach 3." in tok.decode(r0.prompt_ids)
    system = c0.messages[0]["content"]
    assert '"name": "deposit"' in system and "_audit" not in system and "get_reward" not in system
    assert "reset" not in system.split("<tools>")[-1]
    tool_answers = [m["content"] for m in c0.messages if m["role"] == "tool"]
    assert tool_answers == ["2", "3"]  # the instance kept its balance between turns
    assert c0.reward == 1.0 and c0.tool_calls == 2 and c0.tool_errors == 0
    assert [m["content"] for m in c1.messages if m["role"] == "tool"] == [
        "Error: ValueError: amount must be positive",
        "4",
    ]
    assert c1.reward == 0.0 and c1.tool_errors == 1  # its own wallet: 4, not 3 + 4


def test_reward_scores_an_episode_however_it_ended(smol_tokenizer):
    """reward() runs after an episode that max_turns cut (step gave no reward), not after one its environment
    failed; a reward() that raises or returns a non-number ends its episode as an error."""
    tok = smol_tokenizer

    class Counts(Environment):
        def __init__(self, value=0.25):
            self.turns, self.value = 0, value

        def step(self, turn):
            self.turns += 1
            return EnvStep(messages=[{"role": "user", "content": "more"}])

        async def reward(self):
            return self.value * self.turns

    class BadReward(Counts):
        def reward(self):
            return "high"

    class Fails(Counts):
        def step(self, turn):
            raise RuntimeError("boom")

    engine = _scripted(tok, {f"question {i}": ["a", "b"] for i in range(3)})
    runner, _, _ = _runner(engine, tok, max_turns=2)
    starts = [_start(tok, _sample(0), Counts), _start(tok, _sample(1), BadReward), _start(tok, _sample(2), Fails)]
    (_, cut), (_, bad), (_, failed) = runner.run(starts, SAMPLING)
    assert (cut.finish, cut.reward) == ("max_turns", 0.5)
    assert bad.finish == "error" and "reward() failed: TypeError" in bad.error and bad.reward is None
    assert failed.finish == "error" and "step failed" in failed.error and failed.reward is None


def test_an_episode_only_its_environment_could_score_counts_as_0():
    """A data source with no reward function (its environment scores): an episode the environment failed gets
    0 and is counted in reward/unscored; the others keep their environment's reward."""
    from plugrl.config import RewardConfig
    from plugrl.rewards import RewardRunner
    from plugrl.rollout.multiturn import Conversation
    from plugrl.rollout.play import score_episodes
    from plugrl.specs import Registry

    runner = RewardRunner(Registry(), RewardConfig(num_workers=0))

    class Prompt:
        sample, text = _wallet_sample(0, 3), "Wallet 0."

    def episode(reward, finish="done"):
        return (Prompt, Rollout([1], [2], None, "stop"), Conversation([], "env", reward=reward, finish=finish))

    out = score_episodes(runner, [episode(1.0), episode(None, "error"), episode(0.0)], ["a", "b", "c"])
    assert out.scores == [1.0, 0.0, 0.0] and out.details[1] == {"unscored": 0.0}
    assert out.metrics["reward/unscored"] == pytest.approx(1 / 3)
    assert out.metrics["reward/environment/mean"] == 0.5 and out.metrics["reward/mean"] == pytest.approx(1 / 3)


def test_an_episodes_own_tools_run_in_process_with_the_pools_answers():
    """Bound methods and closures are the episode's own tools (not importable by a worker); their calls are
    screened as the pool screens them, and a slow one is answered with a timeout."""
    wallet = Wallet()
    wallet.reset(target=1)
    assert not is_importable(wallet.deposit) and not is_importable(lambda: 0) and is_importable(make_tool)
    spec = make_tool(wallet.deposit, in_process=True)
    assert spec.schema["function"]["parameters"]["required"] == ["amount"]  # no self

    def run(call, tool=spec, limit=5.0):
        return asyncio.run(call_in_process(call, tool, time_limit_s=limit, max_output_chars=100, offered=["deposit"]))

    assert run(ToolCall("deposit", {"amount": 2})).content == "2" and wallet.balance == 2
    assert run(ToolCall("deposit", {"amount": "x"})).error == "bad_arguments"
    assert run(ToolCall("deposit", {})).error == "bad_arguments" and wallet.balance == 2
    unknown = run(ToolCall("withdraw", {"amount": 1}))
    assert unknown.error == "unknown_tool" and "available tools are: deposit" in unknown.content
    assert run(ToolCall("deposit", {}, error="not JSON")).error == "malformed"

    async def stall(seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "late"

    started = time.monotonic()
    slow = run(ToolCall("stall", {"seconds": 30}), make_tool(stall, in_process=True), limit=0.2)
    assert slow.error == "timeout" and "timed out after 0.2s" in slow.content
    assert time.monotonic() - started < 5  # the async call was cancelled


def test_a_class_without_reset_is_refused_at_import():
    class NoReset:
        def act(self, x: int) -> int:
            """Act. Args: x: what."""
            return x

    with pytest.raises(TypeError, match=r"NoReset has no reset\(\) method"):
        trl_environment(NoReset)
    assert not trl_environment(type("Plain", (), {"reset": lambda self, **row: None})).scores_episodes


PLUGIN = textwrap.dedent(
    '''
    """A TRL environment as its users write it, registered with one line."""
    from plugrl.rollout.adapters import trl_environment


    class Guess:
        def reset(self, **row):
            self.secret = row["secret"]
            self.guesses = 0
            return None

        def guess(self, number: int) -> str:
            """Guess the secret number.

            Args:
                number: Your guess.
            """
            self.guesses += 1
            return "right" if number == self.secret else ("higher" if number < self.secret else "lower")

        def get_reward(self) -> float:
            return 1.0 / self.guesses if self.guesses else 0.0


    guess_game = trl_environment(Guess, name="guess")
    '''
)


@pytest.mark.slow
def test_two_training_steps_with_a_trl_environment_and_no_reward_function(tiny_model, tmp_path):
    """`plugrl train` with a TRL class from a local module and no reward plugin for its data source: start-up
    passes (the environment scores every episode), two steps train, and the rewards are get_reward()'s."""
    (tmp_path / "trl_guess.py").write_text(PLUGIN)
    rows = [
        {"prompt": [{"role": "user", "content": f"Find my number ({i})."}], "data_source": "guess", "secret": i}
        for i in range(4)
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sys.path.insert(0, str(tmp_path))
    try:
        overrides = [
            "plugins=['trl_guess:',advantages]",
            f"data.train_files=[{data}]",
            "data.max_response_length=48",
            "rollout.max_turn_tokens=16",
            "environment=guess",
        ]
        metrics, rows = train_two_steps(tmp_path, tiny_model, "trl", overrides)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("trl_guess", None)
    assert [m["step"] for m in metrics] == [1, 2] and all(m["actor/optimizer_steps"] >= 1 for m in metrics)
    assert all(m["env/errors"] == 0.0 and "reward/environment/mean" in m for m in metrics)
    assert all(row["env_reward"] is not None and row["details"] == {"environment": row["env_reward"]} for row in rows)
    assert all('"name": "guess"' in row["messages"][0]["content"] for row in rows)  # the method offered as a tool


def test_env_start_observation_must_be_text():
    from plugrl_multiturn.env_results import as_env_start

    with pytest.raises(TypeError, match="observation must be a string"):
        as_env_start(EnvStart(observation=3), "environment 'x'")


class IncrementEnv:
    """TRL's docs' environment that owns its data: reset() returns the prompt (here the target comes from the
    row's seed, so the tests know it)."""

    def reset(self, **kwargs) -> str:
        self.counter = 0
        self.target = 1 + kwargs["seed"] % 3
        return f"Increment the counter by {self.target}."

    def increment(self, step: int) -> int:
        """Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return float(self.counter == self.target)


def test_rows_without_a_prompt_take_the_prompt_reset_returns(smol_tokenizer):
    """A dataset of rows with no prompt, routed to a TRL environment: each sample gets TRL's empty user message, and
    the string reset() returns is the episode's whole prompt (in its tokens too); a data source whose environment
    does not write prompts still needs them."""
    from plugrl.config import DataConfig
    from plugrl.data import DataError, row_to_sample

    tok = smol_tokenizer
    cfg = DataConfig(train_files=["x.jsonl"], data_source="inc")
    with pytest.raises(DataError, match="no prompt"):
        row_to_sample({"seed": 2}, "row 0", cfg, lambda ds: True, prompt_from_environment=lambda ds: False)
    sample = row_to_sample({"seed": 2}, "row 0", cfg, lambda ds: True, prompt_from_environment=lambda ds: ds == "inc")
    assert sample.prompt == [{"role": "user", "content": ""}] and sample.ground_truth is None
    spec = trl_environment(IncrementEnv)
    assert spec.writes_prompt and not EnvironmentSpec(name="plain", factory=Environment).writes_prompt
    engine = _scripted(tok, {"Increment the counter by 3.": [tool_call("increment", step=3), "Done."]})
    runner, _, _ = _runner(engine, tok, turn_tokens=64, max_turns=3)
    ((rollout, c),) = runner.run([_start(tok, sample, spec.factory)], SAMPLING)
    assert c.messages[1] == {"role": "user", "content": "Increment the counter by 3."} and c.reward == 1.0
    assert c.trl_prompt == [{"role": "user", "content": "Increment the counter by 3."}]
    text = tok.decode(rollout.prompt_ids)
    assert text.count("<|im_start|>user\nIncrement the counter by 3.<|im_end|>") == 1


NO_PROMPT_PLUGIN = textwrap.dedent(
    '''
    from plugrl.rollout.adapters import trl_environment


    class IncrementEnv:
        def reset(self, **kwargs):
            self.counter = 0
            self.target = 1 + kwargs["seed"] % 3
            return f"Increment the counter by {self.target}."

        def increment(self, step: int) -> int:
            """Increment the internal counter.

            Args:
                step: Value to add to the counter.
            """
            self.counter += step
            return self.counter

        def get_reward(self):
            return float(self.counter == self.target)


    increment = trl_environment(IncrementEnv)
    '''
)


@pytest.mark.slow
def test_two_steps_with_an_environment_that_writes_the_prompt(tiny_model, tmp_path):
    """`plugrl train` on rows without a prompt ({"seed": i}) and TRL's IncrementEnv, whose reset() returns it:
    start-up passes, two steps train, every episode's prompt is reset()'s string."""
    (tmp_path / "trl_increment.py").write_text(NO_PROMPT_PLUGIN)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"seed": i}) + "\n" for i in range(4)))
    sys.path.insert(0, str(tmp_path))
    try:
        overrides = [
            "plugins=['trl_increment:',advantages]",
            f"data.train_files=[{data}]",
            "data.data_source=increment",
            "data.max_response_length=48",
            "rollout.max_turn_tokens=16",
            "environment=IncrementEnv",
        ]
        metrics, rows = train_two_steps(tmp_path, tiny_model, "trl_reset", overrides)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("trl_increment", None)
    assert [m["step"] for m in metrics] == [1, 2] and all(m["env/errors"] == 0.0 for m in metrics)
    for row in rows:
        user = [m["content"] for m in row["messages"] if m["role"] == "user"]
        assert re.fullmatch(r"Increment the counter by [123]\.", user[0]), user
