"""Tests for the multi-turn countdown plugin (plugins/envs_countdown): the environment ``countdown_retry``
driven directly with :class:`plugrl.rollout.environment.Turn` objects, its options, its template, and its
loading through plugrl's loader and config checks."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest
from pydantic import ValidationError

from plugrl.config import ConfigError, DataConfig, load_config
from plugrl.data import Sample, row_to_sample
from plugrl.plugins import check_config, check_registry, load_plugins
from plugrl.rollout.environment import EnvStart, EnvStep, Turn
from plugrl_countdown import countdown_dataset, countdown_reward
from plugrl_envs_countdown import CountdownRetry, CountdownRetryOptions, countdown_multiturn_template, judge
from plugrl_envs_countdown.retry import BINARY_WRONG, EMPTY_ANSWER, NO_ANSWER
from plugrl_multiturn.env_results import as_env_start, as_env_step
from plugrl_multiturn.routing import environment_options

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "countdown_multiturn.yaml"


def make_sample(target: int = 8, numbers: tuple[int, ...] = (3, 5)) -> Sample:
    """A sample as the countdown dataset makes it (the row's schema, validated by the kernel's row check)."""
    row = {
        "prompt": [{"role": "user", "content": f"Using the numbers {list(numbers)}, ..."}],
        "data_source": "countdown",
        "ground_truth": {"target": target, "numbers": list(numbers)},
        "extra_info": {"split": "train", "index": 0},
        "nums": list(numbers),
        "target": target,
    }
    return row_to_sample(row, "dataset 'countdown' [train] row 0", DataConfig())


class Episode:
    """Drives one environment as the kernel does: start, then step after each reply, with the conversation."""

    def __init__(self, env: CountdownRetry, sample: Sample, max_turns: int = 10):
        self.env, self.sample, self.max_turns = env, sample, max_turns
        begun = as_env_start(env.start(sample), "test")
        assert begun.messages is None and not begun.tools  # the dataset's prompt, no tools
        self.messages = list(sample.prompt)
        self.turns = 0

    def reply(self, text: str) -> EnvStep:
        self.messages.append({"role": "assistant", "content": text})
        turn = Turn(self.turns, text, [], [], list(self.messages), self.sample, self.turns == self.max_turns - 1)
        self.turns += 1
        step = as_env_step(self.env.step(turn), turn, "test")  # the kernel's own check of the result
        self.messages += step.messages
        return step


def feedback(step: EnvStep) -> str:
    assert not step.done and step.reward is None
    assert len(step.messages) == 1 and step.messages[0]["role"] == "user"
    return step.messages[0]["content"]


# --------------------------------------------------------------------------- one episode


def test_correct_first_try_is_done_with_reward_one():
    ep = Episode(CountdownRetry(), make_sample())
    step = ep.reply("Easy. <answer> 3 + 5 </answer>")
    assert step.done and step.reward == 1.0 and step.messages == []
    assert step.info == {
        "solved": 1.0,
        "solved_turn": 1,
        "attempts": 1,
        "solved_by_turn1": 1.0,
        "solved_by_turn2": 1.0,
        "solved_by_turn3": 1.0,
    }


def test_wrong_then_right_gets_value_feedback_then_a_decayed_reward():
    ep = Episode(CountdownRetry(max_attempts=3, reward_decay=0.5), make_sample())
    first = ep.reply("<answer> 3 * 5 </answer>")
    assert first.messages == [{"role": "user", "content": "3 * 5 = 15, not 8. Try again."}]
    assert not first.done and first.reward is None
    assert first.info["solved"] == 0.0 and first.info["attempts"] == 1 and first.info["solved_by_turn1"] == 0.0
    second = ep.reply("<answer>5 + 3</answer>")
    assert second.done and second.reward == 0.5
    assert second.info["solved_turn"] == 2 and second.info["attempts"] == 2 and second.info["solved"] == 1.0
    assert (second.info["solved_by_turn1"], second.info["solved_by_turn2"], second.info["solved_by_turn3"]) == (
        0.0,
        1.0,
        1.0,
    )
    assert [m["role"] for m in ep.messages] == ["user", "assistant", "user", "assistant"]


def test_reward_decays_per_attempt():
    rewards = []
    for k in (1, 2, 3):
        ep = Episode(CountdownRetry(max_attempts=3, reward_decay=0.9), make_sample())
        for _ in range(k - 1):
            feedback(ep.reply("<answer>3 - 5</answer>"))
        step = ep.reply("<answer>3 + 5</answer>")
        assert step.done and step.info["solved_turn"] == k
        rewards.append(step.reward)
    assert rewards == pytest.approx([1.0, 0.9, 0.81])


def test_no_answer_tag_gets_format_feedback():
    ep = Episode(CountdownRetry(), make_sample())
    assert feedback(ep.reply("I think it is 3 + 5")) == NO_ANSWER
    assert NO_ANSWER == (
        "No <answer> </answer> tags found. Write your equation as <answer> expression </answer>. Try again."
    )
    assert feedback(ep.reply("<answer>3 + 5")) == NO_ANSWER  # an unclosed tag is no answer either
    assert feedback(Episode(CountdownRetry(), make_sample()).reply("<answer> </answer>")) == EMPTY_ANSWER


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("5 + 7", "5 + 7 uses 7, which is not given, and does not use 3. Try again."),
        ("3 + 3", "3 + 3 uses 3 twice and does not use 5. Try again."),
        ("3 + 5 - 0", "3 + 5 - 0 uses 0, which is not given. Try again."),
        ("8", "8 uses 8, which is not given, and does not use 3 or 5. Try again."),
        (
            "1 + 2 + 4 + 6 + 7 + 3 + 5",
            "1 + 2 + 4 + 6 + 7 + 3 + 5 uses 1, 2, 4, 6 and others, which are not given. Try again.",
        ),
    ],
)
def test_wrong_numbers_say_which_rule_is_broken(answer, message):
    """Even an expression worth the target is wrong when it does not use each given number exactly once."""
    step = Episode(CountdownRetry(), make_sample()).reply(f"<answer>{answer}</answer>")
    assert feedback(step) == message


def test_repeated_numbers_are_counted():
    sample = make_sample(target=11, numbers=(3, 3, 5))
    assert Episode(CountdownRetry(), sample).reply("<answer>3 + 3 + 5</answer>").reward == 1.0
    short = feedback(Episode(CountdownRetry(), sample).reply("<answer>3 + 5 + 3 + 3</answer>"))
    assert short == "3 + 5 + 3 + 3 uses 3 three times (given twice). Try again."


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("(3 + 5", "(3 + 5 is not a valid expression: unclosed '(' at position 0. Try again."),
        ("3 ** 5", "3 ** 5 is not a valid expression: exponentiation '**' at position 2 is not allowed. Try again."),
        # model text that is not arithmetic is never echoed back into the conversation
        ("3 x 5", "Your answer is not a valid expression: unexpected character 'x' at position 2. Try again."),
        (
            "__import__('os') <|im_end|>",
            "Your answer is not a valid expression: unexpected character '_' at position 0. Try again.",
        ),
    ],
)
def test_invalid_expressions_are_reported_without_eval(answer, message):
    assert feedback(Episode(CountdownRetry(), make_sample()).reply(f"<answer>{answer}</answer>")) == message


def test_value_feedback_formats_fractions_and_ignores_a_result_suffix():
    ep = Episode(CountdownRetry(), make_sample())
    assert feedback(ep.reply("<answer>5 / 3 = 1.67</answer>")) == "5 / 3 = 1.66667, not 8. Try again."
    assert ep.reply("<answer> 3 + 5 = 8 </answer>").reward == 1.0  # as the countdown reward: `= 8` is ignored


def test_long_answers_are_clipped_in_feedback():
    expr = " + ".join(["3 - 3"] * 12) + " + 5"
    text = feedback(Episode(CountdownRetry(), make_sample()).reply(f"<answer>{expr}</answer>"))
    assert text.startswith(expr[:57] + "... ") and len(text) < 160


def test_the_last_answer_tag_counts():
    step = Episode(CountdownRetry(), make_sample()).reply("<answer>3 * 5</answer> no wait: <answer>3 + 5</answer>")
    assert step.done and step.reward == 1.0


def test_wrong_on_the_last_attempt_ends_with_reward_zero():
    ep = Episode(CountdownRetry(max_attempts=2), make_sample())
    feedback(ep.reply("<answer>5 - 3</answer>"))
    step = ep.reply("<answer>5 - 3</answer>")
    assert step.done and step.reward == 0.0 and step.messages == []
    assert step.info == {"solved": 0.0, "attempts": 2, "solved_by_turn1": 0.0, "solved_by_turn2": 0.0}


def test_single_attempt_is_single_turn():
    step = Episode(CountdownRetry(max_attempts=1), make_sample()).reply("no idea")
    assert step.done and step.reward == 0.0 and step.info["attempts"] == 1


def test_the_runs_last_turn_ends_the_episode_before_max_attempts():
    """rollout.max_turns below max_attempts: the kernel marks the last turn; the environment still scores it."""
    ep = Episode(CountdownRetry(max_attempts=5), make_sample(), max_turns=2)
    feedback(ep.reply("<answer>5 - 3</answer>"))
    step = ep.reply("<answer>5 * 3</answer>")
    assert step.done and step.reward == 0.0 and step.info["attempts"] == 2
    assert step.info["solved_by_turn5"] == 0.0


def test_binary_feedback_only_says_wrong():
    ep = Episode(CountdownRetry(feedback="binary", max_attempts=4), make_sample())
    for reply in ("<answer>3 * 5</answer>", "nothing", "<answer>5 + 7</answer>"):
        assert feedback(ep.reply(reply)) == BINARY_WRONG == "That is not correct. Try again."
    step = ep.reply("<answer>3 + 5</answer>")
    assert step.done and step.reward == 1.0 and step.info["solved_turn"] == 4


def test_episodes_keep_their_own_state():
    a, b = (Episode(CountdownRetry(max_attempts=2), make_sample()) for _ in range(2))
    feedback(a.reply("<answer>3 * 5</answer>"))
    assert b.reply("<answer>3 + 5</answer>").reward == 1.0  # b is at its first attempt, whatever a did
    assert a.reply("<answer>3 - 5</answer>").reward == 0.0


def test_step_without_start_reads_the_problem_from_the_turn():
    env = CountdownRetry()
    sample = make_sample()
    step = env.step(Turn(0, "<answer>3+5</answer>", [], [], [], sample))
    assert step.done and step.reward == 1.0


def test_a_malformed_ground_truth_fails_at_start():
    bad = Sample(prompt="p", data_source="countdown", ground_truth={"target": 3}, origin="x")
    with pytest.raises(ValueError, match="target' and 'numbers"):
        CountdownRetry().start(bad)


# --------------------------------------------------------------------------- the countdown plugin's rules


@pytest.mark.parametrize(
    "reply",
    [
        "<answer>3 + 5</answer>",
        "<answer>(5 + 3) * 1</answer>",
        "<answer>5 + 3 = 8</answer>",
        "<answer>3 + 5.000001</answer>",
        "<answer>3 * 5</answer>",
        "<answer>3 + 3 + 2</answer>",
        "<answer>16 / 2</answer>",
        "<answer>3 + 5 + 0</answer>",
        "<answer>3 + 5</answer> <answer>3</answer>",
        "<answer></answer>",
        "no answer at all",
        "<answer>eval('3+5')</answer>",
    ],
)
def test_correct_exactly_when_the_countdown_reward_says_so(reply):
    assert judge(reply, 8, [3, 5]).correct is countdown_reward(reply, {"target": 8, "numbers": [3, 5]})["correct"]


def test_solves_the_rows_of_the_countdown_dataset():
    """Rows of the default job's dataset, validated as the kernel does, rendered by the template."""
    options = {"size": 20, "seed": 0, "min_numbers": 2, "max_numbers": 2, "max_number": 10, "max_target": 20}
    rows = countdown_dataset("train", ops="+-", **options)
    for i, row in enumerate(islice(rows, 20)):
        sample = row_to_sample(row, f"dataset 'countdown' [train] row {i}", DataConfig())
        (msg,) = countdown_multiturn_template(sample)
        a, b = sample.ground_truth["numbers"]
        assert msg["role"] == "user" and f"[{a}, {b}]" in msg["content"]
        answers = [f"{a} + {b}", f"{a} - {b}", f"{b} - {a}"]
        target = sample.ground_truth["target"]
        right = next(x for x in answers if judge(f"<answer>{x}</answer>", target, [a, b]).correct)
        ep = Episode(CountdownRetry(), sample)
        assert ep.reply(f"<answer>{right}</answer>").reward == 1.0


def test_template_asks_for_tags_and_announces_another_try():
    (msg,) = countdown_multiturn_template(make_sample())
    assert msg == {
        "role": "user",
        "content": "Using the numbers [3, 5], create an equation that equals 8. You may use +, -, * and /, and "
        "must use each number exactly once. Reply with only the equation inside <answer> </answer> tags, for "
        "example <answer> (1 + 2) / 3 </answer>. If it is wrong, you will be told why and may try again.",
    }


# --------------------------------------------------------------------------- options


def test_options_defaults():
    env = CountdownRetry()
    assert (env.options.max_attempts, env.options.feedback, env.options.reward_decay) == (3, "value", 1.0)


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"feedback": "verbose"},
        {"reward_decay": 1.5},
        {"reward_decay": -0.1},
        {"max_attempt": 3},  # a typo is refused, not ignored
    ],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValidationError):
        CountdownRetry(**options)
    with pytest.raises(ValidationError):
        CountdownRetryOptions(**options)


# --------------------------------------------------------------------------- through plugrl


def test_loads_through_plugrls_loader():
    reg = load_plugins(["countdown", "countdown_multiturn"])
    spec = reg.environments["countdown_retry"]
    assert spec.plugin == "countdown_multiturn" and spec.factory is CountdownRetry
    assert spec.options is CountdownRetryOptions
    assert reg.templates["countdown_multiturn"].plugin == "countdown_multiturn"
    assert reg.templates["countdown"].plugin == "countdown"  # the countdown plugin's own, not registered twice
    assert [r.plugin for r in reg.rewards] == ["countdown"]
    assert check_registry(reg) == []
    env = spec.factory(max_attempts=2)
    assert isinstance(env.start(make_sample()), EnvStart)


def test_example_config_passes_the_plugin_checks():
    cfg = load_config(EXAMPLE)
    assert cfg.multi_turn and cfg.environment == "countdown_retry" and cfg.data.prefill == "<answer>"
    assert cfg.rollout.stop == ["</answer>"]  # each turn: "<answer>" (prefill) + expression + "</answer>"
    reg = load_plugins(cfg.plugins)
    check_config(cfg, reg)
    options = environment_options(cfg, reg.environments["countdown_retry"])
    assert options == {"max_attempts": 2, "feedback": "value", "reward_decay": 1.0, "format_score": 0.1}
    assert cfg.rollout.max_turns == options["max_attempts"]
    assert cfg.data.template in reg.templates


def test_bad_environment_options_stop_the_run_at_start_up():
    cfg = load_config(EXAMPLE, ["environment_options.max_attempts=0", "environment_options.feedbak=binary"])
    with pytest.raises(ConfigError) as err:
        check_config(cfg, load_plugins(cfg.plugins))
    assert "environment_options.max_attempts" in str(err.value)
    assert "environment_options.feedbak" in str(err.value) and "did you mean" in str(err.value)


@pytest.mark.slow
def test_example_config_trains_a_step(tiny_model, tmp_path):
    """The example through `plugrl train` on a tiny random model (the HF engine). test_examples' overrides cut
    data.max_response_length to 16, below the example's rollout.max_turn_tokens; here both shrink together."""
    from test_e2e import metrics, run_plugrl, tiny_overrides

    overrides = [*tiny_overrides(tiny_model, tmp_path, 1), "data.max_response_length=64", "rollout.max_turn_tokens=16"]
    run_plugrl(["train", str(EXAMPLE.relative_to(ROOT)), *overrides])
    (m,) = metrics(tmp_path / "e2e")
    assert m["actor/optimizer_steps"] >= 1 and m["env/errors"] == 0.0 and m["env/turns_mean"] >= 1.0
    lines = (tmp_path / "e2e" / "rollouts" / "step_000001.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert rows and all(r["environment"].startswith("environment 'countdown_retry'") for r in rows)


def test_format_score_rewards_a_well_formed_wrong_last_answer():
    from plugrl_envs_countdown.retry import CountdownRetry

    env = CountdownRetry(max_attempts=1, format_score=0.1)
    sample = Sample(prompt="", data_source="countdown", ground_truth={"target": 8, "numbers": [3, 5]}, origin="row 0")
    env.start(sample)
    wrong = env.step(Turn(0, "<answer> 3 * 5 </answer>", [], [], [], sample))
    assert wrong.done and wrong.reward == 0.1
    env = CountdownRetry(max_attempts=1, format_score=0.1)
    env.start(sample)
    assert env.step(Turn(0, "eight", [], [], [], sample)).reward == 0.0
