"""LoRA is plugrl-lora's (plugins/lora): its keys (actor.lora, critic.lora, rollout.lora_sync) through the
entry-point group plugrl.config_fields, its implementation through plugrl.model_adapters. The kernel's seam
(plugrl.model_adapters) finds it, a run without adapters never imports the implementation, and without the package
every way of asking for adapters (actor.lora.r, verl's lora_rank, critic.lora.r, plugrl eval or export --merge of a
LoRA checkpoint) is refused naming the key and the package, before any model loads."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import pytest
import torch

from plugrl import checkpoint, cli, model_adapters
from plugrl.config import ActorConfig, ConfigError, ModelConfig, build_config
from test_export import _run

BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}
HINT = "pip install plugrl-lora (in a plugrl checkout: pip install -e plugins/lora)"
MISSING = rf"LoRA adapters are in the package plugrl-lora, which is not installed: {re.escape(HINT)}"


@pytest.fixture
def without_the_kit(hide_entry_points):
    """plugrl-lora's implementation gone (its keys still known), as where the package is not installed."""
    hide_entry_points(model_adapters.GROUP)


@pytest.fixture
def without_the_package(without_the_kit, without_config_fields):
    """plugrl-lora's keys and implementation gone, as where the package is not installed."""
    without_config_fields("plugrl-lora")


def test_the_kit_is_plugrl_loras_and_its_adapters_do_what_the_kernel_calls(tiny_model):
    import plugrl_lora.kit

    kit = model_adapters.kit("actor.lora.r=4")
    assert kit is plugrl_lora.kit
    for name in ("add_adapters", "merge_to_folder", "vllm_load_adapter"):
        assert callable(getattr(kit, name)), name
    from plugrl.actor import PolicyModel

    actor = ActorConfig(lora={"r": 4, "alpha": 8})
    model = ModelConfig(path=str(tiny_model), dtype="float32")
    policy = PolicyModel(str(tiny_model), model, actor, torch.device("cpu"))
    protocol = [n for n in vars(model_adapters.Adapted) if not n.startswith("_")]
    assert set(protocol) >= {"state", "save", "load", "merged_parameters", "engine_adapter", "dropout_off"}
    assert isinstance(policy.adapters, plugrl_lora.kit.LoRAAdapters)
    assert all(callable(getattr(policy.adapters, n)) for n in protocol)
    state = policy.adapters.state(policy.device)
    assert state and all(".lora_A." in n or ".lora_B." in n for n in state)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["actor.lora.r=8"], ["actor.lora.r"]),
        (["actor_rollout_ref.model.lora_rank=16"], ["actor_rollout_ref.model.lora_rank"]),  # verl's spelling
        (["algorithm.adv_estimator=gae", "critic.lora.r=4"], ["critic.lora.r"]),
        (
            ["actor.lora.r=2", "critic.lora.r=4", "rollout.lora_sync=adapter"],
            ["actor.lora.r", "critic.lora.r", "rollout.lora_sync"],
        ),
    ],
)
def test_a_config_with_adapters_without_the_package_is_refused(without_the_package, overrides, key):
    with pytest.raises(ConfigError) as err:
        build_config(copy.deepcopy(BASE), overrides)
    lines = str(err.value).splitlines()[1:]
    assert lines == [f"  {k} is a key of the package plugrl-lora, which is not installed: {HINT}" for k in key]


def test_a_run_without_adapters_does_not_need_the_package(without_the_package):
    for cfg in (build_config(copy.deepcopy(BASE)), build_config(copy.deepcopy(BASE), ["algorithm.adv_estimator=gae"])):
        assert model_adapters.settings(cfg.actor) is None and model_adapters.settings(cfg.critic) is None


def test_a_policy_with_adapters_without_the_implementation_names_it(without_the_kit, tiny_model):
    from plugrl.actor import PolicyModel

    actor = ActorConfig(lora={"r": 4})
    with pytest.raises(ConfigError, match=rf"^actor.lora.r=4: {MISSING}$"):
        PolicyModel(str(tiny_model), ModelConfig(path=str(tiny_model), dtype="float32"), actor, torch.device("cpu"))


@pytest.fixture(scope="module")
def lora_ckpt(tiny_model, smol_tokenizer, tmp_path_factory):
    run = _run(tmp_path_factory.mktemp("lora_package") / "run", tiny_model, smol_tokenizer, {"r": 4, "alpha": 8}, 1)
    return checkpoint.latest_checkpoint(run)


def test_eval_and_export_of_a_lora_checkpoint_without_the_implementation_name_it(
    without_the_kit, lora_ckpt, tmp_path, capsys
):
    adapter = lora_ckpt / checkpoint.ADAPTER_FOLDER
    assert cli.main(["eval", str(lora_ckpt), "rollout.name=hf", "data.max_samples=2"]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"plugrl: error: {adapter} \(a LoRA checkpoint's adapter\): {MISSING}$", err, re.M), err
    assert cli.main(["export", str(lora_ckpt), "--merge", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"plugrl: error: --merge of {adapter}: {MISSING}$", err, re.M), err
    assert not (tmp_path / "out").exists()
    # without --merge the adapter is copied as it is: no peft code needed
    assert cli.main(["export", str(lora_ckpt), str(tmp_path / "adapter")]) == 0
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()


def test_a_run_without_adapters_never_imports_the_package(tiny_model):
    """A policy without LoRA built, stepped through a log-prob pass and synced, in a fresh interpreter: neither
    plugrl-lora's implementation nor peft is imported (its config keys are)."""
    code = f"""
import json, sys, torch
from plugrl.actor import PolicyModel, TrainBatch
from plugrl.config import ActorConfig, ModelConfig
from plugrl import checkpoint, critic, evaluate, startup, trainer
from plugrl.rollout import vllm_engine
path = {str(tiny_model)!r}
policy = PolicyModel(path, ModelConfig(path=path, dtype="float32"), ActorConfig(), torch.device("cpu"))
batch = TrainBatch.from_sequences([[1, 2, 3, 4]], [2])
policy.compute_logprobs(batch, 1.0, 4096)
sum(t.numel() for _, t in policy.named_full_parameters())
print(json.dumps({{m: m in sys.modules for m in ("plugrl_lora.kit", "plugrl_lora.adapters", "peft")}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert imported == {"plugrl_lora.kit": False, "plugrl_lora.adapters": False, "peft": False}
