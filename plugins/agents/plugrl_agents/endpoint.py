"""An OpenAI-compatible chat endpoint on 127.0.0.1: what agents call during rollouts.

Who calls what: :class:`plugrl_agents.episodes.AgentRunner` starts one :class:`ChatEndpoint` per run
(lazily, when the first agent episode plays) and closes it at the run's end. The endpoint speaks OpenAI's
chat-completions wire format and nothing more: it reads a request (:func:`read_chat_request`), checks its
bearer key, hands it to its backend (:class:`ChatBackend`) and writes the backend's :class:`ChatReply` as a
``chat.completion`` (:func:`completion_json`). It generates nothing and runs nothing: the model's output is
only text, and what a reply holds is the backend's.

Routes: ``POST /v1/chat/completions`` and ``GET /v1/models``. A ``stream: true`` call is answered whole, as one
``chat.completion.chunk`` event (the reply, its tool calls and why it ended), a usage event when
``stream_options.include_usage`` asks for one, then ``[DONE]``: the policy samples each reply in one engine call,
so there is nothing to send earlier, and clients that always stream (verifiers' v1 harnesses, through their
interception server) read it as any stream. Errors are OpenAI's error objects (``{"error": {"message", "type",
"param", "code"}}``), so the ``openai`` client raises ``BadRequestError`` (400) or ``AuthenticationError`` (401)
carrying the message.

Served by aiohttp on an event loop of its own, in a daemon thread, bound to 127.0.0.1 (never another
interface) on a free port.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

HOST = "127.0.0.1"
MODEL = "policy"  # the id /v1/models lists; a request may name any model, the run's policy answers it

# request keys the endpoint does not apply, reported in the X-Plugrl-Ignored header: sampling is the run's
# (the policy trains under the sampling it samples with), and the reply's form is the model's own
IGNORED = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
)
_ROLES = ("system", "developer", "user", "assistant", "tool")
_MAX_BODY = 64 * 2**20  # a long agent conversation is still far below this


class RequestError(Exception):
    """A call the endpoint answers with an OpenAI error object: ``status`` 400 (what the request asks cannot
    be served; ``message`` says why and what to do) or 401 (an unknown key)."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code


@dataclass
class ChatRequest:
    """A chat-completions request, checked. ``messages``: each ``{"role", "content": str}`` plus, where given,
    ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments": JSON text}}]``),
    ``tool_call_id`` and ``name``; ``developer`` is read as ``system``, text parts are joined, a missing or
    null content is ``""``. ``tools``: OpenAI function schemas, or None. ``max_tokens``: the smaller of
    ``max_tokens`` and ``max_completion_tokens``, None when neither is set. ``ignored``: the request's keys of
    :data:`IGNORED` it set. ``stream``: answer as server-sent events; ``include_usage``: with a usage event."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    ignored: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False


@dataclass
class ReplyToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class ChatReply:
    """What the backend answers a call with: the assistant's text (None when it only called tools), its tool
    calls, why it ended (``stop``, ``length`` or ``tool_calls``), the token counts, and headers to add."""

    content: str | None
    tool_calls: list[ReplyToolCall]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    headers: dict[str, str] = field(default_factory=dict)


class ChatBackend(Protocol):
    """Who answers the calls. ``knows(key)``: whether ``key`` is a live episode's. ``submit(key, request)`` is
    called on the endpoint's thread and returns a future the backend completes from any thread, with a
    :class:`ChatReply` or a :class:`RequestError`."""

    def knows(self, key: str) -> bool: ...

    def submit(self, key: str, request: ChatRequest) -> Future[ChatReply]: ...


# ---------------------------------------------------------------------------- the wire format


def read_chat_request(body: Any) -> ChatRequest:
    """``body`` (the request's JSON) as a :class:`ChatRequest`; a :class:`RequestError` saying what is wrong
    with it otherwise (``n`` above 1 and non-text content are refused)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options must be an object, e.g. {'include_usage': true}", param="stream_options")
    if body.get("n") not in (None, 1):
        raise RequestError("n must be 1: each call is one sample of the policy (call again for another)", param="n")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of chat messages", param="messages")
    model = body.get("model")
    return ChatRequest(
        model=model if isinstance(model, str) and model else MODEL,
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=_tools(body.get("tools")),
        max_tokens=_max_tokens(body),
        ignored=tuple(k for k in IGNORED if body.get(k) is not None),
        stream=bool(body.get("stream")),
        include_usage=bool((options or {}).get("include_usage")),
    )


def _message(m: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise RequestError(f"{where} must be an object with 'role' and 'content'", param=where)
    role = m.get("role")
    if role not in _ROLES:
        raise RequestError(f"{where}.role {role!r} is not served; use one of {', '.join(_ROLES)}", param=where)
    out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": _text(m.get("content"), where)}
    if role == "assistant" and m.get("tool_calls"):
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls must be a list", param=where)
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)]
    for key in ("tool_call_id", "name"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}.content holds a {kind!r} part: only text is served", param=where)
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where}.content must be a string or a list of text parts", param=where)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
        raise RequestError(f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):  # some clients send the object itself
        arguments = json.dumps(arguments if arguments is not None else {})
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of {'type': 'function', 'function': {...}} schemas", param="tools")
    for k, t in enumerate(tools):
        function = t.get("function") if isinstance(t, dict) else None
        if not (t.get("type") == "function" and isinstance(function, dict) and isinstance(function.get("name"), str)):
            raise RequestError(
                f"tools[{k}] must be {{'type': 'function', 'function': {{'name', 'description', 'parameters'}}}}",
                param="tools",
            )
    return json.loads(json.dumps(tools))  # a copy the caller cannot change under us


def _max_tokens(body: dict[str, Any]) -> int | None:
    limits = []
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"{key} must be a positive integer, got {value!r}", param=key)
        limits.append(value)
    return min(limits) if limits else None


def completion_json(reply: ChatReply, model: str) -> dict[str, Any]:
    """``reply`` as OpenAI's ``chat.completion`` object (tool arguments as JSON text, as OpenAI sends them)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in reply.tool_calls
        ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def stream_events(reply: ChatReply, model: str, *, include_usage: bool = False) -> bytes:
    """``reply`` as the server-sent events of a streamed chat completion: one chunk holding the whole message
    (each tool call with its ``index``, as deltas number them) and why it ended; with ``include_usage`` a usage
    chunk (empty ``choices``, as OpenAI sends it); then ``[DONE]``."""
    whole = completion_json(reply, model)
    message = whole["choices"][0]["message"]
    for index, call in enumerate(message.get("tool_calls") or []):
        call["index"] = index
    head = {"id": whole["id"], "object": "chat.completion.chunk", "created": whole["created"], "model": model}
    events = [{**head, "choices": [{"index": 0, "delta": message, "finish_reason": reply.finish_reason}]}]
    if include_usage:
        events.append({**head, "choices": [], "usage": whole["usage"]})
    return b"".join(f"data: {json.dumps(event)}\n\n".encode() for event in events) + b"data: [DONE]\n\n"


def error_json(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = {401: "authentication_error"}.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# ---------------------------------------------------------------------------- the server


class ChatEndpoint:
    """The HTTP server. ``start()`` (idempotent) returns the base URL, ``http://127.0.0.1:<port>/v1``, the
    ``base_url`` of an ``openai`` client; ``close()`` stops it. Every route needs ``Authorization: Bearer
    <key>`` with a key the backend knows."""

    def __init__(self, backend: ChatBackend, *, model: str = MODEL):
        self.backend, self.model = backend, model
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def start(self) -> str:
        if self.url is not None:
            return self.url
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="plugrl-chat-endpoint", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            port = asyncio.run_coroutine_threadsafe(self._serve(), loop).result(timeout=30)
        except BaseException:
            self.close()
            raise
        self.url = f"http://{HOST}:{port}/v1"
        return self.url

    async def _serve(self) -> int:
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # no access log (one line per call); in-flight calls get 1 s to finish when the run closes it
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0, backlog=1024)  # port 0: a free one; every agent connects at once
        await site.start()
        return self._runner.addresses[0][1]

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._runner is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(timeout=10)
            except Exception:  # closing at the run's end: nothing left to save
                pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not loop.is_running():
            loop.close()
        self._loop = self._thread = self._runner = None
        self.url = None

    # ------------------------------------------------------------------ routes
    def _key(self, request: web.Request) -> str:
        header = request.headers.get("Authorization", "")
        key = header[len("Bearer ") :].strip() if header.startswith("Bearer ") else ""
        if not key or not self.backend.knows(key):
            raise RequestError(
                "unknown api key: use the client plugrl passes to the agent (its api_key is the episode's key, "
                "valid while the episode plays)",
                status=401,
            )
        return key

    async def _models(self, request: web.Request) -> web.Response:
        return await _answering(self._list_models, request)

    async def _list_models(self, request: web.Request) -> web.Response:
        self._key(request)
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "plugrl"}
        return web.json_response({"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.Response:
        return await _answering(self._complete, request)

    async def _complete(self, request: web.Request) -> web.Response:
        key = self._key(request)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not JSON: {e}") from None
        chat = read_chat_request(body)
        reply: ChatReply = await asyncio.wrap_future(self.backend.submit(key, chat))
        if chat.stream:  # answered whole: one chunk (and the usage), then [DONE]
            events = stream_events(reply, chat.model, include_usage=chat.include_usage)
            return web.Response(body=events, content_type="text/event-stream", headers=reply.headers)
        return web.json_response(completion_json(reply, chat.model), headers=reply.headers)


async def _answering(handler: Callable[[web.Request], Any], request: web.Request) -> web.Response:
    """``handler(request)``, with a :class:`RequestError` (or a failure of the backend) as OpenAI's error."""
    try:
        return await handler(request)
    except RequestError as e:
        return web.json_response(error_json(e.message, e.status, e.param, e.code), status=e.status)
    except Exception as e:  # the backend's bug: the agent sees it as a server error, the run goes on
        return web.json_response(error_json(f"internal error: {type(e).__name__}: {e}", 500), status=500)
