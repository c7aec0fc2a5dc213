"""Resuming checks that the checkpoints are this run's (issue 41): two runs that share a run directory (verl's
example scripts for GRPO, RLOO and REINFORCE++ share one experiment name) must not continue each other's
checkpoints. A checkpoint made with another model, estimator, loss or data stops the run at start, naming the
keys and the ways out; keys that legitimately change on resume do not."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from plugrl.config import load_config
from plugrl.resume_check import IDENTITY_KEYS, RECORD_KEY, resume_problem, run_identity
from test_e2e import ROOT, metrics, tiny_overrides

EXAMPLE = ROOT / "examples/countdown_grpo.yaml"


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(EXAMPLE, [f"trainer.output_dir={tmp_path}", "trainer.experiment_name=shared", *overrides])


def _checkpoint(run_dir: Path, step: int, record: dict | None) -> Path:
    """A checkpoint folder as list_checkpoints sees it, with its trainer_state.json (no weights: none are read)."""
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    state = {"step": step, "data": {}} | ({} if record is None else {RECORD_KEY: record})
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    return ckpt


# the case, the other identity keys, and a spelling of each in the other project's terms
OTHER_RUNS = {
    "another estimator (verl's RLOO script)": (["algorithm.adv_estimator=rloo"], "algorithm.adv_estimator was 'grpo'"),
    "another model": (["model.path=/models/Qwen2.5-0.5B"], "model.path was 'local:SmolLM2-135M-Instruct'"),
    "another loss": (["actor.loss_mode=gspo", "actor.loss_agg_mode=seq-mean-token-mean"], "actor.loss_mode was"),
    "other data options": (["data.dataset_options.max_number=99"], "data.dataset_options.max_number was 10, now 99"),
    "other data files": (["data.dataset=null", "data.train_files=[other.parquet]"], "data.train_files was []"),
    "LoRA instead of full weights": (["actor.lora.r=8"], "actor.lora.r was 0, now 8"),
}


@pytest.mark.parametrize("name", list(OTHER_RUNS))
def test_a_checkpoint_of_another_run_is_not_resumed(tmp_path, name):
    overrides, named = OTHER_RUNS[name]
    first = _cfg(tmp_path)
    ckpt = _checkpoint(first.trainer.run_dir, 4, run_identity(first))
    problem = resume_problem(_cfg(tmp_path, *overrides))
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"trainer.resume=auto would continue {ckpt}, but that checkpoint was made by another run")
    assert named in problem
    assert "a new trainer.experiment_name (now 'shared')" in problem
    assert f"start it afresh in {first.trainer.run_dir} with trainer.resume=disable" in problem
    assert resume_problem(_cfg(tmp_path, *overrides, "trainer.resume=disable")) is None


def test_keys_that_change_on_resume_do_not_block(tmp_path):
    first = _cfg(tmp_path)
    _checkpoint(first.trainer.run_dir, 2, run_identity(first))
    resumed = _cfg(
        tmp_path,
        "trainer.total_steps=500",
        "trainer.save_freq=7",
        "trainer.test_freq=3",
        "trainer.log_freq=5",
        "trainer.logger=[console,jsonl,tensorboard]",
        "trainer.max_checkpoints=4",
        "actor.optim.lr=3e-6",
        "data.train_batch_size=8",
        "rollout.n=4",
        "rollout.name=hf",
        "actor.ppo_max_token_len_per_gpu=2048",
        "trainer.project_name=other",
    )
    assert resume_problem(resumed) is None


def test_a_shared_default_local_dir_names_that_key_as_the_way_out(tmp_path):
    shared = f"trainer.default_local_dir={tmp_path / 'ckpts'}"
    first = _cfg(tmp_path, shared)
    _checkpoint(first.trainer.run_dir, 1, run_identity(first))
    problem = resume_problem(_cfg(tmp_path, shared, "algorithm.adv_estimator=reinforce_plus_plus"))
    assert "algorithm.adv_estimator was 'grpo', now 'reinforce_plus_plus'" in problem
    assert "(trainer.default_local_dir=<another folder>)" in problem


def test_checkpoints_without_a_record_are_judged_by_the_run_directorys_config_yaml(tmp_path):
    """Checkpoints of a plugrl before the record: config.yaml (written at every start) speaks for them."""
    from plugrl.config import dump_config

    first = _cfg(tmp_path)
    run_dir = first.trainer.run_dir
    _checkpoint(run_dir, 3, None)
    assert resume_problem(_cfg(tmp_path, "algorithm.adv_estimator=rloo")) is None  # no config.yaml: nothing to tell
    (run_dir / "config.yaml").write_text(dump_config(first))
    assert "algorithm.adv_estimator was 'grpo', now 'rloo'" in resume_problem(
        _cfg(tmp_path, "algorithm.adv_estimator=rloo")
    )
    assert resume_problem(_cfg(tmp_path, "trainer.total_steps=9")) is None


def test_an_older_checkpoint_of_another_run_behind_this_runs_newest_is_found(tmp_path):
    """A directory that holds both runs' checkpoints (the second began with trainer.resume=disable) is refused
    whichever is newest: auto would fall back to the older one if the newest failed its manifest check."""
    first, second = _cfg(tmp_path), _cfg(tmp_path, "algorithm.adv_estimator=rloo")
    older = _checkpoint(first.trainer.run_dir, 9, run_identity(first))
    _checkpoint(first.trainer.run_dir, 12, run_identity(second))
    problem = resume_problem(second)
    assert f"would continue {older}" in problem and "now 'rloo'" in problem


def test_the_identity_keys_are_config_keys(tmp_path):
    identity = run_identity(_cfg(tmp_path))
    assert set(identity) == set(IDENTITY_KEYS)


@pytest.mark.slow
def test_plugrl_train_refuses_another_estimators_checkpoint_then_resumes_its_own(tiny_model, tmp_path, capsys, caplog):
    """The issue's case end to end (tiny model, HF engine): GRPO saves step 1; RLOO with the same experiment name
    stops at start (exit 2, before any model loads) and trains nothing; GRPO again with more steps, another save
    frequency and loggers resumes at step 1. The checkpoint records what it was made with."""
    from plugrl import cli

    def train(*overrides: str) -> int:
        return cli.main(
            ["train", str(EXAMPLE), *tiny_overrides(tiny_model, tmp_path, 1), "trainer.save_freq=1", *overrides]
        )

    assert train() == 0
    run_dir = tmp_path / "e2e"
    ckpt = run_dir / "checkpoints" / "step_000001"
    record = json.loads((ckpt / "trainer_state.json").read_text())[RECORD_KEY]
    assert record["algorithm.adv_estimator"] == "grpo" and record["model.path"] == str(tiny_model)
    capsys.readouterr()

    assert train("algorithm.adv_estimator=rloo") == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("plugrl: error:"))
    assert f"trainer.resume=auto would continue {ckpt}, but that checkpoint was made by another run" in line
    assert "algorithm.adv_estimator was 'grpo', now 'rloo'" in line and "trainer.resume=disable" in line
    assert "resumed from" not in err and [m["step"] for m in metrics(run_dir)] == [1]

    caplog.set_level(logging.INFO, logger="plugrl")
    assert train("trainer.total_steps=2", "trainer.save_freq=5", "trainer.logger=[console,jsonl]") == 0
    assert f"resumed from {ckpt} at step 1" in caplog.text
    assert [m["step"] for m in metrics(run_dir)] == [1, 2]
