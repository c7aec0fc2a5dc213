"""Which reward scores a data_source (plugrl.rewards.routing.rewards_for), as verl's default scorer chooses: an exact
name; a name registered with casefold after strip().lower() (verl's `grade`); the most specific glob, so a
catch-all `*` coexists with `*_tinyv`; then reward.default. Rewards written here, no model."""

from __future__ import annotations

import pytest

from plugrl.config import Config, ConfigError
from plugrl.plugins import PluginError, check_config
from plugrl.rewards.routing import rewards_for
from plugrl.specs import Registry, RewardSpec


def _fn(completion, ground_truth):
    return 0.0


def _registry(*specs: RewardSpec, default: str | None = None) -> Registry:
    return Registry(rewards=list(specs), default_reward=default)


EXACT = RewardSpec("exact", _fn, ("openai/gsm8k",), plugin="a")
GRADE = RewardSpec("grade", _fn, ("grade",), plugin="g", casefold=True)
TINYV = RewardSpec("tinyv", _fn, ("*_tinyv",), plugin="t")
ANY = RewardSpec("anything", _fn, ("*",), plugin="c")


@pytest.mark.parametrize(
    ("data_source", "expected"),
    [
        ("openai/gsm8k", ["exact"]),
        ("OpenAI/GSM8K", ["anything"]),  # exact names match exactly unless registered with casefold
        (" Grade ", ["grade"]),
        ("GRADE", ["grade"]),
        ("math_tinyv", ["tinyv"]),  # *_tinyv is more specific than *
        ("something_else", ["anything"]),
    ],
)
def test_the_first_route_that_matches_decides(data_source, expected):
    assert [r.name for r in rewards_for(_registry(EXACT, GRADE, TINYV, ANY), data_source)] == expected


def test_reward_default_scores_what_nothing_else_matches():
    registry = _registry(EXACT, TINYV, default="exact")
    assert [r.name for r in rewards_for(registry, "x_tinyv")] == ["tinyv"]
    assert [r.name for r in rewards_for(registry, "unknown")] == ["exact"]
    assert rewards_for(_registry(EXACT, TINYV), "unknown") == []


def test_equally_specific_globs_of_two_plugins_are_an_error():
    vague = RewardSpec("vague", _fn, ("x_*",), plugin="o")
    assert [r.name for r in rewards_for(_registry(TINYV, vague), "x_tinyv")] == ["tinyv"]  # 6 literal characters vs 2
    same = RewardSpec("same", _fn, ("x_tiny*",), plugin="o")
    with pytest.raises(PluginError, match="matches reward patterns of several plugins: o, t"):
        rewards_for(_registry(TINYV, same), "x_tinyv")


def test_reward_default_must_name_a_registered_reward():
    cfg = Config.model_validate(
        {"model": {"path": "m"}, "plugins": ["grade"], "data": {"dataset": "d"}, "reward": {"default": "grade_rewrd"}}
    )
    from plugrl.plugins import load_plugins

    with pytest.raises(ConfigError, match=r"reward.default names no registered reward: 'grade_rewrd'; did you mean"):
        check_config(cfg, load_plugins(cfg.plugins))


def test_the_grade_plugin_matches_as_verl_does():
    from plugrl.plugins import load_plugins

    registry = load_plugins(["grade", "math"])
    assert [r.name for r in rewards_for(registry, " Grade")] == ["grade_reward"]
    assert "math_accuracy" in [r.name for r in rewards_for(registry, "DigitalLearningGmbH/MATH-lighteval")]


def _exact(completion, ground_truth):
    return float(completion == ground_truth)


def _length(completion, ground_truth=None):
    return len(completion) / 10


def test_reward_extra_scores_every_sample_beside_its_routes():
    """reward.extra names rewards applied to every data source after its routed ones (TRL's reward_funcs score
    every sample): a reward model beside a rule reward, summed with reward.weights."""
    from types import SimpleNamespace

    from plugrl.config import RewardConfig
    from plugrl.rewards import RewardItem, RewardRunner

    rule = RewardSpec("rule", _exact, ("countdown",), plugin="cd")
    model = RewardSpec("model_score", _length, ("reward_model",), plugin="rm")
    registry = Registry(rewards=[rule, model], extra_rewards=("model_score",))
    assert [r.name for r in rewards_for(registry, "countdown")] == ["rule", "model_score"]
    assert [r.name for r in rewards_for(registry, "reward_model")] == ["model_score"]  # not twice
    assert [r.name for r in rewards_for(registry, "unrouted")] == ["model_score"]

    runner = RewardRunner(registry, RewardConfig(num_workers=0, extra=["model_score"], weights={"model_score": 0.5}))
    try:

        def item(completion):
            sample = SimpleNamespace(prompt="q", data_source="countdown", ground_truth="42", row={}, uid="u")
            return RewardItem(sample, "q", completion)

        out = runner.score([item("42"), item("seven")])
    finally:
        runner.close()
    assert out.scores == pytest.approx([1.0 + 0.5 * 0.2, 0.0 + 0.5 * 0.5])
    assert out.metrics["reward/rule/mean"] == pytest.approx(0.5)
    assert out.metrics["reward/model_score/mean"] == pytest.approx(0.35)


def test_reward_extra_must_name_registered_rewards():
    from plugrl.plugins import load_plugins

    cfg = Config.model_validate(
        {"model": {"path": "m"}, "plugins": ["grade"], "data": {"dataset": "d"}, "reward": {"extra": ["grade_rewrd"]}}
    )
    with pytest.raises(ConfigError, match=r"reward.extra names no registered reward: 'grade_rewrd'; did you mean"):
        check_config(cfg, load_plugins(cfg.plugins))
