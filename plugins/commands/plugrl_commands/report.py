"""``plugrl report``: a dashboard PNG and a self-contained HTML page for one or more run directories.

A run directory (``trainer.output_dir/trainer.experiment_name``) holds ``metrics.jsonl``
(one JSON object per step), ``rollouts/step_NNNNNN.jsonl`` (that step's samples) and
``config.yaml``. :func:`write_report` reads them and writes, into ``out`` (default: the
first run's directory):

- ``report.png``: one panel per quantity over steps (reward per reward function and
  ``reward/mean``, response length, KL, entropy, clip fraction, grad norm, tokens/s) and a
  summary of each run. With several runs, each panel has one line per run (same colour
  everywhere, legend = the run directory's name); the line style tells a panel's metrics apart.
- ``report.html``: the PNG embedded as base64 and, per run, for a few chosen steps (default
  the first, middle and last step with a rollouts file) the best and the worst completions
  with their reward, data_source, ground truth and reward details. Everything read from the
  run is HTML-escaped, and a Content-Security-Policy forbids scripts, so model output is
  shown as text and never interpreted as HTML.

The run may still be training: lines of ``metrics.jsonl`` that do not parse (a half-written
last line) are skipped and counted, and rollouts files are replaced atomically by the trainer.
Plots are drawn with matplotlib's Agg canvas, without pyplot, so no display and no global
backend state are involved.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from plugrl.tracking import METRICS_FILE, REWARD_KEY, ROLLOUTS_DIR, SUMMARY_WINDOW, summarize

PNG_NAME = "report.png"
HTML_NAME = "report.html"
CONFIG_FILE = "config.yaml"
DEFAULT_EXAMPLES = 2  # best and worst completions shown per chosen step
MAX_COMPLETION_CHARS = 6000  # longer texts are cut in the HTML (the rollouts file has them whole)
MAX_PROMPT_CHARS = 6000

_ROLLOUT_RE = re.compile(r"^step_(\d+)\.jsonl$")
_REWARD_FN_RE = re.compile(r"^reward/(.+)/mean$")
_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


class ReportError(RuntimeError):
    """A run directory cannot be reported on; the message names the path."""


# --------------------------------------------------------------------------- reading a run


@dataclass
class Run:
    """What the report knows about one run directory."""

    path: Path
    label: str
    history: dict[int, dict[str, float]]  # step -> metric -> value (NaN when logged as null)
    bad_lines: int = 0  # lines of metrics.jsonl that did not parse, other than a half-written last one
    partial_last_line: bool = False  # the last line was cut off (the run is writing it, or it crashed)
    config: dict[str, Any] = field(default_factory=dict)
    rollout_files: dict[int, Path] = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        return sorted(self.history)

    def series(self, key: str) -> tuple[list[int], list[float]] | None:
        """``(steps, values)`` of one metric, or None when no step logged a finite value of it."""
        steps = [s for s in self.steps if key in self.history[s]]
        values = [self.history[s][key] for s in steps]
        if not any(math.isfinite(v) for v in values):
            return None
        return steps, values

    def keys(self) -> set[str]:
        return {k for rec in self.history.values() for k in rec}

    @property
    def total_steps(self) -> int | None:
        trainer = self.config.get("trainer") if isinstance(self.config, Mapping) else None
        value = trainer.get("total_steps") if isinstance(trainer, Mapping) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A metric value as a float (NaN for null / non-finite); None when it is not numeric at all."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else math.nan
    return None


def read_metrics(path: Path) -> tuple[dict[int, dict[str, float]], int, bool]:
    """Parse a ``metrics.jsonl``: ``(history, bad_lines, partial_last_line)``.

    Lines that are not a JSON object with a numeric ``step`` are skipped: the last one
    (when the file does not end with a newline) is counted as ``partial_last_line``, the
    others as ``bad_lines``. A step logged twice keeps its later values. Non-numeric
    values are left out.
    """
    if not path.is_file():
        raise ReportError(
            f"{path}: no such file; a plugrl run directory (trainer.output_dir/trainer.experiment_name) "
            f"holds {METRICS_FILE}, written from the first training step on"
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e})") from e
    lines = data.split(b"\n")
    history: dict[int, dict[str, float]] = {}
    bad, partial = 0, False
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        is_last_unterminated = i == len(lines) - 1  # split leaves "" last when the file ends with "\n"
        try:
            rec = json.loads(raw.decode("utf-8"))
            step = rec["step"] if isinstance(rec, dict) else None
            if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
                raise ValueError("no numeric step")
        except (ValueError, UnicodeDecodeError):
            if is_last_unterminated:
                partial = True
            else:
                bad += 1
            continue
        values = history.setdefault(int(step), {})
        for key, value in rec.items():
            number = _number(value)
            if key != "step" and number is not None:
                values[str(key)] = number
    return history, bad, partial


def rollout_files(run_dir: Path) -> dict[int, Path]:
    """``{step: path}`` of the run's ``rollouts/step_NNNNNN.jsonl`` files (temp files ignored)."""
    folder = run_dir / ROLLOUTS_DIR
    if not folder.is_dir():
        return {}
    found = {}
    for p in folder.iterdir():
        m = _ROLLOUT_RE.match(p.name)
        if m and p.is_file():
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def read_rollouts(path: Path) -> list[dict[str, Any]]:
    """The rows of one rollouts file; lines that do not parse are skipped."""
    rows = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        import yaml

        loaded = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except Exception:  # a report must not fail on a damaged config
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _labels(paths: Sequence[Path]) -> list[str]:
    """Run labels: the directory names, with as many parent names as it takes to tell them apart."""
    for depth in range(1, 1 + max(len(p.parts) for p in paths)):
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


def load_runs(run_dirs: Sequence[str | os.PathLike[str]]) -> list[Run]:
    """Read every run directory (the same directory named twice is read once)."""
    if not run_dirs:
        raise ReportError("no run directory given")
    paths: list[Path] = []
    for d in run_dirs:
        p = Path(d)
        if not p.is_dir():
            raise ReportError(f"{p}: no such directory (expected a run directory holding {METRICS_FILE})")
        if p.resolve() not in [q.resolve() for q in paths]:
            paths.append(p)
    labels = _labels([p.resolve() for p in paths])
    runs = []
    for p, label in zip(paths, labels, strict=True):
        history, bad, partial = read_metrics(p / METRICS_FILE)
        runs.append(Run(p, label, history, bad, partial, _read_config(p), rollout_files(p)))
    return runs


# --------------------------------------------------------------------------- the dashboard


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    keys: tuple[str, ...]
    nonnegative: bool = False  # start the y axis at 0


def reward_keys(runs: Iterable[Run]) -> tuple[str, ...]:
    """``reward/mean`` first, then ``reward/<function>/mean`` of every reward function logged."""
    fns = sorted({k for run in runs for k in run.keys() if _REWARD_FN_RE.match(k) and k != REWARD_KEY})
    return (REWARD_KEY, *fns)


def panels(runs: Sequence[Run]) -> list[Panel]:
    keys = {k for run in runs for k in run.keys()}
    episodes = []  # multi-turn runs: turns and tool calls per episode, and what the environments report
    if "env/turns_mean" in keys:
        episodes.append(
            Panel("Episodes", "per episode (mean)", ("env/turns_mean", "env/tool_calls", "env/tool_errors"), True)
        )
    info = tuple(sorted(k for k in keys if k.startswith("env/info/")))
    if info:
        episodes.append(Panel("Environment info", "mean over episodes", info))
    return [
        Panel("Reward", "mean reward per sample", reward_keys(runs)),
        Panel("Response length", "tokens (mean over samples)", ("response_length/mean",)),
        Panel("KL", "KL (mean per token)", ("actor/kl_loss", "actor/reward_kl_penalty")),
        Panel("Entropy", "nats per token", ("actor/entropy",)),
        Panel("Clip fraction", "fraction of tokens clipped", ("actor/pg_clipfrac",), nonnegative=True),
        Panel("Grad norm", "L2 norm before clipping", ("actor/grad_norm",)),
        Panel("Throughput", "tokens / s (prompt + response)", ("perf/tokens_per_s",)),
        *episodes,
    ]


def smoothing_window(runs: Sequence[Run]) -> int:
    """Trailing moving-average window for the plots: 1 (none) below 40 steps, then 1/20 of the steps."""
    longest = max((len(r.history) for r in runs), default=0)
    return max(1, longest // 20)


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` finite values at each point (NaN stays NaN)."""
    out = []
    for i, v in enumerate(values):
        if not math.isfinite(v):
            out.append(math.nan)
            continue
        recent = [x for x in values[max(0, i - window + 1) : i + 1] if math.isfinite(x)]
        out.append(sum(recent) / len(recent))
    return out


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}"


def run_summary(run: Run) -> list[str]:
    """A few plain-text lines about a run: steps, reward trend, the last step."""
    steps = run.steps
    if not steps:
        return ["no steps logged yet"]
    total = run.total_steps
    of_total = f" of {total} configured" if total else ""
    lines = [f"steps: {len(steps)} logged ({steps[0]}-{steps[-1]}){of_total}"]
    history = {s: {k: (v if math.isfinite(v) else None) for k, v in rec.items()} for s, rec in run.history.items()}
    summary = summarize(history, wall_time_s=math.nan, window=SUMMARY_WINDOW)
    if summary["reward_window"] is not None:
        k = summary["reward_window"]
        lines.append(
            f"reward/mean: {_fmt(summary['reward_first_mean'])} (first {k}) -> "
            f"{_fmt(summary['reward_last_mean'])} (last {k}), best {_fmt(summary['best_reward'])} "
            f"at step {summary['best_step']}"
        )
    last = run.history[steps[-1]]
    parts = [f"reward {_fmt(last.get(REWARD_KEY))}"]
    if "response_length/mean" in last:
        parts.append(f"length {_fmt(last['response_length/mean'])}")
    if "timing/step" in last:
        parts.append(f"{_fmt(last['timing/step'])} s/step")
    if "perf/tokens_per_s" in last:
        parts.append(f"{_fmt(last['perf/tokens_per_s'])} tok/s")
    lines.append(f"step {steps[-1]}: " + ", ".join(parts))
    shares = [
        f"{name.removeprefix('timing/')} {t['share_pct']:.0f}%"
        for name, t in summary["timing"].items()
        if name != "timing/step" and t["share_pct"] is not None
    ]
    if shares:
        lines.append("time per step: " + ", ".join(shares[:4]))
    if run.partial_last_line or run.bad_lines:
        skipped = []
        if run.partial_last_line:
            skipped.append("a half-written last line (still running?)")
        if run.bad_lines:
            skipped.append(f"{run.bad_lines} unreadable line(s)")
        lines.append("skipped in metrics.jsonl: " + ", ".join(skipped))
    return lines


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3) :]


def render_png(runs: Sequence[Run], path: Path) -> Path:
    """Draw the dashboard into ``path`` (PNG)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    window = smoothing_window(runs)
    multi = len(runs) > 1
    color_of = {id(r): _COLORS[i % len(_COLORS)] for i, r in enumerate(runs)}
    panel_list = panels(runs)

    # run names and metric keys are data: no mathtext ($...$) in any label
    with matplotlib.rc_context({"text.parse_math": False, "font.size": 10, "axes.titlesize": 12}):
        rows = (len(panel_list) + 1 + 1) // 2  # the panels and the summary, two per row
        fig = Figure(figsize=(14, 4.0 * rows + 1.2), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, 2).ravel()
        for ax, panel in zip(axes, panel_list, strict=False):
            _draw_panel(ax, panel, runs, multi, color_of, window)
        _draw_summary(axes[len(panel_list)], runs, color_of)
        for ax in axes[len(panel_list) + 1 :]:
            ax.set_visible(False)

        names = ", ".join(r.label for r in runs)
        title = f"plugrl report: {_short(names, 110)}"
        last_steps = [r.steps[-1] for r in runs if r.steps]
        smooth = (
            f"solid lines: trailing mean over {window} steps, faint: per-step values"
            if window > 1
            else "per-step values"
        )
        sub = (
            f"{len(runs)} run{'s' if multi else ''}, "
            + (f"up to step {max(last_steps)}" if last_steps else "no steps logged yet")
            + f"; {smooth}; generated {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}"
        )
        fig.suptitle(f"{title}\n{sub}", fontsize=13)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def _draw_panel(ax: Any, panel: Panel, runs: Sequence[Run], multi: bool, color_of: dict, window: int) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    ax.set_title(panel.title, fontweight="bold")
    drawn_keys: list[str] = []
    missing_runs = []
    for run in runs:
        drew = False
        for i, key in enumerate(panel.keys):
            s = run.series(key)
            if s is None:
                continue
            drew = True
            if key not in drawn_keys:
                drawn_keys.append(key)
            steps, values = s
            color = color_of[id(run)] if multi else _COLORS[i % len(_COLORS)]
            style = _LINESTYLES[i % len(_LINESTYLES)]
            marker = "o" if len(steps) <= 30 else None
            label = key if not multi else None
            if window > 1:
                ax.plot(steps, values, color=color, lw=0.8, alpha=0.3, linestyle="-")
                smooth = moving_average(values, window)
                ax.plot(steps, smooth, color=color, lw=1.8, linestyle=style, label=label, zorder=3)
            else:
                lw = 2.0 if i == 0 else 1.5
                ax.plot(steps, values, color=color, lw=lw, linestyle=style, marker=marker, ms=3, label=label, zorder=3)
        if not drew:
            missing_runs.append(run.label)
    if not drawn_keys:
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ax.spines.values():
            side.set_color("0.8")
        ax.text(0.5, 0.55, "not logged", ha="center", va="center", fontsize=15, color="0.45", transform=ax.transAxes)
        ax.text(
            0.5, 0.38, ", ".join(panel.keys), ha="center", va="center", fontsize=9, color="0.55", transform=ax.transAxes
        )
        return
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    if panel.nonnegative:  # from 0 (a hair below, so a line at 0 is not hidden by the axis)
        top = ax.get_ylim()[1]
        ax.set_ylim(-0.02 * top, top)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    if multi:  # colour = run, line style = metric
        handles = [Line2D([], [], color=color_of[id(r)], lw=2.5) for r in runs if r.label not in missing_runs]
        labels = [_short(r.label, 40) for r in runs if r.label not in missing_runs]
        if len(drawn_keys) > 1:
            styles = [_LINESTYLES[panel.keys.index(k) % len(_LINESTYLES)] for k in drawn_keys]
            handles += [Line2D([], [], color="0.3", lw=1.8, linestyle=st) for st in styles]
            labels += drawn_keys
        ax.legend(handles, labels, fontsize=8, loc="best")
    else:
        ax.legend(fontsize=8, loc="best")
    if multi and missing_runs:
        ax.text(
            0.01,
            0.02,
            _short("not logged by: " + ", ".join(missing_runs), 80),
            fontsize=8,
            color="0.45",
            transform=ax.transAxes,
        )


def _text_line(ax: Any, text: str, x: float, y: float, **style: Any) -> None:
    """One line of text at (x, y) points from the top-left corner of ``ax``."""
    ax.annotate(text, (0, 1), xycoords="axes fraction", xytext=(x, y), textcoords="offset points", va="top", **style)


def _draw_summary(ax: Any, runs: Sequence[Run], color_of: dict) -> None:
    ax.axis("off")
    ax.set_title("Runs", fontweight="bold")
    y = 0.0  # offset from the top, in points
    for i, run in enumerate(runs):
        if y < -250:
            _text_line(ax, f"... and {len(runs) - i} more run(s)", 0, y, fontsize=9)
            break
        _text_line(ax, _short(run.label, 70), 0, y, fontsize=10, fontweight="bold", color=color_of[id(run)])
        y -= 15
        for line in run_summary(run):
            _text_line(ax, _short(line, 95), 8, y, fontsize=9, family="monospace")
            y -= 13
        y -= 8


# --------------------------------------------------------------------------- choosing steps and samples


def parse_steps(spec: str | None) -> list[str | int] | None:
    """``"1,10,last"`` -> ``[1, 10, "last"]``; words allowed: first, middle (mid), last."""
    if spec is None or not spec.strip():
        return None
    out: list[str | int] = []
    for part in spec.split(","):
        word = part.strip().lower()
        if not word:
            continue
        if word in ("first", "middle", "mid", "last"):
            out.append("middle" if word == "mid" else word)
            continue
        try:
            n = int(word)
        except ValueError:
            raise ReportError(
                f"--steps: {part.strip()!r} is not a step; use step numbers and first/middle/last, e.g. 1,10,last"
            ) from None
        if n < 0:
            raise ReportError(f"--steps: step {n} is negative")
        out.append(n)
    return out or None


def choose_steps(available: Sequence[int], wanted: Sequence[str | int] | None) -> list[tuple[int, str]]:
    """The rollout steps to show: ``[(step, note)]``; the note explains a substitution.

    Default: the first, middle and last step that has a rollouts file. A requested step
    without one is replaced by the nearest step that has one (and says so).
    """
    avail = sorted(available)
    if not avail:
        return []
    wanted = list(wanted) if wanted else ["first", "middle", "last"]
    chosen: list[tuple[int, str]] = []
    for w in wanted:
        if w == "first":
            step, note = avail[0], ""
        elif w == "middle":
            step, note = avail[(len(avail) - 1) // 2], ""
        elif w == "last":
            step, note = avail[-1], ""
        else:
            step = min(avail, key=lambda s: (abs(s - int(w)), s))
            note = "" if step == w else f"step {w} has no rollouts file; showing the nearest, step {step}"
        if step not in [s for s, _ in chosen]:
            chosen.append((step, note))
    return chosen


def reward_of(row: Mapping[str, Any]) -> float | None:
    value = row.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def best_and_worst(rows: Sequence[Mapping[str, Any]], k: int) -> tuple[list[Mapping], list[Mapping]]:
    """The ``k`` highest-reward rows (best first) and the ``k`` lowest of the others (worst first).

    Rows without a numeric reward rank below every scored row. Ties keep file order. A row
    is never in both lists, so a step with fewer than ``2 * k`` rows shows each row once.
    """

    def rank(item: tuple[int, Mapping]) -> float:
        r = reward_of(item[1])
        return -math.inf if r is None else r

    indexed = list(enumerate(rows))
    best = sorted(indexed, key=lambda it: (-rank(it), it[0]))[:k]
    taken = {i for i, _ in best}
    rest = [it for it in indexed if it[0] not in taken]
    worst = sorted(rest, key=lambda it: (rank(it), it[0]))[:k]
    return [r for _, r in best], [r for _, r in worst]


# --------------------------------------------------------------------------- the HTML page

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1500px; padding: 16px 24px; color: #222; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 4px; margin-top: 36px; }
h3 { margin: 22px 0 6px; } h4 { margin: 6px 0; }
.meta { color: #666; font-size: 13px; }
img.dash { width: 100%; max-width: 1400px; border: 1px solid #ddd; }
table.kv { border-collapse: collapse; font-size: 13px; } table.kv td { padding: 2px 12px 2px 0;
       vertical-align: top; } table.kv td:first-child { color: #666; white-space: nowrap; }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.sample { border: 1px solid #ddd; border-radius: 6px; padding: 8px 10px; margin: 8px 0; background: #fafafa; }
.sample.best { border-left: 5px solid #2ca02c; } .sample.worst { border-left: 5px solid #d62728; }
.reward { font-weight: bold; font-size: 15px; }
pre { white-space: pre-wrap; word-break: break-word; background: #fff; border: 1px solid #eee;
      padding: 6px; margin: 4px 0; max-height: 420px; overflow: auto; font-size: 12.5px; }
.note { color: #8a5a00; font-size: 13px; } .dim { color: #777; font-size: 12px; }
summary { cursor: pointer; color: #555; font-size: 13px; }
"""


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _e(value: Any) -> str:
    """HTML-escaped text of any value (JSON for non-strings): what a page may show of run data."""
    return html.escape(value if isinstance(value, str) else _json(value), quote=True)


def _cut(text: str, limit: int) -> tuple[str, str]:
    if len(text) <= limit:
        return text, ""
    return text[:limit], f"... ({len(text) - limit} more characters in the rollouts file)"


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, Mapping) for m in value):  # chat messages
        return "\n\n".join(f"[{m.get('role', '?')}]\n{m.get('content', '')}" for m in value)
    return json.dumps(value, ensure_ascii=False, indent=1)


def _prompt_messages(row: Mapping[str, Any]) -> int:
    """How many of a conversation's messages came before the first assistant reply (the prompt's)."""
    roles = [m.get("role") if isinstance(m, Mapping) else None for m in row["messages"]]
    return roles.index("assistant") if "assistant" in roles else 0


def _sample_html(row: Mapping[str, Any], kind: str) -> str:
    reward = reward_of(row)
    reward_text = _fmt(reward, 4) if reward is not None else _e(row.get("reward", "-"))
    # a multi-turn episode shows its whole conversation after the prompt's messages
    said = row["messages"][_prompt_messages(row) :] if isinstance(row.get("messages"), list) else None
    completion, more = _cut(_text_of(said if said else row.get("completion", "")), MAX_COMPLETION_CHARS)
    prompt, more_p = _cut(_text_of(row.get("prompt", "")), MAX_PROMPT_CHARS)
    kv = [
        ("data_source", row.get("data_source", "-")),
        ("ground truth", row.get("ground_truth", "-")),
        ("finish_reason", row.get("finish_reason", "-")),
    ]
    details = row.get("details")
    if isinstance(details, Mapping) and details:
        kv.append(("details", ", ".join(f"{k}={v if isinstance(v, str) else _json(v)}" for k, v in details.items())))
    shown = {"prompt", "completion", "reward", "details", "data_source", "ground_truth", "finish_reason"}
    shown |= {"messages", "segments"}  # the conversation is shown as the completion
    extra = {k: v for k, v in row.items() if k not in shown}
    if extra:
        kv.append(("other fields", extra))
    rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in kv)
    # "<pre>\n": an HTML parser drops one newline right after <pre>, so the text keeps its own
    return (
        f'<div class="sample {kind}"><div class="reward">reward {reward_text}</div>'
        f'<table class="kv">{rows}</table>'
        f'<div class="dim">completion</div><pre>\n{_e(completion)}</pre>'
        + (f'<div class="dim">{_e(more)}</div>' if more else "")
        + f"<details><summary>prompt</summary><pre>\n{_e(prompt)}</pre>"
        + (f'<div class="dim">{_e(more_p)}</div>' if more_p else "")
        + "</details></div>"
    )


def _step_stats(rows: Sequence[Mapping[str, Any]]) -> str:
    rewards = [r for r in (reward_of(x) for x in rows) if r is not None]
    parts = [f"{len(rows)} samples"]
    if rewards:
        mean = sum(rewards) / len(rewards)
        parts.append(f"reward mean {_fmt(mean, 4)}, min {_fmt(min(rewards), 4)}, max {_fmt(max(rewards), 4)}")
        if min(rewards) == max(rewards):
            parts.append("all rewards equal")
    reasons = Counter(str(x.get("finish_reason")) for x in rows if x.get("finish_reason") is not None)
    if reasons:
        parts.append("finish_reason " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()))
    sources = Counter(str(x.get("data_source")) for x in rows if x.get("data_source") is not None)
    if len(sources) > 1:
        parts.append("data_source " + ", ".join(f"{k} {v}" for k, v in sources.most_common()))
    return "; ".join(parts)


def _config_rows(run: Run) -> list[tuple[str, Any]]:
    cfg = run.config
    picks = [
        ("plugins", ("plugins",)),
        ("model", ("model", "path")),
        ("dataset", ("data", "dataset")),
        ("train files", ("data", "train_files")),
        ("template", ("data", "template")),
        ("estimator", ("algorithm", "adv_estimator")),
        ("rollout", ("rollout", "name")),
        ("samples per prompt", ("rollout", "n")),
        ("prompts per step", ("data", "train_batch_size")),
        ("learning rate", ("actor", "optim", "lr")),
    ]
    out = []
    for label, keys in picks:
        node: Any = cfg
        for k in keys:
            node = node.get(k) if isinstance(node, Mapping) else None
        if node not in (None, [], {}):
            out.append((label, node))
    return out


def render_html(runs: Sequence[Run], png: bytes, wanted: Sequence[str | int] | None, examples: int) -> str:
    names = ", ".join(r.label for r in runs)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # defense in depth: nothing on this page may run or load anything
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>plugrl report: {_e(names)}</title><style>{_CSS}</style></head><body>",
        f'<h1>plugrl report</h1><div class="meta">{_e(names)} &middot; generated '
        f"{_e(_dt.datetime.now().strftime('%Y-%m-%d %H:%M:%S'))}</div>",
        f'<p><img class="dash" alt="metrics dashboard" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        "</p>",
    ]
    for run in runs:
        parts.append(f"<h2>{_e(run.label)}</h2>")
        info = [("directory", str(run.path.resolve()))]
        info += [("summary" if i == 0 else "", line) for i, line in enumerate(run_summary(run))]
        info += _config_rows(run)
        parts.append('<table class="kv">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in info))
        parts.append("</table>")
        chosen = choose_steps(list(run.rollout_files), wanted)
        if not chosen:
            parts.append(
                f'<p class="note">no rollouts saved in {_e(str(run.path / ROLLOUTS_DIR))} '
                "(trainer.save_rollouts writes them, from the first step on)</p>"
            )
            continue
        for step, note in chosen:
            rows = read_rollouts(run.rollout_files[step])
            parts.append(f"<h3>step {step}</h3>")
            if note:
                parts.append(f'<p class="note">{_e(note)}</p>')
            if not rows:
                parts.append('<p class="note">the rollouts file is empty</p>')
                continue
            parts.append(f'<div class="meta">{_e(_step_stats(rows))}</div>')
            best, worst = best_and_worst(rows, examples)
            parts.append('<div class="cols"><div><h4>best</h4>')
            parts += [_sample_html(r, "best") for r in best]
            parts.append("</div><div><h4>worst</h4>")
            parts += [_sample_html(r, "worst") for r in worst] or ['<p class="dim">(no other samples)</p>']
            parts.append("</div></div>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- entry point


class ReportFiles(NamedTuple):
    png: Path
    html: Path
    summary: str  # a plain-text summary of the runs, for the terminal


def write_report(
    run_dirs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    steps: str | Sequence[str | int] | None = None,
    examples: int = DEFAULT_EXAMPLES,
) -> ReportFiles:
    """Write ``report.png`` and ``report.html`` for ``run_dirs`` into ``out``; return their paths.

    ``out`` defaults to the first run's directory. ``steps`` chooses the rollout steps shown
    (``"1,10,last"`` or a list; words first/middle/last); default first, middle, last.
    ``examples`` is the number of best and of worst completions per step.
    """
    wanted = parse_steps(steps) if isinstance(steps, str) or steps is None else list(steps)
    if examples < 1:
        raise ReportError(f"--examples must be at least 1, got {examples}")
    runs = load_runs(run_dirs)
    out_dir = Path(out) if out is not None else runs[0].path
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"{out_dir}: cannot create the output directory ({e})") from e
    png_path = render_png(runs, out_dir / PNG_NAME)
    page = render_html(runs, png_path.read_bytes(), wanted, examples)
    html_path = out_dir / HTML_NAME
    tmp = html_path.with_name(html_path.name + ".tmp")
    tmp.write_text(page, encoding="utf-8", errors="replace")
    os.replace(tmp, html_path)
    summary = "\n".join(f"{r.label}\n" + "\n".join(f"  {line}" for line in run_summary(r)) for r in runs)
    return ReportFiles(png_path, html_path, summary)


def _run(args: Any) -> int:
    try:
        files = write_report(args.run_dirs, out=args.out, steps=args.steps, examples=args.examples)
    except ReportError as e:
        print(f"plugrl: error: {e}", file=sys.stderr)
        return 2
    print(files.summary)
    print(f"wrote {files.png}\nwrote {files.html}")
    return 0


def register(commands: Any) -> None:
    """``plugrl report``: added to the kernel's command line (entry point ``report`` in group plugrl.commands)."""
    r = commands.add_parser("report", help="a dashboard PNG and an HTML page of samples for run directories")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories; several are compared")
    r.add_argument("--out", default=None, help="where report.png and report.html go (default: the first RUN_DIR)")
    r.add_argument("--steps", default=None, help="rollout steps to show, e.g. 1,10,last (default: first,middle,last)")
    r.add_argument("--examples", type=int, default=2, help="best and worst completions shown per step (default 2)")
    r.set_defaults(fn=_run)
