"""The judge plugin (an LLM judge as a reward): its options, checked at start under ``reward.options.judge.<key>``;
its prompt template, filled from the sample in one pass; each verdict parser on judge replies as models write
them; the reductions; then whole judgements against the stand-in OpenAI-compatible server of
tests/stand_in_openai.py (on 127.0.0.1) for what a real server will not do on demand (HTTP errors, a flaky first
answer, slowness, garbage replies, n replies of chosen content); the run hooks (launch through the kernel's
managed server, an unreachable base_url); and, marked slow, the real SmolLM2-135M-Instruct behind a vLLM server
the judge launches itself: real verdicts, garbage verdicts, and the server stopped mid-run."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

import plugrl_judge as pj
import plugrl_model_servers as servers
import stand_in_openai
from plugrl.config import ConfigError, RewardConfig, build_config
from plugrl.data import Sample
from plugrl.plugins import check_config, load_plugins
from plugrl.rewards import RewardItem, RewardRunner
from plugrl.rewards.routing import rewards_for
from stand_in_openai import Reply, StandInOpenAI, echo, error

HOST = "127.0.0.1"
WHERE = "reward.options.judge"
TEMPLATE = "Question: {question}\nReference: {ground_truth}\nResponse: {completion}\nScore 0-10."
BASE = {"model": "m", "prompt_template": TEMPLATE}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


# =========================================================================== options, checked at start

CONFIG_BASE = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}, "plugins": ["judge"]}


def kernel_problems(options) -> list[str]:
    """The problems the kernel's start-up check finds in ``reward.options.judge: options``."""
    cfg = build_config({**CONFIG_BASE, "reward": {"options": {"judge": options}}})
    try:
        check_config(cfg, load_plugins(["judge"]))
    except ConfigError as e:
        return [line.strip() for line in str(e).splitlines()[1:]]
    return []


def test_valid_options_pass_and_are_filled_in():
    assert kernel_problems(BASE) == []
    cfg = build_config(
        {**CONFIG_BASE, "reward": {"options": {"judge": {**BASE, "parser": "label", "labels": {"A": 1}}}}}
    )
    check_config(cfg, load_plugins(["judge"]))
    checked = cfg.reward.options["judge"]
    assert checked["samples"] == 1 and checked["reduce"] == "mean" and checked["labels"] == {"A": 1.0}
    assert pj.parse_options(checked).labels == {"A": 1.0}  # what the kernel validated parses again


@pytest.mark.parametrize(
    ("options", "key", "says"),
    [
        ({"prompt_template": TEMPLATE}, "model", "is required"),
        ({"model": "m"}, "prompt_template", "is required"),
        ({**BASE, "prompt_template": "Rate: {completon}"}, "prompt_template", "unknown placeholders {completon}"),
        ({**BASE, "prompt_template": "Rate {question}"}, "prompt_template", "put {completion}"),
        ({**BASE, "prompt_template": "no_such_file.txt"}, "prompt_template", "nor a readable file"),
        ({**BASE, "parser": "regex"}, "parser", "number, label, json, or module:function"),
        ({**BASE, "parser": "no_such_module_xyz:fn"}, "parser", "cannot be loaded (ModuleNotFoundError"),
        ({**BASE, "parser": "json:nope"}, "parser", "cannot be loaded (AttributeError"),
        ({**BASE, "parser": "label"}, "labels", "is required with parser label"),
        ({**BASE, "parser": "label", "labels": {"A": "high"}}, "labels", "scores are numbers"),
        ({**BASE, "parser": "json"}, "key", "is required with parser json"),
        ({**BASE, "pattern": "Score: ("}, "pattern", "not a valid regular expression"),
        ({**BASE, "pattern": "(a)(b)"}, "pattern", "at most one group"),
        ({**BASE, "range": [10, 0]}, "range", "lo < hi"),
        ({**BASE, "reduce": "mode"}, "reduce", "mean, median, majority, min, max"),
        ({**BASE, "samples": 0}, "samples", ""),
        ({**BASE, "timeout_s": 0}, "timeout_s", ""),
        ({**BASE, "extra_body": {"n": 4}}, "extra_body", "must not set n"),
        ({**BASE, "launch": True, "base_url": "https://api.example.com/v1"}, "base_url", "http://127.0.0.1:PORT/v1"),
        (
            {**BASE, "launch": True, "base_url": "http://127.0.0.1:8011/v1", "launch_args": "--port 9"},
            "launch_args",
            "",
        ),
    ],
)
def test_option_errors_name_their_key(options, key, says):
    problems = kernel_problems(options)
    assert len(problems) == 1, problems
    assert f"{WHERE}.{key}" in problems[0] and says in problems[0], problems[0]
    with pytest.raises(pj.OptionError) as info:
        pj.parse_options(options)
    assert f"{WHERE}.{key}" in str(info.value) and says in str(info.value)


def test_unknown_option_and_pasted_key():
    assert (
        "unknown key 'reward.options.judge.temprature'; did you mean 'reward.options.judge.temperature'"
        in (kernel_problems({**BASE, "temprature": 0.5})[0])
    )
    problems = kernel_problems({**BASE, "api_key": "sk-PLANTED"})
    assert problems and all("sk-PLANTED" not in p for p in problems) and f"{WHERE}.api_key" in problems[0]
    with pytest.raises(pj.OptionError, match="unknown reward.options.judge: temprature"):
        pj.parse_options({**BASE, "temprature": 0.5})


def test_template_from_a_file(tmp_path):
    path = tmp_path / "judge.txt"
    path.write_text("Grade this: {completion}\nAgainst: {extra_info.rubric}")
    opts = pj.parse_options({**BASE, "prompt_template": str(path)})
    assert opts.prompt_text.startswith("Grade this:")
    path.write_text("Grade this: {completio}")
    pj.options._read_file.cache_clear()
    assert "names the file" in kernel_problems({**BASE, "prompt_template": str(path)})[0]


# =========================================================================== the template


def sample(ground_truth="12", extra_info=None, prompt="What is 7 + 5?", data_source="judge") -> Sample:
    return Sample(prompt=prompt, data_source=data_source, ground_truth=ground_truth, extra_info=extra_info or {})


def test_render_fills_each_field_once():
    s = sample(extra_info={"rubric": "exact", "n": 3})
    text = pj.render(
        "Q: {question} | P: {prompt} | C: {completion} | A: {answer} | G: {ground_truth} | D: {data_source} | "
        '{extra_info.rubric} {extra_info.n} | {"score": 7} stays',
        completion="It is {ground_truth}.",  # untrusted: never read for placeholders again
        ground_truth=s.ground_truth,
        prompt="<rendered>What is 7 + 5?",
        sample=s,
        extra_info=s.extra_info,
    )
    assert text == (
        "Q: What is 7 + 5? | P: <rendered>What is 7 + 5? | C: It is {ground_truth}. | A: It is {ground_truth}. | "
        'G: 12 | D: judge | exact 3 | {"score": 7} stays'
    )


def test_question_falls_back_and_long_completions_keep_their_end():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 7 and 5."}]
    assert pj.render("{question}", completion="", sample=sample(prompt=chat)) == "Add 7 and 5."
    assert pj.render("{question}", completion="", sample=sample(extra_info={"question": "Q?"})) == "Q?"
    assert pj.render("{question}", completion="", sample=sample(prompt=""), prompt="rendered") == "rendered"
    text = pj.render("{completion}", completion="x" * 100 + "ANSWER", max_completion_chars=10)
    assert text == "[... 96 characters cut ...]xxxxANSWER"
    with pytest.raises(KeyError, match="extra_info has no 'rubric'"):
        pj.render("{extra_info.rubric}{completion}", completion="c", extra_info={"other": 1})


# =========================================================================== parsers and reductions


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Score: 7", 7.0),
        ("The response is mostly right.\n\nScore: 8/10", 8.0),  # "N/M" reads N
        ("**Final score: 6.5 / 10**", 6.5),
        ("I'd give it a 3 out of 10... no, a 4.", 4.0),  # the last number counts
        ("<think>Maybe 2? The answer 12 is right.</think>\n9", 9.0),
        ("<think>Score: 10, the answer is", None),  # reasoning cut off by max_tokens
        ("No score given.", None),
        ("", None),
        (None, None),
    ],
)
def test_number_parser(reply, score):
    assert pj.parse_number(reply) == score


def test_number_parser_pattern_and_range():
    pattern = pj.options._compile(r"score:\s*(\S+)")
    assert pj.parse_number("Step 1 ok. Step 2 ok. SCORE: 7/10", pattern) == 7.0
    assert pj.parse_number("Step 1 ok, no verdict", pattern) is None
    assert pj.parse_number("Score: 8", bounds=(0, 10)) == pytest.approx(0.8)
    assert pj.parse_number("Score: 12", bounds=(0, 10)) is None  # off its scale: not a verdict
    assert pj.parse_number("Score: 3", bounds=(1, 5)) == pytest.approx(0.5)


LABELS = {"correct": 1.0, "incorrect": 0.0, "partially correct": 0.5}


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Correct", 1.0),
        ("**INCORRECT**", 0.0),
        ("The response is partially correct.", 0.5),  # the longer label wins over its part
        ("At first it looks incorrect, but it is Correct.", 1.0),  # the last label counts
        ("<think>correct?</think>incorrect", 0.0),
        ("I am unsure.", None),
        ("incorrectly", None),  # whole words only
    ],
)
def test_label_parser(reply, score):
    assert pj.parse_label(reply, LABELS) == score


def test_label_parser_with_a_pattern():
    pattern = pj.options._compile(r"verdict:\s*\**\s*([\w ]+?)\W*$")
    assert pj.parse_label("This is not correct at all.\nVerdict: incorrect", LABELS, pattern) == 0.0
    assert pj.parse_label("Verdict: **Correct**.", LABELS, pattern) == 1.0
    assert pj.parse_label("Verdict: brilliant", LABELS, pattern) is None


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ('{"score": 7}', 7.0),
        ('Here you go:\n```json\n{"reasoning": "fine", "score": 9}\n```', 9.0),
        ('{"score": 3} on reflection {"score": 5}', 5.0),  # the last object holding the key
        ('{"result": {"score": 2}}', None),  # nested: needs key result.score
        ('{"score": true}', 1.0),
        ('{"score": "8"}', 8.0),
        ('{"score": "excellent"}', None),
        ('{"score": 7', None),  # cut off
        ("score: 7", None),
    ],
)
def test_json_parser(reply, score):
    assert pj.parse_json(reply, "score") == score


def test_json_parser_nested_labels_and_range():
    assert pj.parse_json('{"result": {"score": 2}}', "result.score") == 2.0
    assert pj.parse_json('{"verdict": "Correct"}', "verdict", labels=LABELS) == 1.0
    assert pj.parse_json('{"score": 15}', "score", bounds=(0, 10)) is None


@pytest.mark.parametrize(
    ("how", "scores", "expected"),
    [
        ("mean", [1.0, 0.0, 0.5], 0.5),
        ("median", [0.2, 0.9, 0.4], 0.4),
        ("median", [0.0, 1.0], 0.5),
        ("min", [0.3, 0.1, 0.7], 0.1),
        ("max", [0.3, 0.1, 0.7], 0.7),
        ("majority", [1.0, 0.0, 1.0], 1.0),
        ("majority", [1.0, 0.0], 0.0),  # a tie: the lower score
        ("majority", [0.5], 0.5),
    ],
)
def test_reductions(how, scores, expected):
    assert pj.reduce_scores(scores, how) == pytest.approx(expected)


# =========================================================================== a stand-in OpenAI-compatible server

# It stands in for vLLM where a real server cannot show the behaviour on demand: HTTP errors, a first attempt
# that fails, slowness, n replies of chosen content. The model name picks the behaviour; "echo" replies with
# the user message it got (so a test sees the rendered prompt), "seq:A|B|C" with choice i = the i-th text
# (cycling). The server keeps every request (stand_in.bodies(model)) and the most in flight per model.


def answer_by_model(request: dict) -> str | list[str] | Reply:
    model, count = request["body"]["model"], request["count"]
    if model.startswith("http"):
        code = int(model[4:7])
        return error(code, f"stand-in {code}")
    if model == "flaky" and count == 1:
        return error(503, "warming up")
    if model.startswith("slow"):
        time.sleep(float(model.split(":")[1]))
    if model == "echo":
        return echo(request)
    if model.startswith("seq:"):
        return model[4:].split("|")
    return "Score: 7"


@pytest.fixture(scope="module")
def stand_in():
    with StandInOpenAI(answer_by_model) as server:
        yield server


def items_for(completions, extra_info=None, data_source="judge"):
    s = sample(extra_info=extra_info, data_source=data_source)
    return [RewardItem(s, "<rendered>What is 7 + 5?", c) for c in completions]


def score(options, items, timeout_s=30.0, error_score=-1.0):
    registry = load_plugins(["judge"])
    cfg = RewardConfig(options={"judge": options}, timeout_s=timeout_s, error_score=error_score)
    with RewardRunner(registry, cfg) as runner:
        return runner.score(items)


def opts_for(server, model, **more):
    return {**BASE, "model": model, "base_url": server.base_url, "backoff_s": 0.01, **more}


def test_routing_and_declared_keywords():
    registry = load_plugins(["judge"])
    assert [r.name for r in rewards_for(registry, "judge")] == ["judge"]
    assert [r.name for r in rewards_for(registry, "helpsteer_judge")] == ["judge"]
    assert rewards_for(registry, "gsm8k") == []
    registry.default_reward = "judge"  # reward.default: judge routes any other data source to it
    assert [r.name for r in rewards_for(registry, "gsm8k")] == ["judge"]


def test_a_judgement_end_to_end(stand_in):
    """The rendered prompt reaches the server; the verdict is read from the reply, scaled by range."""
    pj.reset_judge_stats()
    options = opts_for(stand_in, "echo", prompt_template="{completion}", range=[0, 10], system_prompt="Judge.")
    out = score(options, items_for(["Score: 8", "Score: 3/10"]))
    assert out.scores == pytest.approx([0.8, 0.3])
    assert out.details[0]["judge/parsed"] == 1 and out.details[0]["judge/requests"] == 1
    sent = {body["messages"][-1]["content"]: body for body in stand_in.bodies("echo")}  # in either order
    assert set(sent) == {"Score: 8", "Score: 3/10"}
    last = sent["Score: 3/10"]
    assert last["messages"] == [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Score: 3/10"}]
    assert last["n"] == 1 and last["temperature"] == 0.0 and last["max_tokens"] == 256
    assert pj.judge_stats() == {"judgements": 2, "failures": 0, "requests": 2}


def test_samples_are_reduced_and_garbage_samples_dropped(stand_in):
    model = "seq:Score: 9|Score: 3|I cannot say|Score: 9"
    for reduce, expected in [("mean", 7.0), ("median", 9.0), ("majority", 9.0), ("min", 3.0), ("max", 9.0)]:
        out = score(opts_for(stand_in, model, samples=4, temperature=1.0, reduce=reduce), items_for(["x"]))
        assert out.scores == [pytest.approx(expected)], reduce
        assert out.details[0]["judge/parsed"] == 3 and out.details[0]["judge/verdicts"] == [9.0, 3.0, 9.0]
    assert stand_in.bodies(model)[-1]["n"] == 4


def test_label_json_and_own_parser(stand_in, local_plugin):
    out = score(opts_for(stand_in, "seq:Verdict: Correct", parser="label", labels=LABELS), items_for(["x"]))
    assert out.scores == [1.0]
    out = score(opts_for(stand_in, 'seq:{"score": 4, "why": "ok"}', parser="json", key="score"), items_for(["x"]))
    assert out.scores == [4.0]
    module = local_plugin(
        "my_judge_parser",
        """
        def parse(reply):
            if "great" in reply:
                return 1
            if "boom" in reply:
                raise ValueError("cannot read it")  # a parser that raises: that reply holds no verdict
            return None
        """,
    )
    out = score(opts_for(stand_in, "seq:A great answer", parser=f"{module}:parse"), items_for(["x"]))
    assert out.scores == [1.0]
    out = score(opts_for(stand_in, "seq:boom", parser=f"{module}:parse", retries=0), items_for(["x"]))
    assert out.scores == [-1.0] and "no verdict" in out.details[0]["judge/error"]


def test_garbage_verdicts_fail_are_counted_and_score_error_score(stand_in):
    pj.reset_judge_stats()
    before = len(stand_in.bodies("seq:I refuse to grade this."))
    options = opts_for(stand_in, "seq:I refuse to grade this.", retries=3)
    out = score(options, items_for(["a", "b"]))
    assert out.scores == [-1.0, -1.0]
    assert out.metrics["reward/errors"] == 2.0 and all(d["error"] for d in out.details)
    assert "no verdict (number parser) in 1 replies; last: 'I refuse to grade this.'" in out.details[0]["judge/error"]
    # at temperature 0 the same prompt gets the same reply: no retry
    assert len(stand_in.bodies("seq:I refuse to grade this.")) - before == 2
    assert pj.judge_stats() == {"judgements": 2, "failures": 2, "requests": 2}
    metrics = pj.plugrl_step_metrics(step=1)
    assert metrics == {"judge/failures": 2.0, "judge/judgements": 2.0, "judge/requests": 2.0}
    assert pj.plugrl_step_metrics(step=2) == {"judge/failures": 0.0, "judge/judgements": 0.0, "judge/requests": 0.0}
    # at temperature > 0 another sample may hold a verdict: retried
    out = score({**options, "temperature": 0.7}, items_for(["a"]))
    assert out.details[0]["judge/error"].endswith("(after 4 requests)")


def test_server_errors_are_retried_with_backoff_then_counted(stand_in):
    pj.reset_judge_stats()
    out = score(opts_for(stand_in, "flaky", retries=2), items_for(["x"]))  # 503, then an answer
    assert out.scores == [7.0] and out.details[0]["judge/requests"] == 2
    out = score(opts_for(stand_in, "http500", retries=2), items_for(["x"]))
    assert out.scores == [-1.0] and "(HTTP 500)" in out.details[0]["judge/error"]
    assert out.details[0]["judge/error"].endswith("(after 3 requests)")
    out = score(opts_for(stand_in, "http400", retries=2), items_for(["x"]))  # the same answer every time
    assert out.details[0]["judge/error"].endswith("(after 1 requests)")
    assert pj.judge_stats()["failures"] == 2


def test_timeouts_and_a_server_that_is_down(stand_in):
    t0 = time.perf_counter()
    out = score(opts_for(stand_in, "slow:3", timeout_s=0.5, retries=1), items_for(["x"]))
    assert out.scores == [-1.0] and "Timeout" in out.details[0]["judge/error"]
    assert time.perf_counter() - t0 < 6
    down = {**opts_for(stand_in, "m", retries=1), "base_url": f"http://{HOST}:{free_port()}/v1"}
    out = score(down, items_for(["x", "y"]))
    assert out.scores == [-1.0, -1.0] and all("Connection" in d["judge/error"] for d in out.details)
    # the kernel's own time limit cuts a judgement short: scored error_score, counted as a judge failure too
    pj.reset_judge_stats()
    out = score(opts_for(stand_in, "slow:3", timeout_s=10), items_for(["x"]), timeout_s=0.5)
    assert out.scores == [-1.0] and out.details[0]["timeout"]
    assert pj.judge_stats()["failures"] == 1


def test_a_step_with_the_judge_down_logs_one_line_per_kind_of_failure(stand_in, caplog):
    """A judge that is down fails every judgement of a step. The plugin says so once a step, one warning per kind
    of failure (what failed, how many of the step's judgements, the first one's message), not a line or a
    traceback per sample; each failed request's traceback is logged at DEBUG. The failures are counted as ever."""
    pj.reset_judge_stats()
    url = f"http://{HOST}:{free_port()}/v1"  # nothing listens there
    down = {**opts_for(stand_in, "m", retries=1, prompt_template="{extra_info.rubric}: {completion}"), "base_url": url}
    items = items_for(["a", "b", "c", "d", "e"], extra_info={"rubric": "be exact"}) + items_for(["f", "g"])
    with caplog.at_level(logging.DEBUG, logger="plugrl.judge"):
        out = score(down, items)  # 5 connection failures (2 requests each), 2 prompts missing a field
        metrics = pj.plugrl_step_metrics(step=3)
    assert out.scores == [-1.0] * 7 and out.metrics["reward/errors"] == 7.0
    assert metrics == {"judge/failures": 7.0, "judge/judgements": 7.0, "judge/requests": 10.0}
    assert pj.judge_stats() == {"judgements": 7, "failures": 7, "requests": 10}
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    said = sorted(r.getMessage() for r in warned if r.name == "plugrl.judge")
    assert len(said) == 2, said
    assert said[0].startswith(
        "judge: 2 of 7 judgements in step 3 failed: a field prompt_template names is missing (scored "
        "reward.error_score); the first: the prompt_template's {extra_info.rubric}: this row's extra_info has no "
        "'rubric'"
    )
    assert said[1].startswith(
        "judge: 5 of 7 judgements in step 3 failed: APIConnectionError (scored reward.error_score); the first: "
        f"judge m at {url}: APIConnectionError: Connection error"
    )
    assert said[1].endswith("(after 2 requests)")
    # no traceback from the judge above DEBUG; in all, at most the kernel's one for the batch, not one per sample
    assert not any(r.exc_info for r in warned if r.name == "plugrl.judge")
    assert sum(bool(r.exc_info) or "Traceback" in r.getMessage() for r in warned) <= 1
    debug = [r for r in caplog.records if r.name == "plugrl.judge" and r.levelno == logging.DEBUG and r.exc_info]
    assert len(debug) == 10  # each failed request's traceback

    caplog.clear()  # a step that judged well reports no failure; the end of the run reports what is left
    with caplog.at_level(logging.INFO, logger="plugrl.judge"):
        assert score(opts_for(stand_in, "m"), items_for(["x"])).scores == [7.0]
        pj.plugrl_step_metrics(step=4)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "plugrl.judge"]
        score({**down, "prompt_template": "{completion}"}, items_for(["y"]))
        pj.plugrl_run_end(config=None, run_dir=None, error=None)
    said = [r.getMessage() for r in caplog.records if r.name == "plugrl.judge"]
    assert len(said) == 2 and said[0].startswith("judge: 1 of 1 judgements since the last step failed: APIConnection")
    assert said[1] == "judge: 9 judgements, 8 failed (scored reward.error_score), 13 requests"


def test_concurrency_bounds_requests_in_flight(stand_in):
    out = score(opts_for(stand_in, "slow:0.3", concurrency=2), items_for(["x"] * 6))
    assert out.scores == [7.0] * 6
    assert stand_in.max_in_flight("slow:0.3") == 2


def test_a_missing_extra_info_field_fails_that_judgement(stand_in):
    options = opts_for(stand_in, "m", prompt_template="{extra_info.rubric}: {completion}")
    out = score(options, items_for(["x"], extra_info={"rubric": "be exact"}) + items_for(["y"]))
    assert out.scores[0] == 7.0 and out.scores[1] == -1.0
    assert "extra_info has no 'rubric'" in out.details[1]["judge/error"]


# =========================================================================== run hooks


def test_run_start_stops_a_run_whose_judge_cannot_be_reached(stand_in):
    config = SimpleNamespace(reward=RewardConfig(options={"judge": opts_for(stand_in, "m")}))
    pj.plugrl_run_start(config=config, run_dir=None)  # reachable: fine
    down = {**BASE, "base_url": f"http://{HOST}:{free_port()}/v1"}
    config = SimpleNamespace(reward=RewardConfig(options={"judge": down}))
    with pytest.raises(RuntimeError, match=r"reward\.options\.judge\.base_url .* does not answer.*launch: true"):
        pj.plugrl_run_start(config=config, run_dir=None)
    pj.plugrl_run_end(config=config, run_dir=None, error=RuntimeError("x"))  # never raises
    pj.plugrl_run_end(config=None, run_dir=None, error=None)


def test_openai_api_without_a_key_is_a_config_problem(monkeypatch):
    monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    options = {**BASE, "base_url": "https://api.openai.com/v1", "api_key_env": "JUDGE_TEST_KEY"}
    problems = kernel_problems(options)
    assert len(problems) == 1 and "JUDGE_TEST_KEY (reward.options.judge.api_key_env) is not set" in problems[0]


def test_launch_through_the_hooks_with_a_stand_in(monkeypatch, tmp_path):
    """launch: true starts the server with the kernel's managed server, the reward uses it, run_end stops it."""
    monkeypatch.setattr(servers, "vllm_command", stand_in_openai.vllm_command("--echo"))  # a process, not vLLM
    port = free_port()
    options = {**BASE, "model": "echo", "base_url": f"http://{HOST}:{port}/v1", "launch": True}
    options["prompt_template"] = "{completion}"
    config = SimpleNamespace(reward=RewardConfig(options={"judge": options}, timeout_s=30))
    registry = load_plugins(["judge"])
    registry.hooks.plugrl_run_start(config=config, run_dir=tmp_path)
    try:
        server = servers.running()[port]
        assert server.where == WHERE and server.healthy()
        with RewardRunner(registry, config.reward) as runner:
            assert runner.score(items_for(["Score: 5"])).scores == [5.0]
    finally:
        registry.hooks.plugrl_run_end(config=config, run_dir=tmp_path, error=KeyboardInterrupt())
    assert not server.alive() and servers.running() == {} and not servers.port_in_use(port)
    assert (tmp_path / "judge_server.log").is_file()


# =========================================================================== the real judge (SmolLM2-135M-Instruct)

CPU_SERVER_ARGS = ["--max-model-len", "2048", "--kv-cache-memory-bytes", str(256 * 2**20), "--enforce-eager"]


@pytest.mark.slow
def test_real_judge_launched_then_garbage_then_down(smollm2_path, tmp_path):
    """The judge launches vLLM serving SmolLM2-135M-Instruct (the kernel's managed server) and scores with it:
    real verdicts (a digit, held to by vLLM's structured output), several samples per judgement; garbage
    verdicts (a JSON verdict cannot fit in 2 tokens) fail, are counted and score error_score; then the server is
    stopped mid-run: every judgement fails fast, counted, scored error_score."""
    port = free_port()
    options = {
        "model": "local:SmolLM2-135M-Instruct",
        "base_url": f"http://{HOST}:{port}/v1",
        "launch": True,
        "launch_args": CPU_SERVER_ARGS,
        "launch_timeout_s": 400,
        "prompt_template": "Question: {question}\nAnswer: {completion}\nReference answer: {ground_truth}\n"
        "How correct is the answer, from 0 (wrong) to 9 (right)? Reply with one digit.",
        "parser": "number",
        "range": [0, 9],
        "samples": 3,
        "temperature": 0.8,
        "max_tokens": 4,
        "timeout_s": 60,
        "retries": 1,
        "backoff_s": 0.05,
        "extra_body": {"structured_outputs": {"regex": "[0-9]"}},
    }
    config = SimpleNamespace(reward=RewardConfig(options={"judge": options}, timeout_s=150, error_score=-1.0))
    registry = load_plugins(["judge"])
    pj.reset_judge_stats()
    registry.hooks.plugrl_run_start(config=config, run_dir=tmp_path)
    try:
        server = servers.running()[port]
        assert server.command[server.command.index("--model") + 1] == str(smollm2_path)
        with RewardRunner(registry, config.reward) as runner:
            # real verdicts: a 135M judge's opinion is unreliable, its shape is not
            out = runner.score(items_for(["7 + 5 = 12, so the answer is 12.", "It is 13."]))
            for s, d in zip(out.scores, out.details, strict=True):
                assert not d["error"] and 0.0 <= s <= 1.0, d
                assert d["judge/parsed"] == 3 and len(d["judge/verdicts"]) == 3 and d["judge/requests"] == 1
            assert pj.judge_stats() == {"judgements": 2, "failures": 0, "requests": 2}
            wait_until(
                lambda: "POST /v1/chat/completions" in (tmp_path / "judge_server.log").read_text(errors="replace"),
                10,
                "a request in the server log",
            )

        # garbage: the real server answers, the answer holds no verdict
        garbage = {**options, "parser": "json", "key": "score", "max_tokens": 2, "extra_body": None}
        garbage_cfg = RewardConfig(options={"judge": garbage}, timeout_s=150, error_score=-1.0)
        with RewardRunner(registry, garbage_cfg) as runner:
            out = runner.score(items_for(["12", "13"]))
        assert out.scores == [-1.0, -1.0] and out.metrics["reward/errors"] == 2.0
        assert all("no verdict (json parser)" in d["judge/error"] for d in out.details)
        assert pj.judge_stats()["failures"] == 2

        # the server goes away mid-run: connection failures, fast, counted, error_score
        with RewardRunner(registry, config.reward) as runner:
            assert servers.stop(port, grace_s=5)
            t0 = time.perf_counter()
            out = runner.score(items_for(["12", "13", "14"]))
            assert time.perf_counter() - t0 < 5
        assert out.scores == [-1.0, -1.0, -1.0] and out.metrics["reward/errors"] == 3.0
        assert all("Connection" in d["judge/error"] for d in out.details)
        assert pj.judge_stats()["failures"] == 5
        assert pj.plugrl_step_metrics(step=1)["judge/failures"] >= 5.0
    finally:
        registry.hooks.plugrl_run_end(config=config, run_dir=tmp_path, error=None)
    assert servers.running() == {} and not servers.port_in_use(port)
