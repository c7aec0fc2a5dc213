"""Shared prompt prefixes on GPUs: the work each way of packing a GRPO group costs, counted, not timed.

A GPU is not here, so this counts what decides the choice on one (``actor.share_prompt_prefix``): for a
group of n responses behind one prompt, per decoder layer and forward,

- **tokens** through the projections and the MLP (the bulk of a step's FLOPs at these lengths);
- **attention tiles** of 128 x 128 (query x key) that FlexAttention computes: the tiles its block mask
  leaves non-empty (``plugrl_attention.prefix_block_mask`` of plugrl-attention, the mask the CUDA path uses);
- **mask bytes** that a dense ``[L, L]`` mask would need (the masked-SDPA alternative, which also computes
  every tile).

for three packings: the prompt shared (one copy, FlexAttention), each response with its own prompt copy
(causal per sequence: what verl and TRL compute), and the shared row through masked SDPA. The FLOPs column
weighs them for a model's shape (``--model``: Qwen2.5-7B by default) with forward FLOPs of ``2 x params`` a
token and ``4 x head_dim x heads`` per attended (query, key) pair; ratios are against per-sequence packing.

    python bench/prefix_sharing.py [--model qwen2.5-7b] [--json bench/results/prefix_sharing_DATE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from plugrl.attention import PrefixGroup
from plugrl_attention import FLEX_BLOCK, prefix_block_mask

# (name, prompt tokens, response tokens, responses per prompt, prompts per micro-batch)
CASES = [
    ("gsm8k-like", 150, 300, 8, 4),
    ("math, long answers", 300, 2000, 16, 1),
    ("DAPO 16 x 4k", 200, 4000, 16, 1),
    ("long prompt (RAG)", 3000, 500, 8, 1),
]
# params, layers, heads, head dim (config.json of each model; params from its shapes, docs/scaling.md)
MODELS = {
    "qwen2.5-1.5b": (1.54e9, 28, 12, 128),
    "qwen2.5-7b": (7.62e9, 28, 28, 128),
    "qwen2.5-32b": (32.8e9, 64, 40, 128),
}


def layout(prompt: int, response: int, n: int, prompts: int, shared: bool) -> list[PrefixGroup]:
    """The packed row of ``prompts`` groups: one PrefixGroup per group when shared, one per sequence if not."""
    groups, start = [], 0
    for _ in range(prompts):
        for rlens in [(response,) * n] if shared else [(response,)] * n:
            groups.append(PrefixGroup(start, prompt, rlens))
            start += groups[-1].length
    return groups


def tiles(groups: list[PrefixGroup]) -> tuple[int, int]:
    """(non-empty tiles FlexAttention computes, allowed (query, key) pairs) of a row laid out as ``groups``."""
    length = sum(g.length for g in groups)
    mask = prefix_block_mask(groups, length, "cpu")
    computed = int(mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum())
    pairs = 0
    for g in groups:  # causal prompt, then each response: the prompt plus itself causally
        pairs += g.prompt_len * (g.prompt_len + 1) // 2
        pairs += sum(r * g.prompt_len + r * (r + 1) // 2 for r in g.response_lens)
    return computed, pairs


def measure(model: str) -> list[dict]:
    params, layers, heads, head_dim = MODELS[model]
    rows = []
    for name, p, r, n, k in CASES:
        per_seq = layout(p, r, n, k, shared=False)
        shared = layout(p, r, n, k, shared=True)
        out = {"case": name, "prompt": p, "response": r, "n": n, "prompts": k}
        for label, groups in (("per_sequence", per_seq), ("shared_flex", shared)):
            length = sum(g.length for g in groups)
            computed, pairs = tiles(groups)
            flops = 2 * params * length + 4 * head_dim * heads * layers * computed * FLEX_BLOCK**2
            out[label] = {"tokens": length, "tiles": computed, "pairs": pairs, "fwd_tflop": flops / 1e12}
        length = out["shared_flex"]["tokens"]
        dense_tiles = math.ceil(length / FLEX_BLOCK) ** 2  # every tile of the row
        out["shared_dense_sdpa"] = {
            "tokens": length,
            "tiles": dense_tiles,
            "mask_mib": length * length / 2**20,  # one bool per (query, key)
            "fwd_tflop": (2 * params * length + 4 * head_dim * heads * layers * dense_tiles * FLEX_BLOCK**2) / 1e12,
        }
        rows.append(out)
    return rows


def table(rows: list[dict], model: str) -> str:
    lines = [
        f"forward FLOPs per micro-batch for {model} (ratio to per-sequence packing); tiles {FLEX_BLOCK}x{FLEX_BLOCK}",
        "| case | P / R / n x prompts | per sequence: tokens, tiles, TFLOP | shared + FlexAttention | "
        "shared + masked SDPA (mask MiB) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        base = r["per_sequence"]["fwd_tflop"]
        ps, sf, sd = r["per_sequence"], r["shared_flex"], r["shared_dense_sdpa"]
        lines.append(
            f"| {r['case']} | {r['prompt']} / {r['response']} / {r['n']} x {r['prompts']} | "
            f"{ps['tokens']}, {ps['tiles']}, {base:.1f} | "
            f"{sf['tokens']}, {sf['tiles']}, {sf['fwd_tflop']:.1f} ({sf['fwd_tflop'] / base:.2f}x) | "
            f"{sd['tiles']} tiles, {sd['fwd_tflop']:.1f} ({sd['fwd_tflop'] / base:.2f}x; {sd['mask_mib']:.0f} MiB) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-7b")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = measure(args.model)
    print(table(rows, args.model))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "block": FLEX_BLOCK, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
