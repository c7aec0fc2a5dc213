"""Environments written for TRL, unchanged, as plugrl environments.

:func:`trl_environment` takes a class written for TRL's ``GRPOTrainer(environment_factory=...)``; no TRL
import is needed. Users import it as ``plugrl.rollout.adapters.trl_environment``: the kernel loads this module
through the entry-point group ``plugrl.environment_adapters`` (:mod:`plugrl.rollout.adapters`)::

    # my_envs.py
    from plugrl.rollout.adapters import trl_environment

    class Counter:                       # as written for TRL
        def reset(self, **row):
            self.count = 0
            return " Use the tool."
        def increment(self, step: int) -> int:
            '''Add to the counter.

            Args:
                step: How much to add.
            '''
            self.count += step
            return self.count
        def get_reward(self) -> float:
            return float(self.count == 3)

    counter = trl_environment(Counter)   # the environment 'Counter'

With ``plugins: ["my_envs:", advantages]`` and ``environment: Counter`` in the run config. As in TRL:

- each episode gets its own instance, and ``reset(**row)`` gets the sample's row, every column. A string
  it returns is added to the end of the prompt's last message. A row without a prompt (the environment owns
  the task: a dataset of ``{"seed": 3}`` rows, or of data sources only) gets TRL's empty user message, so the
  string ``reset()`` returns is the prompt. TRL reuses instances between batches and resets them; plugrl makes
  a fresh one per episode and resets it too.
- the public methods of the class (not ``reset``, ``get_reward`` or ``_private`` ones) are the episode's
  tools, with the plain functions of ``tools=`` (TRL's ``tools=[...]``) beside them. The methods run in the
  trainer's process, where the instance's state lives; an exception is the tool's answer, as in TRL.
- the episode goes on while the model calls tools, for at most ``rollout.max_turns`` replies (TRL's
  ``max_tool_calling_iterations`` is ``rollout.max_turns - 1``).
- ``get_reward()`` (plain or ``async def``), when the class has it, scores every episode however it ended,
  and the episode's data source then needs no reward function. Without it, the reward plugins of the
  sample's ``data_source`` score the episode.

One difference: TRL adds ``get_reward`` to its ``reward_funcs`` (weight 1) and sums them; here the
environment's reward is the episode's score and the data source's reward functions are not called for
it. A TRL reward function (of an environment without ``get_reward``) gets the episode's turns as TRL passes
them, but no ``environments=``: move that logic into ``get_reward``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from plugrl.rollout.environment import Environment, EnvStart
from plugrl.specs import EnvironmentSpec

_NOT_TOOLS = ("reset", "get_reward")


def trl_environment(
    factory: Callable[[], Any], *, name: str | None = None, tools: Sequence[Callable[..., Any]] = ()
) -> EnvironmentSpec:
    """The plugrl environment for TRL's ``environment_factory`` ``factory``: a class, or a zero-argument
    callable that returns an instance (called once here to learn the class, as TRL probes one at start).
    ``name``: the environment's name in the config (default: the class name, as TRL logs its reward).
    ``tools``: TRL's standalone ``tools=[...]``, module-level functions, run in the tool worker processes.

    A module-level ``x = trl_environment(MyEnv)`` in a plugin module registers it. A class without a
    ``reset`` method is a TypeError here, at import, as TRL refuses it at start."""
    cls = factory if isinstance(factory, type) else type(factory())
    label = f"trl_environment({getattr(factory, '__name__', cls.__name__)})"
    if not callable(getattr(cls, "reset", None)):
        raise TypeError(f"{label}: {cls.__name__} has no reset() method; TRL's environments must define reset(**row)")
    for tool in tools:
        if not callable(tool):
            raise TypeError(f"{label}: tools must be functions, got {type(tool).__name__}")
    methods = tuple(
        n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction) if n not in _NOT_TOOLS and n[0] != "_"
    )
    body: dict[str, Any] = {
        "factory": staticmethod(factory),
        "methods": methods,
        "standalone": tuple(tools),
        "__doc__": f"TRL's {cls.__name__}, one instance per episode (plugrl.rollout.adapters.trl_environment).",
    }
    if callable(getattr(cls, "get_reward", None)):
        body["reward"] = _TRLEpisode._reward
    episode_class = type(f"TRL_{cls.__name__}", (_TRLEpisode,), body)
    episode_class.__module__ = getattr(cls, "__module__", __name__)
    return EnvironmentSpec(name=name or cls.__name__, factory=episode_class)


class _TRLEpisode(Environment):
    """One episode of a TRL environment: its instance, reset with the sample's row; its public methods and
    the standalone tools offered; done at the first reply without a tool call (the inherited ``step``)."""

    factory: Callable[[], Any]
    methods: tuple[str, ...] = ()
    standalone: tuple[Callable[..., Any], ...] = ()
    plugrl_writes_prompt = True  # reset() may return the prompt: rows routed here may have none

    def __init__(self) -> None:
        self.env = self.factory()

    def start(self, sample: Any) -> EnvStart:
        observation = self.env.reset(**dict(sample.row))
        if observation is not None and not isinstance(observation, str):
            raise TypeError(
                f"reset() returned {type(observation).__name__}: plugrl takes None or a string (no images yet)"
            )
        tools = [getattr(self.env, m) for m in self.methods] + list(self.standalone)
        return EnvStart(tools=tools, observation=observation or None)

    def _reward(self) -> Any:  # installed as ``reward`` when the class has get_reward()
        return self.env.get_reward()
