"""trainer.off_policy_steps: rollouts generated ahead of training, on a thread of their own.

The unit tests drive plugrl-off-policy's :class:`plugrl_off_policy.RolloutsAhead` (and the kernel's on-policy
:class:`plugrl.rollouts_ahead.OnPolicy`) with a generation function that records what it saw; the training tests run the
real trainer (tiny random Llama, HF engine, float32) in this process. The kernel finds the package through the
entry-point group plugrl.off_policy; without it a config that sets trainer.off_policy_steps (its key) is refused.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from moved_names import hint_of
from plugrl import rollouts_ahead as kernel_side
from plugrl_off_policy import RolloutsAhead
from test_e2e import metrics, tiny_overrides


class _Recorder:
    """A generation function: returns (step, thread name, the engine's version when it ran)."""

    def __init__(self, delay: float = 0.0, fail_at: int | None = None):
        self.ahead: kernel_side.Rollouts | None = None
        self.delay, self.fail_at = delay, fail_at
        self.calls: list[tuple[int, str, int]] = []

    def __call__(self, step: int):
        time.sleep(self.delay)
        if step == self.fail_at:
            raise ValueError(f"reward server down at step {step}")
        call = (step, threading.current_thread().name, self.ahead.version)
        self.calls.append(call)
        return call


def _loop(ahead: kernel_side.Rollouts, steps: int, start: int = 0, stop: int | None = None) -> list:
    """The trainer's protocol for a run of ``steps`` steps, from ``start`` until before ``stop``: take, schedule
    step + k (never past the last step), train, settle, new weights."""
    taken = []
    for step in range(start, steps if stop is None else stop):
        got = ahead.take(step)
        ahead.schedule(min(step + ahead.steps_ahead, steps - 1))
        taken.append((got.step, got.result, got.version))
        ahead.settle()
        ahead.weights_changed(step + 1)
    return taken


@pytest.mark.parametrize("make", [kernel_side.OnPolicy, lambda gen: RolloutsAhead(gen, 0)], ids=["kernel", "package"])
def test_on_policy_generates_each_step_on_the_main_thread_with_its_own_weights(make):
    gen = _Recorder()
    gen.ahead = ahead = make(gen)
    taken = _loop(ahead, 3)
    main = threading.current_thread().name
    assert [t[1] for t in taken] == [(s, main, s) for s in range(3)]
    assert [s - v for s, _, v in taken] == [0, 0, 0]
    assert ahead.steps_ahead == 0 and getattr(ahead, "_thread", None) is None  # no thread when k = 0
    assert ahead.pending() == [] and ahead.settle() < 0.1


@pytest.mark.parametrize("k", [1, 2])
def test_step_t_trains_on_rollouts_sampled_with_the_weights_of_step_t_minus_k(k):
    gen = _Recorder(delay=0.01)
    gen.ahead = ahead = RolloutsAhead(gen, k)
    taken = _loop(ahead, 6)
    ahead.close()
    assert [t[0] for t in taken] == list(range(6))
    # the first step generates on the calling thread, every later one on the rollout thread, ahead of its step
    assert taken[0][1][1] == threading.current_thread().name
    assert {t[1][1] for t in taken[1:]} == {"plugrl-rollouts-ahead"}
    # weights of step t - k (the first k steps: the starting weights), as the engine held them when it ran
    assert [t[2] for t in taken] == [max(0, s - k) for s in range(6)]
    assert [t[1][2] for t in taken] == [t[2] for t in taken]
    # generated once each, in order, none past the last step
    assert [c[0] for c in gen.calls] == list(range(6))


def test_a_generation_error_reaches_the_main_thread_in_take_or_settle():
    gen = _Recorder(fail_at=2)
    gen.ahead = ahead = RolloutsAhead(gen, 1)
    with pytest.raises(ValueError, match="reward server down at step 2"):
        _loop(ahead, 4)  # step 2 is generated while step 1 trains: settle() at step 1's end raises it


def test_rollouts_generated_ahead_survive_a_checkpoint_and_resume_exactly():
    """pending() after settle() is what a checkpoint keeps; a new RolloutsAhead restored from it continues as
    the uninterrupted one did: the same results for every step, none generated twice."""
    gen = _Recorder()
    gen.ahead = ahead = RolloutsAhead(gen, 2)
    uninterrupted = _loop(ahead, 6)
    gen2 = _Recorder()
    gen2.ahead = first = RolloutsAhead(gen2, 2)
    part = _loop(first, 6, stop=3)
    kept = first.pending()
    assert [g.step for g in kept] == [3, 4]  # generated while steps 1 and 2 trained
    gen3 = _Recorder()
    gen3.ahead = resumed = RolloutsAhead(gen3, 2)
    resumed.restore(kept)
    resumed.weights_changed(3)
    rest = _loop(resumed, 6, start=3)
    assert part + rest == uninterrupted
    assert [c[0] for c in gen3.calls] == [5]  # 3 and 4 came from the checkpoint


def test_an_off_policy_checkpoint_resumed_on_policy_takes_its_rollouts_first():
    """trainer.off_policy_steps may change on resume: k = 0 (the kernel's OnPolicy, no package needed) takes the
    steps the checkpoint holds (the data is past their batches) and generates the rest."""
    gen = _Recorder()
    gen.ahead = first = RolloutsAhead(gen, 2)
    _loop(first, 6, stop=3)
    kept = first.pending()
    gen2 = _Recorder()
    gen2.ahead = resumed = kernel_side.OnPolicy(gen2)
    resumed.restore(kept)
    assert resumed.pending() == kept
    resumed.weights_changed(3)
    rest = _loop(resumed, 6, start=3)
    assert [(s, r, v) for s, r, v in rest] == [(g.step, g.result, g.version) for g in kept] + [(5, gen2.calls[0], 5)]
    assert [c[0] for c in gen2.calls] == [5]


def test_the_kit_is_plugrl_off_policy_and_has_what_the_kernel_calls():
    import plugrl_off_policy

    assert kernel_side.kit(1) is plugrl_off_policy
    ahead = plugrl_off_policy.RolloutsAhead(lambda step: step, 1)
    for name in [n for n in vars(kernel_side.Rollouts) if not n.startswith("_")]:
        assert callable(getattr(ahead, name)), name
    assert ahead.steps_ahead == 1 and plugrl_off_policy.Generated is kernel_side.Generated
    assert callable(plugrl_off_policy.check)  # the start-up check (OffPolicyKit.check)


def test_the_start_up_check_moved_to_the_package():
    assert hint_of("from plugrl.startup import check_off_policy") == (
        "; plugrl.startup.check_off_policy moved in plugin API 2: import plugrl_off_policy.check "
        "(package plugrl-off-policy)"
    )


def test_an_off_policy_run_without_the_package_is_refused(hide_entry_points, without_config_fields):
    """trainer.off_policy_steps is plugrl-off-policy's key: without the package a config that sets it is refused,
    naming the key and how to install the package; an on-policy config does not need it. The kernel's seam names
    the key too (what the trainer asks, where nothing checked before)."""
    from plugrl.config import ConfigError, build_config

    hide_entry_points(kernel_side.GROUP)
    without_config_fields("plugrl-off-policy")
    base = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}
    hint = "pip install plugrl-off-policy (in a plugrl checkout: pip install -e plugins/off_policy)"
    with pytest.raises(ConfigError) as err:
        build_config(dict(base), ["trainer.off_policy_steps=2"])
    assert str(err.value).splitlines()[1:] == [
        f"  trainer.off_policy_steps is a key of the package plugrl-off-policy, which is not installed: {hint}"
    ]
    missing = (
        r"^trainer\.off_policy_steps=2: generating rollouts ahead of training is in the package plugrl-off-policy, "
        r"which is not installed: pip install plugrl-off-policy \(in a plugrl checkout: pip install -e "
        r"plugins/off_policy\); or set trainer\.off_policy_steps=0$"
    )
    with pytest.raises(kernel_side.NoOffPolicy, match=missing):
        kernel_side.kit(2)
    assert "off_policy_steps" not in type(build_config(dict(base)).trainer).model_fields


def test_pending_while_a_generation_runs_is_refused():
    gate = threading.Event()
    ahead = RolloutsAhead(lambda step: gate.wait(5), 1)
    ahead.take(0)
    ahead.schedule(1)
    try:
        with pytest.raises(RuntimeError, match="settle"):
            ahead.pending()
    finally:
        gate.set()
    ahead.settle()
    assert [g.step for g in ahead.pending()] == [1]


# --------------------------------------------------------------------------- the trainer


def _train(tmp_path, model, name: str, overrides: list[str]):
    from plugrl.config import load_config
    from plugrl.trainer import train

    (tmp_path / "base.yaml").write_text(f"model:\n  path: {model}\n")
    defaults = [
        "data.dataset=countdown",
        "data.template=countdown",
        "plugins=[countdown,advantages]",
        "model.dtype=float32",
        "rollout.name=hf",
        "rollout.n=4",
        "data.train_batch_size=2",
        "data.max_response_length=16",
        "actor.optim.lr=1e-3",  # large: the policy of one step differs measurably from the last
        "actor.entropy_coeff=0.01",
        f"trainer.output_dir={tmp_path}",
        f"trainer.experiment_name={name}",
        "trainer.logger=[jsonl]",
    ]
    train(load_config(tmp_path / "base.yaml", [*defaults, *overrides]))
    run = tmp_path / name
    return run, [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_an_off_policy_run_trains_on_stale_rollouts_and_weighs_them(tiny_model, tmp_path):
    """k = 1: step 1 trains on its own rollouts, every later one on rollouts of the previous step's weights.
    The engine's log-probs then differ from the trainer's (rollout_corr/kl well above the float noise of step 1),
    the truncated-IS correction is on without being asked for, and the rollouts were generated on the rollout
    thread while the previous step trained."""
    run, m = _train(tmp_path, tiny_model, "k1", ["trainer.total_steps=4", "trainer.off_policy_steps=1"])
    assert [x["rollout/policy_lag"] for x in m] == [0.0, 1.0, 1.0, 1.0]
    assert all(x["timing/wait_rollouts"] >= 0 for x in m)
    on_policy_gap, stale_gaps = (
        m[0]["rollout_corr/logp_abs_diff_mean"],
        [x["rollout_corr/logp_abs_diff_mean"] for x in m[1:]],
    )
    assert on_policy_gap < 1e-4, on_policy_gap  # the same weights, float32: the HF engine matches the trainer
    assert min(stale_gaps) > 100 * max(on_policy_gap, 1e-6), (on_policy_gap, stale_gaps)
    saved = (run / "config.yaml").read_text()
    assert "mode: truncate" in saved and "free_cache_engine: false" in saved


@pytest.mark.slow
def test_a_resumed_off_policy_run_continues_exactly(tiny_model, tmp_path):
    """A 4-step k = 1 run checkpointed every step; a second run is cut back to its step-2 checkpoint (later ones
    and their log lines removed, as a SIGKILL after step 2 would leave it) and resumed: it takes step 3's rollouts
    from the checkpoint (generated with step 1's weights), and steps 3 and 4 log the same metrics and end with
    bitwise the same weights as the uninterrupted run."""
    import shutil

    from safetensors.torch import load_file

    common = ["trainer.total_steps=4", "trainer.off_policy_steps=1", "trainer.save_freq=1", "trainer.max_checkpoints=4"]
    ref_run, reference = _train(tmp_path, tiny_model, "reference", common)
    run, _ = _train(tmp_path, tiny_model, "cut", common)
    ckpts = run / "checkpoints"
    assert (ckpts / "step_000002" / "rollouts_ahead" / "rank_0.pt").is_file()
    for step in (3, 4):
        shutil.rmtree(ckpts / f"step_{step:06d}")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    _, resumed = _train(tmp_path, tiny_model, "cut", common)

    def comparable(ms):
        return [{k: v for k, v in x.items() if not k.startswith(("timing/", "perf/", "reward/time_s"))} for x in ms]

    assert [x["step"] for x in resumed] == [1, 2, 3, 4]
    assert comparable(resumed) == comparable(reference)
    final = load_file(ckpts / "step_000004" / "policy" / "model.safetensors")
    expected = load_file(ref_run / "checkpoints" / "step_000004" / "policy" / "model.safetensors")
    assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in final)


def test_off_policy_refuses_what_cannot_run_beside_a_generation(tiny_model, tmp_path):
    from plugrl.config import ConfigError, load_config
    from plugrl.startup import check_run

    (tmp_path / "c.yaml").write_text(f"model:\n  path: {tiny_model}\ndata:\n  dataset: countdown\n")
    with pytest.raises(ValueError, match="rollout.free_cache_engine=true"):
        load_config(tmp_path / "c.yaml", ["trainer.off_policy_steps=1", "rollout.free_cache_engine=true"])
    cfg = load_config(tmp_path / "c.yaml", ["trainer.off_policy_steps=1", "algorithm.rollout_correction.mode=off"])
    assert cfg.algorithm.rollout_correction.mode == "off" and not cfg.rollout.free_cache_engine  # explicit: kept
    for overrides, match in (
        (["algorithm.adv_estimator=remax"], "greedy baseline"),
        (["actor.tp_size=2"], "actor.tp_size=2"),
    ):
        cfg = load_config(
            tmp_path / "c.yaml", ["trainer.off_policy_steps=2", "plugins=[countdown,advantages]", *overrides]
        )
        with pytest.raises(ConfigError, match=match) as e:
            check_run(cfg, training=True)
        assert "trainer.off_policy_steps=2" in str(e.value)


@pytest.mark.slow
def test_two_ranks_generate_ahead_with_dapo_refills_and_checkpoint_their_shares(tiny_model, tmp_path):
    """torchrun, 2 processes (gloo), vLLM, k = 1 with DAPO's dynamic sampling: its refill vote is a collective
    that the rollout thread runs on a group of its own, beside the training's FSDP2 collectives. Each rank's
    rollouts generated ahead go into the checkpoint; a resume with another number of processes is refused."""
    import subprocess

    from test_e2e import ROOT, run_plugrl
    from test_fsdp import TORCHRUN

    args = [
        "train",
        "examples/countdown_grpo.yaml",
        *tiny_overrides(tiny_model, tmp_path, 3),
        "rollout.name=vllm",
        "rollout.cpu_kv_cache_gb=0.25",
        "trainer.off_policy_steps=1",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=2",
    ]
    proc = subprocess.run([*TORCHRUN, "-m", "plugrl.cli", *args], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lines = metrics(tmp_path / "e2e")
    assert [m["rollout/policy_lag"] for m in lines] == [0.0, 1.0, 1.0]
    assert all(1 <= m["dapo/gen_rounds"] <= 2 for m in lines)
    ahead = tmp_path / "e2e" / "checkpoints" / "step_000002" / "rollouts_ahead"
    assert sorted(p.name for p in ahead.iterdir()) == ["rank_0.pt", "rank_1.pt"]
    # the last step generates nothing ahead: its checkpoint holds none
    assert not (tmp_path / "e2e" / "checkpoints" / "step_000003" / "rollouts_ahead").exists()
    import shutil

    shutil.rmtree(tmp_path / "e2e" / "checkpoints" / "step_000003")
    args[args.index("trainer.total_steps=3")] = "trainer.total_steps=4"
    with pytest.raises(AssertionError, match="by 2 ranks, but this run has 1"):
        run_plugrl(args)


@pytest.mark.slow
def test_a_sigkilled_off_policy_run_resumes_exactly(tiny_model, tmp_path):
    """k = 1, a checkpoint every step: the job is SIGKILLed at a random moment after its second checkpoint
    (mid-step, with the next step's rollouts in flight), then run again: it resumes from its newest checkpoint
    and ends with the metrics and bitwise the weights of an uninterrupted run."""
    import random
    import signal
    import subprocess

    from safetensors.torch import load_file

    from plugrl import checkpoint
    from test_e2e import PLUGRL, ROOT, run_plugrl

    steps = 6
    base = [
        "train",
        "examples/countdown_grpo.yaml",
        *tiny_overrides(tiny_model, tmp_path, steps),
        "trainer.save_freq=1",
        "trainer.off_policy_steps=1",
    ]
    run_plugrl([*base, "trainer.experiment_name=reference"])
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        [*PLUGRL, *base, "trainer.experiment_name=killed"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline and len(checkpoint.list_checkpoints(run_dir)) < 2:
        time.sleep(0.01)
    time.sleep(random.Random(7).uniform(0.0, 1.0))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = checkpoint.latest_checkpoint(run_dir)
    assert done is not None and int(done.name.removeprefix("step_")) < steps, "the kill came too late"
    resumed = run_plugrl([*base, "trainer.experiment_name=killed"])
    assert f"resumed from {done}" in resumed.stderr

    def comparable(d):
        return [
            {k: v for k, v in m.items() if not k.startswith(("timing/", "perf/", "reward/time_s"))} for m in metrics(d)
        ]

    assert comparable(run_dir) == comparable(tmp_path / "reference")
    name = f"step_{steps:06d}"
    final = load_file(run_dir / "checkpoints" / name / "policy" / "model.safetensors")
    expected = load_file(tmp_path / "reference" / "checkpoints" / name / "policy" / "model.safetensors")
    assert all(torch.equal(final[k], expected[k]) for k in expected)
