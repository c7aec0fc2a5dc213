"""plugrl scaling table: step time per token as completions per step and max new tokens grow.

    python bench/scaling.py                                   # the full grid: 16,64,256 x 128,512 (long on CPU)
    python bench/scaling.py --completions 16,64 --max-new-tokens 128,512 --json scaling.json

Each case is one plugrl job through its CLI (``examples/countdown_grpo.yaml`` with the same overrides as
bench/vs_trl.py: countdown 3-4 numbers, no prefill, temperature 1, lr 1e-6), ``--n`` completions per prompt
(default 8, so 16 completions = 2 prompts), ``--warmup`` (default 2) warm-up steps and ``--measured`` (default 2)
measured steps, in its own process. Two warm-up steps, because a run's second update still pays for memory the
process has not used before (the optimizer state allocated by the first step, the heap growing): 150,000-280,000
page faults and 1.3-1.9x the time of the later updates of the same batch. For every case: median step time,
tokens per step (prompt + completion, all sequences), step time per token and its ratio to the first (smallest)
case, the same per distinct token (each prompt once: what the step computes) and per completion token, the
generate/update split per token, and peak RSS. The issue's target: step time per token within 1.5x of the smallest
case.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

TARGET = 1.5


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def render_table(cases: list[dict[str, Any]], title: str) -> list[str]:
    """The markdown table of ``cases`` (as in the JSON), ratios against the first.

    "if linear": the ratio per counted token that a cost exactly proportional to the completion tokens would
    give, (completion tokens / counted tokens of the case) / (the same of the first case). A prompt counts once
    per completion but is computed about once per group (prefix-cached in vLLM, one copy per group in
    training), so the cases' prompt shares move this ratio away from 1. "distinct token": the step time over
    the tokens the step works on, each prompt once (completion tokens + counted prompt tokens / n).
    """
    ok = [c for c in cases if not c.get("failed")]
    base = ok[0] if ok else None

    def share(c):
        return c["summary"]["completion_tokens_per_step"] / c["summary"]["tokens_per_step"]

    def per_distinct(c):
        n = c.get("n") or int(re.search(r"rollout\.n=(\d+)", c["command"]).group(1))  # older JSON: no "n"
        return C.median([s["time_s"] / (s["completion_tokens"] + s["prompt_tokens"] / n) for s in c["steps"]])

    lines = [
        "",
        f"## plugrl scaling, {title}",
        "",
        "| completions/step | max new tokens | median step (s) | tokens/step (prompt+compl.) | completions cut at max "
        "| step ms/token | vs smallest | if linear | step ms/distinct token | vs smallest | step ms/compl. token "
        f"| vs smallest | generate ms/compl. token | update ms/token | peak RSS MiB (training / whole run) "
        f"| step ms/token within {TARGET}x | loadavg before | other procs' cores during |",
        "|" + "---|" * 18,
    ]
    for c in cases:
        if c.get("failed") or base is None:
            lines.append(f"| {c['completions']} | {c['max_new_tokens']} | failed |" + " |" * 15)
            continue
        s, p = c["summary"], c["process"]
        rel = c["step_s_per_token"] / base["step_s_per_token"]
        rel_c = c["step_s_per_completion_token"] / base["step_s_per_completion_token"]
        lines.append(
            f"| {c['completions']} | {c['max_new_tokens']} | {s['median_step_s']:.1f} | {s['tokens_per_step']:,.0f} "
            f"({s['prompt_tokens_per_step']:,.0f}+{s['completion_tokens_per_step']:,.0f}) "
            f"| {100 * c['clip_ratio']:.0f}% "
            f"| {1e3 * c['step_s_per_token']:.2f} | {rel:.2f}x | {share(c) / share(base):.2f}x "
            f"| {1e3 * per_distinct(c):.2f} | {per_distinct(c) / per_distinct(base):.2f}x "
            f"| {1e3 * c['step_s_per_completion_token']:.2f} "
            f"| {rel_c:.2f}x | {1e3 * c['generate_s_per_completion_token']:.2f} "
            f"| {1e3 * c['update_s_per_token']:.2f} | {p['peak_rss_train_mib']:,.0f} / {p['peak_rss_mib']:,.0f} "
            f"| {'yes' if rel <= TARGET else 'NO'} | {' '.join(f'{x:.2f}' for x in c['load']['loadavg'])} "
            f"| {p['foreign_cores']:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--completions", type=_ints, default=[16, 64, 256], help="completions per step (default 16,64,256)")
    ap.add_argument("--max-new-tokens", type=_ints, default=[128, 512], help="default 128,512")
    ap.add_argument(
        "--cases", help="explicit cases instead of the grid, e.g. 16x128,64x128,16x512 (completions x max new tokens)"
    )
    ap.add_argument("--n", type=int, default=8, help="completions per prompt (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps, not measured (default 2)")
    ap.add_argument("--measured", type=int, default=2, help="measured steps after the warm-up (default 2)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--override", action="append", default=[], help="extra plugrl override (repeatable)")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--keep", help="keep logs and run dirs in this directory")
    ap.add_argument("--wait-idle", type=float, default=0.0, help="before each case wait up to this many s for idle")
    ap.add_argument("--timeout", type=float, default=3600, help="per case, seconds")
    ap.add_argument("--table-from", metavar="JSON", help="print the table of an earlier run's --json and exit")
    args = ap.parse_args(argv)
    if args.table_from:
        earlier = json.loads(Path(args.table_from).read_text())
        print("\n".join(render_table(earlier["cases"], f"{earlier['date']} ({args.table_from})")))
        return 0
    if args.cases:
        try:
            pairs = [tuple(int(x) for x in case.split("x")) for case in args.cases.split(",") if case.strip()]
        except ValueError:
            ap.error(f"--cases {args.cases!r}: write them as 16x128,64x128")
    else:
        pairs = [(c, m) for c in args.completions for m in args.max_new_tokens]
    for c, _ in pairs:
        if c % args.n:
            ap.error(f"{c} completions is not a multiple of --n {args.n}")

    started = dt.datetime.now().astimezone()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    print(f"plugrl scaling  {started:%Y-%m-%d %H:%M %Z}  command: {command}", flush=True)
    grid = sorted(pairs, key=lambda cm: (cm[0] * cm[1], cm))
    steps = args.warmup + args.measured
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_scaling_"))
    work.mkdir(parents=True, exist_ok=True)
    cases: list[dict[str, Any]] = []
    try:
        for completions, max_new in grid:
            name = f"c{completions}_t{max_new}"
            load = C.wait_until_idle(args.wait_idle) if args.wait_idle else {"loadavg": C.load_avg()}
            print(f"{name}: os.getloadavg() = {tuple(load['loadavg'])}", flush=True)
            res, metrics, cmd = C.run_plugrl(
                prompts=completions // args.n,
                n=args.n,
                max_new_tokens=max_new,
                steps=steps,
                lr=args.lr,
                dtype=args.dtype,
                work_dir=work,
                name=name,
                extra_overrides=args.override,
                timeout_s=args.timeout,
            )
            if res.returncode != 0 or len(metrics) < steps:
                print(f"  FAILED (exit {res.returncode}), log {res.log_path}:\n{C.tail(res.log_path)}", flush=True)
                cases.append({"completions": completions, "max_new_tokens": max_new, "failed": True, "load": load})
                continue
            measured = C.plugrl_steps(metrics, completions, warmup=args.warmup)
            summary = C.summarize_steps(measured)
            per_token = [s["time_s"] / s["tokens"] for s in measured]
            phases = summary["phases_mean_s"]
            tok = summary["tokens_per_step"]
            case = {
                "completions": completions,
                "n": args.n,
                "max_new_tokens": max_new,
                "command": shlex.join(cmd),
                "load": load,
                "process": vars(res),
                "summary": summary,
                "step_s_per_token": C.median(per_token),
                "step_s_per_completion_token": C.median([s["time_s"] / s["completion_tokens"] for s in measured]),
                "generate_s_per_completion_token": phases.get("generate", 0.0) / summary["completion_tokens_per_step"],
                "update_s_per_token": phases.get("update", 0.0) / tok,
                "clip_ratio": C.median([s["clip_ratio"] for s in measured if s["clip_ratio"] is not None]),
                "steps": measured,
            }
            cases.append(case)
            print(
                f"  median step {summary['median_step_s']:.1f}s, {tok:.0f} tokens/step, "
                f"{1e3 * case['step_s_per_token']:.2f} ms/token, peak RSS {res.peak_rss_mib:.0f} MiB, "
                f"other processes used {res.foreign_cores:.2f} cores meanwhile",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    lines = render_table(
        cases,
        f"{started:%Y-%m-%d %H:%M %Z}, {args.dtype}, n={args.n}, {args.measured} measured steps after "
        f"{args.warmup} warm-up",
    )
    print("\n".join(lines), flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"date": started.isoformat(timespec="seconds"), "command": command, "cases": cases, "table": lines},
                indent=1,
                default=str,
            )
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
