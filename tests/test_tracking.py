"""Tests for plugrl.tracking: metrics.jsonl, rollouts, console output, summary, wandb, tensorboard."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest

from plugrl.config import TrainerConfig
from plugrl.tracking import Tracker, summarize


def _strict_json(line: str):
    """json.loads that fails on NaN/Infinity, which are not JSON."""

    def bad(const):
        raise AssertionError(f"non-JSON constant {const} in {line!r}")

    return json.loads(line, parse_constant=bad)


def _read_metrics(run_dir):
    return [_strict_json(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _cfg(**kw):
    kw.setdefault("logger", ["jsonl"])
    return TrainerConfig(**kw)


# --------------------------------------------------------------------------- jsonl


def test_jsonl_one_line_per_step_flushed_while_running(tmp_path):
    t = Tracker(tmp_path / "run", _cfg(), total_steps=3)
    t.log(1, {"reward/mean": 0.5, "actor/pg_loss": -0.25})
    # readable while the run is still going
    assert _read_metrics(tmp_path / "run") == [{"step": 1, "reward/mean": 0.5, "actor/pg_loss": -0.25}]
    t.log(2, {"reward/mean": 0.75, "timing/step": 3})
    t.close()
    assert _read_metrics(tmp_path / "run") == [
        {"step": 1, "reward/mean": 0.5, "actor/pg_loss": -0.25},
        {"step": 2, "reward/mean": 0.75, "timing/step": 3.0},
    ]


def test_jsonl_non_finite_written_as_null(tmp_path):
    t = Tracker(tmp_path, _cfg(), total_steps=1)
    t.log(1, {"a": float("nan"), "b": float("inf"), "c": float("-inf"), "d": 1.5})
    summary = t.close()
    assert _read_metrics(tmp_path) == [{"step": 1, "a": None, "b": None, "c": None, "d": 1.5}]
    assert summary["steps_logged"] == 1


def test_resume_drops_steps_from_start_step(tmp_path):
    t = Tracker(tmp_path, _cfg(), total_steps=10)
    for s in range(1, 6):
        t.log(s, {"reward/mean": s / 10})
    t.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "reward/me')  # a crash mid-write

    t = Tracker(tmp_path, _cfg(), total_steps=10, start_step=4)
    assert [r["step"] for r in _read_metrics(tmp_path)] == [1, 2, 3]
    for s in range(4, 8):
        t.log(s, {"reward/mean": s})
    summary = t.close()
    rows = _read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    assert [r["reward/mean"] for r in rows] == [0.1, 0.2, 0.3, 4.0, 5.0, 6.0, 7.0]
    # the summary covers the whole run, the kept steps included
    assert summary["steps_logged"] == 7
    assert summary["first_step"] == 1
    assert summary["best_step"] == 7


def test_fresh_run_in_used_dir_starts_a_new_file(tmp_path):
    t = Tracker(tmp_path, _cfg(), total_steps=2)
    t.log(1, {"x": 1})
    t.close()
    t = Tracker(tmp_path, _cfg(), total_steps=2)  # start_step=0
    t.log(1, {"x": 2})
    t.close()
    assert _read_metrics(tmp_path) == [{"step": 1, "x": 2.0}]


def test_numpy_and_torch_scalars_are_accepted(tmp_path):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    t = Tracker(tmp_path, _cfg(), total_steps=1)
    t.log(1, {"a": np.float32(0.5), "b": torch.tensor(2.0), "c": np.int64(3), "d": torch.tensor(float("nan"))})
    t.close()
    assert _read_metrics(tmp_path) == [{"step": 1, "a": 0.5, "b": 2.0, "c": 3.0, "d": None}]


def test_other_ranks_write_nothing(tmp_path):
    run = tmp_path / "run"
    t = Tracker(run, _cfg(logger=["console", "jsonl"]), total_steps=2, rank=1)
    t.log(1, {"reward/mean": 1.0})
    t.log_samples(1, [{"prompt": "p", "completion": "c", "reward": 1.0}])
    assert t.close() == {}
    assert not run.exists()


def test_unknown_logger_rejected(tmp_path):
    cfg = _cfg()
    object.__setattr__(cfg, "logger", ["jsonl", "mlflow"])  # bypass validation, as a plain object would
    with pytest.raises(ValueError, match="mlflow"):
        Tracker(tmp_path, cfg, total_steps=1)


# --------------------------------------------------------------------------- rollouts


def test_log_samples_writes_rollout_file(tmp_path):
    t = Tracker(tmp_path, _cfg(), total_steps=10)
    rows = [
        {
            "reward": 1.0,
            "completion": "<answer>3</answer>",
            "prompt": [{"role": "user", "content": "1+2?"}],
            "ground_truth": "3",
            "data_source": "arith",
            "reward_details": {"format": 1.0, "correct": float("nan")},
        },
        {"prompt": "p", "completion": "c", "data_source": "arith", "ground_truth": "4", "reward": 0.0},
    ]
    t.log_samples(7, rows)
    t.close()
    lines = (tmp_path / "rollouts" / "step_000007.jsonl").read_text().splitlines()
    first = _strict_json(lines[0])
    assert list(first) == ["prompt", "completion", "data_source", "ground_truth", "reward", "reward_details"]
    assert first["reward_details"] == {"format": 1.0, "correct": None}
    assert first["prompt"] == [{"role": "user", "content": "1+2?"}]
    assert _strict_json(lines[1])["ground_truth"] == "4"


def test_log_samples_respects_save_rollouts(tmp_path):
    t = Tracker(tmp_path, _cfg(save_rollouts=False), total_steps=1)
    t.log_samples(1, [{"prompt": "p", "completion": "c", "reward": 1.0}])
    t.close()
    assert not (tmp_path / "rollouts").exists()


# --------------------------------------------------------------------------- summary


def _series_history():
    """30 steps; rewards chosen so the summary can be checked by hand."""
    history = {}
    for s in range(1, 31):
        if s <= 10:
            r = 0.4 if s == 3 else 0.1  # first 10: (9 * 0.1 + 0.4) / 10 = 0.13
        elif s <= 20:
            r = 0.9 if s == 15 else 0.5  # best: step 15, 0.9
        else:
            r = 0.3  # last 10: 0.3
        m = {"reward/mean": r, "timing/step": 2.0, "timing/gen": 1.0 if s % 2 else 2.0}  # gen mean 1.5
        if s % 2 == 0:
            m["timing/update"] = 0.4  # logged on half the steps: mean over those, 0.4
        history[s] = m
    return history


def test_summary_numbers_by_hand():
    out = summarize(_series_history(), wall_time_s=12.5)
    assert out["steps_logged"] == 30
    assert out["reward_window"] == 10
    assert out["reward_first_mean"] == pytest.approx(0.13)
    assert out["reward_last_mean"] == pytest.approx(0.3)
    assert out["reward_delta"] == pytest.approx(0.17)
    assert out["reward_improved"] is True
    assert (out["best_step"], out["best_reward"]) == (15, 0.9)
    assert out["wall_time_s"] == 12.5
    timing = out["timing"]
    assert list(timing) == ["timing/step", "timing/gen", "timing/update"]  # biggest first
    assert timing["timing/step"] == {"mean_s": 2.0, "share_pct": 100.0}
    assert timing["timing/gen"]["mean_s"] == pytest.approx(1.5)
    assert timing["timing/gen"]["share_pct"] == pytest.approx(75.0)
    assert timing["timing/update"]["mean_s"] == pytest.approx(0.4)
    assert timing["timing/update"]["share_pct"] == pytest.approx(20.0)


def test_summary_reward_going_down_and_short_runs():
    down = {s: {"reward/mean": 1.0 - s / 100} for s in range(1, 25)}
    out = summarize(down, wall_time_s=1.0)
    # first 10: 1 - 5.5/100; last 10 (steps 15..24): 1 - 19.5/100
    assert out["reward_first_mean"] == pytest.approx(0.945)
    assert out["reward_last_mean"] == pytest.approx(0.805)
    assert out["reward_improved"] is False
    assert out["best_step"] == 1

    # fewer than 20 steps: the two windows are the halves, so they never overlap
    short = {1: {"reward/mean": 0.0}, 2: {"reward/mean": 1.0}, 3: {"reward/mean": 2.0}, 4: {"reward/mean": 4.0}}
    out = summarize(short, wall_time_s=1.0)
    assert out["reward_window"] == 2
    assert (out["reward_first_mean"], out["reward_last_mean"]) == (0.5, 3.0)

    empty = summarize({}, wall_time_s=0.0)
    assert empty["steps_logged"] == 0 and empty["reward_window"] is None and empty["timing"] == {}
    no_step_time = summarize({1: {"timing/gen": 1.0}}, wall_time_s=0.0)
    assert no_step_time["timing"]["timing/gen"] == {"mean_s": 1.0, "share_pct": None}


def test_close_returns_summary_and_ignores_non_finite_rewards(tmp_path):
    t = Tracker(tmp_path, _cfg(), total_steps=30)
    for s, m in _series_history().items():
        t.log(s, m)
    t.log(31, {"reward/mean": float("nan")})
    out = t.close()
    assert out["reward_first_mean"] == pytest.approx(0.13)
    assert out["reward_last_mean"] == pytest.approx(0.3)
    assert out["best_step"] == 15
    assert out["wall_time_s"] > 0
    assert t.close()["best_step"] == 15  # closing twice is harmless


# --------------------------------------------------------------------------- console


def test_console_plain_lines_when_not_a_tty(tmp_path, capsys):
    t = Tracker(tmp_path, _cfg(logger=["console"], log_freq=2), total_steps=5)
    for s in range(1, 6):
        t.log(
            s,
            {
                "perf/tokens_per_s": 12345.678,
                "response_length/mean": 100 + s,
                "reward/mean": 0.123456 * s,
                "timing/step": 2.0,
                "timing/gen": 1.5,
                "misc/ignored": 7.0,
            },
        )
    out = capsys.readouterr().out
    assert "\r" not in out and "\x1b[" not in out  # no redrawing, no escape codes
    lines = out.splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["step 2/5", "step 4/5", "step 5/5"]
    fields = lines[0].split(" | ")
    assert fields[1:5] == ["reward 0.2469", "resp_len 102", "tok/s 1.235e+04", "step_s 2"]
    assert fields[-1].startswith("elapsed ") and " eta " in fields[-1]
    assert "misc/ignored" not in out
    assert not (tmp_path / "metrics.jsonl").exists()  # jsonl not requested

    summary = t.close()
    out = capsys.readouterr().out
    assert "run summary" in out
    assert "reward, first 2 steps" in out and "reward, last 2 steps" in out
    assert "(went up)" in out
    assert f"best step              5 (reward {0.123456 * 5:.4g})" in out
    assert "where the time went" in out
    gen = next(line for line in out.splitlines() if "timing/gen" in line)
    assert "1.5s" in gen and "75.0%" in gen
    assert summary["best_step"] == 5


def test_console_summary_can_be_skipped(tmp_path, capsys):
    t = Tracker(tmp_path, _cfg(logger=["console"], log_freq=100), total_steps=50)
    t.log(1, {"reward/mean": 1.0})
    assert capsys.readouterr().out == ""  # step 1 is not a multiple of log_freq, nor the last step
    out = t.close(summary=False)
    assert capsys.readouterr().out == ""
    assert out["best_step"] == 1


# --------------------------------------------------------------------------- optional loggers


def test_missing_wandb_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
    with pytest.raises(ImportError, match="pip install wandb"):
        Tracker(tmp_path / "run", _cfg(logger=["jsonl", "wandb"]), total_steps=1)
    assert not (tmp_path / "run").exists()  # failed before writing anything


def test_missing_tensorboard_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        Tracker(tmp_path / "run", _cfg(logger=["tensorboard"]), total_steps=1)


@pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None, reason="wandb is not installed (pip install wandb to run this test)"
)
def test_wandb_offline_run(tmp_path, monkeypatch):
    for var, sub in (("WANDB_DIR", "wandb_dir"), ("WANDB_CONFIG_DIR", "wandb_config"), ("WANDB_CACHE_DIR", "cache")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    # trainer.table_freq comes with the trainer section, as the trainer hands it over
    cfg = _cfg(logger=["jsonl", "wandb"], project_name="plugrl-test", experiment_name="offline", table_freq=2)
    t = Tracker(run_dir, cfg, total_steps=5, config_dict={"model": {"path": "tiny"}})
    run_id = (run_dir / "wandb_id").read_text().strip()
    assert run_id
    row = {"prompt": "p", "completion": "c", "data_source": "d", "ground_truth": "g", "reward": 1.0}
    for step in (1, 2, 3):
        t.log(step, {"reward/mean": 0.25 * step, "timing/step": 1.0, "actor/pg_loss": float("nan")})
        t.log_samples(step, [row])
    t.close()

    runs = [p for p in run_dir.rglob(f"offline-run-*-{run_id}") if p.is_dir()]
    assert runs, f"no offline wandb run under {run_dir}: {sorted(str(p) for p in run_dir.rglob('*'))[:20]}"
    assert (runs[0] / f"run-{run_id}.wandb").is_file()
    # one completions table, at step 2 (table_freq 2; step 3 is not the last of 5; the default would log
    # one per step). Counted, not read from the file names: wandb numbers those by its own step counter.
    tables = list(runs[0].rglob("samples_*.table.json"))
    assert len(tables) == 1, sorted(str(p.relative_to(runs[0])) for p in runs[0].rglob("*"))
    # everything wandb wrote stayed under tmp_path
    assert all(str(p).startswith(str(tmp_path)) for p in runs)

    # a resumed run reuses the stored id
    t = Tracker(run_dir, cfg, total_steps=5, start_step=4)
    assert (run_dir / "wandb_id").read_text().strip() == run_id
    t.log(4, {"reward/mean": 1.0})
    t.close()
    assert [r["step"] for r in _read_metrics(run_dir)] == [1, 2, 3, 4]


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None or importlib.util.find_spec("torch") is None,
    reason="tensorboard (and torch) not installed (pip install tensorboard to run this test)",
)
def test_tensorboard_event_file(tmp_path):
    t = Tracker(tmp_path, _cfg(logger=["tensorboard"]), total_steps=2)
    t.log(1, {"reward/mean": 0.5, "timing/step": 1.0})
    t.log(2, {"reward/mean": 0.75, "timing/step": float("inf")})
    t.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events, "no tensorboard event file"

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"reward/mean", "timing/step"} <= set(acc.Tags()["scalars"])
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 0.5), (2, 0.75)]
    assert [e.step for e in acc.Scalars("timing/step")] == [1]  # non-finite values are skipped
    assert not math.isnan(acc.Scalars("timing/step")[0].value)


# --------------------------------------------------------------------------- console on a terminal, wandb tables


def test_console_progress_bar_on_a_terminal(tmp_path, monkeypatch, capsys):
    """On a terminal: a live bar with step, ETA, reward, response length and tokens/s; the summary as a table."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    t = Tracker(tmp_path, _cfg(logger=["console"], log_freq=2), total_steps=4)
    bar = t._console._rich
    assert bar is not None, "no progress bar on a terminal"
    for s in (1, 2):
        live = {"reward/mean": 0.25 * s, "response_length/mean": 30.0, "perf/tokens_per_s": 1000.0}
        t.log(s, {**live, "timing/step": 1.0})
    task = bar.tasks[0]
    assert task.completed == 2 and task.total == 4
    assert task.fields["live"] == "reward 0.5  resp_len 30  tok/s 1000"
    assert t._console.eta_s() is not None  # the bar's TimeRemainingColumn shows it
    t.close()
    out = capsys.readouterr().out
    assert "step 2/4 | reward 0.5" in out  # the compact line every log_freq steps, above the bar
    assert "run summary" in out and "where the time went" in out and "best step" in out


class _FakeWandb:
    """Records what the tracker sends to wandb."""

    def __init__(self):
        self.logged: list[tuple[int, dict]] = []
        outer = self

        class Run:
            summary: dict = {}

            def log(self, data, step):
                outer.logged.append((step, data))

            def finish(self):
                pass

        class Table:
            def __init__(self, columns, data):
                self.columns, self.data = columns, data

        self.Run, self.Table = Run, Table

    def init(self, **kw):
        return self.Run()

    def Settings(self, **kw):  # noqa: N802 (wandb's name)
        return kw


def test_wandb_gets_the_jsonl_names_and_a_completions_table_every_n_steps(tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    t = Tracker(tmp_path, _cfg(logger=["jsonl", "wandb"]), total_steps=5, table_freq=2)
    row = {"prompt": "p", "completion": "c", "data_source": "d", "ground_truth": "g", "reward": 1.0, "len": 3}
    for s in range(1, 6):
        t.log(s, {"reward/mean": 0.1 * s, "timing/step": 1.0})
        t.log_samples(s, [row])
    t.close()
    scalars = [(s, d) for s, d in fake.logged if "samples" not in d]
    assert [set(d) for _, d in scalars] == [set(r) - {"step"} for r in _read_metrics(tmp_path)]
    tables = [(s, d["samples"]) for s, d in fake.logged if "samples" in d]
    assert [s for s, _ in tables] == [2, 4, 5]  # every table_freq steps, and the last
    table = tables[0][1]
    assert table.columns == ["step", "prompt", "completion", "data_source", "ground_truth", "reward", "details"]
    assert table.data == [[2, "p", "c", "d", "g", 1.0, '{"len": 3}']]


def test_trainer_table_freq_from_the_config_reaches_the_tracker(tmp_path, monkeypatch):
    """`trainer.table_freq` (YAML key or override) sets how often the tracker sends a completions table."""
    from plugrl.config import ConfigError, build_config

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    base = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}, "trainer": {"logger": ["jsonl", "wandb"]}}
    cfg = build_config(base, ["trainer.table_freq=2"])
    assert cfg.trainer.table_freq == 2
    t = Tracker(tmp_path / "run", cfg.trainer, total_steps=5)  # as the trainer builds it: the trainer section
    assert t.table_freq == 2
    for s in range(1, 6):
        t.log_samples(s, [{"prompt": "p", "completion": "c", "reward": 1.0}])
    t.close()
    assert [s for s, d in fake.logged if "samples" in d] == [2, 4, 5]  # every 2 steps, and the last

    # unset: about ten tables per run; an explicit keyword still wins over the config
    default = build_config(base, []).trainer
    assert default.table_freq is None
    for name, trainer_cfg, total, keyword, expected in (
        ("a", default, 30, None, 3),
        ("b", default, 3, None, 1),
        ("c", cfg.trainer, 30, 7, 7),
    ):
        t = Tracker(tmp_path / name, trainer_cfg, total_steps=total, table_freq=keyword)
        assert t.table_freq == expected, name
        t.close(summary=False)

    for bad in ("0", "-1", "often"):
        with pytest.raises(ConfigError, match="trainer.table_freq"):
            build_config(base, [f"trainer.table_freq={bad}"])
