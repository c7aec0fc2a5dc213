"""verifiers' classic API (verifiers 0.2.0: ``vf.SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``, ``Rubric``), trained
unchanged.

``environment: verifiers:<env id>`` loads the environment with verifiers' own loader
(``verifiers.load_environment(id, **environment_options)``: an installed environment package, or a module
on the path, that defines ``load_environment``) once per run. Its dataset becomes the run's data when the
config names none (``train`` split: ``get_dataset()``, any other: ``get_eval_dataset()``), its prompts keep
their system prompt and few-shot, its multi-turn logic and tools run as in verifiers
(:mod:`plugrl_envs_verifiers.episode`), and its rubric scores each episode.

Supported: the classic API (``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv``,
``vf.StatefulToolEnv`` and their subclasses) with per-rollout rubrics. Refused at start, with the reason:
environments that are not ``MultiTurnEnv`` s (``EnvGroup``, which routes rollouts itself), rubrics with
group-level reward functions (plugrl scores each episode on its own), and completion-format prompts.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from typing import Any

from plugrl.specs import DatasetSpec, EnvironmentSpec

log = logging.getLogger("plugrl.envs.verifiers")

_LOADED: dict[str, Any] = {}  # "verifiers:<id>" -> the loaded environment, for the config check below
_APPLIED_SAMPLING = {"n", "extra_body"}  # verifiers' defaults; plugrl's rollout settings decide the rest


def load(env_id: str, env_args: dict[str, Any]) -> EnvironmentSpec:
    """The verifiers environment ``env_id`` (``environment_options`` are its ``load_environment`` arguments),
    with its dataset."""
    import verifiers as vf

    from .episode import VerifiersEpisode  # imports verifiers: only once it is known to be there

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        env = vf.load_environment(env_id, **env_args)
    finally:  # verifiers' Environment installs its own SIGINT/SIGTERM handlers; plugrl's checkpoint-on-signal stays
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    _check(env, env_id)
    ignored = sorted(set(env.sampling_args or {}) - _APPLIED_SAMPLING)
    if ignored:
        log.warning(
            "verifiers:%s sets sampling_args %s: ignored; plugrl samples with the run's rollout settings "
            "(rollout.temperature, top_p, top_k, data.max_response_length, rollout.max_turn_tokens)",
            env_id,
            ", ".join(f"{k}={env.sampling_args[k]!r}" for k in ignored),
        )
    _LOADED[f"verifiers:{env_id}"] = env
    episode = type(
        f"Verifiers_{type(env).__name__}",
        (VerifiersEpisode,),
        {"env": env, "__doc__": f"An episode of verifiers' {type(env).__name__} {env_id!r}."},
    )
    return EnvironmentSpec(name=env_id, factory=episode, dataset=DatasetSpec(name=env_id, fn=_rows(env, env_id)))


def _check(env: Any, env_id: str) -> None:
    import verifiers as vf

    kind = type(env).__name__
    if not isinstance(env, vf.MultiTurnEnv):
        raise TypeError(
            f"load_environment({env_id!r}) returned a {kind}; plugrl drives verifiers' MultiTurnEnv family "
            "(SingleTurnEnv, MultiTurnEnv, ToolEnv, StatefulToolEnv and their subclasses) turn by turn. For an "
            "EnvGroup, route each data source to its own environment (environment: {pattern: verifiers:<id>})"
        )
    if env.rubric.has_group_rewards:
        rubrics = getattr(env.rubric, "rubrics", [env.rubric])  # a RubricGroup holds them in its members
        names = [f.__name__ for r in rubrics for f in r._get_group_reward_funcs()]
        raise TypeError(
            f"{kind} {env_id!r} scores with group-level reward functions ({', '.join(names)}); plugrl scores each "
            "episode on its own and does not support them yet: use per-rollout reward functions"
        )


def _rows(env: Any, env_id: str) -> Any:
    def rows(split: str) -> Iterator[dict[str, Any]]:
        """The environment's dataset as plugrl rows: every column (prompt, answer, info, task, example_id), and
        the environment's id as ``data_source`` where a row has none."""
        dataset = env.get_dataset() if split == "train" else env.get_eval_dataset()
        if "prompt" not in dataset.column_names:
            raise ValueError(
                f"verifiers:{env_id}'s {split} dataset has no 'prompt' column (columns: {dataset.column_names})"
            )
        for row in dataset:
            row = dict(row)
            row.setdefault("data_source", env_id)
            row["prompt"] = [{k: v for k, v in dict(m).items() if v is not None} for m in row["prompt"]]
            yield row

    return rows


def check_run(config: Any) -> None:
    """A verifiers environment's own ``max_turns`` beyond ``rollout.max_turns``: plugrl's limit cuts its
    episodes first; said once at start rather than found in the logs."""
    env_names = [config.environment] if isinstance(config.environment, str) else (config.environment or {}).values()
    for name in env_names:
        env = _LOADED.get(name)
        limit = getattr(env, "max_turns", -1)
        if env is not None and (limit <= 0 or limit > config.rollout.max_turns):
            log.warning(
                "%s allows %s turns, rollout.max_turns=%d: episodes end at %d turns; raise rollout.max_turns to "
                "give them the environment's own limit",
                name,
                "unlimited" if limit <= 0 else limit,
                config.rollout.max_turns,
                config.rollout.max_turns,
            )
