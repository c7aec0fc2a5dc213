"""`plugrl report`: the dashboard PNG and the HTML page, on synthetic run directories."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from plugrl_commands.report import (
    ReportError,
    best_and_worst,
    choose_steps,
    moving_average,
    parse_steps,
    read_metrics,
    write_report,
)

PLANTED = "<script>alert('pwned')</script>"


def write_run(
    run_dir: Path,
    steps: int = 12,
    *,
    rollout_steps: tuple[int, ...] = (),
    half_written: bool = False,
    kl: bool = False,
    reward_fns: tuple[str, ...] = ("exact",),
    slope: float = 0.05,
) -> Path:
    """A run directory as the trainer writes it: metrics.jsonl, rollouts/step_NNNNNN.jsonl, config.yaml."""
    run_dir.mkdir(parents=True)
    lines = []
    for s in range(1, steps + 1):
        reward = min(1.0, 0.1 + slope * s + 0.03 * math.sin(s))
        rec = {
            "step": s,
            "reward/mean": reward,
            **{f"reward/{fn}/mean": reward * (i + 1) / len(reward_fns) for i, fn in enumerate(reward_fns)},
            "reward/std": 0.2,
            "response_length/mean": 30 - s,
            "actor/entropy": 2.0 - 0.05 * s,
            "actor/pg_clipfrac": 0.01 * (s % 3),
            "actor/grad_norm": 1.0 + 0.1 * s,
            "perf/tokens_per_s": 300 + 5 * s,
            "timing/step": 10.0,
            "timing/generate": 6.0,
            "timing/update": 3.5,
            "actor/lr": None,  # logged as null (non-finite): must be tolerated
            "note": "text values are skipped",
        }
        if kl:
            rec["actor/kl_loss"] = 0.001 * s
        lines.append(json.dumps(rec))
    text = "".join(line + "\n" for line in lines)
    if half_written:
        text += f'{{"step": {steps + 1}, "reward/mean": 0.'  # the trainer is writing this line
    (run_dir / "metrics.jsonl").write_text(text)
    (run_dir / "config.yaml").write_text(
        f"plugins: [my_rewards, advantages]\nmodel: {{path: /models/tiny}}\ntrainer: {{total_steps: {steps + 8}}}\n"
    )
    for s in rollout_steps:
        rows = [
            {
                "prompt": [{"role": "user", "content": f"Say {i} <b>now</b>"}],
                "completion": f"answer {i}",
                "data_source": "my_task",
                "ground_truth": str(i),
                "reward": i / 10,
                "details": {"exact": i / 10, "<img src=x onerror=alert(1)>": 1},
                "finish_reason": "stop",
            }
            for i in range(6)
        ]
        rows[2]["completion"] = f"PLANTED-BEST {PLANTED}"
        rows[2]["reward"] = 5.0
        rows[4]["completion"] = "PLANTED-WORST"
        rows[4]["reward"] = -3.0
        rows[5]["ground_truth"] = {"target": "</pre><script>x()</script>"}
        (run_dir / "rollouts").mkdir(exist_ok=True)
        (run_dir / "rollouts" / f"step_{s:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "rollouts").mkdir(exist_ok=True)
    (run_dir / "rollouts" / "step_000099.jsonl.tmp").write_text("{half")  # a rollouts file being written
    return run_dir


def check_png(path: Path) -> tuple[int, int]:
    img = matplotlib.image.imread(path)
    h, w = img.shape[:2]
    assert 1000 <= w <= 3000 and 1000 <= h <= 3000, img.shape
    assert (img[..., :3] < 0.5).mean() > 0.002, "the PNG is blank"
    return h, w


def test_report_on_a_running_run(tmp_path):
    run = write_run(tmp_path / "running", rollout_steps=(1, 5, 10), half_written=True)
    files = write_report([run])
    assert files.png == run / "report.png" and files.html == run / "report.html"
    check_png(files.png)
    page = files.html.read_text(encoding="utf-8")
    # the planted completion is shown, escaped, and no raw tag from the run reaches the page
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
    assert "<script" not in page.lower()
    assert "<img src=x" not in page and "<b>now" not in page
    assert "&lt;/pre&gt;&lt;script&gt;x()" in page
    assert "default-src 'none'" in page  # CSP: nothing on the page may run
    # the PNG is embedded, not linked
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m and len(m.group(1)) > 10_000
    # default steps: first, middle, last with a rollouts file
    assert re.findall(r"<h3>step (\d+)</h3>", page) == ["1", "5", "10"]
    # the half-written line was skipped and reported
    assert "half-written last line" in page and "12 logged" in files.summary


def test_best_and_worst_order_in_html(tmp_path):
    run = write_run(tmp_path / "r", rollout_steps=(3,))
    page = write_report([run], examples=2).html.read_text(encoding="utf-8")
    best_col, worst_col = page.split("<h4>best</h4>")[1].split("<h4>worst</h4>")
    rewards = lambda col: [float(x) for x in re.findall(r'class="reward">reward ([-\d.e]+)<', col)]  # noqa: E731
    assert rewards(best_col) == [5.0, 0.5]  # highest first
    assert rewards(worst_col) == [-3.0, 0.0]  # lowest first
    assert best_col.index("PLANTED-BEST") >= 0 and "PLANTED-WORST" in worst_col
    assert "my_task" in best_col and "ground truth" in best_col


def test_compare_two_runs_to_out_dir(tmp_path):
    a = write_run(tmp_path / "runs" / "grpo", 30, rollout_steps=(10, 30), reward_fns=("exact", "format"))
    b = write_run(tmp_path / "runs" / "rloo", 20, rollout_steps=(20,), kl=True, slope=0.02, half_written=True)
    out = tmp_path / "cmp"
    files = write_report([a, b], out=out, steps="1,10,last")
    assert files.png.parent == out and files.html.parent == out
    assert not (a / "report.png").exists()
    h, w = check_png(files.png)
    assert h > w  # the 4 x 2 grid of panels
    page = files.html.read_text(encoding="utf-8")
    assert "<h2>grpo</h2>" in page and "<h2>rloo</h2>" in page
    # step 1 has no rollouts file: the nearest one is shown, and the page says so
    assert "step 1 has no rollouts file; showing the nearest, step 10" in page
    assert "<script" not in page.lower()


def test_same_named_runs_are_told_apart(tmp_path):
    a = write_run(tmp_path / "a" / "exp")
    b = write_run(tmp_path / "b" / "exp")
    files = write_report([a, b], out=tmp_path / "o")
    assert "a/exp" in files.summary and "b/exp" in files.summary


def test_empty_and_missing(tmp_path):
    with pytest.raises(ReportError, match=re.escape(str(tmp_path / "nope"))):
        write_report([tmp_path / "nope"])
    (tmp_path / "fresh").mkdir()
    with pytest.raises(ReportError, match=re.escape(str(tmp_path / "fresh" / "metrics.jsonl"))):
        write_report([tmp_path / "fresh"])
    (tmp_path / "fresh" / "metrics.jsonl").write_text("")  # a run that has not finished its first step
    files = write_report([tmp_path / "fresh"])
    check_png(files.png)
    assert "no steps logged yet" in files.summary and "no rollouts saved" in files.html.read_text()


def test_read_metrics_tolerates_bad_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "a": 1}\nnot json\n{"step": 2, "a": null, "b": "x"}\n{"step": 3, "a": 3')
    history, bad, partial = read_metrics(p)
    assert sorted(history) == [1, 2] and bad == 1 and partial
    assert math.isnan(history[2]["a"]) and "b" not in history[2]


def test_helpers():
    assert parse_steps("1, 10,last,mid") == [1, 10, "last", "middle"]
    assert parse_steps(None) is None
    with pytest.raises(ReportError, match="--steps"):
        parse_steps("1,ten")
    assert choose_steps([2, 4, 6, 8], None) == [(2, ""), (4, ""), (8, "")]
    assert choose_steps([2, 4], [4, "last"]) == [(4, "")]
    assert choose_steps([], None) == []
    rows = [{"reward": 1}, {"reward": None}, {"reward": 3}, {"reward": 1}]
    best, worst = best_and_worst(rows, 1)
    assert best == [rows[2]] and worst == [rows[1]]  # no reward ranks lowest
    best, worst = best_and_worst(rows[:1], 2)
    assert best == [rows[0]] and worst == []
    assert moving_average([1.0, 3.0, math.nan, 5.0], 2)[:2] == [1.0, 2.0]


@pytest.mark.slow
def test_cli(tmp_path):
    run = write_run(tmp_path / "r", rollout_steps=(2,))
    cmd = [sys.executable, "-m", "plugrl.cli", "report", str(run), "--steps", "2", "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "report.html" in proc.stdout and (tmp_path / "o" / "report.png").is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "plugrl.cli", "report", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and str(tmp_path / "missing") in proc.stderr


def test_a_multi_turn_run_shows_its_episodes_and_conversations(tmp_path):
    from plugrl_commands.report import load_runs, panels

    run = write_run(tmp_path / "mt", rollout_steps=(2,))
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        m.update(
            {"env/turns_mean": 1.5, "env/tool_calls": 0.5, "env/tool_errors": 0.0, "env/info/solved_by_turn1": 0.2}
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    rows = [json.loads(line) for line in (run / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    for r in rows:
        r["messages"] = [
            *r["prompt"],
            {"role": "assistant", "content": "FIRST-TRY <tool_call>"},
            {"role": "user", "content": "FEEDBACK-MSG"},
            {"role": "assistant", "content": r["completion"]},
        ]
        r["segments"] = [{"trained": True, "tokens": 3, "text": "x"}]
    (run / "rollouts" / "step_000002.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    titles = [p.title for p in panels(load_runs([run]))]
    assert titles[-2:] == ["Episodes", "Environment info"]
    page = write_report([run]).html.read_text(encoding="utf-8")
    best = page.split("<h4>best</h4>")[1]
    shown = best.split("completion</div><pre>\n")[1].split("</pre>")[0]  # the conversation, not its prompt
    assert shown.startswith("[assistant]\nFIRST-TRY &lt;tool_call&gt;") and "[user]\nFEEDBACK-MSG" in shown
