"""TRL's reward_funcs and reward_weights applied as TRL applies them, and TRL reward functions on multi-turn and tool
episodes given the completion as TRL gives it.

The reward functions are TRL's own (trl.rewards, real) and functions written here in TRL's style. What TRL's
GRPOTrainer computes from them (TRL 1.16, `_calculate_rewards` and `_generate_and_score_completions`: each
function's list with None as NaN, the weighted NaN-skipping sum, `rewards/<name>/mean` as the NaN-mean and `/std`
as TRL's nanstd) is computed here with torch and TRL's nanstd, and compared with plugrl's scores and metrics."""

from __future__ import annotations

import json
import sys
import textwrap
from types import SimpleNamespace

import pytest

from episode_helpers import tool_call
from plugrl.config import RewardConfig
from plugrl.data import Sample
from plugrl.rewards import RewardError, RewardItem, RewardRunner
from plugrl.specs import Registry
from plugrl_compat.trl_reward_funcs import use_reward_funcs

MY_REWARDS = textwrap.dedent(
    '''
    """Reward functions written for TRL's reward_funcs."""


    def says_answer(completions, answer, **kwargs):
        return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]


    def short_only(completions, completion_ids, **kwargs):
        """None where it does not apply (long completions), as TRL allows."""
        return [len(ids) / 1000 if len(ids) < 1200 else None for ids in completion_ids]
    '''
)


@pytest.fixture
def my_rewards(tmp_path, monkeypatch):
    (tmp_path / "my_trl_rewards.py").write_text(MY_REWARDS)
    monkeypatch.chdir(tmp_path)  # TRL's grpo.py imports a dotted path from the directory it runs in
    yield tmp_path
    sys.modules.pop("my_trl_rewards", None)


def _runner(funcs, weights=None, default_weight=1.0):
    cfg = SimpleNamespace(
        reward=RewardConfig(reward_funcs=funcs, weights=weights or {}, default_weight=default_weight, num_workers=0)
    )
    registry = Registry()
    use_reward_funcs(cfg, registry)
    return RewardRunner(registry, cfg.reward)


COMPLETIONS = [
    ("<think>\nadd them\n</think>\nThe answer is 42.", "42", list(range(5))),
    ("The answer is 41.", "42", list(range(1300))),  # over the soft-overlong cache: punished
    ("<think>x</think><think>y</think> 42", "42", list(range(1100))),
]


def _items():
    prompt = [{"role": "user", "content": "What is 40 + 2?"}]
    items = []
    for i, (text, answer, ids) in enumerate(COMPLETIONS):
        sample = Sample(
            prompt=prompt, data_source="anything", ground_truth=answer, row={"answer": answer}, origin=f"{i}"
        )
        items.append(RewardItem(sample, "What is 40 + 2?", text, completion_ids=ids))
    return items


def test_reward_funcs_score_and_sum_as_trls_trainer(my_rewards):
    """TRL's own functions by name (with the script's soft-overlong values) and the user's by `module.function` and
    `module:function`, weighted by reward_weights: the scores are TRL's NaN-skipping weighted sums, the metrics its
    per-function NaN-mean and nanstd."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl", reason="TRL is not installed (make setup installs it)")
    from trl.rewards import get_soft_overlong_punishment, think_format_reward
    from trl.trainer.utils import nanstd

    names = ["think_format_reward", "soft_overlong_punishment_reward", "says_answer", "short_only"]
    weights = {"think_format_reward": 0.5, "soft_overlong_punishment_reward": 1.0, "says_answer": 2.0}
    runner = _runner(
        [
            "think_format_reward",
            "get_soft_overlong_punishment",
            "my_trl_rewards.says_answer",
            "my_trl_rewards:short_only",
        ],
        weights,
    )
    out = runner.score(_items())
    mine = sys.modules["my_trl_rewards"]  # loaded from the current directory, as TRL's script does

    prompts = [[{"role": "user", "content": "What is 40 + 2?"}]] * 3
    completions = [[{"role": "assistant", "content": text}] for text, _, _ in COMPLETIONS]
    kwargs = {"prompts": prompts, "completions": completions, "completion_ids": [ids for _, _, ids in COMPLETIONS]}
    answers = [a for _, a, _ in COMPLETIONS]
    columns = [
        think_format_reward(**kwargs),
        get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)(**kwargs),
        mine.says_answer(answer=answers, **kwargs),
        mine.short_only(**kwargs),
    ]
    per_func = torch.tensor([[float("nan") if v is None else v for v in col] for col in columns]).T  # (B, funcs)
    w = torch.tensor([weights.get(n, 1.0) for n in names])  # short_only: TRL's default weight 1
    expected = (per_func * w).nansum(dim=1)
    assert out.scores == pytest.approx(expected.tolist())
    assert columns[1][1] == -1.0 and columns[3][1] is None  # the cases hold: punished, not applicable
    for j, name in enumerate(names):
        assert out.metrics[f"reward/{name}/mean"] == pytest.approx(torch.nanmean(per_func[:, j]).item())
        assert out.metrics[f"reward/{name}/std"] == pytest.approx(nanstd(per_func[:, j]).item(), abs=1e-6)


def test_trl_metric_names_of_the_reward_functions(my_rewards):
    from plugrl_compat.trl_metrics import trl_aliases

    out = _runner(["think_format_reward"]).score(_items())
    aliases = trl_aliases(out.metrics)
    assert aliases["rewards/think_format_reward/mean"] == out.metrics["reward/think_format_reward/mean"]
    assert aliases["rewards/think_format_reward/std"] == out.metrics["reward/think_format_reward/std"]


def test_a_reward_funcs_entry_that_cannot_load_is_named(my_rewards):
    with pytest.raises(RewardError, match=r"'accuracy_rewardz' is not a reward function TRL's script knows"):
        _runner(["accuracy_rewardz"])
    with pytest.raises(RewardError, match=r"'no_such_module.f': importing 'no_such_module' failed"):
        _runner(["no_such_module.f"])
    with pytest.raises(RewardError, match=r"'my_trl_rewards:nothing': module 'my_trl_rewards' has no 'nothing'"):
        _runner(["my_trl_rewards:nothing"])
    registry = Registry()
    registry.rewards.append(_runner(["my_trl_rewards.says_answer"]).registry.rewards[0])
    with pytest.raises(RewardError, match="registers a reward of that name too"):
        use_reward_funcs(SimpleNamespace(reward=RewardConfig(reward_funcs=["my_trl_rewards.says_answer"])), registry)


def test_default_weight_reweighs_a_plugins_reward_and_says_so(caplog):
    """A TRL run weighs every reward 1.0 (reward.default_weight): the math plugin's format reward, 0.2 in plugrl's
    own configs, counts fully, and the start says so."""
    import logging

    from plugrl.plugins import load_plugins

    registry = load_plugins(["math"])
    with caplog.at_level(logging.INFO, logger="plugrl.rewards"):
        runner = RewardRunner(registry, RewardConfig(default_weight=1.0, num_workers=0))
    fmt = next(p for p in runner._plans.values() if p.name == "think_answer_format")
    assert fmt.spec.weight != 1.0 and fmt.weight == 1.0
    assert "reward.default_weight=1 weighs think_answer_format (0.2)," in caplog.text
    tags = next(p for p in runner._plans.values() if p.name == "tag_count")
    assert tags.spec.weight == 0 and tags.weight == 0  # a reward its plugin turns off stays off
    plain = RewardRunner(registry, RewardConfig(num_workers=0))
    assert next(p for p in plain._plans.values() if p.name == "think_answer_format").weight == fmt.spec.weight


# ---- multi-turn and tool episodes


def used_the_wallet(completions, target, **kwargs):
    """A TRL agent reward as TRL's docs write them: the episode's messages, its tool calls and their answers."""
    rewards = []
    for completion, goal in zip(completions, target, strict=True):
        calls = [c for m in completion if m["role"] == "assistant" for c in m.get("tool_calls", [])]
        answers = [m["content"] for m in completion if m["role"] == "tool"]
        done = completion[-1]["role"] == "assistant" and "Done" in completion[-1]["content"]
        rewards.append(1.0 if calls and answers and answers[-1] == str(goal) and done else 0.0)
    return rewards


def test_a_trl_reward_sees_the_whole_tool_episode(smol_tokenizer):
    """Two Wallet episodes (TRL environment_factory class, real SmolLM2 tokenizer, scripted replies): the reward gets
    each episode's turns as TRL's GRPOTrainer passes them, so TRL's style of agent reward scores them (it scored 0
    when it saw only the last reply)."""
    from plugrl.rewards import trl_reward
    from plugrl.rollout.adapters import trl_environment
    from plugrl.rollout.play import score_episodes
    from test_multiturn import SAMPLING, _start
    from test_multiturn import _runner as episode_runner
    from test_trl_environments import Wallet, _scripted, _wallet_sample

    tok = smol_tokenizer
    spec = trl_environment(Wallet)
    engine = _scripted(
        tok,
        {
            "Wallet 0": ["Let me pay. " + tool_call("deposit", amount=2), tool_call("deposit", amount=1), "Done."],
            "Wallet 1": ["Done."],
        },
    )
    runner, _, _ = episode_runner(engine, tok, turn_tokens=64, max_turns=4)
    samples = [_wallet_sample(0, 3), _wallet_sample(1, 3)]
    played = runner.run([_start(tok, s, spec.factory) for s in samples], SAMPLING)
    for (_, c), s in zip(played, samples, strict=True):
        c.reward = None  # score with the reward function, not the environment's get_reward
        s.row["target"] = 3
    registry = Registry(rewards=[trl_reward(used_the_wallet, data_sources=["wallet"])])
    rewards = RewardRunner(registry, RewardConfig(num_workers=0))
    episodes = [(SimpleNamespace(sample=s, text="prompt"), r, c) for s, (r, c) in zip(samples, played, strict=True)]
    out = score_episodes(rewards, episodes, [c.last_reply for _, c in played])
    assert out.scores == [1.0, 0.0]
    completion = played[0][1].trl_completion()
    assert completion == [
        {
            "role": "assistant",
            "content": "Let me pay.",
            "tool_calls": [{"type": "function", "function": {"name": "deposit", "arguments": {"amount": 2}}}],
        },
        {"role": "tool", "name": "deposit", "content": "2"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "deposit", "arguments": {"amount": 1}}}],
        },
        {"role": "tool", "name": "deposit", "content": "3"},
        {"role": "assistant", "content": "Done."},
    ]
    assert played[0][1].trl_prompt == [{"role": "user", "content": "Wallet 0. Reach 3."}]  # reset()'s observation
    assert played[1][1].trl_completion() == [{"role": "assistant", "content": "Done."}]


def test_a_malformed_call_stays_text_as_trl_decodes_it():
    from plugrl.rollout.tools import ToolCall
    from plugrl_multiturn.records import trl_assistant

    bad = ToolCall("deposit", {}, raw="<tool_call>{oops</tool_call>", error="not JSON")
    assert trl_assistant("x <tool_call>{oops</tool_call>", [bad]) == {
        "role": "assistant",
        "content": "x <tool_call>{oops</tool_call>",
    }


def test_an_agents_turns_are_given_in_trls_shape():
    """An openai_agent's conversation (its requests' messages: OpenAI tool_calls with JSON arguments, tool answers
    carrying only the call id) reaches a TRL reward in TRL's shape."""
    from plugrl.rollout.multiturn import Conversation

    c = Conversation(
        [
            {"role": "user", "content": "pay 3"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "deposit", "arguments": '{"amount": 3}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
            {"role": "assistant", "content": "Done."},
        ],
        "agent",
        prompt_count=1,
    )
    assert c.trl_completion() == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "deposit", "arguments": {"amount": 3}}}],
        },
        {"role": "tool", "name": "deposit", "content": "3"},
        {"role": "assistant", "content": "Done."},
    ]


# ---- end to end

TRL_YAML = """\
model_name_or_path: {model}
bf16: false
use_vllm: false
datasets:
  - path: json
    data_files: {data}
field_mapping: {{question_field: problem, answer_field: answer}}
reward_funcs: [think_format_reward, my_trl_rewards.says_answer]
reward_weights: [0.5, 2.0]
loss_type: cispo
epsilon_high: 5.0
per_device_train_batch_size: 4
num_generations: 2
max_steps: 1
max_completion_length: 8
max_prompt_length: 256
learning_rate: 1.0e-4
report_to: none
output_dir: {out}
"""


@pytest.mark.slow
def test_a_trl_yaml_with_reward_funcs_trains_given_as_the_config(tiny_model, my_rewards, capsys):
    """`plugrl train grpo.yaml`, a TRL file (no --trl-config) whose rewards are reward_funcs only: TRL's
    think_format_reward and a function of the user's module, weighted; loss_type cispo. One step on the tiny model;
    every sample's reward is the weighted sum of the two, and the metrics carry TRL's names."""
    from pathlib import Path

    from plugrl.cli import main

    pytest.importorskip("trl", reason="TRL is not installed (make setup installs it): think_format_reward is TRL's")
    root = Path(__file__).resolve().parent.parent
    out = my_rewards / "run"
    path = my_rewards / "grpo.yaml"
    path.write_text(TRL_YAML.format(model=tiny_model, data=root / "examples" / "data" / "math_tiny.jsonl", out=out))
    assert main(["train", str(path), "reward.num_workers=0", "trainer.save_freq=0"]) == 0, capsys.readouterr().err[
        -3000:
    ]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    m = metrics[0]
    assert "rewards/think_format_reward/mean" in m and "rewards/says_answer/std" in m
    rows = [json.loads(line) for line in (out / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        d = row["details"]
        assert row["reward"] == pytest.approx(0.5 * d["think_format_reward"] + 2.0 * d["says_answer"])
    config = (out / "config.yaml").read_text()
    assert "loss_mode: cispo" in config and "reward_funcs:" in config
