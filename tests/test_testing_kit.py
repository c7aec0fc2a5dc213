"""`plugrl_testing`, the test kit for plugin authors: it passes the first-party plugins (countdown, gsm8k,
advantages, countdown_multiturn) and fails broken ones with a message that names the plugin, the record and
the rule. The broken plugins are real modules written to a temporary directory (conftest's ``local_plugin``)
and named as a third party's test would name them: by their decorated objects, or ``module:``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from fixture_paths import GSM8K_FIXTURE
from plugrl.algorithms import AdvantageResult
from plugrl.data import Sample
from plugrl_testing import (
    chat_tokenizer,
    check_dataset,
    check_environment,
    check_estimator,
    check_plugin,
    check_reward,
    check_template,
)

COUNTDOWN_GT = {"target": 8, "numbers": [3, 5]}
COUNTDOWN_ROW = {"data_source": "countdown", "ground_truth": COUNTDOWN_GT, "nums": [3, 5], "target": 8}


@pytest.fixture
def module(local_plugin):
    """Write a module (``local_plugin``) and import it."""

    def write(name: str, source: str):
        return importlib.import_module(local_plugin(name, source))

    return write


def fails(match: str):
    """The check raises AssertionError whose message matches ``match`` (a regular expression)."""
    return pytest.raises(AssertionError, match=match)


# --------------------------------------------------------------------------- the first-party plugins pass


def test_importing_the_kit_imports_no_torch():
    code = "import sys, plugrl_testing; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("plugin", ["countdown", "gsm8k", "advantages", "countdown_multiturn"])
def test_first_party_plugins_pass_check_plugin(plugin):
    registry = check_plugin(plugin)
    assert plugin in registry.plugins


def test_first_party_rewards_pass():
    from plugrl_countdown import countdown_reward
    from plugrl_gsm8k import gsm8k_reward

    cases = [
        ("<answer> 3 + 5 </answer>", COUNTDOWN_GT, {"score": 1.0, "correct": True}),
        ("<answer> 3 * 5 </answer>", COUNTDOWN_GT, 0.1),  # the format credit
        ("no answer", COUNTDOWN_GT, 0.0),
    ]
    assert check_reward(countdown_reward, cases) == [1.0, 0.1, 0.0]
    assert check_reward(countdown_reward, [(cases[0][0], COUNTDOWN_GT, 2.0)], options={"correct_score": 2.0}) == [2.0]
    by_name = check_reward("gsm8k_reward", [("so #### 42", "42", {"score": 1.0, "extracted": "42"})], plugin="gsm8k")
    assert by_name == [1.0]
    assert check_reward(gsm8k_reward, [("42", "42", 0.0)]) == [0.0]  # strict: needs "#### 42"


def test_first_party_datasets_and_templates_pass():
    samples = check_dataset("countdown", options={"size": 8, "seed": 3}, n=5)
    assert len(samples) == 5 and {s.data_source for s in samples} == {"countdown"}
    (message,) = check_template("countdown", samples[0], plugin="countdown")  # chat messages
    assert "<answer>" in message["content"]
    assert check_template("countdown_r1", samples[0], plugin="countdown").endswith("<think>")  # raw text
    rows = check_dataset("gsm8k", split="test", options={"path": str(GSM8K_FIXTURE)}, n=16)
    assert len(rows) == 16 and rows[0].data_source == "openai/gsm8k"
    row = {"question": "What is 2 + 2?", "data_source": "openai/gsm8k", "ground_truth": "4"}
    assert check_template("gsm8k", row)[0]["content"].startswith("What is 2 + 2?")
    (message,) = check_template("countdown_multiturn", COUNTDOWN_ROW)
    assert "may try again" in message["content"]


def test_every_first_party_estimator_passes():
    registry = check_plugin("advantages")
    assert len(registry.estimators) == 11
    for name in registry.estimators:
        result = check_estimator(name, plugin=registry)
        assert isinstance(result, AdvantageResult) and result.advantages.shape[0] == 8
    grpo = check_estimator("grpo", scores=[1.0, 0.0], group_size=2, plugin=registry)
    assert grpo.advantages[0, 0] > 0 > grpo.advantages[1, 0]


def test_the_countdown_environment_passes():
    played = check_environment(
        "countdown_retry",
        COUNTDOWN_ROW,
        ["<answer> 3 * 5 </answer>", "<answer> 3 + 5 </answer>"],
        plugin=["countdown", "countdown_multiturn"],
        template="countdown_multiturn",
        options={"max_attempts": 2},
        expected_score=1.0,
    )
    conv = played.conversation
    assert conv.finish == "done" and conv.turns == 2 and conv.info["solved_turn"] == 2
    assert [m["role"] for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    assert conv.messages[2]["content"] == "3 * 5 = 15, not 8. Try again."  # the value feedback
    assert sum(played.rollout.policy_mask) < len(played.rollout.response_ids)  # the feedback is not trained on
    # the last reply's turn is the last (rollout.max_turns = len(replies)): a wrong answer there ends it
    lost = check_environment(
        "countdown_retry",
        COUNTDOWN_ROW,
        ["<answer> 3 * 5 </answer>"],
        plugin=["countdown", "countdown_multiturn"],
        template="countdown_multiturn",
        options={"format_score": 0.1},
    )
    assert lost.conversation.finish == "done" and lost.score == pytest.approx(0.1)


def test_an_environment_whose_tools_run_in_the_tool_workers():
    """math_tools offers the calculator, which runs in a tool worker process; gsm8k's reward scores the episode."""
    row = {
        "prompt": [{"role": "user", "content": "What is 12 * 7?"}],
        "data_source": "openai/gsm8k",
        "ground_truth": "84",
    }
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
    played = check_environment(
        "math_tools", row, [call, "So #### 84"], plugin=["gsm8k", "math_tools"], expected_score=1.0
    )
    roles = [m["role"] for m in played.conversation.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]  # the system message describes the tools
    assert played.conversation.messages[3]["content"] == "84" and played.details["gsm8k_reward/extracted"] == "84"


def test_an_environment_with_a_models_own_tokenizer(smol_tokenizer):
    played = check_environment(
        "countdown_retry",
        COUNTDOWN_ROW,
        ["<answer> 3 + 5 </answer>"],
        plugin="countdown_multiturn",
        template="countdown_multiturn",
        tokenizer=smol_tokenizer,
        expected_score=1.0,
    )
    assert played.conversation.turns == 1


def test_the_kits_tokenizer_round_trips_text_and_writes_chatml():
    tok = chat_tokenizer()
    text = "héllo <tool_call>{}</tool_call> ✓"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# --------------------------------------------------------------------------- broken plugins fail, clearly


REWARDS = """
import math

import plugrl
from pydantic import BaseModel, Field


class Threshold(BaseModel):
    threshold: float = Field(0.5, ge=0, le=1)


@plugrl.reward("t")
def exact(completion, ground_truth):
    return float(completion == ground_truth)


@plugrl.reward("t", options=Threshold)
def graded(completion, ground_truth, threshold=0.5):
    return float(len(completion) >= threshold)


@plugrl.reward("t")
def as_text(completion, ground_truth):
    return "1.0"


@plugrl.reward("t")
def not_a_number(completion, ground_truth):
    return math.nan


@plugrl.reward("t")
def no_score(completion, ground_truth):
    return {"value": 1.0}


@plugrl.reward("t")
def raises(completion, ground_truth):
    raise ValueError("boom")


@plugrl.reward("t_*")
def globbed(completion, ground_truth, data_source=None):
    return float(data_source == "t_x")


@plugrl.reward("t")
async def slow_but_fine(completion, ground_truth, extra_info=None, nums=()):
    return {"score": float(extra_info["k"] + sum(nums)), "seen": True}


@plugrl.reward("t")
def three_required(completion, ground_truth, threshold):
    return 1.0


def undecorated(completion, ground_truth):
    return 1.0

"""
HOOKED_CLOSURE = """
@plugrl.hookimpl
def plugrl_rewards():
    return [plugrl.RewardSpec(name="closure", fn=lambda completion, ground_truth: 1.0, data_sources=("c",))]
"""
REWARDS += HOOKED_CLOSURE


def test_rewards_the_kernel_would_refuse(module):
    m = module("kit_rewards", REWARDS)
    assert check_reward(m.exact, [("a", "a", 1.0), ("a", "b", 0.0), ("a", "b")]) == [1.0, 0.0, 0.0]
    with fails(r"reward 'exact' of plugin 'kit_rewards:exact', case 1 \(completion 'a'\): score is 0.0, expected 1"):
        check_reward(m.exact, [("a", "a", 1.0), ("a", "b", 1.0)])
    with fails(r"reward 'as_text' of plugin 'kit_rewards:as_text', case 0 .*returned str '1.0', expected a float"):
        check_reward(m.as_text, [("a", "a")])
    with fails(r"reward 'not_a_number'.*non-finite score \(nan\)"):
        check_reward(m.not_a_number, [("a", "a")])
    with fails(r"reward 'no_score'.*returned a dict without 'score' \(keys: value\)"):
        check_reward(m.no_score, [("a", "a")])
    with fails(r"reward 'raises'.*ValueError: boom"):
        check_reward(m.raises, [("a", "a")])
    signature = r"its signature does not fit how the kernel calls it: .* is called as fn\(completion, ground_truth, "
    with fails(r"reward 'three_required' of plugin 'kit_rewards:three_required': " + signature):
        check_reward(m.three_required, [("a", "a")])
    with fails(r"undecorated .* is not registered as a reward: decorate it with @plugrl.reward"):
        check_reward(m.undecorated, [("a", "a")])
    with fails(r"reward 'closure' of plugin 'kit_rewards:'.*cannot be sent to a worker process.*module-level"):
        check_reward("closure", [("a", "a")], plugin="kit_rewards:")


def test_reward_options_context_and_data_sources(module):
    m = module("kit_rewards_ctx", REWARDS)
    assert check_reward(m.graded, [("abc", "", 1.0)], options={"threshold": 0.2}) == [1.0]
    with fails(r"reward 'graded'.*refused at start-up:\n  reward.options.graded.threshold: .*less than or equal to 1"):
        check_reward(m.graded, [("abc", "")], options={"threshold": 2})
    with fails(
        r"reward.options.exact sets bonus, which reward 'exact' of plugin 'kit_rewards_ctx:exact' does not take"
    ):
        check_reward(m.exact, [("a", "a")], options={"bonus": 1})
    assert check_reward(m.globbed, [("a", "a", 1.0)], data_source="t_x") == [1.0]
    with fails(r"reward 'globbed'.*data_source 'u' is not among its patterns \['t_\*'\]"):
        check_reward(m.globbed, [("a", "a")], data_source="u")
    cases = [("a", "a", {"score": 3.0, "seen": True})]
    assert check_reward(m.slow_but_fine, cases, extra_info={"k": 1}, nums=[1, 1]) == [3.0]  # async, context keywords
    with fails(r"reward 'slow_but_fine'.*the result has no field 'correct' \(it has score, seen\)"):
        check_reward(m.slow_but_fine, [("a", "a", {"score": 3.0, "correct": 1})], extra_info={"k": 1}, nums=[1, 1])


def test_a_reward_defined_in_a_function_cannot_go_to_the_workers():
    import plugrl

    @plugrl.reward("t")
    def local(completion, ground_truth):
        return 1.0

    with fails(r"reward 'local' of plugin '.*local'.*cannot be sent to a worker process.*module-level function"):
        check_reward(local, [("a", "a", 1.0)])


DATASETS = """
import random

import plugrl

ROW = {"prompt": "Say 1.", "data_source": "t", "ground_truth": "1"}


@plugrl.reward("t")
def exact(completion, ground_truth):
    return float(completion == ground_truth)


@plugrl.dataset("good")
def good(split, size=4):
    return [dict(ROW, extra_info={"i": i}) for i in range(size)]


@plugrl.dataset("no_source")
def no_source(split):
    return [{"prompt": "Say 1.", "ground_truth": "1"}]


@plugrl.dataset("no_answer")
def no_answer(split):
    return [{"prompt": "Say 1.", "data_source": "t"}]


@plugrl.dataset("unrouted")
def unrouted(split):
    return [dict(ROW, data_source="nowhere")]


@plugrl.dataset("shuffled")
def shuffled(split):
    return [dict(ROW, ground_truth=str(random.random()))]


@plugrl.dataset("broken")
def broken(split):
    raise FileNotFoundError("data/t.jsonl")


@plugrl.dataset("games")
def games(split):
    return [{"prompt": "Play.", "data_source": "game"}]  # no ground truth: its environment scores it


@plugrl.environment("scored")
class Scored(plugrl.Environment):
    def step(self, turn):
        return plugrl.EnvStep(done=True)

    def reward(self):
        return 1.0
"""


def test_datasets_the_kernel_would_refuse(module):
    module("kit_datasets", DATASETS)
    plugin = "kit_datasets:"
    assert [s.extra_info["i"] for s in check_dataset("good", plugin=plugin, options={"size": 6}, n=5)] == [
        0,
        1,
        2,
        3,
        4,
    ]
    with fails(r"dataset 'no_source' of plugin 'kit_datasets:': dataset 'no_source' \[train\] row 0: no 'data_source'"):
        check_dataset("no_source", plugin=plugin)
    with fails(r"dataset 'no_answer' of plugin 'kit_datasets:': .*row 0: no ground truth"):
        check_dataset("no_answer", plugin=plugin)
    with fails(r"dataset 'unrouted' of plugin 'kit_datasets:': no reward function for data_source 'nowhere'"):
        check_dataset("unrouted", plugin=plugin)
    assert check_dataset("unrouted", plugin=plugin, routed=False)[0].data_source == "nowhere"
    with fails(r"dataset 'shuffled' .*two calls with the same options give different rows \(from row 0 on\)"):
        check_dataset("shuffled", plugin=plugin)
    with fails(r"dataset 'broken' .*failed for split 'train' .*FileNotFoundError: data/t.jsonl"):
        check_dataset("broken", plugin=plugin)
    with fails(r"dataset 'good' .*failed for split 'train' .*unexpected keyword argument 'colour'"):
        check_dataset("good", plugin=plugin, options={"size": 2, "colour": "red"})  # no options model: the call
    with fails(r"dataset 'games' .*no ground truth"):  # unless its environment scores the episodes
        check_dataset("games", plugin=plugin)
    assert check_dataset("games", plugin=plugin, environment="scored")[0].ground_truth is None


TEMPLATES = """
import plugrl


@plugrl.template("good")
def good(sample):
    return [{"role": "user", "content": sample.row["question"]}]


@plugrl.template("as_text")
def as_text(sample):
    return "Q: " + sample.row["question"]


@plugrl.template("bad_role")
def bad_role(sample):
    return [{"role": "bot", "content": "hi"}]


@plugrl.template("empty")
def empty(sample):
    return "   "


@plugrl.template("a_dict")
def a_dict(sample):
    return {"role": "user", "content": "hi"}


@plugrl.template("no_args")
def no_args():
    return "hi"
"""


def test_templates_the_kernel_would_refuse(module):
    m = module("kit_templates", TEMPLATES)
    row = {"question": "What is 2 + 2?", "data_source": "t", "ground_truth": "4"}
    assert check_template(m.good, row) == [{"role": "user", "content": "What is 2 + 2?"}]
    assert check_template(m.as_text, Sample("", "t", "4", row={"question": "2 + 2?"})) == "Q: 2 + 2?"
    with fails(r"template 'bad_role' of plugin 'kit_templates:bad_role': .*messages\[0\] has role 'bot'; known roles"):
        check_template(m.bad_role, row)
    with fails(r"template 'empty' .*the prompt is empty \(template 'empty' returned no text\)"):
        check_template(m.empty, row)
    with fails(r"template 'a_dict' .*must be text or a list of chat messages, got dict"):
        check_template(m.a_dict, row)
    with fails(r"signatures the kernel cannot call:\n  kit_templates:: template 'no_args' is called as fn\(sample\)"):
        check_plugin("kit_templates:")


ESTIMATORS = """
import torch

import plugrl
from plugrl.algorithms import AdvantageResult, group_mean_std


def centred(batch):
    mean, _, _ = group_mean_std(batch.scores, batch.group_ids)
    return (batch.scores - mean).unsqueeze(-1)


@plugrl.advantage_estimator("good")
def good(batch, config):
    adv = centred(batch) * batch.response_mask
    return AdvantageResult(adv, metrics={"adv/mean": adv.mean()})


@plugrl.advantage_estimator("per_sequence")
def per_sequence(batch, config):
    return AdvantageResult(centred(batch).squeeze(-1))


@plugrl.advantage_estimator("divides_by_zero")
def divides_by_zero(batch, config):
    _, std, _ = group_mean_std(batch.scores, batch.group_ids)
    return AdvantageResult(centred(batch) / (std * 0).unsqueeze(-1) * batch.response_mask)


@plugrl.advantage_estimator("per_padded_token")
def per_padded_token(batch, config):
    return AdvantageResult(centred(batch) / batch.response_mask.shape[1] * batch.response_mask)


@plugrl.advantage_estimator("a_tensor")
def a_tensor(batch, config):
    return centred(batch) * batch.response_mask


@plugrl.advantage_estimator("critic", needs_critic=True)
def critic(batch, config):
    assert batch.values is not None
    return AdvantageResult(centred(batch) * batch.response_mask)


@plugrl.advantage_estimator("bad_metric")
def bad_metric(batch, config):
    return AdvantageResult(centred(batch) * batch.response_mask, metrics={"adv/kind": "centred"})
"""


def test_estimators_the_kernel_would_refuse(module):
    module("kit_estimators", ESTIMATORS)
    plugin = "kit_estimators:"
    result = check_estimator("good", scores=[1.0, 0.0, 0.5, 0.5], group_size=2, plugin=plugin)
    assert result.advantages[:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]
    shape = r"advantages must be a float tensor of the batch's shape \[B, T\] = \(8, 7\), got \(8,\)"
    with fails(r"advantage estimator 'per_sequence' of plugin 'kit_estimators:': " + shape):
        check_estimator("per_sequence", plugin=plugin)
    with fails(r"'divides_by_zero' .*: advantages\[0, 0\] is inf; every entry must be finite, padding included"):
        check_estimator("divides_by_zero", plugin=plugin)
    with fails(r"'per_padded_token' .*change when the batch has more padding; leave the padding out"):
        check_estimator("per_padded_token", plugin=plugin)
    with fails(r"'a_tensor' .*must return a plugrl.algorithms.AdvantageResult, got Tensor"):
        check_estimator("a_tensor", plugin=plugin)
    with fails(r"'critic' .*needs a critic: it must return the critic's targets as `returns`"):
        check_estimator("critic", plugin=plugin)
    with fails(r"'bad_metric' .*metrics must be \{name: number\}, got \{'adv/kind': 'centred'\}"):
        check_estimator("bad_metric", plugin=plugin)
    with fails(r"'per_sequence'"):  # check_plugin runs every estimator of the plugin
        check_plugin(plugin)
    with pytest.raises(ValueError, match="5 scores do not make groups of 2"):
        check_estimator("good", scores=[1, 0, 1, 0, 1], group_size=2, plugin=plugin)


ENVIRONMENTS = """
import math

import plugrl
from pydantic import BaseModel, Field

ROW = {"prompt": [{"role": "user", "content": "Add 2 and 3."}], "data_source": "calc", "ground_truth": "5"}


@plugrl.reward("calc")
def answered(completion, ground_truth):
    return float(completion.strip() == ground_truth)


class Turns(BaseModel):
    turns: int = Field(2, ge=1)


@plugrl.environment("calc", options=Turns)
class Calc(plugrl.Environment):
    def __init__(self, turns=2):
        self.turns = turns

    def start(self, sample):
        return plugrl.EnvStart(tools=[self.add])

    def add(self, a: int, b: int) -> int:
        '''Add two integers.

        Args:
            a: the first
            b: the second
        '''
        return a + b


@plugrl.environment("says_hello")
class SaysHello(plugrl.Environment):
    def start(self, sample):
        return "hello"


@plugrl.environment("answers_a_dict")
class AnswersADict(plugrl.Environment):
    def step(self, turn):
        return {"done": True}


@plugrl.environment("nan_reward")
class NanReward(plugrl.Environment):
    async def step(self, turn):
        return plugrl.EnvStep(done=True, reward=math.nan)


@plugrl.environment("crashes")
class Crashes(plugrl.Environment):
    def step(self, turn):
        raise KeyError(turn.index)


@plugrl.environment("chatty")
class Chatty(plugrl.Environment):
    def step(self, turn):
        return [{"role": "user", "content": "go on"}]


class Unregistered(plugrl.Environment):
    def step(self, turn):
        return plugrl.EnvStep(done=True, reward=0.5)
"""


def test_environments_the_kernel_would_refuse(module):
    m = module("kit_envs", ENVIRONMENTS)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    plugin = "kit_envs:"  # the environment with the reward of its data source
    played = check_environment(m.Calc, m.ROW, [call, "5"], plugin=plugin, expected_score=1.0)  # by `answered`
    tool = played.conversation.messages[3]  # after the system message that describes the tools, and the call
    assert tool["role"] == "tool" and tool["content"] == "5" and played.conversation.tool_calls == 1
    assert check_environment(m.Unregistered, m.ROW, ["5"]).score == 0.5  # a factory the kernel could train as it is
    with fails(r"environment 'calc' of plugin 'kit_envs:': the episode scored 0.0, expected 1.0"):
        check_environment(m.Calc, m.ROW, ["6"], plugin=plugin, expected_score=1.0)
    unscored = r"nothing scored the episode: .*register no reward for data_source 'calc' \(name the plugin of"
    with fails(r"environment 'calc' of plugin 'kit_envs:Calc': " + unscored):
        check_environment(m.Calc, m.ROW, ["5"], expected_score=1.0)
    with fails(r"environment 'calc'.*refused at start-up:\n  environment_options.turns: .*greater than or equal to 1"):
        check_environment(m.Calc, m.ROW, ["5"], options={"turns": 0})
    start = r"start failed: TypeError: .*start\(\) must return an EnvStart, a list of chat messages or None, got str"
    with fails(r"environment 'says_hello' \(plugin kit_envs:SaysHello\): " + start):
        check_environment(m.SaysHello, m.ROW, ["5"])
    with fails(r"environment 'answers_a_dict' .*step failed at turn 0: TypeError: .*step\(\) must return an EnvStep"):
        check_environment(m.AnswersADict, m.ROW, ["5"])
    with fails(r"environment 'nan_reward' .*EnvStep.reward must be a finite number"):
        check_environment(m.NanReward, m.ROW, ["5"])
    with fails(r"environment 'crashes' .*step failed at turn 0: KeyError: 0"):
        check_environment(m.Crashes, m.ROW, ["5"])
    with fails(r"environment 'chatty' .*the episode asks for turn 3, but replies holds 2: give more replies"):
        check_environment(m.Chatty, m.ROW, ["a", "b"], max_turns=3)
    assert check_environment(m.Chatty, m.ROW, ["a", "5"]).conversation.finish == "max_turns"
    with fails(r"plugin 'calc' is not installed.*\n\(the environment 'calc' was looked for in the plugin of that name"):
        check_environment("calc", m.ROW, ["5"])


def test_plugins_that_do_nothing_or_are_missing(module):
    module("kit_idle", "import plugrl\n\ndef score(completion, ground_truth):\n    return 1.0\n")
    with fails(r"plugin kit_idle:: registers nothing and implements no hook; decorate its functions"):
        check_plugin("kit_idle:")
    with fails(r"plugin 'kit_nowhere' is not installed"):
        check_plugin("kit_nowhere")
    with fails(
        r"plugin\(s\) kit_rewards_all:: signatures the kernel cannot call:\n  kit_rewards_all:: reward "
        r"'three_required' is called as fn\(completion, ground_truth, \*\*context\)"
    ):
        check_plugin(module("kit_rewards_all", REWARDS))
    closure = module("kit_closure", "import plugrl\n" + HOOKED_CLOSURE)
    with fails(r"reward 'closure' of plugin 'kit_closure:': .*cannot be sent to a worker process"):
        check_plugin(closure)
    hooked = module(
        "kit_hooked", "import plugrl\n\n@plugrl.hookimpl\ndef plugrl_check_config(config):\n    return None\n"
    )
    assert "kit_hooked:" in check_plugin(hooked).plugins
