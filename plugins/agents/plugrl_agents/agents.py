"""Agents written with the ``openai`` client, as plugrl environments.

An agent is a function that plays one episode. It gets an ``openai`` client whose ``base_url`` is the run's
own rollout endpoint, and the sample; it calls ``client.chat.completions.create(...)`` as often as it likes,
runs its own tools, and returns the episode's reward::

    # my_agents.py
    from plugrl_agents import openai_agent

    async def solve(client, sample):                  # client: openai.AsyncOpenAI
        messages = list(sample.prompt)
        reply = await client.chat.completions.create(model="policy", messages=messages)
        return float(reply.choices[0].message.content.strip() == sample.ground_truth)

    solver = openai_agent(solve, name="solver")       # the environment 'solver'

With ``plugins: ["my_agents:", advantages]`` and ``environment: solver`` in the run config:

- every call is answered by the policy being trained, sampled with the run's ``rollout.temperature``,
  ``top_p`` and ``top_k`` (a request's own sampling settings are ignored: the policy trains on what it
  samples under the run's); plugrl records the exact tokens of every call and trains on them
  (:mod:`plugrl_agents.episodes`);
- ``async def`` agents get an ``openai.AsyncOpenAI`` and run as tasks on one event loop; a plain ``def``
  gets an ``openai.OpenAI`` and runs in a thread. ``client.base_url`` and ``client.api_key`` are the
  endpoint and this episode's key, for an agent that builds a client of its own (any OpenAI-compatible
  library);
- the returned number (or :class:`plugrl.EpisodeScore`, a score with its parts) is the episode's score; None
  leaves it to the reward plugins of the sample's ``data_source`` (they score the last reply). The data
  sources routed to an agent need no reward function;
- an agent that raises, returns something else, or runs past ``time_limit_s`` ends its own episode as an
  error (``env/errors``), never the step.

This module holds the contract only (no torch, no HTTP): plugin modules import it.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

from plugrl.specs import EnvironmentSpec


def openai_agent(
    solve: Callable[..., Any],
    *,
    name: str | None = None,
    options: type | None = None,
    time_limit_s: float | None = 600.0,
) -> EnvironmentSpec:
    """The plugrl environment that plays each episode by calling ``solve(client, sample, **options)``.

    ``solve``: ``async def`` (gets an ``openai.AsyncOpenAI``) or plain (gets an ``openai.OpenAI``, runs in a
    thread); returns a number or an ``EpisodeScore`` (the episode's score) or None (the reward plugins score
    it). ``name``: the environment's name in the config (default: the function's name). ``options``: a
    pydantic model of ``environment_options``, validated at start-up and passed to ``solve`` as keywords.
    ``time_limit_s``: the wall-clock limit of one episode, waiting for the model included (None: none); past
    it the episode ends as an error (an ``async def`` agent is cancelled; a thread cannot be stopped, its
    later calls are refused).

    A module-level ``x = openai_agent(fn)`` in a plugin module registers it. A ``solve`` that cannot take
    ``(client, sample)``, or a missing ``openai`` package, is an error here, at import."""
    label = f"openai_agent({getattr(solve, '__name__', type(solve).__name__)})"
    if not callable(solve):
        raise TypeError(f"{label}: solve must be a function (client, sample) -> float | EpisodeScore | None")
    try:
        inspect.signature(solve).bind(None, None)
    except (TypeError, ValueError):
        raise TypeError(f"{label}: solve must take two arguments, (client, sample)") from None
    if time_limit_s is not None and not time_limit_s > 0:
        raise ValueError(f"{label}: time_limit_s must be a positive number of seconds or None")
    if importlib.util.find_spec("openai") is None:
        raise ImportError(f"{label}: agents call the policy with the openai client; pip install openai")
    body: dict[str, Any] = {
        "solve": staticmethod(solve),
        "is_async": inspect.iscoroutinefunction(solve) or inspect.iscoroutinefunction(type(solve).__call__),
        "time_limit_s": time_limit_s,
        "__doc__": f"An episode of the agent {label} (plugrl_agents.agents).",
    }
    episode_class = type(f"Agent_{getattr(solve, '__name__', 'agent')}", (AgentEpisode,), body)
    episode_class.__module__ = getattr(solve, "__module__", __name__)
    return EnvironmentSpec(name=name or getattr(solve, "__name__", "agent"), factory=episode_class, options=options)


class AgentEpisode:
    """One episode of an agent, made once per episode with the validated ``environment_options``. The kernel
    plays it through the rollout endpoint (:class:`plugrl_agents.episodes.AgentRunner`), never turn by
    turn: it has no ``start`` or ``step``."""

    solve: Callable[..., Any]
    is_async: bool = True
    time_limit_s: float | None = 600.0
    kind = "agent"  # the word the logs and errors use for these environments

    @staticmethod
    def episode_runner(*args: Any, **kwargs: Any) -> Any:
        """The kernel plays these episodes with an :class:`plugrl_agents.episodes.AgentRunner`, made once per run
        (the environment contract's ``episode_runner``)."""
        from plugrl_agents.episodes import AgentRunner

        return AgentRunner(*args, **kwargs)

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.result: float | None = None

    def reward(self) -> float | None:
        """What ``solve`` returned. Having ``reward()`` tells start-up that this environment scores its episodes,
        so the data sources routed to it need no reward function (``EnvironmentSpec.scores_episodes``)."""
        return self.result
