"""Playing a step's episodes: a run's multi-turn player, what a conversation adds to the metrics and the rollout
logs, and generating and scoring (single-turn and multi-turn alike).

Multi-turn episodes (``environment``, ``rollout.tools``) are played by the package behind
:mod:`plugrl.rollout.episode_kit` (plugrl-multiturn). The trainer and ``plugrl eval`` build one
:class:`EpisodePlayer` per run (:func:`make_episode_runner`) and call ``play`` with a step's prompts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from plugrl.rollout.episode_kit import EpisodePlayer, kit, multi_turn_keys
from plugrl.rollout.multiturn import Conversation
from plugrl.rollout.types import Rollout, RolloutEngine, SamplingSettings


def make_episode_runner(
    cfg: Any, registry: Any, engine: RolloutEngine, tokenizer: Any, processor: Any = None
) -> EpisodePlayer:
    """The run's :class:`EpisodePlayer` (:class:`plugrl.rollout.episode_kit.EpisodeKit`'s ``make_episode_player``);
    a :class:`plugrl.rollout.episode_kit.NoEpisodeRunner` without the package."""
    keys = ", ".join(multi_turn_keys(cfg)) or "a multi-turn episode player"
    return kit(keys).make_episode_player(cfg, registry, engine, tokenizer, processor)


# ---------------------------------------------------------------------------- what a step logs


def conversation_metrics(conversations: Sequence[Conversation]) -> dict[str, float]:
    """``env/*`` metrics of a step's episodes: turns, tool calls and turns cut at ``rollout.max_turn_tokens``
    per episode, and context edits (step-wise runs); the share of episodes that the response budget cut
    (``env/truncated``), whose environment failed (``env/errors``) or ended them (``env/done``); and the
    mean of every numeric field environments put in ``EnvStep.info`` (``env/info/<field>``, over the
    episodes that report it)."""
    n = max(len(conversations), 1)
    fields: dict[str, list[float]] = {}
    for c in conversations:
        for key, value in c.info.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                fields.setdefault(f"env/info/{key}", []).append(float(value))
    return {
        **{key: sum(v) / len(v) for key, v in fields.items()},
        "env/turns_mean": sum(c.turns for c in conversations) / n,
        "env/tool_calls": sum(c.tool_calls for c in conversations) / n,
        "env/tool_errors": sum(c.tool_errors for c in conversations) / n,
        "env/truncated": sum(c.finish == "truncated" for c in conversations) / n,
        "env/cut_turns": sum(c.cut_turns for c in conversations) / n,
        "env/context_edits": sum(c.context_edits for c in conversations) / n,
        "env/errors": sum(c.finish == "error" for c in conversations) / n,
        "env/done": sum(c.finish == "done" for c in conversations) / n,
    }


def conversation_row(conversation: Conversation, rollout: Rollout, tokenizer: Any) -> dict[str, Any]:
    """The fields a multi-turn episode adds to its row in ``rollouts/step_N.jsonl``: the whole conversation,
    how it ended, and the response as segments of trained (the policy's) and untrained (tools', the
    environment's) tokens."""
    mask = rollout.policy_mask or [1] * len(rollout.response_ids)
    segments: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            text = tokenizer.decode(rollout.response_ids[start:i], skip_special_tokens=False)
            segments.append({"trained": bool(mask[start]), "tokens": i - start, "text": text})
            start = i
    return {
        "messages": conversation.messages,
        "environment": conversation.environment,
        "turns": conversation.turns,
        "finish": conversation.finish,
        "env_reward": conversation.reward,
        "env_error": conversation.error,
        "env_info": conversation.info,
        "tool_calls": conversation.tool_calls,
        "tool_errors": conversation.tool_errors,
        "segments": segments,
        **({} if rollout.steps is None else {"steps": [_step_row(s, tokenizer) for s in rollout.steps]}),
    }


def _step_row(step: Rollout, tokenizer: Any) -> dict[str, Any]:
    """A step-wise sample in the rollout log: how long its context was, and what the policy said."""
    return {
        "prompt_tokens": len(step.prompt_ids),
        "response_tokens": len(step.response_ids),
        "response": tokenizer.decode(step.response_ids, skip_special_tokens=False),
    }


# ---------------------------------------------------------------------------- generating and scoring


def generate_scored(
    engine: RolloutEngine,
    tokenizer: Any,
    prompts: Sequence[Any],
    rewards: Any,
    sampling: SamplingSettings,
    *,
    prefill: str | None = None,
    player: EpisodePlayer | None = None,
) -> tuple[list[tuple[Any, Rollout, Conversation | None]], list[str], Any]:
    """``sampling.n`` episodes of each prompt, generated and scored: ``(prompt, rollout, conversation)``
    per episode (group by group), the text each was scored on, and the reward runner's
    :class:`plugrl.rewards.RewardOutput`. With ``player``, whole multi-turn episodes: the last reply is
    the completion, the conversation goes to the rewards as ``messages``, and an episode whose environment
    returned a reward keeps it (``details["environment"]``). Used by the trainer and by validation."""
    from plugrl.rewards import RewardOutput
    from plugrl.rollout.types import response_texts

    if player is None:  # every rank calls the engine, with or without prompts: TP ranks generate together
        groups = engine.generate([p.engine_prompt for p in prompts], sampling)
    if not prompts:  # the later ranks of a TP group: they receive the first rank's record
        return [], [], RewardOutput([], [], {})
    if player is not None:
        played = player.play(prompts, sampling)
        episodes = [(p, r, c) for p, (r, c) in zip(_each(prompts, sampling.n), played, strict=True)]
        texts = [c.last_reply for _, _, c in episodes]
    else:
        episodes = [(p, r, None) for p, g in zip(prompts, groups, strict=True) for r in g]
        texts = response_texts(tokenizer, [r for _, r, _ in episodes], sampling)
        if prefill:  # the prefill is the start of the assistant's answer: score it with the rest
            texts = [prefill + t for t in texts]
    return episodes, texts, score_episodes(rewards, episodes, texts)


def score_episodes(rewards: Any, episodes: Sequence[tuple[Any, Rollout, Conversation | None]], texts: list[str]) -> Any:
    """The reward plugins' scores of ``episodes``; one whose environment returned a reward keeps that one,
    and one that only its environment could score but did not (it failed) gets 0 (``details["unscored"]``).
    ``reward/mean`` and ``reward/std`` cover every episode, ``reward/environment/mean`` those the
    environments scored (``reward/<part>/mean`` the parts of their scores), ``reward/unscored`` the share
    nobody could score."""
    from plugrl.rewards import RewardItem, RewardOutput

    own = [c is not None and c.reward is not None for _, _, c in episodes]
    # only an environment scores these (its class has reward()), and it did not: its episode failed, or
    # reward() returned None. They count as failures, with 0.
    scorable = {ds: rewards.can_score(ds) for ds in {p.sample.data_source for p, _, c in episodes if c is not None}}
    unscored = [
        not o and c is not None and not scorable[p.sample.data_source]
        for (p, _, c), o in zip(episodes, own, strict=True)
    ]
    items = [
        RewardItem(p.sample, p.text, t, None, r.response_ids)
        if c is None
        else RewardItem(p.sample, p.text, t, c.messages, r.response_ids, c.trl_prompt, c.trl_completion())
        for (p, r, c), t, o, u in zip(episodes, texts, own, unscored, strict=True)
        if not (o or u)
    ]
    scored = rewards.score(items) if items else RewardOutput([], [], {})
    if not any(own) and not any(unscored):
        return scored
    theirs = iter(zip(scored.scores, scored.details, strict=True))
    scores, details = [], []
    for (_, _, c), o, u in zip(episodes, own, unscored, strict=True):
        if o:  # the environment's score, and its parts (a rubric's functions) beside it
            score, detail = c.reward, {"environment": c.reward, **c.reward_parts}
        else:
            score, detail = (0.0, {"unscored": 0.0}) if u else next(theirs)
        scores.append(score)
        details.append(detail)
    # reward/mean and reward/std are over every episode; the reward functions' own means over those they scored
    metrics = dict(scored.metrics)
    every = [float(x) for x in scores if x is not None]
    mean = sum(every) / len(every) if every else 0.0
    by_env = [float(c.reward) for (_, _, c), o in zip(episodes, own, strict=True) if o]
    metrics["reward/mean"] = mean
    metrics["reward/std"] = math.sqrt(sum((x - mean) ** 2 for x in every) / len(every)) if every else 0.0
    if by_env:
        metrics["reward/environment/mean"] = sum(by_env) / len(by_env)
    parts: dict[str, list[float]] = {}
    for (_, _, c), o in zip(episodes, own, strict=True):
        for name, value in (c.reward_parts if o else {}).items():
            parts.setdefault(name, []).append(value)
    for name, values in parts.items():
        metrics.setdefault(f"reward/{name}/mean", sum(values) / len(values))
    if any(unscored):
        metrics["reward/unscored"] = sum(unscored) / len(unscored)
    return RewardOutput(scores, details, metrics)


def _each(items: Sequence[Any], n: int) -> list[Any]:
    """Each item n times in a row: the prompts of a step's episodes, group by group."""
    return [x for x in items for _ in range(n)]
