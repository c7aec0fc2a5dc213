"""vLLM eager vs compiled on this CPU: the engine's start-up and its generation, as the trainer builds it.

    python bench/vllm_compiled.py [--repeats 4] [--json out.json] [--profile]

``rollout.enforce_eager`` unset is eager on CPU (true); ``false`` runs vLLM's torch.compile'd model. Three child
processes, in order: eager; compiled with empty compile caches (vLLM's and inductor's pointed at a new temporary
folder: the first compiled start on a machine); compiled again from the caches that run filled (every later
start). Each builds ``VLLMEngine`` (SmolLM2-135M-Instruct, bf16 where the CPU has bf16 kernels, else float32) and
generates the vs_trl.py step's shape: 2 prompts of 122 random tokens x 8 samples, up to 128 new tokens (random
prompts seldom stop early; the token counts are printed), once as a warm-up and ``--repeats`` times measured.
Prints each child's start-up (building the engine: loading, compiling, the KV cache) and median generation, and
both against eager; ``--profile`` adds the top operators of one more eager generation (``torch.profiler``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

MODEL = "local:SmolLM2-135M-Instruct"
PROFILE = "=== profile ==="  # brackets the child's profile table in its output (vLLM logs around it)


def child(mode: str, repeats: int, profile: bool = False) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from plugrl.config import RolloutConfig
    from plugrl.models import resolve_model_path
    from plugrl.precision import resolve_dtype
    from plugrl.rollout import SamplingSettings
    from plugrl.rollout.vllm_engine import VLLMEngine

    dtype = str(resolve_dtype("auto", "cpu")).removeprefix("torch.")
    path = resolve_model_path(MODEL)
    t = time.perf_counter()
    engine = VLLMEngine(path, RolloutConfig(enforce_eager=mode == "eager"), dtype, 1024, "cpu")
    build_s = time.perf_counter() - t
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 40000, (122,), generator=gen).tolist() for _ in range(2)]
    sampling = SamplingSettings(n=8, max_tokens=128, temperature=1.0)
    times, tokens = [], []
    for _ in range(1 + repeats):
        t = time.perf_counter()
        out = engine.generate(prompts, sampling)
        times.append(time.perf_counter() - t)
        tokens.append(sum(len(r.response_ids) for group in out for r in group))
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        with profiler(activities=[ProfilerActivity.CPU]) as prof:
            engine.generate(prompts, sampling)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
        print(f"{PROFILE}\n{table}\n{PROFILE}", flush=True)
    return {"dtype": dtype, "build_s": build_s, "generate_s": statistics.median(times[1:]), "runs_s": times,
            "tokens": tokens}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--profile", action="store_true", help="print the top operators of an eager generation")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        C.print_result(child(args.child, args.repeats, args.profile))
        return 0

    info = C.machine_info()
    print(f"machine: {info}", flush=True)
    results: dict = {"command": " ".join(["python", *sys.argv]), "machine": info, "runs": {}}
    caches = tempfile.mkdtemp(prefix="bench_vllm_compiled_")
    env = {**os.environ, "VLLM_CACHE_ROOT": caches, "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor"}
    try:
        for label, mode in (("eager", "eager"), ("compiled, cold", "compiled"), ("compiled, cached", "compiled")):
            if not _run(label, mode, args.repeats, env, results, args.profile and mode == "eager"):
                return 1
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _run(label: str, mode: str, repeats: int, env: dict, results: dict, profile: bool) -> bool:
    """One child; prints its line (and its profile) and adds its result; False when it failed."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--repeats", str(repeats), *(["--profile"] if profile else [])],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    run = C.child_result(proc.stdout)
    if profile and proc.stdout.count(PROFILE) == 2:
        print(proc.stdout.split(PROFILE)[1].strip("\n"), flush=True)
    if proc.returncode or run is None:
        print(f"{label}: FAILED (exit {proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
        return False
    results["runs"][label] = run
    base = results["runs"]["eager"]
    print(
        f"{label:17s} start-up {run['build_s']:6.1f} s ({run['build_s'] - base['build_s']:+6.1f} s vs eager)   "
        f"generate {run['generate_s']:5.2f} s for {statistics.median(run['tokens']):.0f} tokens "
        f"({base['generate_s'] / run['generate_s']:.2f}x eager's speed)",
        flush=True,
    )
    return True


if __name__ == "__main__":
    sys.exit(main())
