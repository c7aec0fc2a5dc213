"""The tinyv plugin: verdict and rubric parsing, each setup's arithmetic, routing (``_tinyv`` anywhere in the
data source), replaceable prompt templates, retries and fallbacks, prompt bounds from the context the server
reports (a fake OpenAI-compatible server in a subprocess, standing in for vLLM), ``launch: true`` through the run
hooks (a fake server; the managed server's own failure paths are tests/test_servers.py's), then the real
SmolLM2-135M-Instruct behind vLLM: one request per template, its reported context, 100 KB completions, a server
going away mid-run and coming back, and ``launch: true`` starting and stopping a real server."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import plugrl_model_servers as servers
import plugrl_tinyv as tv
from plugrl.config import ConfigError, RewardConfig, build_config, load_config
from plugrl.data import Sample
from plugrl.plugins import check_config, load_plugins
from plugrl.rewards import RewardItem, RewardRunner, check_routes
from plugrl.rewards.routing import rewards_for
from plugrl.specs import Registry, RewardSpec
from plugrl_tinyv.prompts import build_messages, question_text
from plugrl_tinyv.verifier import combine, last_boxed, rule_answer
from tcp_relay import Relay

# the session-scoped `openai_server` fixture: one real vLLM server per session, shared with other modules
pytest_plugins = ["openai_server"]

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"


@pytest.fixture(autouse=True)
def _no_failures_in_a_row_from_other_tests():
    """The count behind max_failures_in_a_row is per process (a run resets it at its start): each test starts at 0."""
    from plugrl_tinyv.verifier import reset_failures_in_a_row

    reset_failures_in_a_row()


# no --dtype: plugrl_model_servers picks float32 on a CPU without bf16 kernels (tests/test_servers.py)
CPU_SERVER_ARGS = ["--max-model-len", "2048", "--kv-cache-memory-bytes", str(256 * 2**20), "--enforce-eager"]


def free_port() -> int:
    from openai_server import free_port as pick  # imported after pytest loaded it as a plugin

    return pick()


# =========================================================================== parsing canned replies


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("True", True),
        ("False", False),
        ("true.", True),
        ("  FALSE\n", False),
        ("**True**", True),
        ("`False`", False),
        ("\\boxed{True}", True),
        ("The answer is True", True),
        ("Final verdict: **False**.", False),
        ("False. True would need the answer 13.", False),  # both words: the opening verdict decides
        ("True\n\nThe student's 0.5 equals 1/2, so it is not false.", True),
        # thinking models: only the text after the reasoning counts
        ("<think>The student wrote 1/2, the reference is 0.5. False? No, they are equal.</think>\nTrue", True),
        ("<think>\nlooks true at first\n</think>\n\nFalse", False),
        ("<think>a</think><think>b True</think> False", False),
    ],
)
def test_parse_verdict(reply, verdict):
    assert tv.parse_verdict(reply) is verdict


@pytest.mark.parametrize(
    "reply",
    [
        None,
        "",
        "   ",
        "I cannot tell.",
        "True or False",  # both, no verdict of its own
        "It is not true.",  # a negation is not a verdict
        "untrue",
        "<think>The answer is clearly True but let me check",  # reasoning cut off by max_tokens
        "<think>True</think>",  # a verdict only inside the reasoning
        "Yes",
        "1",
    ],
)
def test_parse_verdict_garbage(reply):
    assert tv.parse_verdict(reply) is None


@pytest.mark.parametrize(
    ("reply", "fraction"),
    [
        ("The response meets criteria 1 and 2.\nTotal Score: 7/10", 0.7),
        ("**Total Score**: 8.5 / 10", 0.85),
        ("Total Score: [9/10]", 0.9),
        ("Total Score: 3 points", 0.3),
        ("7/10", 0.7),  # no marker: read whole, as the grade plugin does
        ("Total Score: 12/10", 1.0),  # clamped to [0, 1]
        ("Total Score: -2/10", 0.0),
        ("<think>Total Score: 2/10? no.</think>\nTotal Score: 6/10", 0.6),
        ("Total Score: 4/10 ... on reflection, Total Score: 5/10", 0.5),  # the last one counts
    ],
)
def test_parse_rubric(reply, fraction):
    assert tv.parse_rubric(reply) == pytest.approx(fraction)


@pytest.mark.parametrize(
    "reply", [None, "", "A fine answer.", "Total Score: great", "Total Score: nan/10", "<think>Total Score: 8/10"]
)
def test_parse_rubric_garbage(reply):
    assert tv.parse_rubric(reply) is None


# =========================================================================== each setup's arithmetic


@pytest.mark.parametrize(
    ("setup", "rule", "verdict", "weight", "score"),
    [
        ("tinyv_only", 1.0, 0.0, 1.0, 0.0),  # the verdict alone, whatever the rule says
        ("tinyv_only", 0.0, 1.0, 0.3, 1.0),  # ... and the weight does not apply
        ("tinyv_only", 0.0, 0.7, 1.0, 0.7),  # rubric: Total Score 7/10
        ("addon", 1.0, 0.0, 0.5, 1.0),  # the rule says correct: 1
        ("addon", 0.0, 1.0, 0.5, 0.5),  # else verdict x weight
        ("addon", 0.0, 1.0, 1.0, 1.0),
        ("addon", 0.0, 0.0, 1.0, 0.0),
        ("addon", 0.0, 0.7, 0.5, 0.35),
        ("mixed", 0.0, 1.0, 0.3, 0.3),  # weight x verdict + (1 - weight) x rule
        ("mixed", 1.0, 0.0, 0.3, 0.7),
        ("mixed", 1.0, 1.0, 0.3, 1.0),
        ("mixed", 1.0, 0.7, 0.5, 0.85),
    ],
)
def test_combine_by_hand(setup, rule, verdict, weight, score):
    assert combine(setup, rule, verdict, weight) == pytest.approx(score)


# =========================================================================== prompts and the rule check


def sample(question="What is 7 + 5?", ground_truth="12", extra_info=None, chat=True):
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}] if chat else question
    return Sample(
        prompt=prompt, data_source="math_tinyv", ground_truth=ground_truth, extra_info=extra_info or {}, origin="t"
    )


def test_question_comes_from_extra_info_then_the_prompt():
    assert question_text({"question": "Q from extra"}, sample("Q in prompt")) == "Q from extra"
    assert question_text({}, sample("Q in prompt")) == "Q in prompt"  # the last user message, no system prompt
    assert question_text(None, sample("Plain Q", chat=False)) == "Plain Q"
    assert question_text(None, None, "<rendered>") == "<rendered>"


def test_tinyv_prompt_has_question_truth_and_the_answer_after_the_reasoning():
    completion = "<think>long reasoning that says 99</think>So the answer is \\boxed{12}."
    (msg,) = build_messages("tinyv", completion, "12", sample=sample())
    text = msg["content"]
    assert msg["role"] == "user"
    assert "What is 7 + 5?" in text and "12" in text and "\\boxed{12}" in text
    assert "long reasoning" not in text and "True" in text and "False" in text


def test_rubric_prompt_has_the_criteria_and_the_whole_answer():
    completion = "<think>reasoning kept</think>The answer is 12."
    criteria = "- States 12: 10 points."
    (msg,) = build_messages("rubric", completion, "12", extra_info={"criteria": criteria}, sample=sample())
    assert criteria in msg["content"] and "reasoning kept" in msg["content"] and "Total Score: x/10" in msg["content"]
    (msg,) = build_messages("rubric", "x", "12", extra_info={"rubric": ["a", "b"]})
    assert "- a\n- b" in msg["content"]


def test_prompts_are_bounded_for_huge_inputs():
    huge = "9" * 100_000
    for template in ("tinyv", "rubric"):
        (msg,) = build_messages(template, huge, huge, extra_info={"question": huge, "rubric": huge})
        assert len(msg["content"]) < 4 * 4000 + 2000
        (msg,) = build_messages(template, huge, "1", sample=sample(), max_answer_chars=100)
        assert len(msg["content"]) < 2500


# The verifier's context is counted in tokens: 4,000 characters of digits are 4,000 tokens, of CJK ~9,000
ANSWER_END = " so the answer is \\boxed{42}."
LONG_ANSWERS = {
    "digits": "".join(str(i % 10) for i in range(10_000)) + ANSWER_END,
    "cjk": "".join(chr(0x4E00 + i % 2000) for i in range(10_000)) + ANSWER_END,  # 2.2 tokens a character
}
TOKEN_BOUND = 1536  # the prompt bound when the server reports no context


def chat_tokens(tokenizer, content: str) -> int:
    """The tokens a server counts for one user message: the message in the model's chat template."""
    chat = [{"role": "user", "content": content}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("exact", [False, True], ids=["estimated", "tokenizer"])
@pytest.mark.parametrize("template", ["tinyv", "rubric"])
@pytest.mark.parametrize("answer", list(LONG_ANSWERS))
def test_prompts_fit_the_token_bound_and_keep_the_final_answer(smollm2_path, smol_tokenizer, answer, template, exact):
    from plugrl_tinyv.prompts import TEMPLATES

    extra = {"question": "Compute " + "7" * 3000 + " modulo 9.", "rubric": "- Says 42: 10 points."}
    count = tv.token_counter(str(smollm2_path)) if exact else None
    (unbounded,) = build_messages(template, LONG_ANSWERS[answer], "42", extra_info=extra)
    assert chat_tokens(smol_tokenizer, unbounded["content"]) > 2048  # characters alone overflow a 2,048 context
    (msg,) = build_messages(
        template, LONG_ANSWERS[answer], "42", extra_info=extra, max_prompt_tokens=TOKEN_BOUND, count_tokens=count
    )
    content = msg["content"]
    used = chat_tokens(smol_tokenizer, content)
    assert used <= TOKEN_BOUND
    if exact:  # with the verifier's tokenizer the room is used, not just a worst-case share of it
        assert used > 0.9 * TOKEN_BOUND
    assert ANSWER_END.strip() in content  # the end of the answer (its final answer) is kept
    assert "Compute 777" in content and "modulo 9." in content  # the question keeps its start and end
    for line in TEMPLATES[template].splitlines():  # the template is whole
        if "{" not in line:
            assert line in content


def test_long_answers_reach_the_verifier_within_the_token_bound(fake_server, smol_tokenizer):
    opts = {"model": "true-long", "base_url": fake_server.base_url, "setup": "tinyv_only"}
    for answer in LONG_ANSWERS.values():
        _, details = score(opts, items_for([answer]))
        assert details[0]["verdict"] == 1.0
        content = fake_stats(fake_server)["true-long"]["last"]["messages"][0]["content"]
        assert chat_tokens(smol_tokenizer, content) <= TOKEN_BOUND and ANSWER_END.strip() in content


def test_a_tokenizer_path_that_does_not_load_stops_the_run(tmp_path):
    opts = {"model": "m", "tokenizer_path": str(tmp_path / "nowhere")}
    with pytest.raises(tv.OptionError, match="tokenizer_path=.*no tokenizer could be loaded.*Point it at a local"):
        tv.plugrl_run_start(config=SimpleNamespace(reward=RewardConfig(options={"tinyv": opts})), run_dir=None)


def test_rule_reads_boxed_then_answer_tag_after_the_reasoning():
    assert last_boxed("a \\boxed{\\frac{1}{2}} then \\boxed{3}") == "3"
    assert last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} and \\boxed{2") is None  # unbalanced: none
    assert rule_answer("<answer>7</answer> and \\boxed{12}") == "\\boxed{12}"  # \boxed{} first
    assert rule_answer("<think>\\boxed{3}</think><answer>12</answer>") == "12"  # the reasoning is not read
    assert rule_answer("so it is 12") == "so it is 12"


def run(coro):
    import asyncio

    return asyncio.run(coro)


@pytest.mark.parametrize(
    ("completion", "truth", "rule"),
    [
        ("So \\boxed{12}.", "12", 1.0),
        ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
        ("\\boxed{13}", "12", 0.0),
        ("twelve", "12", 0.0),  # a false negative of the rule: what the verifier is for
        ("\\boxed{12}", None, 0.0),  # a ground truth math-verify cannot use: not correct, no exception
    ],
)
def test_rule_score(completion, truth, rule):
    assert run(tv.rule_score(completion, truth)) == rule


@pytest.mark.parametrize(
    "completion",
    [
        "9" * 100_000,
        "(" * 100_000,
        "\\boxed{" * 15_000,
        "\\boxed{" + "{" * 50_000 + "}" * 50_000 + "}",
        "\\boxed{9^{9^{9^{9^{9}}}}}",
        "<answer>" + "x^" * 50_000 + "</answer>",
        "数学" * 50_000,
    ],
)
def test_rule_score_is_fast_on_adversarial_completions(completion):
    t0 = time.perf_counter()
    assert run(tv.rule_score(completion, "12")) == 0.0
    assert time.perf_counter() - t0 < 5.0


# =========================================================================== options


def test_options_defaults_and_validation():
    o = tv.parse_options({"model": "m"})
    # tinyv_only, as TinyV's verl fork defaults; it never scores by the rule, so a failure scores 0
    assert (o.setup, o.weight, o.template, o.fallback, o.launch) == ("tinyv_only", 1.0, "tinyv", "zero", False)
    fallbacks = {setup: tv.parse_options({"model": "m", "setup": setup}).fallback for setup in ("addon", "mixed")}
    assert fallbacks == {"addon": "rule", "mixed": "rule"}
    assert tv.parse_options({"model": "m", "fallback": "rule"}).fallback == "rule"  # still there, when asked
    assert tv.parse_options({"model": "m", "setup": "addon", "fallback": "zero"}).fallback == "zero"
    assert (o.base_url, o.api_key_env, o.temperature, o.max_tokens) == (
        "http://127.0.0.1:8000/v1",
        "OPENAI_API_KEY",
        0.0,
        16,
    )
    assert (o.request_timeout_s, o.retries, o.launch_timeout_s) == (30.0, 3, 300.0)
    assert (o.max_prompt_tokens, o.tokenizer_path, o.prompt_template) == ("auto", None, None)  # auto: the server's
    assert (o.max_question_chars, o.max_answer_chars) == (None, None)  # from the token bound
    assert o.char_bounds(2032) == (8 * 2032, 8 * 2032) and o.char_bounds(None) == (4000, 4000)
    assert tv.parse_options({"model": "m", "max_answer_chars": 300}).char_bounds(2032) == (8 * 2032, 300)
    assert tv.parse_options({"model": "m", "max_prompt_tokens": 2000}).max_prompt_tokens == 2000
    assert tv.parse_options({"model": "m", "max_prompt_tokens": None}).max_prompt_tokens is None  # no token bound
    assert tv.parse_options({"model": "m", "template": "rubric"}).max_tokens == 512
    assert tv.parse_options({"model": "m", "launch_args": "--a 1 --b"}).launch_args == ("--a", "1", "--b")
    assert tv.parse_options({"model": "m", "retries": 3, "backoff_s": 0.5}).worst_case_s == 4 * 30 + 3.5
    bad = [
        ({}, "model is required"),
        ({"model": "m", "setup": "both"}, "setup must be one of"),
        ({"model": "m", "template": "x"}, "template must be one of"),
        ({"model": "m", "fallback": "none"}, "fallback must be one of"),
        ({"model": "m", "setup": "mixed", "weight": 1.5}, r"\[0, 1\]"),
        ({"model": "m", "retries": -1}, "retries must be >= 0"),
        ({"model": "m", "request_timeout_s": 0}, "request_timeout_s must be > 0"),
        ({"model": "m", "api_key": "sk-x"}, "takes no api_key"),
        ({"model": "m", "api_key_env": "sk-123 secret"}, "NAME of an environment variable"),
        ({"model": "m", "colour": 1}, "unknown reward.options.tinyv: colour"),
        ({"model": "m", "launch": True, "base_url": "http://10.0.0.5:8000/v1"}, "127.0.0.1"),
        ({"model": "m", "launch": True, "base_url": "http://127.0.0.1/v1"}, "explicit port"),
        ({"model": "m", "launch": True, "launch_args": ["--host", "0.0.0.0"]}, "must not set --host"),
        ({"model": "m", "max_prompt_tokens": 100}, "max_prompt_tokens=100 leaves no room .* at least 440"),
        ({"model": "m", "max_prompt_tokens": "many"}, "max_prompt_tokens must be a number of tokens, auto .* or null"),
        ({"model": "m", "max_answer_chars": 0}, "max_answer_chars must be >= 1"),
        ({"model": "m", "tokenizer_path": 5}, "tokenizer_path must be a local directory"),
    ]
    for raw, match in bad:
        with pytest.raises(tv.OptionError, match=match):
            tv.parse_options(raw)


CONFIG_BASE = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}, "plugins": ["tinyv"]}


def kernel_problems(options) -> list[str]:
    """The problems the kernel's start-up check finds in ``reward.options.tinyv: options``."""
    cfg = build_config({**CONFIG_BASE, "reward": {"options": {"tinyv": options}}})
    try:
        check_config(cfg, load_plugins(["tinyv"]))
    except ConfigError as e:
        return [line.strip() for line in str(e).splitlines()[1:]]
    return []


def test_the_reward_declares_its_options_once():
    """tv.Options is the one declaration: the registration carries it, and the reward's signature lists
    its fields (the kernel's reward runner passes a reward only the keywords it declares)."""
    (spec,) = [r for r in load_plugins(["tinyv"]).rewards if r.name == "tinyv"]
    assert spec.options is tv.Options
    params = inspect.signature(tv.tinyv).parameters
    assert [name for name in params if name in tv.Options.model_fields] == list(tv.OPTION_NAMES)
    assert "api_key" not in params and "api_key" not in tv.OPTION_NAMES  # refused, never passed
    assert params["model"].default is inspect.Parameter.empty
    for name in set(tv.OPTION_NAMES) - {"model"}:
        assert params[name].default == tv.Options.model_fields[name].default, name
    assert kernel_problems({"model": "m"}) == []


def test_the_kernel_reports_every_bad_option_under_its_key():
    problems = kernel_problems(
        {
            "model": "m",
            "setup": "mixed",
            "weight": 1.5,
            "launch": True,
            "base_url": "http://10.0.0.5:8000/v1",
            "launch_args": ["--port", "9"],
            "max_prompt_tokens": 100,
            "retries": -1,
            "colour": 1,
        }
    )
    assert problems[0].startswith("unknown key 'reward.options.tinyv.colour'; known: ")
    assert problems[1:] == [
        "reward.options.tinyv.weight: must be in [0, 1] for setup mixed (got 1.5)",
        "reward.options.tinyv.base_url: must be http://127.0.0.1:PORT/v1 (with an explicit port) with launch: true, "
        "which starts the verifier server on this machine, bound to 127.0.0.1 only, on that port (got 'http://10.0.0.5:8000/v1')",
        "reward.options.tinyv.launch_args: must not set --port with launch: true: the plugin starts the server bound "
        "to 127.0.0.1 on the port of base_url, serving the model named by model under that name (got ['--port', '9'])",
        "reward.options.tinyv.retries: must be >= 0 (got -1)",
        "reward.options.tinyv.max_prompt_tokens: leaves no room for the question and the answer: the tinyv template "
        "and the chat markup take up to 312 tokens. Set it to the verifier server's context (--max-model-len) minus "
        "max_tokens, at least 440; or leave it out (auto: the context the server reports, minus max_tokens); or null "
        "for no token bound (got 100)",
    ]
    (missing,) = kernel_problems({})
    assert missing.startswith("'reward.options.tinyv.model' is required"), missing
    # a key pasted into the config, or where the NAME of its variable belongs, is never echoed
    problems = kernel_problems({"model": "m", "api_key": "sk-PLANTED-1", "api_key_env": "sk-PLANTED-2"})
    assert problems == [
        "reward.options.tinyv.api_key: keep keys out of configs; put it in an environment variable and name that "
        "variable in reward.options.tinyv.api_key_env",
        "reward.options.tinyv.api_key_env: must be the NAME of an environment variable holding the key "
        "(e.g. OPENAI_API_KEY), not the key itself",
    ]
    with pytest.raises(tv.OptionError) as info:
        tv.parse_options({"model": "m", "api_key_env": "sk-PLANTED-2"})
    assert "sk-PLANTED" not in str(info.value)


def test_example_config_routes_to_tinyv_and_its_options_are_valid():
    cfg = load_config(ROOT / "examples" / "tinyv_rrm.yaml")
    assert {"math", "tinyv", "advantages"} <= set(cfg.plugins)
    opts = tv.parse_options(cfg.reward.options["tinyv"])
    assert (opts.setup, opts.weight, opts.launch, opts.model) == ("addon", 1.0, True, "local:SmolLM2-135M-Instruct")
    assert opts.worst_case_s < cfg.reward.timeout_s  # the fallback, not the kernel's timeout, handles a slow server
    registry = load_plugins(cfg.plugins)
    assert [s.name for s in check_routes(registry, {"math_tinyv"})["math_tinyv"]] == ["tinyv"]
    RewardRunner(registry, cfg.reward).close()  # the kernel accepts every option the config sets
    rows = [json.loads(line) for line in (ROOT / "examples" / "data" / "tinyv_tiny.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and {r["data_source"] for r in rows} == {"math_tinyv"}
    assert all(r["problem"].strip() and str(r["answer"]).strip() for r in rows)


def test_run_hooks_without_launch_launch_nothing_and_bad_options_stop_the_run(fake_server):
    registry = load_plugins(["tinyv"])
    ok = SimpleNamespace(reward=RewardConfig(options={"tinyv": {"model": "true", "base_url": fake_server.base_url}}))
    registry.hooks.plugrl_run_start(config=ok, run_dir=None)
    registry.hooks.plugrl_run_end(config=ok, run_dir=None, error=None)
    assert servers.running() == {}
    bad = SimpleNamespace(reward=RewardConfig(options={"tinyv": {"model": "m", "setup": "oops"}}))
    with pytest.raises(tv.OptionError, match="setup must be one of"):
        registry.hooks.plugrl_run_start(config=bad, run_dir=None)
    registry.hooks.plugrl_run_end(config=bad, run_dir=None, error=RuntimeError("x"))  # never raises
    registry.hooks.plugrl_run_end(config=None, run_dir=None, error=None)


def test_openai_api_without_a_key_stops_the_run(monkeypatch):
    monkeypatch.delenv("TINYV_TEST_KEY", raising=False)
    opts = {"model": "gpt-4o-mini", "base_url": "https://api.openai.com/v1", "api_key_env": "TINYV_TEST_KEY"}
    config = SimpleNamespace(reward=RewardConfig(options={"tinyv": opts}))
    with pytest.raises(tv.OptionError, match="TINYV_TEST_KEY .* is not set"):
        tv.plugrl_run_start(config=config, run_dir=None)
    monkeypatch.setenv("TINYV_TEST_KEY", "sk-test")
    config.reward.options["tinyv"]["wait_s"] = 0  # no internet here: the key check passes, the server never answers
    with pytest.raises(tv.OptionError, match="did not answer GET /models"):
        tv.plugrl_run_start(config=config, run_dir=None)


def test_start_warns_when_a_verification_can_outlast_the_kernels_timeout(caplog, fake_server):
    opts = {"model": "true", "request_timeout_s": 30, "retries": 3, "base_url": fake_server.base_url}
    with caplog.at_level("WARNING", logger="plugrl.tinyv"):
        tv.plugrl_run_start(config=SimpleNamespace(reward=RewardConfig(options={"tinyv": opts})), run_dir=None)
    assert "more than reward.timeout_s=10" in caplog.text


# =========================================================================== a fake OpenAI-compatible server

# It stands in for vLLM's OpenAI-compatible server where a real one cannot show the behaviour (garbage, HTTP
# errors, slowness, chosen context lengths); the real one runs in the slow tests below. The model name picks
# the behaviour (the part before a "-": "true-4096" replies as "true"). GET /models lists the models of
# CONTEXTS with their max_model_len, as vLLM reports --max-model-len, and "fake" without one; every other
# model is not listed (a server that reports no context). Counts and the last request per model (and the
# count of GET /models, under "/models") at GET /stats.
FAKE_SERVER = textwrap.dedent(
    """
    import json, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    REPLIES = {
        "true": "True", "false": "**False**", "garbage": "I am not sure.", "rubric": "Good.\\nTotal Score: 7/10",
        "think": "<think>0.5 and 1/2 are equal, so not False.</think>\\nTrue",
    }
    CONTEXTS = {"true-4096": 4096, "true-700": 700, "true-2048": 2048}
    STATS, LOCK = {}, threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.endswith("/models"):
                with LOCK:
                    STATS.setdefault("/models", {"count": 0})["count"] += 1
                data = [{"id": "fake", "object": "model"}]
                data += [{"id": m, "object": "model", "max_model_len": n} for m, n in CONTEXTS.items()]
                self.send(200, {"object": "list", "data": data})
            elif self.path == "/stats":
                with LOCK:
                    self.send(200, STATS)
            else:
                self.send(404, {"error": {"message": "not found"}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model = body["model"]
            with LOCK:
                entry = STATS.setdefault(model, {"count": 0})
                entry["count"] += 1
                entry["last"] = body
                entry["auth"] = self.headers.get("Authorization")
            if model == "context":  # vLLM's answer to a prompt over its context
                message = ("This model's maximum context length is 2048 tokens. However, your prompt contains "
                           "2100 input tokens, which exceeds this limit even without any output tokens.")
                return self.send(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
            if model.startswith("http"):
                code = int(model[4:])
                return self.send(code, {"error": {"message": f"fake {code}", "type": "fake", "code": code}})
            if model == "slow":
                time.sleep(5)
            content = REPLIES.get(model.split("-")[0], "True")
            self.send(200, {
                "id": "c", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })

    port = int(sys.argv[sys.argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


@pytest.fixture(scope="module")
def fake_script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fake") / "fake_openai_server.py"
    path.write_text(FAKE_SERVER)
    return path


def fake_command(script: Path):
    """A stand-in for servers.vllm_command that starts the fake server (same arguments)."""

    def command(model_path, served_name, port, extra_args=()):
        return [sys.executable, str(script), "--model", str(model_path), "--host", HOST, "--port", str(port)]

    return command


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def fake_server(fake_script):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(fake_script), "--port", str(port)], start_new_session=True)
    base_url = f"http://{HOST}:{port}/v1"
    wait_until(lambda: servers.reachable(base_url), 60, "the fake server")
    yield SimpleNamespace(base_url=base_url, port=port, process=proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def fake_stats(server) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"http://{HOST}:{server.port}/stats", timeout=5) as r:
        return json.loads(r.read())


def items_for(completions, ground_truth="12", extra_info=None):
    s = sample(ground_truth=ground_truth, extra_info=extra_info)
    return [RewardItem(s, "<rendered>What is 7 + 5?", c) for c in completions]


def score(options, items, timeout_s=30.0):
    registry = load_plugins(["tinyv"])
    with RewardRunner(registry, RewardConfig(options={"tinyv": options}, timeout_s=timeout_s)) as runner:
        out = runner.score(items)
    return out, [{k.removeprefix("tinyv/"): v for k, v in d.items()} for d in out.details]


RIGHT, WRONG, UNPARSED = "So \\boxed{12}.", "So \\boxed{13}.", "The answer is twelve."


@pytest.mark.parametrize(
    ("setup", "model", "weight", "expected"),  # expected scores of RIGHT, WRONG, UNPARSED (rules 1, 0, 0)
    [
        ("tinyv_only", "false", 1.0, [0.0, 0.0, 0.0]),
        ("tinyv_only", "true", 0.4, [1.0, 1.0, 1.0]),
        ("tinyv_only", "think", 1.0, [1.0, 1.0, 1.0]),
        ("tinyv_only", "rubric", 1.0, [0.7, 0.7, 0.7]),
        ("addon", "true", 0.4, [1.0, 0.4, 0.4]),
        ("addon", "false", 0.4, [1.0, 0.0, 0.0]),
        ("addon", "rubric", 0.5, [1.0, 0.35, 0.35]),
        ("mixed", "true", 0.4, [1.0, 0.4, 0.4]),
        ("mixed", "false", 0.4, [0.6, 0.0, 0.0]),
        ("mixed", "rubric", 0.5, [0.85, 0.35, 0.35]),
    ],
)
def test_setups_through_the_kernel(fake_server, setup, model, weight, expected):
    template = "rubric" if model == "rubric" else "tinyv"
    opts = {"model": model, "base_url": fake_server.base_url, "setup": setup, "weight": weight, "template": template}
    out, details = score(opts, items_for([RIGHT, WRONG, UNPARSED]))
    assert out.scores == pytest.approx(expected)
    assert [d["rule"] for d in details] == [1.0, 0.0, 0.0]
    for d in details:
        assert d["setup"] == setup and d["verifier_failed"] is False and d["failure"] is None
        assert d["error"] is False and d["timeout"] is False
    asked = [d["requests"] for d in details]
    assert asked == ([0, 1, 1] if setup == "addon" else [1, 1, 1])  # addon asks only when the rule says wrong
    verdict = {"true": 1.0, "think": 1.0, "false": 0.0, "rubric": 0.7}[model]
    assert [d["verdict"] for d in details] == ([None] if setup == "addon" else [verdict]) + [verdict, verdict]


def test_options_the_kernel_validated_reach_the_reward(fake_server):
    """check_config validates reward.options.tinyv against tv.Options and writes the values back as JSON types
    (a list for launch_args, defaults filled in); the reward takes them as keywords and parses them again."""
    opts = {
        "model": "rubric",
        "base_url": fake_server.base_url + "/",
        "setup": "mixed",
        "weight": "0.5",
        "template": "rubric",
        "launch_args": "--max-model-len 2048",
        "retries": "1",
    }
    cfg = build_config({**CONFIG_BASE, "reward": {"options": {"tinyv": opts}}})
    registry = load_plugins(["tinyv"])
    check_config(cfg, registry)
    checked = cfg.reward.options["tinyv"]
    assert checked["launch_args"] == ["--max-model-len", "2048"] and checked["base_url"] == fake_server.base_url
    assert (checked["weight"], checked["retries"], checked["max_tokens"]) == (0.5, 1, 512)  # 512: the rubric's
    assert set(checked) == set(tv.OPTION_NAMES)
    assert tv.parse_options(checked) == tv.parse_options(opts)
    with RewardRunner(registry, cfg.reward) as runner:
        out = runner.score(items_for([RIGHT, WRONG]))
    assert out.scores == pytest.approx([0.85, 0.35])
    assert [d["tinyv/verdict"] for d in out.details] == [0.7, 0.7]


def test_request_carries_the_options(fake_server, monkeypatch):
    monkeypatch.setenv("TINYV_TEST_KEY", "secret-123")
    opts = {"model": "true", "base_url": fake_server.base_url, "setup": "tinyv_only", "api_key_env": "TINYV_TEST_KEY"}
    score(opts, items_for(["<think>hidden</think>\\boxed{12}"]))
    stats = fake_stats(fake_server)["true"]
    assert stats["auth"] == "Bearer secret-123"
    body = stats["last"]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 16
    content = body["messages"][0]["content"]
    assert "What is 7 + 5?" in content and "\\boxed{12}" in content and "hidden" not in content
    monkeypatch.delenv("TINYV_TEST_KEY")
    opts.update(model="rubric", template="rubric")
    score(opts, items_for(["x"], extra_info={"rubric": "- says 12"}))
    stats = fake_stats(fake_server)["rubric"]
    assert stats["auth"] == "Bearer EMPTY"  # no key set: a local server's dummy key
    assert stats["last"]["max_tokens"] == 512 and "- says 12" in stats["last"]["messages"][0]["content"]


@pytest.mark.parametrize(
    ("model", "retries", "requests", "failure"),
    [
        ("garbage", 2, 3, "NoVerdict"),  # retried, then the fallback
        ("http500", 2, 3, "InternalServerError"),
        ("http429", 1, 2, "RateLimitError"),
        ("http404", 3, 1, "NotFoundError"),  # the same on every attempt: not retried
        ("http400", 3, 1, "BadRequestError"),
        ("context", 3, 1, "set reward.options.tinyv.max_prompt_tokens"),  # over the context: says what to set
        ("slow", 1, 2, "Timeout"),
    ],
)
@pytest.mark.parametrize("fallback", ["rule", "zero"])
def test_failures_retry_then_fall_back(fake_server, model, retries, requests, failure, fallback):
    tv.reset_verifier_stats()
    before = fake_stats(fake_server).get(model, {}).get("count", 0)
    opts = {"model": model, "base_url": fake_server.base_url, "setup": "tinyv_only", "retries": retries}
    opts.update(backoff_s=0.05, request_timeout_s=0.5, fallback=fallback)
    t0 = time.perf_counter()
    out, details = score(opts, items_for([RIGHT, WRONG]))
    assert time.perf_counter() - t0 < 10
    assert out.scores == ([1.0, 0.0] if fallback == "rule" else [0.0, 0.0])
    for d in details:
        assert d["verifier_failed"] is True and d["verdict"] is None and d["requests"] == requests
        assert failure in d["failure"]
        assert d["error"] is False and d["timeout"] is False  # handled by the reward, not the kernel
    assert tv.verifier_stats() == {"calls": 2, "failures": 2, "requests": 2 * requests}
    if model != "slow":  # a timed-out request may still be counted by the server after the client gave up
        assert fake_stats(fake_server)[model]["count"] - before == 2 * requests


def test_backoff_is_exponential(fake_server):
    opts = {"model": "garbage", "base_url": fake_server.base_url, "setup": "tinyv_only", "retries": 3}
    t0 = time.perf_counter()
    score({**opts, "backoff_s": 0.2}, items_for([WRONG]))
    assert time.perf_counter() - t0 >= 0.2 + 0.4 + 0.8


def test_unreachable_server_is_a_fast_counted_failure():
    tv.reset_verifier_stats()
    opts = {"model": "m", "base_url": f"http://{HOST}:{free_port()}/v1", "setup": "addon", "retries": 2}
    t0 = time.perf_counter()
    out, details = score({**opts, "backoff_s": 0.05}, items_for([RIGHT, WRONG, UNPARSED]))
    assert time.perf_counter() - t0 < 5
    assert out.scores == [1.0, 0.0, 0.0]
    assert [d["verifier_failed"] for d in details] == [False, True, True]  # RIGHT needed no verifier
    assert all("APIConnectionError" in d["failure"] for d in details[1:])
    assert tv.verifier_stats()["failures"] == 2
    # the step's metrics (README, "Metrics"): means over the samples; the failure count is the mean x 3
    m = out.metrics
    assert m["reward/tinyv/verifier_failed"] == pytest.approx(2 / 3) and m["reward/tinyv/requests"] == 2.0
    assert m["reward/tinyv/rule"] == m["reward/tinyv/mean"] == pytest.approx(1 / 3)
    assert "reward/tinyv/verdict" not in m  # no verdict came back: None is not averaged
    assert not any(k in m for k in ("reward/tinyv/setup", "reward/tinyv/failure", "verifier/failures"))
    # the count itself comes from the plugin's plugrl_step_metrics, which the trainer calls after each step
    from plugrl.plugins import PluginError, load_plugins, plugin_step_metrics

    registry = load_plugins(["tinyv"])
    # 2 verifications x 3 attempts each (retries 2): 6 requests
    assert plugin_step_metrics(registry, 1, {}) == {"verifier/failures": 2.0, "verifier/requests": 6.0}
    assert plugin_step_metrics(registry, 2, {}) == {"verifier/failures": 0.0, "verifier/requests": 0.0}
    with pytest.raises(PluginError, match="'verifier/failures', a metric the kernel or another plugin"):
        plugin_step_metrics(registry, 3, {"verifier/failures": 1.0})


def test_a_failed_verification_scores_zero_in_tinyv_only_unless_fallback_says_rule(fake_server):
    """tinyv_only scores by the verifier alone (the document: no rule-based verifier at all), so by default a
    verification that fails scores 0, not the rule's score; fallback: rule still gives the rule's score."""
    base = {"model": "garbage", "base_url": fake_server.base_url, "retries": 0}  # setup: the default, tinyv_only
    out, details = score(base, items_for([RIGHT, WRONG]))
    assert out.scores == [0.0, 0.0]
    assert [d["rule"] for d in details] == [1.0, 0.0] and all(d["verifier_failed"] for d in details)
    assert all(d["setup"] == "tinyv_only" for d in details)
    out, _ = score({**base, "fallback": "rule"}, items_for([RIGHT, WRONG]))
    assert out.scores == [1.0, 0.0]
    out, details = score({**base, "setup": "mixed", "weight": 0.5}, items_for([RIGHT, WRONG]))
    assert out.scores == [1.0, 0.0]  # addon and mixed keep the rule's score by default
    out, details = score({**base, "setup": "addon"}, items_for([RIGHT, WRONG]))
    assert out.scores == [1.0, 0.0] and [d["requests"] for d in details] == [0, 1]


# =========================================================================== routing


def _tinyv_spec() -> RewardSpec:
    (spec,) = [r for r in load_plugins(["tinyv"]).rewards if r.name == "tinyv"]
    return spec


def _anything(completion, ground_truth):
    return 0.0


@pytest.mark.parametrize(
    ("data_source", "routed"),
    [
        ("math_tinyv", True),
        ("math_tinyv_v2", True),  # _tinyv anywhere, as the document's '_tinyv' in data_source
        ("foo_tinyv_bar", True),
        ("_tinyv", True),
        ("openai/gsm8k_tinyv", True),
        ("tinyv_math", False),  # no underscore before it
        ("mathtinyv", False),
        ("math_TINYV", False),  # case-sensitive, as `in` is
        ("math", False),
    ],
)
def test_tinyv_routes_every_data_source_holding_tinyv(data_source, routed):
    registry = load_plugins(["math", "tinyv"])
    names = [r.name for r in rewards_for(registry, data_source)]
    assert ("tinyv" in names) is routed and routed is ("_tinyv" in data_source)
    if routed:
        assert names == ["tinyv"]  # not also math's rewards: one route decides
    # beside a catch-all `*` of another plugin, *_tinyv* is the more specific glob (6 literal characters to 0)
    catch_all = RewardSpec("anything", _anything, ("*",), plugin="c")
    with_all = Registry(rewards=[_tinyv_spec(), catch_all])
    assert [r.name for r in rewards_for(with_all, data_source)] == (["tinyv"] if routed else ["anything"])


def test_tinyv_route_precedence():
    """exact > casefold > most specific glob > reward.default, with the real tinyv registration."""
    tinyv = _tinyv_spec()
    assert tinyv.data_sources == ("*_tinyv*",)
    exact = RewardSpec("exact", _anything, ("math_tinyv_v2",), plugin="e")
    grade = RewardSpec("grade", _anything, ("grade_tinyv",), plugin="g", casefold=True)
    registry = Registry(rewards=[tinyv, exact, grade], default_reward="exact")
    assert [r.name for r in rewards_for(registry, "math_tinyv_v2")] == ["exact"]  # an exact name first
    assert [r.name for r in rewards_for(registry, "Grade_Tinyv")] == ["grade"]  # then a casefold name
    assert [r.name for r in rewards_for(registry, "math_tinyv_v3")] == ["tinyv"]  # then the glob
    assert [r.name for r in rewards_for(registry, "unknown")] == ["exact"]  # then reward.default
    # a glob with more literal characters is more specific: it wins where it matches, tinyv elsewhere
    rubric = RewardSpec("rubric", _anything, ("*_tinyv_rubric",), plugin="r")
    vague = RewardSpec("vague", _anything, ("math_*",), plugin="v")  # 5 literal characters to tinyv's 6
    registry = Registry(rewards=[tinyv, rubric, vague])
    assert [r.name for r in rewards_for(registry, "x_tinyv_rubric")] == ["rubric"]
    assert [r.name for r in rewards_for(registry, "math_tinyv_2")] == ["tinyv"]
    assert [r.name for r in rewards_for(registry, "math_other")] == ["vague"]


# =========================================================================== the prompt template


def test_prompt_template_text_replaces_the_built_in_one(fake_server):
    text = "Q: {question}\nReference: {ground_truth}\nStudent: {answer}\nAnswer True or False."
    opts = {"model": "true", "base_url": fake_server.base_url, "prompt_template": text}
    out, details = score(opts, items_for(["<think>hidden</think>So \\boxed{12}."]))
    assert details[0]["verdict"] == 1.0
    content = fake_stats(fake_server)["true"]["last"]["messages"][0]["content"]
    assert content == "Q: What is 7 + 5?\nReference: 12\nStudent: So \\boxed{12}.\nAnswer True or False."
    # a long answer is cut to the token bound around the template, which stays whole
    _, details = score(opts, items_for([LONG_ANSWERS["digits"]]))
    content = fake_stats(fake_server)["true"]["last"]["messages"][0]["content"]
    assert content.startswith("Q: What is 7 + 5?\nReference: 12\nStudent: ") and content.endswith("True or False.")
    assert ANSWER_END.strip() in content and len(content.encode()) <= TOKEN_BOUND


def test_prompt_template_from_a_file(fake_server, tmp_path):
    path = tmp_path / "rubric_prompt.txt"
    path.write_text("Grade {answer}\nagainst:\n{criteria}\nEnd with Total Score: x/10 {{not a field}}")
    opts = {"model": "rubric", "base_url": fake_server.base_url, "template": "rubric", "prompt_template": str(path)}
    out, details = score(opts, items_for(["<think>kept</think>It is 12."], extra_info={"rubric": "- says 12"}))
    assert details[0]["verdict"] == pytest.approx(0.7)
    content = fake_stats(fake_server)["rubric"]["last"]["messages"][0]["content"]
    assert (
        content == "Grade <think>kept</think>It is 12.\nagainst:\n- says 12\nEnd with Total Score: x/10 {not a field}"
    )
    assert kernel_problems({"model": "m", "template": "rubric", "prompt_template": str(path)}) == []


def test_a_bad_prompt_template_is_named_with_the_fix(tmp_path):
    (tmp_path / "bad.txt").write_text("Is {answer} right? {ground_truth} {reference}")
    (tmp_path / "latin1.txt").write_bytes(b"{answer} {ground_truth} caf\xe9")
    cases = [
        ("{question} {answer}", "tinyv", r"lacks \{ground_truth\}: a tinyv template must hold \{ground_truth\} and"),
        ("{answer} {ground_truth} {criteria}", "tinyv", r"has unknown placeholders \{criteria\}: a tinyv"),
        ("{answer} {question}", "rubric", r"lacks \{criteria\}"),
        ("{answer} {ground_truth} {", "tinyv", r"is not a valid template .* write \{\{ and \}\} for a literal brace"),
        ("{} {answer} {ground_truth}", "tinyv", r"has a positional placeholder \{\}: name the field"),
        ("{answer!r} {ground_truth}", "tinyv", r"has \{answer!r\}: write \{answer\}"),
        (str(tmp_path / "missing.txt"), "tinyv", r"is neither a template .* nor a readable file .*missing.txt' does"),
        (str(tmp_path), "tinyv", r"is neither a template .* is a directory\): give the path of a file"),
        (
            str(tmp_path / "bad.txt"),
            "tinyv",
            r"names the file '.*bad.txt', which has unknown placeholders \{reference\}",
        ),
        (str(tmp_path / "latin1.txt"), "tinyv", r"names the file '.*latin1.txt', which cannot be read as UTF-8"),
        ("  ", "tinyv", r"must be a template text with placeholders such as \{answer\}, or the path of a file"),
    ]
    for value, template, match in cases:
        with pytest.raises(tv.OptionError, match="^reward.options.tinyv.prompt_template " + match):
            tv.parse_options({"model": "m", "template": template, "prompt_template": value})
    (line,) = kernel_problems({"model": "m", "prompt_template": "Judge {answer}"})
    assert line == (
        "reward.options.tinyv.prompt_template: lacks {ground_truth}: a tinyv template must hold {ground_truth} and "
        "{answer}, and may hold {question} (got 'Judge {answer}')"
    )
    # the token bound must leave room for the texts around this template, not the built-in one
    long = "Instructions. " * 300 + "{question} {ground_truth} {answer}"
    assert tv.parse_options({"model": "m", "max_prompt_tokens": 1000}).max_prompt_tokens == 1000
    with pytest.raises(tv.OptionError, match="max_prompt_tokens=1000 leaves no room"):
        tv.parse_options({"model": "m", "max_prompt_tokens": 1000, "prompt_template": long})


# =========================================================================== the served context


def test_prompts_fill_the_context_the_server_reports(fake_server, smol_tokenizer):
    """max_prompt_tokens: auto -> the served max_model_len minus max_tokens, asked from the server once."""
    tv.reset_served_contexts()
    before = fake_stats(fake_server).get("/models", {}).get("count", 0)
    opts = {"model": "true-4096", "base_url": fake_server.base_url}
    for _ in range(2):
        out, details = score(opts, items_for([LONG_ANSWERS["digits"]] * 3))
        assert [d["verdict"] for d in details] == [1.0] * 3
    assert fake_stats(fake_server)["/models"]["count"] - before == 1  # 6 verifications, one question
    content = fake_stats(fake_server)["true-4096"]["last"]["messages"][0]["content"]
    used = chat_tokens(smol_tokenizer, content)
    assert 3000 < used <= 4096 - 16  # far past the old fixed 1536, within the context less the reply
    assert ANSWER_END.strip() in content
    assert tv.served_context(fake_server.base_url, "true-4096", "EMPTY") == 4096
    assert tv.prompt_budget(tv.parse_options(opts), 4096) == 4080
    # an explicit bound within the context is kept
    score({**opts, "max_prompt_tokens": 2000}, items_for([LONG_ANSWERS["digits"]]))
    content = fake_stats(fake_server)["true-4096"]["last"]["messages"][0]["content"]
    assert 1536 < chat_tokens(smol_tokenizer, content) <= 2000


def test_a_server_that_reports_no_context_gets_the_default_bound_logged_once(fake_server, smol_tokenizer, caplog):
    tv.reset_served_contexts()
    opts = {"model": "true", "base_url": fake_server.base_url}  # not listed with a max_model_len
    with caplog.at_level("WARNING", logger="plugrl.tinyv"):
        for _ in range(2):
            score(opts, items_for([LONG_ANSWERS["digits"]] * 2))
    content = fake_stats(fake_server)["true"]["last"]["messages"][0]["content"]
    assert chat_tokens(smol_tokenizer, content) <= TOKEN_BOUND
    logged = [r.getMessage() for r in caplog.records if "does not report max_model_len" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "model 'true'" in logged[0] and "Set reward.options.tinyv.max_prompt_tokens" in logged[0]


def test_options_over_the_served_context_are_named(fake_server):
    """At run start (a local server is asked then), and at a verification when the server was not asked."""
    tv.reset_served_contexts()

    def start(**more):
        opts = {"model": "true-4096", "base_url": fake_server.base_url, **more}
        tv.plugrl_run_start(config=SimpleNamespace(reward=RewardConfig(options={"tinyv": opts})), run_dir=None)

    start()  # auto: fits
    start(max_prompt_tokens=4080)
    over = (
        r"^tinyv: reward.options.tinyv.max_prompt_tokens=4081 with max_tokens=16 lets a request need 4097 tokens, "
        r"over the context of 4096 tokens that the server at .* serves 'true-4096' with .* Set max_prompt_tokens to "
        r"at most 4080, or leave it out"
    )
    with pytest.raises(tv.OptionError, match=over):
        start(max_prompt_tokens=4081)
    with pytest.raises(tv.OptionError, match=r"max_tokens=600 leaves 100 tokens for the prompt .* at most 2"):
        start(model="true-700", max_tokens=600)  # auto, but the reply leaves no room for the template
    start(max_prompt_tokens=None)  # null: no bound, nothing to check
    # the reward itself, when no run start asked (here: an eval-like runner straight away)
    tv.reset_served_contexts()
    opts = {"model": "true-4096", "base_url": fake_server.base_url, "max_prompt_tokens": 5000}
    out, _ = score(opts, items_for([RIGHT]))
    (d,) = out.details
    assert d["error"] is True and "reward.options.tinyv.max_prompt_tokens=5000" in d["tinyv/error"]


def test_a_server_reached_later_is_asked_then(fake_server, monkeypatch):
    """A server not up at the first verification is not taken as reporting nothing: it is asked again."""
    from plugrl_tinyv import context

    monkeypatch.setattr(context, "RETRY_AFTER_S", 0.0)  # ask again at once, not after 30 s
    tv.reset_served_contexts()
    relay = Relay(fake_server.port)  # not started: refused
    opts = {"model": "true-4096", "base_url": relay.base_url, "retries": 0}
    try:
        _, details = score(opts, items_for([WRONG]))
        assert details[0]["verifier_failed"] and "Connection" in details[0]["failure"]
        assert context.cached_context(relay.base_url, "true-4096") is context.MISSING
        relay.start()
        _, details = score(opts, items_for([LONG_ANSWERS["digits"]]))
        assert details[0]["verdict"] == 1.0
        assert context.cached_context(relay.base_url, "true-4096") == 4096
    finally:
        relay.stop()


# =========================================================================== launch: true, with fake servers


group_members = servers.group_members  # live, non-zombie members of a process group


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            addr, hexport = parts[1].rsplit(":", 1)
            if parts[3] == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.add(addr)
    return found


LOOPBACK = "0100007F"  # 127.0.0.1 in /proc/net/tcp


def test_launch_with_a_fake_server_through_the_hooks(fake_script, monkeypatch, tmp_path):
    monkeypatch.setattr(servers, "vllm_command", fake_command(fake_script))
    port = free_port()
    opts = {"model": "true", "base_url": f"http://{HOST}:{port}/v1", "setup": "tinyv_only", "launch": True}
    config = SimpleNamespace(reward=RewardConfig(options={"tinyv": opts}))
    registry = load_plugins(["tinyv"])
    registry.hooks.plugrl_run_start(config=config, run_dir=tmp_path)
    try:
        server = servers.running()[port]
        assert listening_addresses(port) == {LOOPBACK}
        registry.hooks.plugrl_run_start(config=config, run_dir=tmp_path)  # again: the same server
        assert servers.running()[port] is server
        out, details = score(opts, items_for([WRONG]))
        assert out.scores == [1.0] and details[0]["requests"] == 1
    finally:
        registry.hooks.plugrl_run_end(config=config, run_dir=tmp_path, error=KeyboardInterrupt())
    assert server.process.poll() is not None and group_members(server.process.pid) == []
    assert servers.running() == {} and not servers.port_in_use(port)
    assert (tmp_path / "verifier_server.log").is_file()


def test_other_ranks_wait_for_rank_0s_server(fake_server, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    opts = {"model": "m", "base_url": fake_server.base_url, "launch": True, "launch_timeout_s": 5}
    config = SimpleNamespace(reward=RewardConfig(options={"tinyv": opts}))
    tv.plugrl_run_start(config=config, run_dir=None)  # answers at once: returns, launches nothing
    assert servers.running() == {}
    opts = {**opts, "base_url": f"http://{HOST}:{free_port()}/v1", "launch_timeout_s": 1}
    with pytest.raises(RuntimeError, match="which rank 0 launches"):
        tv.plugrl_run_start(config=SimpleNamespace(reward=RewardConfig(options={"tinyv": opts})), run_dir=None)


def test_a_launch_failure_names_tinyvs_options(monkeypatch, tmp_path):
    """The kernel's managed server words its errors under reward.options.tinyv; the server is stopped."""

    def silent(model_path, served_name, port, extra_args=()):
        return [sys.executable, "-c", "import time; print('loading...', flush=True); time.sleep(600)"]

    monkeypatch.setattr(servers, "vllm_command", silent)
    opts = {"model": "m", "base_url": f"http://{HOST}:{free_port()}/v1", "launch": True, "launch_timeout_s": 2}
    with pytest.raises(RuntimeError, match=r"(?s)within 2s \(raise reward\.options\.tinyv\.launch_timeout_s.*loading"):
        tv.plugrl_run_start(config=SimpleNamespace(reward=RewardConfig(options={"tinyv": opts})), run_dir=tmp_path)
    assert servers.running() == {} and (tmp_path / "verifier_server.log").is_file()


# =========================================================================== the real server (SmolLM2-135M-Instruct)


def real_options(server, **more):
    opts = {"model": server.model, "base_url": server.base_url, "setup": "tinyv_only", "retries": 0}
    opts["request_timeout_s"] = 60
    return {**opts, **more}


def assert_plumbing(details):
    """A 135M verifier's verdicts are unreliable: check the result's shape, not its correctness."""
    for d in details:
        assert d["error"] is False and d["timeout"] is False, d
        assert 0.0 <= d["tinyv"] <= 1.0
        assert d["requests"] >= 1
        if d["verifier_failed"]:
            assert d["verdict"] is None and d["failure"]
        else:
            assert 0.0 <= d["verdict"] <= 1.0 and d["failure"] is None


def connection_failures(details) -> int:
    return sum(1 for d in details if d["failure"] and "Connection" in d["failure"])


@pytest.mark.slow
@pytest.mark.parametrize("template", ["tinyv", "rubric"])
def test_real_server_one_request_per_template(openai_server, template):
    before = openai_server.requests_served()
    opts = real_options(openai_server, template=template, max_tokens=16 if template == "tinyv" else 40)
    extra = {"rubric": "- The final answer is 12: 10 points. Anything else: 0 points."}
    out, details = score(opts, items_for(["7 + 5 = 12, so the answer is \\boxed{12}.", "It is 13."], extra_info=extra))
    assert all(0.0 <= s <= 1.0 for s in out.scores)
    assert_plumbing(details)
    assert connection_failures(details) == 0
    wait_until(lambda: openai_server.requests_served() - before >= 2, 10, "the server's access log")


@pytest.mark.slow
def test_real_server_reports_its_context_and_prompts_fill_it(openai_server, smollm2_path, smol_tokenizer):
    """vLLM's GET /v1/models reports --max-model-len (2048 here): prompts may take 2048 - max_tokens, past the
    1536 a server that reports nothing gets, and vLLM accepts them; a bound over it stops the run at start."""
    tv.reset_served_contexts()
    assert tv.served_context(openai_server.base_url, openai_server.model, "EMPTY") == 2048
    opts = real_options(openai_server, tokenizer_path=str(smollm2_path))  # exact counts: the room is used
    budget = tv.prompt_budget(tv.parse_options(opts), 2048)
    assert budget == 2048 - 16
    count = tv.token_counter(str(smollm2_path))
    extra = {"question": "Compute " + "7" * 3000 + " modulo 9."}
    (msg,) = build_messages(
        "tinyv",
        LONG_ANSWERS["digits"],
        "42",
        extra_info=extra,
        max_prompt_tokens=budget,
        max_question_chars=8 * budget,
        max_answer_chars=8 * budget,
        count_tokens=count,
    )
    assert 1536 < chat_tokens(smol_tokenizer, msg["content"]) <= budget
    # the same prompt, sent by the reward: the server takes it (a prompt over its context would be a 400)
    _, details = score(opts, items_for([LONG_ANSWERS["digits"]], ground_truth="42", extra_info=extra), timeout_s=90)
    assert_plumbing(details)
    assert connection_failures(details) == 0 and "BadRequest" not in (details[0]["failure"] or "")
    config = SimpleNamespace(reward=RewardConfig(options={"tinyv": {**opts, "max_prompt_tokens": 2040}}))
    with pytest.raises(tv.OptionError, match=r"max_prompt_tokens=2040 with max_tokens=16 .* at most 2032"):
        tv.plugrl_run_start(config=config, run_dir=None)


@pytest.mark.slow
def test_real_server_stopped_mid_run_then_back(openai_server):
    """One runner throughout: up -> scored by the verifier; down -> counted failures, the rule's score,
    fast; up again -> the same clients reach the server again."""
    relay = Relay(openai_server.port)
    relay.start()
    opts = {**real_options(openai_server), "base_url": relay.base_url, "retries": 1, "backoff_s": 0.05}
    opts["fallback"] = "rule"  # not tinyv_only's default (0): the rule's score, when asked for
    completions = [RIGHT, WRONG, UNPARSED]
    registry = load_plugins(["tinyv"])
    try:
        with RewardRunner(registry, RewardConfig(options={"tinyv": opts}, timeout_s=60)) as runner:

            def scored():
                out = runner.score(items_for(completions))
                return out, [{k.removeprefix("tinyv/"): v for k, v in d.items()} for d in out.details]

            served = openai_server.requests_served()
            _, details = scored()
            assert_plumbing(details)
            assert connection_failures(details) == 0

            relay.stop()
            tv.reset_verifier_stats()
            t0 = time.perf_counter()
            out, details = scored()
            assert time.perf_counter() - t0 < 5
            assert all(d["verifier_failed"] and d["requests"] == 2 for d in details)
            assert connection_failures(details) == 3
            assert out.scores == [1.0, 0.0, 0.0]  # the fallback: the rule's score
            assert tv.verifier_stats()["failures"] == 3

            relay.start()
            _, details = scored()
            assert_plumbing(details)
            assert connection_failures(details) == 0
            wait_until(lambda: openai_server.requests_served() - served >= 6, 10, "the server's access log")
    finally:
        relay.stop()


@pytest.mark.slow
def test_real_server_adversarial_completions_finish_in_time(openai_server):
    huge = [
        "9" * 100_000,
        "(" * 100_000,
        "\\boxed{" * 15_000,
        "<think>" + "wait, " * 20_000,  # reasoning that never ends
        "".join(chr(0x4E00 + i % 2000) for i in range(100_000)),
        "True. " * 17_000,  # a completion that tries to answer for the verifier
    ]
    opts = real_options(openai_server, setup="mixed", weight=0.5, request_timeout_s=45)
    t0 = time.perf_counter()
    out, details = score(opts, items_for(huge), timeout_s=60)
    assert time.perf_counter() - t0 < 60
    assert all(0.0 <= s <= 1.0 for s in out.scores)
    assert_plumbing(details)
    assert all(d["rule"] == 0.0 for d in details)
    # digits, brackets and CJK are a token a character or more: bounded in tokens, none is over the context
    assert not [d["failure"] for d in details if "context length" in (d["failure"] or "")]


@pytest.mark.slow
def test_launch_true_starts_and_stops_a_real_server(smollm2_path, tmp_path):
    port = free_port()
    opts = {
        "model": "local:SmolLM2-135M-Instruct",  # resolved to the prepared copy (smollm2_path)
        "base_url": f"http://{HOST}:{port}/v1",
        "setup": "tinyv_only",
        "retries": 0,
        "request_timeout_s": 60,
        "launch": True,
        "launch_args": CPU_SERVER_ARGS,
        "launch_timeout_s": 400,
    }
    config = SimpleNamespace(reward=RewardConfig(options={"tinyv": opts}, timeout_s=90))
    registry = load_plugins(["tinyv"])
    registry.hooks.plugrl_run_start(config=config, run_dir=tmp_path)
    try:
        server = servers.running()[port]
        assert server.alive()
        assert server.command[server.command.index("--host") + 1] == HOST
        assert listening_addresses(port) == {LOOPBACK}  # bound to 127.0.0.1 only
        assert server.command[server.command.index("--model") + 1] == str(smollm2_path)
        with RewardRunner(registry, config.reward) as runner:
            out = runner.score(items_for([WRONG]))
            d = {k.removeprefix("tinyv/"): v for k, v in out.details[0].items()}
            assert_plumbing([d])
            assert connection_failures([d]) == 0
            log_text = (tmp_path / "verifier_server.log").read_text(errors="replace")
            wait_until(
                lambda: "POST /v1/chat/completions" in (tmp_path / "verifier_server.log").read_text(errors="replace"),
                10,
                f"a request in the server log:\n{log_text[-2000:]}",
            )

            # the run ends (here as by Ctrl-C): the server and its engine processes are gone
            registry.hooks.plugrl_run_end(config=config, run_dir=tmp_path, error=KeyboardInterrupt())
            assert server.process.poll() is not None
            assert group_members(server.process.pid) == []
            assert not servers.port_in_use(port) and servers.running() == {}

            # scoring goes on without the server: counted failures, the fallback, fast
            t0 = time.perf_counter()
            out = runner.score(items_for([RIGHT, WRONG]))
            assert time.perf_counter() - t0 < 5
            assert out.scores == [0.0, 0.0]  # tinyv_only's default fallback: 0, whatever the rule says
            assert [d["tinyv/rule"] for d in out.details] == [1.0, 0.0]
            assert all(d["tinyv/verifier_failed"] for d in out.details)
    finally:
        servers.stop_all(grace_s=5)
