"""bf16 vs float32 on this machine: matmul, vLLM generation, one policy update; and what ``dtype: auto`` picks.

    python bench/dtype.py [--json out.json]

Each measurement runs in its own child process (so neither dtype warms the other's caches): a
[1024, 576] x [576, 1536] matmul (SmolLM2-135M's MLP shape); an in-process vLLM engine generating 2 prompts x 4
samples x up to 16 tokens (eager, as the trainer builds it; its time is scaled to 128 generated tokens, since
sampled lengths vary); and ``PolicyModel.update`` on one group (a 32-token prompt, 4 responses of 32 tokens;
bf16 = autocast over float32 weights, as training runs it). Prints each side's time and the ratio
bf16 / float32 (above 1: bf16 is slower here), and what ``plugrl.precision.resolve_dtype("auto", "cpu")``
chooses on this CPU. On CPUs without bf16 kernels (AVX2 only) the bf16 update takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

MODEL = "local:SmolLM2-135M-Instruct"
MLP_SHAPE = (1024, 576, 1536)  # [m, k] x [k, n]: SmolLM2-135M's MLP


def matmul(dtype_name: str) -> dict:
    m, k, n = MLP_SHAPE
    gflops = C.matmul_gflops(dtype_name, reps=3, shape=MLP_SHAPE)
    return {"seconds": 2 * m * k * n / gflops / 1e9, "gflops": gflops}


def generate(dtype_name: str) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from plugrl.config import RolloutConfig
    from plugrl.models import resolve_model_path
    from plugrl.rollout import SamplingSettings
    from plugrl.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(resolve_model_path(MODEL), RolloutConfig(cpu_kv_cache_gb=0.25), dtype_name, 256, "cpu")
    prompts = [[1, 504, 3458, 314, 253, 1345, 28, 2345] * 2, [1, 2113, 506, 3571, 3953, 30, 216, 44] * 2]
    sampling = SamplingSettings(n=4, max_tokens=16, temperature=1.0)
    engine.generate(prompts, sampling)  # warm-up
    t = time.perf_counter()
    out = engine.generate(prompts, sampling)
    seconds = time.perf_counter() - t
    tokens = sum(len(r.response_ids) for group in out for r in group)
    # sampled lengths vary (EOS): compare the time per generated token
    return {"seconds": seconds / tokens * 128, "tokens": tokens, "tokens_per_s": tokens / seconds}


def update(dtype_name: str) -> dict:
    import torch

    from plugrl.actor import PolicyModel, TrainBatch
    from plugrl.config import ActorConfig, ModelConfig
    from plugrl.models import resolve_model_path

    path = resolve_model_path(MODEL)
    policy = PolicyModel(
        path, ModelConfig(path=path, dtype=dtype_name), ActorConfig(optim={"lr": 1e-6}), torch.device("cpu")
    )
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 40000, (32,), generator=gen).tolist()
    seqs = [prompt + torch.randint(5, 40000, (32,), generator=gen).tolist() for _ in range(4)]
    batch = TrainBatch.from_sequences(seqs, [32] * 4, group_ids=[0] * 4)
    batch.advantages = torch.randn(4, 1, generator=gen) * batch.response_mask
    times = []
    for _ in range(2):  # the first pays for first-touch allocations
        t = time.perf_counter()
        policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=32)
        times.append(time.perf_counter() - t)
    return {"seconds": times[-1], "tokens": 32 + 4 * 32}


def child(part: str, dtype_name: str) -> dict:
    return {"matmul": matmul, "generate": generate, "update": update}[part](dtype_name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="matmul,generate,update")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", nargs=2, metavar=("PART", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        C.print_result(child(*args.child))
        return 0

    from plugrl.precision import cpu_has_fast_bf16, resolve_dtype

    fast = cpu_has_fast_bf16()
    print(f"CPU has bf16 kernels: {fast}; model.dtype=auto -> {resolve_dtype('auto', 'cpu')}", flush=True)
    results: dict = {"cpu_has_fast_bf16": fast, "auto": resolve_dtype("auto", "cpu"), "parts": {}}
    for part in args.parts.split(","):
        row = {}
        for dtype_name in ("float32", "bfloat16"):
            proc = subprocess.run(
                [sys.executable, __file__, "--child", part, dtype_name], capture_output=True, text=True, check=False
            )
            result = C.child_result(proc.stdout)
            if proc.returncode or result is None:
                print(f"{part} {dtype_name}: FAILED (exit {proc.returncode})\n{proc.stderr[-2000:]}", flush=True)
                break
            row[dtype_name] = result
            print(f"{part:9s} {dtype_name:9s} {row[dtype_name]['seconds']:8.3f} s  {row[dtype_name]}", flush=True)
        if len(row) == 2:
            row["ratio_bf16_over_fp32"] = row["bfloat16"]["seconds"] / row["float32"]["seconds"]
            print(f"{part:9s} time bf16 / float32 = {row['ratio_bf16_over_fp32']:.2f}x", flush=True)
        results["parts"][part] = row
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
