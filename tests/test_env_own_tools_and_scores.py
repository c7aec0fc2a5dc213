"""Two parts of the environment contract that libraries with their own tool runtime and rubrics need
(verifiers' ToolEnv and Rubric): tools the environment answers itself (``EnvStart.tool_schemas``: shown,
parsed, never run by the kernel) and a score with its parts (``EpisodeScore``: logged per part)."""

from __future__ import annotations

import json
import math

import pytest

from episode_helpers import tool_call
from plugrl.data import Sample
from plugrl.rollout.environment import Environment, EnvStart, EnvStep, EpisodeScore
from plugrl.rollout.play import score_episodes
from plugrl_multiturn.env_results import check_score
from plugrl_tools.authoring import make_tool
from test_multiturn import SAMPLING, _runner, _start
from test_trl_environments import _scripted

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


def double(x: int) -> int:
    """Double a number.

    Args:
        x: The number.
    """
    return 2 * x


class Dictionary(Environment):
    """Runs its own tool `lookup`; the registered tool `double` is the kernel's."""

    seen: list = []

    def start(self, sample):
        return EnvStart(tools=["double"], tool_schemas=[LOOKUP])

    def step(self, turn):
        Dictionary.seen.append((turn.tool_calls, turn.tool_results))
        answers = [
            {"role": "tool", "name": c.name, "tool_call_id": c.id, "content": f"{c.arguments['word']}: a word"}
            for c in turn.tool_calls
            if c.name == "lookup" and c.error is None
        ]
        return EnvStep(messages=answers, done=not turn.tool_calls)

    def reward(self):
        return EpisodeScore(0.75, {"found": 1.0, "style": 0.5})


def _sample(i: int) -> Sample:
    prompt = [{"role": "user", "content": f"Define ({i})."}]
    return Sample(prompt=prompt, data_source="dict", ground_truth="", row={"prompt": prompt}, origin=f"row {i}")


def test_tools_an_environment_answers_itself_are_shown_and_parsed_but_not_run(smol_tokenizer):
    tok = smol_tokenizer
    Dictionary.seen = []
    engine = _scripted(tok, {"(0)": [tool_call("lookup", word="cat") + tool_call("double", x=4), "Done."]})
    runner, _, executor = _runner(engine, tok, turn_tokens=64, max_turns=3, tools={"double": make_tool(double)})
    try:
        ((rollout, conv),) = runner.run([_start(tok, _sample(0), Dictionary)], SAMPLING)
    finally:
        executor.close()
    prompt = tok.decode(rollout.prompt_ids)
    assert '"name": "lookup"' in prompt and '"name": "double"' in prompt
    calls, results = Dictionary.seen[0]
    assert [c.name for c in calls] == ["lookup", "double"]  # step sees every call
    assert [(r.call.name, r.content) for r in results] == [("double", "8")]  # the kernel ran only its own
    tools = [m["content"] for m in conv.messages if m["role"] == "tool"]
    assert tools == ["8", "cat: a word"] and conv.tool_calls == 2 and conv.tool_errors == 0
    assert "cat: a word" in tok.decode(rollout.response_ids)  # the environment's answer is in the context
    assert (conv.finish, conv.reward, conv.reward_parts) == ("done", 0.75, {"found": 1.0, "style": 0.5})


def test_a_tool_both_run_by_the_kernel_and_by_the_environment_is_refused(smol_tokenizer):
    class Both(Dictionary):
        def start(self, sample):
            clash = {**LOOKUP, "function": {**LOOKUP["function"], "name": "double"}}
            return EnvStart(tools=["double"], tool_schemas=[clash])

    tok = smol_tokenizer
    runner, _, executor = _runner(_scripted(tok, {"(0)": ["x"]}), tok, tools={"double": make_tool(double)})
    try:
        ((_, conv),) = runner.run([_start(tok, _sample(0), Both)], SAMPLING)
    finally:
        executor.close()
    assert conv.finish == "error" and "both as tools the kernel runs and in tool_schemas" in conv.error


@pytest.mark.parametrize("bad", [float("nan"), EpisodeScore(1.0, {"a": math.inf}), EpisodeScore(1.0, {"a": "x"}), True])
def test_a_score_must_be_finite_numbers(bad):
    with pytest.raises(TypeError, match="finite number"):
        check_score(bad, "reward()")


def test_a_scores_parts_are_logged_per_part():
    """score_episodes: an environment's score keeps its parts in the details and logs reward/<part>/mean over
    the episodes that have that part."""

    class NoPlugins:
        def can_score(self, ds):
            return False

    conv = [_conv(1.0, {"found": 1.0}), _conv(0.0, {"found": 0.0, "style": 0.5})]
    prompts = [type("P", (), {"sample": _sample(i), "text": ""})() for i in range(2)]
    out = score_episodes(NoPlugins(), [(p, None, c) for p, c in zip(prompts, conv, strict=True)], ["", ""])
    assert out.scores == [1.0, 0.0]
    assert out.details == [{"environment": 1.0, "found": 1.0}, {"environment": 0.0, "found": 0.0, "style": 0.5}]
    assert out.metrics["reward/found/mean"] == 0.5 and out.metrics["reward/style/mean"] == 0.5
    assert json.dumps(out.details)  # the rollout log holds them as they are


def _conv(reward, parts):
    from plugrl.rollout.multiturn import Conversation

    return Conversation(messages=[], environment="e", finish="done", reward=reward, reward_parts=parts)


def test_close_is_called_once_however_the_episode_ended(smol_tokenizer):
    """close() runs after the episode is scored (done, or cut by max_turns) and after a failure; one that
    raises is logged and changes nothing."""
    closed = []

    class Closing(Environment):
        def __init__(self, fail_step=False, fail_close=False):
            self.fail_step, self.fail_close = fail_step, fail_close

        def step(self, turn):
            if self.fail_step:
                raise RuntimeError("broken")
            return EnvStep(done=turn.index == 1, reward=1.0)

        async def close(self):
            closed.append(self.fail_step)
            if self.fail_close:
                raise OSError("already gone")

    tok = smol_tokenizer
    engine = _scripted(tok, {"(0)": ["a", "b"], "(1)": ["a"], "(2)": ["a", "b"]})
    runner, _, _ = _runner(engine, tok, max_turns=2)
    envs = [lambda: Closing(), lambda: Closing(fail_step=True), lambda: Closing(fail_close=True)]
    played = runner.run([_start(tok, _sample(i), make) for i, make in enumerate(envs)], SAMPLING)
    assert [c.finish for _, c in played] == ["done", "error", "done"]
    assert sorted(closed) == [False, False, True] and played[2][1].reward == 1.0
