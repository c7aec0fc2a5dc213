"""LoRA is plugrl-lora's (plugins/lora), found through the entry-point group plugrl.model_adapters: the kernel's
seam (plugrl.model_adapters) finds it, a run without adapters never imports it, and without it every way of asking
for adapters (actor.lora.r, verl's lora_rank, critic.lora.r, plugrl eval or export --merge of a LoRA checkpoint) is
refused naming the key and the package, before any model loads."""

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
MISSING = (
    r"LoRA adapters are in the package plugrl-lora, which is not installed: pip install plugrl-lora "
    r"\(in a plugrl checkout: pip install -e plugins/lora\)"
)


@pytest.fixture
def without_the_package(hide_entry_points):
    """plugrl-lora's entry point gone, as where the package is not installed."""
    hide_entry_points(model_adapters.GROUP)


def test_the_kit_is_plugrl_loras_and_its_adapters_do_what_the_kernel_calls(tiny_model):
    import plugrl_lora

    kit = model_adapters.kit("actor.lora.r=4")
    assert kit is plugrl_lora
    for name in ("add_adapters", "merge_to_folder", "vllm_load_adapter"):
        assert callable(getattr(kit, name)), name
    from plugrl.actor import PolicyModel

    actor = ActorConfig(lora={"r": 4, "alpha": 8})
    model = ModelConfig(path=str(tiny_model), dtype="float32")
    policy = PolicyModel(str(tiny_model), model, actor, torch.device("cpu"))
    protocol = [n for n in vars(model_adapters.Adapted) if not n.startswith("_")]
    assert set(protocol) >= {"state", "save", "load", "merged_parameters", "engine_adapter", "dropout_off"}
    assert isinstance(policy.adapters, plugrl_lora.LoRAAdapters)
    assert all(callable(getattr(policy.adapters, n)) for n in protocol)
    state = policy.adapters.state(policy.device)
    assert state and all(".lora_A." in n or ".lora_B." in n for n in state)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["actor.lora.r=8"], r"actor.lora.r=8"),
        (["actor_rollout_ref.model.lora_rank=16"], r"actor.lora.r=16"),  # verl's spelling
        (["algorithm.adv_estimator=gae", "critic.lora.r=4"], r"critic.lora.r=4"),
        (["actor.lora.r=2", "algorithm.adv_estimator=gae", "critic.lora.r=4"], r"actor.lora.r=2, critic.lora.r=4"),
    ],
)
def test_a_run_with_adapters_without_the_package_is_refused_at_start(without_the_package, overrides, key):
    from plugrl.startup import check_run

    cfg = build_config(copy.deepcopy(BASE), overrides)
    with pytest.raises(ConfigError, match=rf"^{key}: {MISSING}$"):
        check_run(cfg, training=True)


def test_a_run_without_adapters_does_not_need_the_package(without_the_package):
    model_adapters.check_installed(build_config(copy.deepcopy(BASE)))
    model_adapters.check_installed(build_config(copy.deepcopy(BASE), ["algorithm.adv_estimator=gae"]))


def test_a_policy_with_adapters_without_the_package_names_it(without_the_package, tiny_model):
    from plugrl.actor import PolicyModel

    actor = ActorConfig(lora={"r": 4})
    with pytest.raises(ConfigError, match=rf"^actor.lora.r=4: {MISSING}$"):
        PolicyModel(str(tiny_model), ModelConfig(path=str(tiny_model), dtype="float32"), actor, torch.device("cpu"))


@pytest.fixture(scope="module")
def lora_ckpt(tiny_model, smol_tokenizer, tmp_path_factory):
    run = _run(tmp_path_factory.mktemp("lora_package") / "run", tiny_model, smol_tokenizer, {"r": 4, "alpha": 8}, 1)
    return checkpoint.latest_checkpoint(run)


def test_eval_and_export_of_a_lora_checkpoint_without_the_package_name_it(
    without_the_package, lora_ckpt, tmp_path, capsys
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
    plugrl_lora nor peft is imported."""
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
print(json.dumps({{m: m in sys.modules for m in ("plugrl_lora", "peft")}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"plugrl_lora": False, "peft": False}
