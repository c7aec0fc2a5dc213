"""Experiment tracking: console progress, ``metrics.jsonl``, rollout dumps, and the loggers of installed packages
(entry-point group ``plugrl.loggers``: plugrl-loggers' wandb and TensorBoard).

One :class:`Tracker` per run. Every sink gets the same metric names (``reward/mean``,
``timing/step``, ...). Only rank 0 writes anything; on the other ranks every method
is a no-op, so the trainer can call them unconditionally.

Step numbers are the trainer's (verl counts them from 1; step ``s`` means "``s``
optimizer steps done"). ``start_step`` is the first step this session will log:
on resume, lines of ``metrics.jsonl`` with ``step >= start_step`` are dropped (and a
logger gets ``start_step``: TensorBoard purges its later events), so a resumed run has no
duplicate steps. A fresh run passes 0.

A logger of ``trainer.logger`` other than ``console`` and ``jsonl`` is a class of the group
``plugrl.loggers``: ``problem(environ)`` (why it cannot run here, or None: :func:`logger_problem` asks
every one before any model loads) and ``prepare()`` (imports its package, or an ImportError naming the pip
command), made on rank 0 with ``(run_dir, cfg_trainer, config_dict=, start_step=,
total_steps=)``, then ``log(step, values)`` (finite numbers, aliases included), ``log_samples(step, rows)``
(every ``table_freq`` steps and at the last) and ``close(summary)`` (None: no summary).

``trainer.metric_aliases`` (other than ``none``) names an entry of the group ``plugrl.metric_aliases``
(:func:`metric_names`: plugrl-compat's ``trl``, TRL's names): ``metrics.jsonl`` and the loggers get those names
beside plugrl's, the console and the summary only plugrl's.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from plugrl.plugin_errors import own_packages

METRICS_FILE = "metrics.jsonl"
ROLLOUTS_DIR = "rollouts"
LOGGERS_GROUP = "plugrl.loggers"
BUILTIN_LOGGERS = ("console", "jsonl")
LOGGERS_PACKAGE = own_packages("logger")  # plugrl's own, for the hint
ALIASES_GROUP = "plugrl.metric_aliases"  # trainer.metric_aliases names one of its entries

REWARD_KEY = "reward/mean"
STEP_TIME_KEY = "timing/step"
SKIPPED_STEP_KEY = "rollout/skipped_step"  # 1 in a step with no episode to train on (the trainer skips it)
SUMMARY_WINDOW = 10  # first-N vs last-N logged steps in the summary


class Timer:
    """Wall time per phase of a step, reported as ``timing/<phase>`` seconds."""

    def __init__(self):
        self.times: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.times[phase] += time.perf_counter() - start


# Shown live next to the progress bar when present.
LIVE_METRICS: tuple[tuple[str, str], ...] = (
    ("reward/mean", "reward"),
    ("response_length/mean", "resp_len"),
    ("perf/tokens_per_s", "tok/s"),
)
# The compact every-`log_freq`-steps line: these, when present, in this order.
LINE_METRICS: tuple[tuple[str, str], ...] = (
    ("reward/mean", "reward"),
    ("response_length/mean", "resp_len"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl_loss"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad_norm"),
    ("perf/tokens_per_s", "tok/s"),
    ("timing/step", "step_s"),
)
# Fields of a rollout row written first, in this order; the row's other fields follow.
SAMPLE_FIELDS = ("prompt", "completion", "data_source", "ground_truth", "reward")
MAX_TABLE_ROWS = 64


# --------------------------------------------------------------------------- helpers


def as_float(value: Any) -> float | None:
    """A metric value as a float (numbers, numpy/torch scalars); None when it is not numeric."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return float(item())
        except (TypeError, ValueError, RuntimeError):
            return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _json_safe(value: Any) -> Any:
    """``value`` with non-finite floats replaced by None (recursively) and scalars unwrapped."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        try:
            return _json_safe(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    tolist = getattr(value, "tolist", None)  # numpy / torch arrays
    if callable(tolist):
        return _json_safe(tolist())
    return str(value)


def dumps_json(obj: Any) -> str:
    return json.dumps(_json_safe(obj), ensure_ascii=False, allow_nan=False)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def truncate_metrics(path: Path, start_step: int) -> list[dict[str, Any]]:
    """Drop the lines of a ``metrics.jsonl`` with ``step >= start_step``; return the records kept.

    Lines that do not parse (a half-written last line after a crash) are dropped too.
    The file is rewritten atomically.
    """
    if not path.exists():
        return []
    kept: list[dict[str, Any]] = []
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), (int, float)):
            continue
        if rec["step"] >= start_step:
            continue
        kept.append(rec)
        lines.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)
    return kept


def summarize(
    history: Mapping[int, Mapping[str, float | None]],
    wall_time_s: float,
    window: int = SUMMARY_WINDOW,
    failures: Sequence[tuple[str, int]] = (),
) -> dict[str, Any]:
    """The end-of-run summary of a ``{step: metrics}`` history.

    - ``reward_first_mean`` / ``reward_last_mean``: mean ``reward/mean`` over the first and
      last ``reward_window`` logged steps (``window``, or half the steps for a run shorter
      than ``2 * window`` so the two never overlap); ``reward_delta`` and ``reward_improved``
      compare them.
    - ``best_step`` / ``best_reward``: the step with the highest ``reward/mean`` (the earliest on ties).
    - ``timing``: ``{name: {"mean_s", "share_pct"}}`` for every ``timing/*`` metric, the mean
      over the steps that logged it and its share of the mean ``timing/step`` (None without it).
    - ``failed_episodes`` and ``episode_failures``: the episodes that failed this session, in all and as
      ``[{"reason", "count"}]`` from ``failures`` (a reason's message, its count), the most frequent first;
      ``skipped_steps``: the logged steps with no episode to train on (``rollout/skipped_step``).
    """
    steps = sorted(history)
    rewards = [(s, history[s][REWARD_KEY]) for s in steps if history[s].get(REWARD_KEY) is not None]
    out: dict[str, Any] = {
        "steps_logged": len(steps),
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "reward_window": None,
        "reward_first_mean": None,
        "reward_last_mean": None,
        "reward_delta": None,
        "reward_improved": None,
        "best_step": None,
        "best_reward": None,
        "wall_time_s": wall_time_s,
        "timing": {},
        "failed_episodes": sum(count for _, count in failures),
        "episode_failures": [{"reason": reason, "count": count} for reason, count in failures],
        "skipped_steps": sum(1 for s in steps if history[s].get(SKIPPED_STEP_KEY)),
    }
    if rewards:
        values = [r for _, r in rewards]
        k = min(window, len(values) // 2) if len(values) >= 2 else 1
        first, last = _mean(values[:k]), _mean(values[-k:])
        best_step, best_reward = max(rewards, key=lambda sr: (sr[1], -sr[0]))
        out.update(
            reward_window=k,
            reward_first_mean=first,
            reward_last_mean=last,
            reward_delta=last - first,
            reward_improved=last > first,
            best_step=best_step,
            best_reward=best_reward,
        )
    timing_names = sorted({k for s in steps for k in history[s] if k.startswith("timing/")})
    means = {n: _mean([history[s][n] for s in steps if history[s].get(n) is not None]) for n in timing_names}
    step_time = means.get(STEP_TIME_KEY)
    for name in sorted(timing_names, key=lambda n: -(means[n] or 0.0)):
        m = means[name]
        share = 100.0 * m / step_time if m is not None and step_time else None
        out["timing"][name] = {"mean_s": m, "share_pct": share}
    return out


def summary_rows(summary: Mapping[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """The summary as display rows: ``(name, value)`` pairs and ``(timing name, mean, share)`` triples."""
    rows = [("steps logged", str(summary["steps_logged"]))]
    if summary["reward_window"] is not None:
        k = summary["reward_window"]
        verdict = "went up" if summary["reward_improved"] else "did not go up"
        rows += [
            (f"reward, first {k} steps", _fmt(summary["reward_first_mean"])),
            (f"reward, last {k} steps", _fmt(summary["reward_last_mean"])),
            ("reward change", f"{summary['reward_delta']:+.4g} ({verdict})"),
            ("best step", f"{summary['best_step']} (reward {_fmt(summary['best_reward'])})"),
        ]
    if summary.get("skipped_steps"):
        rows.append(("steps skipped (no episode to train on)", str(summary["skipped_steps"])))
    if summary.get("failed_episodes"):
        rows.append(("failed episodes, by reason", str(summary["failed_episodes"])))
        rows += [(f"  {f['count']}", f["reason"]) for f in summary["episode_failures"]]
    rows.append(("wall time", _fmt_duration(summary["wall_time_s"])))
    timing = [
        (name, f"{_fmt(t['mean_s'])}s", f"{t['share_pct']:.1f}%" if t["share_pct"] is not None else "-")
        for name, t in summary["timing"].items()
    ]
    return rows, timing


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary as plain text lines."""
    rows, timing = summary_rows(summary)
    width = max(len(name) for name, _ in rows)
    lines = ["run summary"] + [f"  {name:<{width}}  {value}" for name, value in rows]
    if timing:
        lines.append(f"  where the time went (mean per step, share of {STEP_TIME_KEY})")
        tw = max(len(t[0]) for t in timing)
        lines += [f"    {name:<{tw}}  {mean:>9}  {share:>6}" for name, mean, share in timing]
    return lines


# --------------------------------------------------------------------------- console


class _Console:
    """Progress bar on a terminal; plain lines otherwise (CI, output piped to a file)."""

    def __init__(self, total: int, start_step: int, log_freq: int) -> None:
        self.total = total
        self.log_freq = log_freq
        self.completed = min(total, max(0, start_step - 1))
        self.session_start_completed = self.completed
        self.t0 = time.monotonic()
        self.tty = bool(getattr(sys.stdout, "isatty", lambda: False)())
        self._rich = None
        if self.tty:
            self._start_bar()

    def _start_bar(self) -> None:
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
        except ImportError:  # rich is a dependency; without it, plain lines
            self.tty = False
            return
        self._rich = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[live]}"),
            console=Console(),
        )
        self._task = self._rich.add_task("train", total=self.total, completed=self.completed, live="")
        self._rich.start()

    def eta_s(self) -> float | None:
        done = self.completed - self.session_start_completed
        if done <= 0:
            return None
        return (time.monotonic() - self.t0) / done * max(0, self.total - self.completed)

    def update(self, step: int, metrics: Mapping[str, float | None]) -> None:
        self.completed = max(self.completed, min(self.total, step))
        live = "  ".join(f"{label} {_fmt(metrics[k])}" for k, label in LIVE_METRICS if metrics.get(k) is not None)
        if self._rich is not None:
            self._rich.update(self._task, completed=self.completed, live=live)
        if step % self.log_freq == 0 or step >= self.total:
            self.write(self.line(step, metrics))

    def line(self, step: int, metrics: Mapping[str, float | None]) -> str:
        parts = [f"{label} {_fmt(metrics[k])}" for k, label in LINE_METRICS if k in metrics]
        if not parts:  # e.g. a validation-only log call: show what there is
            parts = [f"{k} {_fmt(v)}" for k, v in sorted(metrics.items())[:6]]
        head = f"step {step}/{self.total}"
        tail = f"elapsed {_fmt_duration(time.monotonic() - self.t0)}"
        if self._rich is None:  # the bar shows the ETA itself
            tail += f" eta {_fmt_duration(self.eta_s())}"
        return " | ".join([head, *parts, tail])

    def write(self, text: str) -> None:
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def stop(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def print_summary(self, summary: Mapping[str, Any]) -> None:
        if self.tty:
            try:
                from rich.console import Console
                from rich.table import Table
            except ImportError:
                pass
            else:
                rows, timing = summary_rows(summary)
                table = Table(title="run summary", show_header=False)
                table.add_column(style="bold")
                table.add_column()
                table.add_column(justify="right")
                for name, value in rows:
                    table.add_row(name, value, "")
                if timing:
                    table.add_section()
                    table.add_row(f"where the time went (share of {STEP_TIME_KEY})", "", "")
                    for name, mean, share in timing:
                        table.add_row(f"  {name}", mean, share)
                Console().print(table)
                return
        for line in summary_lines(summary):
            print(line, flush=True)


# --------------------------------------------------------------------------- tracker


class Tracker:
    """Sends a run's metrics and samples to the loggers listed in ``trainer.logger``.

    ``cfg_trainer`` is the :class:`plugrl.config.TrainerConfig` (``logger``, ``log_freq``,
    ``table_freq``, ``project_name``, ``experiment_name``, ``save_rollouts``). ``config_dict`` is
    the run config for wandb, already redacted by the caller. ``table_freq``: log a wandb table of
    the samples every this many steps and at the last; default ``cfg_trainer.table_freq``, and
    when that is unset too, about ten tables per run.
    """

    def __init__(
        self,
        run_dir: Path,
        cfg_trainer: Any,
        total_steps: int,
        start_step: int = 0,
        config_dict: dict[str, Any] | None = None,
        rank: int = 0,
        *,
        table_freq: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.enabled = rank == 0
        self.total_steps = max(1, int(total_steps))
        self.start_step = int(start_step)
        self.loggers = list(getattr(cfg_trainer, "logger", ["console", "jsonl"]))
        self.log_freq = max(1, int(getattr(cfg_trainer, "log_freq", 1)))
        self.save_rollouts = bool(getattr(cfg_trainer, "save_rollouts", True))
        self.names: Any = None  # trainer.metric_aliases: other names of the metrics (metric_names), for the sinks
        # the keyword wins over trainer.table_freq, which the trainer sets through cfg_trainer
        self.table_freq = int(table_freq or getattr(cfg_trainer, "table_freq", None) or max(1, self.total_steps // 10))
        if self.table_freq < 1:
            raise ValueError(f"trainer.table_freq must be a number of steps >= 1, got {self.table_freq}")
        self.history: dict[int, dict[str, float | None]] = {}
        # (a reason's message, its count) of the episodes that failed, set by the trainer for the summary
        self.episode_failures: list[tuple[str, int]] = []
        self.t0 = time.monotonic()
        self._closed = False
        self._jsonl = None
        self._console: _Console | None = None
        self._sinks: list[Any] = []  # the loggers of installed packages that trainer.logger names
        if not self.enabled:
            return

        self.names = metric_names(getattr(cfg_trainer, "metric_aliases", "none"))
        problem = unknown_loggers(self.loggers)
        if problem:
            raise ValueError(problem)
        classes = installed_loggers()
        named = [classes[n] for n in dict.fromkeys(self.loggers) if n not in BUILTIN_LOGGERS]
        for cls in named:  # import each logger's package first, so a missing one fails before anything is written
            cls.prepare()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        metrics_path = self.run_dir / METRICS_FILE
        if metrics_path.exists():  # resume: keep the earlier steps, for the file and the summary
            for rec in truncate_metrics(metrics_path, self.start_step):
                step = int(rec["step"])
                vals = {k: as_float(v) for k, v in rec.items() if k != "step"}
                self.history.setdefault(step, {}).update(
                    {k: v for k, v in vals.items() if v is None or math.isfinite(v)}
                )
        if "jsonl" in self.loggers:
            self._jsonl = open(metrics_path, "a", encoding="utf-8")  # noqa: SIM115 - stays open for the run
        if "console" in self.loggers:
            self._console = _Console(self.total_steps, self.start_step, self.log_freq)
        kwargs = {"config_dict": config_dict, "start_step": self.start_step, "total_steps": self.total_steps}
        self._sinks = [cls(self.run_dir, cfg_trainer, **kwargs) for cls in named]

    # ------------------------------------------------------------------ API

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record one step's metrics in every enabled sink."""
        if not self.enabled or self._closed:
            return
        step = int(step)
        values: dict[str, float | None] = {}
        raw: dict[str, Any] = {}
        for k, v in metrics.items():
            f = as_float(v)
            if f is None and v is not None:
                raw[str(k)] = v  # not a number: jsonl only
            else:
                values[str(k)] = f
        # non-finite values are "missing": null in jsonl, left out of wandb/tensorboard and the summary
        finite = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
        self.history.setdefault(step, {}).update({k: finite.get(k) for k in values})
        # aliases go to the sinks only: the history, summary and console keep plugrl's names
        names = self.names
        aliases = names.aliases(values) if names else {}
        sunk = {**finite, **{names.logger_prefix + k: v for k, v in names.aliases(finite).items()}} if names else finite
        if self._jsonl is not None:
            self._jsonl.write(dumps_json({"step": step, **values, **aliases, **raw}) + "\n")
            self._jsonl.flush()
        for sink in self._sinks:
            sink.log(step, sunk)
        if self._console is not None:
            self._console.update(step, values)

    def log_samples(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        """Write a step's samples to ``rollouts/step_{step:06d}.jsonl`` (and a wandb table now and then).

        Each row is expected to hold ``prompt``, ``completion``, ``data_source``,
        ``ground_truth``, ``reward`` and the per-function reward details; they are written
        in that order, followed by any other fields of the row.
        """
        if not self.enabled or self._closed:
            return
        step = int(step)
        ordered = [
            {
                **{k: row[k] for k in SAMPLE_FIELDS if k in row},
                **{k: v for k, v in row.items() if k not in SAMPLE_FIELDS},
            }
            for row in rows
        ]
        if self.save_rollouts:
            out_dir = self.run_dir / ROLLOUTS_DIR
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"step_{step:06d}.jsonl"
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(dumps_json(r) + "\n" for r in ordered), encoding="utf-8")
            os.replace(tmp, path)
        if ordered and (step % self.table_freq == 0 or step >= self.total_steps):
            for sink in self._sinks:
                sink.log_samples(step, ordered)

    def close(self, summary: bool = True) -> dict[str, Any]:
        """Finish every sink; print the run summary when ``summary`` and return it as a dict.

        Safe to call twice (the second call only returns the summary again). On ranks
        other than 0 it returns an empty dict.
        """
        if not self.enabled:
            return {}
        result = summarize(self.history, wall_time_s=time.monotonic() - self.t0, failures=self.episode_failures)
        if self._closed:
            return result
        self._closed = True
        if self._console is not None:
            self._console.stop()
            if summary:
                self._console.print_summary(result)
        if self._jsonl is not None:
            self._jsonl.close()
        for sink in self._sinks:
            sink.close(result if summary else None)
        return result


# --------------------------------------------------------------------------- the loggers of installed packages


def installed_loggers() -> dict[str, type]:
    """Every logger class of the entry-point group ``plugrl.loggers``, by name. One that fails to import is left
    out (:func:`logger_problem` names it when ``trainer.logger`` asks for it)."""
    import importlib.metadata

    found: dict[str, type] = {}
    for ep in sorted(importlib.metadata.entry_points(group=LOGGERS_GROUP), key=lambda e: e.name):
        try:
            found[ep.name] = ep.load()
        except Exception:  # a broken logger package must not stop a run that does not use it
            continue
    return found


def unknown_loggers(loggers: Sequence[str]) -> str | None:
    known = installed_loggers()
    unknown = [n for n in dict.fromkeys(loggers) if n not in BUILTIN_LOGGERS and n not in known]
    if not unknown:
        return None
    packages = sorted({LOGGERS_PACKAGE[n] for n in unknown if n in LOGGERS_PACKAGE})
    hint = (
        f"; {', '.join(repr(n) for n in unknown if n in LOGGERS_PACKAGE)} is in the package {', '.join(packages)}, "
        f"which is not installed: pip install {' '.join(packages)} (in a plugrl checkout: pip install -e "
        "plugins/loggers)"
        if packages
        else ""
    )
    available = ", ".join([*BUILTIN_LOGGERS, *sorted(known)])
    return f"trainer.logger: unknown logger(s) {unknown}; use {available}{hint}"


def logger_problem(loggers: Sequence[str], environ: Mapping[str, str] | None = None) -> str | None:
    """What a logger of ``trainer.logger`` misses to run, in one line naming it and the fix; None when all can.
    Called before any model loads; only the process that logs checks (rank 0 of a launch: ``RANK``). A logger
    no installed package provides is named (with the package of plugrl's own that has it); each installed one
    answers its own ``problem(environ)`` (wandb: its package and a login or offline mode)."""
    environ = os.environ if environ is None else environ
    if int(environ.get("RANK", "0") or 0) != 0:
        return None
    problem = unknown_loggers(loggers)
    if problem:
        return problem
    classes = installed_loggers()
    for name in dict.fromkeys(n for n in loggers if n not in BUILTIN_LOGGERS):
        problem = classes[name].problem(environ)
        if problem:
            return problem
    return None


def metric_names(name: str) -> Any | None:
    """The other names ``trainer.metric_aliases`` asks for: what the entry point ``name`` of the group
    ``plugrl.metric_aliases`` gives (``aliases(metrics)``: other names with the same values, for ``metrics.jsonl``;
    ``logger_prefix``: put before each in the loggers of installed packages); None for ``none``; a ValueError
    when no installed package has them (the key is plugrl-compat's, which has ``trl``)."""
    import importlib.metadata

    if name == "none":
        return None
    found = [ep for ep in importlib.metadata.entry_points(group=ALIASES_GROUP) if ep.name == name]
    if found:
        return found[0].load()
    raise ValueError(f"the metric names {name!r} come with no installed package (entry-point group {ALIASES_GROUP})")
