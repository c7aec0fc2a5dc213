"""Tool authoring: :class:`plugrl.specs.ToolSpec` records made from Python functions, the schema the model is shown
derived from a function's signature and docstring (:func:`tool_schema`) or given explicitly and checked
(:func:`check_schema`).

The kernel keeps the tool protocol (:mod:`plugrl.rollout.tools`: parsing calls, results) and reaches this module
through the entry-point group ``plugrl.tool_authoring`` (:func:`plugrl.rollout.tools.tool_authoring`):
``@plugrl.tool`` is :func:`tool`, and a function an environment offers as a tool (``EnvStart.tools``) becomes a
record with :func:`make_tool`, run in a worker process when one can import it (:func:`is_importable`), in the
trainer's process otherwise.

The schema shape (what :func:`tool_schema` returns and :func:`check_schema` normalises to)::

    {"type": "function",
     "function": {"name": "calc",                        # letters, digits, _ and -; at most 64
                  "description": "Evaluate an arithmetic expression.",
                  "parameters": {"type": "object",
                                 "properties": {"expr": {"type": "string", "description": "..."},
                                                "digits": {"type": "integer", "default": 6}},
                                 "required": ["expr"]}}}

How messages name a tool (:func:`tool_where`) and the type-hint helpers (:func:`strip_optional`, :func:`unannotate`,
:func:`is_union`) are here too: :mod:`plugrl_tools.screening` and :mod:`plugrl_tools.executor` share them.

This module imports the standard library and the kernel's :mod:`plugrl.specs` only (never torch): tool modules
import it in worker processes.
"""

from __future__ import annotations

import collections.abc
import copy
import functools
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from plugrl.specs import TOOL_SCHEMA_FORM as _SCHEMA_FORM
from plugrl.specs import ToolSpec, mark

F = typing.TypeVar("F", bound=Callable[..., Any])

__all__ = ["check_schema", "is_importable", "make_tool", "tool", "tool_schema"]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
_BASIC_HINTS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


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
    hint, optional = strip_optional(p.annotation)
    prop = _hint_schema(hint, where, p.name)
    if p.default is not p.empty:
        optional = True
        if p.default is not None and _jsonable(p.default):
            prop["default"] = json.loads(json.dumps(p.default))
    return prop, optional


def _hint_schema(hint: Any, where: str, param: str) -> dict:
    hint = unannotate(hint)
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
    if is_union(hint):
        subs = [_hint_schema(a, where, param) for a in args]
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in subs):
            return {"type": list(dict.fromkeys(s["type"] for s in subs))}
        return {"anyOf": subs}
    if origin in (list, tuple, collections.abc.Sequence):
        items = [a for a in args if a is not Ellipsis]
        if origin is tuple and len(items) > 1:
            sub = [_hint_schema(a, where, param) for a in items]
            return {"type": "array", "prefixItems": sub, "minItems": len(sub), "maxItems": len(sub)}
        if not items or unannotate(items[0]) is Any:  # list[Any]: no constraint on the items
            return {"type": "array"}
        return {"type": "array", "items": _hint_schema(items[0], where, param)}
    if origin in (dict, collections.abc.Mapping):
        if len(args) == 2 and unannotate(args[1]) is not Any:
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
