"""Environment families (``@plugrl.environment_family``): ``environment: family:id`` loads through the
family's ``load(id, **options)`` once at start-up; what it loads is registered under the full name, its
options went to ``load`` (not to each episode), and the data it brings is the run's when the config names
none. Problems are start-up errors naming the environment. A plugin module written here, no library."""

from __future__ import annotations

import sys
import textwrap

import pytest

from plugrl.config import Config, ConfigError
from plugrl.data import load_samples
from plugrl.plugins import check_config, load_plugins
from plugrl.rollout.routing import environment_for
from plugrl_multiturn.routing import environment_options

FAMILY = textwrap.dedent(
    """
    import plugrl
    from pydantic import BaseModel
    from plugrl.rollout.environment import Environment, EnvStep
    from plugrl.specs import DatasetSpec, EnvironmentSpec

    LOADS = []


    class Options(BaseModel):
        size: int = 2


    @plugrl.environment_family("fam", options=Options)
    def load(env_id, size):
        LOADS.append((env_id, size))
        if env_id == "plain":  # a class alone: no data of its own
            return Environment
        if env_id != "ok":
            raise KeyError(f"no environment {env_id!r}; known: ok, plain")

        class Episode(Environment):
            def step(self, turn):
                return EnvStep(done=True, reward=1.0)

            def reward(self):
                return 0.0

        def rows(split):
            n = size if split == "train" else 1
            return [{"prompt": [{"role": "user", "content": f"{split} {i}"}], "data_source": "fam"} for i in range(n)]

        return EnvironmentSpec(name="ignored", factory=Episode, dataset=DatasetSpec(name="ignored", fn=rows))
    """
)


@pytest.fixture
def family(tmp_path, monkeypatch):
    (tmp_path / "fam_plugin.py").write_text(FAMILY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield sys.modules.setdefault("fam_plugin", __import__("fam_plugin"))
    sys.modules.pop("fam_plugin", None)


def _checked(**raw):
    cfg = Config.model_validate({"model": {"path": "unused"}, "plugins": ["fam_plugin:"], **raw})
    registry = load_plugins(cfg.plugins)
    check_config(cfg, registry)
    return cfg, registry


def test_a_family_loads_its_environment_once_with_the_options(family):
    cfg, registry = _checked(environment="fam:ok", environment_options={"size": 3})
    spec = registry.environments["fam:ok"]
    assert family.LOADS == [("ok", 3)]
    assert (spec.name, spec.family, spec.plugin) == ("fam:ok", "fam", "fam_plugin:")
    assert spec.scores_episodes and environment_options(cfg, spec) == {}  # the options went to load()
    assert environment_for(cfg, registry, "anything") is spec


def test_the_data_an_environment_brings_is_the_runs_when_none_is_named(family, tmp_path):
    cfg, registry = _checked(environment="fam:ok", environment_options={"size": 3})
    assert cfg.data.dataset == "fam:ok"
    train, _ = load_samples(cfg.data, registry, ground_truth_optional=lambda ds: True)
    val, _ = load_samples(cfg.data, registry, split="test", ground_truth_optional=lambda ds: True)
    assert [s.prompt[0]["content"] for s in train] == ["train 0", "train 1", "train 2"] and len(val) == 1
    data = tmp_path / "mine.jsonl"
    data.write_text('{"prompt": "q", "data_source": "fam"}\n')
    cfg, _ = _checked(environment="fam:ok", data={"train_files": [str(data)]})
    assert cfg.data.dataset is None  # the config's own data wins


def test_routes_load_each_family_member_with_its_own_options(family, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "q", "data_source": "a"}\n')
    cfg, registry = _checked(
        environment={"a": "fam:ok", "b*": "fam:plain"},
        environment_options={"fam:ok": {"size": 5}},
        data={"train_files": [str(data)]},
    )
    assert sorted(family.LOADS) == [("ok", 5), ("plain", 2)]
    assert environment_for(cfg, registry, "b1").factory is sys.modules["plugrl.rollout.environment"].Environment
    assert not registry.environments["fam:plain"].scores_episodes


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"environment": "fam:nope"},
            r"environment 'fam:nope' \(plugin 'fam_plugin:'\) failed to load: KeyError: .*known: ok",
        ),
        ({"environment": "fam:ok", "environment_options": {"size": "x"}}, r"environment_options\.size"),
        ({"environment": "fam", "data": {"dataset": "d"}}, r"'fam' is a family of environments.*'fam:<id>'"),
        ({"environment": "other:x"}, r"names no registered environment: 'other:x'"),
    ],
)
def test_a_family_problem_is_a_start_up_error_naming_it(family, raw, message):
    with pytest.raises(ConfigError, match=message):
        _checked(**raw)


def test_an_unloaded_first_party_family_names_the_plugin_to_install(family):
    hint = r"family 'verifiers' is not loaded; add plugin 'verifiers'.*plugrl-envs-verifiers"
    with pytest.raises(ConfigError, match=hint):
        _checked(environment="verifiers:x")


def test_a_config_without_data_is_refused_unless_a_family_may_bring_it():
    with pytest.raises(ValueError, match="no training data"):
        Config.model_validate({"model": {"path": "m"}, "environment": "plain_env"})
    Config.model_validate({"model": {"path": "m"}, "environment": "fam:ok"})  # checked once it has loaded
