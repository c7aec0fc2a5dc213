"""The classifier_openai plugin: prompt, reply parsing, keys, fallbacks (fake servers), and a real vLLM server."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import plugrl_classifier_openai as cls
import stand_in_openai
from plugrl.specs import specs_of
from plugrl_advantages.classify import ClassifierSpec, classify_groups, find_classifier
from plugrl_classifier_openai import build_messages, classify_strategies, parse_groups, resolve_api_key
from stand_in_openai import StandInOpenAI

# the session-scoped `openai_server` fixture: one real server per session, shared with other modules that load it
pytest_plugins = ["openai_server"]


def free_port() -> int:
    from openai_server import free_port as pick  # imported after pytest loaded it as a plugin (assertion rewriting)

    return pick()


PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "classifier_openai"
SPEC = ClassifierSpec("openai", classify_strategies)
RESPONSES = ["3 + 5 = 8, so the answer is 3 + 5.", "5 + 3 = 8", "Work backwards: 8 - 5 = 3, so 3 + 5."]


# =========================================================================== parsing canned replies


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"groups": [1, 1, 2]}', [1, 1, 2]),
        ('```json\n{"groups": [0, 0, 1]}\n```', [0, 0, 1]),
        ('Sure! Here is the grouping:\n```\n{ "groups": [2, 2, 3] }\n```\nSolutions 1 and 2 add directly.', [2, 2, 3]),
        ('The first two add, the third works backwards. {"groups":[1,1,2]} Hope this helps.', [1, 1, 2]),
        ("[1, 1, 2]", [1, 1, 2]),  # a bare JSON list
        ("Groups: [1, 2, 2]", [1, 2, 2]),
        ('{"groups": ["1", "1", "2"]}', [1, 1, 2]),  # numbers as strings
        ('{"groups": [1.0, 1.0, 2.0]}', [1, 1, 2]),
        ('{"Groups": [1, 1, 2]}', [1, 1, 2]),
        ("{'groups': [1, 1, 2]}", [1, 1, 2]),  # Python-style quotes: not JSON
        ('{"groups": [1, 1, 2,]}', [1, 1, 2]),  # trailing comma: not JSON
        ('{"groups": [[1, 2], [3]]}', [0, 0, 1]),  # a partition of the solution numbers
        ('{"groups": [[0], [1, 2]]}', [0, 1, 1]),  # ... 0-based
        # the format restated first (placeholders, not JSON), the answer last
        ('The format is {"groups": [g1, g2, g3]}. My answer: {"groups": [1, 2, 1]}', [1, 2, 1]),
        ('{"groups": [1, 1]} wait, three solutions: {"groups": [1, 1, 3]}', [1, 1, 3]),
        ('{"reasoning": "1 and 2 add; 3 subtracts", "groups": [1, 1, 2]}', [1, 1, 2]),
        # a keyed answer wins over other lists in the text (the problem's numbers, say)
        ('Numbers [3, 5, 8]. {"groups": [1, 2, 2]}', [1, 2, 2]),
    ],
)
def test_parse_realistic_replies(reply, expected):
    assert parse_groups(reply, 3) == expected


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (None, "empty"),
        ("   ", "empty"),
        ("The solutions all use addition, so they are one group.", "no JSON group ids"),
        ('{"groups": [1, 2]}', r"of 3 group ids .*found entries: 2"),  # wrong length
        ('{"groups": [1, 2, 3, 4]}', "found entries: 4"),
        ('{"groups": [g1, g2, g3]}', "no JSON group ids"),  # the format echoed with its placeholders
        ('{"groups": ["a", "b", "a"]}', "group ids"),
        ('{"groups": [true, false, true]}', "group ids"),
        ('{"groups": [[1, 2], [2, 3]]}', "group ids"),  # not a partition
        ('{"groups": "1, 1, 2"}', "not a list"),
        ('{"groups": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12', "no JSON group ids"),  # cut off by max_tokens
    ],
)
def test_parse_rejects_what_is_not_a_grouping(reply, match):
    with pytest.raises(ValueError, match=match):
        parse_groups(reply, 3)


# =========================================================================== the request


def test_messages_number_the_solutions_and_ask_for_methods_only():
    system, user = build_messages("Using 3 and 5, make 8.", RESPONSES)
    assert system["role"] == "system" and user["role"] == "user"
    text = user["content"]
    assert "OVERARCHING METHOD" in text and "correctness" in text
    assert "Using 3 and 5, make 8." in text
    for i, r in enumerate(RESPONSES, 1):
        assert f"Solution {i}:\n<solution>\n{r}\n</solution>" in text
    assert '{"groups": [g1, g2, ..., g3]}' in text and "exactly 3 integers" in text
    # the worked example never has the length asked for, so echoing it is no valid answer
    assert '{"groups": [1, 2, 1, 1]}' in text
    assert '{"groups": [1, 1, 2]}' in build_messages("p", ["a", "b"])[1]["content"]


def test_long_responses_are_truncated():
    text = build_messages("p", ["x" * 5000, "short"], max_chars_per_response=100)[1]["content"]
    assert "x" * 100 + "\n[... 4900 more characters omitted ...]" in text and "x" * 101 not in text
    assert "short" in text
    with pytest.raises(ValueError, match="max_chars_per_response"):
        build_messages("p", ["a", "b"], max_chars_per_response=0)


# =========================================================================== keys and options


def test_api_key_comes_from_the_named_environment_variable(monkeypatch):
    monkeypatch.setenv("MY_CLASSIFIER_KEY", "sk-test-123")
    assert resolve_api_key("https://api.openai.com/v1", "MY_CLASSIFIER_KEY") == "sk-test-123"
    monkeypatch.delenv("MY_CLASSIFIER_KEY")
    # a local server needs no key: the dummy key
    assert resolve_api_key("http://127.0.0.1:8000/v1", "MY_CLASSIFIER_KEY") == "EMPTY"
    # OpenAI's API does: a clear error naming the variable
    with pytest.raises(RuntimeError, match=r"MY_CLASSIFIER_KEY \(algorithm.classifier_options.api_key_env\) is not"):
        resolve_api_key("https://api.openai.com/v1", "MY_CLASSIFIER_KEY")
    # a key pasted where the variable's name belongs is refused without being echoed
    with pytest.raises(ValueError, match="NAME of an environment variable") as err:
        resolve_api_key("http://127.0.0.1:8000/v1", "sk-proj-abc-123")
    assert "sk-proj" not in str(err.value)


def test_missing_key_for_openai_fails_before_any_request(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match=r"OPENAI_API_KEY \(algorithm.classifier_options.api_key_env\) is not set"):
        classify_strategies("p", ["a", "b"])  # default base_url: api.openai.com


def test_options_refuse_a_key_in_the_config_and_unknown_names():
    with pytest.raises(TypeError, match="api_key_env") as err:
        classify_strategies("p", ["a", "b"], api_key="sk-PLANTED")
    assert "sk-PLANTED" not in str(err.value)
    with pytest.raises(TypeError, match="unknown .*: temprature"):
        classify_strategies("p", ["a", "b"], temprature=0.5)


CONFIG = {
    "model": {"path": "m"},
    "data": {"train_files": ["t.jsonl"]},
    "plugins": ["advantages", "classifier_openai"],
    "algorithm": {"adv_estimator": "grpo_weighted_mul", "classifier": "openai"},
}


def checked_config(options):
    """A run config with ``algorithm.classifier_options: options`` after the kernel's start-up check."""
    from plugrl.config import build_config
    from plugrl.plugins import check_config, load_plugins

    cfg = build_config({**CONFIG, "algorithm": {**CONFIG["algorithm"], "classifier_options": options}})
    check_config(cfg, load_plugins(cfg.plugins))
    return cfg


def test_options_are_declared_once_and_checked_before_any_model_loads():
    from plugrl.config import ConfigError
    from plugrl.plugins import load_plugins

    assert find_classifier(load_plugins(["classifier_openai"]), "openai").options is cls.ClassifierOptions
    with pytest.raises(ConfigError) as info:
        checked_config(
            {"timeout_s": 0, "temprature": 0.5, "api_key": "sk-PLANTED-1", "api_key_env": "sk-PLANTED-2", "x": 1}
        )
    text = str(info.value)
    assert "sk-PLANTED" not in text  # a key pasted into the config is never echoed
    # found by the advantages plugin, which checks the classifier its estimators call
    assert all(line.strip().startswith("plugin 'advantages': ") for line in text.splitlines()[1:])
    problems = [line.strip().removeprefix("plugin 'advantages': ") for line in text.splitlines()[1:]]
    assert problems[0].startswith(
        "unknown key 'algorithm.classifier_options.temprature'; "
        "did you mean 'algorithm.classifier_options.temperature'?"
    )
    assert problems[1].startswith("unknown key 'algorithm.classifier_options.x'")
    assert problems[2:] == [
        "algorithm.classifier_options.api_key: keep keys out of configs and name the environment variable that holds "
        "it in algorithm.classifier_options.api_key_env",
        "algorithm.classifier_options.api_key_env: must be the NAME of an environment variable holding the key "
        "(e.g. OPENAI_API_KEY), not the key itself",
        "algorithm.classifier_options.timeout_s: must be > 0 (got 0)",
    ]
    for options, named in (
        ({"base_url": "localhost:8000"}, "algorithm.classifier_options.base_url: must be an http(s) URL"),
        ({"timeout_s": float("inf")}, "algorithm.classifier_options.timeout_s: must be > 0 (got inf)"),
        ({"max_tokens": 1.5}, "algorithm.classifier_options.max_tokens: must be a whole number (got 1.5)"),
        ({"json_schema": "yes please"}, "algorithm.classifier_options.json_schema: must be true or false"),
        ({"model": " "}, "algorithm.classifier_options.model: must name the model the server serves"),
    ):
        with pytest.raises(ConfigError, match=re.escape(named)):
            checked_config(options)


def test_options_the_kernel_validated_reach_the_classifier(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    with StandInOpenAI('{"groups": [2, 2, 5]}') as server:
        cfg = checked_config({"base_url": server.base_url, "model": "judge", "max_tokens": "64", "json_schema": True})
        options = cfg.algorithm.classifier_options  # validated, defaults filled in, JSON types
        assert options == {
            "launch": False,
            "base_url": server.base_url,
            "model": "judge",
            "launch_args": [],
            "launch_timeout_s": 300.0,
            "api_key_env": "OPENAI_API_KEY",
            "timeout_s": 60.0,
            "temperature": 0.0,
            "max_tokens": 64,
            "max_chars_per_response": 2000,
            "json_schema": True,
        }
        ids, metrics = classify_groups(SPEC, ["p"], [RESPONSES], options=options, concurrency=1, retries=1)
        (req,) = server.requests
    assert ids == [0, 0, 1] and metrics["classifier/failures"] == 0.0  # the kernel renumbers the groups
    assert req["body"]["model"] == "judge" and req["body"]["max_tokens"] == 64 and "response_format" in req["body"]


def test_a_bad_value_passed_directly_is_a_value_error_naming_the_option():
    with pytest.raises(ValueError, match=re.escape("algorithm.classifier_options.timeout_s must be > 0, got 0")):
        classify_strategies("p", ["a", "b"], timeout_s=0)
    with pytest.raises(ValueError, match="api_key_env must be the NAME") as err:
        classify_strategies("p", ["a", "b"], api_key_env="sk-proj-abc-123")
    assert "sk-proj" not in str(err.value)


def test_one_response_needs_no_request():
    # nothing listens on this port: a request would fail
    assert classify_strategies("p", ["only"], base_url=f"http://127.0.0.1:{free_port()}/v1") == [0]
    assert classify_strategies("p", [], base_url=f"http://127.0.0.1:{free_port()}/v1") == []


def test_clients_are_cached_per_base_url_and_key():
    a = cls.get_client("http://127.0.0.1:1/v1", "k1", 5.0)
    assert cls.get_client("http://127.0.0.1:1/v1", "k1", 9.0) is a
    assert cls.get_client("http://127.0.0.1:1/v1", "k2", 5.0) is not a
    assert cls.get_client("http://127.0.0.1:2/v1", "k1", 5.0) is not a
    assert a.max_retries == 0  # the kernel retries


def test_registered_through_the_entry_point():
    from plugrl.plugins import load_plugins

    (spec,) = specs_of(classify_strategies)
    assert isinstance(spec, ClassifierSpec) and spec.name == "openai"
    registry = load_plugins(["classifier_openai"])
    assert find_classifier(registry, "openai").fn is classify_strategies
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "plugrl-classifier-openai"
    assert meta["project"]["entry-points"]["plugrl"] == {"classifier_openai": "plugrl_classifier_openai"}
    assert any(d.replace(" ", "").startswith("openai>=1") for d in meta["project"]["dependencies"])
    # its decorator and record are the advantages plugin's, whose estimators call the classifier
    assert any(d.replace(" ", "").startswith("plugrl-advantages") for d in meta["project"]["dependencies"])


# =========================================================================== fake servers: plumbing and fallback


def test_a_valid_reply_over_http(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-fake-1")
    with StandInOpenAI('Here you go:\n```json\n{"groups": [1, 1, 2]}\n```') as server:
        opts = dict(base_url=server.base_url, model="judge", api_key_env="FAKE_KEY", max_tokens=64, temperature=0.3)
        assert classify_strategies("Make 8 from 3 and 5.", RESPONSES, **opts) == [1, 1, 2]
        (req,) = server.requests
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-fake-1"
    body = req["body"]
    assert body["model"] == "judge" and body["max_tokens"] == 64 and body["temperature"] == 0.3
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert all(r in body["messages"][1]["content"] for r in RESPONSES)


def test_json_schema_asks_for_structured_output_of_exactly_n_ids(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    with StandInOpenAI('{"groups":[3,3,1]}') as server:
        assert classify_strategies("p", RESPONSES, base_url=server.base_url, json_schema=True) == [3, 3, 1]
        assert classify_strategies("p", RESPONSES, base_url=server.base_url) == [3, 3, 1]
        with_schema, without = (r["body"] for r in server.requests)
    fmt = with_schema["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    groups = fmt["json_schema"]["schema"]["properties"]["groups"]
    assert groups == {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3}
    assert "response_format" not in without


def test_a_local_server_without_a_key_gets_the_dummy_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with StandInOpenAI('{"groups": [0, 1, 0]}') as server:
        assert classify_strategies("p", RESPONSES, base_url=server.base_url) == [0, 1, 0]
        assert server.requests[0]["auth"] == "Bearer EMPTY"
        assert server.requests[0]["body"]["model"] == "gpt-4o-mini"  # the default model name


def test_a_garbage_reply_raises_and_the_kernel_falls_back(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    garbage = "I think these solutions are all quite similar, but solution 2 is more elegant!!"
    with StandInOpenAI(garbage) as server:
        opts = {"base_url": server.base_url, "model": "m", "timeout_s": 5.0}
        with pytest.raises(ValueError, match="no JSON group ids"):
            classify_strategies("p", RESPONSES, **opts)
        ids, metrics = classify_groups(
            SPEC, ["p1", "p2"], [RESPONSES, RESPONSES[:2]], options=opts, concurrency=2, retries=3
        )
        assert len(server.requests) == 1 + 2 * 3  # every attempt reached the server
    assert ids == [0, 1, 2, 3, 4]  # one group per response, unique across prompts
    assert metrics == {"classifier/failures": 2.0, "classifier/retries": 4.0, "classifier/groups_mean": 2.5}


def test_a_server_that_is_down_falls_back_fast(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    opts = {"base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "m", "timeout_s": 2.0}
    with pytest.raises(Exception, match="[Cc]onnection"):
        classify_strategies("p", RESPONSES, **opts)
    t0 = time.monotonic()
    ids, metrics = classify_groups(SPEC, ["p"], [RESPONSES], options=opts, concurrency=1, retries=2)
    assert time.monotonic() - t0 < 10.0
    assert ids == [0, 1, 2] and metrics["classifier/failures"] == 1.0 and metrics["classifier/retries"] == 1.0


# =========================================================================== start-time checks (the plugin's hooks)


def run_config(tmp_path, options=None, **algorithm):
    """A creativity run's config (model path absent: a check that came after it would fail on it instead)."""
    from plugrl.config import build_config

    tree = {**CONFIG, "model": {"path": str(tmp_path / "no_model")}, "rollout": {"name": "hf"}}
    tree["algorithm"] = {**CONFIG["algorithm"], "classifier_options": options or {}, **algorithm}
    return build_config(tree)


def start_run(cfg, run_dir):
    """The trainer's start-up up to the first step, without the models: the checks, then plugrl_run_start."""
    from plugrl.plugins import PluginRun, check_algorithm, check_config, configure_plugins, load_plugins

    registry = configure_plugins(cfg, load_plugins(cfg.plugins), training=True)
    check_algorithm(cfg.algorithm, registry)
    check_config(cfg, registry)
    with PluginRun(registry, cfg, run_dir):
        pass


def test_a_missing_key_is_a_start_time_error(tmp_path, monkeypatch):
    from plugrl.config import ConfigError
    from plugrl.startup import check_run

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for cfg in (
        run_config(tmp_path),  # base_url: OpenAI's API, the default
        run_config(tmp_path, plugins=["advantages"], classifier=None),  # the default classifier, not named
    ):
        with pytest.raises(ConfigError) as info:
            check_run(cfg, training=True)  # before the model path is even looked at
        text = str(info.value)
        assert "before any model was loaded" in text
        assert (
            "plugin 'classifier_openai': the environment variable OPENAI_API_KEY "
            "(algorithm.classifier_options.api_key_env) is not set: the openai solution classifier needs an API key "
            "for https://api.openai.com/v1. Export it (export OPENAI_API_KEY=...)"
        ) in text
        assert "algorithm.classifier: off" in text  # the off switch is one of the fixes
    # the variable the options name is the one asked for
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one")
    with pytest.raises(ConfigError, match=r"environment variable MY_CLASSIFIER_KEY \(algorithm.classifier_options"):
        check_run(run_config(tmp_path, {"api_key_env": "MY_CLASSIFIER_KEY"}), training=True)
    # set: the classifier checks pass, and the next check is the model path
    monkeypatch.setenv("MY_CLASSIFIER_KEY", "sk-test")
    with pytest.raises(ConfigError, match="model.path .* does not exist"):
        check_run(run_config(tmp_path, {"api_key_env": "MY_CLASSIFIER_KEY"}), training=True)


def test_an_unreachable_base_url_stops_the_run_at_start(tmp_path, monkeypatch):
    from plugrl.plugins import PluginError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a local server needs no key
    url = f"http://127.0.0.1:{free_port()}/v1"  # a closed port: nothing listens there
    cfg = run_config(tmp_path, {"base_url": url, "model": "judge"})
    t0 = time.monotonic()
    with pytest.raises(PluginError) as info:
        start_run(cfg, tmp_path)
    assert time.monotonic() - t0 < 5.0  # refused at once, not a timeout per step
    text = str(info.value)
    assert "plugin 'classifier_openai': plugrl_run_start failed, so the run stops before training" in text
    assert f"cannot reach algorithm.classifier_options.base_url {url}: GET {url}/models failed" in text
    assert "Start the OpenAI-compatible server there" in text and "--served-model-name judge" in text
    assert "algorithm.classifier: off" in text
    # plugrl eval (no run directory) classifies nothing, so it needs no server
    start_run(cfg, None)
    # nor does a run with the classifier off
    start_run(run_config(tmp_path, {"base_url": url}, classifier="off"), tmp_path)


def test_a_rejected_key_stops_the_run_at_start(tmp_path, monkeypatch):
    from plugrl.plugins import PluginError

    with StandInOpenAI(models_status=401) as server:  # a server started with --api-key
        cfg = run_config(tmp_path, {"base_url": server.base_url, "model": "judge"})
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        with pytest.raises(PluginError) as info:
            start_run(cfg, tmp_path)
        text = str(info.value)
        assert f"rejected its key: GET {server.base_url}/models answered HTTP 401" in text
        assert "the dummy key EMPTY, as OPENAI_API_KEY is not set" in text
        assert "Set OPENAI_API_KEY to a key that server accepts" in text and "algorithm.classifier: off" in text
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-123")
        with pytest.raises(PluginError) as info:
            start_run(cfg, tmp_path)
        assert "to the key in $OPENAI_API_KEY" in str(info.value) and "sk-wrong" not in str(info.value)
        assert [g["auth"] for g in server.gets] == ["Bearer EMPTY", "Bearer sk-wrong-key-123"]
        assert server.requests == []  # no classification was attempted


def test_a_reachable_server_passes_with_one_cheap_request(tmp_path, monkeypatch, caplog):
    import logging

    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    with StandInOpenAI(models=("judge",)) as server:
        with caplog.at_level(logging.INFO, logger="plugrl.classifier_openai"):
            start_run(run_config(tmp_path, {"base_url": server.base_url, "model": "judge"}), tmp_path)
        assert [g["path"] for g in server.gets] == ["/v1/models"] and server.requests == []
        assert f"classifier openai: model judge at {server.base_url} (reachable)" in caplog.text
        assert "does not list" not in caplog.text
        # a model the server does not list: a warning (some servers answer to aliases they do not list)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="plugrl.classifier_openai"):
            start_run(run_config(tmp_path, {"base_url": server.base_url, "model": "judje"}), tmp_path)
        assert "does not list the model 'judje'" in caplog.text and "it lists judge" in caplog.text
    with pytest.raises(cls.ClassifierUnavailable, match="cannot reach"):  # the same server, stopped
        cls.check_server(cls.parse_options({"base_url": server.base_url}))


@pytest.mark.slow  # three real `plugrl train` runs, ~30 s: CI runs it (make test-all)
def test_plugrl_train_stops_at_start_and_says_what_to_do(tiny_model, tmp_path):
    """The command line, the real trainer: the creativity example with its classifier's server down stops
    before step 1; the same run with the classifier off trains; left unset with no key, it stops before the
    model loads."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    plugrl = [sys.executable, "-m", "plugrl.cli", "train", "examples/creativity_grpo_weighted.yaml"]
    tiny = [
        f"model.path={tiny_model}",
        "model.dtype=float32",
        "rollout.name=hf",
        "rollout.n=2",
        "data.train_batch_size=2",
        "data.max_response_length=8",
        "trainer.total_steps=1",
        f"trainer.output_dir={tmp_path}",
        "trainer.save_freq=0",
    ]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    url = f"http://127.0.0.1:{free_port()}/v1"  # a closed port

    def train(*overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*plugrl, *tiny, *overrides], capture_output=True, text=True, env=env, cwd=root, timeout=600
        )

    tiny.append(f"algorithm.classifier_options.base_url={url}")
    down = train("trainer.experiment_name=down")
    assert down.returncode != 0
    assert f"cannot reach algorithm.classifier_options.base_url {url}" in down.stderr, down.stderr[-3000:]
    assert "algorithm.classifier: off" in down.stderr and "Traceback" not in down.stderr
    logged = tmp_path / "down" / "metrics.jsonl"
    assert not logged.exists() or not logged.read_text().strip()  # not one step
    off = train("algorithm.classifier=off", "trainer.experiment_name=no_classifier")  # server still down
    assert off.returncode == 0, off.stderr[-3000:]
    assert "algorithm.classifier is off: classifying is off" in off.stderr
    (step,) = [json.loads(line) for line in (tmp_path / "no_classifier" / "metrics.jsonl").read_text().splitlines()]
    assert step["classifier/failures"] == 0.0 and step["classifier/groups_mean"] == 2.0  # rollout.n = 2
    assert step["creativity/weight_min"] == step["creativity/weight_max"] == 1.0
    del tiny[-1]  # base_url: OpenAI's API, the default
    unset = train("algorithm.classifier=null", "algorithm.classifier_options={}", "trainer.experiment_name=unset")
    assert unset.returncode == 2
    assert "OPENAI_API_KEY (algorithm.classifier_options.api_key_env) is not set" in unset.stderr
    assert "before any model was loaded" in unset.stderr


# =========================================================================== launch: true (the kernel's managed server)

# The stand-in server of tests/stand_in_openai.py, as a process plugrl_model_servers starts in vLLM's place
# (servers.vllm_command is swapped): it lists the served name at GET /v1/models and answers every chat completion
# with a grouping of n = 3. Its own arguments, passed as launch_args, make it slow to start (--delay S) or exit at
# once (--exit CODE).


@pytest.fixture
def launch_stand_in(monkeypatch):
    """plugrl_model_servers starts the stand-in where it would start vLLM; the commands asked for are recorded."""
    import plugrl_model_servers as servers

    stand_in = stand_in_openai.vllm_command("--reply", '{"groups": [4, 4, 9]}')
    asked: list[tuple] = []

    def command(model_path, served_name, port, args=()):
        asked.append((model_path, served_name, port, tuple(args)))
        return stand_in(model_path, served_name, port, args)

    monkeypatch.setattr(servers, "vllm_command", command)
    yield asked
    servers.stop_all(grace_s=2.0)


def launch_options(port, **more):
    return {"launch": True, "model": "judge", "base_url": f"http://127.0.0.1:{port}/v1", **more}


def test_launch_option_errors_name_their_key():
    """Checked by the kernel at start-up, before any model loads or any server starts."""
    from plugrl.config import ConfigError

    for options, named in (
        ({"launch": "yes"}, "algorithm.classifier_options.launch: must be true or false"),
        (  # launch without a base_url: the default is OpenAI's API, which cannot be launched
            {"launch": True, "model": "local:SmolLM2-135M-Instruct"},
            "algorithm.classifier_options.base_url: must be http://127.0.0.1:PORT/v1 (with an explicit port) with "
            "launch: true",
        ),
        (
            {"launch": True, "model": "m", "base_url": "http://10.0.0.7:8000/v1"},
            "algorithm.classifier_options.base_url: must be http://127.0.0.1:PORT/v1",
        ),
        (
            {"launch": True, "model": "m", "base_url": "http://127.0.0.1/v1"},  # no port
            "algorithm.classifier_options.base_url: must be http://127.0.0.1:PORT/v1 (with an explicit port)",
        ),
        (
            {"launch": True, "base_url": "http://127.0.0.1:8011/v1"},  # the default model: OpenAI's
            "algorithm.classifier_options.model: must name the model the launched server loads with launch: true",
        ),
        (
            launch_options(8011, launch_args=["--max-model-len", "2048", "--port=9"]),
            "algorithm.classifier_options.launch_args: must not set --port with launch: true",
        ),
        (
            launch_options(8011, launch_args="--served-model-name x --host 0.0.0.0"),
            "algorithm.classifier_options.launch_args: must not set --host, --served-model-name with launch: true",
        ),
        (launch_options(8011, launch_args={"a": 1}), "algorithm.classifier_options.launch_args: must be a list"),
        (launch_options(8011, launch_timeout_s=0), "algorithm.classifier_options.launch_timeout_s: must be > 0"),
    ):
        with pytest.raises(ConfigError, match=re.escape(named)):
            checked_config(options)
    # valid: a string of arguments is split; without launch the same arguments are left alone
    options = checked_config(launch_options(8011, launch_args="--max-model-len 2048")).algorithm.classifier_options
    assert options["launch"] is True and options["launch_args"] == ["--max-model-len", "2048"]
    assert options["launch_timeout_s"] == 300.0
    local = {"launch_args": ["--port", "9"], "base_url": "http://127.0.0.1:8011/v1"}
    assert checked_config(local).algorithm.classifier_options["launch"] is False
    # the classifier parses the same options when called directly
    with pytest.raises(ValueError, match=re.escape("algorithm.classifier_options.base_url must be http://127.0.0.1")):
        classify_strategies("p", ["a", "b"], launch=True, model="m")


def test_launch_through_the_hooks_with_a_stand_in(tmp_path, monkeypatch, launch_stand_in):
    """launch: true starts the classifier's server with plugrl_model_servers in plugrl_run_start (waiting for it, here
    1.5 s, instead of failing the reachability check), the classifier uses it, plugrl_run_end stops it."""
    import plugrl_model_servers as servers
    from plugrl.plugins import PluginRun, check_algorithm, check_config, configure_plugins, load_plugins

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a launched server needs no key
    port = free_port()
    run_dir = tmp_path / "run"
    cfg = run_config(tmp_path, launch_options(port, launch_args=["--delay", "1.5"], launch_timeout_s=30))
    registry = configure_plugins(cfg, load_plugins(cfg.plugins), training=True)
    check_algorithm(cfg.algorithm, registry)
    check_config(cfg, registry)
    options = cfg.algorithm.classifier_options
    with PluginRun(registry, cfg, run_dir):
        server = servers.running()[port]
        assert server.where == "algorithm.classifier_options" and server.healthy()
        assert launch_stand_in == [("judge", "judge", port, ("--delay", "1.5"))]
        ids, metrics = classify_groups(SPEC, ["p"], [RESPONSES], options=options, concurrency=1, retries=1)
        assert ids == [0, 0, 1] and metrics["classifier/failures"] == 0.0
    assert not server.alive() and port not in servers.running() and not servers.port_in_use(port)
    assert "stand-in serving judge" in (run_dir / "classifier_server.log").read_text()
    # plugrl eval (no run directory) classifies nothing: no server is launched
    with PluginRun(registry, cfg, None):
        assert servers.running() == {}


def test_a_launched_server_that_fails_stops_the_run_at_start(tmp_path, monkeypatch, launch_stand_in):
    """A server that exits, or does not answer within launch_timeout_s, stops the run before training with the
    tail of its log and the option to change; it is not left running."""
    import plugrl_model_servers as servers
    from plugrl.plugins import PluginError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    port = free_port()
    with pytest.raises(PluginError) as info:
        start_run(run_config(tmp_path, launch_options(port, launch_args=["--exit", "3"])), tmp_path)
    text = str(info.value)
    assert "plugin 'classifier_openai': plugrl_run_start failed, so the run stops before training" in text
    assert "the server for algorithm.classifier_options exited with code 3 during start-up" in text
    assert "stand-in: exiting at once" in text and str(tmp_path / "classifier_server.log") in text
    cfg = run_config(tmp_path, launch_options(port, launch_args=["--delay", "60"], launch_timeout_s=1))
    with pytest.raises(PluginError) as info:
        start_run(cfg, tmp_path)
    assert "did not answer GET" in str(info.value) and "raise algorithm.classifier_options.launch_timeout_s" in str(
        info.value
    )
    assert servers.running() == {} and not servers.port_in_use(port)


def test_run_end_leaves_a_server_another_plugin_launched(tmp_path, launch_stand_in):
    """Two plugins may share one launched server (same model, same port): the classifier stops only its own."""
    from types import SimpleNamespace

    import plugrl_model_servers as servers

    port = free_port()
    theirs = servers.start("judge", port, where="reward.options.judge", timeout_s=30)
    config = SimpleNamespace(algorithm=SimpleNamespace(classifier="openai", classifier_options=launch_options(port)))
    cls.plugrl_run_start(config=config, run_dir=tmp_path)  # the judge's server, already there, is used
    cls.plugrl_run_end(config=config, run_dir=tmp_path, error=None)
    assert theirs.healthy()
    servers.stop(port)
    cls.plugrl_run_end(config=None, run_dir=None, error=RuntimeError("x"))  # never raises


# =========================================================================== a real vLLM server (SmolLM2-135M-Instruct)


@pytest.mark.slow
def test_real_server_round_trip(openai_server):
    """A 135M model rarely writes a valid grouping: either n ids or a ValueError, after a real HTTP exchange."""
    before = openai_server.requests_served()
    opts = {"base_url": openai_server.base_url, "model": openai_server.model, "max_tokens": 48, "timeout_s": 60.0}
    try:
        ids = classify_strategies("Using the numbers 3 and 5, make 8.", RESPONSES, **opts)
    except ValueError as e:  # no valid grouping in the reply: what the kernel retries, then replaces
        assert "group ids" in str(e) or "empty" in str(e)
    else:
        assert len(ids) == 3 and all(isinstance(i, int) for i in ids)
    assert openai_server.requests_served() == before + 1
    # the start-time check: one GET /models, which lists the served name
    assert openai_server.model in cls.check_server(cls.parse_options(opts))
    # structured output: the server decodes against the schema, so even this model's reply parses
    ids = classify_strategies("Using the numbers 3 and 5, make 8.", RESPONSES, **opts, json_schema=True)
    assert len(ids) == 3 and all(isinstance(i, int) for i in ids)
    before += 1
    # through the kernel: always n ids, a failure counted at most once per prompt
    ids, metrics = classify_groups(SPEC, ["Make 8."], [RESPONSES], options=opts, concurrency=1, retries=1)
    assert len(ids) == 3 and metrics["classifier/failures"] in (0.0, 1.0)
    assert openai_server.requests_served() == before + 2


@pytest.mark.slow
def test_grpo_weighted_trains_against_the_real_server(openai_server, tiny_model, tmp_path):
    """examples/creativity_grpo_weighted.yaml for 2 steps: tiny policy (HF engine), SmolLM2 as the classifier."""
    import os

    from test_e2e import metrics, run_plugrl, tiny_overrides

    before = openai_server.requests_served()
    run_plugrl(
        [
            "train",
            "examples/creativity_grpo_weighted.yaml",
            *tiny_overrides(tiny_model, tmp_path, 2),
            f"algorithm.classifier_options.base_url={openai_server.base_url}",
            f"algorithm.classifier_options.model={openai_server.model}",
            "algorithm.classifier_options.max_tokens=32",  # keep the 135M model's ramble short
            "algorithm.classifier_retries=1",
        ],
        env=dict(os.environ, OPENAI_API_KEY="EMPTY"),
    )
    m = metrics(tmp_path / "e2e")
    assert [x["step"] for x in m] == [1, 2]
    for x in m:
        for key in ("weight_mean", "weight_min", "weight_max", "grpo_adv_mean", "groups_mean"):
            assert f"creativity/{key}" in x, key
        assert 0.0 < x["creativity/weight_min"] <= x["creativity/weight_mean"] <= x["creativity/weight_max"] <= 1.0
        assert 1.0 <= x["creativity/groups_mean"] <= 4.0  # rollout.n = 4
        assert x["classifier/failures"] in (0.0, 1.0, 2.0)  # 2 prompts per step
        assert x["classifier/groups_mean"] == x["creativity/groups_mean"]
        assert x["timing/classify"] > 0 and "actor/kl_loss" in x
    assert openai_server.requests_served() == before + 4  # 2 steps x 2 prompts, one attempt each
