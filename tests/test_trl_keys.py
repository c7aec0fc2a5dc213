"""Every key TRL 1.16's GRPO script accepts has a fate in plugrl (plugrl_compat.trl_keys.KEYS), checked against
TRL's real dataclasses; the fates are what `--trl-config` does; GRPOConfigs in the shapes of TRL's paper index load; the
accelerate config file's FSDP, DeepSpeed and precision settings are read as `accelerate launch` passes them; a TRL
file given where a plugrl config goes is read as one; docs/coming_from_trl.md's key table is this table.

TRL is imported where a test needs its classes (`make setup` installs it); such tests skip when it is absent."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from plugrl.config import ConfigError, build_config
from plugrl_compat.trl_config import _quiet, is_trl_config_file, load_trl_config, looks_like_trl_config, translate
from plugrl_compat.trl_keys import KEYS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "coming_from_trl.md"


def _trl_fields() -> dict[str, dataclasses.Field]:
    """The fields of the dataclasses TRL's grpo.py parses a YAML into, by name."""
    pytest.importorskip("trl", reason="TRL is not installed (make setup installs it)")
    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    out: dict[str, dataclasses.Field] = {}
    for cls in (GRPOConfig, ModelConfig, GRPOScriptArguments, DatasetMixtureConfig):
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, f)
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def test_every_field_of_trls_dataclasses_has_a_fate():
    """Fails when TRL adds a field plugrl has no fate for, or when KEYS holds a TRL key TRL no longer has."""
    fields = _trl_fields()
    missing = sorted(set(fields) - set(KEYS))
    assert not missing, f"TRL keys with no fate in plugrl_compat.trl_keys.KEYS: {missing}"
    stale = sorted(k for k, fate in KEYS.items() if not fate.extra and k not in fields)
    assert not stale, (
        f"KEYS holds keys TRL 1.16 does not have (mark them extra=True if plugrl still reads them): {stale}"
    )
    assert len(fields) >= 200 and {fate.kind for fate in KEYS.values()} == {"mapped", "said", "refused", "same"}


# values that make a key be read (its fate applies only then, as in TRL)
CONTEXT = {
    "hub_token": {"push_to_hub": True},
    "hub_revision": {"push_to_hub": True},
    "hub_always_push": {"push_to_hub": True},
    "hub_strategy": {"push_to_hub": True},
    "use_bias_correction_kl": {"beta": 0.01},
    "per_device_eval_batch_size": {"eval_strategy": "steps", "eval_steps": 5},
    "log_multimodal": {"log_completions": True},
}
BASE = {"model_name_or_path": "m", "lr_scheduler_type": "constant", "per_device_train_batch_size": 8, "use_vllm": True}


def _other_value(f: dataclasses.Field, default, quiet=()):
    """A value of the field's type that is neither its default nor one plugrl accepts in silence."""
    kind = str(f.type)
    if isinstance(default, bool) or kind.startswith("bool"):
        candidates = [not default, True, False]
    elif isinstance(default, int) or (kind.startswith("int") and not isinstance(default, str)):
        candidates = [(default or 0) + 7]
    elif isinstance(default, float) or (kind.startswith("float") and not isinstance(default, str)):
        candidates = [(default or 0.0) + 0.75]
    elif "dict" in kind:
        candidates = [{"some_option": 1}]
    elif "list" in kind:
        candidates = [["something"]]
    else:
        candidates = ["something-else"]
    return next((c for c in candidates if c != default and not any(c is q or c == q for q in quiet)), default)


def test_said_keys_are_named_at_start_and_silent_at_trls_default():
    """A `said` key at TRL's default value passes in silence where plugrl does the same, and is named where it does
    not (a default of TRL plugrl differs from, said at start); at another value it is named with why."""
    fields = _trl_fields()
    for key, fate in KEYS.items():
        if fate.kind != "said" or key not in fields:
            continue
        default = _default(fields[key])
        at_default = translate({**BASE, **CONTEXT.get(key, {}), key: default}).unmapped
        named = any(n.startswith(f"{key}=") or n.startswith(f"{key} ") for n in at_default)
        # silent at TRL's default where plugrl does the same; named where plugrl's default differs (hub_strategy)
        assert named == (not _quiet(default, fate.quiet)), (key, at_default)
        value = _other_value(fields[key], default, fate.quiet)
        if value is default:  # a flag whose other value is what plugrl does (disable_dropout: true)
            continue
        said = translate({**BASE, **CONTEXT.get(key, {}), key: value}).unmapped
        assert any(n.startswith(f"{key}=") and fate.text in n for n in said), (key, value, said)


def test_refused_keys_stop_the_translation_naming_the_key():
    fields = _trl_fields()
    for key, fate in KEYS.items():
        if fate.kind != "refused":
            continue
        translate({**BASE, key: _default(fields[key])})  # TRL's default: accepted
        with pytest.raises(ConfigError, match=f"TRL key '{key}'"):
            translate({**BASE, key: _other_value(fields[key], _default(fields[key]), fate.quiet)})


def test_keys_trls_script_does_not_read_change_nothing():
    base = translate(BASE).tree
    for key, fate in KEYS.items():
        if fate.kind == "same":
            result = translate({**BASE, key: True})
            assert result.tree == base and result.unmapped == translate(BASE).unmapped, key


@pytest.mark.parametrize(
    "trl, key, value",
    [
        ({"eval_strategy": "steps", "eval_steps": 5, "eval_on_start": True}, "trainer.val_before_train", True),
        ({"ddp_timeout": 600}, "trainer.dist_timeout_s", 600.0),
        ({"max_tool_calling_iterations": 3}, "rollout.max_turns", 4),
        (
            {"chat_template_kwargs": {"enable_thinking": False}},
            "data.apply_chat_template_kwargs",
            {"enable_thinking": False},
        ),
        ({"model_init_kwargs": {"torch_dtype": "float32"}}, "model.dtype", "float32"),
        ({"model_init_kwargs": {"attn_implementation": "sdpa"}}, "model.attn_implementation", "sdpa"),
        ({"loss_type": "sapo", "sapo_temperature_pos": 0.9}, "actor.tau_pos", 0.9),
        ({"delta": 4.0}, "actor.clip_ratio_c", 4.0),
        ({"fsdp": "shard_grad_op offload auto_wrap"}, "actor.fsdp_config.reshard_after_forward", False),
        ({"fsdp": ["full_shard", "offload"]}, "actor.fsdp_config.param_offload", True),
        ({"fsdp_config": {"fsdp_offload_params": True}}, "actor.fsdp_config.optimizer_offload", True),
        ({"deepspeed": {"zero_optimization": {"stage": 2}}}, "actor.fsdp_config.reshard_after_forward", False),
        (
            {"gradient_checkpointing": False, "fsdp_config": {"activation_checkpointing": True}},
            "model.enable_gradient_checkpointing",
            True,
        ),
        (
            {"reward_funcs": ["think_format_reward", "my_lib.rewards.custom_reward"]},
            "reward.reward_funcs",
            ["think_format_reward", "my_lib.rewards.custom_reward"],
        ),
    ],
)
def test_mapped_keys(trl, key, value):
    tree = translate({**BASE, **trl}).tree
    node = tree
    for part in key.split("."):
        node = node[part]
    assert node == value
    build_config({**tree, "data": {**tree.get("data", {}), "train_files": ["x.jsonl"]}})  # a valid plugrl config


def test_sharding_plugrl_cannot_do_is_refused_with_the_nearest():
    with pytest.raises(ConfigError, match=r"TRL key 'fsdp'.*hybrid_shard.*SHARD_GRAD_OP"):
        translate({**BASE, "fsdp": "hybrid_shard"})
    with pytest.raises(ConfigError, match="offloads to nvme: plugrl offloads to host memory only"):
        translate({**BASE, "deepspeed": {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}})


def test_reward_weights_follow_trls_order_and_length():
    """TRL puts reward_model_name_or_path first, then reward_funcs; reward_weights must match that list's length."""
    trl = {**BASE, "reward_model_name_or_path": "/models/rm", "reward_funcs": ["accuracy_reward", "pkg.mod:fmt"]}
    tree = translate({**trl, "reward_weights": [0.5, 1.0, 0.2]}).tree
    assert tree["reward"]["weights"] == {"reward_model": 0.5, "accuracy_reward": 1.0, "fmt": 0.2}
    assert tree["reward"]["reward_funcs"] == ["accuracy_reward", "pkg.mod:fmt"]
    with pytest.raises(ConfigError, match=r"'reward_weights' \(2\) and 'reward_funcs' \(3, reward_model_name_or_path"):
        translate({**trl, "reward_weights": [1.0, 1.0]})
    with pytest.raises(ConfigError, match="names accuracy_reward twice"):
        translate({**BASE, "reward_funcs": ["accuracy_reward", "mine.accuracy_reward"]})
    name = translate({**BASE, "reward_funcs": ["get_soft_overlong_punishment"], "reward_weights": [0.5]}).tree
    assert name["reward"]["weights"] == {"soft_overlong_punishment_reward": 0.5}  # the name TRL logs it under


# GRPOConfigs in the shapes TRL's paper index gives (sizes cut), in TRL's spelling; each must load in TRL and in plugrl
PAPER_INDEX = {
    "deepseekmath": {
        "loss_type": "grpo",
        "beta": 0.001,
        "epsilon": 10.0,
        "num_generations": 4,
        "max_completion_length": 64,
        "steps_per_generation": 2,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 8,
    },
    "deepseek_r1": {
        "learning_rate": 4.0e-5,
        "max_completion_length": 64,
        "num_generations": 8,
        "beta": 0.001,
        "use_vllm": True,
    },
    "gspo": {
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",
        "beta": 0.0,
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 4,
    },
    "dapo": {
        "mask_truncated_completions": True,
        "loss_type": "dapo",
        "epsilon_high": 0.28,
        "epsilon": 0.2,
        "per_device_train_batch_size": 16,
        "num_generations": 8,
        "max_completion_length": 64,
        "beta": 0.0,
    },
    "intellect2": {"delta": 4, "epsilon": 0.2, "beta": 0.001, "num_generations": 8, "learning_rate": 3e-7},
    "skywork": {"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_target": 5.0, "entropy_coef_delta": 0.005},
    "80_20": {
        "mask_truncated_completions": True,
        "loss_type": "dapo",
        "epsilon_high": 0.28,
        "epsilon": 0.2,
        "per_device_train_batch_size": 16,
        "num_generations": 8,
        "beta": 0.0,
        "top_entropy_quantile": 0.2,
    },
    "dr_grpo": {
        "loss_type": "dr_grpo",
        "per_device_train_batch_size": 8,
        "num_generations": 8,
        "max_completion_length": 64,
        "beta": 0.0,
    },
    "lite_ppo": {
        "scale_rewards": "batch",
        "loss_type": "dapo",
        "beta": 0.0,
        "top_p": 0.99,
        "top_k": 100,
        "temperature": 0.99,
        "num_generations": 8,
        "num_iterations": 1,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 8,
        "steps_per_generation": 4,
    },
    "tis": {
        "use_vllm": True,
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "sequence_truncate",
        "vllm_importance_sampling_clip_max": 2.0,
    },
    "mis": {
        "use_vllm": True,
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "sequence_mask",
        "vllm_importance_sampling_clip_max": 2.0,
        "vllm_importance_sampling_clip_min": 0.5,
    },
    "scalerl_cispo": {
        "loss_type": "cispo",
        "epsilon_high": 5.0,
        "num_generations": 8,
        "scale_rewards": "batch",
        "cast_lm_head_to_fp32": True,
    },
    "two_grpo": {"num_generations": 2, "loss_type": "grpo"},
    "sapo": {"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "scale_rewards": "group"},
    "deepseek_v32": {"beta": 0.001, "use_bias_correction_kl": True, "off_policy_mask_threshold": 0.5},
    "gdpo": {"multi_objective_aggregation": "normalize_then_sum"},
    "luspo": {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 2e-3, "epsilon_high": 2.5e-3},
}


@pytest.mark.parametrize("name", sorted(PAPER_INDEX))
def test_paper_index_configs_load(name, tmp_path):
    """TRL accepts each (its GRPOConfig, on this GPU-less machine with use_cpu); plugrl loads it from a YAML and
    every key is acted on or named."""
    pytest.importorskip("trl", reason="TRL is not installed (make setup installs it)")
    from trl import GRPOConfig

    trl = PAPER_INDEX[name]
    GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, report_to="none", **trl)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**trl, "model_name_or_path": "m", "dataset_name": "data.jsonl"}))
    cfg = load_trl_config(path, num_processes=1)
    notes = "; ".join(cfg._trl_unmapped)
    for key in trl:
        fate = KEYS[key]
        assert fate.kind in ("mapped", "said"), key
    if name == "scalerl_cispo":
        assert (cfg.actor.loss_mode, cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) == ("cispo", 1.0, 4.0)
        assert "scale_rewards=batch" in notes and "cast_lm_head_to_fp32=True" in notes
    if name == "deepseekmath":  # 2 generation batches of 8 per optimizer step of 32: sampled at once, said
        assert (cfg.data.train_batch_size, cfg.mini_batch_size) == (8, 8) and "steps_per_generation=2" in notes
    if name == "luspo":
        assert cfg.actor.loss_mode == "luspo"
    if name == "sapo":
        assert (cfg.actor.loss_mode, cfg.actor.tau_pos, cfg.actor.tau_neg) == ("sapo", 1.0, 1.05)


# ---- the accelerate config file (seed 004: accelerate launch --config_file accelerate_config.yaml ...)

FSDP_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_offload_params: true
  fsdp_reshard_after_forward: false
  fsdp_activation_checkpointing: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_cpu_ram_efficient_loading: true
  fsdp_sync_module_states: true
machine_rank: 0
mixed_precision: bf16
num_machines: 1
num_processes: 2
"""
FSDP1_CONFIG = FSDP_CONFIG.replace("fsdp_version: 2", "fsdp_version: 1").replace(
    "fsdp_reshard_after_forward: false", "fsdp_sharding_strategy: HYBRID_SHARD"
)
DEEPSPEED_CONFIG = """\
compute_environment: LOCAL_MACHINE
deepspeed_config:
  offload_optimizer_device: cpu
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
distributed_type: DEEPSPEED
mixed_precision: fp16
num_machines: 1
num_processes: 2
"""


def _launch_env(tmp_path: Path, text: str) -> dict[str, str]:
    """The variables `accelerate launch --config_file FILE` sets for its script on a GPU machine, computed by
    accelerate's own launch code (its argument parsing, the config file's defaults, the launcher's environment)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    path = tmp_path / "accelerate_config.yaml"
    path.write_text(text)
    args = launch_command_parser().parse_args(["--config_file", str(path), "-m", "plugrl.cli"])
    args, defaults, from_config = _validate_launch_command(args)
    if args.use_deepspeed:  # as accelerate's launch_command does before its DeepSpeed launcher
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        return {k: v for k, v in prepare_deepspeed_cmd_env(args)[1].items() if k.startswith("ACCELERATE")}
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("ACCELERATE", "FSDP"))}


def test_accelerate_fsdp_settings_are_honoured(tmp_path):
    env = _launch_env(tmp_path, FSDP_CONFIG)
    result = translate({**BASE, "gradient_checkpointing": False}, 2, env)
    fsdp = result.tree["actor"]["fsdp_config"]
    assert fsdp == {"param_offload": True, "optimizer_offload": True, "reshard_after_forward": False}
    assert result.tree["model"]["enable_gradient_checkpointing"] is True  # fsdp_activation_checkpointing
    assert not any("mixed_precision" in n for n in result.unmapped)  # bf16: TRL's default too
    with pytest.raises(ConfigError, match="fsdp_sharding_strategy.*'HYBRID_SHARD'.*no hybrid sharding"):
        translate(BASE, 2, _launch_env(tmp_path, FSDP1_CONFIG))


def test_accelerate_deepspeed_and_precision_are_honoured_or_said(tmp_path):
    env = _launch_env(tmp_path, DEEPSPEED_CONFIG)
    result = translate(BASE, 2, env)
    fsdp = result.tree["actor"]["fsdp_config"]
    assert fsdp == {"param_offload": True, "optimizer_offload": True, "reshard_after_forward": False}  # ZeRO-2 + cpu
    notes = "; ".join(result.unmapped)
    assert "plugrl's FSDP2 offloads both together" in notes
    assert "accelerate mixed_precision=fp16 (TRL's bf16, true unless the file turns it off, wins over it" in notes
    off = translate({**BASE, "bf16": False}, 2, {**env, "ACCELERATE_MIXED_PRECISION": "bf16"}).tree
    assert off["model"]["dtype"] == "bfloat16"  # bf16 and fp16 off in the file: accelerate's precision applies


def test_load_trl_config_reads_the_launchers_variables(tmp_path, monkeypatch):
    for key, value in _launch_env(tmp_path, FSDP_CONFIG).items():
        monkeypatch.setenv(key, value)
    path = tmp_path / "grpo.yaml"
    path.write_text("model_name_or_path: m\ndataset_name: data.jsonl\nper_device_train_batch_size: 8\n")
    cfg = load_trl_config(path, num_processes=2)
    assert cfg.actor.fsdp_config.param_offload and not cfg.actor.fsdp_config.reshard_after_forward


# ---- a TRL file where a plugrl config goes


def test_a_trl_file_given_as_the_config_is_read_as_one(tmp_path):
    import argparse

    from plugrl.cli import _train_config

    trl = {"model_name_or_path": "m", "dataset_name": "data.jsonl", "num_generations": 4, "learning_rate": 1e-5}
    assert looks_like_trl_config(trl) and looks_like_trl_config({**trl, "plugrl": {"plugins": ["math"]}})
    assert not looks_like_trl_config({"model": {"path": "m"}, "data": {"train_files": ["x"]}})
    assert not looks_like_trl_config({"learning_rate": 1e-5, "trainer": {"total_steps": 1}})  # plugrl's sections
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(trl))
    assert is_trl_config_file(path) and not is_trl_config_file(tmp_path / "missing.yaml")
    args = argparse.Namespace(config=str(path), overrides=["num_generations=2"], trl_config=None)
    cfg = _train_config(args)
    assert cfg.trainer.metric_aliases == "trl" and cfg.rollout.n == 2 and cfg.actor.optim.lr == 1e-5


# ---- docs/coming_from_trl.md's table of every key


def _doc_table() -> dict[str, tuple[str, str]]:
    text = DOC.read_text()
    section = text.split("### Every key of TRL's GRPO script", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([^`]+)` \| (mapped|said|refused|same) \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_the_docs_table_is_the_key_table():
    rows = _doc_table()
    assert rows.keys() == KEYS.keys(), sorted(set(rows) ^ set(KEYS))
    for key, fate in KEYS.items():
        assert rows[key] == (fate.kind, fate.text.replace("|", "\\|")), key
    fields = _trl_fields()
    assert set(fields) <= set(rows)


def test_trls_defaults_plugrl_does_not_follow_are_said():
    """TRL generates with transformers unless use_vllm; plugrl keeps vLLM and says so. TRL's default KL weighting
    and hub strategy are said where they apply."""
    unset = {k: v for k, v in BASE.items() if k != "use_vllm"}
    assert any(n.startswith("use_vllm not set (TRL's default, false") for n in translate(unset).unmapped)
    notes = translate({**BASE, "beta": 0.04, "push_to_hub": True}).unmapped
    assert (
        "use_bias_correction_kl=True (plugrl's KL term is not weighted by the importance ratio, TRL's default)" in notes
    )
    assert any(n.startswith("hub_strategy=every_save (plugrl uploads the final checkpoint once") for n in notes)


def test_quiet_values_compare_by_type():
    """A value plugrl follows anyway passes in silence, by type too: `True` is not the number 1."""
    assert not translate({**BASE, "repetition_penalty": 1.0}).unmapped
    notes = translate({**BASE, "repetition_penalty": True}).unmapped
    assert any(n.startswith("repetition_penalty=True") for n in notes)


def test_the_check_reports_each_key_of_a_trl_file_with_its_fate(tmp_path, monkeypatch, capsys):
    """plugrl train --check --trl-config FILE: one line per key of the file (and TRL override) with its TRL fate,
    then a plugrl override's own; a key TRL does not know is refused as unknown."""
    from plugrl import cli

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(ROOT)
    fixture = "tests/fixtures/trl_grpo.yaml"
    code = cli.main(["train", "--check", "--trl-config", fixture, "num_generations=8", "trainer.save_freq=-1"])
    out = capsys.readouterr().out
    lines = {line.split()[0].split("=", 1)[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "acted on (`rollout.n`)" in lines["num_generations"]
    assert "not acted on: plugrl batches prompts itself" in lines["dataloader_num_workers"]
    assert "-> trainer.save_freq" in lines["trainer.save_freq"] or "acted on" in lines["trainer.save_freq"]
    assert "learning_rate" in lines and code in (0, 2)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: x\nlearning_rat: 1.0e-6\n")
    assert cli.main(["train", "--check", "--trl-config", str(bad)]) == 2
    assert "did you mean learning_rate?" in capsys.readouterr().out
