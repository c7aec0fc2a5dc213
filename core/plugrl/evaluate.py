"""Validation: generate for held-out prompts, score them, report per data_source.

The same code serves validation during training (`trainer.test_freq`) and `plugrl eval`.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb
from typing import Any

from plugrl.prompts import EncodedPrompt
from plugrl.rollout import SamplingSettings
from plugrl.rollout.play import conversation_metrics, conversation_row, generate_scored


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021 (the Codex paper) for ``c`` correct of ``n`` samples,
    ``1 - C(n - c, k) / C(n, k)``: the chance that at least one of ``k`` samples drawn without replacement from the
    ``n`` is correct (1.0 when ``n - c < k``). E.g. n=4, c=1: pass@1 = 0.25, pass@2 = 1 - 3/6 = 0.5, pass@4 = 1.0.
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"{c} correct of {n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_at_k_ks(n: int) -> list[int]:
    """The k for which pass@k is reported with ``n`` samples a prompt: the powers of 2 up to ``n``, and
    ``n`` itself (n=1: [1]; n=4: [1, 2, 4]; n=6: [1, 2, 4, 6])."""
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample, got n={n}")
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else [*ks, n]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def validate(
    engine,
    tokenizer,
    prompts: list[EncodedPrompt],
    rewards,
    sampling: SamplingSettings,
    *,
    prefill: str | None,
    threshold: float,
    player: Any = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics (``val/<data_source>/...`` and ``val/all/...``) and one row per sample.

    Per data source: ``score_mean`` (mean reward), ``accuracy`` (share of samples with reward >= ``threshold``),
    ``pass@k`` for every k of :func:`pass_at_k_ks` (averaged over prompts) and ``response_length_mean`` (tokens).
    With ``player`` (:class:`plugrl.rollout.play.EpisodePlayer`), whole multi-turn episodes: their rows hold the
    conversations, and the metrics gain the training step's ``env/*`` ones as ``val/env/*``.
    """
    engine.wake_up()
    flat, texts, scored = generate_scored(engine, tokenizer, prompts, rewards, sampling, prefill=prefill, player=player)
    engine.sleep()
    n = sampling.n
    ks = pass_at_k_ks(n)
    by_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    rows = []
    for i, prompt in enumerate(prompts):
        scores = scored.scores[i * n : (i + 1) * n]
        correct = sum(s >= threshold for s in scores)
        for key in (prompt.sample.data_source, "all"):
            acc = by_source[key]
            acc["score"] += scores
            acc["correct"] += [float(s >= threshold) for s in scores]
            acc["length"] += [len(r.response_ids) for _, r, _ in flat[i * n : (i + 1) * n]]
            for k in ks:
                acc[f"pass@{k}"].append(pass_at_k(n, correct, k))
        for j in range(i * n, (i + 1) * n):
            rows.append(
                {
                    "prompt": prompt.text,
                    "completion": texts[j],
                    "data_source": prompt.sample.data_source,
                    "ground_truth": prompt.sample.ground_truth,
                    "reward": scored.scores[j],
                    "details": scored.details[j],
                    **({} if flat[j][2] is None else conversation_row(flat[j][2], flat[j][1], tokenizer)),
                }
            )
    metrics: dict[str, float] = {}
    for source, acc in by_source.items():
        metrics[f"val/{source}/score_mean"] = _mean(acc["score"])
        metrics[f"val/{source}/accuracy"] = _mean(acc["correct"])
        for k in ks:
            metrics[f"val/{source}/pass@{k}"] = _mean(acc[f"pass@{k}"])
        metrics[f"val/{source}/response_length_mean"] = _mean(acc["length"])
    metrics["val/all/prompts"] = float(len(prompts))
    conversations = [c for _, _, c in flat if c is not None]
    if conversations:  # episodes: their turns, tool calls, endings and environment info, as in training
        metrics.update({f"val/{key}": value for key, value in conversation_metrics(conversations).items()})
    return metrics, rows
