"""``plugrl eval TARGET [key=value ...]``: a config's model, or a checkpoint with its run's config, on validation
data: accuracy, pass@k and response length per data source (:func:`plugrl.evaluate.validate`, what the trainer
validates with), printed as a table and, with ``--out``, written as JSON.

TARGET is a run config (YAML) or a checkpoint (``RUN_DIR/checkpoints/step_N``): its run's ``config.yaml`` with the
checkpoint's policy; a LoRA checkpoint's adapter is merged into the run's base model in a temporary folder, removed
at the end. The start-up is the trainer's (:func:`plugrl.startup.check_run`): every check that needs no model comes
before any model loads.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("plugrl.evaluate")


def evaluate_cli(target: str, data: list[str] | None, overrides: list[str], **options: Any) -> dict[str, float]:
    """`plugrl eval`: a config's model, or a checkpoint with its run's config, on validation data (``options``:
    ``n``, ``temperature``, ``split``). A LoRA checkpoint's adapter is merged into the run's base model in a
    temporary folder, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="plugrl_merged_") as scratch:
        return _evaluate(target, data, overrides, scratch=scratch, **options)


def _config_of(path: Path, overrides: list[str], scratch: str) -> Any:
    """The run config of TARGET: a checkpoint's run's ``config.yaml`` with its policy as ``model.path`` (a LoRA
    adapter merged into the base model under ``scratch``), or the YAML itself."""
    from plugrl.config import ConfigError, load_config

    if not path.is_dir():
        return load_config(path, overrides)
    # RUN_DIR/checkpoints/step_N: the run's resolved config, the checkpoint's policy
    from plugrl.model_adapters import base_model_path, merge_to_folder, run_config_path

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
    return load_config(run_config, [*merged, *overrides, f"model.path={policy}"], run_record=True)


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
    import torch

    from plugrl.evaluate import validate
    from plugrl.plugins import PluginRun
    from plugrl.precision import resolve_config_dtypes
    from plugrl.rewards import RewardRunner
    from plugrl.rollout import make_engine, sampling_settings
    from plugrl.startup import check_run, load_processor, load_prompts, load_tokenizer

    path = Path(target)
    cfg = _config_of(path, overrides, scratch)
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


def _run(args: argparse.Namespace) -> int:
    metrics = evaluate_cli(
        args.target, args.data, args.overrides, n=args.n, temperature=args.temperature, split=args.split
    )
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps(metrics, indent=2))
        print(f"wrote {args.out}")
    return 0


def register(commands: Any) -> None:
    """``plugrl eval``: added to the kernel's command line (entry point ``eval`` in group plugrl.commands)."""
    from plugrl.cli import VERBOSE_HELP

    e = commands.add_parser("eval", help="validate a config's model or a checkpoint: accuracy, pass@k, length")
    e.add_argument("target", help="a run config (YAML) or a checkpoint directory (RUN_DIR/checkpoints/step_N)")
    e.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.name=hf")
    e.add_argument(
        "--data",
        nargs="*",
        default=None,
        help="validation files (default: data.val_files, or the config's dataset with data.val_split)",
    )
    e.add_argument("--split", default=None, help="split to read (default: data.val_split)")
    e.add_argument("--n", type=int, default=None, help="samples per prompt (default: rollout.val_kwargs.n)")
    e.add_argument("--temperature", type=float, default=None, help="default: rollout.val_kwargs.temperature (0)")
    e.add_argument("--out", default=None, help="also write the metrics as JSON here")
    e.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    e.set_defaults(fn=_run)
