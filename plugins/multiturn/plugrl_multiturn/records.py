"""The records of an episode in flight, which the turn-by-turn runner (:mod:`plugrl_multiturn.turns`) and agents
(plugrl-agents) fill: its tokens as they will be trained (:class:`EpisodeRecord`), how it starts
(:class:`EpisodeStart`), its limits (:class:`MultiTurnLimits`), and a reply as TRL's reward functions read it
(:func:`trl_assistant`). What the trainer, the rewards and the rollout logs read of a finished episode, its
:class:`plugrl.rollout.multiturn.Conversation`, is the kernel's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plugrl.rollout.environment import Message
from plugrl.rollout.multiturn import Conversation
from plugrl.rollout.tools import ToolCall
from plugrl.rollout.types import ImagePrompt, Rollout


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
