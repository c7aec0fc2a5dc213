"""Tests for the math-with-tools plugin (plugins/envs_math_tools): the ``calculator`` tool (values, exactness,
limits, refused constructs), the schema plugrl derives for it, calls through plugrl's tool worker processes,
the ``math_tools`` environment and template, a scripted episode through plugrl's multi-turn loop scored by the
gsm8k reward, and one training step on a tiny model."""

from __future__ import annotations

import ast
import builtins
import json
import random
import re
import time
from fractions import Fraction
from pathlib import Path

import pytest
from pydantic import ValidationError

from plugrl.config import ConfigError, DataConfig, load_config
from plugrl.data import row_to_sample
from plugrl.plugins import check_config, check_registry, load_plugins
from plugrl.rollout.environment import EnvStart, EnvStep, Turn
from plugrl.rollout.tools import ToolCall, get_parser
from plugrl_envs_math_tools import (
    DEFAULT_TOOLS,
    MathTools,
    MathToolsOptions,
    answer_instruction,
    calculator,
    evaluate,
    format_number,
    math_tools_template,
    sample_question,
)
from plugrl_envs_math_tools.calculator import MAX_CHARS, MAX_DEPTH, MAX_DIGITS
from plugrl_gsm8k import gsm8k_dataset, gsm8k_reward
from plugrl_multiturn.env_results import as_env_start, as_env_step
from plugrl_multiturn.routing import environment_options
from plugrl_tools.authoring import make_tool
from plugrl_tools.executor import ToolExecutor

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gsm8k_tools.yaml"

GSM8K_ROWS = [  # made-up problems in GSM8K's own format
    {"question": "Tom has 12 apples and buys 30 more. How many apples does he have?", "answer": "12+30=42\n#### 42"},
    {"question": "A box holds 6 rows of 7 eggs. How many eggs are in 3 boxes?", "answer": "6*7*3=126\n#### 126"},
    {"question": "Ann reads 15 pages a day. How many pages does she read in a week?", "answer": "15*7=105\n#### 105"},
    {"question": "A shirt costs $25 and is 20% off. What does it cost now?", "answer": "25*0.8=20\n#### 20"},
]


def write_gsm8k(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    return path


def gsm8k_samples(tmp_path: Path) -> list:
    """The rows as the gsm8k dataset makes them, validated into samples by the kernel."""
    rows = gsm8k_dataset("train", path=str(write_gsm8k(tmp_path / "gsm8k.jsonl")))
    return [row_to_sample(row, f"gsm8k row {i}", DataConfig()) for i, row in enumerate(rows)]


# --------------------------------------------------------------------------- the calculator: values


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("2 * 3 ** 2", "18"),
        ("-2 ** 2", "-4"),  # Python's (and maths') precedence: the power first
        ("(-2) ** 2", "4"),
        ("2 ** 3 ** 2", "512"),  # right-associative
        ("2 ^ 10", "1024"),  # ^ is a power, as on calculators
        ("--3", "3"),
        ("+5 - -5", "10"),
        ("10 - 4 - 3", "3"),  # left-associative
        ("100 / 10 / 5", "2"),
        ("7 / 2", "3.5"),
        ("10 / 4", "2.5"),
        ("1 / 8", "0.125"),
        ("1 / 3", "0.333333333333333"),
        ("2 / 3", "0.666666666666667"),
        ("-1 / 3", "-0.333333333333333"),
        ("1 / 3 * 3", "1"),  # exact fractions, not floats
        ("0.1 + 0.2", "0.3"),
        ("0.1 * 3", "0.3"),
        ("1.10 - 1", "0.1"),
        ("12.50 * 4", "50"),
        ("-7.25", "-7.25"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("-7 % 3", "2"),
        ("7.5 % 2", "1.5"),
        ("2 ** -2", "0.25"),
        ("2 ** 0", "1"),
        ("0 ** 0", "1"),
        ("1e3 + 1", "1001"),
        ("1_000 * 3", "3000"),
        ("0x10", "16"),
        ("1e308 * 10", "1" + "0" * 309),  # exact: no float overflow
        ("2 ** 100", str(2**100)),
        ("sqrt(16)", "4"),
        ("sqrt(2.25)", "1.5"),
        ("sqrt(1/4)", "0.5"),
        ("sqrt(2)", "1.4142135623731"),
        ("8 ** (1/3)", "2"),
        ("(-8) ** (1/3)", "-2"),
        ("(-2) ** (1/3)", "-1.25992104989487"),
        ("4 ** 0.5", "2"),
        ("2 ** 0.5", "1.4142135623731"),
        ("abs(-3.5)", "3.5"),
        ("round(2.5)", "3"),  # halves away from zero
        ("round(-2.5)", "-3"),
        ("round(2.675, 2)", "2.68"),  # the decimal 2.675, not the float below it
        ("round(1234.5678, -2)", "1200"),
        ("round(7 / 3, 3)", "2.333"),
        ("round(sqrt(2), 4)", "1.4142"),
        ("min(3, 1, 2)", "1"),
        ("max(1.5, 2)", "2"),
        ("min(1/3, 0.3)", "0.3"),
        ("floor(-2.5)", "-3"),
        ("ceil(2.1)", "3"),
        ("floor(7 / 2)", "3"),
        ("log(8, 2)", "3"),
        ("log(1000, 10)", "3"),  # exact, though the float is 2.9999999999999996
        ("log(e)", "1"),
        ("log(2)", "0.693147180559945"),
        ("exp(0)", "1"),
        ("exp(1)", "2.71828182845905"),
        ("sin(0)", "0"),
        ("cos(0)", "1"),
        ("sin(pi / 2)", "1"),
        ("pi", "3.14159265358979"),
        ("e", "2.71828182845905"),
        ("2 * pi * 10", "62.8318530717959"),
        ("10 ** 20 / 3", "3.33333333333333e+19"),
        ("1 / 30000000000", "3.33333333333333e-11"),
        ("(48 / 2 + 48) * 3", "216"),
        ("25 * (1 - 20 / 100)", "20"),
        # the spellings a model writes
        ("3 × 4 ÷ 2 − 1", "5"),
        ("2 · 21", "42"),
        ("$12 * 4", "48"),
        ("6 * 7 =", "42"),
        ("  6*7  ", "42"),
        ("(((((((((((1)))))))))))", "1"),
        ("+".join(["1"] * 240), "240"),  # a long flat sum does not nest
    ],
)
def test_calculator_values(expression, expected):
    assert calculator(expression) == expected


def test_calculator_is_exact_where_floats_are_not():
    assert evaluate("0.1 + 0.2") == Fraction(3, 10)
    assert evaluate("1/3 + 1/6") == Fraction(1, 2)
    assert isinstance(evaluate("sqrt(2)"), float) and isinstance(evaluate("sqrt(9/4)"), Fraction)
    assert format_number(Fraction(-1, 8)) == "-0.125" and format_number(-0.0) == "0"
    assert format_number(Fraction(1, 2**20)) == "0.00000095367431640625"  # exact: 20 decimals
    assert format_number(Fraction(1, 2**40)) == "9.09494701772928e-13"  # 40 decimals: more than shown exactly


def test_calculator_agrees_with_exact_python_arithmetic_on_random_expressions():
    rng = random.Random(0)

    def expr(depth: int) -> str:
        if depth == 0 or rng.random() < 0.3:
            return str(rng.randint(-20, 20))
        return f"({expr(depth - 1)} {rng.choice('+-*/')} {expr(depth - 1)})"

    checked = 0
    for _ in range(300):
        text = expr(4)
        # the reference: the same expression over Fractions (trusted test input, never model output)
        reference_text = re.sub(r"\d+", lambda m: f"Fraction({m.group()})", text)
        try:
            reference = eval(reference_text, {"Fraction": Fraction})
        except ZeroDivisionError:
            assert calculator(text) == "Error: division by zero"
            continue
        assert evaluate(text) == reference, text
        checked += 1
    assert checked > 200


# --------------------------------------------------------------------------- the calculator: refusals


@pytest.mark.parametrize(
    "expression, says",
    [
        ("1 / 0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("5 % 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("sqrt(-1)", "negative"),
        ("(-8) ** 0.5", "no real value"),
        ("log(0)", "undefined"),
        ("log(-1)", "undefined"),
        ("log(8, 1)", "base"),
        ("exp(1000)", "too large"),
        ("1e999999999", "too large or too small"),
        ("1e-999999999", "too large or too small"),
        ("1 / 3 ** 5000", "too large"),
        # huge powers are refused before they are computed
        ("9 ** 9 ** 9", "too large"),
        ("10 ** 10 ** 10", "too large"),
        ("2 ** 100000", "too large"),
        ("2 ** (10 ** 400)", "too large"),
        ("(1/2) ** 100000", "too large"),
        ("(10 ** 999) * (10 ** 999)", "too large"),
        ("2.5 ** 1e10", "too large"),
        ("round(1, 1000)", "between"),
        ("round(1.5, 0.5)", "whole number"),
        # input size and nesting
        ("1" * (MAX_CHARS + 1), "too long"),
        ("1+" * 5000 + "1", "too long"),
        ("-" * (MAX_DEPTH + 1) + "1", "nested too deeply"),
        ("sqrt(" * 70 + "1" + ")" * 70, "nested too deeply"),
        ("(" * 210 + "1" + ")" * 210, "invalid expression"),  # the parser's own limit (200)
        ("", "empty"),
        ("   =", "empty"),
        # what is not arithmetic
        ("__import__('os')", "unknown function '__import__'"),
        ("__import__('os').system('echo hacked')", "attribute access"),
        ("().__class__.__bases__[0].__subclasses__()", "attribute access"),
        ("open('/etc/passwd')", "unknown function 'open'"),
        ("eval('1+1')", "unknown function 'eval'"),
        ("exec('import os')", "unknown function 'exec'"),
        ("(lambda: 1)()", "lambda"),
        ("lambda x: x", "lambda"),
        ("[x for x in range(10)]", "comprehensions"),
        ("sum(x for x in range(10))", "unknown function 'sum'"),
        ("max(x for x in (1, 2))", "generator expressions"),
        ("(x := 5)", "assignments"),
        ("x + 1", "unknown name 'x'"),
        ("__builtins__", "unknown name '__builtins__'"),
        ("pi.real", "attribute access"),
        ("'abc'", "text is not a number"),
        ("'a' * 10**9", "text is not a number"),
        ("f'{1+1}'", "text is not a number"),
        ("b'1'", "text is not a number"),
        ("[1, 2][0]", "indexing"),
        ("{1: 2}", "dictionaries"),
        ("{1, 2}", "sets"),
        ("[1] * 10**9", "lists"),
        ("1, 2", "comma"),
        ("1,000", "thousands separators"),
        ("1 < 2", "comparisons"),
        ("1 and 2", "and / or"),
        ("1 if 1 else 2", "conditional"),
        ("not 1", "not is not supported"),
        ("~1", "~ is not supported"),
        ("1 << 100000", "<< is not supported"),
        ("1 | 2", "| is not supported"),
        ("True + 1", "True is not a number"),
        ("None", "None is not a number"),
        ("...", "Ellipsis is not a number"),
        ("1j * 2", "complex"),
        ("max(*[1, 2])", "unpacking"),
        ("round(x=1.5)", "keyword"),
        ("round(1, 2, 3)", "one or two arguments"),
        ("sqrt()", "one argument"),
        ("max()", "at least one argument"),
        ("sqrt", "sqrt is a function"),
        ("pi(2)", "pi is a constant"),
        ("2(3 + 4)", "write the multiplication out"),
        ("import os", "invalid expression"),
        ("1 +", "invalid expression"),
        ("1\x00", "invalid expression"),
        ("x = 5", "invalid expression"),
        ("50%", "invalid expression"),
    ],
)
def test_calculator_refuses_with_an_error_text(expression, says):
    out = calculator(expression)
    assert out.startswith("Error: ") and says in out, out
    assert len(out) < 400  # one sentence for the model, not a traceback


@pytest.mark.parametrize("value", [None, 42, 1.5, ["1+1"], {"expression": "1"}, b"1+1"])
def test_calculator_answers_non_text_with_an_error(value):
    assert calculator(value).startswith("Error: the expression must be text")


def test_hostile_inputs_never_run_code_and_finish_fast(tmp_path, monkeypatch):
    marker = tmp_path / "hacked"
    refused = [
        f"__import__('os').system('touch {marker}')",
        f"open('{marker}', 'w').write('x')",
        f"exec(\"open('{marker}', 'w')\")",
        "().__class__.__base__.__subclasses__()",
        "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]('id')",
        "9 ** 9 ** 9 ** 9",
        "10 ** 10 ** 10 ** 10 ** 10",
        "(" * 199 + "9 ** 9 ** 9" + ")" * 199,
        "2 ** 3322 * 2 ** 3322",
        "1e1000 ** 3",
        "sqrt(10 ** 999)",
        "(10 ** 999 + 1/7) * (10 ** 999 - 1/7)",
        "-" * 400 + "1",
        "1" * 10**6,
        "\x00" * 100,
    ]
    heavy = [  # allowed, but as large as the limits let them be
        "max(" + ", ".join(["10 ** 999"] * 40) + ")",
        "round(10 ** 999 + 0.5)",
        "log(10 ** 999, 1.0000001)",
        "(10 ** 999) ** (1/7)",
        "(9 ** 1000) ** (1/64)",
        " + ".join(f"1/{p}" for p in (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79)),
        "*".join(["(1 + 1/3)"] * 45),
    ]

    called = []  # code run by eval, exec or compile (ast.parse's compile to a syntax tree only is parsing)
    real_compile = builtins.compile

    def parse_only(source, filename, mode, flags=0, *args, **kwargs):
        if not flags & ast.PyCF_ONLY_AST:
            called.append(("compile", source))
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", parse_only)
    monkeypatch.setattr(builtins, "eval", lambda *args, **kwargs: called.append(("eval", args)))
    monkeypatch.setattr(builtins, "exec", lambda *args, **kwargs: called.append(("exec", args)))
    started = time.perf_counter()
    outs = [calculator(a) for a in refused]
    heavy_outs = [calculator(a) for a in heavy]
    elapsed = time.perf_counter() - started
    monkeypatch.undo()
    assert called == [] and not marker.exists()
    assert all(o.startswith("Error: ") for o in outs), outs
    assert all(isinstance(o, str) and o for o in heavy_outs)
    assert elapsed < 5.0, elapsed  # every limit is checked before the work is done


def test_limits_are_as_documented():
    assert calculator("9" * 400) == "9" * 400
    assert calculator("10 ** 999") == "1" + "0" * 999
    assert calculator(f"10 ** {MAX_DIGITS + 10}").startswith("Error: the power is too large")
    assert calculator("-" * (MAX_DEPTH - 1) + "1") in ("1", "-1")


# --------------------------------------------------------------------------- the tool as plugrl sees it


def test_the_schema_plugrl_derives():
    reg = load_plugins(["math_tools"])
    spec = reg.tools["calculator"]
    assert spec.fn is calculator and spec.plugin == "math_tools" and spec.name == "calculator"
    assert spec.schema == make_tool(calculator).schema  # the decorator's record is the kernel's own derivation
    function = spec.schema["function"]
    assert function["name"] == "calculator"
    assert function["description"].startswith("Evaluate an arithmetic expression exactly")
    for word in ("sqrt", "round", "min", "max", "floor", "ceil", "log", "exp", "sin", "cos", "pi"):
        assert word in function["description"]
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "expression": {
                "type": "string",
                "description": 'The expression, e.g. "(48 / 2 + 48) * 3" or "sqrt(2) * 10".',
            }
        },
        "required": ["expression"],
    }
    assert "python" in reg.tools  # the kernel's sandbox, which the environment offers too
    assert reg.environments["math_tools"].factory is MathTools
    assert reg.environments["math_tools"].options is MathToolsOptions
    assert reg.templates["math_tools"].fn is math_tools_template
    assert check_registry(reg) == []


def test_calls_run_in_plugrls_tool_worker_processes():
    """The worker processes import the tool's module by name (the installed plugin) and answer every call."""
    reg = load_plugins(["math_tools"])
    assert calculator.__module__ == "plugrl_envs_math_tools.calculator"
    calls = [
        ToolCall("calculator", {"expression": "(48 / 2 + 48) * 3"}),
        ToolCall("calculator", {"expression": "1 / 0"}),
        ToolCall("calculator", {"expression": "__import__('os').getpid()"}),
        ToolCall("calculator", {"expression": "9 ** 9 ** 9"}),
        ToolCall("calculator", {"expression": 42}),  # not a string: the kernel's argument check answers
        ToolCall("calculator", {}),
        ToolCall("calculator", {"expression": "1", "precision": 3}),
    ]
    with ToolExecutor({"calculator": reg.tools["calculator"]}, max_workers=2, time_limit_s=10) as executor:
        results = executor.run(calls)
        again = executor.run([ToolCall("calculator", {"expression": "sqrt(2) ** 2"})])
    contents = [r.content for r in results]
    assert contents[0] == "216" and results[0].error is None
    assert contents[1] == "Error: division by zero" and results[1].error is None  # answered by the tool itself
    assert "attribute access" in contents[2] and "too large" in contents[3]
    assert [r.error for r in results[4:]] == ["bad_arguments"] * 3
    assert "'expression' must be string" in contents[4] and "missing required argument 'expression'" in contents[5]
    assert "unexpected argument 'precision'" in contents[6]
    assert [r.content for r in again] == ["2"]
    assert executor.counts["calls"] == 1 and executor.counts["errors"] == 0


def test_tool_calls_as_a_model_writes_them_are_parsed_for_the_calculator():
    reply = 'Half of 48: <tool_call>\n{"name": "calculator", "arguments": {"expression": "48 / 2"}}\n</tool_call>'
    (call,) = get_parser("hermes").parse(reply)
    assert call.error is None and call.name == "calculator" and calculator(**call.arguments) == "24"


# --------------------------------------------------------------------------- the environment


def test_start_offers_the_tools_and_keeps_the_samples_prompt(tmp_path):
    sample = gsm8k_samples(tmp_path)[0]
    begun = as_env_start(MathTools().start(sample), "test")
    assert isinstance(begun, EnvStart) and begun.messages is None
    assert list(begun.tools) == ["calculator", "python"] == list(DEFAULT_TOOLS)
    only = as_env_start(MathTools(tools=["calculator"]).start(sample), "test")
    assert list(only.tools) == ["calculator"]
    assert list(MathTools(tools=[]).start(sample).tools) == []


def test_the_episode_continues_while_the_model_calls_tools(tmp_path):
    sample = gsm8k_samples(tmp_path)[0]
    env = MathTools()
    call = ToolCall("calculator", {"expression": "12 + 30"})
    turn = Turn(0, "<tool_call>...</tool_call>", [call], [], [], sample)
    step = as_env_step(env.step(turn), turn, "test")
    assert step == EnvStep(done=False) and step.messages == []
    final = Turn(1, "Tom has 42 apples. #### 42", [], [], [], sample)
    step = as_env_step(env.step(final), final, "test")
    assert step.done and step.reward is None  # the reward plugins score the reply


@pytest.mark.parametrize(
    "options",
    [
        {"tools": ["calculator", "calculator"]},
        {"tools": ["not a name"]},
        {"tools": [""]},
        {"tools": "calculator"},
        {"tool": ["calculator"]},  # a typo is refused, not ignored
        {"max_tool_rounds": 3},
    ],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValidationError):
        MathToolsOptions(**options)
    with pytest.raises(ValidationError):
        MathTools(**options)


def test_bad_environment_options_stop_the_run_at_start_up():
    cfg = load_config(EXAMPLE, ["environment_options.tools=[calculator, calculator]", "environment_options.tols=[]"])
    with pytest.raises(ConfigError) as err:
        check_config(cfg, load_plugins(cfg.plugins))
    assert "environment_options.tools" in str(err.value) and "environment_options.tols" in str(err.value)


def test_a_tool_the_environment_would_offer_must_be_registered_at_start_up():
    """environment_options.tools names tools the episodes' start() asks for: an unknown one stops the run
    before any model loads, not every episode at its start."""
    cfg = load_config(EXAMPLE, ["environment_options.tools=[calculater, python]"])
    with pytest.raises(ConfigError, match=r"environment_options.tools names no registered tool: 'calculater'; did"):
        check_config(cfg, load_plugins(cfg.plugins))
    routed = load_config(
        EXAMPLE, ["environment={'gsm8k*': math_tools}", "environment_options={math_tools: {tools: [pythn]}}"]
    )
    with pytest.raises(ConfigError, match=r"environment_options.math_tools.tools names no registered tool: 'pythn'"):
        check_config(routed, load_plugins(routed.plugins))


# --------------------------------------------------------------------------- the template and the rewards


def test_the_template_asks_for_the_answer_format_of_the_samples_reward(tmp_path):
    sample = gsm8k_samples(tmp_path)[1]
    (message,) = math_tools_template(sample)
    assert message["role"] == "user"
    assert message["content"].startswith("A box holds 6 rows of 7 eggs. How many eggs are in 3 boxes?\n\n")
    assert "tools" in message["content"] and '"#### 42"' in message["content"]
    assert "Let's think step by step" not in message["content"]  # verl's instruction is replaced, not repeated
    math_row = {"problem": "What is 2 + 2?", "data_source": "math", "prompt": ""}
    (message,) = math_tools_template(math_row)
    assert message["content"].startswith("What is 2 + 2?") and "\\boxed{42}" in message["content"]
    assert "####" in answer_instruction("my_source") and "\\boxed" in answer_instruction("HuggingFaceH4/MATH-500")


def test_the_question_is_found_in_every_layout():
    assert sample_question({"question": " Q1 "}) == "Q1"
    assert sample_question({"extra_info": {"question": "Q2"}, "prompt": "other"}) == "Q2"
    assert sample_question({"problem": "Q3"}) == "Q3"
    assert sample_question({"prompt": "Q4"}) == "Q4"
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q5"}]
    assert sample_question({"prompt": messages}) == "Q5"
    with pytest.raises(ValueError, match="template 'math_tools' needs the problem"):
        sample_question({"prompt": ""})


def test_replies_in_the_asked_format_earn_the_rewards():
    from plugrl_math import math_accuracy

    assert gsm8k_reward("6 * 7 * 3 = 126 eggs.\n#### 126", "126")["score"] == 1.0
    assert gsm8k_reward("The calculator says 126.", "126")["score"] == 0.0  # no "#### ": no answer
    assert math_accuracy("So the answer is \\boxed{4}.", "4")["score"] == 1.0


def test_the_example_config_passes_the_plugin_checks():
    cfg = load_config(EXAMPLE)
    assert cfg.multi_turn and cfg.environment == "math_tools" and cfg.data.template == "math_tools"
    reg = load_plugins(cfg.plugins)
    check_config(cfg, reg)
    assert environment_options(cfg, reg.environments["math_tools"]) == {"tools": ["calculator", "python"]}
    assert cfg.rollout.max_turns == 3 and "</tool_call>" in cfg.rollout.stop
    assert cfg.data.dataset == "gsm8k" and "gsm8k_reward" in cfg.reward.options


# --------------------------------------------------------------------------- through plugrl's multi-turn loop


class ScriptedEngine:
    """Answers each turn with the next scripted reply (tokenized, closed by the EOS token)."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.replies = tokenizer, list(replies)
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.prompts: list[list[int]] = []

    def generate(self, prompts, sampling):
        from plugrl.rollout import Rollout

        out = []
        for p in prompts:
            self.prompts.append(list(p))
            ids = self.tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"] + [self.eos]
            out.append([Rollout(list(p), ids[: sampling.max_tokens], None, "stop")])
        return out


def _play(tokenizer, sample, env_factory, replies, registry):
    from plugrl.rollout import SamplingSettings
    from plugrl_multiturn import EpisodeRunner
    from plugrl_multiturn.chat import ChatFormat
    from plugrl_multiturn.records import EpisodeStart, MultiTurnLimits

    chat = ChatFormat(tokenizer, "SmolLM2")
    messages = math_tools_template(sample)
    engine = ScriptedEngine(tokenizer, replies)
    with ToolExecutor(registry.tools, max_workers=1, time_limit_s=10) as executor:
        runner = EpisodeRunner(
            engine,
            chat,
            tokenizer,
            MultiTurnLimits(max_turns=3, max_turn_tokens=64, max_response_tokens=400, max_tool_calls_per_turn=4),
            registered_tools=registry.tools,
            default_tools=[],
            parser=get_parser("hermes"),
            run_tools=lambda pairs: executor.run([c for c, _ in pairs]),
        )
        start = EpisodeStart(sample, chat.prompt_ids(messages, None), messages, env_factory, "environment 'math_tools'")
        ((rollout, conversation),) = runner.run([start], SamplingSettings(n=1, max_tokens=64, temperature=1.0))
    return rollout, conversation, engine


def test_a_scripted_episode_calls_the_calculator_and_is_scored_by_the_gsm8k_reward(tmp_path, smol_tokenizer):
    reg = load_plugins(["gsm8k", "math_tools"])
    sample = gsm8k_samples(tmp_path)[1]
    replies = [
        'Eggs in a box: <tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7 * 3"}}\n</tool_call>',
        "There are 126 eggs in 3 boxes.\n#### 126",
    ]
    rollout, conv, engine = _play(smol_tokenizer, sample, MathTools, replies, reg)
    assert conv.finish == "done" and conv.turns == 2 and conv.error is None
    assert conv.tool_calls == 1 and conv.tool_errors == 0 and conv.reward is None
    roles = [m["role"] for m in conv.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    # SmolLM2's chat template ignores `tools`: the kernel describes both offered tools in the system message
    system = conv.messages[0]["content"]
    assert '"name": "calculator"' in system and '"name": "python"' in system
    assert conv.messages[3] == {"role": "tool", "name": "calculator", "content": "126", "tool_call_id": "call_0_0"}
    assert gsm8k_reward(conv.last_reply, sample.ground_truth)["score"] == 1.0
    # the second turn's context holds the tool's answer; it is not trained on
    assert "126" in smol_tokenizer.decode(engine.prompts[1][len(engine.prompts[0]) :])
    assert 0 in rollout.policy_mask and rollout.policy_mask[0] == 1 and rollout.policy_mask[-1] == 1


def test_an_unknown_tool_name_fails_each_episode_at_its_start(tmp_path, smol_tokenizer):
    reg = load_plugins(["math_tools"])
    sample = gsm8k_samples(tmp_path)[0]
    _, conv, engine = _play(smol_tokenizer, sample, lambda: MathTools(tools=["calculater"]), [], reg)
    assert conv.finish == "error" and "'calculater', which no plugin registers" in conv.error
    assert engine.prompts == []


# --------------------------------------------------------------------------- training


@pytest.mark.slow
def test_one_training_step_with_the_environment(tiny_model, tmp_path):
    """The example's settings, shrunk: one GRPO step on a tiny random model (HF engine) with made-up GSM8K rows."""
    from plugrl.trainer import train

    data = write_gsm8k(tmp_path / "gsm8k.jsonl")
    cfg = load_config(
        EXAMPLE,
        [
            f"model.path={tiny_model}",
            "model.dtype=float32",
            f"data.dataset_options.path={data}",
            "data.train_batch_size=2",
            "data.max_response_length=48",
            "rollout.name=hf",
            "rollout.n=2",
            "rollout.max_turn_tokens=16",
            "environment=math_tools",
            "trainer.total_steps=1",
            "trainer.save_freq=0",
            f"trainer.output_dir={tmp_path}",
            "trainer.experiment_name=mt",
            "trainer.logger=[jsonl]",
            "actor.optim.lr=1e-4",
        ],
    )
    train(cfg)
    run = tmp_path / "mt"
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert m["actor/optimizer_steps"] == 1 and m["env/errors"] == 0.0
    assert m["env/turns_mean"] >= 1.0 and "env/tool_calls" in m and "env/tool_errors" in m and "env/truncated" in m
    rows = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert row["environment"].startswith("environment 'math_tools'")
        assert row["messages"][0]["role"] == "system" and '"name": "calculator"' in row["messages"][0]["content"]
        assert "Use the tools" in row["messages"][1]["content"]
        assert row["segments"][0]["trained"]
