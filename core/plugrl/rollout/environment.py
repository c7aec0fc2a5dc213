"""The environment contract: what a multi-turn episode asks of an environment, and what it gets back.

An environment answers the policy: the policy speaks (one assistant turn), the kernel runs the tool calls
in it, the environment answers (chat messages: feedback, a new observation), and so on until the
environment says the episode is done, the turns run out (``rollout.max_turns``) or the token budget does.

A plugin registers a factory with ``@plugrl.environment("name")``: a class (or any callable) that the
kernel calls once per episode, with the validated ``environment_options`` as keywords. The object it
returns holds that episode's state; nothing is shared between episodes unless the plugin shares it. Its
two methods may be plain or ``async def``; the kernel advances all live episodes of a step together and
awaits their environments concurrently (plain methods run in threads).

- ``start(sample) -> EnvStart | list[message] | None``: the episode's first messages and the tools it
  offers. None (or ``EnvStart()``) keeps the sample's own prompt, rendered as the data config says.
- ``step(turn) -> EnvStep | list[message] | None``: called after every policy turn with a :class:`Turn`
  (the reply, its parsed tool calls and their results, the conversation so far). Returns the messages to
  append, whether the episode is done, and optionally its reward. A list of messages means "not done";
  None means "done" when the reply called no tool, as :class:`Environment` does by default.

- ``reward() -> float | EpisodeScore | None`` (optional): the score of an episode that ended without a reward
  from ``step`` (its last turn, the token budget, ``max_turns``), however it ended; not called when the
  environment failed. The data sources routed to an environment whose class has it need no reward function.
  An :class:`EpisodeScore` also gives the score's parts (a rubric's functions), logged as ``reward/<name>/mean``.
- ``close()`` (optional, plain or ``async def``): called once when the episode is over (scored or failed), for
  what the environment holds (a database, a sandbox, a connection). What it raises is logged, not fatal.

A reward returned with ``done`` (or by ``reward()``) scores the episode; otherwise the reward plugins score
it by ``data_source``: the last assistant message is the completion and the whole conversation is in their
``messages`` context. An environment that raises, or returns the wrong type, ends only its own episode
(counted in ``env/errors``; the error is kept in the rollout record: plugrl-multiturn checks what an environment
returns, :mod:`plugrl_multiturn.env_results`).

An environment class may instead play its episodes itself: a class attribute ``episode_runner``, a callable
``(engine, chat, tokenizer, limits, *, parser) -> runner`` made once per run (:func:`own_runner`), whose
``run(starts, sampling)`` returns each start's (``Rollout``, ``Conversation``) as the kernel's own runner does,
with ``timings`` (seconds by phase) and ``close()``; and ``kind``, the word the logs use for it (e.g. agents that
call the policy through an OpenAI-compatible endpoint: they render their own prompts and take no image prompts).

Subclassing :class:`Environment` is optional; it supplies both defaults, which make the tool loop of
TRL's ``tools=[...]`` and verifiers' ``ToolEnv``: the episode continues while the model calls tools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugrl.rollout.tools import ToolCall, ToolResult, ToolSpec

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


@dataclass
class EnvStart:
    """How an episode starts.

    ``messages``: the conversation before the first policy turn (system, user, ...), or None for the
    sample's prompt as the data config renders it. ``observation``: text added to the end of the last of
    those messages (the episode's first observation; what TRL's ``reset()`` returns). ``tools``: what this
    episode may call, added to ``rollout.tools``: registered tool names (``"calculator"``),
    :class:`plugrl.rollout.tools.ToolSpec` records, or functions (their signature and docstring give the
    schema). A module-level function runs in the tool worker processes; a bound method (``self.guess``) or
    a closure runs in the trainer's process, where the episode's state lives.

    ``tool_schemas``: tools the environment runs itself (OpenAI's ``{"type": "function", "function": {...}}``
    form), as verifiers' ``ToolEnv`` does: shown to the model and parsed from its replies into
    ``Turn.tool_calls``, but not run by the kernel; ``step`` answers them in its messages (role ``tool``).
    """

    messages: list[Message] | None = None
    tools: Sequence[str | ToolSpec | Callable[..., Any]] = ()
    observation: str | None = None
    tool_schemas: Sequence[dict[str, Any]] = ()


@dataclass
class EpisodeScore:
    """An episode's reward with its parts: ``value`` scores the episode; ``parts`` ({name: number}, a rubric's
    reward functions, unweighted) are logged as ``reward/<name>/mean`` and kept in the rollout log."""

    value: float
    parts: dict[str, float] = field(default_factory=dict)


@dataclass
class EnvStep:
    """The environment's answer to one policy turn.

    ``messages`` are appended after the turn (after the tool results the kernel already appended), as
    tokens the policy reads but is not trained on; with ``done`` they are only kept in the logged
    conversation (no turn follows them). ``done`` ends the episode; ``reward`` (read only when done) is its
    score, None to let the reward plugins score it. ``info`` is logged with the episode.

    ``context`` edits the conversation: the next turn sees these messages (then ``messages``) instead of
    everything so far (a summary of the history, a sliding window). Only step-wise runs
    (``rollout.step_wise: true``) train on edited contexts, each turn as its own sample; in a run that
    trains each episode as one sequence an edit ends the episode as an error.
    """

    messages: list[Message] = field(default_factory=list)
    done: bool = False
    reward: float | EpisodeScore | None = None
    info: dict[str, Any] = field(default_factory=dict)
    context: list[Message] | None = None


@dataclass
class Turn:
    """One policy turn, as the environment sees it.

    ``index``: 0 for the first turn. ``reply``: the assistant's text (special tokens removed).
    ``tool_calls`` / ``tool_results``: what the kernel parsed from the reply and what the tools it ran answered
    (in the same order; errors included, as the model sees them; none for the calls of the environment's own
    ``EnvStart.tool_schemas``, which ``step`` answers). ``messages``: the conversation so far, this reply and the
    tool results included. ``sample``: the episode's :class:`plugrl.data.Sample`. ``last``: no further turn will
    follow (``rollout.max_turns`` reached): the environment may still return a reward.
    """

    index: int
    reply: str
    tool_calls: list[ToolCall]
    tool_results: list[ToolResult]
    messages: list[Message]
    sample: Any
    last: bool = False


class Environment:
    """A convenient base: start with the sample's prompt and no tools of its own; end the episode at the
    first reply that calls no tool. Override either method (plain or ``async def``)."""

    def start(self, sample: Any) -> EnvStart | list[Message] | None:
        return EnvStart()

    def step(self, turn: Turn) -> EnvStep | list[Message] | None:
        return EnvStep(done=not turn.tool_calls)


def own_runner(make_env: Any) -> Callable[..., Any] | None:
    """The ``episode_runner`` of an environment class (or of a ``functools.partial`` of one) that plays its
    episodes itself; None for an environment the kernel plays turn by turn."""
    factory = getattr(make_env, "func", make_env)
    return getattr(factory, "episode_runner", None) if isinstance(factory, type) else None
