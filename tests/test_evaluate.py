"""Validation: pass@k by hand, `plugrl eval` on a config and on a checkpoint, validation during training."""

from __future__ import annotations

import json

import pytest

from plugrl.evaluate import pass_at_k
from test_e2e import metrics, run_plugrl, tiny_overrides


def test_pass_at_k_by_hand():
    # n=4, c=1: pass@1 = 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 3, 2) == 1.0
    with pytest.raises(ValueError, match="pass@5 needs at least 5 samples"):
        pass_at_k(4, 1, 5)


def test_validation_during_training_and_eval_of_the_checkpoint(tiny_model, tmp_path):
    run_plugrl(
        [
            "train",
            "examples/countdown_grpo.yaml",
            *tiny_overrides(tiny_model, tmp_path, 2),
            "trainer.test_freq=2",
            "trainer.val_before_train=true",
            "data.max_samples=12",
            "rollout.val_kwargs.n=2",
            "rollout.val_kwargs.temperature=1.0",
        ]
    )
    m = metrics(tmp_path / "e2e")
    assert [x["step"] for x in m] == [0, 1, 2]  # step 0: before training
    for x in (m[0], m[2]):
        assert x["val/all/prompts"] == 12 and "val/countdown/pass@2" in x
        assert 0.0 <= x["val/countdown/accuracy"] <= x["val/countdown/pass@2"] <= 1.0
    assert "val/all/prompts" not in m[1]
    rows = (tmp_path / "e2e" / "validation" / "step_000002.jsonl").read_text().splitlines()
    assert len(rows) == 24 and json.loads(rows[0])["data_source"] == "countdown"

    out = tmp_path / "eval.json"
    proc = run_plugrl(
        [
            "eval",
            str(tmp_path / "e2e" / "checkpoints" / "step_000002"),
            "rollout.name=hf",
            "data.max_samples=5",
            "--n",
            "2",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert result["val/all/prompts"] == 5 and "val/countdown/pass@2" in result
    assert "val/countdown/accuracy" in proc.stdout
