"""The records of multi-turn episodes: what an episode said and did (:class:`Conversation`), its tokens as they will
be trained (:class:`EpisodeRecord`), how it starts (:class:`EpisodeStart`) and its limits
(:class:`MultiTurnLimits`).

The turns themselves are played by the package plugrl-multiturn (found through
:func:`plugrl.rollout.play.make_episode_runner`); agents (plugrl-agents) fill the same records, and the trainer,
the rewards and the rollout logs read them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plugrl.rollout.environment import Message
from plugrl.rollout.tools import ToolCall
from plugrl.rollout.types import ImagePrompt, Rollout


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


def trl_assistant(text: str, calls: Sequence[ToolCall]) -> Message:
    """A reply as TRL's ``parse_response`` gives it: its calls in ``tool_calls`` and the text around them as the
    content; a reply with a malformed call stays plain text, as TRL falls back to decoding it."""
    if not calls or any(c.error is not None for c in calls):
        return {"role": "assistant", "content": text}
    content = text
    for raw in dict.fromkeys(c.raw for c in calls):
        content = content.replace(raw, "", 1)
    return {
        "role": "assistant",
        "content": content.strip(),
        "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls],
    }


@dataclass
class MultiTurnLimits:
    max_turns: int
    max_turn_tokens: int
    max_response_tokens: int
    max_tool_calls_per_turn: int
    # data.max_prompt_length: a prompt re-rendered with its tools' descriptions (or an environment's own
    # messages) must still fit; None: unchecked
    max_prompt_tokens: int | None = None
    # data.prefill: the start of every assistant turn, written after each generation prompt (context, not
    # trained) and in front of each reply's text, as single-turn runs put it in front of the one answer
    prefill: str = ""
    # rollout.step_wise: each turn also kept as its own rollout (Rollout.steps), edited contexts allowed
    step_wise: bool = False
    # rollout.tool_time_limit_s and max_tool_response_chars, for the episodes' own tools (ToolSpec.in_process),
    # which run here rather than in the tool workers
    tool_time_limit_s: float = 10.0
    max_tool_output_chars: int = 4000
    # rollout.env_time_limit_s: each call of an environment's start, step, reward and close
    env_time_limit_s: float = 60.0


@dataclass(kw_only=True)
class EpisodeRecord:
    """The tokens of an episode in flight, as it will be trained: what turn-driven episodes and agents
    (plugrl-agents' AgentRunner) both keep."""

    conversation: Conversation
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # the response so far: turns and what came between
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    context: list[int] = field(default_factory=list)  # what the next turn reads: prompt_ids + ids, unless edited
    steps: list[Rollout] | None = None  # step-wise runs: each turn as its own rollout
    done: bool = False  # no further turn
    finish_reason: str = "stop"  # the engine's, for the last turn: "length" when a limit cut it
    # a prompt with images: the engine's form of prompt_ids (one image token per image) beside the images
    image: ImagePrompt | None = None

    def engine_prompt(self) -> list[int] | ImagePrompt:
        """What the next turn's engine call reads: the context, or for a prompt with images the context with its
        prompt part as the engine takes it (the engine expands the image tokens itself) beside the images."""
        if self.image is None:
            return self.context
        return self.image.continued(self.context[len(self.image.model_ids) :])

    def append(self, ids: Sequence[int], policy: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids += ids
        self.context += ids
        self.mask += [int(policy)] * len(ids)
        if self.logprobs is not None:  # a policy turn without log-probs leaves the episode without them
            if policy and logprobs is None:
                self.logprobs = None
            else:  # 0.0 for the tokens the policy did not sample
                self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def take_reply(
        self, r: Rollout, budget: int, room: int, decode: Callable[[list[int]], str]
    ) -> tuple[list[int], bool, str]:
        """Append the policy's reply ``r`` to the episode, kept to ``budget`` tokens (``rollout.max_turn_tokens``
        or what is left of the response budget, ``room``): (the tokens kept, whether a limit cut it, its text by
        ``decode``). A turn cut because the response budget ran out ends the episode (``truncated``); one cut at
        ``max_turn_tokens`` goes on. Turn-driven episodes and agents' calls both record replies through this."""
        kept = list(r.response_ids[:budget])
        cut = len(r.response_ids) > budget or r.finish_reason == "length"
        logprobs = None if r.logprobs is None else r.logprobs[:budget]
        if self.steps is not None:
            self.steps.append(Rollout(list(self.context), list(kept), logprobs, "length" if cut else "stop"))
        self.append(kept, True, logprobs)
        self.finish_reason = "length" if cut else "stop"
        self.conversation.turns += 1
        self.conversation.cut_turns += int(cut)
        text = decode(kept)
        if cut and budget == room:
            self.end("truncated")
        return kept, cut, text

    def end(self, finish: str, error: str | None = None) -> None:
        self.done = True
        self.conversation.finish = finish
        if error:
            self.conversation.error = error

    def rollout(self) -> Rollout:
        return Rollout(
            self.prompt_ids, self.ids, self.logprobs, self.finish_reason, policy_mask=self.mask, steps=self.steps
        )


def reply_text(limits: Any, tokenizer: Any) -> Callable[[list[int]], str]:
    """How a policy turn reads in the conversation: the prefill the engine was given, then its tokens."""
    return lambda kept: limits.prefill + tokenizer.decode(kept, skip_special_tokens=True)


@dataclass
class EpisodeStart:
    """What the kernel knows of an episode before it starts: the sample, its rendered prompt (ids and chat
    messages) and its environment (None: the tool loop of :class:`plugrl.rollout.environment.Environment`)."""

    sample: Any
    prompt_ids: list[int] | None  # None: rendered from ``messages`` by the chat template
    messages: list[Message]
    make_env: Callable[[], Any]
    where: str
    image: ImagePrompt | None = None  # a prompt with images: prompt_ids as the engine takes them, the images
