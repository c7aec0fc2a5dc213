"""verl's trainer config, key by key, against the real one: verl 0.9.1's ``_generated_ppo_trainer.yaml``, read from
the installed wheel (``make setup`` installs it without its dependencies; nothing of verl is imported).

Every key has a fate in plugrl (acted on, accepted and not acted on, or refused), every key typed at verl's own
default is accepted, and the defaults plugrl applies to a run given as overrides only are verl's."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugrl.config import ConfigError, build_config, is_plugrl_key
from plugrl_compat.verl import load_overrides, verl_config_keys, verl_key_table
from plugrl_compat.verl_keys import DIFFERS_FROM_VERL, VERL_DEFAULTS, fate_of


@pytest.fixture(scope="module")
def verl_keys() -> dict[str, Any]:
    try:
        return verl_config_keys()
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("verl is not installed (make setup installs its wheel without dependencies)")


def _interpolated(value: Any) -> bool:
    """A value verl computes from another key (``${...}``) or requires (``???``): not one a user types."""
    return isinstance(value, str) and ("${" in value or value == "???")


def test_every_key_of_verls_trainer_config_has_a_fate(verl_keys):
    assert len(verl_keys) > 800  # the whole file, not a section of it
    without = [key for key, value in verl_keys.items() if fate_of(key, value, is_plugrl_key) is None]
    assert without == []


def test_every_key_typed_at_verls_default_is_accepted(verl_keys):
    """A verl script that spells out verl's defaults loads: no key is refused at the value verl ships."""
    refused = {
        key: fate.why
        for key, value in verl_keys.items()
        if not _interpolated(value) and (fate := fate_of(key, value, is_plugrl_key)).kind == "refused"
    }
    assert refused == {}


def test_verls_defaults_all_typed_build_one_config(verl_keys):
    """Every key at its default (null included), as overrides on verl's defaults: one valid config, each key with its
    fate; verl's nulls ("verl decides") leave plugrl's defaults."""
    overrides = [
        f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
        for key, value in verl_keys.items()
        if not _interpolated(value)
    ]
    cfg = load_overrides(overrides)
    fates = {f.key: f for f in cfg._key_fates}
    assert set(fates) == {o.split("=", 1)[0] for o in overrides}
    assert cfg.algorithm.adv_estimator == "gae" and cfg.data.train_batch_size == 1024 and cfg.rollout.n == 1
    assert cfg.trainer.max_checkpoints == 2 and fates["trainer.max_actor_ckpt_to_keep"].kind == "not acted"


def test_plugrls_verl_defaults_are_verls(verl_keys):
    wrong = {key: (value, verl_keys.get(key)) for key, value in VERL_DEFAULTS.items() if verl_keys.get(key) != value}
    assert wrong == {}
    assert set(DIFFERS_FROM_VERL) - set(verl_keys) <= {"reward.num_workers"} | set(verl_keys)


def test_a_run_given_as_overrides_only_takes_verls_defaults():
    cfg = load_overrides(["actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet"])
    assert (cfg.algorithm.adv_estimator, cfg.data.train_batch_size, cfg.rollout.n) == ("gae", 1024, 1)
    assert (cfg.data.max_response_length, cfg.data.filter_overlong_prompts) == (512, False)
    assert (cfg.actor.optim.weight_decay, cfg.actor.ppo_mini_batch_size, cfg.trainer.total_epochs) == (0.01, 256, 30)
    assert cfg.model.enable_gradient_checkpointing is True and cfg.trainer.val_before_train is True
    assert cfg.trainer.logger == ["console", "wandb", "jsonl"] and cfg.trainer.save_freq == -1
    assert cfg.trainer.run_dir == Path("checkpoints/verl_examples/gsm8k")
    assert cfg.data.val_files == ["~/data/rlhf/gsm8k/test.parquet"]
    named = load_overrides(["actor_rollout_ref.model.path=/m", "trainer.project_name=P", "trainer.experiment_name=E"])
    assert named.trainer.run_dir == Path("checkpoints/P/E")
    # verl's defaults are not the user's: a critic default does not count as critic keys set for GRPO
    grpo = load_overrides(["actor_rollout_ref.model.path=/m", "algorithm.adv_estimator=grpo"])
    assert grpo.critic.model_fields_set == set()


def test_a_plugrl_config_keeps_plugrls_defaults():
    cfg = build_config({"model": {"path": "/m"}, "data": {"train_files": ["t.parquet"]}})
    assert (cfg.algorithm.adv_estimator, cfg.data.train_batch_size, cfg.rollout.n) == ("grpo", 16, 8)
    assert cfg.trainer.save_freq == "end"


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("actor_rollout_ref.actor.strategy=megatron", "plugrl trains with FSDP2"),
        ("actor_rollout_ref.rollout.data_parallel_size=2", "one engine per"),
        ("trainer.val_only=True", "plugrl eval"),
        ("reward_model.reward_manager=my_manager", "other managers need verl"),
        ("sandbox_fusion.url=http://x:8080", "plugrl runs code in its own sandbox"),
    ],
)
def test_a_verl_value_plugrl_cannot_honour_is_refused_with_the_fix(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_overrides(["actor_rollout_ref.model.path=/m", override])
    assert override.split("=")[0] in str(e.value) and fragment in str(e.value)
    assert e.value.fates  # --check prints them


def test_the_docs_key_table_is_every_key_of_verls_file(verl_keys):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "coming_from_verl.md").read_text()
    table = doc.split("<!-- verl-keys:begin -->\n", 1)[1].split("<!-- verl-keys:end -->", 1)[0]
    assert table == verl_key_table(verl_keys), "stale: python -m plugrl_compat.verl docs/coming_from_verl.md"
    assert len(table.splitlines()) == len(verl_keys) + 2


def test_verls_resume_modes():
    """verl's trainer.resume_mode: auto and disable as in plugrl; resume_path resumes from trainer.resume_from_path
    (and without it is an error naming both keys as typed)."""
    base = ["actor_rollout_ref.model.path=/m"]
    assert load_overrides([*base, "trainer.resume_mode=disable"]).trainer.resume == "disable"
    cfg = load_overrides([*base, "trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/step_000010"])
    assert cfg.trainer.resume == "/ckpt/step_000010"
    with pytest.raises(ConfigError, match=r"trainer.resume_mode=resume_path resumes from trainer.resume_from_path"):
        load_overrides([*base, "trainer.resume_mode=resume_path"])
