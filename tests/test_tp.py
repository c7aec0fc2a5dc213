"""Tensor parallelism (actor.tp_size) in two real processes (gloo on CPU): the same numbers as one process."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest
import torch

from test_e2e import ROOT, tiny_overrides
from test_fsdp import TORCHRUN

ARCHS = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="module")
def tp_models(tmp_path_factory, smollm2_path) -> dict[str, str]:
    """Tiny random models whose query and key/value heads split over 2 ranks (Gemma 3 text: 4 and 2, and a sliding
    layer)."""
    from tiny_models import make_tiny_model, make_tiny_sliding

    root = tmp_path_factory.mktemp("tp")
    models = {a: str(make_tiny_model(root / a, smollm2_path, arch=a, kv_heads=2)) for a in ARCHS}
    # sliding layers of 8 tokens: the longer sequences of the batch take dense masks per layer type
    models["gemma3_text"] = str(make_tiny_sliding(root / "gemma3_text", smollm2_path, window=8))
    return models


@pytest.mark.slow
def test_tp2_equals_one_process(tp_models, tmp_path):
    """Log-probs, entropy, the loss and every gradient (full tensors) with the vocabulary-sharded LM head
    and column/row-sharded attention and MLP equal one process's in fp32; so do the weights after a step.
    So do a critic's values, its value loss and gradients, and a frozen reference's log-probs."""
    from tp_worker import measure, measure_critic_ref

    out = tmp_path / "tp2.pt"
    cmd = [*TORCHRUN, str(ROOT / "tests" / "tp_worker.py"), str(out), *tp_models.values(), "--critic-ref"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    cpu = torch.device("cpu")
    ones = {path: measure(path, 1, cpu) for path in tp_models.values()}  # meanwhile, alone
    one_critic_ref = measure_critic_ref(tp_models["llama"], 1, cpu)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{err[-4000:]}"
    two = torch.load(out)
    for arch, path in tp_models.items():
        one, tp = ones[path], two[path]
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac"):
            assert tp["metrics"][key] == pytest.approx(one["metrics"][key], abs=1e-5), (arch, key)
        assert tp["metrics"]["actor/grad_norm"] == pytest.approx(one["metrics"]["actor/grad_norm"], rel=1e-5)
        assert_same_step(one, tp, arch, rows=len(one["logprobs"]))
    assert_same_critic_ref(one_critic_ref, two["critic_ref"])


def assert_same_critic_ref(one: dict, tp: dict) -> None:
    """The critic (replicated value head on the TP trunk) and the reference (a frozen TP policy)."""
    for key in ("values", "ref_logprobs"):
        assert one[key].abs().sum() > 0, key
        torch.testing.assert_close(tp[key], one[key], atol=1e-5, rtol=0, msg=key)
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean"):
        assert tp["critic_metrics"][key] == pytest.approx(one["critic_metrics"][key], abs=1e-5), key
    assert 0 < one["critic_metrics"]["critic/vf_clipfrac"] < 1  # the clipped branch is taken for some tokens
    grad_norm = one["critic_metrics"]["critic/grad_norm"]
    assert tp["critic_metrics"]["critic/grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    assert tp["critic_grads"].keys() == one["critic_grads"].keys()
    assert any(n.startswith("score.") for n in one["critic_grads"])
    for name, g in one["critic_grads"].items():
        torch.testing.assert_close(tp["critic_grads"][name], g, atol=1e-5, rtol=0, msg=f"critic grad {name}")


def assert_same_step(one: dict, tp: dict, arch: str, rows: int) -> None:
    """Log-probs and entropy of the first ``rows`` sequences, every gradient, the weights after the step."""
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(tp[key], one[key][:rows], atol=1e-5, rtol=0, msg=f"{arch} {key}")
    assert tp["grads"].keys() == one["grads"].keys()
    for name, g in one["grads"].items():
        torch.testing.assert_close(tp["grads"][name], g, atol=1e-5, rtol=0, msg=f"{arch} grad {name}")
    # Adam's first step is lr * g / (|g| + eps): where |g| is near eps (1e-8) float noise in g moves
    # the weight by up to lr, elsewhere the step is as exact as the gradient
    for name, w in one["weights"].items():
        diff = (tp["weights"][name] - w).abs()
        if name not in one["grads"]:  # frozen (a vision encoder): the file's values on both sides
            assert diff.max() == 0, (arch, name)
            continue
        steady = one["grads"][name].abs() > 1e-6
        assert (diff * steady).max() < 1e-5 and diff.max() <= 2e-3, (arch, name, float(diff.max()))


@pytest.mark.slow
def test_dp2_x_tp2_equals_one_process(tp_models, tmp_path):
    """FSDP2 over "dp" composed with TP over "tp": 4 processes, each TP pair with half the batch."""
    from tp_worker import measure

    out = tmp_path / "dp2tp2.pt"
    four = [a if a != "--nproc_per_node=2" else "--nproc_per_node=4" for a in TORCHRUN]
    cmd = [*four, str(ROOT / "tests" / "tp_worker.py"), str(out), tp_models["llama"]]
    env = {**os.environ, "TP_SIZE": "2"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    one = measure(tp_models["llama"], 1, torch.device("cpu"))
    assert_same_step(one, torch.load(out)[tp_models["llama"]], "llama", rows=len(one["logprobs"]) // 2)


def train_tp2(example: str, model, tmp_path, steps: int, *overrides: str) -> list[dict]:
    """``plugrl train example`` under torchrun with actor.tp_size=2 on ``model``; its metrics records."""
    cmd = [
        *TORCHRUN,
        "-m",
        "plugrl.cli",
        "train",
        example,
        *tiny_overrides(model, tmp_path, steps),
        "actor.tp_size=2",
        *overrides,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads(x) for x in (tmp_path / "e2e" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_process_tp2_training_run(tp_models, tmp_path):
    lines = train_tp2("examples/countdown_grpo.yaml", tp_models["qwen2"], tmp_path, 2, "rollout.name=hf")
    run_dir = tmp_path / "e2e"
    assert [m["step"] for m in lines] == [1, 2]
    assert lines[-1]["actor/optimizer_steps"] == 1
    # one TP group: its 2 prompts x 4 samples, written once (not once per rank)
    assert len((run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()) == 8
    from safetensors.torch import load_file

    saved = load_file(run_dir / "checkpoints" / "step_000002" / "policy" / "model.safetensors")
    base = load_file(f"{tp_models['qwen2']}/model.safetensors")
    assert saved.keys() == base.keys()  # full tensors, the tied head saved once
    assert all(saved[k].shape == base[k].shape for k in base)
    assert any(not torch.equal(saved[k], base[k]) for k in base), "training changed nothing"


@pytest.mark.slow
def test_two_process_tp2_ppo_critic_and_reference(tp_models, tmp_path):
    """PPO with a critic (GAE, as examples/ppo_gae.yaml) and a KL loss to the reference model, all three
    models tensor-parallel over 2 processes: one step trains both the critic and the policy."""
    lines = train_tp2(
        "examples/ppo_gae.yaml",
        tp_models["qwen2"],
        tmp_path,
        1,
        "actor.use_kl_loss=true",
        "trainer.critic_warmup=0",
        "critic.optim.lr=1e-4",
    )
    assert [m["step"] for m in lines] == [1]
    m = lines[0]
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean", "actor/kl_loss", "actor/pg_loss"):
        assert key in m and math.isfinite(m[key]), (key, m.get(key))
    assert m["actor/optimizer_steps"] == 1 and m["critic/grad_norm"] > 0


def test_tp_config_errors():
    from transformers import LlamaConfig

    from plugrl.config import ActorConfig, ConfigError
    from plugrl.parallel import check_world
    from plugrl_tensor_parallel import check_model

    with pytest.raises(ConfigError, match=r"actor.tp_size=2 must divide the number of processes \(3\)"):
        check_world(3, 2)
    config = LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
    with pytest.raises(ConfigError, match=r"actor.tp_size=2 must divide the model's num_key_value_heads \(1\)"):
        check_model(config, 2)
    check_model(config, 1)
    assert ActorConfig(fsdp_size=4).fsdp_config.fsdp_size == 4  # actor.fsdp_size is an alias
    assert ActorConfig().tp_size == 1
