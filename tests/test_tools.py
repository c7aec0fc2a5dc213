"""plugrl.rollout.tools: schemas from signatures, explicit schema checks, Hermes parsing, and the process executor.

The executor tests run real worker processes (the tool functions live in tests/tool_fns.py, which the workers
import by name through the sys.path they are given).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Annotated, Literal

import pytest

import tool_fns
from plugrl.rollout.tools import (
    PARSERS,
    HermesParser,
    ToolCall,
    ToolCallParser,
    ToolResult,
    ToolSpec,
    get_parser,
    register_parser,
    strip_tool_calls,
)
from plugrl_tools.authoring import check_schema, make_tool, tool_schema
from plugrl_tools.executor import ToolExecutor

# --------------------------------------------------------------------------- schemas


def search(query: str, max_results: int = 5, lang: Literal["en", "de"] = "en") -> list:
    """Search the web for pages.

    Returns the best matches first. This paragraph is not part of the description.

    Args:
        query: What to look for; plain words,
            not a URL.
        max_results (int): How many results to return.
        lang: The language of the results.

    Returns:
        A list of page titles.
    """
    return []


def test_schema_from_a_typed_function_with_a_google_docstring():
    assert tool_schema(search) == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web for pages.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for; plain words, not a URL."},
                    "max_results": {"type": "integer", "default": 5, "description": "How many results to return."},
                    "lang": {
                        "type": "string",
                        "enum": ["en", "de"],
                        "default": "en",
                        "description": "The language of the results.",
                    },
                },
                "required": ["query"],
            },
        },
    }


def typed(
    mode: Literal["fast", "exact"],
    tags: list[str],
    limit: int | None = None,
    scale: float = 1.5,
    flags: dict[str, bool] | None = None,
    pair: tuple[int, str] = (1, "a"),
    either: int | str = 0,
    note: Annotated[str, "metadata"] | None = None,
    raw: list = [],  # noqa: B006 (a default shown in the schema, never mutated)
    level: Literal[1, 2, 3] | None = None,
) -> None:
    """Every kind of hint.

    :param mode: How to run.
    :param list[str] tags: Labels to attach,
        one per item.
    """


def test_schema_types_optional_defaults_literal_and_containers():
    fn = tool_schema(typed, name="typed_tool", description="Custom.")["function"]
    assert fn["name"] == "typed_tool" and fn["description"] == "Custom."
    props = fn["parameters"]["properties"]
    assert props == {
        "mode": {"type": "string", "enum": ["fast", "exact"], "description": "How to run."},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels to attach, one per item."},
        "limit": {"type": "integer"},
        "scale": {"type": "number", "default": 1.5},
        "flags": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "pair": {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "string"}],
            "minItems": 2,
            "maxItems": 2,
            "default": [1, "a"],
        },
        "either": {"type": ["integer", "string"], "default": 0},
        "note": {"type": "string"},
        "raw": {"type": "array", "default": []},
        "level": {"type": "integer", "enum": [1, 2, 3]},
    }
    assert fn["parameters"]["required"] == ["mode", "tags"]
    assert tool_schema(tool_fns.maybe)["function"]["parameters"]["required"] == []  # Optional without a default
    assert tool_schema(tool_fns.async_add)["function"]["parameters"]["required"] == ["a", "b"]


def no_hint(expr, digits: int = 3) -> str:
    return expr


def star_args(*values: int) -> int:
    return 0


def star_kwargs(x: int, **extra: str) -> int:
    return 0


def object_hint(when: Path) -> str:
    return ""


def positional(x: int, /) -> int:
    return x


def test_schema_refuses_what_cannot_be_described():
    with pytest.raises(ValueError) as e:
        tool_schema(no_hint, name="calc")
    assert str(e.value) == "tool 'calc': parameter 'expr' has no type hint; annotate it or pass an explicit schema"
    with pytest.raises(ValueError, match=r"^tool 'star_args': parameter '\*values' cannot be described"):
        tool_schema(star_args)
    with pytest.raises(ValueError, match=r"^tool 'star_kwargs': parameter '\*\*extra' cannot be described"):
        tool_schema(star_kwargs)
    with pytest.raises(ValueError, match=r"parameter 'when' has type Path, which has no JSON schema; use str"):
        tool_schema(object_hint)
    with pytest.raises(ValueError, match="positional-only"):
        tool_schema(positional)
    with pytest.raises(ValueError, match=r"^tool '<lambda>': a tool name must be letters"):
        tool_schema(lambda: 0)
    with pytest.raises(ValueError, match=r"^plugin 'calc_tools', tool 'no_hint': parameter 'expr' has no type hint"):
        make_tool(no_hint, plugin="calc_tools")


GOOD = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an expression.",
        "parameters": {
            "type": "object",
            "properties": {"expr": {"type": "string"}, "digits": {"type": "integer"}},
            "required": ["expr"],
        },
    },
}


def test_check_schema_accepts_both_forms_and_normalises():
    assert check_schema(GOOD, "here") == GOOD
    assert check_schema(GOOD["function"], "here") == GOOD  # the bare function form is wrapped
    bare = check_schema({"name": "ping"}, "here")
    assert bare == {
        "type": "function",
        "function": {
            "name": "ping",
            "description": "",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    }
    copy = check_schema(GOOD, "here")
    copy["function"]["parameters"]["required"].append("digits")
    assert GOOD["function"]["parameters"]["required"] == ["expr"]  # a copy, never the caller's dict


def _bad(**changes):
    function = {**GOOD["function"], **changes}
    return {"type": "function", "function": function}


def _params(**changes):
    return _bad(parameters={**GOOD["function"]["parameters"], **changes})


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (["calc"], "a tool schema must be a dict"),
        ({"type": "tool", "function": GOOD["function"]}, "schema['type'] must be 'function', got 'tool'"),
        ({"type": "function"}, "schema['function'] must be a dict with 'name' and 'parameters'"),
        ({"description": "no name"}, "not a tool schema"),
        (_bad(name=""), "function.name must be a non-empty name"),
        (_bad(name="my tool"), "got 'my tool'"),
        (_bad(description=3), "schema of tool 'calc': function.description must be a string"),
        (_bad(parameters={"type": "array"}), "function.parameters must be a JSON-schema object"),
        (_params(properties=[]), "parameters.properties must be a dict"),
        (_params(required=["expr", "x"]), "parameters.required lists 'x', not in properties (expr, digits)"),
        (_params(required="expr"), "parameters.required must be a list of property names"),
        (_params(properties={"expr": {"description": "what"}}), "property 'expr' has no 'type' (nor 'enum'/'anyOf')"),
        (_params(properties={"expr": {"type": "str"}}), "property 'expr': type 'str' is not a JSON type; use one of"),
        (_params(properties={"expr": "string"}), "property 'expr' must be a dict like {'type': 'string'}"),
        (_params(properties={"my-arg": {"type": "string"}}, required=[]), "property name 'my-arg' is not a Python"),
        (_params(properties={"xs": {"type": "array", "items": {"type": "float"}}}, required=[]), "'xs', items: type"),
    ],
)
def test_check_schema_errors_say_where_and_what(schema, message):
    where = "plugin 'calc_tools', hook plugrl_tools"
    with pytest.raises(ValueError) as e:
        check_schema(schema, where)
    assert str(e.value).startswith(where + ": ")
    assert message in str(e.value)


def calc(expr: str, digits: int = 6) -> str:
    """Evaluate."""
    return expr


def test_make_tool_with_an_explicit_schema():
    spec = make_tool(calc, schema=GOOD["function"], plugin="calc_tools", time_limit_s=2.0)
    assert isinstance(spec, ToolSpec) and spec.schema == GOOD
    assert (spec.name, spec.plugin, spec.time_limit_s, spec.description) == (
        "calc",
        "calc_tools",
        2.0,
        GOOD["function"]["description"],
    )
    renamed = make_tool(calc, name="calculator", description="Other.", schema=GOOD)
    assert renamed.name == renamed.schema["function"]["name"] == "calculator" and renamed.description == "Other."
    assert GOOD["function"]["name"] == "calc"
    wrong = {"name": "calc", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}
    with pytest.raises(ValueError, match=r"^plugin 'p', tool 'calc': schema property 'expression' is not a keyword"):
        make_tool(calc, schema=wrong, plugin="p")
    with pytest.raises(ValueError, match="the function needs parameter 'expr', which the schema does not list"):
        make_tool(calc, schema={"name": "calc"})
    with pytest.raises(ValueError, match="time_limit_s must be a positive number"):
        make_tool(calc, time_limit_s=0)
    with pytest.raises(AttributeError):
        spec.name = "other"  # frozen
    assert make_tool(calc).schema == tool_schema(calc)


# --------------------------------------------------------------------------- parsing


def test_hermes_one_call_and_message_shape():
    text = 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>'
    [call] = HermesParser().parse(text)
    assert (call.name, call.arguments, call.error, call.id) == ("calc", {"expr": "2+3"}, None, "")
    assert call.raw == text[len("Let me compute.\n") :]
    result = ToolResult(call, "5")
    assert result.message() == {"role": "tool", "name": "calc", "content": "5"}
    assert ToolResult(ToolCall("calc", {}, id="call_1"), "5").message()["tool_call_id"] == "call_1"


def test_hermes_two_calls_around_text_string_arguments_and_synonyms():
    text = (
        'First <tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call> then\n'
        '<tool_call>\n  {"name": "b", "parameters": {"y": [1, 2]}}  \n</tool_call> and done.'
    )
    calls = get_parser("hermes").parse(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("a", {"x": 1}, None), ("b", {"y": [1, 2]}, None)]
    assert strip_tool_calls(text) == "First  then\n and done."
    no_args = HermesParser().parse('<tool_call>{"name": "now"}</tool_call>')
    assert (no_args[0].arguments, no_args[0].error) == ({}, None)
    fenced = HermesParser().parse('<tool_call>\n```json\n{"name": "f", "arguments": {}}\n```\n</tool_call>')
    assert (fenced[0].name, fenced[0].error) == ("f", None)
    listed = HermesParser().parse('<tool_call>[{"name": "f"}, {"name": "g", "arguments": {"k": 1}}]</tool_call>')
    assert [c.name for c in listed] == ["f", "g"]


def test_hermes_malformed_calls_and_no_calls():
    parser = HermesParser()
    assert parser.parse("Just an answer: 42.") == []
    assert parser.parse("") == []
    [bad_json] = parser.parse('<tool_call>{"name": "calc", "arguments": {"expr": }</tool_call>')
    assert bad_json.error.startswith("the tool call is not valid JSON (Expecting value at line 1 column")
    assert '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>' in bad_json.error
    [no_name] = parser.parse('<tool_call>{"arguments": {}}</tool_call>')
    assert no_name.error.startswith('the tool call has no "name"')
    [not_object] = parser.parse('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>')
    assert (not_object.name, not_object.error[:42]) == ("calc", '"arguments" must be a JSON object, got arr')
    [bad_string] = parser.parse('<tool_call>{"name": "calc", "arguments": "{oops"}</tool_call>')
    assert bad_string.error.startswith('"arguments" is a string but not valid JSON')
    [scalar] = parser.parse("<tool_call>42</tool_call>")
    assert scalar.error.startswith("a tool call must be a JSON object, got integer")
    [empty] = parser.parse("<tool_call>  </tool_call>")
    assert empty.error.startswith("the <tool_call> block is empty")
    text = 'ok <tool_call>{"name": "a"}</tool_call> then <tool_call>{"name": "b", "arguments": {'
    first, unterminated = parser.parse(text)
    assert (first.name, first.error) == ("a", None)
    assert unterminated.error.startswith("the <tool_call> block is not closed with </tool_call>")
    assert unterminated.raw == '<tool_call>{"name": "b", "arguments": {'
    assert parser.strip_tool_calls(text) == "ok  then"


class UpperParser:
    name = "upper_test"

    def parse(self, text: str) -> list[ToolCall]:
        return [ToolCall(word.lower(), {}) for word in text.split() if word.isupper()]


def test_parser_registry():
    assert isinstance(PARSERS["hermes"], ToolCallParser)
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'qwen9'; known: hermes"):
        get_parser("qwen9")
    try:
        register_parser(UpperParser())
        register_parser(UpperParser())  # the same kind again replaces it
        assert [c.name for c in get_parser("upper_test").parse("call PING now")] == ["ping"]
        with pytest.raises(ValueError, match="already registered"):
            register_parser(type("Other", (UpperParser,), {})())
        with pytest.raises(ValueError, match="needs a non-empty str .name"):
            register_parser(object())
    finally:
        PARSERS.pop("upper_test", None)


# --------------------------------------------------------------------------- the executor

HANG_LIMIT_S = 1.0


def _tools() -> dict[str, ToolSpec]:
    fns = [
        tool_fns.add,
        tool_fns.echo,
        tool_fns.sleepy,
        tool_fns.boom,
        tool_fns.leave,
        tool_fns.crash,
        tool_fns.async_add,
        tool_fns.big,
        tool_fns.as_dict,
        tool_fns.as_list,
        tool_fns.as_number,
        tool_fns.as_none,
        tool_fns.pid,
        tool_fns.noop,
        tool_fns.options,
        tool_fns.maybe,
    ]
    specs = [make_tool(fn, plugin="test_tools") for fn in fns]
    specs += [make_tool(fn, time_limit_s=HANG_LIMIT_S) for fn in (tool_fns.hang, tool_fns.hang_with_child)]
    return {s.name: s for s in specs}


@pytest.fixture(scope="module")
def executor():
    with ToolExecutor(_tools(), max_workers=4, time_limit_s=10.0, max_output_chars=200) as ex:
        yield ex


def _worker_pids() -> set[int]:
    """Live tool worker processes whose parent is this process (read from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"_plugrl_tool_worker" in cmdline:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _all_workers_ready(executor: ToolExecutor) -> None:
    """Return once every worker has answered: 4 overlapping calls landed on 4 different processes."""
    for _ in range(50):
        if len({r.content for r in executor.run([ToolCall("sleepy", {"seconds": 0.1})] * 4)}) == 4:
            return
    raise AssertionError("the 4 tool workers never all started")


def test_calls_run_concurrently_and_come_back_in_order(executor):
    _all_workers_ready(executor)
    calls = [ToolCall("sleepy", {"seconds": 0.3}) for _ in range(8)] + [ToolCall("add", {"a": 2, "b": 3})]
    start = time.monotonic()
    results = executor.run(calls)
    elapsed = time.monotonic() - start
    assert elapsed < 1.5, f"8 calls of 0.3 s on 4 workers took {elapsed:.2f}s"  # serial: 2.4 s
    assert [r.call for r in results] == calls
    assert all(r.error is None and r.content.startswith("slept in ") for r in results[:8])
    assert len({r.content for r in results[:8]}) == 4  # spread over the 4 workers
    assert results[8].content == "5" and all(0.25 < r.seconds < 1.5 for r in results[:8])
    assert executor.counts == {
        "calls": 9,
        "errors": 0,
        "malformed": 0,
        "unknown_tool": 0,
        "bad_arguments": 0,
        "exception": 0,
        "timeout": 0,
        "worker_restarts": 0,
    }


def test_every_failure_is_a_result_for_the_model(executor):
    [malformed] = HermesParser().parse('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>')
    calls = [
        malformed,
        ToolCall("subtract", {"a": 1}),
        ToolCall("add", {"a": "1", "b": 2}),
        ToolCall("add", {"a": 1}),
        ToolCall("add", {"a": 1, "b": 2, "c": 3}),
        ToolCall("options", {"mode": "slow", "tags": ["x"]}),
        ToolCall("options", {"mode": "fast", "tags": ["x", 2]}),
        ToolCall("boom", {"message": "bad input"}),
        ToolCall("leave", {"code": 2}),
        ToolCall("crash", {}),
        ToolCall("add", {"a": 4, "b": 5}),
    ]
    results = executor.run(calls)
    assert [r.error for r in results] == [
        "malformed",
        "unknown_tool",
        "bad_arguments",
        "bad_arguments",
        "bad_arguments",
        "bad_arguments",
        "bad_arguments",
        "exception",
        "exception",
        "exception",
        None,
    ]
    content = [r.content for r in results]
    assert content[0].startswith("Error: malformed tool call: the tool call is not valid JSON")
    assert content[1].startswith("Error: unknown tool 'subtract'; the available tools are: add, as_dict, as_list")
    assert content[2] == (
        "Error: bad arguments for tool 'add': 'a' must be integer, got string '1'. "
        "add takes: a (integer, required), b (integer, required)"
    )
    assert "missing required argument 'b'" in content[3]
    assert "unexpected argument 'c'" in content[4]
    assert "'mode' must be one of \"fast\", \"exact\", got 'slow'" in content[5]
    assert "'tags'[1] must be string, got integer" in content[6]
    assert content[7] == "Error: ValueError: bad input"
    assert content[8] == "Error: SystemExit: 2"
    assert content[9].startswith("Error: the tool's worker process died while running it (exit code 3)")
    assert content[10] == "9"
    counts = executor.counts
    assert (counts["calls"], counts["errors"], counts["bad_arguments"], counts["exception"]) == (11, 10, 5, 3)
    assert (counts["malformed"], counts["unknown_tool"], counts["worker_restarts"]) == (1, 1, 1)
    assert executor.run([ToolCall("add", {"a": 1, "b": 1})])[0].content == "2"  # the crashed worker was replaced


def test_argument_conversion_and_optional_values(executor):
    results = executor.run(
        [
            ToolCall("maybe", {}),
            ToolCall("maybe", {"note": None}),
            ToolCall("echo", {"text": "ab", "times": None}),  # null for an optional argument: its default
            ToolCall("add", {"a": 2.0, "b": 1}),  # an integral number is an integer (JSON schema's rule)
            ToolCall("options", {"mode": "fast", "tags": [], "limit": 3, "flags": {"x": True}}),
        ]
    )
    assert [r.error for r in results] == [None] * 5
    assert [r.content for r in results[:4]] == ["None", "None", "ab", "3"]
    assert results[4].content == '{"mode": "fast", "tags": [], "limit": 3, "scale": 1.5, "flags": {"x": true}}'


def test_async_tools_non_string_returns_and_truncation(executor):
    results = executor.run(
        [
            ToolCall("async_add", {"a": 2, "b": 40}),
            ToolCall("as_dict", {"key": "k"}),
            ToolCall("as_list", {}),
            ToolCall("as_number", {}),
            ToolCall("as_none", {}),
            ToolCall("big", {"n": 200}),
            ToolCall("big", {"n": 1000}),
        ]
    )
    assert [r.error for r in results] == [None] * 7
    assert [r.content for r in results[:5]] == [
        "42",
        '{"key": "k", "values": [1, 2.5, null], "ok": true}',
        '["é", 1]',
        "2.5",
        "None",
    ]
    assert results[5].content == "x" * 200
    assert results[6].content == "x" * 200 + "\n[output truncated: 800 more characters; tools show at most 200]"


def test_a_hung_tool_times_out_and_its_worker_is_replaced(executor):
    executor.run([ToolCall("noop", {})])
    before = _worker_pids()
    assert len(before) == 4
    start = time.monotonic()
    results = executor.run(
        [ToolCall("hang", {}), ToolCall("add", {"a": 1, "b": 2}), ToolCall("sleepy", {"seconds": 0.2})]
    )
    elapsed = time.monotonic() - start
    assert elapsed < HANG_LIMIT_S + 2.0, f"took {elapsed:.2f}s"
    assert (results[0].error, results[0].content) == (
        "timeout",
        "Error: tool 'hang' timed out after 1s and was stopped",
    )
    assert HANG_LIMIT_S <= results[0].seconds < HANG_LIMIT_S + 1.0
    assert [r.error for r in results[1:]] == [None, None]
    assert executor.counts["timeout"] == 1 and executor.counts["worker_restarts"] == 1
    assert executor.run([ToolCall("add", {"a": 3, "b": 4})])[0].content == "7"  # the pool still works
    after = _worker_pids()
    assert len(after) == 4 and len(before - after) == 1  # one worker killed, one started


def test_a_timeout_kills_the_tools_subprocesses_too(executor, tmp_path):
    pid_file = tmp_path / "child.pid"
    [result] = executor.run([ToolCall("hang_with_child", {"pid_file": str(pid_file)})])
    assert result.error == "timeout"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 3.0
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the tool's subprocess outlived its killed worker"


def closure_factory():
    def inner(x: int) -> int:
        return x

    return inner


def test_unpicklable_tools_are_refused_at_construction():
    with pytest.raises(ValueError) as e:
        ToolExecutor({"inner": make_tool(closure_factory(), plugin="mine")})
    message = str(e.value)
    assert message.startswith("plugin 'mine', tool 'inner': its function cannot be sent to the tool worker processes")
    assert "define it at module level" in message
    spec = make_tool(calc, schema=GOOD)
    lam = ToolSpec("calc", lambda expr, digits=6: expr, spec.schema)
    with pytest.raises(ValueError, match="define it at module level"):
        ToolExecutor({"calc": lam})
    with pytest.raises(ValueError, match=r"tools\['other'\] holds the tool named 'calc'; key it by its name"):
        ToolExecutor({"other": spec})
    with pytest.raises(TypeError, match="must be a ToolSpec"):
        ToolExecutor({"calc": calc})


def test_a_tool_its_workers_cannot_import_fails_alone(tmp_path, monkeypatch, caplog):
    (tmp_path / "parent_only_tools.py").write_text("def hidden(x: int) -> int:\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import parent_only_tools

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])  # the workers will not find it
    specs = {"hidden": make_tool(parent_only_tools.hidden, plugin="p"), "add": make_tool(tool_fns.add)}
    try:
        with ToolExecutor(specs, max_workers=1) as ex:
            hidden, added = ex.run([ToolCall("hidden", {"x": 1}), ToolCall("add", {"a": 1, "b": 1})])
    finally:
        sys.modules.pop("parent_only_tools", None)
    assert hidden.error == "exception"
    assert hidden.content.startswith("Error: tool 'hidden' could not be loaded in the tool worker: ModuleNotFoundError")
    assert (added.error, added.content) == (None, "2")
    assert "plugin 'p', tool 'hidden' cannot be loaded in the tool workers" in caplog.text


def test_workers_get_no_secrets_and_close_leaves_no_process(monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "sk-123")
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    monkeypatch.setenv("DB_PASSWORD", "pw")
    monkeypatch.setenv("KEPT_SECRET", "kept")
    monkeypatch.setenv("PLAIN_SETTING", "visible")
    before = _worker_pids()
    spec = make_tool(tool_fns.env_var)
    executor = ToolExecutor({"env_var": spec}, max_workers=2, keep_env=["KEPT_SECRET"])
    names = ["MY_API_KEY", "HF_TOKEN", "DB_PASSWORD", "KEPT_SECRET", "PLAIN_SETTING"]
    results = executor.run([ToolCall("env_var", {"name": n}) for n in names])
    assert [r.content for r in results] == ["<unset>", "<unset>", "<unset>", "kept", "visible"]
    assert len(_worker_pids() - before) == 2
    executor.close()
    executor.close()  # idempotent
    assert _worker_pids() == before
    with pytest.raises(RuntimeError, match="after close"):
        executor.run([ToolCall("env_var", {"name": "X"})])


# a script's first lines: plugrl's tools protocol as `tools`, plugrl-tools' pool as `executor` and tool authoring as
# `authoring` (none imports torch)
LOAD_TOOLS = "import sys; from plugrl.rollout import tools; from plugrl_tools import authoring, executor"


def test_tools_defined_in_the_main_script(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            {LOAD_TOOLS}

            def shout(text: str) -> str:
                \"\"\"Upper-case the text.\"\"\"
                return text.upper() + "!"

            if __name__ == "__main__":
                with executor.ToolExecutor({{"shout": authoring.make_tool(shout)}}, max_workers=1) as ex:
                    print(ex.run([tools.ToolCall("shout", {{"text": "hi"}})])[0].content)
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "HI!"


def test_workers_die_with_a_killed_trainer(tmp_path):
    script = tmp_path / "killed_trainer.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time
            {LOAD_TOOLS}
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            import tool_fns

            specs = {{"pid": authoring.make_tool(tool_fns.pid), "hang": authoring.make_tool(tool_fns.hang)}}
            ex = executor.ToolExecutor(specs, max_workers=1, time_limit_s=60)
            print(ex.run([tools.ToolCall("pid", {{}})])[0].content, flush=True)
            ex.run([tools.ToolCall("hang", {{"seconds": 60}})])
            """
        )
    )
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(trainer.stdout.readline())
        assert _alive(worker)
        time.sleep(0.2)  # the hanging call is running
    finally:
        trainer.kill()
        trainer.wait()
        trainer.stdout.close()
    deadline = time.monotonic() + 4.0
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker), "a tool worker outlived its killed trainer"


def test_per_call_overhead_is_small(executor):
    executor.run([ToolCall("noop", {})] * 8)  # warm
    n = 400
    start = time.perf_counter()
    results = executor.run([ToolCall("noop", {})] * n)
    batch_ms = (time.perf_counter() - start) / n * 1000
    start = time.perf_counter()
    for _ in range(50):
        executor.run([ToolCall("noop", {})])
    single_ms = (time.perf_counter() - start) / 50 * 1000
    assert all(r.content == "ok" for r in results)
    print(f"tool call overhead: {batch_ms:.3f} ms per call in a batch of {n}, {single_ms:.3f} ms for a lone call")
    assert batch_ms < 5.0 and single_ms < 5.0


def test_an_empty_batch_and_no_tools():
    with ToolExecutor({}) as ex:
        assert ex.run([]) == [] and ex.counts["calls"] == 0
        [result] = ex.run([ToolCall("anything", {})])
        assert (result.error, result.content) == (
            "unknown_tool",
            "Error: unknown tool 'anything'; the available tools are: none",
        )


def test_the_executor_comes_from_plugrl_tools_and_its_absence_names_the_package(monkeypatch, tmp_path):
    """The worker pool is plugrl-tools' (entry-point group plugrl.tool_executors); without it, tool_executor()
    and a run with rollout.tools name the package, before any model loads."""
    import importlib.metadata

    from plugrl.config import ConfigError, build_config
    from plugrl.rollout.tools import NoToolExecutor, tool_executor
    from plugrl_multiturn.checks import check_config

    assert tool_executor() is ToolExecutor
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kw: [] if kw.get("group") == "plugrl.tool_executors" else real(**kw),
    )
    with pytest.raises(NoToolExecutor, match=r"plugrl-tools, which is not installed: pip install plugrl-tools"):
        tool_executor()
    cfg = build_config({"model": {"path": "/m"}, "data": {"train_files": ["t"]}, "rollout": {"tools": ["python"]}})
    with pytest.raises(ConfigError, match=r"rollout.tools=\['python'\]: tool calls run in the package plugrl-tools"):
        check_config(cfg)
