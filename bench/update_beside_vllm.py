"""How much slower `PolicyModel.update` runs once an in-process vLLM engine exists (docs/performance.md).

One process: the policy update on a fixed batch shaped like bench/vs_trl.py's step (2 prompts of 122 tokens x 8
responses of 30-128 tokens, SmolLM2-135M-Instruct, bf16 autocast, token budget 1024), ``--repeats`` times; then a
vLLM engine is built (as the trainer builds it) and the same updates run again. Prints the median of each and the
ratio, and with ``--profile`` the top operators of one update on each side.

    python bench/update_beside_vllm.py [--repeats 4] [--profile] [--kv-cache-gb 1.0]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from plugrl.actor import PolicyModel, TrainBatch
    from plugrl.config import ActorConfig, ModelConfig, RolloutConfig
    from plugrl.models import resolve_model_path
    from plugrl.rollout.vllm_engine import VLLMEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--kv-cache-gb", type=float, default=1.0)
    ap.add_argument("--malloc-default", action="store_true", help="leave glibc malloc as it is (plugrl.hostmem)")
    args = ap.parse_args()
    if not args.malloc_default:
        from plugrl.hostmem import keep_freed_memory

        print("keep_freed_memory:", keep_freed_memory())

    model = resolve_model_path("local:SmolLM2-135M-Instruct")
    g = torch.Generator().manual_seed(0)
    seqs, plens, groups = [], [], []
    for p in range(2):
        prompt = torch.randint(5, 40000, (122,), generator=g).tolist()
        for r in (128, 40, 60, 80, 128, 100, 30, 128):
            seqs.append(prompt + torch.randint(5, 40000, (r,), generator=g).tolist())
            plens.append(122)
            groups.append(p)
    batch = TrainBatch.from_sequences(seqs, plens, group_ids=groups)
    batch.advantages = torch.randn(len(seqs), 1, generator=g) * batch.response_mask
    policy = PolicyModel(
        model,
        ModelConfig(path=model, dtype="bfloat16"),
        ActorConfig(optim={"lr": 1e-6}, ppo_max_token_len_per_gpu=1024),
        torch.device("cpu"),
    )

    faults: list[int] = []

    def update() -> float:
        f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter()
        policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=128)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
        return time.perf_counter() - t

    def measure(label: str) -> float:
        update()  # warm-up: first-touch allocations
        faults.clear()
        times = [update() for _ in range(args.repeats)]
        print(
            f"{label}: median {statistics.median(times):.2f} s  ({', '.join(f'{t:.2f}' for t in times)}); "
            f"page faults per update {statistics.median(faults):,.0f}",
            flush=True,
        )
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                update()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10), flush=True)
        return statistics.median(times)

    alone = measure("update, no vLLM engine in the process")
    engine = VLLMEngine(model, RolloutConfig(cpu_kv_cache_gb=args.kv_cache_gb), "bfloat16", 1024, "cpu")
    beside = measure("update, vLLM engine built in the process")
    print(f"ratio beside / alone = {beside / alone:.2f}x")
    sys.exit(0)
