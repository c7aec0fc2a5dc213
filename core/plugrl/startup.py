"""Start-up shared by ``plugrl train`` and ``plugrl eval``: every check that can fail fast, then the
tokenizer and the prompts, in one order, so the two commands cannot drift apart.

Plugin and config checks come first: a mistake must cost seconds, not a model load (resolving a
``local:`` model path may convert one), nor a process group. All data checks follow, before any model
is loaded or anything generated.
"""

from __future__ import annotations

import functools
import logging
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugrl.config import Config, ConfigError, ignored_keys
from plugrl.data import DataError, load_samples
from plugrl.dist import launched_world_size
from plugrl.episodes import dapo_settings, dynamic_sampling
from plugrl.models import check_context_length, resolve_model_path
from plugrl.parallel import check_installed as check_tensor_parallel_installed
from plugrl.plugin_choice import Installed, Needs, choose_plugins, describe_choice, load_installed
from plugrl.plugins import (
    check_algorithm,
    check_config,
    check_policy_loss,
    configure_plugins,
    load_plugins,
)
from plugrl.policy_losses import check_agg_mode
from plugrl.prompts import EncodedPrompt, encode_prompts
from plugrl.readers import start_notes
from plugrl.rewards import check_routes
from plugrl.rewards.routing import ground_truth_optional, rewards_for
from plugrl.rollout.episode_kit import check_installed as check_episode_runner_installed
from plugrl.rollout.episode_kit import run_kit
from plugrl.rollout.routing import prompt_from_environment, scored_by_environment
from plugrl.rollouts_ahead import kit as off_policy_kit
from plugrl.specs import EstimatorSpec, PolicyLossSpec, Registry

log = logging.getLogger("plugrl.startup")


@dataclass
class RunPlugins:
    """What the checked plugins provide to a run: the registry, and for training the estimator and the
    policy loss the config names (None for evaluation, which needs neither)."""

    registry: Registry
    estimator: EstimatorSpec | None = None
    policy_loss: PolicyLossSpec | None = None


def add_reader_rewards(cfg: Config, registry: Registry) -> None:
    """The reward functions a config names in verl's or TRL's way (``reward.custom_reward_function.path``,
    ``reward.reward_funcs``: plugrl-compat's keys), put into ``registry`` by the installed config readers."""
    from plugrl.readers import installed_readers

    for reader in installed_readers():
        reader.add_rewards(cfg, registry)


def check_run(cfg: Config, *, training: bool, warn_ignored: bool = True) -> RunPlugins:
    """Load the plugins (and those they ask for) and check everything that needs no model: the estimator and policy
    loss (training), every plugin-owned option and every plugin's own check, the model and tokenizer
    paths (``local:`` names resolved in ``cfg``), the context length, and the rollout layout.
    ``warn_ignored``: name the keys accepted but not acted on (false for a run's own config.yaml, which holds
    every key and was named when the run started). Raises :class:`ConfigError` or
    :class:`plugrl.plugins.PluginError` naming the key and the fix."""
    registry = _load_run_plugins(cfg, training=training)
    # each plugin settles its own keys; one may need another plugin for this run (then added to `plugins:`)
    registry = configure_plugins(cfg, registry, training=training)
    # verl's custom_reward_function scores every sample, TRL's reward_funcs too: their readers load them
    add_reader_rewards(cfg, registry)
    run = RunPlugins(registry)
    check_episode_runner_installed(cfg)  # multi-turn episodes (environment, rollout.tools): plugrl-multiturn's
    if training:
        run.estimator = check_algorithm(cfg.algorithm, registry)
        check_critic_keys(cfg, run.estimator, registry)
        check_tensor_parallel_installed(cfg)  # actor.tp_size > 1 is plugrl-tensor-parallel's: named now
        run.policy_loss = check_policy_loss(cfg.actor.loss_mode, registry)
        check_agg_mode(cfg.actor, run.policy_loss)
        from plugrl import rollout_correction  # its package installed, a loss that takes its weights

        rollout_correction.check_run(cfg, run.policy_loss, registry.policy_losses)
        if cfg.multi_turn and cfg.rollout.step_wise:
            check_step_wise(cfg, run.estimator, registry)
        steps_ahead = getattr(cfg.trainer, "off_policy_steps", 0)  # plugrl-off-policy's key
        if steps_ahead:  # what cannot run beside a generation in flight: plugrl-off-policy's check
            off_policy_kit(steps_ahead).check(cfg, run.estimator)
    check_engine(cfg, registry)
    check_config(cfg, registry, training=training)  # declared plugin options, then each plugin's plugrl_check_config
    ignored = ignored_keys(cfg)
    if ignored and warn_ignored:  # accepted (verl's commands load as written, a run's keys stay), but never silent
        log.warning("set, but not acted on: %s", "; ".join(ignored))
    for note in start_notes(cfg) if warn_ignored else []:  # a verl script's: the verl defaults plugrl does not take
        log.warning("%s", note)
    cfg.model.path = _model_path(cfg.model.path, "model.path")
    if cfg.model.tokenizer_path:
        cfg.model.tokenizer_path = _model_path(cfg.model.tokenizer_path, "model.tokenizer_path")
    check_context_length(
        cfg.model.path, cfg.data.max_prompt_length, cfg.data.max_response_length, cfg.model.override_config
    )
    episodes = run_kit(cfg)  # installed for a multi-turn run: checked above
    if episodes is not None:  # what multi-turn episodes cannot honour: plugrl-multiturn's check
        episodes.check_config(cfg)
    if cfg.rollout.name == "vllm" and training:  # a layout the engine cannot drive fails before any model loads
        from plugrl.rollout.vllm_engine import check_rollout_parallel

        check_rollout_parallel(cfg.rollout, launched_world_size())
    return run


def _load_run_plugins(cfg: Config, *, training: bool) -> Registry:
    """The plugins ``plugins:`` names; when it is not set, the installed ones that provide what the run names
    (:mod:`plugrl.plugin_choice`), written back to ``cfg.plugins`` and logged."""
    if "plugins" in cfg.model_fields_set:
        return load_plugins(cfg.plugins)
    installed = load_installed()
    names, chosen = choose_plugins(installed, run_needs(cfg, installed, training=training), cfg.plugin_preference)
    cfg.plugins = names
    log.info("plugins not set: loaded the installed plugins this run needs: %s", describe_choice(chosen))
    return load_plugins(names)


def run_needs(cfg: Config, installed: Installed, *, training: bool) -> Needs:
    """What the run names that a plugin must provide, and the data sources of its data (its rows are read)."""
    needs = Needs()
    if training:
        needs.add("advantage estimator", cfg.algorithm.adv_estimator, "algorithm.adv_estimator")
        needs.add("policy loss", cfg.actor.loss_mode, "actor.loss_mode")
    if cfg.rollout.mode == "colocate":
        needs.add("rollout engine", cfg.rollout.name, "rollout.name")
    needs.add("template", cfg.data.template, "data.template")
    needs.add("dataset", cfg.data.dataset, "data.dataset")
    envs = [cfg.environment] if isinstance(cfg.environment, str) else list((cfg.environment or {}).values())
    for env in envs:
        needs.add("environment", env.split(":", 1)[0], "environment")  # a family `lib:<id>` is the plugin's `lib`
    for tool in getattr(cfg.rollout, "tools", ()):  # plugrl-multiturn's key
        needs.add("tool", tool, "rollout.tools")
    for name in [cfg.reward.default, *cfg.reward.extra]:
        needs.add("reward", name, "reward.default" if name == cfg.reward.default else "reward.extra")
    needs.data_sources = _data_sources(cfg, installed, training=training)
    return needs


def _data_sources(cfg: Config, installed: Installed, *, training: bool) -> set[str]:
    """Every data_source of the training data (and the validation data a training run reads)."""
    provider = next((r for r in installed.registries.values() if cfg.data.dataset in r.datasets), Registry())
    sources = set()
    reads = [dict(split=None, files=None)]
    if training and (cfg.data.val_files or (cfg.data.dataset and cfg.trainer.test_freq > 0)):
        reads.append(dict(split=cfg.data.val_split, files=cfg.data.val_files or None))
    for read in reads:
        try:
            samples, _ = load_samples(cfg.data, provider, ground_truth_optional=lambda _ds: True, **read)
        except DataError:
            continue  # the data's own problems are reported, naming the row, when the run reads it for real
        sources |= {s.data_source for s in samples}
    return sources


def check_engine(cfg: Config, registry: Registry) -> None:
    """``rollout.name`` names a registered rollout engine (the kernel's vllm and hf, or a plugin's), or a
    :class:`ConfigError` naming the ones there are."""
    if cfg.rollout.mode == "server" and "server" not in registry.engines:
        raise ConfigError(
            "rollout.mode=server: the rollout servers are in the package plugrl-rollout-servers, which is not "
            "installed: pip install plugrl-rollout-servers (in a plugrl checkout: "
            "pip install -e plugins/rollout_servers)"
        )
    if cfg.rollout.mode == "colocate" and cfg.rollout.name == "server":
        raise ConfigError("rollout.name=server is the engine of rollout.mode=server; set rollout.mode=server")
    if cfg.rollout.mode == "colocate" and cfg.rollout.name not in registry.engines:
        known = ", ".join(f"{n} ({s.plugin})" for n, s in sorted(registry.engines.items()))
        raise ConfigError(
            f"rollout.name {cfg.rollout.name!r} is not a registered rollout engine; registered: {known}. A plugin "
            "registers one with @plugrl.rollout_engine (docs/plugins.md)"
        )


def check_critic_keys(cfg: Config, estimator: EstimatorSpec, registry: Registry) -> None:
    """``critic.*`` set for an estimator that trains no critic would be ignored: a ConfigError naming the
    estimators that use one. (verl's default estimator is ``gae``: a verl PPO command that sets critic options
    and no estimator means GAE with a critic, never GRPO with the options dropped.)"""
    written = sorted(f"critic.{key}" for key in cfg.critic.model_fields_set)
    if estimator.needs_critic or not written:
        return
    users = ", ".join(sorted(name for name, e in registry.estimators.items() if e.needs_critic)) or "none loaded"
    raise ConfigError(
        f"{', '.join(written)} set, but algorithm.adv_estimator {estimator.name!r} trains no critic, so they would "
        f"be ignored: set algorithm.adv_estimator to an estimator that uses one ({users}; verl's default is gae), "
        "or remove the critic keys"
    )


def check_step_wise(cfg: Config, estimator: EstimatorSpec, registry: Registry | None = None) -> None:
    """Step-wise training gives every turn its episode's advantage (the estimator's, over each episode's last
    turn): estimators and settings that need per-token values across a whole episode cannot run so. ``registry``:
    where to find the estimators to suggest instead (those registered without a critic)."""
    problems = []
    if estimator.needs_critic:
        outcome = sorted(name for name, e in (registry.estimators if registry else {}).items() if not e.needs_critic)
        which = f" ({', '.join(outcome)})" if outcome else ""
        problems.append(
            f"algorithm.adv_estimator {estimator.name!r} learns token values along one sequence per episode; "
            f"step-wise samples have none: use an outcome estimator{which} or set rollout.step_wise false"
        )
    if cfg.algorithm.use_kl_in_reward:
        problems.append(
            "algorithm.use_kl_in_reward puts a KL penalty on every token of an episode's sequence; step-wise samples "
            "carry their episode's advantage instead: use actor.use_kl_loss, or set rollout.step_wise false"
        )
    if problems:
        raise ConfigError("rollout.step_wise is true, but " + "; ".join(problems))


_HUB_NAME = re.compile(r"^[\w.-]+/[\w.-]+$")  # organisation/name, as the Hugging Face Hub spells models


def _model_path(path: str, key: str) -> str:
    """``path`` resolved (a ``local:`` name prepared); a :class:`ConfigError` naming ``key`` when it names no
    local model, or a directory that does not exist (a Hub name, ``org/name``, is left to transformers)."""
    try:
        resolved = resolve_model_path(path)
    except ValueError as e:
        raise ConfigError(str(e).replace("model.path", key, 1)) from None
    if Path(resolved).exists() or (_HUB_NAME.match(path) and not path.startswith((".", "~", "/"))):
        return resolved
    raise ConfigError(
        f"{key} {path!r} does not exist: give a model directory (a Hugging Face save), an organisation/name "
        "from the Hub, or local:SmolLM2-135M-Instruct"
    )


def output_dir_problem(run_dir: Path) -> str | None:
    """Why the run directory cannot be created or written (a file in the way, no permission, a read-only or
    immutable directory), as one sentence naming ``trainer.output_dir``; None when it can. Tries it: makes
    and removes a temporary file in the run directory, or in its nearest existing parent."""
    where = Path(run_dir)
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        return (
            f"trainer.output_dir: {where} is a file, so the run directory {run_dir} cannot be created there; "
            "move the file or choose another trainer.output_dir / trainer.experiment_name"
        )
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as e:
        return (
            f"trainer.output_dir: cannot write in {where} ({e.strerror or e}), so the run directory {run_dir} "
            "cannot be made or written; choose a writable trainer.output_dir"
        )
    return None


def load_tokenizer(cfg: Config) -> Any:
    """The tokenizer of ``model.tokenizer_path``, else of ``model.path`` (both resolved by :func:`check_run`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)


def load_processor(cfg: Config) -> Any:
    """A vision-language model's processor (plugrl-vision's, from ``model.tokenizer_path`` or ``model.path``), or
    None for a text model (read from its config; no weights load). A vision-language model, or ``data.image_key``
    set, without plugrl-vision installed is a :class:`ConfigError` naming the package."""
    from transformers import AutoConfig

    from plugrl.models import is_vision_model
    from plugrl.vlm import NoVisionSupport, vision_support

    config = AutoConfig.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    vlm = is_vision_model(config)
    if vlm or "image_key" in cfg.data.model_fields_set:
        try:
            support = vision_support()
        except NoVisionSupport as e:
            key = f"model.path={cfg.model.path} is a vision-language model" if vlm else "data.image_key is set"
            raise ConfigError(f"{key}: {e}") from None
    if not vlm:
        if (
            getattr(cfg.actor, "freeze_vision_tower", True) is False
            and "freeze_vision_tower" in cfg.actor.model_fields_set
        ):
            log.warning("actor.freeze_vision_tower=false is not acted on: %s is a text model", cfg.model.path)
        return None
    return support.load_processor(cfg.model.tokenizer_path or cfg.model.path, cfg.model.trust_remote_code)


@dataclass
class RunData:
    """What a training run reads before any model loads: the tokenizer (and a vision-language model's processor),
    every training prompt, encoded and routed to its rewards, and the validation prompts (none when the run does
    not validate), with the counts of what was dropped."""

    tokenizer: Any
    processor: Any
    prompts: list[EncodedPrompt]
    counts: dict[str, int]
    val_prompts: list[EncodedPrompt]


def load_run_data(cfg: Config, registry: Registry) -> RunData:
    """A training run's data, read and checked (:class:`RunData`): shared by the trainer and ``plugrl train
    --check``, so a mistake in the data or its routing is found by both, before any model loads."""
    tokenizer = load_tokenizer(cfg)
    processor = load_processor(cfg)  # a vision-language model's; None for a text model
    if processor is not None:  # what such a model does not train with yet: refused, naming the key
        from plugrl.vlm import vision_support

        vision_support().check_config(cfg, registry)
    prompts, counts = load_prompts(cfg, registry, tokenizer, processor=processor)
    if dapo_settings(cfg)[0]:  # a metric the rewards never return: found now, not at step 1
        routes = {ds: rewards_for(registry, ds) for ds in {p.sample.data_source for p in prompts}}
        dynamic_sampling().check_group_metric(cfg.algorithm.filter_groups.metric, routes)
    val: list[EncodedPrompt] = []
    if cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train:
        val, _ = load_prompts(cfg, registry, tokenizer, validation=True, processor=processor)
    episodes = run_kit(cfg)  # multi-turn: a prompt that fits alone may not with its tools' descriptions
    if episodes is not None:
        problem = episodes.check_first_prompts(cfg, registry, tokenizer, [*prompts, *val])
        if problem:
            raise ConfigError(problem)
    return RunData(tokenizer, processor, prompts, counts, val)


def load_prompts(
    cfg: Config,
    registry: Registry,
    tokenizer: Any,
    *,
    split: str | None = None,
    files: Sequence[str] | None = None,
    validation: bool = False,
    processor: Any = None,
) -> tuple[list[EncodedPrompt], dict[str, int]]:
    """Every row of the run's data (``files``, else the config's), validated, routed to a reward and encoded;
    with the counts of what was dropped. ``validation``: ``data.val_files`` and ``data.val_split`` are the
    defaults, and having none of them is a :class:`ConfigError`. ``processor``: a vision-language model's
    (:func:`load_processor`), for samples with images."""
    if validation:
        files = files or cfg.data.val_files or None
        split = split or cfg.data.val_split
        if not files and not cfg.data.dataset:
            raise ConfigError(
                "no validation data: set data.val_files (or data.dataset), or pass `plugrl eval --data FILES`; "
                "trainer.test_freq / trainer.val_before_train need it too"
            )

    optional = functools.partial(ground_truth_optional, cfg, registry)
    written = functools.partial(prompt_from_environment, cfg, registry)  # TRL's reset() returns the prompt
    samples, counts = load_samples(
        cfg.data, registry, split=split, files=files, ground_truth_optional=optional, prompt_from_environment=written
    )
    sources = {s.data_source for s in samples}
    check_routes(registry, {ds for ds in sources if not scored_by_environment(cfg, registry, ds)})
    prompts, encoded = encode_prompts(samples, cfg.data, tokenizer, registry, processor)
    counts.update(encoded)
    return prompts, counts
