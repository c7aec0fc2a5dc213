"""Checking a tool call before it runs: its tool exists, its arguments fit the tool's schema (:class:`ToolCheck`,
:func:`screen_call`); a call that cannot run is answered here, as the kernel's :class:`plugrl.rollout.tools.ToolResult`
whose ``content`` tells the model what to fix (``malformed``, ``unknown_tool``, ``bad_arguments``).

The worker pool (:class:`plugrl_tools.executor.ToolExecutor`) screens every call in the trainer before sending it to a
worker, so a worker only ever runs a call with well-formed arguments; an episode's own tools
(:func:`plugrl_tools.executor.call_in_process`) are screened alike.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from plugrl.rollout.tools import ToolCall, ToolResult, json_kind
from plugrl.specs import ToolSpec
from plugrl_tools.authoring import strip_optional
from plugrl_tools.worker import _truncate

__all__ = ["ToolCheck", "bad_arguments", "screen_call"]


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
            return value, f"{path} must be {' or '.join(_type_text(s) for s in prop[key])}, got {json_kind(value)}"
    kinds = prop.get("type")
    if kinds is None:
        return value, None
    kind = next((k for k in ([kinds] if isinstance(kinds, str) else kinds) if _is_json_type(value, k)), None)
    if kind is None:
        return value, f"{path} must be {_type_text(prop)}, got {json_kind(value)} {value!r:.60}"
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
        why = call.error or f"arguments must be a JSON object, got {json_kind(call.arguments)}"
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
