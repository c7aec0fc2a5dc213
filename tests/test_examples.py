"""Every example config trains a step on a tiny local model (the HF engine, the same code paths otherwise)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import yaml

from fixture_paths import GSM8K_FIXTURE
from test_e2e import ROOT, metrics, run_plugrl, tiny_overrides

# examples that need a server or a plugin of their own are tested beside that plugin
NEEDS_MORE = {
    "creativity_grpo_weighted.yaml",
    "tinyv_rrm.yaml",
    "gsm8k_grpo_rm.yaml",  # tests/plugins/test_reward_model.py, with the test reward model
}
# verifiers' classic API needs verifiers 0.2.0 (make setup installs 0.4): tests/test_envs_verifiers_v1.py trains it
# in a scratch environment with 0.2.0, where this file runs it too
if importlib.metadata.version("verifiers") != "0.2.0":
    NEEDS_MORE.add("verifiers_sums.yaml")
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml") if p.name not in NEEDS_MORE)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_config_trains(example, request, tmp_path):
    config = yaml.safe_load((ROOT / "examples" / example).read_text())
    # a vision-language example trains the tiny VLM (the test VLM with 2 text layers), the others the tiny llama
    vlm = "Idefics3" in config["model"]["path"]
    model = request.getfixturevalue("tiny_vlm" if vlm else "tiny_model")
    overrides = [*tiny_overrides(model, tmp_path, 2), "trainer.critic_warmup=0", "reward.overlong_buffer.len=4"]
    if "environment" in config:  # multi-turn: room for 2 turns
        overrides += ["data.max_response_length=48", "rollout.max_turn_tokens=12"]
    if "eval_taskset" in config.get("environment_options", {}):  # a verifiers v1 taskset's validation tasks: 2
        overrides += ["environment_options.eval_taskset.num_tasks=2"]
    if config.get("data", {}).get("dataset") == "gsm8k":  # openai/gsm8k from the hub: no network here
        overrides += [f"data.dataset_options.path={GSM8K_FIXTURE}"]
    run_plugrl(["train", f"examples/{example}", *overrides])
    m = metrics(Path(tmp_path) / "e2e")
    if config.get("trainer", {}).get("val_before_train"):  # its validation before any update: a row of step 0
        before, *m = m
        assert before["step"] == 0 and "val/all/pass@1" in before and "actor/optimizer_steps" not in before
    assert [x["step"] for x in m] == [1, 2]
    assert all(x["actor/optimizer_steps"] >= 1 for x in m)


@pytest.mark.slow
@pytest.mark.parametrize(
    "estimator", ["rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg", "grpo_passk"]
)
def test_every_estimator_trains(estimator, tiny_model, tmp_path):
    """Each estimator of the advantages plugin through a real training step (remax: with its greedy baseline)."""
    overrides = [*tiny_overrides(tiny_model, tmp_path, 1), f"algorithm.adv_estimator={estimator}"]
    run_plugrl(["train", "examples/countdown_grpo.yaml", *overrides])
    (m,) = metrics(Path(tmp_path) / "e2e")
    assert m["actor/optimizer_steps"] == 1 and "adv/mean" in m
    if estimator == "remax":
        assert m["timing/baseline"] > 0.0
