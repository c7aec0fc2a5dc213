"""Tools for multi-turn rollouts, the protocol: parsing the calls a policy writes, checking a call's arguments
against its tool's schema, the results the model reads.

Who calls what:

- A plugin registers tools as :class:`plugrl.specs.ToolSpec` records, each with the OpenAI-style schema the model
  is shown. Making such records of Python functions (``@plugrl.tool``, and the functions an environment offers in
  ``EnvStart.tools``) is tool authoring, the package plugrl-tools': :func:`tool_authoring` finds it.
- The multi-turn loop shows the schemas to the chat template (``tools=[spec.schema, ...]``), parses each
  reply with a :class:`ToolCallParser` (``get_parser("hermes")``: ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>``), runs the calls of all live episodes in one batch of the tool executor (the entry point
  of group ``plugrl.tool_executors``, :func:`tool_executor`: plugrl-tools' pool of worker processes) and
  appends ``result.message()`` (``{"role": "tool", "name": ..., "content": ...}``) to each conversation. An
  episode's own tools (methods of its environment) run in the trainer's process (:func:`call_in_process`).
- Running a call never raises for what a tool or the model did wrong: every failure (malformed call, unknown
  tool, bad arguments, exception, timeout) is a :class:`ToolResult` whose ``content`` tells the model what went
  wrong and whose ``error`` names the kind (:func:`screen_call` answers the calls that cannot run).

The schema shape: ``{"type": "function", "function": {"name", "description", "parameters": {"type": "object",
"properties": {...}, "required": [...]}}}``.

This module imports the standard library and :mod:`plugrl.specs` only (never torch): plugins and reward
workers import it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import re
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Union, runtime_checkable

from plugrl.plugin_errors import implementation, package_hint
from plugrl.specs import ToolSpec

__all__ = [
    "PARSERS",
    "HermesParser",
    "ToolCall",
    "ToolCallParser",
    "ToolResult",
    "ToolSpec",
    "get_parser",
    "register_parser",
    "strip_tool_calls",
    "screen_call",
    "tool_authoring",
    "tool_executor",
]

log = logging.getLogger("plugrl.tools")

# The error kinds of a ToolResult, in the order counts lists them.
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout")


# --------------------------------------------------------------------------- names and type hints


def tool_where(name: str | None, plugin: str = "") -> str:
    """How messages name a tool: ``plugin 'p', tool 'x'``."""
    tool = f"tool {name!r}"
    return f"plugin {plugin!r}, {tool}" if plugin else tool


def strip_optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (hint, False)."""
    hint = unannotate(hint)
    args = typing.get_args(hint)
    if is_union(hint) and type(None) in args:
        rest = tuple(a for a in args if a is not type(None))
        return (rest[0] if len(rest) == 1 else Union[rest]), True  # noqa: UP007 (a runtime tuple)
    return hint, False


def unannotate(hint: Any) -> Any:
    """``Annotated[X, ...]`` -> X."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


# --------------------------------------------------------------------------- parsing tool calls


@dataclass
class ToolCall:
    """One tool call the model wrote. ``raw``: its text in the reply. ``id``: the model's call id, "" if it
    gave none. ``error``: why it could not be parsed (then ``name``/``arguments`` hold what could be read)."""

    name: str
    arguments: dict
    raw: str = ""
    id: str = ""
    error: str | None = None


@runtime_checkable
class ToolCallParser(Protocol):
    """Finds the tool calls in a reply: ``parse(text)`` -> the calls in order (malformed ones with ``error``)."""

    name: str

    def parse(self, text: str) -> list[ToolCall]: ...


_HERMES_FORM = 'write <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>'
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FENCE_RE = re.compile(r"^```[\w-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)


class HermesParser:
    """Hermes/Qwen tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks.

    Whitespace (and a ```json fence) around the JSON is fine; ``arguments`` may be an object or a JSON string
    holding one, ``parameters`` is read as a synonym, a block holding a JSON list gives one call per item.
    A ``<tool_call>`` left open at the end of the reply is a malformed call (keep ``</tool_call>`` in the
    output when it is a stop string).
    """

    name = "hermes"

    def parse(self, text: str) -> list[ToolCall]:
        calls: list[ToolCall] = []
        end = 0
        for match in _BLOCK_RE.finditer(text):
            calls.extend(_calls_in_block(match.group(1), match.group(0)))
            end = match.end()
        left_open = text.find(_OPEN, end)
        if left_open != -1:
            calls.append(
                _malformed(text[left_open:], f"the <tool_call> block is not closed with </tool_call>; {_HERMES_FORM}")
            )
        return calls

    def strip_tool_calls(self, text: str) -> str:
        """The reply without its tool-call blocks (and without an unclosed one at the end), stripped."""
        text = _BLOCK_RE.sub("", text)
        left_open = text.find(_OPEN)
        return (text if left_open == -1 else text[:left_open]).strip()


def _malformed(raw: str, error: str, name: str = "") -> ToolCall:
    return ToolCall(name=name, arguments={}, raw=raw, id="", error=error)


def _calls_in_block(body: str, raw: str) -> list[ToolCall]:
    body = body.strip()
    fenced = _FENCE_RE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body:
        return [_malformed(raw, f"the <tool_call> block is empty; {_HERMES_FORM}")]
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return [
            _malformed(
                raw, f"the tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {_HERMES_FORM}"
            )
        ]
    if isinstance(value, list) and value:
        return [_call_from_json(item, raw) for item in value]
    return [_call_from_json(value, raw)]


def _call_from_json(obj: Any, raw: str) -> ToolCall:
    if not isinstance(obj, dict):
        return _malformed(raw, f"a tool call must be a JSON object, got {_json_kind(obj)}; {_HERMES_FORM}")
    name = obj.get("name")
    if not (isinstance(name, str) and name.strip()):
        return _malformed(raw, f'the tool call has no "name"; {_HERMES_FORM}')
    name = name.strip()
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return _malformed(raw, f'"arguments" is a string but not valid JSON ({e.msg}); {_HERMES_FORM}', name)
    if not isinstance(args, dict):
        return _malformed(raw, f'"arguments" must be a JSON object, got {_json_kind(args)}; {_HERMES_FORM}', name)
    call_id = obj.get("id")
    return ToolCall(name=name, arguments=args, raw=raw, id=call_id if isinstance(call_id, str) else "")


PARSERS: dict[str, ToolCallParser] = {"hermes": HermesParser()}


def get_parser(name: str) -> ToolCallParser:
    """The registered tool-call parser called ``name``; a ValueError listing the known ones otherwise."""
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {name!r}; known: {', '.join(sorted(PARSERS))} "
            "(a plugin adds one with plugrl.rollout.tools.register_parser)"
        ) from None


def register_parser(parser: ToolCallParser) -> ToolCallParser:
    """Add ``parser`` (an object with ``name`` and ``parse(text)``) to :data:`PARSERS`; returns it.

    Registering another instance of the same class under a name again replaces it; a different parser
    under a taken name is a ValueError."""
    name = getattr(parser, "name", None)
    if not (isinstance(name, str) and name) or not callable(getattr(parser, "parse", None)):
        raise ValueError(f"a tool-call parser needs a non-empty str .name and a .parse(text) method, got {parser!r}")
    old = PARSERS.get(name)
    if old is not None and type(old) is not type(parser):
        raise ValueError(f"tool-call parser {name!r} is already registered ({type(old).__name__}); pick another name")
    PARSERS[name] = parser
    return parser


def strip_tool_calls(text: str, parser: str = "hermes") -> str:
    """``text`` without its tool-call blocks, as the parser called ``parser`` finds them."""
    strip = getattr(get_parser(parser), "strip_tool_calls", None)
    if strip is None:
        raise ValueError(f"tool-call parser {parser!r} has no strip_tool_calls(text) method")
    return strip(text)


# --------------------------------------------------------------------------- results


@dataclass
class ToolResult:
    """What one call gave: ``content`` is what the model sees; ``error`` is None or one of ``ERROR_KINDS``
    ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout"); ``seconds`` the time it ran."""

    call: ToolCall
    content: str
    error: str | None = None
    seconds: float = 0.0

    def message(self) -> dict[str, str]:
        """The chat message to append: ``{"role": "tool", "name", "content"}`` (+ ``tool_call_id``)."""
        msg = {"role": "tool", "name": self.call.name, "content": self.content}
        if self.call.id:
            msg["tool_call_id"] = self.call.id
        return msg


def _error_text(e: BaseException) -> str:
    try:
        return f"Error: {type(e).__name__}: {e}"
    except Exception:  # an exception whose str() fails
        return f"Error: {type(e).__name__}"


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[output truncated: {len(text) - limit} more characters; tools show at most {limit}]"


# --------------------------------------------------------------------------- parent side


class ToolCheck:
    """What the executor knows of one tool to check a call's arguments before sending it to a worker."""

    def __init__(self, spec: ToolSpec):
        self.spec = spec
        params = spec.schema["function"]["parameters"]
        self.props: dict[str, dict] = params["properties"]
        self.required: list[str] = params["required"]
        try:
            self.sig: inspect.Signature | None = inspect.signature(spec.fn, eval_str=True)
        except (NameError, TypeError, ValueError, SyntaxError):
            self.sig = None
        ps = self.sig.parameters.values() if self.sig else []
        self.var_kw = any(p.kind is p.VAR_KEYWORD for p in ps)
        self.nullable = {p.name for p in ps if strip_optional(p.annotation)[1]}  # X | None: may be given null
        self.fill_none = {p.name for p in ps if p.name in self.nullable and p.default is p.empty}
        usage = [f"{k} ({_type_text(v)}{', required' if k in self.required else ''})" for k, v in self.props.items()]
        self.usage = f"{spec.name} takes: {', '.join(usage) or 'no arguments'}"

    def prepare(self, arguments: dict) -> tuple[dict, list[str]]:
        """(keyword arguments to call the tool with, problems); the problems say what to fix."""
        kwargs: dict[str, Any] = {}
        problems: list[str] = []
        for key, value in arguments.items():
            prop = self.props.get(key)
            if prop is None:
                if self.var_kw:
                    kwargs[key] = value
                else:
                    problems.append(f"unexpected argument {key!r}")
                continue
            if value is None and key not in self.required and not _allows_null(prop):
                if key in self.nullable:
                    kwargs[key] = None
                continue  # null for an optional argument: its default applies
            value, problem = _check_value(value, prop, repr(key))
            if problem:
                problems.append(problem)
            kwargs[key] = value
        problems += [f"missing required argument {k!r}" for k in self.required if k not in arguments]
        for name in self.fill_none:
            kwargs.setdefault(name, None)
        if not problems and self.sig is not None:
            try:
                self.sig.bind(**kwargs)
            except TypeError as e:
                problems.append(str(e))
        return kwargs, problems


def _type_text(prop: dict) -> str:
    if "enum" in prop:
        return "one of " + ", ".join(json.dumps(v) for v in prop["enum"])
    kinds = prop.get("type", "any")
    text = "/".join(kinds) if isinstance(kinds, list) else kinds
    if text == "array" and isinstance(prop.get("items"), dict):
        text = f"array of {_type_text(prop['items'])}"
    return text


def _allows_null(prop: dict) -> bool:
    kinds = prop.get("type")
    return bool(prop.get("nullable")) or kinds == "null" or (isinstance(kinds, list) and "null" in kinds)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    for kind, types_ in (("boolean", bool), ("integer", int), ("number", float), ("string", str)):
        if isinstance(value, types_):
            return kind
    return "array" if isinstance(value, list) else "object" if isinstance(value, dict) else type(value).__name__


def _is_json_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    expected = {"string": str, "boolean": bool, "array": list, "object": dict, "null": type(None)}.get(kind)
    return expected is None or isinstance(value, expected)


def _same(a: Any, b: Any) -> bool:
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _check_value(value: Any, prop: dict, path: str) -> tuple[Any, str | None]:
    """(value, None) if ``value`` fits the property's schema (an integral float becomes an int), else
    (value, what is wrong). Checks type, enum, anyOf/oneOf, array items and nested object properties."""
    if value is None and prop.get("nullable"):
        return value, None
    if "enum" in prop and not any(_same(value, e) for e in prop["enum"]):
        return value, f"{path} must be one of {', '.join(json.dumps(e) for e in prop['enum'])}, got {value!r:.60}"
    if "const" in prop and not _same(value, prop["const"]):
        return value, f"{path} must be {json.dumps(prop['const'])}"
    for key in ("anyOf", "oneOf"):
        if key in prop:
            for sub in prop[key]:
                converted, problem = _check_value(value, sub, path)
                if problem is None:
                    return converted, None
            return value, f"{path} must be {' or '.join(_type_text(s) for s in prop[key])}, got {_json_kind(value)}"
    kinds = prop.get("type")
    if kinds is None:
        return value, None
    kind = next((k for k in ([kinds] if isinstance(kinds, str) else kinds) if _is_json_type(value, k)), None)
    if kind is None:
        return value, f"{path} must be {_type_text(prop)}, got {_json_kind(value)} {value!r:.60}"
    if kind == "integer" and isinstance(value, float):
        return int(value), None
    if kind == "array" and isinstance(prop.get("items"), dict):
        items = []
        for i, item in enumerate(value):
            item, problem = _check_value(item, prop["items"], f"{path}[{i}]")
            if problem:
                return value, problem
            items.append(item)
        return items, None
    if kind == "object" and isinstance(prop.get("properties"), dict):
        return _check_object(value, prop, path)
    return value, None


def _check_object(value: dict, prop: dict, path: str) -> tuple[Any, str | None]:
    out = dict(value)
    for key in prop.get("required", []):
        if key not in value:
            return value, f"{path} is missing key {key!r}"
    for key, sub in prop["properties"].items():
        if key in value:
            out[key], problem = _check_value(value[key], sub, f"{path}[{key!r}]")
            if problem:
                return value, problem
    return out, None


def screen_call(call: ToolCall, tools: dict[str, ToolCheck], max_output_chars: int) -> tuple[ToolResult | None, dict]:
    """(a result for a call that cannot run: malformed, unknown tool, bad arguments; else None, the keyword
    arguments to call the tool with)."""
    if call.error is not None or not isinstance(call.arguments, dict) or not isinstance(call.name, str):
        why = call.error or f"arguments must be a JSON object, got {_json_kind(call.arguments)}"
        return ToolResult(call, f"Error: malformed tool call: {why}", "malformed"), {}
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return ToolResult(
            call, f"Error: unknown tool {call.name!r}; the available tools are: {known}", "unknown_tool"
        ), {}
    kwargs, problems = tool.prepare(call.arguments)
    return (bad_arguments(call, tool, problems, max_output_chars) if problems else None), kwargs


def bad_arguments(call: ToolCall, tool: ToolCheck, problems: list[str], max_output_chars: int) -> ToolResult:
    content = f"Error: bad arguments for tool {call.name!r}: {'; '.join(problems)}. {tool.usage}"
    return ToolResult(call, _truncate(content, max_output_chars), "bad_arguments")


# --------------------------------------------------------------------------- in the trainer's process


async def call_in_process(
    call: ToolCall, tool: ToolSpec, *, time_limit_s: float, max_output_chars: int, offered: Sequence[str] = ()
) -> ToolResult:
    """One call of an episode's own tool (:attr:`ToolSpec.in_process`: a method of its environment, whose
    state is the episode's), run in the trainer's process and answered as the worker pool answers.

    A plain function runs in a thread, an ``async def`` one on the episode loop. Past its time limit the
    call is answered with a timeout: an ``async def`` call is cancelled; a plain one cannot be stopped, so
    it finishes in its thread and its result is dropped. Never raises for the call's sake.
    ``offered``: every tool name the episode offers, for the unknown-tool answer."""
    tools = {tool.name: ToolCheck(tool)} if call.name == tool.name else {}
    early, kwargs = screen_call(call, tools, max_output_chars)
    if early is not None:
        if early.error == "unknown_tool" and offered:
            known = ", ".join(sorted(offered))
            early.content = f"Error: unknown tool {call.name!r}; the available tools are: {known}"
        return early
    limit = tool.time_limit_s if tool.time_limit_s is not None else time_limit_s
    started = time.monotonic()
    try:
        if inspect.iscoroutinefunction(tool.fn):
            out = await asyncio.wait_for(tool.fn(**kwargs), limit)
        else:
            out = await asyncio.wait_for(asyncio.to_thread(tool.fn, **kwargs), limit)
            if inspect.isawaitable(out):
                out = await asyncio.wait_for(out, max(0.001, limit - (time.monotonic() - started)))
    except asyncio.TimeoutError:
        content = f"Error: tool {call.name!r} timed out after {limit:g}s"
        return ToolResult(call, content, "timeout", time.monotonic() - started)
    except Exception as e:  # the tool's failure is the model's answer, never the run's
        return ToolResult(call, _truncate(_error_text(e), max_output_chars), "exception", time.monotonic() - started)
    return ToolResult(call, _truncate(_as_text(out), max_output_chars), None, time.monotonic() - started)


# --------------------------------------------------------------------------- the executor

EXECUTORS_GROUP = "plugrl.tool_executors"
EXECUTOR_PACKAGE = "plugrl-tools"


class NoToolExecutor(RuntimeError):
    """No installed package runs tool calls (or makes tools of functions); the message names the one to install."""


def tool_executor() -> type:
    """The class that runs tool calls (``cls(tools, *, max_workers, time_limit_s, max_output_chars)``, whose
    ``run(calls)`` answers each call with a :class:`ToolResult`, ``counts`` tallies the last batch, and
    ``close()`` stops it): the entry point of group ``plugrl.tool_executors`` (plugrl-tools' worker pool). Raises
    :class:`NoToolExecutor` naming the package when none is installed."""
    missing = f"tool calls run in the package {EXECUTOR_PACKAGE}, which is not installed: "
    return implementation(EXECUTORS_GROUP, NoToolExecutor(missing + package_hint(EXECUTOR_PACKAGE)))


# --------------------------------------------------------------------------- tool authoring

AUTHORING_GROUP = "plugrl.tool_authoring"


class ToolAuthoring(Protocol):
    """What makes :class:`ToolSpec` records of Python functions (plugrl-tools' module ``plugrl_tools.authoring``)."""

    def tool(self, name: str | None = None, **options: Any) -> Any:
        """``@plugrl.tool`` (``description``, ``schema``, ``time_limit_s``): registers a module-level function."""

    def make_tool(self, fn: Callable[..., Any], *, plugin: str = "", in_process: bool = False) -> ToolSpec:
        """The record of ``fn``, its schema derived from the signature and docstring."""

    def is_importable(self, fn: Any) -> bool:
        """Whether a worker process can import ``fn`` by reference (else it runs in the trainer's process)."""


@functools.cache  # looked up for each episode whose environment offers a closure as a tool
def tool_authoring() -> ToolAuthoring:
    """What makes tools of Python functions (``@plugrl.tool``, the functions in ``EnvStart.tools``): the entry point
    of group ``plugrl.tool_authoring``. Raises :class:`NoToolExecutor` naming the package when none is installed."""
    missing = f"tools made from Python functions are in the package {EXECUTOR_PACKAGE}, which is not installed: "
    return implementation(AUTHORING_GROUP, NoToolExecutor(missing + package_hint(EXECUTOR_PACKAGE)))
