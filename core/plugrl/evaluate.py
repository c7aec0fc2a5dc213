"""Validation: generate for held-out prompts, score them, report per data_source.

The same code serves `plugrl eval` and validation during training (`trainer.test_freq`).
"""

from __future__ import annotations

import logging
import tempfile
from collections import defaultdict
from math import comb
from typing import Any

from plugrl.prompts import EncodedPrompt
from plugrl.rollout import SamplingSettings
from plugrl.rollout.play import conversation_metrics, conversation_row, generate_scored

log = logging.getLogger("plugrl.evaluate")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021 (the Codex paper), for ``c`` correct of ``n`` samples:

        pass@k = 1 - C(n - c, k) / C(n, k)

    the chance that at least one of ``k`` samples drawn without replacement from the ``n`` is correct
    (1.0 when ``n - c < k``: every draw of ``k`` holds a correct one). Averaged over prompts it is the
    reported ``pass@k``. E.g. n=4, c=1: pass@1 = 0.25, pass@2 = 1 - 3/6 = 0.5, pass@4 = 1.0.
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

    Per data source: ``score_mean`` (mean reward), ``accuracy`` (share of samples with reward >=
    ``threshold``), ``pass@k`` for every k of :func:`pass_at_k_ks` (1, 2, 4, ... up to n, and n:
    unbiased, over each prompt's n samples, averaged over prompts) and ``response_length_mean`` (tokens).
    With ``player`` (:class:`plugrl.rollout.play.EpisodePlayer`), whole multi-turn episodes: their rows hold
    the conversations, and the metrics gain the training step's ``env/*`` ones as ``val/env/*``.
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


def evaluate_cli(target: str, data: list[str] | None, overrides: list[str], **options: Any) -> dict[str, float]:
    """`plugrl eval`: a config's model, or a checkpoint with its run's config, on validation data (``options``:
    ``n``, ``temperature``, ``split``). A LoRA checkpoint's adapter is merged into the run's base model in a
    temporary folder, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="plugrl_merged_") as scratch:
        return _evaluate(target, data, overrides, scratch=scratch, **options)


def _evaluate(
    target: str,
    data: list[str] | None,
    overrides: list[str],
    *,
    n: int | None,
    temperature: float | None,
    split: str | None,
    scratch: str,
) -> dict[str, float]:
    from pathlib import Path

    import torch

    from plugrl.config import ConfigError, load_config
    from plugrl.plugins import PluginRun
    from plugrl.precision import resolve_config_dtypes
    from plugrl.rewards import RewardRunner
    from plugrl.rollout import make_engine, sampling_settings
    from plugrl.startup import check_run, load_processor, load_prompts, load_tokenizer

    path = Path(target)
    if path.is_dir():  # RUN_DIR/checkpoints/step_N: the run's resolved config, the checkpoint's policy
        from plugrl.lora import base_model_path, merge_to_folder, run_config_path

        run_config = run_config_path(path)
        adapter = path / "policy_adapter"  # a LoRA run's checkpoint: the adapter, merged into the run's base model
        if not ((path / "policy").is_dir() or adapter.is_dir()) or not run_config.is_file():
            raise ConfigError(
                f"{path} is not a checkpoint (no policy/ or policy_adapter/ in it, or no config.yaml two levels up)"
            )
        policy = path / "policy"
        if not policy.is_dir():
            base = base_model_path(path, overrides)
            policy = merge_to_folder(base, adapter, Path(scratch))
        merged = [] if policy == path / "policy" else [f"model.tokenizer_path={policy}"]  # it holds the tokenizer
        cfg = load_config(run_config, [*merged, *overrides, f"model.path={policy}"])
    else:
        cfg = load_config(path, overrides)
    # the trainer's checks, before anything loads (a run's own config.yaml: its ignored keys were named in training)
    registry = check_run(cfg, training=False, warn_ignored=not path.is_dir()).registry
    sampling = sampling_settings(cfg, "validate", n=n, temperature=temperature)
    tokenizer = load_tokenizer(cfg)
    processor = load_processor(cfg)  # a vision-language model's (a checkpoint holds it beside the weights)
    prompts, _ = load_prompts(cfg, registry, tokenizer, split=split, files=data, validation=True, processor=processor)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    resolve_config_dtypes(cfg, device)
    if cfg.rollout.mode == "server":  # the servers hold whatever they were last given, not this model
        log.info("rollout.mode=server is for training: plugrl eval generates with %s in this process", cfg.model.path)
    engine = make_engine(
        cfg.rollout.name,
        registry.engines,
        model_path=cfg.model.path,
        cfg=cfg.rollout,
        dtype=cfg.rollout.dtype,
        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
        device=device,
        tokenizer=tokenizer,
        trainer_seed=cfg.trainer.seed,
        syncs_weights=False,  # evaluation reloads no weights: one process may drive a TP engine
        hf_overrides=cfg.model.override_config,
    )
    player = None
    try:
        if cfg.multi_turn:
            from plugrl.rollout.play import make_episode_runner

            player = make_episode_runner(cfg, registry, engine, tokenizer, processor)
        with PluginRun(registry, cfg, None), RewardRunner(registry, cfg.reward) as rewards:
            metrics, _ = validate(
                engine,
                tokenizer,
                prompts,
                rewards,
                sampling,
                prefill=cfg.data.prefill,
                threshold=cfg.trainer.val_correct_threshold,
                player=player,
            )
    finally:
        if player is not None:
            player.close()
        engine.close()
    return metrics
