"""The engine of turns: every live episode of a step advances one turn at a time, together.

A turn is one batched engine call for all live episodes, then the tool calls of every reply (run together
in worker processes), then every environment's ``step`` (awaited together), then the tokens that carry
each episode on to its next turn. The context is only ever appended to (:mod:`plugrl_multiturn.chat`), so
the sequence trained on holds exactly the tokens the policy sampled, with the tool and environment
tokens between them marked as not the policy's (``Rollout.policy_mask``).

Limits: ``rollout.max_turns`` policy turns; each turn at most ``rollout.max_turn_tokens`` tokens (a longer
one is cut there, closed, and answered like any other); the whole response (every turn and everything
between them) within ``data.max_response_length``, as verl counts a multi-turn response. An episode ends
when its environment says so, when the response budget runs out (``truncated``), after its last turn, or
when its environment fails (``error``, kept in the record). A missing package (plugrl-tools, for an
environment's tool functions) ends the run, not the episode.

Step-wise runs (``rollout.step_wise``, SkyRL's step-wise trajectories) also keep each policy turn as its
own rollout whose prompt is the whole context that turn saw (``Rollout.steps``); there an environment may
edit the context between turns (``EnvStep.context``), which one sequence per episode could not hold.

The records it fills (:class:`plugrl.rollout.multiturn.EpisodeRecord`, ``Conversation``, ``EpisodeStart``,
``MultiTurnLimits``) are the kernel's: agents (plugrl-agents) and the trainer share them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from plugrl.rollout.environment import EnvStart, EnvStep, Message, Turn
from plugrl.rollout.multiturn import Conversation
from plugrl.rollout.tools import (
    NoToolExecutor,
    ToolCall,
    ToolResult,
    ToolSpec,
    tool_authoring,
    tool_executor,
)
from plugrl.rollout.types import ImagePrompt, Rollout, RolloutEngine, SamplingSettings
from plugrl_multiturn.chat import ChatFormat
from plugrl_multiturn.env_results import as_env_start, as_env_step, check_score
from plugrl_multiturn.records import EpisodeRecord, EpisodeStart, MultiTurnLimits, reply_text, trl_assistant

log = logging.getLogger("plugrl.rollout")


@dataclass(kw_only=True)
class _Live(EpisodeRecord):
    """One turn-driven episode in flight."""

    env: Any
    where: str  # "environment 'name' (plugin p)": how errors name it
    sample: Any
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    schemas: list[dict] | None = None
    env_tools: frozenset[str] = frozenset()  # EnvStart.tool_schemas: called by the policy, answered by step()


class EpisodeRunner:
    """Runs multi-turn episodes on an engine. ``tools``: every registered tool (``rollout.tools`` are offered
    to every episode, an environment may ask for any); ``run_tools(pairs)`` runs (call, spec) pairs in worker
    processes and returns their results in order (plugrl-tools' ``ToolExecutor``)."""

    def __init__(
        self,
        engine: RolloutEngine,
        chat: ChatFormat,
        tokenizer: Any,
        limits: MultiTurnLimits,
        *,
        registered_tools: dict[str, ToolSpec],
        default_tools: Sequence[str],
        parser: Any,
        run_tools: Callable[[list[tuple[ToolCall, ToolSpec | None]]], list[ToolResult]],
        processor: Any = None,
    ):
        self.engine, self.chat, self.tokenizer, self.limits = engine, chat, tokenizer, limits
        self.processor = processor  # a vision-language model's (plugrl.vlm.Processor): renders image prompts
        self.registered_tools = registered_tools
        self.default_tools = list(default_tools)
        self.parser = parser
        self.run_tools = run_tools
        self.timings: dict[str, float] = {}
        self._prefill_ids = chat.encode(limits.prefill) if limits.prefill else []
        self._method_tools: dict[tuple[Any, str], ToolSpec] = {}  # (function, environment) -> its tool

    # ------------------------------------------------------------------ the loop
    def run(self, starts: Sequence[EpisodeStart], sampling: SamplingSettings) -> list[tuple[Rollout, Conversation]]:
        """Every episode of ``starts`` to its end; one engine call per turn for all live ones."""
        self.timings = {"generate": 0.0, "env": 0.0}
        t0 = time.perf_counter()
        live = _run_async(self._start_all(starts))
        self.timings["env"] += time.perf_counter() - t0
        for turn in range(self.limits.max_turns):
            active = [e for e in live if not e.done]
            if not active:
                break
            self._policy_turn(active, sampling)
            t0 = time.perf_counter()
            answering = [e for e in active if not e.done]
            results = self._tool_results(answering)
            _run_async(self._step_all(answering, results, turn, last=turn == self.limits.max_turns - 1))
            self.timings["env"] += time.perf_counter() - t0
        for e in live:
            if not e.done:
                e.end("max_turns")
        t0 = time.perf_counter()
        if any(callable(getattr(e.env, "reward", None)) for e in live):
            _run_async(self._final_rewards(live))
        if any(callable(getattr(e.env, "close", None)) for e in live):
            _run_async(self._close_all(live))
        self.timings["env"] += time.perf_counter() - t0
        return [(e.rollout(), e.conversation) for e in live]

    # ------------------------------------------------------------------ starting
    async def _start_all(self, starts: Sequence[EpisodeStart]) -> list[_Live]:
        return list(await asyncio.gather(*(self._start(s) for s in starts)))

    async def _start(self, s: EpisodeStart) -> _Live:
        conversation = Conversation(list(s.messages), environment=s.where)
        episode = _Live(
            env=None,
            where=s.where,
            sample=s.sample,
            prompt_ids=list(s.prompt_ids or []),
            conversation=conversation,
            image=s.image,
        )
        if self.limits.step_wise:
            episode.steps = []
        try:
            episode.env = s.make_env()
            begun = as_env_start(await _call(episode.env.start, s.sample, limit=self.limits.env_time_limit_s), s.where)
            self._open(episode, s, begun)
        except NoToolExecutor:  # a package the run needs is missing: no episode can start, so the run stops
            raise
        except Exception as e:  # the environment's fault: this episode only
            episode.end("error", f"{s.where}: start failed: {type(e).__name__}: {e}")
        episode.context = list(episode.prompt_ids)
        return episode

    def _open(self, episode: _Live, s: EpisodeStart, begun: EnvStart) -> None:
        tools = {name: self.registered_tools[name] for name in self.default_tools}
        for t in begun.tools:
            spec = self._tool(t, s.where)
            tools[spec.name] = spec
        episode.tools = tools
        own = [_checked_schema(schema, s.where) for schema in begun.tool_schemas]
        episode.env_tools = frozenset(schema["function"]["name"] for schema in own)
        clash = episode.env_tools & set(tools)
        if clash:
            raise ValueError(f"start() offers {sorted(clash)} both as tools the kernel runs and in tool_schemas")
        episode.schemas = [t.schema for t in tools.values()] + own or None
        messages = list(begun.messages) if begun.messages is not None else list(s.messages)
        if begun.observation:  # the first observation ends the last message (TRL's reset() result)
            if not messages:
                raise ValueError("start() returned an observation but no messages to add it to")
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + begun.observation}
        episode.conversation.trl_prompt = list(messages)
        if begun.messages is not None or episode.schemas or s.prompt_ids is None or begun.observation:
            messages = self.chat.with_tool_prompt(messages, episode.schemas)
            if episode.image is not None:
                self._render_image_prompt(episode, messages)
            else:
                episode.prompt_ids = self.chat.prompt_ids(messages, episode.schemas) + self._prefill_ids
            limit = self.limits.max_prompt_tokens
            if limit is not None and len(episode.prompt_ids) > limit:
                raise ValueError(
                    f"the episode's first prompt is {len(episode.prompt_ids)} tokens with its messages and tools' "
                    f"descriptions, more than data.max_prompt_length={limit}; raise data.max_prompt_length"
                )
        episode.conversation.messages = messages
        episode.conversation.prompt_count = len(messages)

    def _render_image_prompt(self, episode: _Live, messages: list[Message]) -> None:
        """The first prompt of an episode whose prompt has images, rendered afresh (the environment's messages, the
        tools' schemas) by the processor's chat template: its ids for the model (each image token expanded) and
        for the engine (one image token per image). The images stay the prompt's; ``<image>`` in the messages
        marks their places, as in the data."""
        from plugrl.vlm import count_places

        image = episode.image
        assert image is not None
        if self.processor is None:
            raise ValueError("a prompt with images needs the model's processor to render it (a text model was given)")
        if count_places(messages) != len(image.images):
            raise ValueError(
                f"start() returned messages with {count_places(messages)} image places (<image>) for the prompt's "
                f"{len(image.images)} images: keep the prompt's image places in the messages"
            )
        text = self.processor.render(messages, tools=episode.schemas)
        # templates write the schemas as JSON: a tool shown has its name in quotes
        missing = [t["function"]["name"] for t in episode.schemas or [] if f'"{t["function"]["name"]}"' not in text]
        if missing:
            raise ValueError(
                f"the processor's chat template does not show the tools {missing} in the prompt; give the model a "
                "processor whose template renders tools (or put their descriptions in the system message)"
            )
        engine_ids, model_ids, _ = self.processor.encode(text, image.images)
        prefill = self._prefill_ids
        episode.prompt_ids = model_ids + prefill
        episode.image = ImagePrompt(engine_ids + prefill, image.images, model_ids + prefill, lambda _: image.pixels)

    def _tool(self, t: Any, where: str) -> ToolSpec:
        if isinstance(t, ToolSpec):
            return t
        if isinstance(t, str):
            if t not in self.registered_tools:
                known = ", ".join(sorted(self.registered_tools)) or "none"
                raise ValueError(f"start() asks for the tool {t!r}, which no plugin registers (registered: {known})")
            return self.registered_tools[t]
        if callable(t):  # a method of the environment (or a closure) runs here, where its state lives
            method = getattr(t, "__func__", None)  # every episode's bound method of one class: one schema
            spec = self._method_tools.get((method, where)) if method is not None else None
            if spec is not None:
                return replace(spec, fn=t)
            authoring = tool_authoring()  # plugrl-tools' (a NoToolExecutor naming it without)
            spec = authoring.make_tool(t, plugin=where, in_process=not authoring.is_importable(t))
            if method is not None:
                self._method_tools[(method, where)] = spec
            return spec
        raise TypeError(f"EnvStart.tools holds {type(t).__name__}: give tool names, ToolSpec records or functions")

    # ------------------------------------------------------------------ one turn
    def _policy_turn(self, active: list[_Live], sampling: SamplingSettings) -> None:
        """One engine call for every active episode; each keeps at most its own budget of the tokens. A turn
        cut at ``max_turn_tokens`` is closed and answered like any other; one cut because the response budget
        ran out ends its episode (``truncated``)."""
        lim = self.limits
        left = [self._room(e) for e in active]
        budgets = [min(lim.max_turn_tokens, room) for room in left]
        t0 = time.perf_counter()
        out = self.engine.generate([e.engine_prompt() for e in active], replace(sampling, n=1, max_tokens=max(budgets)))
        self.timings["generate"] += time.perf_counter() - t0
        for e, group, budget, room in zip(active, out, budgets, left, strict=True):
            _, _, reply = e.take_reply(group[0], budget, room, reply_text(self.limits, self.tokenizer))
            e.conversation.messages.append({"role": "assistant", "content": reply})

    def _room(self, e: _Live) -> int:
        """Tokens episode ``e`` may still generate: the response budget, and in step-wise runs also what an
        edited context leaves of max_prompt_length + max_response_length."""
        lim = self.limits
        room = lim.max_response_tokens - len(e.ids)
        if e.steps is not None and lim.max_prompt_tokens is not None:
            room = min(room, lim.max_prompt_tokens + lim.max_response_tokens - len(e.context))
        return room

    def _tool_results(self, answering: list[_Live]) -> list[tuple[list[ToolCall], list[ToolResult]]]:
        """Each episode's parsed calls and their results. The calls of every episode run together: the tools
        of worker processes in one batch; each episode's own tools (``ToolSpec.in_process``) here (the tool
        executor's ``call_in_process``), in the order they were called, episodes concurrently."""
        limit = self.limits.max_tool_calls_per_turn
        calls: list[list[ToolCall]] = []
        pooled: list[tuple[ToolCall, ToolSpec | None]] = []
        own: list[list[ToolCall]] = []
        for e in answering:
            found = self.parser.parse(e.conversation.messages[-1]["content"]) if e.tools or e.env_tools else []
            if found:  # the reply as TRL's reward functions see it
                reply = len(e.conversation.messages) - 1
                e.conversation.trl_replies[reply] = trl_assistant(e.conversation.messages[reply]["content"], found)
            for k, call in enumerate(found):  # the formats without call ids (Hermes): one per call, for the results
                call.id = call.id or f"call_{e.conversation.turns - 1}_{k}"
            calls.append(found)
            own.append([])
            for c in _kernels(found[:limit], e.env_tools):
                spec = e.tools.get(c.name) if c.error is None else None
                if spec is not None and spec.in_process:
                    own[-1].append(c)
                else:
                    pooled.append((c, spec))
        pooled_results = iter(self.run_tools(pooled) if pooled else [])
        own_results = _run_async(self._own_tools(answering, own)) if any(own) else [[] for _ in answering]
        out = []
        for e, found, ran_here, here in zip(answering, calls, own, own_results, strict=True):
            by_call = {id(c): r for c, r in zip(ran_here, here, strict=True)}
            ran = _kernels(found[:limit], e.env_tools)
            mine = [by_call[id(c)] if id(c) in by_call else next(pooled_results) for c in ran]
            mine += [_over_limit(c, limit) for c in _kernels(found[limit:], e.env_tools)]
            e.conversation.tool_calls += len(found) - len(_kernels(found, e.env_tools)) + len(mine)
            e.conversation.tool_errors += sum(r.error is not None for r in mine)
            e.conversation.messages += [r.message() for r in mine]
            out.append((found, mine))
        return out

    async def _own_tools(self, answering: list[_Live], own: list[list[ToolCall]]) -> list[list[ToolResult]]:
        # an in-process tool is made by plugrl-tools' authoring, so its executor is there to run it
        call_in_process = tool_executor().call_in_process

        async def one(e: _Live, calls: list[ToolCall]) -> list[ToolResult]:
            lim = self.limits
            return [
                await call_in_process(
                    c,
                    e.tools[c.name],
                    time_limit_s=lim.tool_time_limit_s,
                    max_output_chars=lim.max_tool_output_chars,
                    offered=list(e.tools),
                )
                for c in calls
            ]

        return list(await asyncio.gather(*(one(e, calls) for e, calls in zip(answering, own, strict=True))))

    async def _step_all(self, answering: list[_Live], results: list, turn: int, last: bool) -> None:
        await asyncio.gather(*(self._step(e, c, r, turn, last) for e, (c, r) in zip(answering, results, strict=True)))

    async def _step(self, e: _Live, calls: list[ToolCall], results: list[ToolResult], turn: int, last: bool) -> None:
        msgs = e.conversation.messages
        reply = msgs[-1 - len(results)]["content"]
        view = Turn(turn, reply, calls, results, list(msgs), e.sample, last)
        try:
            step = as_env_step(await _call(e.env.step, view, limit=self.limits.env_time_limit_s), view, e.where)
        except Exception as err:
            e.end("error", f"{e.where}: step failed at turn {turn}: {type(err).__name__}: {err}")
            return
        e.conversation.info.update(step.info)
        if step.done:
            # a last word of the environment (verifiers' final_env_response) is kept in the conversation; no
            # turn follows it, so it is not written into the tokens
            e.conversation.messages += step.messages
            if step.reward is not None:
                score = check_score(step.reward, f"{e.where}: EnvStep.reward")
                e.conversation.reward, e.conversation.reward_parts = score.value, score.parts
            e.end("done")
            return
        if last:
            e.end("max_turns")
            return
        self._carry_on(e, results, step)

    async def _final_rewards(self, live: list[_Live]) -> None:
        await asyncio.gather(*(self._final_reward(e) for e in live))

    async def _final_reward(self, e: _Live) -> None:
        """An environment with a ``reward()`` method scores its episode however it ended (its last turn, the
        token budget, ``max_turns``) when ``step`` gave no reward; not when the environment failed."""
        method = getattr(e.env, "reward", None)
        if e.conversation.finish == "error" or e.conversation.reward is not None or not callable(method):
            return
        try:
            value = await _call(method, limit=self.limits.env_time_limit_s)
            score = None if value is None else check_score(value, "its result")
        except Exception as err:
            e.end("error", f"{e.where}: reward() failed: {type(err).__name__}: {err}")
            return
        if score is not None:
            e.conversation.reward, e.conversation.reward_parts = score.value, score.parts

    async def _close_all(self, live: list[_Live]) -> None:
        async def close(e: _Live) -> None:
            method = getattr(e.env, "close", None)
            if not callable(method):
                return
            try:
                await _call(method, limit=self.limits.env_time_limit_s)
            except Exception as err:  # the episode has its score (or its error) already
                log.warning("%s: close() failed: %s: %s", e.where, type(err).__name__, err)

        await asyncio.gather(*(close(e) for e in live))

    def _carry_on(self, e: _Live, results: list[ToolResult], step: EnvStep) -> None:
        """Close the turn and append what answered it, as the chat template writes them (not trained on)."""
        if step.context is not None:
            self._edit(e, step)
            return
        new = [r.message() for r in results] + list(step.messages)
        e.conversation.messages += step.messages
        more = self.chat.turn_end(e.ids, e.schemas) + self.chat.continuation(new, e.schemas) + self._prefill_ids
        if len(e.ids) + len(more) >= self.limits.max_response_tokens:  # no room left for another turn
            e.finish_reason = "length"
            e.end("truncated")
            return
        e.append(more, False)

    def _edit(self, e: _Live, step: EnvStep) -> None:
        """The environment replaced the conversation: the next turn reads ``context + messages``, rendered
        afresh by the chat template (a step-wise sample's prompt; the turns already sampled keep their
        tokens). The response budget keeps counting the turns and the answers appended to them; the edited
        context itself must fit max_prompt_length + max_response_length."""
        if not self.limits.step_wise:
            e.end(
                "error",
                f"{e.where}: step() edited the context (EnvStep.context), but this run trains each episode as one "
                "sequence, which cannot hold an edited context; set rollout.step_wise: true to train each turn as "
                "its own sample",
            )
            return
        if e.image is not None:
            e.end(
                "error",
                f"{e.where}: step() edited the context (EnvStep.context) of an episode whose prompt has images; "
                "plugrl does not re-render image prompts mid-episode yet: append messages instead",
            )
            return
        messages = self.chat.with_tool_prompt(list(step.context or []) + list(step.messages), e.schemas)
        e.conversation.messages = messages
        e.conversation.context_edits += 1
        context = self.chat.prompt_ids(messages, e.schemas) + self._prefill_ids
        limit = (self.limits.max_prompt_tokens or len(e.prompt_ids)) + self.limits.max_response_tokens
        if len(context) + 1 > limit or len(e.ids) >= self.limits.max_response_tokens:
            e.finish_reason = "length"
            e.end("truncated")
            return
        e.context = context


def _kernels(calls: list[ToolCall], env_tools: frozenset[str]) -> list[ToolCall]:
    """The calls the kernel runs: all but the well-formed calls of the environment's own tools."""
    return [c for c in calls if c.error is not None or c.name not in env_tools]


def _checked_schema(schema: Any, where: str) -> dict:
    function = schema.get("function") if isinstance(schema, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]):
        raise TypeError(
            f"{where}: EnvStart.tool_schemas entries must be {{'type': 'function', 'function': {{'name': ..., "
            f"'description': ..., 'parameters': {{...}}}}}}, got {schema!r:.80}"
        )
    return schema


def _over_limit(call: ToolCall, limit: int) -> ToolResult:
    return ToolResult(call, f"Error: more than {limit} tool calls in one reply; this one was not run", "too_many", 0.0)


class EnvironmentTimeout(Exception):
    """An environment's method ran past ``rollout.env_time_limit_s``."""


async def _call(method: Callable[..., Any], *args: Any, limit: float) -> Any:
    """``method(*args)``, awaited when it is ``async def``, in a thread otherwise (environments may block), within
    ``limit`` seconds (``rollout.env_time_limit_s``). A coroutine past it is cancelled; a thread cannot be, and
    finishes unobserved. What an environment awaits inside (a verifiers tool run by its ``env_response``, a
    sandbox) counts, since plugrl cannot limit it separately."""

    async def run() -> Any:
        if inspect.iscoroutinefunction(method):
            return await method(*args)
        result = await asyncio.to_thread(method, *args)
        return await result if inspect.isawaitable(result) else result

    try:
        return await asyncio.wait_for(run(), limit)
    except TimeoutError:
        raise EnvironmentTimeout(
            f"it ran past rollout.env_time_limit_s={limit:g} s; raise it if the environment is slow by design"
        ) from None


def _run_async(coro: Any) -> Any:
    """Run ``coro`` to completion from synchronous code (the trainer has no running event loop)."""
    return asyncio.run(coro)
