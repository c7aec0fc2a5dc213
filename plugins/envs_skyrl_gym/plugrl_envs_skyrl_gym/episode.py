"""One episode of a skyrl-gym environment, on plugrl's environment contract.

SkyRL's generator builds an environment per trajectory with ``skyrl_gym.make(env_class, env_config=...,
extras=...)``, where ``extras`` is the dataset row less its ``prompt`` and ``env_class`` columns, plus
``max_turns`` (the generator's). It calls ``init(prompt)`` for the first messages, then ``step(reply)`` after
every reply: observations (messages), a reward, done. Here the same calls happen in the same order:

- ``start(sample)``: ``make`` with the sample's row as ``extras`` (``rollout.max_turns`` as ``max_turns``),
  then ``init`` with the row's prompt messages;
- ``step(turn)``: ``env.step(turn.reply)``; the observations are the messages that follow the reply;
- the episode's score is the sum of the step rewards (SkyRL's per-turn rewards, summed as its outcome
  estimators sum them), returned with ``done`` or by ``reward()`` when plugrl's limits end the episode.

``close()``: the kernel calls it once the episode has ended (done, scored by ``reward()``, or failed).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from plugrl.rollout.environment import EnvStart, EnvStep, Message, Turn

log = logging.getLogger("plugrl.skyrl_gym")


class SkyRLEpisode:
    """Base of the per-environment classes :func:`episode_class` makes; one instance per episode.

    Class attributes (set per environment): ``env_id``, ``env_config`` (the ``DictConfig`` every episode is
    made with) and ``make`` (``skyrl_gym.make``); set at run start: ``max_turns`` (``rollout.max_turns``; None:
    ``extras`` keeps the row's own ``max_turns``, if any) and ``prompt_key`` (``data.prompt_key``).
    """

    env_id: ClassVar[str] = ""
    env_config: ClassVar[Any] = None
    make: ClassVar[Callable[..., Any]]
    max_turns: ClassVar[int | None] = None
    prompt_key: ClassVar[str] = "prompt"

    def __init__(self) -> None:
        self.env: Any = None
        self.total = 0.0  # the sum of the step rewards so far
        self.origin = ""

    @property
    def label(self) -> str:
        return f"skyrl-gym environment {self.env_id!r}"

    # ------------------------------------------------------------------ the contract
    def start(self, sample: Any) -> EnvStart:
        """Make the environment from the sample's row and ``init`` it with the row's prompt. The messages
        ``init`` returns replace the sample's prompt only when they differ from it, so that ``data.template``
        and ``data.system_prompt`` still apply to an environment that keeps the prompt as it is."""
        self.origin = getattr(sample, "origin", "") or "the sample"
        self.env = self.build(sample)
        prompt = prompt_messages(sample.prompt)
        result = self.env.init(copy.deepcopy(prompt))
        messages = _messages(result[0] if isinstance(result, tuple) else result, f"{self.label}: init()")
        return EnvStart() if messages == prompt else EnvStart(messages=messages)

    def step(self, turn: Turn) -> EnvStep:
        """``env.step(reply)``: its observations follow the reply; its reward adds to the episode's score,
        which ends the episode with ``done``. Its ``metadata`` and ``get_metrics()`` values that are numbers
        or text are logged as the episode's ``info``."""
        out = self.env.step(turn.reply)
        if not isinstance(out, Mapping):
            raise TypeError(f"step() returned {type(out).__name__}, not a dict (BaseTextEnvStepOutput)")
        reward = _reward(out.get("reward"))
        observations = _messages(out.get("observations") or [], f"{self.label}: step() observations")
        info = {**_scalars(out.get("metadata")), **_scalars(_metrics(self.env))}
        self.total += reward
        if out.get("done"):
            return EnvStep(messages=observations, done=True, reward=self.total, info=info)
        return EnvStep(messages=observations, info=info)

    def reward(self) -> float:
        """The episode's score when plugrl ended it (``rollout.max_turns``, the token budget) before the
        environment said done: the sum of the rewards its steps gave."""
        return self.total

    def close(self) -> None:
        """Close the environment once (SkyRL's ``Env.close``: databases, connections). A close that raises is
        logged: the episode has its score by then, or already failed for its own reason."""
        env, self.env = self.env, None
        if env is None:
            return
        try:
            env.close()
        except Exception as e:
            log.warning("%s on %s: close() failed: %s: %s", self.label, self.origin, type(e).__name__, e)

    # ------------------------------------------------------------------ making the environment
    def build(self, sample: Any) -> Any:
        """``skyrl_gym.make(env_id, env_config=..., extras=...)`` for this sample; a ValueError naming the row,
        the field the environment wanted and the columns the row has, when the row is not what it needs."""
        row = dict(getattr(sample, "row", None) or {})
        wanted = row.get("env_class")
        if wanted not in (None, "", self.env_id):
            raise ValueError(
                f"{self.origin}: the row's env_class is {wanted!r}, but this run plays skyrl_gym:{self.env_id} "
                f"(SkyRL would make {wanted!r} for it); set `environment: skyrl_gym:{wanted}`, route its rows by "
                "data_source (`environment: {data_source pattern: skyrl_gym:<id>}`), or drop the env_class column"
            )
        try:
            return self.make(
                self.env_id, env_config=self.env_config, extras=extras(row, self.max_turns, self.prompt_key)
            )
        except Exception as e:
            raise ValueError(
                f"{self.label} cannot start on {self.origin}: {_problem(e)}. It reads its per-sample data from "
                f"the row's columns (SkyRL's extras: all but prompt and env_class), and the row has "
                f"{sorted(row) or 'no columns'}; SkyRL's rows carry e.g. reward_spec: {{method, ground_truth}} and "
                "extra_info"
            ) from e


def extras(row: Mapping[str, Any], max_turns: int | None, prompt_key: str = "prompt") -> dict[str, Any]:
    """SkyRL's ``extras`` for a dataset row: every column but the prompt's and ``env_class``, copied (an
    environment may change them, and the ``n`` episodes of a prompt share the row), with ``max_turns`` set
    as SkyRL's generator sets it."""
    out = {k: copy.deepcopy(v) for k, v in row.items() if k not in (prompt_key, "env_class")}
    if max_turns is not None:
        out["max_turns"] = max_turns
    return out


def prompt_messages(prompt: Any) -> list[Message]:
    """The sample's prompt as chat messages, as SkyRL's rows hold it (a text prompt is one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}] if prompt else []
    return [dict(m) for m in prompt or []]


def _messages(value: Any, where: str) -> list[Message]:
    """SkyRL's messages (OpenAI chat format) as plugrl's, copied; a TypeError naming ``where`` otherwise."""
    if not isinstance(value, list):
        raise TypeError(f"{where} must be a list of chat messages, got {type(value).__name__}")
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise TypeError(f"{where}: message {i} must have string 'role' and 'content', got {m!r:.80}")
        out.append(dict(m))
    return out


def _reward(value: Any) -> float:
    """A step's reward as a float (SkyRL's rewards are numbers; gsm8k's may be the int 0)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"step() returned reward {value!r:.80}: plugrl takes a finite number per step")
    return float(value)


def _scalars(values: Any) -> dict[str, Any]:
    """The fields of a metadata dict that plugrl logs as ``info``: numbers and text; a bool becomes 1.0 or 0.0
    (aime's ``acc``), so that its mean is logged as ``env/info/<field>``. Lists, None and objects are left out."""
    if not isinstance(values, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[str(key)] = float(value)
        elif isinstance(value, (str, int, float)):
            out[str(key)] = value
    return out


def _metrics(env: Any) -> Any:
    method = getattr(env, "get_metrics", None)
    return method() if callable(method) else None


def _problem(e: BaseException) -> str:
    """What an environment's constructor objected to: skyrl-gym's asserts name the field
    (``reward_spec field is required``); a KeyError names only the key."""
    if isinstance(e, KeyError):
        return f"it needs the field {e.args[0]!r}, which the row lacks (KeyError)"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def episode_class(env_id: str, make: Callable[..., Any], env_config: Any, module: str | None = None) -> type:
    """A :class:`SkyRLEpisode` class for one environment (the kernel makes one instance per episode)."""
    body = {
        "env_id": env_id,
        "make": staticmethod(make),
        "env_config": env_config,
        "__doc__": f"skyrl-gym's {env_id!r}, one environment per episode (plugrl_envs_skyrl_gym).",
    }
    cls = type(f"SkyRLGym_{env_id}", (SkyRLEpisode,), body)
    if module:
        cls.__module__ = module
    return cls
