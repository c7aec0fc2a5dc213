"""What an environment returns, checked against the environment contract (:mod:`plugrl.rollout.environment`) before
an episode uses it: ``start``'s and ``step``'s results and an episode's score. A wrong type is a TypeError naming
the environment's call, which ends only that episode.
"""

from __future__ import annotations

import math
from typing import Any

from plugrl.rollout.environment import EnvStart, EnvStep, EpisodeScore, Message, Turn


def as_env_start(value: Any, where: str) -> EnvStart:
    """``start``'s result as an :class:`EnvStart`; a TypeError naming ``where`` for anything else."""
    if value is None:
        return EnvStart()
    if isinstance(value, EnvStart):
        _check_messages(value.messages or [], where)
        if value.observation is not None and not isinstance(value.observation, str):
            raise TypeError(f"{where}: EnvStart.observation must be a string or None, got {_kind(value.observation)}")
        return value
    if isinstance(value, list):
        return EnvStart(messages=_check_messages(value, where))
    raise TypeError(f"{where}: start() must return an EnvStart, a list of chat messages or None, got {_kind(value)}")


def as_env_step(value: Any, turn: Turn, where: str) -> EnvStep:
    """``step``'s result as an :class:`EnvStep`; a TypeError naming ``where`` for anything else."""
    if value is None:
        return EnvStep(done=not turn.tool_calls)
    if isinstance(value, EnvStep):
        _check_messages(value.messages, where)
        if value.context is not None:
            _check_messages(value.context, where)
        if value.reward is not None:
            check_score(value.reward, f"{where}: EnvStep.reward")
        return value
    if isinstance(value, list):
        return EnvStep(messages=_check_messages(value, where))
    raise TypeError(f"{where}: step() must return an EnvStep, a list of chat messages or None, got {_kind(value)}")


def check_score(value: Any, where: str) -> EpisodeScore:
    """A reward (a finite number or an :class:`EpisodeScore`) as an EpisodeScore; a TypeError naming ``where``
    for anything else."""
    score = value if isinstance(value, EpisodeScore) else EpisodeScore(value)
    parts = score.parts if isinstance(score.parts, dict) else {"": None}
    numbers = [score.value, *parts.values()]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in numbers):
        raise TypeError(
            f"{where} must be a finite number, an EpisodeScore of finite numbers, or None; got {value!r:.80}"
        )
    return EpisodeScore(float(score.value), {str(k): float(v) for k, v in parts.items()})


def _check_messages(messages: Any, where: str) -> list[Message]:
    if not isinstance(messages, list):
        raise TypeError(f"{where}: messages must be a list of {{'role', 'content'}} dicts, got {_kind(messages)}")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise TypeError(
                f"{where}: message {i} must be a dict with string 'role' and 'content', got {_kind(m)} {m!r:.80}"
            )
    return messages


def _kind(value: Any) -> str:
    return type(value).__name__
