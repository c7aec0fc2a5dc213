"""Tools for multi-turn rollouts, the protocol: the tool records, parsing the calls a policy writes, the results
the model reads, and the seams to the package that runs tools.

Who calls what:

- A plugin registers tools as :class:`plugrl.specs.ToolSpec` records, each with the OpenAI-style schema the model
  is shown. Making such records of Python functions (``@plugrl.tool``, and the functions an environment offers in
  ``EnvStart.tools``) is tool authoring, the package plugrl-tools': :func:`tool_authoring` finds it.
- The multi-turn loop shows the schemas to the chat template (``tools=[spec.schema, ...]``), parses each
  reply with a :class:`ToolCallParser` (``get_parser("hermes")``: ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>``), runs the calls of all live episodes in one batch of the tool executor (the entry point
  of group ``plugrl.tool_executors``, :func:`tool_executor`: plugrl-tools' pool of worker processes) and
  appends ``result.message()`` (``{"role": "tool", "name": ..., "content": ...}``) to each conversation. An
  episode's own tools (methods of its environment) run in the trainer's process (the executor's
  ``call_in_process``).
- Running a call never raises for what a tool or the model did wrong: every failure (malformed call, unknown
  tool, bad arguments, exception, timeout) is a :class:`ToolResult` whose ``content`` tells the model what went
  wrong and whose ``error`` names the kind (:data:`ERROR_KINDS`). Checking a call's arguments against its tool's
  schema before it runs is plugrl-tools' too (``plugrl_tools.screening``).

The schema shape: ``{"type": "function", "function": {"name", "description", "parameters": {"type": "object",
"properties": {...}, "required": [...]}}}``.

This module imports the standard library and :mod:`plugrl.specs` only (never torch): plugins and reward
workers import it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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
    "tool_authoring",
    "tool_executor",
]


# The error kinds of a ToolResult, in the order counts lists them.
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout")


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
        return _malformed(raw, f"a tool call must be a JSON object, got {json_kind(obj)}; {_HERMES_FORM}")
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
        return _malformed(raw, f'"arguments" must be a JSON object, got {json_kind(args)}; {_HERMES_FORM}', name)
    call_id = obj.get("id")
    return ToolCall(name=name, arguments=args, raw=raw, id=call_id if isinstance(call_id, str) else "")


def json_kind(value: Any) -> str:
    """The JSON kind of ``value`` as messages name it: null, boolean, integer, number, string, array, object."""
    if value is None:
        return "null"
    for kind, types_ in (("boolean", bool), ("integer", int), ("number", float), ("string", str)):
        if isinstance(value, types_):
            return kind
    return "array" if isinstance(value, list) else "object" if isinstance(value, dict) else type(value).__name__


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


# --------------------------------------------------------------------------- the executor

EXECUTORS_GROUP = "plugrl.tool_executors"
EXECUTOR_PACKAGE = "plugrl-tools"


class NoToolExecutor(RuntimeError):
    """No installed package runs tool calls (or makes tools of functions); the message names the one to install."""


def tool_executor() -> type:
    """The class that runs tool calls (``cls(tools, *, max_workers, time_limit_s, max_output_chars)``, whose
    ``run(calls)`` answers each call with a :class:`ToolResult`, ``counts`` tallies the last batch, and
    ``close()`` stops it; its staticmethod ``call_in_process(call, tool, *, time_limit_s, max_output_chars,
    offered=())`` runs one call of an episode's own tool (``ToolSpec.in_process``) in the trainer's process, an
    awaitable answered as the pool answers): the entry point of group ``plugrl.tool_executors`` (plugrl-tools'
    worker pool, ``plugrl_tools.executor.ToolExecutor``). Raises :class:`NoToolExecutor` naming the package when
    none is installed."""
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
