"""LoRA (actor.lora, through peft): config and verl keys, only the adapters train, the reference is the policy with
its adapters off, the engine gets merged weights, checkpoints hold a PEFT adapter that peft loads and that resumes
exactly, on one process and under FSDP2 with 1 and 2 ranks (tests/lora_worker.py)."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dp_worker import global_batch
from plugrl import checkpoint
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ConfigError, ModelConfig, build_config
from plugrl_lora import adapters as lora
from test_e2e import PLUGRL, ROOT, metrics, run_plugrl, tiny_overrides

BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def _lora_policy(path, lr: float = 1e-2, **lora_cfg) -> PolicyModel:
    torch.manual_seed(0)  # as the trainer's seed_everything: the adapters' init follows the seed
    actor = ActorConfig(optim={"lr": lr, "eps": 1e-6}, lora={"r": 4, "alpha": 8, **lora_cfg})
    return PolicyModel(str(path), ModelConfig(path=str(path), dtype="float32"), actor, torch.device("cpu"))


def _base_policy(path) -> PolicyModel:
    """The base model loaded on its own, as the trainer loads a reference without LoRA."""
    return PolicyModel(
        str(path), ModelConfig(path=str(path), dtype="float32"), ActorConfig(), torch.device("cpu"), trainable=False
    )


def _adapter_names(model) -> list[str]:
    return sorted(n for n, _ in model.named_parameters() if ".lora_A." in n or ".lora_B." in n)


def _merged(base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """W + scale * B @ A for every adapted layer of ``base`` (the file's weights), from the adapter's full tensors."""
    out = dict(base)
    for name, a in adapter.items():
        if ".lora_A." in name:
            layer = name.split(".lora_A.")[0]
            b = adapter[name.replace(".lora_A.", ".lora_B.")]
            out[f"{layer}.weight"] = base[f"{layer}.weight"] + scale * (b @ a)
    return out


def _peft_logprobs(base_path, adapter_dir, batch) -> torch.Tensor:
    """[B, T] log-probs of the batch's response tokens under transformers + ``PeftModel.from_pretrained``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32), adapter_dir)
    model.eval()
    out = torch.zeros(batch.response_mask.shape)
    for i, (seq, p) in enumerate(zip(batch.sequences, batch.prompt_lens, strict=True)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0].float()
        logp = torch.log_softmax(logits, -1)[p - 1 : len(seq) - 1].gather(-1, torch.tensor(seq[p:])[:, None])[:, 0]
        out[i, : len(seq) - p] = logp
    return out


# --- config ------------------------------------------------------------------------------------------------------


def test_lora_config_defaults_verl_keys_and_bad_values():
    cfg = build_config(copy.deepcopy(BASE))
    assert cfg.actor.lora.model_dump() == {"r": 0, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"}
    verl = [
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
    ]
    lora_cfg = build_config(copy.deepcopy(BASE), verl).actor.lora
    assert (lora_cfg.r, lora_cfg.alpha, lora_cfg.target_modules) == (8, 32.0, ["q_proj", "v_proj"])
    # a command line's comma-separated names are a list
    assert build_config(copy.deepcopy(BASE), ["actor.lora.target_modules=q_proj,v_proj"]).actor.lora.target_modules == [
        "q_proj",
        "v_proj",
    ]

    def error(*overrides) -> str:
        with pytest.raises(ConfigError) as info:
            build_config(copy.deepcopy(BASE), list(overrides))
        return str(info.value)

    assert "actor.lora.r: Input should be greater than or equal to 0 (got -1)" in error("actor.lora.r=-1")
    assert "actor.lora.dropout" in error("actor.lora.dropout=1.0")
    assert "actor.lora.alpha" in error("actor.lora.alpha=0")
    assert "actor.lora: target_modules is empty" in error("actor.lora.target_modules=[]")
    # tensor parallelism shards nn.Linear modules that LoRA wraps: refused at start, naming both keys
    message = error("actor.lora.r=4", "actor.tp_size=2")
    assert "actor.lora.r=4 cannot combine with actor.tp_size=2" in message and "actor.tp_size=1" in message
    assert build_config(copy.deepcopy(BASE), ["actor.lora.r=0", "actor.tp_size=2"]).actor.tp_size == 2  # LoRA off


def test_target_modules_select_linear_layers_and_a_name_matching_none_is_an_error(tiny_model):
    policy = _lora_policy(tiny_model, target_modules=["q_proj", "v_proj"])
    trainable = sorted(n for n, p in policy.model.named_parameters() if p.requires_grad)
    assert trainable == _adapter_names(policy.model)
    assert {n.split(".")[4] for n in trainable} == {"q_proj", "v_proj"} and len(trainable) == 2 * 2 * 2
    with pytest.raises(ConfigError) as info:
        _lora_policy(tiny_model, target_modules=["q_proj", "qkv_proj"])
    message = str(info.value)
    assert message.startswith("actor.lora.target_modules: ['qkv_proj'] match no linear layer of LlamaForCausalLM")
    assert all(name in message for name in LINEAR), message  # the model's linear layers, to pick from
    assert "lm_head" not in message.split("Its linear layers")[1]


# --- one process ------------------------------------------------------------------------------------------------


def test_only_adapters_train_the_reference_is_the_base_model_and_the_engine_gets_merged_weights(
    tiny_model, smol_tokenizer
):
    """r=4, alpha=8 on every linear layer: the adapters (and nothing else) require grad and are the optimizer's
    parameters; an update moves the log-probs, while the log-probs with the adapters off stay equal (float32,
    exactly) to a separately loaded base model's; the HF engine, given ``named_full_parameters``, holds
    W + alpha / r * B @ A under the base names and computes the trained policy's log-probs."""
    from plugrl.rollout.hf_engine import HFEngine

    policy = _lora_policy(tiny_model)
    names = {id(p): n for n, p in policy.model.named_parameters()}
    adapters = _adapter_names(policy.model)
    assert len(adapters) == 2 * len(LINEAR) * 2  # layers x linear layers x (A, B)
    assert sorted(n for n, p in policy.model.named_parameters() if p.requires_grad) == adapters
    assert sorted(names[id(p)] for g in policy.optimizer.param_groups for p in g["params"]) == adapters
    assert policy.adapters.peft.base_model.model is policy.model  # peft wrapped the policy's model in place

    batch = global_batch()
    base = _base_policy(tiny_model)
    reference = base.compute_logprobs(batch, 1.0, 64)
    before = policy.compute_logprobs(batch, 1.0, 64)
    torch.testing.assert_close(before, reference, atol=0, rtol=0)  # lora_B starts at 0
    policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
    after = policy.compute_logprobs(batch, 1.0, 64)
    assert (after - before).abs().max() > 0.05, "the update did not move the policy"
    torch.testing.assert_close(policy.compute_logprobs(batch, 1.0, 64, adapters=False), reference, atol=0, rtol=0)
    assert all(not p.requires_grad for p in base.model.parameters())
    with pytest.raises(ValueError, match="needs a LoRA policy"):
        base.compute_logprobs(batch, 1.0, 64, adapters=False)

    adapter = lora.adapter_state(policy.model, policy.device)
    assert any(t.abs().max() > 0 for n, t in adapter.items() if ".lora_B." in n), "lora_B is still zero"
    file_weights = load_file(tiny_model / "model.safetensors")
    expected = _merged(file_weights, {k.replace(".default", ""): v for k, v in adapter.items()}, 8 / 4)
    engine = HFEngine(str(tiny_model), "float32", "cpu", smol_tokenizer)
    engine_names = {n for n, _ in engine.model.named_parameters()}
    synced = dict(policy.named_full_parameters(torch.float32))
    assert set(synced) <= engine_names and "model.layers.0.self_attn.q_proj.weight" in synced
    engine.load_weights(iter(synced.items()))
    for name, p in engine.model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], atol=1e-6, rtol=1e-6, msg=name)
    assert not torch.equal(
        expected["model.layers.0.mlp.down_proj.weight"], file_weights["model.layers.0.mlp.down_proj.weight"]
    )
    # the engine's model computes what the trained policy does
    for i, (seq, p) in enumerate(zip(batch.sequences, batch.prompt_lens, strict=True)):
        with torch.no_grad():
            logits = engine.model(input_ids=torch.tensor([seq])).logits[0]
        logp = torch.log_softmax(logits, -1)[p - 1 : len(seq) - 1].gather(-1, torch.tensor(seq[p:])[:, None])[:, 0]
        torch.testing.assert_close(logp, after[i, : len(seq) - p], atol=1e-5, rtol=1e-5)


def test_under_bf16_autocast_frozen_bases_are_held_in_bf16_and_every_number_stays_the_same(tiny_model, monkeypatch):
    """``model.dtype: bfloat16`` in one process: the adapters' frozen base weights and biases are held in bf16
    (autocast casts them so in every forward anyway), the adapters, embedding and norms stay float32. The old
    log-probs, an update's loss, grad norm and adapters after it, the reference log-probs and the merged weights
    for the engine equal, bit for bit, those of the same policy with float32 bases."""

    def policy(hold: bool) -> PolicyModel:
        if not hold:
            monkeypatch.setattr(lora, "hold_frozen_bases", lambda *args, **kwargs: 0)
        torch.manual_seed(0)
        actor = ActorConfig(optim={"lr": 1e-2, "eps": 1e-6}, lora={"r": 4, "alpha": 8})
        out = PolicyModel(str(tiny_model), ModelConfig(path=str(tiny_model), dtype="bfloat16"), actor, "cpu")
        monkeypatch.undo()
        return out

    held, kept = policy(True), policy(False)
    dtypes = {n: p.dtype for n, p in held.model.named_parameters()}
    bases = [n for n in dtypes if ".base_layer." in n]
    assert bases and all(dtypes[n] == torch.bfloat16 for n in bases)
    assert all(dtypes[n] == torch.float32 for n in dtypes if n not in bases)  # adapters, embedding, norms
    assert all(p.dtype == torch.float32 for n, p in kept.model.named_parameters())
    # none is left on the model file's mapping, which the cast paged in (a memory of its own: resizable)
    assert all(p.untyped_storage().resizable() for p in held.model.parameters())

    batch = global_batch()
    results = []
    for p in (held, kept):
        old = p.compute_logprobs(batch, 1.0, 64)
        batch.old_logprobs = old
        metrics = p.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
        merged = dict(p.named_full_parameters(torch.float32))
        reference = p.compute_logprobs(batch, 1.0, 64, adapters=False)
        results.append((old, metrics, reference, lora.adapter_state(p.model, p.device), merged))
    (old_h, m_h, ref_h, ad_h, merged_h), (old_k, m_k, ref_k, ad_k, merged_k) = results
    assert torch.equal(old_h, old_k) and torch.equal(ref_h, ref_k)
    assert m_h["actor/grad_norm"] == m_k["actor/grad_norm"] > 0 and m_h["actor/pg_loss"] == m_k["actor/pg_loss"]
    assert ad_h.keys() == ad_k.keys() and all(torch.equal(ad_h[n], ad_k[n]) for n in ad_h)
    # the engine's merged weights W + s * B @ A: from the bf16 base they differ from the float32 one's by W's bf16
    # rounding at most (none where the file's weights are bf16 numbers; the tiny model's are not), as the forward
    # sees W; everything else equal
    files = load_file(tiny_model / "model.safetensors")
    assert merged_h.keys() == merged_k.keys()
    for name, w in merged_h.items():
        assert w.dtype == torch.float32
        owner, _, leaf = name.rpartition(".")
        rounding = torch.zeros_like(w)
        if f"{owner}.base_layer.{leaf}" in bases:
            rounding = files[name] - files[name].to(torch.bfloat16).float()
        torch.testing.assert_close(w - merged_k[name], -rounding, atol=1e-7, rtol=0, msg=name)


def test_lora_dropout_trains_but_log_prob_passes_are_deterministic(tiny_model):
    policy = _lora_policy(tiny_model, dropout=0.5)
    batch = global_batch()
    policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)  # lora_B leaves 0: dropout matters
    first = policy.compute_logprobs(batch, 1.0, 64)
    torch.testing.assert_close(policy.compute_logprobs(batch, 1.0, 64), first, atol=0, rtol=0)
    drops = [d for layer in lora.lora_layers(policy.model).values() for d in layer.lora_dropout.values()]
    assert drops and all(d.training for d in drops)  # back in training mode for the next update


def test_checkpoint_is_a_peft_adapter_that_peft_loads_and_that_resumes_exactly(tiny_model, smol_tokenizer, tmp_path):
    """The checkpoint holds policy_adapter/ (adapter_config.json, adapter_model.safetensors, the tokenizer) and the
    adapters' optimizer state, no full weights; ``PeftModel.from_pretrained(base, policy_adapter)`` computes the
    trained policy's log-probs; a fresh policy loaded from it takes the same next update, bit for bit; a run with
    other LoRA settings, or without LoRA, is refused with the key to fix."""
    batch = global_batch()
    policy = _lora_policy(tiny_model)
    policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
    ckpt = checkpoint.save_checkpoint(tmp_path, 1, policy, smol_tokenizer, {"data": {}}, keep=2, rank=0)
    folder = ckpt / checkpoint.ADAPTER_FOLDER
    assert not (ckpt / "policy").exists()
    assert (folder / "adapter_model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert sorted(config["target_modules"]) == sorted(LINEAR) and config["base_model_name_or_path"] == str(tiny_model)
    saved = load_file(folder / "adapter_model.safetensors")
    assert len(saved) == 2 * len(LINEAR) * 2
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in saved
    manifest = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert "policy_adapter/adapter_model.safetensors" in manifest and checkpoint.verify(ckpt) is None
    optim = torch.load(ckpt / "optimizer.pt", weights_only=False)
    assert sorted(optim["state"]) == _adapter_names(policy.model)  # Adam moments of the adapters only

    after = policy.compute_logprobs(batch, 1.0, 64)
    torch.testing.assert_close(_peft_logprobs(tiny_model, folder, batch), after, atol=1e-5, rtol=1e-5)

    resumed = _lora_policy(tiny_model)
    checkpoint.load_checkpoint(ckpt, resumed, rank=0)
    torch.testing.assert_close(resumed.compute_logprobs(batch, 1.0, 64), after, atol=0, rtol=0)
    for p in (policy, resumed):
        p.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
    one, two = lora.adapter_state(policy.model, policy.device), lora.adapter_state(resumed.model, resumed.device)
    assert all(torch.equal(one[k], two[k]) for k in one), "the resumed optimizer took another step"

    with pytest.raises(checkpoint.CheckpointError, match="a LoRA adapter .* full fine-tuning .*actor.lora.r"):
        checkpoint.load_checkpoint(ckpt, _base_policy_trainable(tiny_model), rank=0)
    with pytest.raises(checkpoint.CheckpointError, match="other shapes than this model's .*actor.lora.r"):
        checkpoint.load_checkpoint(ckpt, _lora_policy(tiny_model, r=8), rank=0)


def _base_policy_trainable(path) -> PolicyModel:
    return PolicyModel(str(path), ModelConfig(path=str(path), dtype="float32"), ActorConfig(), torch.device("cpu"))


# --- FSDP2: 1 and 2 ranks -----------------------------------------------------------------------------------------


def _run_workers(tiny_model, tmp_path, launches: dict[str, list[str]]) -> dict[str, dict]:
    worker = str(ROOT / "tests" / "lora_worker.py")
    results = {}
    for key, launcher in launches.items():
        out = tmp_path / f"{key}.pt"
        mode = ["offload"] if key.endswith("offload") else []
        proc = subprocess.run(
            [*launcher, worker, str(tiny_model), str(out), *mode], capture_output=True, text=True, timeout=600, cwd=ROOT
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        results[key] = torch.load(out, weights_only=False)
    return results


def _check_run(r: dict, alone: dict, tiny_model) -> None:
    """What every launch must show, and its agreement with one process (``alone``)."""
    adapters = r["trainable"]
    assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    assert r["optimized"] == r["trainable"] == alone["trainable"]
    torch.testing.assert_close(r["before"], alone["before"], atol=0, rtol=0)
    torch.testing.assert_close(r["ref"], r["before"], atol=0, rtol=0)  # the adapters off: the base model, exactly
    # measured max 1e-6 (log-probs) and 3e-6 (adapters) between 1 process and 2 ranks
    torch.testing.assert_close(r["after"], alone["after"], atol=1e-5, rtol=1e-5)
    for k, t in alone["adapter"].items():
        torch.testing.assert_close(r["adapter"][k], t, atol=2e-5, rtol=1e-4, msg=k)
    expected = _merged(
        load_file(tiny_model / "model.safetensors"),
        {k.replace(".default", ""): v for k, v in r["adapter"].items()},
        2.0,
    )
    assert set(r["merged"]) == set(expected) - {"lm_head.weight"}  # tied to the embedding: sent once
    for k, t in r["merged"].items():
        torch.testing.assert_close(t, expected[k], atol=1e-6, rtol=1e-6, msg=k)
    # the checkpoint resumes exactly: same log-probs, and the same next update bit for bit
    torch.testing.assert_close(r["resumed_after"], r["after"], atol=0, rtol=0)
    assert all(torch.equal(r["second"][k], r["resumed_second"][k]) for k in r["second"])


@pytest.mark.slow  # two torchrun jobs, ~30 s: CI runs it (make test-all)
def test_fsdp2_two_ranks_train_lora_as_one_process_and_resume_exactly(tiny_model, tmp_path):
    """One update of a fixed global batch on 2 FSDP2 ranks (half the sequences each) gives the adapters one process
    gets from all of them; the frozen base stays sharded beside them; the 2-rank checkpoint is a PEFT adapter that
    peft loads, and a fresh 2-rank policy resumes from it exactly."""
    runs = _run_workers(tiny_model, tmp_path, {"alone": [sys.executable], "dp2": [*TORCHRUN, "--nproc_per_node=2"]})
    alone, dp2 = runs["alone"], runs["dp2"]
    assert (alone["sharded"], dp2["sharded"]) == ("Parameter", "DTensor")
    _check_run(dp2, alone, tiny_model)
    adapter_dir = Path(dp2["ckpt"]) / checkpoint.ADAPTER_FOLDER
    torch.testing.assert_close(
        _peft_logprobs(tiny_model, adapter_dir, global_batch()), dp2["after"], atol=1e-5, rtol=1e-5
    )


@pytest.mark.slow
def test_fsdp2_one_rank_and_two_ranks_with_param_offload_train_lora_as_one_process(tiny_model, tmp_path):
    """torchrun with 1 rank (FSDP2 over one rank) and 2 ranks with actor.fsdp_config.param_offload (FSDP2's
    CPUOffloadPolicy holds frozen and trainable shards alike) agree with one process and resume exactly."""
    runs = _run_workers(
        tiny_model,
        tmp_path,
        {
            "alone": [sys.executable],
            "dp1": [*TORCHRUN, "--nproc_per_node=1"],
            "dp2_offload": [*TORCHRUN, "--nproc_per_node=2"],
        },
    )
    for key in ("dp1", "dp2_offload"):
        assert runs[key]["sharded"] == "DTensor"
        _check_run(runs[key], runs["alone"], tiny_model)


# --- the trainer --------------------------------------------------------------------------------------------------


def _lora_run(tiny_model, tmp_path, steps: int, name: str) -> list[str]:
    return [
        "train",
        "examples/countdown_grpo.yaml",
        *tiny_overrides(tiny_model, tmp_path, steps),
        "actor.lora.r=4",
        "actor.lora.alpha=8",
        "actor.optim.lr=1e-2",
        "actor.use_kl_loss=true",
        "actor.kl_loss_coef=0.5",
        "trainer.save_freq=1",
        f"trainer.experiment_name={name}",
    ]


def test_trainer_loads_no_reference_model_with_lora(tiny_model, tmp_path, monkeypatch):
    """actor.use_kl_loss with LoRA: one PolicyModel is built (no frozen copy) and the KL to the reference (the
    adapters off) is 0 at step 1, where lora_B is 0, and positive once the adapters have moved."""
    from plugrl import cli, trainer

    built = []
    real = trainer.PolicyModel

    def spy(*args, **kwargs):
        built.append(kwargs.get("trainable", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "PolicyModel", spy)
    code = cli.main(_lora_run(tiny_model, tmp_path, 2, "lora"))
    assert code == 0
    assert built == [True], built
    logged = metrics(tmp_path / "lora")
    assert logged[0]["actor/kl_loss"] == 0.0 and logged[1]["actor/kl_loss"] > 0, logged
    assert (tmp_path / "lora" / "checkpoints" / "step_000002" / "policy_adapter" / "adapter_config.json").is_file()
    # plugrl eval takes the adapter checkpoint: merged into the run's base model for the engine, in a temporary
    # folder that goes at the end (it held a whole model; it used to stay in /tmp)
    out, scratch = tmp_path / "eval.json", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    code = cli.main(
        ["eval", str(tmp_path / "lora" / "checkpoints" / "step_000002"), "rollout.name=hf", "data.max_samples=2"]
        + ["--n", "1", "--out", str(out)]
    )
    assert code == 0 and json.loads(out.read_text())["val/all/prompts"] == 2
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
def test_lora_run_sigkilled_after_a_checkpoint_resumes_as_an_uninterrupted_run(tiny_model, tmp_path):
    """A 4-step LoRA run (KL to the adapters-off reference) SIGKILLed after its step-2 checkpoint, then run again:
    it resumes from that checkpoint and ends with the uninterrupted run's per-step metrics and bitwise the same
    adapter."""
    from test_reliability import _comparable

    run_plugrl(_lora_run(tiny_model, tmp_path, 4, "reference"))
    args = [*PLUGRL, *_lora_run(tiny_model, tmp_path, 4, "killed")]
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline and not (run_dir / "checkpoints" / "step_000002").is_dir():
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ready = checkpoint.latest_checkpoint(run_dir)
    assert ready is not None and ready.name in ("step_000002", "step_000003"), ready
    assert not (run_dir / "checkpoints" / "step_000004").exists(), "the run finished before its kill"
    proc = run_plugrl(_lora_run(tiny_model, tmp_path, 4, "killed"))
    assert f"resumed from {ready} at step" in proc.stderr
    assert _comparable(run_dir) == _comparable(tmp_path / "reference")
    final = "checkpoints/step_000004/policy_adapter/adapter_model.safetensors"
    got, expected = load_file(run_dir / final), load_file(tmp_path / "reference" / final)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)
