"""Packages add keys to the run config (entry-point group plugrl.config_fields): each gives a ConfigFields whose
section models join the kernel's sections, validators and all. A third party's keys are read, checked, suggested,
written down and named as not acted on like the kernel's; a package whose fields fail to load is named and left
out, and its keys are refused with the reason; a fields module that asks for the built classes while they are built
is told why."""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import logging
import pickle

import pytest
import yaml

from plugrl import config
from plugrl.config import ConfigError, build_config, dump_config, ignored_keys

BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}

BUDGET_FIELDS = """
from pydantic import Field, model_validator

from plugrl.config import ConfigFields, Section


class BudgetKeys(Section):
    token_budget: int = Field(3, ge=0, description="A third party's key.")


class BudgetChecks(Section):
    @model_validator(mode="after")
    def _within_the_epochs(self):
        if self.trainer.token_budget > 10 * self.trainer.total_epochs:
            raise ValueError("trainer.token_budget is more than 10 x trainer.total_epochs")
        return self


def ignored(cfg):
    return ["trainer.token_budget (nothing spends it)"] if cfg.trainer.token_budget == 0 else []


FIELDS = ConfigFields(sections={"trainer": BudgetKeys, "": BudgetChecks}, ignored=ignored)
"""


@pytest.fixture
def fields_from(monkeypatch, local_plugin):
    """``fields_from(package, module_source)``: the installed packages' fields plus that package's (its entry point
    in plugrl.config_fields naming ``module:FIELDS``), loaded as the kernel loads them; the config's classes are
    built anew for the test."""

    def install(package: str, source: str | None) -> None:
        module = local_plugin(f"fields_{package.replace('-', '_')}", source) if source else "no_such_module_here"
        real = importlib.metadata.entry_points
        ep = importlib.metadata.EntryPoint(package, f"{module}:FIELDS", config.FIELDS_GROUP)

        def patched(**kw):
            return [*real(**kw), ep] if kw.get("group") == config.FIELDS_GROUP else real(**kw)

        monkeypatch.setattr(importlib.metadata, "entry_points", patched)
        monkeypatch.setattr(config, "installed_fields", functools.cache(config.installed_fields.__wrapped__))
        monkeypatch.setattr(config, "_built", {})
        monkeypatch.setattr(config, "_failed", {})

    return install


def test_the_packages_keys_join_the_kernels_sections():
    from plugrl.config import Config, KernelConfig, RolloutConfig, RolloutSection

    assert issubclass(Config, KernelConfig) and issubclass(RolloutConfig, RolloutSection)
    assert "server_urls" in RolloutConfig.model_fields and "server_urls" not in RolloutSection.model_fields
    assert config.key_packages()["rollout.server_urls"] == "plugrl-rollout-servers"
    cfg = build_config(copy.deepcopy(BASE), ["rollout.servers=2", "rollout.mode=server"])
    assert pickle.loads(pickle.dumps(cfg)).rollout.servers == 2  # the built classes pickle by their public names
    for key, package in config.PACKAGE_KEYS.items():  # every key of plugrl's own packages is one they add
        assert any(key == k or key.startswith(k + ".") for k in config.key_packages()), (key, package)


def test_a_third_partys_keys_are_read_checked_and_named_like_the_kernels(fields_from):
    fields_from("plugrl-budget", BUDGET_FIELDS)
    cfg = build_config(copy.deepcopy(BASE), ["trainer.token_budget=7"])
    assert cfg.trainer.token_budget == 7
    assert yaml.safe_load(dump_config(cfg))["trainer"]["token_budget"] == 7
    assert config.key_packages()["trainer.token_budget"] == "plugrl-budget"
    with pytest.raises(ConfigError) as err:
        build_config(copy.deepcopy(BASE), ["trainer.token_budget=70"])
    assert "trainer.token_budget is more than 10 x trainer.total_epochs" in str(err.value)
    with pytest.raises(ConfigError) as err:
        build_config(copy.deepcopy(BASE), ["trainer.token_budgte=7"])
    assert "unknown key 'trainer.token_budgte'; did you mean 'trainer.token_budget'?" in str(err.value)
    assert "trainer.token_budget (nothing spends it)" in ignored_keys(
        build_config(copy.deepcopy(BASE), ["trainer.token_budget=0"])
    )


def test_a_package_whose_fields_fail_to_load_is_named_and_its_keys_say_why(fields_from, monkeypatch, caplog):
    fields_from("plugrl-budget", None)
    monkeypatch.setitem(config.PACKAGE_KEYS, "trainer.token_budget", "plugrl-budget")
    with caplog.at_level(logging.WARNING, logger="plugrl.config"):
        cfg = build_config(copy.deepcopy(BASE))  # a run that does not use its keys is not stopped
    assert "plugrl-budget: its config fields (no_such_module_here:FIELDS) failed to load" in caplog.text
    assert "server_urls" in type(cfg.rollout).model_fields  # the other packages' keys are all there
    with pytest.raises(ConfigError) as err:
        build_config(copy.deepcopy(BASE), ["trainer.token_budget=1"])
    assert str(err.value).splitlines()[1] == (
        "  trainer.token_budget is a key of the package plugrl-budget, whose config fields failed to load: "
        "ModuleNotFoundError: No module named 'no_such_module_here'"
    )


def test_a_fields_module_that_asks_for_the_built_classes_is_told_why(fields_from, caplog):
    fields_from("plugrl-eager", "from plugrl.config import Config\n" + BUDGET_FIELDS)
    with caplog.at_level(logging.WARNING, logger="plugrl.config"):
        cfg = build_config(copy.deepcopy(BASE))
    assert "token_budget" not in type(cfg.trainer).model_fields
    assert config._failed["plugrl-eager"] == (
        "ImportError: plugrl.config.Config was asked for while the config's classes are built: a module of the "
        "group plugrl.config_fields may import Section and helpers from plugrl.config, not the built classes"
    )


def test_a_key_two_owners_add_is_an_error_naming_both(fields_from):
    fields_from("plugrl-clash", BUDGET_FIELDS.replace("token_budget: int", "total_epochs: int"))
    with pytest.raises(ConfigError, match=r"^plugrl-clash adds the config key trainer.total_epochs, which the kernel "):
        build_config(copy.deepcopy(BASE))


def test_a_runs_config_yaml_read_without_a_package_leaves_its_keys_out_saying_so(
    tmp_path, without_config_fields, caplog
):
    """A run's config.yaml writes every key, those of its packages at their defaults too: read as the run's record
    (``plugrl eval`` of its checkpoint) where a package is not installed, they are left out with a warning; a
    config the user writes still has them refused."""
    from plugrl.config import load_config

    record = tmp_path / "config.yaml"
    record.write_text(dump_config(build_config(copy.deepcopy(BASE), ["algorithm.filter_groups.enable=true"])))
    without_config_fields("plugrl-dapo")
    with pytest.raises(ConfigError, match="algorithm.filter_groups.enable is a key of the package plugrl-dapo"):
        load_config(record)
    with caplog.at_level(logging.WARNING, logger="plugrl.config"):
        cfg = load_config(record, ["trainer.total_epochs=2"], run_record=True)
    assert cfg.trainer.total_epochs == 2 and not hasattr(cfg.algorithm, "filter_groups")
    shown = "keys of packages not installed here, left out: data.gen_batch_size (plugrl-dapo), "
    assert f"{record}: {shown}" in caplog.text and "algorithm.filter_groups (plugrl-dapo)" in caplog.text
