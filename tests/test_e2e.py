"""End to end: real training runs through the `plugrl` command, checkpoints, resume, a third-party plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import warm_start
from third_party_plugin import DATA_SOURCE, PLUGIN_NAME, REWARD_NAME, build_third_party_plugin, env_with_site

ROOT = Path(__file__).resolve().parent.parent
PLUGRL = [sys.executable, "-m", "plugrl.cli"]


def run_plugrl(args: list[str], env=None, timeout=900) -> subprocess.CompletedProcess:
    """`python -m plugrl.cli ARGS` in ROOT; forked from a warm process with torch imported where env is this one."""
    proc = warm_start.run(args, ROOT, timeout) if env is None else None
    if proc is None:
        proc = subprocess.run(PLUGRL + args, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, f"plugrl {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def tiny_overrides(model: Path, out: Path, steps: int) -> list[str]:
    return [
        f"model.path={model}",
        "model.dtype=float32",
        "rollout.name=hf",
        "rollout.n=4",
        "data.train_batch_size=2",
        "data.max_response_length=16",
        f"trainer.total_steps={steps}",
        f"trainer.output_dir={out}",
        "trainer.experiment_name=e2e",
        "trainer.save_freq=2",
        "actor.optim.lr=1e-4",
        "actor.entropy_coeff=0.01",  # a random tiny model earns no reward: the entropy bonus still moves it
    ]


@pytest.mark.slow
def test_train_checkpoint_resume_continue(tiny_model, tmp_path):
    run_dir = tmp_path / "e2e"
    run_plugrl(["train", "examples/countdown_grpo.yaml", *tiny_overrides(tiny_model, tmp_path, 2)])
    first = metrics(run_dir)
    assert [m["step"] for m in first] == [1, 2]
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "manifest.json").is_file() and (ckpt / "policy" / "config.json").is_file()
    # the policy checkpoint is plain HF safetensors that transformers loads, and training changed it
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    base = load_file(tiny_model / "model.safetensors")
    moved = [k for k, v in trained.state_dict().items() if k in base and not torch.equal(v, base[k])]
    assert moved, "no weight changed after two training steps"
    assert (run_dir / "config.yaml").is_file() and (run_dir / "rollouts" / "step_000002.jsonl").is_file()

    # the same command with more steps resumes at step 2 and continues
    proc = run_plugrl(["train", "examples/countdown_grpo.yaml", *tiny_overrides(tiny_model, tmp_path, 4)])
    assert "resumed from" in proc.stderr + proc.stdout
    steps = [m["step"] for m in metrics(run_dir)]
    assert steps == [1, 2, 3, 4], steps
    assert (run_dir / "checkpoints" / "step_000004" / "optimizer.pt").is_file()
    state = json.loads((run_dir / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["data"]["position"] == 8  # 4 steps x 2 prompts, one epoch in


@pytest.mark.slow
def test_third_party_reward_plugin_trains(tiny_model, tmp_path):
    """A reward plugin written in a few lines, pip-installed from a temp dir, trains a real run."""
    site = build_third_party_plugin(tmp_path / "pkg")
    data = tmp_path / "my_task.jsonl"
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Say the number {i}."}],
            "data_source": DATA_SOURCE,
            "ground_truth": str(i),
        }
        for i in range(8)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "my_task.yaml"
    config.write_text(
        f"plugins: [{PLUGIN_NAME}, advantages]\n"
        f"model: {{path: {tiny_model}}}\n"
        f"data: {{train_files: [{data}], train_batch_size: 2, max_response_length: 8}}\n"
        "rollout: {name: hf, n: 2}\n"
        f"trainer: {{total_steps: 2, output_dir: {tmp_path}, experiment_name: third_party, save_freq: 0}}\n"
    )
    run_plugrl(["train", str(config)], env=env_with_site(site))
    m = metrics(tmp_path / "third_party")
    assert [x["step"] for x in m] == [1, 2]
    assert f"reward/{REWARD_NAME}/mean" in m[0]
    assert not (tmp_path / "third_party" / "checkpoints").exists() or not any(
        (tmp_path / "third_party" / "checkpoints").iterdir()
    ), "trainer.save_freq=0 wrote a checkpoint"


@pytest.mark.slow
def test_default_job_real_smollm2_with_vllm(tmp_path):
    """The real model through the real vLLM engine, with the default job's config, for 2 steps."""
    run_dir = tmp_path / "smol"
    proc = run_plugrl(
        [
            "train",
            "examples/countdown_grpo.yaml",
            "trainer.total_steps=2",
            f"trainer.output_dir={tmp_path}",
            "trainer.experiment_name=smol",
            "data.train_batch_size=2",
            "rollout.n=4",
            "rollout.cpu_kv_cache_gb=0.5",
        ]
    )
    m = metrics(run_dir)
    assert [x["step"] for x in m] == [1, 2]
    for x in m:
        assert x["perf/rollout_tokens_per_s"] > 0 and x["response_length/mean"] > 0
        assert 0.0 <= x["reward/mean"] <= 1.0
    assert "mean reward: first" in proc.stdout
    samples = [json.loads(line) for line in (run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all(s["completion"].startswith("<answer>") for s in samples)
    # the example's model.dtype: auto ran, and the run's config records, what this CPU computes fast
    from plugrl.precision import resolve_dtype

    ran = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert ran["model"]["dtype"] == ran["rollout"]["dtype"] == resolve_dtype("auto", "cpu")


@pytest.mark.slow
def test_kl_ref_model_minibatches_epochs_and_grad_checkpointing(tiny_model, tmp_path):
    """The off-policy path: a reference model with k3 KL loss, 2 mini-batches x 2 PPO epochs, KL in reward."""
    run_plugrl(
        [
            "train",
            "examples/countdown_grpo.yaml",
            *tiny_overrides(tiny_model, tmp_path, 2),
            "actor.use_kl_loss=true",
            "actor.kl_loss_type=low_var_kl",
            "actor.kl_loss_coef=0.1",
            "actor.ppo_epochs=2",
            "actor.ppo_mini_batch_size=1",
            "model.enable_gradient_checkpointing=true",
            "algorithm.use_kl_in_reward=true",
            "actor.clip_ratio_high=0.28",
            # every logger, and a secret that must never reach the run dir
            "trainer.logger=[console,jsonl,wandb,tensorboard]",
            "trainer.table_freq=2",  # a completions table at step 2 only (the default would also log step 1)
            "algorithm.classifier_options.api_key=sk-PLANTED-1234",
        ],
        env=dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(tmp_path)),
    )
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and b"sk-PLANTED-1234" in p.read_bytes()]
    assert not leaked, leaked
    assert list((tmp_path / "e2e" / "tensorboard").iterdir()) and list(tmp_path.rglob("*.wandb"))
    # trainer.table_freq reached the tracker: one completions table (the default, every step, makes two)
    tables = list(tmp_path.rglob("samples_*.table.json"))
    assert len(tables) == 1, tables
    m = metrics(tmp_path / "e2e")
    assert [x["step"] for x in m] == [1, 2]
    for x in m:
        assert x["actor/optimizer_steps"] == 4  # 2 epochs x 2 mini-batches
        assert "actor/kl_loss" in x and x["actor/kl_loss"] >= 0.0
        assert "timing/ref_logprob" in x and "timing/old_logprob" in x
    # step 1 starts at the reference policy: the KL is exactly 0; after 4 updates it is not
    assert m[0]["actor/reward_kl_penalty"] == 0.0
    assert m[1]["actor/kl_loss"] > 0.0


@pytest.mark.slow
def test_ppo_with_critic_trains_checkpoints_and_resumes(tiny_model, tmp_path):
    common = ["examples/ppo_gae.yaml", *tiny_overrides(tiny_model, tmp_path, 2), "trainer.critic_warmup=1"]
    run_plugrl(["train", *common])
    m = metrics(tmp_path / "e2e")
    assert "actor/optimizer_steps" not in m[0]  # warm-up: the critic alone
    assert m[1]["actor/optimizer_steps"] == 1 and m[1]["critic/optimizer_steps"] == 1
    ckpt = tmp_path / "e2e" / "checkpoints" / "step_000002"
    assert (ckpt / "critic" / "config.json").is_file() and (ckpt / "critic_optimizer.pt").is_file()
    proc = run_plugrl(["train", *common[:-1], "trainer.total_steps=3", "trainer.critic_warmup=1"])
    assert "at step 2" in proc.stderr
    assert [x["step"] for x in metrics(tmp_path / "e2e")] == [1, 2, 3]


@pytest.mark.slow
def test_dapo_dynamic_sampling_keeps_only_informative_groups(tiny_model, tmp_path):
    """A local `module:` plugin whose reward is the completion length's parity: some groups agree, most don't."""
    data = tmp_path / "toy.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"Count to {i}.", "data_source": "toy", "ground_truth": ""}) + "\n" for i in range(64)
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    run_plugrl(
        [
            "train",
            "examples/dapo.yaml",
            *tiny_overrides(tiny_model, tmp_path, 2),
            'plugins=["toy_plugin:", advantages]',
            "data.dataset=null",
            "data.template=null",
            "data.prefill=null",
            f"data.train_files=[{data}]",
            "rollout.n=2",
            "data.train_batch_size=4",
            "reward.overlong_buffer.len=4",
            "actor.mask_truncated_completions=true",
        ],
        env=env,
    )
    for m in metrics(tmp_path / "e2e"):
        assert 1 <= m["dapo/gen_rounds"] <= 3 and m["dapo/kept_groups"] <= 4
        assert 0.0 < m["dapo/kept_frac"] < 1.0 or m["dapo/kept_groups"] == 4
        assert "reward/overlong_penalty_mean" in m and m["reward/overlong_penalty_mean"] <= 0.0
        assert "reward/parity/mean" in m and "reward/short_answer/mean" in m  # the TRL function, unchanged
