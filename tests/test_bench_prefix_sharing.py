"""bench/prefix_sharing.py counts what it says: tokens, FlexAttention tiles and attended pairs of each packing."""

from __future__ import annotations

from bench_scripts import load
from plugrl.attention import dense_mask


def test_counts_match_the_layouts_by_hand_and_the_dense_mask():
    bench = load("prefix_sharing")
    shared = bench.layout(5, 7, 3, 2, shared=True)
    per_seq = bench.layout(5, 7, 3, 2, shared=False)
    assert sum(g.length for g in shared) == 2 * (5 + 3 * 7)  # one prompt copy per group
    assert sum(g.length for g in per_seq) == 2 * 3 * (5 + 7)  # one per response
    for groups in (shared, per_seq):
        length = sum(g.length for g in groups)
        computed, pairs = bench.tiles(groups)
        assert pairs == int(dense_mask(groups, length).sum())
        assert computed == 1  # 52 or 72 tokens: one 128 x 128 tile


def test_sharing_a_long_prompt_saves_most_of_the_work_and_a_dense_mask_costs_every_tile():
    bench = load("prefix_sharing")
    rows = {r["case"]: r for r in bench.measure("qwen2.5-1.5b")}
    rag = rows["long prompt (RAG)"]
    assert rag["shared_flex"]["tokens"] == 3000 + 8 * 500 and rag["per_sequence"]["tokens"] == 8 * 3500
    assert rag["shared_flex"]["fwd_tflop"] < 0.3 * rag["per_sequence"]["fwd_tflop"]
    dapo = rows["DAPO 16 x 4k"]
    assert dapo["shared_dense_sdpa"]["tiles"] == 502**2  # ceil(64200 / 128) tiles a side
    assert dapo["shared_dense_sdpa"]["fwd_tflop"] > 2 * dapo["per_sequence"]["fwd_tflop"]
    assert dapo["shared_flex"]["fwd_tflop"] < dapo["per_sequence"]["fwd_tflop"]
    assert "| DAPO 16 x 4k | 200 / 4000 / 16 x 1 |" in bench.table(list(rows.values()), "qwen2.5-1.5b")
