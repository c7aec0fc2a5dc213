"""Shared helpers of the benchmarks: child processes with peak RSS, machine load, matmul peak, FLOPs.

Not a benchmark itself; `vs_trl.py` and `scaling.py` import it (run them from the repository root
as ``python bench/<script>.py``, so that ``bench/`` is on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "countdown_grpo.yaml"
MiB = 1 << 20

# The countdown problems of the issue (TinyZero's 3-4 numbers), used by both frameworks.
COUNTDOWN_OPTIONS: dict[str, Any] = {
    "size": 64,
    "seed": 0,
    "min_numbers": 3,
    "max_numbers": 4,
    "max_number": 99,
    "max_target": 100,
    "ops": "+-*/",
}


# --------------------------------------------------------------------------- machine


def load_avg() -> tuple[float, float, float]:
    return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]


def busy_cores(window_s: float = 2.0) -> float:
    """Cores busy over the last ``window_s`` seconds, from /proc/stat (all processes, this one included)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        idle = vals[3] + vals[4]  # idle + iowait
        return sum(vals), idle

    t1, i1 = sample()
    time.sleep(window_s)
    t2, i2 = sample()
    total = max(t2 - t1, 1)
    return round((1.0 - (i2 - i1) / total) * (os.cpu_count() or 1), 2)


def cpu_busy_seconds() -> float:
    """CPU seconds all processes on this machine have spent busy since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    return (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def wait_until_idle(max_wait_s: float, max_busy: float = 0.3, log=print) -> dict[str, Any]:
    """Wait (at most ``max_wait_s``) until other processes use less than ``max_busy`` cores.

    Returns what was seen, for the results: the load average and busy cores just before the run.
    """
    start = time.monotonic()
    busy = busy_cores()
    while busy > max_busy and time.monotonic() - start < max_wait_s:
        log(f"  machine busy ({busy} cores in use, load {load_avg()}); waiting ...")
        time.sleep(10)
        busy = busy_cores()
    return {"loadavg": list(load_avg()), "busy_cores_before": busy, "waited_s": round(time.monotonic() - start, 1)}


def matmul_gflops(
    dtype_name: str, size: int = 2048, reps: int = 10, shape: tuple[int, int, int] | None = None
) -> float:
    """Best-of-``reps`` GFLOP/s of a ``size`` x ``size`` matmul (or [m, k] x [k, n] for ``shape`` = (m, k, n)) with
    torch on this CPU (all torch threads). ``dtype_name``: fp32/float32 or bf16/bfloat16."""
    import torch

    dtype = torch.bfloat16 if dtype_name in ("bf16", "bfloat16") else torch.float32
    m, k, n = shape or (size, size, size)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    a @ b  # warm-up (oneDNN/AMX kernel selection)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best / 1e9


def machine_info() -> dict[str, Any]:
    import platform

    import torch

    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": flags,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def model_parameters(model_dir: str | Path) -> int:
    """N: parameters of the safetensors model in ``model_dir`` (tied embeddings counted once)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                n = 1
                for d in st.get_slice(name).get_shape():
                    n *= d
                total += n
    return total


def package_versions(*names: str) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = "-"
    return out


# --------------------------------------------------------------------------- child processes


@dataclass
class ChildResult:
    returncode: int
    wall_s: float
    peak_rss_mib: float  # exact, whole run: ru_maxrss from wait4 (the largest process of the child's tree)
    peak_rss_train_mib: float  # polled RSS of the child process until ``marker`` showed in its log
    peak_tree_rss_mib: float  # polled sum of RSS over the child and its descendants (shared pages counted twice)
    cpu_s: float  # user + system CPU seconds of the child (and its reaped descendants)
    foreign_cores: float  # mean cores busy with other processes during the run: contention from elsewhere
    log_path: str


def _rss(pid: int) -> tuple[int, int]:
    """(RSS of ``pid``, RSS summed over ``pid`` and its descendants), bytes."""
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
        own = p.memory_info().rss
    except psutil.Error:
        return 0, 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return own, total


def run_child(
    cmd: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 1800,
    marker: str | None = None,
) -> ChildResult:
    """Run ``cmd`` with stdout+stderr to ``log_path``; its peak RSS from wait4, and polled (every 0.25 s).

    ``marker``: text the child prints when its measured work is over (e.g. the last step's line);
    the polled peak stops there, so saving a checkpoint afterwards does not count.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        busy0 = cpu_busy_seconds()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
        peaks = {"train": 0, "tree": 0}
        done = threading.Event()

        def poll() -> None:
            seen_marker = marker is None
            tail_text = ""
            with open(log_path, errors="replace") as reader:
                while not done.is_set():
                    own, tree = _rss(proc.pid)
                    if not seen_marker:  # look for the marker in the output written since the last poll
                        tail_text = tail_text[-len(marker) :] + reader.read()
                        seen_marker = marker in tail_text
                    if not seen_marker or marker is None:
                        peaks["train"] = max(peaks["train"], own)
                    peaks["tree"] = max(peaks["tree"], tree)
                    done.wait(0.25)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        deadline = t0 + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        wall = time.perf_counter() - t0
        busy = cpu_busy_seconds() - busy0
        done.set()
        poller.join()
    cpu = usage.ru_utime + usage.ru_stime
    return ChildResult(
        returncode=proc.returncode,
        wall_s=wall,
        peak_rss_mib=usage.ru_maxrss * 1024 / MiB,  # Linux reports KiB
        peak_rss_train_mib=peaks["train"] / MiB,
        peak_tree_rss_mib=peaks["tree"] / MiB,
        cpu_s=cpu,
        foreign_cores=max(busy - cpu, 0.0) / wall,  # includes this bench's own RSS polling (negligible)
        log_path=str(log_path),
    )


def tail(path: str | Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --------------------------------------------------------------------------- plugrl runs


def plugrl_overrides(
    *,
    prompts: int,
    n: int,
    max_new_tokens: int,
    steps: int,
    lr: float,
    dtype: str,
    out_dir: Path,
    name: str,
    dataset_size: int,
) -> list[str]:
    """The CLI overrides that make the example job do the benchmark's work."""
    o = COUNTDOWN_OPTIONS
    return [
        f"data.train_batch_size={prompts}",
        f"rollout.n={n}",
        f"data.max_response_length={max_new_tokens}",
        "data.prefill=null",
        "data.shuffle=false",  # rows 0,1 | 2,3 | ...: the order TRL visits them with shuffle_dataset=False
        "rollout.temperature=1.0",
        f"trainer.total_steps={steps}",
        f"actor.optim.lr={lr}",
        f"model.dtype={dtype}",
        f"data.dataset_options.size={dataset_size}",
        f"data.dataset_options.seed={o['seed']}",
        f"data.dataset_options.min_numbers={o['min_numbers']}",
        f"data.dataset_options.max_numbers={o['max_numbers']}",
        f"data.dataset_options.max_number={o['max_number']}",
        f"data.dataset_options.max_target={o['max_target']}",
        f"data.dataset_options.ops={o['ops']}",
        f"trainer.output_dir={out_dir}",
        f"trainer.experiment_name={name}",
        "trainer.resume=disable",
        "trainer.save_rollouts=false",
        "trainer.save_freq=0",  # no checkpoint: outside the measured steps, but ~5 s and 1.6 GB a run
    ]


def config_engine(cfg, tokenizer, **kwargs: Any):
    """The rollout engine of a loaded plugrl config on this CPU, in this process, as the trainer builds it
    (``rollout.name``, its dtype, the config's context length, seeded by ``trainer.seed``); ``kwargs`` go to
    ``make_engine`` (``lora_rank=16``)."""
    from plugrl.rollout import make_engine

    return make_engine(
        kwargs.pop("name", cfg.rollout.name),
        model_path=cfg.model.path,
        cfg=cfg.rollout,
        dtype=cfg.rollout.dtype,
        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
        device="cpu",
        trainer_seed=cfg.trainer.seed,
        tokenizer=tokenizer,
        **kwargs,
    )


# a benchmark child process reports its measurement as one line "RESULT <json>" on its output
RESULT = "RESULT "


def print_result(result: dict[str, Any]) -> None:
    """The child's side: its measurement, as the parent reads it (:func:`child_result`)."""
    print(RESULT + json.dumps(result), flush=True)


def child_result(output: str) -> dict[str, Any] | None:
    """The parent's side: the last measurement a child printed with :func:`print_result`, or None."""
    lines = [line for line in output.splitlines() if line.startswith(RESULT)]
    return json.loads(lines[-1][len(RESULT) :]) if lines else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plugrl_steps(metrics: list[dict[str, Any]], sequences_per_step: int, warmup: int = 1) -> list[dict[str, Any]]:
    """Per measured step: time, tokens and the timing/* phases, from plugrl's metrics.jsonl records."""
    out = []
    for m in metrics:
        if "timing/step" not in m or m["step"] <= warmup:
            continue
        prompt_tokens = m["prompt_length/mean"] * sequences_per_step
        completion_tokens = m["response_length/mean"] * sequences_per_step
        phases = {k.removeprefix("timing/"): v for k, v in m.items() if k.startswith("timing/")}
        # batch building, rollout metrics: what the step spends outside its timed phases
        phases["other"] = max(phases["step"] - sum(v for k, v in phases.items() if k != "step"), 0.0)
        out.append(
            {
                "step": m["step"],
                "time_s": m["timing/step"],
                "prompt_tokens": round(prompt_tokens),
                "completion_tokens": round(completion_tokens),
                "tokens": round(prompt_tokens + completion_tokens),
                "phases": phases,
                "reward_mean": m.get("reward/mean"),
                "clip_ratio": m.get("response_length/clip_ratio"),
            }
        )
    return out


def run_plugrl(
    *,
    prompts: int,
    n: int,
    max_new_tokens: int,
    steps: int,
    lr: float,
    dtype: str,
    work_dir: Path,
    name: str,
    extra_overrides: list[str] = (),
    dataset_size: int | None = None,
    timeout_s: float = 1800,
) -> tuple[ChildResult, list[dict[str, Any]], list[str]]:
    """One plugrl training job through its CLI in a child process; (process result, metrics records, command)."""
    size = dataset_size or max(COUNTDOWN_OPTIONS["size"], prompts * steps)
    cmd = [
        sys.executable,
        "-m",
        "plugrl.cli",
        "train",
        str(EXAMPLE.relative_to(REPO)),
        *plugrl_overrides(
            prompts=prompts,
            n=n,
            max_new_tokens=max_new_tokens,
            steps=steps,
            lr=lr,
            dtype=dtype,
            out_dir=work_dir,
            name=name,
            dataset_size=size,
        ),
        *extra_overrides,
    ]
    res = run_child(cmd, work_dir / f"{name}.log", timeout_s=timeout_s, marker=f"step {steps}/{steps} ")
    metrics_file = work_dir / name / "metrics.jsonl"
    metrics = read_jsonl(metrics_file) if metrics_file.is_file() else []
    return res, metrics, cmd


# --------------------------------------------------------------------------- numbers


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize_steps(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Median step time, aggregate tokens/s (all measured tokens / all measured time), mean phases."""
    times = [s["time_s"] for s in steps]
    tokens = sum(s["tokens"] for s in steps)
    phases: dict[str, float] = {}
    for s in steps:
        for k, v in s.get("phases", {}).items():
            phases[k] = phases.get(k, 0.0) + v / len(steps)
    return {
        "measured_steps": len(steps),
        "median_step_s": median(times),
        "mean_step_s": sum(times) / len(times) if times else float("nan"),
        "tokens_per_step": tokens / len(steps) if steps else float("nan"),
        "prompt_tokens_per_step": sum(s["prompt_tokens"] for s in steps) / len(steps) if steps else float("nan"),
        "completion_tokens_per_step": sum(s["completion_tokens"] for s in steps) / len(steps)
        if steps
        else float("nan"),
        "tokens_per_s": tokens / sum(times) if times else float("nan"),
        "phases_mean_s": phases,
    }


def flops_per_step(n_params: int, prompt_tokens: float, completion_tokens: float, extra_forwards: int = 0):
    """(model FLOPs, FLOPs incl. extra forwards) of one step; tokens summed over all its sequences.

    Model FLOPs, the same for the same work whatever the framework: 2N per generated token and 6N per
    trained token (forward + backward over every sequence's prompt and completion). The second number
    adds 2N per prompt+completion token for each extra full forward the framework runs (old log-probs,
    reference model, activation recomputation). Not counted: attention score FLOPs, prompt prefill in
    the rollout, padding; and savings such as computing a prompt once for its group.
    """
    model = 2.0 * n_params * completion_tokens + 6.0 * n_params * (prompt_tokens + completion_tokens)
    return model, model + 2.0 * n_params * (prompt_tokens + completion_tokens) * extra_forwards
