"""Steps whose episodes fail (issue 41): an environment that rejects rows, prompts that exceed data.max_prompt_length
once the tools' descriptions are added. A step with no episode to train on is skipped and counted, never a crash
(it was an IndexError in the actor); trainer.max_bad_steps such steps in a row stop the run naming the reason; the
run summary counts the failures by reason; prompts too long with their tools are found at start.

The real trainer on a tiny random model with the HF engine, a local plugin for the environment, reward and tool."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from plugrl.episodes import FailureTally, failure_kind
from test_actor import _batch, _policy

PLUGIN = textwrap.dedent(
    '''
    import plugrl


    @plugrl.environment("picky")
    class Picky(plugrl.Environment):
        """Rejects the rows whose ground truth says so, at start(); the others get one turn."""

        def start(self, sample):
            if sample.ground_truth.startswith("reject"):
                raise ValueError(f"row {sample.ground_truth!r} is not for this environment")
            return plugrl.EnvStart()

        def step(self, turn):
            return plugrl.EnvStep(done=True)


    @plugrl.reward("fe")
    def length_score(completion, ground_truth):
        return (len(completion) % 7) / 7


    @plugrl.tool()
    def lookup(query: str) -> str:
        """Look a word up in the reference book. '''
    + "The book is long and this description says so at length. " * 12
    + '''

        Args:
            query: the word to look up
        """
        return query
    '''
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("fe")
    (root / "fe_plugin.py").write_text(PLUGIN)

    def data(name: str, truths: list[str]) -> str:
        rows = [
            {
                "prompt": [{"role": "user", "content": f"Say something about {w}."}],
                "data_source": "fe",
                "ground_truth": t,
            }
            for w, t in zip(("cats", "rain", "tea", "maps"), truths, strict=True)
        ]
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    files = {
        "all rejected": data("all", ["reject a", "reject b", "reject c", "reject d"]),
        "half rejected": data("half", ["reject a", "ok", "reject c", "ok"]),
        "none rejected": data("none", ["ok"] * 4),
    }
    (root / "base.yaml").write_text(f"model:\n  path: {tiny_model}\ndata:\n  train_files: [{files['none rejected']}]\n")
    sys.path.insert(0, str(root))
    yield files, tiny_model, root / "base.yaml"
    sys.path.remove(str(root))
    sys.modules.pop("fe_plugin", None)


def _train(setup, tmp_path, rows: str, *extra: str) -> int:
    from plugrl import cli

    files, model, base = setup
    overrides = [
        "plugins=['fe_plugin:',advantages]",
        f"model.path={model}",
        "model.dtype=float32",
        f"data.train_files=[{files[rows]}]",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.shuffle=false",
        "rollout.name=hf",
        "rollout.n=2",
        "rollout.max_turns=1",
        "environment=picky",
        "trainer.total_steps=2",
        "trainer.save_freq=0",
        f"trainer.output_dir={tmp_path}",
        "trainer.experiment_name=fe",
        "trainer.logger=[console,jsonl]",
        "actor.optim.lr=1e-3",
        *extra,
    ]
    return cli.main(["train", str(base), *overrides])


def _metrics(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "fe" / "metrics.jsonl").read_text().splitlines()]


def test_a_batch_without_response_tokens_runs_in_the_actor(tiny_model):
    """The actor's empty-batch guard: log-probs of sequences that hold no response token (it was IndexError:
    an empty position list became a float tensor), and an update over them changes no weight."""
    policy = _policy(tiny_model)
    empty = _batch([[1, 2, 3], [4, 5]], [3, 2])
    assert torch.equal(policy.compute_logprobs(empty, 1.0, 1024), torch.zeros(2, 1))
    empty.advantages = torch.ones_like(empty.response_mask)
    before = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
    out = policy.update(empty, num_mini_batches=1, temperature=1.0, norm_length=16)
    assert out["actor/optimizer_steps"] == 0 and out["actor/skipped_updates"] == 0
    assert all(torch.equal(before[k], v) for k, v in policy.model.named_parameters())
    mixed = _batch([[1, 2, 3], [4, 5, 6, 7]], [3, 2])  # one sequence without a response token, one with two
    logprobs = policy.compute_logprobs(mixed, 1.0, 1024)
    assert logprobs[0].eq(0).all() and logprobs[1].lt(0).all()


def test_failure_reasons_count_together_without_their_numbers():
    tally = FailureTally()
    counted, new = tally.add(
        ["start failed: row 3 too long (812 tokens)", "start failed: row 7 too long (90 tokens)"], 4
    )
    assert len(new) == 1 and counted[new[0]] == 2 and tally.first_step[new[0]] == 4
    tally.add(["step failed at turn 2: KeyError: 'x'", "step failed at turn 1: KeyError: 'yz'"], 5)
    assert tally.by_reason() == [
        ("start failed: row 3 too long (812 tokens)", 2),
        ("step failed at turn 2: KeyError: 'x'", 2),
    ]
    assert failure_kind("a" * 1000) == "a" * 300


def test_steps_whose_every_episode_fails_are_skipped_then_stop_the_run(setup, tmp_path, capsys, caplog):
    """Every row rejected at start(): each step is skipped (no update, weights as loaded), counted, the reason said
    once; trainer.max_bad_steps=2 such steps in a row stop the run (exit 3) naming the reason, with a checkpoint
    and the summary."""
    caplog.set_level(logging.WARNING, logger="plugrl")
    code = _train(setup, tmp_path, "all rejected", "trainer.total_steps=4", "trainer.max_bad_steps=2")
    out, err = capsys.readouterr()
    assert code == 3, err[-3000:]
    stop = next(x for x in err.splitlines() if x.startswith("plugrl: training stopped:"))
    assert "2 steps in a row had no episode to train on (every episode failed at its start)" in stop
    assert (
        "(trainer.max_bad_steps=2); most often: environment 'picky' (plugin fe_plugin:): start failed: ValueError:"
        in stop
    )
    assert "(8 episodes)" in stop and "resume with the same command" in stop
    logged = _metrics(tmp_path)
    assert [m["step"] for m in logged] == [1, 2]
    assert [m["rollout/failed_episodes"] for m in logged] == [4.0, 4.0]
    assert [m["rollout/skipped_step"] for m in logged] == [1.0, 1.0]
    assert all("actor/pg_loss" not in m and m["env/errors"] == 1.0 for m in logged)
    # the reason said once, the skips twice; every episode in the rollouts with its error
    said = [r.getMessage() for r in caplog.records if "start failed: ValueError" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("step 1: 4 episodes failed: environment 'picky'"), said
    skips = [r.getMessage() for r in caplog.records if "skipped: none of its" in r.getMessage()]
    assert skips == [f"step {s} skipped: none of its 4 episodes has a token to train on (4 failed, 4 for the "
                     "reason said at step 1)" for s in (1, 2)]  # fmt: skip
    rows = [json.loads(x) for x in (tmp_path / "fe" / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["finish"] == "error" and "start failed" in r["env_error"] for r in rows)
    # nothing was trained: the checkpoint the stop wrote holds the weights as loaded
    model = setup[1]
    start, saved = (
        load_file(model / "model.safetensors"),
        load_file(tmp_path / "fe/checkpoints/step_000002/policy/model.safetensors"),
    )
    assert all(torch.equal(saved[k], start[k].to(saved[k].dtype)) for k in saved if k in start)
    assert "failed episodes, by reason" in out and "steps skipped (no episode to train on)" in out


def test_half_the_episodes_failing_trains_on_the_rest_and_the_summary_counts_them(setup, tmp_path, capsys):
    code = _train(setup, tmp_path, "half rejected")
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    logged = _metrics(tmp_path)
    assert [m["rollout/failed_episodes"] for m in logged] == [2.0, 2.0]
    assert all(m["actor/optimizer_steps"] >= 1 and "rollout/skipped_step" not in m for m in logged)
    lines = out.splitlines()
    at = next(i for i, x in enumerate(lines) if "failed episodes, by reason" in x)
    assert lines[at].split()[-1] == "4"
    assert lines[at + 1].split()[0] == "4" and "environment 'picky' (plugin fe_plugin:): start failed" in lines[at + 1]
    assert "steps skipped" not in out


def test_prompts_too_long_with_their_tools_descriptions_are_found_at_start(setup, tmp_path, capsys, monkeypatch):
    """Each prompt fits data.max_prompt_length=64 on its own; with the tool's description it does not: the run
    stops before any model loads, naming the row, the length and the fix (every episode failed at its start)."""
    from plugrl import trainer

    loaded = []
    monkeypatch.setattr(trainer, "PolicyModel", lambda *a, **k: loaded.append(1))
    assert _train(setup, tmp_path, "none rejected", "rollout.tools=[lookup]") == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("plugrl: error:"))
    assert "none.jsonl" in line and "tokens with the descriptions of its tools (lookup), more than " in line
    assert "data.max_prompt_length=64: each of its episodes would fail at its start" in line
    assert "Raise data.max_prompt_length to at least " in line and loaded == []


def test_with_filter_overlong_prompts_such_episodes_fail_alone_and_the_run_stops_naming_why(setup, tmp_path, capsys):
    """The issue's second case: the prompts pass the data check, every episode then fails at its start because
    its prompt with the tool's description is over the limit (it was an IndexError): skipped, then stopped."""
    code = _train(
        setup, tmp_path, "none rejected", "rollout.tools=[lookup]", "data.filter_overlong_prompts=true",
        "trainer.max_bad_steps=2",
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 3, err[-3000:]
    stop = next(x for x in err.splitlines() if x.startswith("plugrl: training stopped:"))
    assert "2 steps in a row had no episode to train on" in stop
    assert "start failed: ValueError: the episode's first prompt is" in stop
    assert "more than data.max_prompt_length=64; raise data.max_prompt_length" in stop


@pytest.mark.slow
def test_two_ranks_one_without_an_episode_to_train_on_then_both(setup, tmp_path):
    """torchrun, 2 gloo ranks (FSDP2), 4 prompts a step split 2 + 2. Step 1: rank 0's prompts are all rejected,
    rank 1's are not: the step trains, rank 0 joining the forward and backward over no position (it was an
    IndexError there). Step 2: every prompt rejected: both ranks skip it together."""
    files, model, base = setup
    rows = [("cats", "reject a"), ("rain", "reject b"), ("tea", "ok"), ("maps", "ok")] + [("x", "reject c")] * 4
    data = tmp_path / "split.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Say something about {w}."}],
                                        "data_source": "fe", "ground_truth": t}) + "\n" for w, t in rows))  # fmt: skip
    root = base.parent
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "plugrl.cli",
        "train", str(base), "plugins=['fe_plugin:',advantages]", f"model.path={model}", "model.dtype=float32",
        f"data.train_files=[{data}]", "data.train_batch_size=4", "data.shuffle=false", "data.max_prompt_length=64",
        "data.max_response_length=16", "rollout.name=hf", "rollout.n=2", "rollout.max_turns=1", "environment=picky",
        "trainer.total_steps=2", "trainer.save_freq=0", f"trainer.output_dir={tmp_path}", "trainer.experiment_name=fe",
        "trainer.logger=[console,jsonl]",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    first, second = _metrics(tmp_path)
    assert first["rollout/failed_episodes"] == 4.0 and first["actor/optimizer_steps"] == 1.0
    assert "rollout/skipped_step" not in first
    assert second["rollout/failed_episodes"] == 8.0 and second["rollout/skipped_step"] == 1.0
    assert "actor/optimizer_steps" not in second
    assert re.search(r"steps skipped \(no episode to train on\)\s+1\n", proc.stdout), proc.stdout[-3000:]
