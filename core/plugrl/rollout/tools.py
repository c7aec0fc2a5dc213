"""Tools for multi-turn rollouts, the protocol: their schemas, parsing the calls a policy writes, checking a
call's arguments, the results the model reads.

Who calls what:

- A plugin registers plain module-level functions (sync or ``async def``); :func:`make_tool` (``@plugrl.tool``)
  turns each into a :class:`plugrl.specs.ToolSpec` whose ``schema`` comes from the signature and docstring
  (:func:`tool_schema`), or from an explicit OpenAI-style schema checked by :func:`check_schema`.
- The multi-turn loop shows the schemas to the chat template (``tools=[spec.schema, ...]``), parses each
  reply with a :class:`ToolCallParser` (``get_parser("hermes")``: ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>``), runs the calls of all live episodes in one batch of the tool executor (the entry point
  of group ``plugrl.tool_executors``, :func:`tool_executor`: plugrl-tools' pool of worker processes) and
  appends ``result.message()`` (``{"role": "tool", "name": ..., "content": ...}``) to each conversation. An
  episode's own tools (methods of its environment) run in the trainer's process (:func:`call_in_process`).
- Running a call never raises for what a tool or the model did wrong: every failure (malformed call, unknown
  tool, bad arguments, exception, timeout) is a :class:`ToolResult` whose ``content`` tells the model what went
  wrong and whose ``error`` names the kind (:func:`screen_call` answers the calls that cannot run).

The schema shape (what :func:`tool_schema` returns and :func:`check_schema` normalises to)::

    {"type": "function",
     "function": {"name": "calc",                        # letters, digits, _ and -; at most 64
                  "description": "Evaluate an arithmetic expression.",
                  "parameters": {"type": "object",
                                 "properties": {"expr": {"type": "string", "description": "..."},
                                                "digits": {"type": "integer", "default": 6}},
                                 "required": ["expr"]}}}

This module imports the standard library and :mod:`plugrl.specs` only (never torch): plugins and reward
workers import it.
"""

from __future__ import annotations

import asyncio
import collections.abc
import copy
import functools
import inspect
import json
import logging
import re
import sys
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Union, runtime_checkable

from plugrl.plugin_errors import implementation, package_hint
from plugrl.specs import TOOL_SCHEMA_FORM as _SCHEMA_FORM
from plugrl.specs import ToolSpec, mark

F = typing.TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "PARSERS",
    "HermesParser",
    "ToolCall",
    "ToolCallParser",
    "ToolResult",
    "ToolSpec",
    "check_schema",
    "get_parser",
    "make_tool",
    "register_parser",
    "strip_tool_calls",
    "screen_call",
    "tool",
    "tool_executor",
    "tool_schema",
]

log = logging.getLogger("plugrl.tools")

# The error kinds of a ToolResult, in the order counts lists them.
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout")

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
_BASIC_HINTS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


# --------------------------------------------------------------------------- specs and schemas


def tool_where(name: str | None, plugin: str = "") -> str:
    tool = f"tool {name!r}"
    return f"plugin {plugin!r}, {tool}" if plugin else tool


def _fn_name(fn: Any) -> str:
    for obj in (fn, getattr(fn, "func", None), type(fn)):
        name = getattr(obj, "__name__", None)
        if isinstance(name, str):
            return name
    return "tool"


def tool_schema(fn: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> dict:
    """The OpenAI-style schema of ``fn`` from its type hints and docstring (shape: see the module docstring).

    Hints map to JSON types (str, int, float, bool, list[X], tuple[X, ...], dict[str, X], Literal[...] as
    an enum, unions); a parameter that is ``Optional``/``X | None`` or has a default is not required (a
    JSON-serialisable default other than None is shown as ``"default"``). The description is the
    docstring's first paragraph; parameter descriptions come from a Google ``Args:`` section or reST
    ``:param x:`` lines. A parameter without a hint, ``*args``/``**kwargs`` and positional-only
    parameters are ValueErrors: tools are called with keyword arguments from JSON.
    """
    name = name or _fn_name(fn)
    return _schema_from_function(fn, name, description, tool_where(name))


def _schema_from_function(fn: Callable[..., Any], name: str, description: str | None, where: str) -> dict:
    if not _NAME_RE.match(name):
        raise ValueError(
            f"{where}: a tool name must be letters, digits, '_' or '-' (at most 64, not starting with a digit); "
            "pass name='...'"
        )
    try:
        sig = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, ValueError, SyntaxError) as e:
        raise ValueError(
            f"{where}: cannot read the signature's type hints ({e}); fix them or pass an explicit schema"
        ) from None
    doc_text, param_docs = _parse_docstring(inspect.getdoc(fn.func if isinstance(fn, functools.partial) else fn))
    properties: dict[str, dict] = {}
    required: list[str] = []
    for p in sig.parameters.values():
        prop, optional = _param_schema(p, where)
        if param_docs.get(p.name):
            prop["description"] = param_docs[p.name]
        properties[p.name] = prop
        if not optional:
            required.append(p.name)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": doc_text if description is None else description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _param_schema(p: inspect.Parameter, where: str) -> tuple[dict, bool]:
    """(JSON schema of parameter ``p``, whether the model may leave it out)."""
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
        star = "*" if p.kind is p.VAR_POSITIONAL else "**"
        raise ValueError(
            f"{where}: parameter '{star}{p.name}' cannot be described to the model; "
            "list each argument as a named, annotated parameter or pass an explicit schema"
        )
    if p.kind is p.POSITIONAL_ONLY:
        raise ValueError(f"{where}: parameter {p.name!r} is positional-only; tools are called with keyword arguments")
    if p.annotation is p.empty:
        raise ValueError(f"{where}: parameter {p.name!r} has no type hint; annotate it or pass an explicit schema")
    hint, optional = _strip_optional(p.annotation)
    prop = _hint_schema(hint, where, p.name)
    if p.default is not p.empty:
        optional = True
        if p.default is not None and _jsonable(p.default):
            prop["default"] = json.loads(json.dumps(p.default))
    return prop, optional


def _strip_optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (hint, False)."""
    hint = _unannotate(hint)
    args = typing.get_args(hint)
    if _is_union(hint) and type(None) in args:
        rest = tuple(a for a in args if a is not type(None))
        return (rest[0] if len(rest) == 1 else Union[rest]), True  # noqa: UP007 (a runtime tuple)
    return hint, False


def _unannotate(hint: Any) -> Any:
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


def _hint_schema(hint: Any, where: str, param: str) -> dict:
    hint = _unannotate(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _BASIC_HINTS:
        return {"type": _BASIC_HINTS[hint]}
    if hint is type(None) or hint is None:
        return {"type": "null"}
    if hint in (list, tuple, collections.abc.Sequence):
        return {"type": "array"}
    if hint in (dict, collections.abc.Mapping):
        return {"type": "object"}
    if origin is Literal:
        return _literal_schema(args, where, param)
    if _is_union(hint):
        subs = [_hint_schema(a, where, param) for a in args]
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in subs):
            return {"type": list(dict.fromkeys(s["type"] for s in subs))}
        return {"anyOf": subs}
    if origin in (list, tuple, collections.abc.Sequence):
        items = [a for a in args if a is not Ellipsis]
        if origin is tuple and len(items) > 1:
            sub = [_hint_schema(a, where, param) for a in items]
            return {"type": "array", "prefixItems": sub, "minItems": len(sub), "maxItems": len(sub)}
        if not items or _unannotate(items[0]) is Any:  # list[Any]: no constraint on the items
            return {"type": "array"}
        return {"type": "array", "items": _hint_schema(items[0], where, param)}
    if origin in (dict, collections.abc.Mapping):
        if len(args) == 2 and _unannotate(args[1]) is not Any:
            return {"type": "object", "additionalProperties": _hint_schema(args[1], where, param)}
        return {"type": "object"}
    raise ValueError(
        f"{where}: parameter {param!r} has type {_hint_text(hint)}, which has no JSON schema; use str, int, float, "
        "bool, list[...], dict[str, ...], Literal[...] or an Optional of them, or pass an explicit schema"
    )


def _hint_text(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _literal_schema(values: tuple, where: str, param: str) -> dict:
    kinds: list[str] = []
    for v in values:
        kind = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}.get(type(v))
        if kind is None:
            raise ValueError(f"{where}: parameter {param!r}: Literal values must be str, int, float, bool or None")
        if kind not in kinds:
            kinds.append(kind)
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(values)}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


_SECTION_RE = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Returns?|Yields?|Raises|Examples?|Notes?|Warnings?"
    r"|See Also|Attributes|Todo|References)\s*:\s*$",
    re.IGNORECASE,
)
_ARGS_HEADER_RE = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args)\s*:\s*$", re.IGNORECASE)
_GOOGLE_ITEM_RE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_PARAM_RE = re.compile(r"^:param\s+(?:[^:]*?\s)?(\w+)\s*:\s*(.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) of a cleaned docstring (Google ``Args:`` or reST ``:param``)."""
    if not doc:
        return "", {}
    lines = doc.splitlines()
    first: list[str] = []
    for line in lines:
        text = line.strip()
        if not text or _SECTION_RE.match(text) or text.startswith(":"):
            break
        first.append(text)
    params = _google_args(lines)
    params.update({k: v for k, v in _rest_params(lines).items() if k not in params})
    return " ".join(first), params


def _google_args(lines: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    start = next((i for i, line in enumerate(lines) if _ARGS_HEADER_RE.match(line.strip())), None)
    if start is None:
        return params
    base, item_indent, current = _indent(lines[start]), None, None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        ind = _indent(line)
        if ind <= base:
            break
        if item_indent is None:
            item_indent = ind
        match = _GOOGLE_ITEM_RE.match(line.strip()) if ind <= item_indent else None
        if match:
            current = match.group(1)
            params[current] = match.group(2).strip()
        elif current is not None and ind > item_indent:
            params[current] = f"{params[current]} {line.strip()}".strip()
    return params


def _rest_params(lines: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    current, current_indent = None, 0
    for line in lines:
        text = line.strip()
        match = _REST_PARAM_RE.match(text)
        if match:
            current, current_indent = match.group(1), _indent(line)
            params[current] = match.group(2).strip()
        elif current is not None and text and not text.startswith(":") and _indent(line) > current_indent:
            params[current] = f"{params[current]} {text}".strip()
        else:
            current = None
    return params


def check_schema(schema: dict, where: str) -> dict:
    """Check an explicit tool schema and return it in the full form (a deep copy; shape: module docstring).

    Accepts ``{"type": "function", "function": {...}}`` or the bare ``{"name", "description",
    "parameters"}``. ``parameters`` must be an object schema whose ``properties`` each have a ``type``
    (or ``enum``/``anyOf``/``oneOf``/``const``) and whose ``required`` names only properties; missing
    ``description``/``parameters``/``properties``/``required`` default to empty. A ValueError whose
    message starts with ``where`` says what is wrong and how to fix it.
    """
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a tool schema must be a dict like {_SCHEMA_FORM}, got {type(schema).__name__}")
    if "function" in schema or "type" in schema:
        if schema.get("type") != "function":
            raise ValueError(f"{where}: schema['type'] must be 'function', got {schema.get('type')!r}; {_SCHEMA_FORM}")
        function = schema.get("function")
        if not isinstance(function, dict):
            raise ValueError(f"{where}: schema['function'] must be a dict with 'name' and 'parameters'; {_SCHEMA_FORM}")
    elif "name" in schema:
        function = schema  # the bare function form
    else:
        raise ValueError(f"{where}: not a tool schema (no 'type': 'function' and no 'name'); write {_SCHEMA_FORM}")
    function = copy.deepcopy(function)
    name = function.get("name")
    if not (isinstance(name, str) and _NAME_RE.match(name)):
        raise ValueError(
            f"{where}: function.name must be a non-empty name of letters, digits, '_' or '-' (at most 64, not starting "
            f"with a digit), got {name!r}"
        )
    where = f"{where}: schema of tool {name!r}"
    if not isinstance(function.get("description", ""), str):
        raise ValueError(f"{where}: function.description must be a string")
    function.setdefault("description", "")
    function["parameters"] = _check_parameters(function.get("parameters", {"type": "object"}), where)
    return {"type": "function", "function": function}


def _check_parameters(params: Any, where: str) -> dict:
    if not isinstance(params, dict) or params.get("type") != "object":
        raise ValueError(
            f"{where}: function.parameters must be a JSON-schema object "
            "{'type': 'object', 'properties': {name: {'type': ...}}, 'required': [...]}"
        )
    props = params.setdefault("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"{where}: parameters.properties must be a dict of property name -> schema")
    for pname, prop in props.items():
        if not (isinstance(pname, str) and pname.isidentifier()):
            raise ValueError(f"{where}: property name {pname!r} is not a Python identifier; tools take keywords")
        _check_property(prop, f"{where}: property {pname!r}")
    required = params.setdefault("required", [])
    if not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise ValueError(f"{where}: parameters.required must be a list of property names, got {required!r}")
    unknown = [r for r in required if r not in props]
    if unknown:
        raise ValueError(
            f"{where}: parameters.required lists {', '.join(map(repr, unknown))}, not in properties "
            f"({', '.join(props) or 'none'}); add it to properties or remove it from required"
        )
    if len(set(required)) != len(required):
        raise ValueError(f"{where}: parameters.required names a property twice")
    return params


def _check_property(prop: Any, where: str) -> None:
    if not isinstance(prop, dict):
        raise ValueError(f"{where} must be a dict like {{'type': 'string'}}, got {type(prop).__name__}")
    if not any(k in prop for k in ("type", "enum", "anyOf", "oneOf", "const")):
        raise ValueError(f"{where} has no 'type' (nor 'enum'/'anyOf'); give it a JSON type, e.g. {{'type': 'string'}}")
    kinds = prop.get("type", [])
    for kind in [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else [kinds]:
        if kind not in _JSON_TYPES:
            raise ValueError(f"{where}: type {kind!r} is not a JSON type; use one of {', '.join(_JSON_TYPES)}")
    if "enum" in prop and not (isinstance(prop["enum"], list) and prop["enum"]):
        raise ValueError(f"{where}: enum must be a non-empty list of allowed values")
    for key in ("anyOf", "oneOf"):
        if key in prop:
            if not (isinstance(prop[key], list) and prop[key]):
                raise ValueError(f"{where}: {key} must be a non-empty list of schemas")
            for i, sub in enumerate(prop[key]):
                _check_property(sub, f"{where}, {key}[{i}]")
    if isinstance(prop.get("items"), dict):
        _check_property(prop["items"], f"{where}, items")


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    schema: dict | None = None,
    plugin: str = "",
    time_limit_s: float | None = None,
    in_process: bool = False,
) -> ToolSpec:
    """A :class:`ToolSpec` for ``fn``: its schema from :func:`tool_schema`, or ``schema`` checked by
    :func:`check_schema` (then ``name``/``description`` override the schema's, and every property must be
    a parameter of ``fn`` and every parameter without a default a property)."""
    if not callable(fn):
        raise ValueError(f"{tool_where(name, plugin)}: a tool must be a function, got {type(fn).__name__}")
    if schema is None:
        name = name or _fn_name(fn)
        schema = _schema_from_function(fn, name, description, tool_where(name, plugin))
        return ToolSpec(name, fn, schema, plugin, time_limit_s, in_process)
    full = check_schema(schema, tool_where(name, plugin) if name else (f"plugin {plugin!r}" if plugin else "tool"))
    if name is not None:
        if not _NAME_RE.match(name):
            where = tool_where(name, plugin)
            raise ValueError(f"{where}: a tool name must be letters, digits, '_' or '-' (at most 64)")
        full["function"]["name"] = name
    if description is not None:
        full["function"]["description"] = description
    name = full["function"]["name"]
    _check_schema_fits(fn, full, tool_where(name, plugin))
    return ToolSpec(name, fn, full, plugin, time_limit_s, in_process)


def tool(
    name: str | None = None,
    *,
    description: str | None = None,
    schema: dict[str, Any] | None = None,
    time_limit_s: float | None = None,
) -> Callable[[F], F]:
    """Register a plain module-level function as the tool called ``name`` (default: the function's name).

    Its signature and docstring give the JSON schema the chat template shows the model, unless ``schema``
    (OpenAI's function form) is given. The kernel runs calls in worker processes, each within
    ``time_limit_s`` (default ``rollout.tool_time_limit_s``).
    """
    if callable(name):  # used bare: @plugrl.tool
        return tool()(name)

    def deco(fn: F) -> F:
        return mark(fn, make_tool(fn, name=name, description=description, schema=schema, time_limit_s=time_limit_s))

    return deco


def _check_schema_fits(fn: Callable[..., Any], schema: dict, where: str) -> None:
    """Every schema property is a keyword ``fn`` takes; every parameter ``fn`` needs is a property."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return  # a builtin without a signature: trust the schema
    props = schema["function"]["parameters"]["properties"]
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        extra = [k for k in props if k not in named]
        if extra:
            raise ValueError(f"{where}: schema property {extra[0]!r} is not a keyword parameter of the function")
    needed = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [n for n in needed if n not in props]
    if missing:
        raise ValueError(
            f"{where}: the function needs parameter {missing[0]!r}, which the schema does not list; "
            "add it to the schema's properties (and required) or give it a default"
        )


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
        self.nullable = {p.name for p in ps if _strip_optional(p.annotation)[1]}  # X | None: may be given null
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


def is_importable(fn: Any) -> bool:
    """True when a worker process can import ``fn`` by reference (a function or callable class at module
    level): such tools run in worker processes. Bound methods, closures and lambdas are not."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    name = getattr(fn, "__qualname__", "")
    if module is None or not name or "<" in name or inspect.ismethod(fn):
        return False
    obj: Any = module
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj is fn


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
    """No installed package runs tool calls; the message names the one to install."""


def tool_executor() -> type:
    """The class that runs tool calls (``cls(tools, *, max_workers, time_limit_s, max_output_chars)``, whose
    ``run(calls)`` answers each call with a :class:`ToolResult`, ``counts`` tallies the last batch, and
    ``close()`` stops it): the entry point of group ``plugrl.tool_executors`` (plugrl-tools' worker pool). Raises
    :class:`NoToolExecutor` naming the package when none is installed."""
    missing = f"tool calls run in the package {EXECUTOR_PACKAGE}, which is not installed: "
    return implementation(EXECUTORS_GROUP, NoToolExecutor(missing + package_hint(EXECUTOR_PACKAGE)))
