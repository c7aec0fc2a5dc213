"""What a multi-turn episode said and did (:class:`Conversation`), beside its tokens: what the trainer, the rewards
and the rollout logs read of it.

The turns themselves are played by the package plugrl-multiturn (found through
:func:`plugrl.rollout.play.make_episode_runner`), whose records of an episode in flight
(:mod:`plugrl_multiturn.records`) agents (plugrl-agents) fill too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from plugrl.rollout.environment import Message


@dataclass
class Conversation:
    """What a multi-turn episode said and did, beside its tokens (:class:`plugrl.rollout.Rollout`).

    ``messages``: the whole conversation (the prompt's messages, then each turn and what answered it).
    ``finish``: ``done`` (the environment ended it), ``max_turns``, ``truncated`` (a token limit cut it)
    or ``error`` (its environment failed: ``error`` says how). ``reward``: the environment's, or None
    (the reward plugins score it); ``reward_parts`` its parts (:class:`plugrl.rollout.environment.EpisodeScore`).
    ``info``: the environment's ``EnvStep.info``, merged over turns.
    """

    messages: list[Message]
    environment: str
    turns: int = 0
    finish: str = ""
    reward: float | None = None
    reward_parts: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    tool_calls: int = 0
    tool_errors: int = 0
    cut_turns: int = 0  # turns cut at rollout.max_turn_tokens (the episode went on)
    context_edits: int = 0  # EnvStep.context replaced the conversation (step-wise runs)
    error: str | None = None
    prompt_count: int = 0  # the messages before the first turn (the prompt, a tool system message included)
    trl_prompt: list[Message] | None = None  # the prompt as TRL's reward functions get it (no tool system message)
    trl_replies: dict[int, Message] = field(default_factory=dict)  # assistant messages parsed as TRL parses them

    @property
    def last_reply(self) -> str:
        """The last assistant message: what the reward plugins score as the completion."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")

    def trl_completion(self) -> list[Message]:
        """The episode's turns as TRL's GRPOTrainer passes them to a reward function as ``completion``: each
        assistant message with its well-formed calls parsed out into ``tool_calls``
        (``[{"type": "function", "function": {"name", "arguments"}}]``, the content without them), each tool's
        answer as ``{"role": "tool", "name", "content"}``, the environment's messages as they are."""
        out: list[Message] = []
        names: dict[str, str] = {}  # call id -> tool name, for tool answers that carry only the id (OpenAI's)
        for i, m in enumerate(self.messages[self.prompt_count :], start=self.prompt_count):
            if m.get("role") == "assistant":
                reply = self.trl_replies.get(i) or _openai_assistant(m)
                names.update({str(c.get("id")): c["function"]["name"] for c in m.get("tool_calls") or [] if "id" in c})
                out.append(reply)
            elif m.get("role") == "tool":
                name = m.get("name") or names.get(str(m.get("tool_call_id")), "")
                out.append({"role": "tool", "name": name, "content": m.get("content")})
            else:
                out.append(dict(m))
        return out


def _openai_assistant(m: Message) -> Message:
    """An assistant message of a chat request (an agent's history: OpenAI's ``tool_calls``, their arguments as
    JSON text) in TRL's shape."""
    calls = m.get("tool_calls") or []
    if not calls:
        return {"role": "assistant", "content": m.get("content") or ""}
    shaped = []
    for c in calls:
        function = c.get("function", c)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        shaped.append({"type": "function", "function": {"name": function.get("name"), "arguments": arguments}})
    return {"role": "assistant", "content": m.get("content") or "", "tool_calls": shaped}
