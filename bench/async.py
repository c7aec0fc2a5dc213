"""Off-policy rollouts (``trainer.off_policy_steps``), measured: throughput of k steps ahead vs on-policy, and the
default job's reward curve under each.

    python bench/async.py                                   # part 1: k = 0, 1 on the default job, 2 rounds
    python bench/async.py --parts 1 --ks 0,1,2 --rounds 3 --out bench/results/async_<date>.json
    python bench/async.py --parts 2 --plot docs/img/async_reward.png      # part 2: 60-step reward curves
    python bench/async.py --parts 3                         # part 3: a weight push over shm, http, collective
    python bench/async.py --quick                           # the mechanics, small (tests run it)

Every run is ``python -m plugrl.cli train examples/countdown_grpo.yaml`` (the default job: SmolLM2-135M-Instruct,
vLLM in the process, 4 countdown prompts x 8 responses, <= 32 new tokens) in a child process of its own, with
``trainer.off_policy_steps=k``, no checkpoints and no rollout files; the numbers come from its metrics.jsonl.

1. **Throughput**: ``--steps`` steps per run (default 10); the first two are not measured (the first generates
   on-policy, the second is the first to overlap). A variant is a ``rollout.mode`` (``--modes``: colocate, or
   server: one rollout server started by the run on this host, weights through shared memory) with a k. Each
   round runs every variant once, the order rotating, so drift of the machine hits all of them. Per variant:
   median step time, tokens/s (every measured step's prompt and response tokens over their summed step times, as
   ``perf/tokens_per_s``), the mean of each phase, and the ratio of its tokens/s to the first variant's in the
   same round (the median over rounds is reported), and the cores the training process kept busy
   (``perf/cpu_cores_busy``: its CPU seconds over the step's wall time; a rollout server's are its own).
   ``timing/generate`` of k >= 1 runs on the rollout thread, beside ``update``; ``timing/wait_rollouts`` is what
   the training waited for it. ``--uncorrected`` adds each k >= 1 with the rollout correction off: the overlap
   without the old log-prob pass that the correction costs.
2. **Reward curves**: the default job's whole run (``--curve-steps``, default its 60) with k = 0 and with each
   other k, ``reward/mean`` per step; the means of the first and last 10 steps, and the largest gap between the
   curves' 10-step moving averages. ``--plot`` writes both curves to a PNG.
3. **Weight push**: the default job's model (its weights in the rollout dtype ``auto`` resolves to here) pushed
   ``--push-rounds`` times to one rollout server (vLLM) on this host over each ``--transports`` (shm, http,
   collective: gloo here): the median seconds of ``RemoteEngine.load_weights``, the server's reload included.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

PHASES = ("generate", "reward", "old_logprob", "update", "sync_weights", "wait_rollouts")


def _log(msg: str) -> None:
    print(msg, flush=True)


def run_job(
    work: Path,
    name: str,
    k: int,
    steps: int,
    extra: list[str],
    timeout_s: float,
    mode: str = "colocate",
    uncorrected: bool = False,
) -> dict[str, Any]:
    """One run of the default job with ``trainer.off_policy_steps=k`` and ``rollout.mode``; its command, process
    and metrics."""
    cmd = [
        sys.executable,
        "-m",
        "plugrl.cli",
        "train",
        str(C.EXAMPLE.relative_to(C.REPO)),
        f"trainer.total_steps={steps}",
        f"trainer.off_policy_steps={k}",
        f"rollout.mode={mode}",
        *(["algorithm.rollout_correction.mode=off"] if uncorrected else []),
        f"trainer.output_dir={work}",
        f"trainer.experiment_name={name}",
        "trainer.resume=disable",
        "trainer.save_freq=0",
        "trainer.save_rollouts=false",
        "trainer.logger=[jsonl]",
        *extra,
    ]
    res = C.run_child(cmd, work / f"{name}.log", timeout_s=timeout_s, marker=f"step {steps}/{steps} ")
    metrics_file = work / name / "metrics.jsonl"
    metrics = C.read_jsonl(metrics_file) if metrics_file.is_file() else []
    if res.returncode != 0 or len(metrics) < steps:
        raise SystemExit(f"{shlex.join(cmd)} failed (exit {res.returncode}):\n{C.tail(res.log_path)}")
    import yaml

    cfg = yaml.safe_load((work / name / "config.yaml").read_text())
    sequences = cfg["data"]["train_batch_size"] * cfg["rollout"]["n"]
    return {
        "k": k,
        "mode": mode,
        "command": shlex.join(cmd),
        "process": vars(res),
        "metrics": metrics,
        "sequences": sequences,
    }


def throughput(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Tokens/s, median step time and mean phases of a run's measured steps."""
    steps = C.plugrl_steps(run["metrics"], run["sequences"], warmup=warmup)
    summary = C.summarize_steps(steps)
    measured = [m for m in run["metrics"] if m["step"] > warmup]
    lags = [m.get("rollout/policy_lag", 0.0) for m in measured]
    busy = [m["perf/cpu_cores_busy"] for m in measured if "perf/cpu_cores_busy" in m]
    return {
        "k": run["k"],
        "mode": run["mode"],
        "tokens_per_s": summary["tokens_per_s"],
        "median_step_s": summary["median_step_s"],
        "phases_mean_s": {p: summary["phases_mean_s"].get(p, 0.0) for p in PHASES},
        "policy_lag_mean": sum(lags) / len(lags),
        "cpu_cores_busy": sum(busy) / len(busy) if busy else float("nan"),
        "measured_steps": len(steps),
    }


def part_throughput(args, work: Path) -> dict[str, Any]:
    variants = [(mode, k, False) for mode in args.modes for k in args.ks]
    if args.uncorrected:  # the overlap alone: k >= 1 without the old log-prob pass the correction needs
        variants += [(mode, k, True) for mode in args.modes for k in args.ks if k]
    rounds = []
    for r in range(args.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        measured = {}
        for mode, k, off in order:
            if args.wait_idle:
                C.wait_until_idle(args.wait_idle, log=_log)
            name = _name(mode, k, off)
            run = run_job(
                work,
                f"r{r}_{mode}_k{k}{'_off' if off else ''}",
                k,
                args.steps,
                args.overrides,
                args.child_timeout,
                mode,
                off,
            )
            m = measured[name] = throughput(run, warmup=2)
            _log(
                f"round {r + 1} {name}: {m['tokens_per_s']:.1f} tokens/s, step {m['median_step_s']:.2f} s "
                f"(median), {m['cpu_cores_busy']:.2f} cores busy, foreign load {run['process']['foreign_cores']:.2f}"
            )
        base = measured[_name(*variants[0])]["tokens_per_s"]
        rounds.append(
            {"order": order, "runs": measured, "ratio": {v: m["tokens_per_s"] / base for v, m in measured.items()}}
        )
    table = []
    for mode, k, off in variants:
        name = _name(mode, k, off)
        runs = [r["runs"][name] for r in rounds]
        table.append(
            {
                "variant": name,
                "mode": mode,
                "k": k,
                "tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs),
                "median_step_s": statistics.median(x["median_step_s"] for x in runs),
                "ratio_vs_first": statistics.median(r["ratio"][name] for r in rounds),
                "policy_lag_mean": runs[0]["policy_lag_mean"],
                "cpu_cores_busy": statistics.mean(x["cpu_cores_busy"] for x in runs),
                "uncorrected": off,
                "phases_mean_s": {p: statistics.mean(x["phases_mean_s"][p] for x in runs) for p in PHASES},
            }
        )
    first = table[0]["variant"]
    head = f"\n| variant | tokens/s | step s | vs {first} | lag | cores busy | "
    _log(head + " | ".join(f"{p} s" for p in PHASES) + " |")
    _log("| --- | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in PHASES) + " |")
    for row in table:
        phases = " | ".join(f"{row['phases_mean_s'][p]:.2f}" for p in PHASES)
        _log(
            f"| {row['variant']} | {row['tokens_per_s']:.1f} | {row['median_step_s']:.2f} | "
            f"{row['ratio_vs_first']:.2f}x | {row['policy_lag_mean']:.2f} | {row['cpu_cores_busy']:.2f} | {phases} |"
        )
    return {"rounds": rounds, "table": table}


def _name(mode: str, k: int, uncorrected: bool) -> str:
    return f"{mode} k={k}" + (" uncorrected" if uncorrected else "")


def _moving(xs: list[float], w: int) -> list[float]:
    return [sum(xs[max(0, i - w + 1) : i + 1]) / len(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]


def plot_curves(curves: dict[int, list[float]], path: str) -> None:
    """Each k's reward per step (faint) and its 10-step moving average, one colour per k, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, c in curves.items():
        steps = range(1, len(c) + 1)
        (line,) = ax.plot(steps, _moving(c, 10), label=f"off_policy_steps={k} (10-step mean)")
        ax.plot(steps, c, alpha=0.3, color=line.get_color())
    ax.set_xlabel("step")
    ax.set_ylabel("reward/mean")
    ax.set_title("Default job: reward per step, on-policy vs generated ahead")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    _log(f"plot: {path}")


def part_curves(args, work: Path) -> dict[str, Any]:
    curves = {}
    for k in args.ks:
        run = run_job(work, f"curve_k{k}", k, args.curve_steps, args.overrides, args.child_timeout)
        curves[k] = [m["reward/mean"] for m in run["metrics"]]
        _log(
            f"k={k}: reward first 10 steps {statistics.mean(curves[k][:10]):.3f}, last 10 "
            f"{statistics.mean(curves[k][-10:]):.3f}; {run['process']['wall_s'] / 60:.1f} min"
        )
    base = _moving(curves[args.ks[0]], 10)
    gaps = {k: max(abs(a - b) for a, b in zip(_moving(c, 10), base, strict=True)) for k, c in curves.items()}
    for k in args.ks[1:]:
        _log(f"k={k} vs k={args.ks[0]}: largest gap of the 10-step moving averages {gaps[k]:.3f}")
    if args.plot:
        plot_curves(curves, args.plot)
    return {"curves": {str(k): c for k, c in curves.items()}, "max_moving_gap": {str(k): g for k, g in gaps.items()}}


def part_push(args, work: Path) -> dict[str, Any]:
    """Part 3: one weight push of the default job's model to a rollout server (vLLM, this host) per transport."""
    import torch
    from safetensors.torch import load_file

    import plugrl_model_servers as servers
    from plugrl.config import load_config
    from plugrl_rollout_servers.remote import RemoteEngine, free_port, serve_command

    cfg = load_config(C.EXAMPLE, args.overrides)
    from plugrl.startup import check_run

    check_run(cfg, training=False, warn_ignored=False)  # resolves local: model names
    from plugrl.precision import resolve_dtype

    dtype = resolve_dtype(cfg.model.dtype, "cpu")
    cfg.rollout.dtype = dtype
    port = free_port()
    command = serve_command(cfg.model.path, cfg.rollout, port=port, max_model_len=1024, device="cpu", seed=0)
    servers.start_command(lambda: command, cfg.model.path, port, log_path=work / "push_server.log")
    weights = {}
    for f in sorted(Path(cfg.model.path).glob("*.safetensors")):
        weights.update(load_file(f))
    weights = {k: v.to(getattr(torch, dtype)) for k, v in weights.items()}
    size_mib = sum(v.numel() * v.element_size() for v in weights.values()) / C.MiB
    results = {}
    try:
        for transport in args.transports:
            remote = RemoteEngine([f"http://127.0.0.1:{port}"], transport=transport)
            times = []
            for _ in range(args.push_rounds):
                t0 = time.perf_counter()
                remote.load_weights(iter(weights.items()))
                times.append(time.perf_counter() - t0)
            results[transport] = {"median_s": statistics.median(times), "all_s": times}
            _log(
                f"push over {transport}: {statistics.median(times):.3f} s (median of {len(times)}), {size_mib:.0f} MiB"
            )
    finally:
        servers.stop(port)
    return {"model": cfg.model.path, "dtype": dtype, "size_mib": size_mib, "transports": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="1", help="1: throughput, 2: reward curves (default 1)")
    ap.add_argument("--ks", default="0,1", help="the off_policy_steps values, the baseline first (default 0,1)")
    ap.add_argument(
        "--modes", default="colocate", help="part 1: rollout.mode values, the baseline first (colocate,server)"
    )
    ap.add_argument(
        "--uncorrected",
        action="store_true",
        help="part 1: also each k >= 1 with algorithm.rollout_correction.mode=off (no old log-prob pass)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="part 1: rounds of every k (default 2)")
    ap.add_argument("--steps", type=int, default=10, help="part 1: steps per run, the first 2 not measured")
    ap.add_argument("--curve-steps", type=int, default=60, help="part 2: steps per run (the default job's 60)")
    ap.add_argument("--plot", help="part 2: write the curves to this PNG")
    ap.add_argument(
        "--transports",
        default="shm,http,collective",
        help="part 3: weight transports to time (default shm,http,collective)",
    )
    ap.add_argument("--push-rounds", type=int, default=5, help="part 3: pushes per transport (default 5)")
    ap.add_argument("--quick", action="store_true", help="the tiny shape: 1 round of 4 steps, 4-step curves")
    ap.add_argument("--overrides", nargs="*", default=[], help="more config overrides for every run")
    ap.add_argument("--wait-idle", type=float, default=0.0, help="part 1: wait up to this many s for a quiet box")
    ap.add_argument("--child-timeout", type=float, default=3600.0)
    ap.add_argument("--keep", help="keep the runs' directories and logs here")
    ap.add_argument("--out", help="write every number as JSON here")
    args = ap.parse_args(argv)
    args.ks = [int(k) for k in args.ks.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if args.quick:
        args.rounds, args.steps, args.curve_steps = 1, 4, 4
    parts = {int(p) for p in args.parts.split(",") if p.strip()}
    started = dt.datetime.now().astimezone()
    machine = C.machine_info()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    _log(f"bench/async.py  {started:%Y-%m-%d %H:%M %Z}  command: {command}")
    _log(f"CPU: {machine['cpu']} ({machine['cores']} cores); load average {C.load_avg()}")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_async_"))
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"command": command, "started": started.isoformat(), "machine": machine, "ks": args.ks}
    if 1 in parts:
        out["throughput"] = part_throughput(args, work)
    if 2 in parts:
        out["curves"] = part_curves(args, work)
    if 3 in parts:
        out["push"] = part_push(args, work)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))
        _log(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
