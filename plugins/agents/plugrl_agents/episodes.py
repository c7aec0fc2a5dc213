"""Agent episodes: agents written with the ``openai`` client (:func:`plugrl_agents.agents.openai_agent`) play
against the run's own engine through a local OpenAI-compatible endpoint, and plugrl records the exact tokens
of every call.

Who calls what: plugrl-multiturn's player (:class:`plugrl_multiturn.player.EpisodePlayer`) hands the episodes
whose environment is an agent to :meth:`AgentRunner.run`, which returns what
:meth:`plugrl_multiturn.turns.EpisodeRunner.run` returns for the others, one ``(Rollout, Conversation)`` per
episode: rewards, advantages, logs and step-wise training see no difference.

Threads. The agents run as asyncio tasks on an event loop in a thread of their own (a plain ``def`` agent in a
worker thread of that loop); the endpoint serves HTTP on its own loop (:mod:`plugrl_agents.endpoint`) and
queues each call. Everything else happens in the caller's (the trainer's) thread: rendering, the engine (which
is not thread-safe) and each episode's record. That thread waits until every agent still playing has a call
waiting or has returned, or until no new call has come for ``batch_wait_s`` (the others are busy in their own
tools; at most ``max_batch_wait_s`` after the oldest call), then makes one engine call for all waiting calls
(one sample each) and answers them; until every agent has returned.

Tokens. An episode is one sequence, built only by appending (:mod:`plugrl_multiturn.chat`): a call whose
messages are the previous call's messages, then the reply it got, then new messages (tool results, user
turns) reads the previous context, the tokens the policy sampled, and the chat template's tokens of the new
messages only. The sequence trained on holds exactly the sampled tokens (their log-probs kept); the tokens
between calls are masked out (``Rollout.policy_mask``, log-prob 0.0). A call whose messages (or tools) do not
extend the previous ones rewrites the history: with ``rollout.step_wise`` it reads a fresh rendering and is a
sample of its own (``Rollout.steps``, as every call is in step-wise runs); otherwise it is refused (HTTP 400)
and the episode ends as an error. It is never silently re-tokenized.

Limits, as for turn-driven episodes: ``rollout.max_turns`` calls, ``rollout.max_turn_tokens`` per call
(``max_tokens`` in a request may only lower it), ``data.max_response_length`` for the whole response. A call
past a limit is refused and ends the episode (``max_turns``, ``truncated``: the latter with OpenAI's error code
``context_length_exceeded``); a reply cut because the response budget ran out is answered
(``finish_reason: length``) and ends it too.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import queue
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from plugrl.rollout.environment import Message
from plugrl.rollout.multiturn import Conversation
from plugrl.rollout.types import Rollout, RolloutEngine, SamplingSettings
from plugrl_agents.agents import AgentEpisode
from plugrl_agents.endpoint import ChatEndpoint, ChatReply, ChatRequest, ReplyToolCall, RequestError
from plugrl_multiturn.chat import ChatFormat, ChatTemplateError
from plugrl_multiturn.env_results import check_score
from plugrl_multiturn.records import EpisodeRecord, EpisodeStart, MultiTurnLimits, reply_text

log = logging.getLogger("plugrl.rollout")


class _Refusal(Exception):
    """A call that is answered with an error (HTTP 400, ``message``); ``finish``: how it ends the episode (None:
    the episode had ended already)."""

    def __init__(self, message: str, finish: str | None):
        super().__init__(message)
        self.message, self.finish = message, finish


class _TimedOut(Exception):
    pass


@dataclass
class _Call:
    """A call admitted to the next engine batch, and what answering it does to its episode."""

    request: ChatRequest
    future: Future
    arrived: float
    context: list[int]  # what the engine reads
    between: list[int]  # appended before the reply, not the policy's ([] when fresh)
    fresh: bool  # the first call, or a rewritten history: ``context`` replaces the episode's
    budget: int  # tokens this reply may keep
    room: int  # what is left of the response budget: a reply cut at it ends the episode


@dataclass(kw_only=True)
class _Episode(EpisodeRecord):
    """One agent episode in flight: its record (``prompt_ids`` the first call's context, ``context`` what the
    last call read, then its reply; ``done``: no further call is answered) and where its calls stand."""

    start: EpisodeStart
    key: str
    agent: AgentEpisode | None = None
    history: list[Message] | None = None  # the last call's messages and the reply: what the next must extend
    tools: list[dict] | None = None  # the last call's tools
    reply_ids: list[int] = field(default_factory=list)  # the last reply's tokens
    pending: _Call | None = None
    returned: bool = False  # the agent returned, raised or timed out


class AgentRunner:
    """Plays agent episodes on ``engine`` (see the module docstring). ``run(starts, sampling)`` per step;
    ``close()`` at the run's end stops the endpoint, which the first ``run`` started."""

    def __init__(
        self,
        engine: RolloutEngine,
        chat: ChatFormat,
        tokenizer: Any,
        limits: MultiTurnLimits,
        *,
        parser: Any,
        batch_wait_s: float = 0.03,
        max_batch_wait_s: float = 1.0,
    ):
        self.engine, self.chat, self.tokenizer, self.limits, self.parser = engine, chat, tokenizer, limits, parser
        self.batch_wait_s, self.max_batch_wait_s = batch_wait_s, max_batch_wait_s
        self.endpoint = ChatEndpoint(self)
        self.timings: dict[str, float] = {}
        self.engine_calls = 0  # engine.generate calls so far (one per batch of calls)
        self._events: queue.Queue = queue.Queue()
        self._live: dict[str, _Episode] = {}  # key -> episode, for the endpoint's thread
        self._prefill_ids = chat.encode(limits.prefill) if limits.prefill else []
        self._noted: set[str] = set()

    def close(self) -> None:
        """Stop the endpoint (the run's end); a later ``run`` starts it again."""
        self.endpoint.close()

    # ------------------------------------------------------------------ the endpoint's backend (its thread)
    def knows(self, key: str) -> bool:
        return key in self._live

    def submit(self, key: str, request: ChatRequest) -> Future:
        future: Future = Future()
        self._events.put(("call", key, request, future, time.perf_counter()))
        return future

    # ------------------------------------------------------------------ a step's episodes
    def run(self, starts: Sequence[EpisodeStart], sampling: SamplingSettings) -> list[tuple[Rollout, Conversation]]:
        """Every agent of ``starts`` played to its end, its calls served in batches; the records in order."""
        t0 = time.perf_counter()
        self.timings = {"generate": 0.0, "env": 0.0}
        url = self.endpoint.start()
        episodes = [self._open(s) for s in starts]
        mine = {e.key: e for e in episodes}
        self._live.update(mine)
        agents = threading.Thread(target=self._play_agents, args=(episodes, url), name="plugrl-agents", daemon=True)
        agents.start()
        try:
            self._serve(episodes, mine, sampling, agents)
        finally:
            for key in mine:
                self._live.pop(key, None)
            self._refuse_the_rest(episodes)
        agents.join(timeout=5)
        self.timings["env"] = time.perf_counter() - t0 - self.timings["generate"]
        return [self._result(e) for e in episodes]

    def _open(self, s: EpisodeStart) -> _Episode:
        episode = _Episode(
            start=s, key=secrets.token_urlsafe(24), conversation=Conversation(list(s.messages), environment=s.where)
        )
        if self.limits.step_wise:
            episode.steps = []
        try:
            episode.agent = s.make_env()
        except Exception as e:  # the plugin's fault: this episode only
            episode.end("error", f"{s.where}: making the episode failed: {type(e).__name__}: {e}")
            episode.returned = True
        return episode

    def _serve(
        self, episodes: list[_Episode], mine: dict[str, _Episode], sampling: SamplingSettings, agents: threading.Thread
    ) -> None:
        """Answer calls until every agent has returned: one engine call per batch of waiting calls."""
        last_arrival = 0.0
        while not all(e.returned for e in episodes):
            waiting = [e for e in episodes if e.pending is not None]
            timeout = 0.5
            if waiting:
                oldest = min(e.pending.arrived for e in waiting)
                timeout = min(last_arrival + self.batch_wait_s, oldest + self.max_batch_wait_s) - time.perf_counter()
            for event in self._next_events(max(timeout, 0.0)):
                if event[0] == "call":
                    last_arrival = event[4]
                    self._admit(mine.get(event[1]), *event[2:])
                else:
                    self._returned(*event[1:])
            waiting = [e for e in episodes if e.pending is not None]
            busy = any(not e.returned and e.pending is None for e in episodes)
            now = time.perf_counter()
            if waiting and (
                not busy
                or now - last_arrival >= self.batch_wait_s
                or now - min(e.pending.arrived for e in waiting) >= self.max_batch_wait_s
            ):
                self._generate(waiting, sampling)
            elif not waiting and not agents.is_alive() and self._events.empty():
                for e in episodes:  # cannot happen unless the agents' thread itself failed
                    if not e.returned:
                        self._returned(e, None, RuntimeError("the agents' thread stopped before the agent returned"))

    def _next_events(self, timeout: float) -> list[tuple]:
        try:
            events = [self._events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:  # every call already queued joins this round
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    # ------------------------------------------------------------------ admitting a call
    def _admit(self, e: _Episode | None, request: ChatRequest, future: Future, arrived: float) -> None:
        if e is None:  # a key of an earlier step, revoked while its call was on its way
            _fail(future, RequestError("unknown api key: this episode has ended", status=401))
            return
        self._note_ignored(request)
        try:
            e.pending = self._plan(e, request, future, arrived)
        except _Refusal as r:
            if r.finish is not None:  # the refused call ends the episode
                e.end(r.finish, f"{e.start.where}: {r.message}" if r.finish == "error" else None)
                if r.finish == "truncated":
                    e.finish_reason = "length"
            # the response budget spent is the episode's context exhausted: OpenAI's code for it lets an agent
            # that handles a full context (verifiers' v1 harnesses end their run cleanly) tell it apart
            code = "context_length_exceeded" if r.finish == "truncated" else None
            _fail(future, RequestError(r.message, code=code))

    def _plan(self, e: _Episode, request: ChatRequest, future: Future, arrived: float) -> _Call:
        """The call's context and budget, or a :class:`_Refusal` saying why it cannot be answered."""
        lim = self.limits
        if e.done:
            raise _Refusal(
                f"this episode has ended ({e.conversation.finish}): no further call is answered; return the "
                "episode's reward",
                None,
            )
        if e.pending is not None:
            raise _Refusal(
                "this episode already has a call waiting for its reply: an episode's calls form one conversation, "
                "so make one call at a time (await each reply before the next call)",
                "error",
            )
        if e.conversation.turns >= lim.max_turns:
            raise _Refusal(
                f"rollout.max_turns={lim.max_turns} calls per episode were made; this call was not answered and the "
                "episode has ended",
                "max_turns",
            )
        fresh = e.history is None
        new = None if fresh or request.tools != e.tools else _extension(e.history, request.messages)
        if not fresh and new is None:
            if not lim.step_wise:
                raise _Refusal(
                    f"call {e.conversation.turns + 1} does not extend the previous call's messages and the reply it "
                    "got (or changes the tools), so the episode cannot be trained as one sequence; keep the history "
                    "append-only (send back the assistant message as it came), or set rollout.step_wise: true to "
                    "train each call as its own sample",
                    "error",
                )
            fresh = True
        context, between, room = self._fresh(e, request) if fresh else self._appended(e, request, new)
        budget = min(lim.max_turn_tokens, room, request.max_tokens or room)
        return _Call(request, future, arrived, context, between, fresh, budget, room)

    def _fresh(self, e: _Episode, request: ChatRequest) -> tuple[list[int], list[int], int]:
        """(context, nothing between, room) of a call that reads its messages rendered afresh: the episode's
        first, or (step-wise) one that rewrote the history."""
        lim = self.limits
        try:
            messages = self.chat.with_tool_prompt(_renderable(request.messages), request.tools)
            context = self.chat.prompt_ids(messages, request.tools) + self._prefill_ids
        except Exception as err:
            raise _Refusal(_template_error(err), "error") from None
        if e.history is None:
            if lim.max_prompt_tokens is not None and len(context) > lim.max_prompt_tokens:
                raise _Refusal(
                    f"the first call's prompt is {len(context)} tokens with its messages and tools, more than "
                    f"data.max_prompt_length={lim.max_prompt_tokens}; raise data.max_prompt_length",
                    "error",
                )
            return context, [], lim.max_response_tokens
        # as an edited context in a step-wise run: it must fit max_prompt_length + max_response_length
        limit = (lim.max_prompt_tokens or len(e.prompt_ids)) + lim.max_response_tokens
        room = min(lim.max_response_tokens - len(e.ids), limit - len(context))
        if room < 1:
            raise _Refusal(self._no_room(), "truncated")
        return context, [], room

    def _appended(self, e: _Episode, request: ChatRequest, new: list[Message]) -> tuple[list[int], list[int], int]:
        """(context, between, room) of a call that extends the previous one: the previous context and reply,
        then ``between``: the tokens that close the reply and write the new messages and the next generation
        prompt."""
        lim, tools = self.limits, request.tools
        named = _renderable(request.messages)[len(request.messages) - len(new) :]
        try:
            between = self.chat.turn_end(e.reply_ids, tools) + self.chat.continuation(named, tools) + self._prefill_ids
        except Exception as err:
            raise _Refusal(_template_error(err), "error") from None
        room = lim.max_response_tokens - len(e.ids) - len(between)
        if e.steps is not None and lim.max_prompt_tokens is not None:
            room = min(room, lim.max_prompt_tokens + lim.max_response_tokens - len(e.context) - len(between))
        if room < 1:
            raise _Refusal(self._no_room(), "truncated")
        return e.context + between, between, room

    def _no_room(self) -> str:
        return (
            f"data.max_response_length={self.limits.max_response_tokens} tokens (the episode's whole response: "
            "every reply and every message between them) leave no room for another reply; the episode has ended"
        )

    def _note_ignored(self, request: ChatRequest) -> None:
        new = [k for k in request.ignored if k not in self._noted]
        if new:
            self._noted.update(new)
            log.info(
                "agent calls set %s: ignored; the policy samples with the run's rollout settings, which it trains "
                "under (the X-Plugrl-Ignored header of each reply lists what was ignored)",
                ", ".join(new),
            )

    # ------------------------------------------------------------------ answering a batch
    def _generate(self, waiting: list[_Episode], sampling: SamplingSettings) -> None:
        """One engine call for every waiting call (one sample each); each keeps at most its own budget."""
        live = []
        for e in waiting:
            if e.pending.future.set_running_or_notify_cancel():
                live.append(e)
            else:  # its agent stopped waiting (cancelled): the call is not answered, nor recorded
                e.pending = None
        if not live:
            return
        budget = max(e.pending.budget for e in live)
        t0 = time.perf_counter()
        out = self.engine.generate([e.pending.context for e in live], replace(sampling, n=1, max_tokens=budget))
        self.timings["generate"] += time.perf_counter() - t0
        self.engine_calls += 1
        headers = {
            "X-Plugrl-Sampling": f"temperature={sampling.temperature} top_p={sampling.top_p} "
            f"top_k={sampling.top_k} (the run's rollout settings)"
        }
        for e, group in zip(live, out, strict=True):
            self._answer(e, group[0], headers)

    def _answer(self, e: _Episode, r: Rollout, headers: dict[str, str]) -> None:
        """Record the reply in the episode and answer the call with it."""
        call, conversation = e.pending, e.conversation
        e.pending = None
        if call.fresh:
            if e.history is None:
                e.prompt_ids = list(call.context)
            else:
                conversation.context_edits += 1
            e.context = list(call.context)
        else:
            e.append(call.between, False)
        # the response budget running out (a cut at call.room) ends the episode: no room for another call
        kept, cut, text = e.take_reply(r, call.budget, call.room, reply_text(self.limits, self.tokenizer))
        e.reply_ids = kept
        content, calls, malformed = self._tool_calls(text, call.request.tools, conversation.turns - 1)
        conversation.tool_calls += len(calls)
        conversation.tool_errors += malformed
        returned: Message = {"role": "assistant", "content": content or ""}
        if calls:
            returned["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
        e.history = [*call.request.messages, returned]
        e.tools = call.request.tools
        conversation.messages = [*call.request.messages, {"role": "assistant", "content": text}]
        if conversation.trl_prompt is None:  # the agent's first request is the episode's prompt
            conversation.trl_prompt = list(call.request.messages)
            conversation.prompt_count = len(call.request.messages)
        conversation.trl_replies = {len(conversation.messages) - 1: _trl_reply(text, content, calls, malformed)}
        extra = {"X-Plugrl-Ignored": ", ".join(call.request.ignored)} if call.request.ignored else {}
        finish = "tool_calls" if calls else "length" if cut else "stop"
        call.future.set_result(
            ChatReply(content, calls, finish, len(call.context), len(kept), headers={**headers, **extra})
        )

    def _tool_calls(self, text: str, tools: list[dict] | None, turn: int) -> tuple[str | None, list, int]:
        """(the content without its well-formed calls, or None when nothing else is left; the calls; how many
        calls were malformed). Replies are parsed only when the call offered tools; a malformed call stays in
        the content, as the model wrote it."""
        if not tools:
            return text, [], 0
        found = self.parser.parse(text)
        good = [c for c in found if c.error is None]
        content = text
        for raw in dict.fromkeys(c.raw for c in good):
            content = content.replace(raw, "", 1)
        calls = [ReplyToolCall(c.id or f"call_{turn}_{k}", c.name, c.arguments) for k, c in enumerate(good)]
        return (content.strip() or None) if good else text, calls, len(found) - len(good)

    # ------------------------------------------------------------------ the agents' ends
    def _returned(self, e: _Episode, value: Any, error: BaseException | None) -> None:
        """The agent returned ``value`` or failed with ``error``: settle how its episode ended and its score."""
        e.returned = True
        if e.pending is not None:  # it stopped waiting for its call (a time limit)
            _fail(e.pending.future, RequestError("the agent has returned"))
            e.pending = None
        where, conversation = e.start.where, e.conversation
        if error is not None:
            if not e.done:  # a refused call ended it already: that is how it ended, whatever the agent did next
                e.end("error", f"{where}: the agent failed: {_describe(error)}")
            return
        try:
            score = None if value is None else check_score(value, "the agent's return value")
        except TypeError as err:
            e.end("error", f"{where}: {err}")
            return
        if conversation.turns == 0:
            e.end("error", f"{where}: the agent returned without calling the model; there is nothing to train on")
            return
        if conversation.finish != "error" and score is not None:
            conversation.reward, conversation.reward_parts = score.value, score.parts
            e.agent.result = score.value
        if not e.done:
            e.end("done")

    def _refuse_the_rest(self, episodes: list[_Episode]) -> None:
        """After the step: calls that are still waiting (an agent past its time limit) are refused."""
        for e in episodes:
            if e.pending is not None:
                _fail(e.pending.future, RequestError("this episode has ended", status=401))
            e.pending = None
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            if event[0] == "call":
                _fail(event[3], RequestError("unknown api key: this episode has ended", status=401))

    def _result(self, e: _Episode) -> tuple[Rollout, Conversation]:
        if e.history is None:  # no call was answered: the sample's prompt, an empty response
            e.prompt_ids = list(e.start.prompt_ids or self.chat.prompt_ids(e.start.messages, None))
        rollout = e.rollout()
        return rollout, e.conversation

    # ------------------------------------------------------------------ the agents' thread
    def _play_agents(self, episodes: list[_Episode], url: str) -> None:
        """The agents' thread: every agent of ``episodes`` to its end, each end reported as an event."""
        playing = [e for e in episodes if not e.returned]
        try:
            import openai  # noqa: F401 (imported once, here: its first import must not count against a time limit)

            asyncio.run(self._agents(playing, url))
        except BaseException as err:  # the agents could not run at all: each episode says why
            for e in playing:
                self._events.put(("returned", e, None, err))

    async def _agents(self, episodes: list[_Episode], url: str) -> None:
        threads = sum(not e.agent.is_async for e in episodes)
        pool = ThreadPoolExecutor(threads, thread_name_prefix="plugrl-agent") if threads else None
        try:
            await asyncio.gather(*(self._agent(e, url, pool) for e in episodes))
        finally:
            if pool is not None:  # a thread past its time limit cannot be stopped: do not wait for it
                pool.shutdown(wait=False, cancel_futures=True)

    async def _agent(self, e: _Episode, url: str, pool: ThreadPoolExecutor | None) -> None:
        """Run one agent to its end and report it; never raises."""
        agent, value, error = e.agent, None, None
        try:
            if agent.is_async:
                work = _solve_async(agent, e, url)
            else:
                work = asyncio.get_running_loop().run_in_executor(pool, _solve_sync, agent, e, url)
            value = await asyncio.wait_for(work, agent.time_limit_s)
        except asyncio.TimeoutError:
            error = _TimedOut(f"it ran past its time limit of {agent.time_limit_s} s (openai_agent(time_limit_s=...))")
        except Exception as err:
            error = err
        finally:
            self._events.put(("returned", e, value, error))


async def _solve_async(agent: AgentEpisode, e: _Episode, url: str) -> Any:
    import openai

    client = openai.AsyncOpenAI(**_client_kwargs(agent, e, url, openai.DefaultAsyncHttpxClient))
    try:
        return await agent.solve(client, e.start.sample, **agent.options)
    finally:
        await client.close()


def _solve_sync(agent: AgentEpisode, e: _Episode, url: str) -> Any:
    import openai

    client = openai.OpenAI(**_client_kwargs(agent, e, url, openai.DefaultHttpxClient))
    try:
        result = agent.solve(client, e.start.sample, **agent.options)
        if inspect.isawaitable(result):
            raise TypeError("a plain def agent returned an awaitable; declare it async def")
        return result
    finally:
        client.close()


def _client_kwargs(agent: AgentEpisode, e: _Episode, url: str, http_client: Any) -> dict[str, Any]:
    # plain HTTP on the loopback: no proxy from the environment, no CA bundle to load (20 ms per client);
    # no retries (a retried call would be a second sample); no timeout but the agent's own limit
    return {
        "base_url": url,
        "api_key": e.key,
        "max_retries": 0,
        "timeout": agent.time_limit_s,
        "http_client": http_client(trust_env=False, verify=False, timeout=agent.time_limit_s),
    }


# ---------------------------------------------------------------------------- messages


def _extension(history: list[Message], messages: list[Message]) -> list[Message] | None:
    """The messages ``messages`` adds after ``history`` (the previous call's messages and its reply), or None
    when it does not start with them. The reply may come back with or without its ``tool_calls``, and with
    its content as it came (None and "" alike); every other message must come back unchanged."""
    if len(messages) <= len(history):
        return None
    for sent, kept in zip(messages, history, strict=False):
        if not _same(sent, kept):
            return None
    return messages[len(history) :]


def _same(sent: Message, kept: Message) -> bool:
    if sent["role"] != kept["role"] or sent["content"] != kept["content"]:
        return False
    if sent["role"] == "assistant":
        return not sent.get("tool_calls") or _calls(sent) == _calls(kept)
    return all(sent.get(k) == kept.get(k) for k in ("tool_call_id", "name"))


def _calls(message: Message) -> list[tuple[str, Any]]:
    """An assistant message's tool calls as (name, arguments), whichever form the arguments take."""
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        out.append((function.get("name"), arguments))
    return out


def _renderable(messages: list[Message]) -> list[Message]:
    """``messages`` as chat templates take them: tool-call arguments as objects (OpenAI sends JSON text), and a
    tool result named after the call it answers when the agent left the name out."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [_renderable_call(c) for c in m["tool_calls"]]
            names.update({c["id"]: c["function"]["name"] for c in m["tool_calls"] if c.get("id")})
        if m["role"] == "tool" and "name" not in m and m.get("tool_call_id") in names:
            m["name"] = names[m["tool_call_id"]]
        out.append(m)
    return out


def _renderable_call(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call["function"]["arguments"]
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        pass
    return {**call, "function": {**call["function"], "arguments": arguments}}


def _fail(future: Future, error: RequestError) -> None:
    """Answer a call with ``error``, unless its caller gave up on it (a cancelled future)."""
    if not future.done():
        future.set_exception(error)


def _template_error(error: Exception) -> str:
    if isinstance(error, ChatTemplateError):
        return str(error)
    return f"the chat template cannot render these messages: {type(error).__name__}: {error}"


def _describe(error: BaseException) -> str:
    if isinstance(error, _TimedOut):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _trl_reply(text: str, content: str | None, calls: list[ReplyToolCall], malformed: int) -> Message:
    """The agent's reply as TRL's reward functions see it: the calls in ``tool_calls``, the text around them as the
    content; plain text when a call was malformed (TRL decodes such a reply as it is)."""
    if not calls or malformed:
        return {"role": "assistant", "content": text}
    return {
        "role": "assistant",
        "content": content or "",
        "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls],
    }
