"""Validation: pass@k by hand, `plugrl eval` on a config and on a checkpoint, validation during training."""

from __future__ import annotations

import json

import pytest

from plugrl.evaluate import pass_at_k, pass_at_k_ks
from test_e2e import metrics, run_plugrl, tiny_overrides


def test_pass_at_k_by_hand():
    # n=4, c=1: pass@1 = 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 3, 2) == 1.0
    # n=5, c=2: pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7; pass@4 = 1 (3 wrong cannot fill 4 draws)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4) and pass_at_k(5, 2, 4) == 1.0
    # n=8, c=1: pass@k = k/8 (the one correct sample is among the k drawn)
    assert [pass_at_k(8, 1, k) for k in (1, 2, 4, 8)] == pytest.approx([0.125, 0.25, 0.5, 1.0])
    with pytest.raises(ValueError, match="pass@5 needs at least 5 samples"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_pass_at_k_is_reported_for_powers_of_2_and_n():
    assert pass_at_k_ks(1) == [1] and pass_at_k_ks(2) == [1, 2] and pass_at_k_ks(4) == [1, 2, 4]
    assert pass_at_k_ks(6) == [1, 2, 4, 6] and pass_at_k_ks(16) == [1, 2, 4, 8, 16]


def test_validate_reports_pass_at_k_per_data_source():
    """Rewards chosen per sample, 4 samples a prompt: pass@k by hand per data source and for all."""
    from types import SimpleNamespace as NS

    from plugrl.evaluate import validate
    from plugrl.rewards import RewardOutput
    from plugrl.rollout import SamplingSettings

    right = {"a": [[1, 0, 0, 0]], "b": [[1, 1, 0, 0], [0, 0, 0, 0]]}  # per prompt, its 4 samples
    prompts = [NS(sample=NS(data_source=src, ground_truth="x"), text="q", ids=[1], engine_prompt=[1]) for src in "abb"]
    flat = [float(x) for src in "ab" for group in right[src] for x in group]

    class Engine:
        wake_up = sleep = staticmethod(lambda: None)

        def generate(self, ids, sampling):  # sample j of a prompt has j + 1 tokens
            return [[NS(response_ids=[7] * (j + 1)) for j in range(sampling.n)] for _ in ids]

    class Rewards:
        def score(self, items):
            return RewardOutput(flat, [{} for _ in items], {})

    tokenizer = NS(batch_decode=lambda ids, skip_special_tokens: ["t"] * len(ids))
    m, rows = validate(
        Engine(), tokenizer, prompts, Rewards(), SamplingSettings(n=4, max_tokens=8), prefill=None, threshold=0.5
    )
    # a: c=1 of 4 -> pass@1 0.25, pass@2 0.5, pass@4 1.0
    assert [m[f"val/a/pass@{k}"] for k in (1, 2, 4)] == pytest.approx([0.25, 0.5, 1.0])
    # b: c=2 -> 0.5, 1 - C(2,2)/C(4,2) = 5/6, 1.0; c=0 -> 0, 0, 0; averaged over the 2 prompts
    assert [m[f"val/b/pass@{k}"] for k in (1, 2, 4)] == pytest.approx([0.25, 5 / 12, 0.5])
    assert [m[f"val/all/pass@{k}"] for k in (1, 2, 4)] == pytest.approx([0.25, (0.5 + 5 / 6) / 3, 2 / 3])
    assert m["val/a/accuracy"] == 0.25 and m["val/b/accuracy"] == 0.25 and m["val/all/prompts"] == 3
    assert m["val/b/response_length_mean"] == 2.5 and len(rows) == 12
    assert not any("pass@3" in k for k in m)


@pytest.mark.slow
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
            # verl's dump directories, as its scripts spell them: written as well as the run's own files
            f"+trainer.rollout_data_dir={tmp_path / 'verl_rollouts'}",
            f"trainer.validation_data_dir={tmp_path / 'verl_val'}",
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
    # verl's layout: {dir}/{step}.jsonl, one line per sample: input, output, gts, score, step, then details
    assert sorted(p.name for p in (tmp_path / "verl_val").iterdir()) == ["0.jsonl", "2.jsonl"]
    ours = [json.loads(r) for r in rows]
    theirs = [json.loads(r) for r in (tmp_path / "verl_val" / "2.jsonl").read_text().splitlines()]
    assert [list(t)[:5] for t in theirs] == [["input", "output", "gts", "score", "step"]] * 24
    assert [(t["input"], t["output"], t["gts"], t["score"], t["step"]) for t in theirs] == [
        (o["prompt"], o["completion"], o["ground_truth"], o["reward"], 2) for o in ours
    ]
    assert sorted(p.name for p in (tmp_path / "verl_rollouts").iterdir()) == ["1.jsonl", "2.jsonl"]
    ours = [json.loads(r) for r in (tmp_path / "e2e" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    theirs = [json.loads(r) for r in (tmp_path / "verl_rollouts" / "1.jsonl").read_text().splitlines()]
    assert [(t["output"], t["score"], t["step"]) for t in theirs] == [(o["completion"], o["reward"], 1) for o in ours]

    out = tmp_path / "eval.json"
    proc = run_plugrl(
        [
            "eval",
            str(tmp_path / "e2e" / "checkpoints" / "step_000002"),
            "rollout.name=hf",
            "data.max_samples=5",
            # the tiny model uses SmolLM2's tokenizer: a `local:` name, resolved by the start-up shared with training
            "model.tokenizer_path=local:SmolLM2-135M-Instruct",
            "--n",
            "2",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert result["val/all/prompts"] == 5 and "val/countdown/pass@2" in result
    assert "val/countdown/accuracy" in proc.stdout


@pytest.mark.slow
def test_eval_with_the_vllm_engine(tiny_model, tmp_path):
    """`plugrl eval` through the real (in-process, CPU) vLLM engine: 2 prompts, 2 samples each."""
    out = tmp_path / "eval.json"
    proc = run_plugrl(
        [
            "eval",
            "examples/countdown_grpo.yaml",
            f"model.path={tiny_model}",
            "model.dtype=float32",
            "rollout.name=vllm",
            "rollout.cpu_kv_cache_gb=0.25",
            "data.max_samples=2",
            "data.max_response_length=16",
            "--n",
            "2",
            "--temperature",
            "1.0",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert result["val/all/prompts"] == 2
    for source in ("countdown", "all"):
        keys = [k.removeprefix(f"val/{source}/") for k in result if k.startswith(f"val/{source}/")]
        assert [k for k in keys if k.startswith("pass@")] == ["pass@1", "pass@2"]
        acc, p1, p2 = (result[f"val/{source}/{k}"] for k in ("accuracy", "pass@1", "pass@2"))
        assert acc == pytest.approx(p1) and 0.0 <= p1 <= p2 <= 1.0  # pass@1: the accuracy, n being the same
        assert 0.0 <= result[f"val/{source}/score_mean"] <= 1.0
        assert 1 <= result[f"val/{source}/response_length_mean"] <= 16  # a random model runs to the limit
    # the printed table holds the same keys and values (4 decimals)
    table = dict(line.rsplit(None, 1) for line in proc.stdout.splitlines() if line.startswith("val/"))
    assert set(table) == set(result)
    assert all(float(v) == pytest.approx(result[k], abs=1e-4) for k, v in table.items())
