"""LoRA on the PPO critic (critic.lora, through peft): config and verl keys, only the trunk's adapters and the value
head train (the head whole, as peft's modules_to_save), the wrapped critic starts with the values of the unwrapped
one, checkpoints hold one PEFT adapter (critic_adapter/) that peft loads onto a token-classification base and that
resumes exactly, on one process and under FSDP2 with 2 ranks, and a short PPO run (GAE) trains and resumes with it.

Run as a script (``python tests/test_critic_lora.py MODEL OUT``, alone or under torchrun), this file is the worker
of the 2-rank test: see :func:`_worker`."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dp_worker import global_batch
from plugrl import checkpoint
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ConfigError, CriticConfig, ModelConfig, build_config
from plugrl.critic import ValueModel
from plugrl_lora import adapters as lora

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HEAD = ("score.modules_to_save.default.bias", "score.modules_to_save.default.weight")  # the trained value head
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def _critic(path, device=torch.device("cpu"), *, seed: int = 0, lr: float = 1e-2, budget: int = 8192, **lora_cfg):
    """A critic on ``path``; with ``lora_cfg`` (r=4, alpha=8 unless given) LoRA on its trunk. ``seed``: the value
    head's random init (and the adapters'), as the trainer's seed_everything sets it."""
    torch.manual_seed(seed)
    lora_cfg = {"r": 4, "alpha": 8, **lora_cfg} if lora_cfg else {}
    cfg = CriticConfig(optim={"lr": lr, "eps": 1e-6}, ppo_max_token_len_per_gpu=budget, lora=lora_cfg)
    return ValueModel(str(path), ModelConfig(path=str(path), dtype="float32"), cfg, device)


def _lora_critic(path, device=torch.device("cpu"), **kwargs) -> ValueModel:
    return _critic(path, device, **{"r": 4, **kwargs})


def _critic_batch():
    """dp_worker's fixed batch of 8 sequences (4 prompts x 2 responses) with value targets."""
    batch = global_batch()
    g = torch.Generator().manual_seed(1)
    batch.returns = torch.randn(batch.response_mask.shape, generator=g) * batch.response_mask
    return batch


def _update(critic: ValueModel, batch) -> dict[str, float]:
    return critic.update(batch, num_mini_batches=1, epochs=1, norm_length=16)


def _trained_names(critic: ValueModel) -> list[str]:
    return sorted(n for n, p in critic.model.named_parameters() if p.requires_grad)


def _peft_values(base_path, adapter_dir, batch) -> torch.Tensor:
    """[B, T] values of the batch's response tokens under transformers' token-classification model (the critic's
    class, num_labels=1) + ``PeftModel.from_pretrained``: V_t read where token t is predicted."""
    from peft import PeftModel
    from transformers import AutoModelForTokenClassification

    base = AutoModelForTokenClassification.from_pretrained(str(base_path), num_labels=1, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    assert type(model).__name__ == "PeftModelForTokenClassification"
    model.eval()
    out = torch.zeros(batch.response_mask.shape)
    for i, (seq, p) in enumerate(zip(batch.sequences, batch.prompt_lens, strict=True)):
        with torch.no_grad():
            head = model(input_ids=torch.tensor([seq])).logits[0, :, 0]
        out[i, : len(seq) - p] = head[p - 1 : len(seq) - 1]
    return out


# --- config ------------------------------------------------------------------------------------------------------


def test_critic_lora_config_verl_keys_and_bad_values():
    cfg = build_config(copy.deepcopy(BASE))
    assert cfg.critic.lora.model_dump() == {"r": 0, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"}
    assert "lora" not in cfg.critic.model_fields_set  # a run without critic keys stays one (startup's check)
    verl = ["critic.model.lora_rank=8", "critic.model.lora_alpha=32", "critic.model.target_modules=[q_proj,v_proj]"]
    lora_cfg = build_config(copy.deepcopy(BASE), verl).critic.lora
    assert (lora_cfg.r, lora_cfg.alpha, lora_cfg.target_modules) == (8, 32.0, ["q_proj", "v_proj"])
    # verl's nested YAML spelling too, and the actor's LoRA keys stay the actor's
    tree = {**copy.deepcopy(BASE), "critic": {"model": {"lora_rank": 4, "target_modules": "q_proj,v_proj"}}}
    cfg = build_config(tree, ["actor_rollout_ref.model.lora_rank=2"])
    assert (cfg.critic.lora.r, cfg.critic.lora.target_modules, cfg.actor.lora.r) == (4, ["q_proj", "v_proj"], 2)

    def error(*overrides) -> str:
        with pytest.raises(ConfigError) as info:
            build_config(copy.deepcopy(BASE), list(overrides))
        return str(info.value)

    assert "critic.lora.r: Input should be greater than or equal to 0 (got -1)" in error("critic.lora.r=-1")
    assert "critic.model.lora_rank: Input should be" in error("critic.model.lora_rank=-2")  # named as typed
    assert "critic.lora.dropout" in error("critic.lora.dropout=1.0")
    assert "critic.lora.alpha" in error("critic.lora.alpha=0")
    assert "critic.lora: target_modules is empty" in error("critic.lora.target_modules=[]")
    # the critic is tensor-parallel on the policy's mesh, whose nn.Linear layers LoRA would wrap: refused at start
    message = error("critic.lora.r=4", "actor.tp_size=2")
    assert "critic.lora.r=4 cannot combine with actor.tp_size=2" in message and "critic.lora.r=0" in message
    assert build_config(copy.deepcopy(BASE), ["critic.lora.r=0", "actor.tp_size=2"]).actor.tp_size == 2


def test_bad_critic_targets_name_the_critic_key(tiny_model):
    """A name that matches no linear layer, and the value head itself (never a target: it trains whole), are
    ConfigErrors naming critic.lora.target_modules; so is the tensor-parallel mesh for a critic built directly."""
    with pytest.raises(ConfigError) as info:
        _lora_critic(tiny_model, target_modules=["q_proj", "qkv_proj"])
    message = str(info.value)
    assert message.startswith(
        "critic.lora.target_modules: ['qkv_proj'] match no linear layer of LlamaForTokenClassification"
    ), message
    assert all(name in message for name in LINEAR) and "critic.lora.target_modules=all-linear" in message
    with pytest.raises(ConfigError, match=r"critic.lora.target_modules: \['score'\] .*the value head \(score"):
        _lora_critic(tiny_model, target_modules=["score"])
    with pytest.raises(ConfigError, match="critic.lora.r=4 cannot combine with actor.tp_size=2"):
        cfg = CriticConfig(lora={"r": 4})
        ValueModel(str(tiny_model), ModelConfig(path=str(tiny_model)), cfg, torch.device("cpu"), tp_size=2)


# --- one process ------------------------------------------------------------------------------------------------


def test_only_adapters_and_value_head_train_and_the_wrapped_critic_starts_as_the_unwrapped_one(tiny_model):
    """r=4 on every linear layer of the trunk: the adapters and the value head (peft's trained copy of it) are the
    only trainable parameters and the optimizer's; the head has no adapter; with lora_B at zero and the same head
    init the values equal (float32, exactly) those of the critic without LoRA; one update moves only those
    parameters (the base weights and the head's frozen original stay as loaded) and moves the values."""
    critic, plain = _lora_critic(tiny_model), _critic(tiny_model)
    names = {id(p): n for n, p in critic.model.named_parameters()}
    adapters = sorted(n for n in names.values() if lora.is_adapter_param(n))
    assert len(adapters) == 2 * len(LINEAR) * 2  # layers x linear layers x (A, B)
    assert _trained_names(critic) == sorted([*adapters, *HEAD])
    assert sorted(names[id(p)] for g in critic.optimizer.param_groups for p in g["params"]) == _trained_names(critic)
    assert lora.saved_modules(critic.model) == ["score"] and not any(
        "score" in n for n in lora.lora_layers(critic.model)
    )
    assert critic.adapters.peft.base_model.model is critic.model  # peft wrapped the critic's model in place
    config = critic.adapters.peft.peft_config["default"]
    assert (config.task_type, sorted(config.modules_to_save)) == ("TOKEN_CLS", ["classifier", "score"])

    batch = _critic_batch()
    before = critic.compute_values(batch)
    torch.testing.assert_close(before, plain.compute_values(batch), atol=0, rtol=0)  # lora_B starts at 0
    batch.old_values = before
    weights = {n: p.detach().clone() for n, p in critic.model.named_parameters()}
    metrics = _update(critic, batch)
    assert metrics["critic/optimizer_steps"] == 1.0 and metrics["critic/vf_loss"] > 0
    changed = sorted(n for n, p in critic.model.named_parameters() if not torch.equal(p, weights[n]))
    assert set(changed) <= set(_trained_names(critic)), set(changed) - set(_trained_names(critic))
    assert set(HEAD) <= set(changed) and any(".lora_B." in n for n in changed)
    after = critic.compute_values(batch)
    assert (after - before).abs().max() > 0.05, "the update did not move the values"
    torch.testing.assert_close(critic.compute_values(batch), after, atol=0, rtol=0)


def test_lora_dropout_trains_but_value_passes_are_deterministic(tiny_model):
    critic = _lora_critic(tiny_model, dropout=0.5)
    batch = _critic_batch()
    batch.old_values = critic.compute_values(batch)
    _update(critic, batch)  # lora_B leaves 0: the adapters' dropout matters from now on
    first = critic.compute_values(batch)
    torch.testing.assert_close(critic.compute_values(batch), first, atol=0, rtol=0)
    drops = [d for layer in lora.lora_layers(critic.model).values() for d in layer.lora_dropout.values()]
    assert drops and all(d.training for d in drops)  # back in training mode for the next update


def _policy(path) -> PolicyModel:
    """The policy a checkpoint needs beside the critic (LoRA: a small optimizer file)."""
    torch.manual_seed(0)
    actor = ActorConfig(optim={"lr": 1e-2, "eps": 1e-6}, lora={"r": 2, "alpha": 4})
    return PolicyModel(str(path), ModelConfig(path=str(path), dtype="float32"), actor, torch.device("cpu"))


def test_checkpoint_is_a_peft_adapter_with_the_value_head_that_peft_loads_and_that_resumes_exactly(
    tiny_model, smol_tokenizer, tmp_path
):
    """The checkpoint holds critic_adapter/ (no critic/): the adapters and the value head in PEFT format, and the
    critic optimizer's state of those alone; ``PeftModel.from_pretrained`` on the critic's base class computes the
    trained critic's values; a fresh critic with another head init, loaded from it, has the trained parameters and
    values exactly and takes the same next update bit for bit; other critic.lora settings, or none, are refused
    with the key to fix, and a checkpoint of a critic without LoRA is refused by a LoRA critic."""
    batch = _critic_batch()
    critic = _lora_critic(tiny_model)
    batch.old_values = critic.compute_values(batch)
    _update(critic, batch)
    policy = _policy(tiny_model)
    ckpt = checkpoint.save_checkpoint(tmp_path, 1, policy, smol_tokenizer, {"data": {}}, keep=2, rank=0, critic=critic)
    folder = ckpt / checkpoint.CRITIC_ADAPTER_FOLDER
    assert not (ckpt / "critic").exists() and (ckpt / checkpoint.ADAPTER_FOLDER).is_dir()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"]) == ("LORA", "TOKEN_CLS", 4, 8)
    assert sorted(config["target_modules"]) == sorted(LINEAR) and "score" in config["modules_to_save"]
    saved = load_file(folder / "adapter_model.safetensors")
    assert len(saved) == 2 * len(LINEAR) * 2 + 2
    head = critic.model.score.modules_to_save["default"]
    assert torch.equal(saved["base_model.model.score.weight"], head.weight.detach())
    assert torch.equal(saved["base_model.model.score.bias"], head.bias.detach())
    assert not any("original_module" in k or "score.lora" in k for k in saved)
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert "critic_adapter/adapter_model.safetensors" in files and checkpoint.verify(ckpt) is None
    optim = torch.load(ckpt / "critic_optimizer.pt", weights_only=False)
    assert sorted(optim["state"]) == _trained_names(critic)  # Adam moments of the adapters and the head only

    after = critic.compute_values(batch)
    torch.testing.assert_close(_peft_values(tiny_model, folder, batch), after, atol=1e-5, rtol=1e-5)

    resumed = _lora_critic(tiny_model, seed=1)  # another value head init: the checkpoint must replace it
    assert not torch.equal(resumed.model.score.modules_to_save["default"].weight, head.weight)
    checkpoint.load_checkpoint(ckpt, _policy(tiny_model), rank=0, critic=resumed)
    one, two = lora.adapter_state(critic.model, critic.device), lora.adapter_state(resumed.model, resumed.device)
    assert sorted(one) == sorted(two) == _trained_names(critic)
    assert all(torch.equal(one[k], two[k]) for k in one)
    torch.testing.assert_close(resumed.compute_values(batch), after, atol=0, rtol=0)
    batch.old_values = after
    for c in (critic, resumed):
        _update(c, batch)
    one, two = lora.adapter_state(critic.model, critic.device), lora.adapter_state(resumed.model, resumed.device)
    assert all(torch.equal(one[k], two[k]) for k in one), "the resumed optimizer took another step"

    def refused(critic: ValueModel, pattern: str) -> None:
        with pytest.raises(checkpoint.CheckpointError, match=pattern):
            checkpoint.load_checkpoint(ckpt, _policy(tiny_model), rank=0, critic=critic)

    refused(
        _critic(tiny_model), r"a LoRA adapter \(critic_adapter/\) but this run does full fine-tuning \(critic.lora.r\)"
    )
    refused(_lora_critic(tiny_model, r=8), r"other shapes than this model's \(critic.lora.r\?\)")
    refused(_lora_critic(tiny_model, target_modules=["q_proj", "v_proj"]), "does not fit this model's critic.lora")

    full = _critic(tiny_model)
    other = checkpoint.save_checkpoint(tmp_path / "full", 1, policy, smol_tokenizer, {"data": {}}, 2, 0, critic=full)
    assert (other / "critic" / "config.json").is_file()
    refused_full = r"full weights \(critic/\) but this run does LoRA \(critic.lora.r\)"
    with pytest.raises(checkpoint.CheckpointError, match=refused_full):
        checkpoint.load_checkpoint(other, _policy(tiny_model), rank=0, critic=_lora_critic(tiny_model))


# --- FSDP2: 2 ranks -----------------------------------------------------------------------------------------------


def _worker(model: str, out: str) -> None:
    """Alone or under torchrun: a critic without and one with LoRA (FSDP2 under torchrun), their values on the
    fixed batch, one update of the LoRA critic (each rank its contiguous share, several micro-batches), a
    checkpoint, a fresh LoRA critic loaded from it, and one more update on both. Rank 0 writes what the test
    checks."""
    from transformers import AutoTokenizer

    from plugrl.dist import exit_worker, init_distributed

    info = init_distributed("cpu")
    batch = _critic_batch()
    share = len(batch) // info.world_size
    plain = _critic(model, info.device, budget=24)
    result = {"plain": plain.compute_values(batch)}
    del plain
    critic = _lora_critic(model, info.device, budget=24)
    names = {id(p): n for n, p in critic.model.named_parameters()}
    result.update(
        trainable=_trained_names(critic),
        optimized=sorted(names[id(p)] for g in critic.optimizer.param_groups for p in g["params"]),
        sharded=type(critic.model.score.modules_to_save["default"].weight).__name__,
        before=critic.compute_values(batch),
    )
    batch.old_values = result["before"]
    local = batch.select(list(range(info.rank * share, (info.rank + 1) * share)))
    _update(critic, local)
    result["after"] = critic.compute_values(batch)
    result["adapter"] = lora.adapter_state(critic.model, info.device)

    run_dir = Path(out).with_suffix(".run")
    policy = _policy(model)  # a checkpoint holds one; under torchrun it is sharded too, as in a run
    tokenizer = AutoTokenizer.from_pretrained(model)
    ckpt = checkpoint.save_checkpoint(run_dir, 1, policy, tokenizer, {"data": {}}, 2, info.rank, critic=critic)
    resumed = _lora_critic(model, info.device, seed=1, budget=24)
    checkpoint.load_checkpoint(ckpt, policy, info.rank, critic=resumed)
    result["resumed_after"] = resumed.compute_values(batch)
    batch.old_values = result["after"]
    local = batch.select(list(range(info.rank * share, (info.rank + 1) * share)))
    for key, c in (("second", critic), ("resumed_second", resumed)):
        _update(c, local)
        result[key] = lora.adapter_state(c.model, info.device)
    result["ckpt"] = str(ckpt)
    if info.rank == 0:
        torch.save(result, out)
    exit_worker()


@pytest.mark.slow  # two launches, one of them torchrun with 2 ranks: ~40 s
def test_fsdp2_two_ranks_train_the_lora_critic_as_one_process_and_resume_exactly(tiny_model, tmp_path):
    """One update of a fixed global batch on 2 FSDP2 ranks (half the sequences each) gives the adapters and the
    value head one process gets from all of them; the head is sharded like the rest; before the update the values
    are the unwrapped critic's; the 2-rank checkpoint is a PEFT adapter that peft loads, and a fresh 2-rank critic
    resumes from it exactly."""
    runs = {}
    for key, launcher in {"alone": [sys.executable], "dp2": [*TORCHRUN, "--nproc_per_node=2"]}.items():
        out = tmp_path / f"{key}.pt"
        proc = subprocess.run(
            [*launcher, str(Path(__file__)), str(tiny_model), str(out)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[key] = torch.load(out, weights_only=False)
    alone, dp2 = runs["alone"], runs["dp2"]
    assert (alone["sharded"], dp2["sharded"]) == ("Parameter", "DTensor")
    for r in (alone, dp2):
        assert r["optimized"] == r["trainable"] == alone["trainable"]
        assert set(r["trainable"]) - {n for n in r["trainable"] if lora.is_adapter_param(n)} == set(HEAD)
        torch.testing.assert_close(r["before"], r["plain"], atol=0, rtol=0)  # lora_B starts at 0
        # the checkpoint resumes exactly: the same values, and the same next update bit for bit
        torch.testing.assert_close(r["resumed_after"], r["after"], atol=0, rtol=0)
        assert all(torch.equal(r["second"][k], r["resumed_second"][k]) for k in r["second"])
    # the same head init on 1 and 2 ranks (rank 0 builds the full copy); the update agrees up to float sums
    torch.testing.assert_close(dp2["before"], alone["before"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dp2["after"], alone["after"], atol=1e-5, rtol=1e-5)
    for k, t in alone["adapter"].items():
        torch.testing.assert_close(dp2["adapter"][k], t, atol=2e-5, rtol=1e-4, msg=k)
    adapter_dir = Path(dp2["ckpt"]) / checkpoint.CRITIC_ADAPTER_FOLDER
    torch.testing.assert_close(
        _peft_values(tiny_model, adapter_dir, _critic_batch()), dp2["after"], atol=1e-5, rtol=1e-5
    )


# --- the trainer --------------------------------------------------------------------------------------------------


@pytest.mark.slow  # three PPO steps through plugrl train: ~40 s
def test_ppo_run_with_a_lora_critic_trains_checkpoints_and_resumes(tiny_model, tmp_path):
    """PPO with GAE and critic.lora (and a full-weight policy): two steps train the critic's adapters and head,
    the checkpoint holds critic_adapter/ beside policy/, and a third step resumes from it."""
    from plugrl import cli
    from test_e2e import metrics, tiny_overrides

    common = [
        "train",
        "examples/ppo_gae.yaml",
        *tiny_overrides(tiny_model, tmp_path, 2),
        "critic.lora.r=4",
        "critic.lora.alpha=8",
        "critic.optim.lr=1e-2",
        "trainer.critic_warmup=0",
    ]
    assert cli.main(common) == 0
    logged = metrics(tmp_path / "e2e")
    assert [m["critic/optimizer_steps"] for m in logged] == [1.0, 1.0]
    assert logged[1]["critic/vpred_mean"] != logged[0]["critic/vpred_mean"]
    ckpt = tmp_path / "e2e" / "checkpoints" / "step_000002"
    assert (ckpt / "critic_adapter" / "adapter_config.json").is_file() and not (ckpt / "critic").exists()
    assert (ckpt / "policy" / "config.json").is_file()
    assert cli.main([*common, "trainer.total_steps=3"]) == 0
    assert [m["step"] for m in metrics(tmp_path / "e2e")] == [1, 2, 3]


if __name__ == "__main__":
    _worker(*sys.argv[1:])
