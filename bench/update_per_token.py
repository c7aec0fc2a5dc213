"""`PolicyModel.update` time per distinct token as the batch grows, in one process (docs/performance.md).

    python bench/update_per_token.py [--groups 2,8] [--max-response 128] [--budget 1024] [--dtype auto]

For each count of groups G: G prompts of 122 random tokens, each with 8 responses of random length in
[max_response / 4, max_response] (the same generator seed, so a larger batch starts with the smaller one's
groups), SmolLM2-135M-Instruct, micro-batches by token budget. One warm-up update, then ``--repeats`` measured
ones; prints the best time, ms per distinct token (responses + each prompt once: what the update computes) and
its ratio to the first G, and the page faults of each update. A cost that grows faster than the tokens shows as
a ratio above 1.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

if __name__ == "__main__":
    import torch

    from plugrl.actor import PolicyModel, TrainBatch
    from plugrl.config import ActorConfig, ModelConfig
    from plugrl.hostmem import keep_freed_memory
    from plugrl.models import resolve_model_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="2,8", help="group counts, comma-separated (default 2,8)")
    ap.add_argument("--max-response", type=int, default=128)
    ap.add_argument("--budget", type=int, default=1024, help="actor.ppo_max_token_len_per_gpu")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    keep_freed_memory()  # as the trainer does by default

    model = resolve_model_path("local:SmolLM2-135M-Instruct")
    policy = PolicyModel(
        model,
        ModelConfig(path=model, dtype=args.dtype),
        ActorConfig(optim={"lr": 1e-6}, ppo_max_token_len_per_gpu=args.budget),
        torch.device("cpu"),
    )

    def make(groups: int) -> TrainBatch:
        g = torch.Generator().manual_seed(0)
        seqs, plens, gids = [], [], []
        for p in range(groups):
            prompt = torch.randint(5, 40000, (122,), generator=g).tolist()
            for _ in range(8):
                r = int(torch.randint(args.max_response // 4, args.max_response + 1, (1,), generator=g))
                seqs.append(prompt + torch.randint(5, 40000, (r,), generator=g).tolist())
                plens.append(122)
                gids.append(p)
        batch = TrainBatch.from_sequences(seqs, plens, group_ids=gids)
        batch.advantages = torch.randn(len(seqs), 1, generator=g) * batch.response_mask
        return batch

    def update(batch: TrainBatch) -> tuple[float, int]:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter()
        policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=args.max_response)
        return time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    first = None
    for groups in (int(x) for x in args.groups.split(",")):
        batch = make(groups)
        distinct = sum(batch.response_lens) + 122 * groups
        micro = len(policy._micro_batches(batch, list(range(len(batch))), args.budget))
        update(batch)  # warm-up
        runs = [update(batch) for _ in range(args.repeats)]
        best = min(t for t, _ in runs)
        per_token = best / distinct
        first = first or per_token
        print(
            f"{groups} groups: {distinct} distinct tokens in {micro} micro-batches; update {best:.2f} s "
            f"(runs {', '.join(f'{t:.2f}' for t, _ in runs)}), {1e3 * per_token:.2f} ms/distinct token "
            f"({per_token / first:.2f}x the first), page faults {[f for _, f in runs]}",
            flush=True,
        )
    sys.exit(0)
