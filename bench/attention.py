"""Shared-prefix attention (plugrl-attention) against SDPA with the dense mask, one layer, forward + backward.

One group of a 122-token prompt and 8 responses (SmolLM2-135M's 9 query heads, 3 key/value heads, head dim 64, bf16
inputs as under autocast), for two response-length mixes: the vs_trl step's (30-128 tokens) and a 512-token one
(80-512). For each: the median time of SDPA with the [L, L] mask (the baseline, run in the same process), and of
the shared-prefix kernel at several tile sizes (``untiled``: one tile per response, padded to the longest), with
the ratio to the baseline.

    python bench/attention.py [--repeats 10] [--tiles 32,64,128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from plugrl.attention import TILE, PrefixGroup, dense_mask
from plugrl_attention import shared_prefix_attention

MIXES = {
    "30-128 tokens": (128, 40, 60, 80, 128, 100, 30, 128),
    "80-512 tokens": (512, 100, 200, 512, 150, 300, 80, 512),
}


def _timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _compare(name: str, lens: tuple[int, ...], tiles: list[int], repeats: int) -> None:
    length = 122 + sum(lens)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, length, 64, generator=gen).bfloat16().requires_grad_()
    k, v = (torch.randn(1, 3, length, 64, generator=gen).bfloat16().requires_grad_() for _ in range(2))
    grad = torch.randn(1, 9, length, 64, generator=gen).bfloat16()
    mask = dense_mask([PrefixGroup(0, 122, lens)], length)[None, None]

    def dense():
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True).backward(grad)

    def tiled(size):
        # a new group each call: its tiles are built once per forward, as in training
        shared_prefix_attention(q, k, v, [PrefixGroup(0, 122, lens, tile=size)], 0.125).backward(grad)

    base = _timed(dense, repeats)
    print(f"\n{name} ({length} tokens in the row), forward + backward of one layer:")
    print(f"  dense-mask SDPA (baseline)   {base * 1e3:7.1f} ms   1.00x")
    longest = max(lens)
    for size in sorted({*(t for t in tiles if t < longest), longest}):
        label = "untiled" if size == longest else f"tile {size}"
        t = _timed(lambda size=size: tiled(size), repeats)
        print(f"  shared prefix, {label:<12}  {t * 1e3:7.1f} ms   {base / t:.2f}x faster")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--tiles", default="32,64,128", help=f"tile sizes to time (plugrl's default: {TILE})")
    args = ap.parse_args()
    tiles = [int(t) for t in args.tiles.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; default tile {TILE}")
    for name, lens in MIXES.items():
        _compare(name, lens, tiles, args.repeats)


if __name__ == "__main__":
    main()
