"""Grouping responses by strategy with a pluggable classifier: ids, retries, fallback; and algorithm.classifier at
start-up: the default (openai) for estimators that group by strategy, the off switch (off)."""

from __future__ import annotations

import logging

import pytest

from plugrl.classify import OFF, classify_groups, one_group_per_response
from plugrl.config import ConfigError, build_config
from plugrl.plugins import PluginError, installed_plugins
from plugrl.specs import ClassifierSpec
from plugrl.startup import check_run


def by_first_word(prompt, responses, **_):
    return [hash(r.split()[0]) % 1000 for r in responses]


def test_groups_are_renumbered_and_unique_across_prompts():
    spec = ClassifierSpec("words", by_first_word)
    ids, m = classify_groups(
        spec, ["p1", "p2"], [["add 1", "add 2", "mul 3"], ["sub 1", "sub 2"]], options={}, concurrency=2, retries=3
    )
    # prompt 1: {add, add, mul} -> 0, 0, 1; prompt 2 starts at offset 3: {sub, sub} -> 3, 3
    assert ids == [0, 0, 1, 3, 3]
    assert m == {"classifier/failures": 0.0, "classifier/retries": 0.0, "classifier/groups_mean": 1.5}


def test_retries_then_falls_back_to_one_group_per_response():
    calls = {"n": 0}

    def flaky(prompt, responses, **_):
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionError("server down")
        return [0] * len(responses)

    ids, m = classify_groups(ClassifierSpec("flaky", flaky), ["p"], [["a", "b"]], options={}, concurrency=1, retries=3)
    assert ids == [0, 0] and m["classifier/retries"] == 2 and m["classifier/failures"] == 0

    def garbage(prompt, responses, **_):
        return ["x"]  # wrong length and type

    ids, m = classify_groups(
        ClassifierSpec("g", garbage), ["p"], [["a", "b", "c"]], options={}, concurrency=1, retries=2
    )
    assert ids == [0, 1, 2] and m["classifier/failures"] == 1 and m["classifier/retries"] == 1


def test_async_classifier_and_options():
    async def by_option(prompt, responses, *, same: bool):
        return [0 if same else i for i in range(len(responses))]

    ids, _ = classify_groups(
        ClassifierSpec("a", by_option), ["p"], [["a", "b"]], options={"same": True}, concurrency=1, retries=1
    )
    assert ids == [0, 0]


# =========================================================================== algorithm.classifier at start-up


MINIMAL = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}}


def run_config(model_path, plugins=("advantages",), **algorithm):
    return build_config(
        {
            "plugins": list(plugins),
            "model": {"path": str(model_path)},
            "data": {"train_files": ["t.jsonl"]},  # check_run reads no data
            "rollout": {"name": "hf"},
            "algorithm": {"adv_estimator": "grpo_weighted_mul", **algorithm},
        }
    )


def test_a_weighted_estimator_without_a_classifier_gets_the_openai_classifier(smollm2_path, monkeypatch, caplog):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")  # api.openai.com needs one; nothing is sent
    cfg = run_config(smollm2_path)  # plugins: [advantages] only, as the creativity fork's users write it
    assert cfg.algorithm.classifier is None
    with caplog.at_level(logging.INFO, logger="plugrl.classify"):
        run = check_run(cfg, training=True)
    assert cfg.algorithm.classifier == "openai"
    assert cfg.plugins == ["advantages", "classifier_openai"]  # added, so the run's config.yaml says what ran
    spec = run.registry.classifiers["openai"]
    assert spec.plugin == "classifier_openai" and run.estimator.name == "grpo_weighted_mul"
    # the plugin's declared options were validated and filled in: its default model and OpenAI's API
    options = cfg.algorithm.classifier_options
    assert options["model"] == "gpt-4o-mini" and options["base_url"] == "https://api.openai.com/v1"
    assert options["api_key_env"] == "OPENAI_API_KEY"
    said = [r.getMessage() for r in caplog.records if "algorithm.classifier not set" in r.getMessage()]
    assert len(said) == 1 and "'openai'" in said[0] and "algorithm.classifier: off" in said[0]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage() in said)
    # its plugin named already: loaded once, not twice
    cfg = run_config(smollm2_path, plugins=("classifier_openai", "advantages"))
    check_run(cfg, training=True)
    assert cfg.plugins == ["classifier_openai", "advantages"] and cfg.algorithm.classifier == "openai"
    # the classifier named, its plugin not: the plugin is added as for the default
    cfg = run_config(smollm2_path, classifier="openai")
    assert check_run(cfg, training=True).registry.classifiers["openai"].plugin == "classifier_openai"
    assert cfg.plugins == ["advantages", "classifier_openai"]


def test_a_classifier_written_as_null_gets_the_default_with_a_warning(smollm2_path, monkeypatch, caplog):
    """null (None, ~) is "not set": the default classifier. It reads like "no classifier", so a warning says so."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    cfg = build_config(
        {**MINIMAL, "model": {"path": str(smollm2_path)}, "rollout": {"name": "hf"}, "plugins": ["advantages"]},
        ["algorithm.adv_estimator=grpo_weighted_add", "algorithm.classifier=None"],
    )
    with caplog.at_level(logging.INFO, logger="plugrl.classify"):
        check_run(cfg, training=True)
    assert cfg.algorithm.classifier == "openai"
    (record,) = [r for r in caplog.records if "algorithm.classifier is null" in r.getMessage()]
    assert record.levelno == logging.WARNING and "algorithm.classifier: off to switch it off" in record.getMessage()


def test_the_default_classifier_not_installed_is_named_at_start(tmp_path, monkeypatch):
    """A copy of the plugin's distribution without its entry point, first on sys.path, shadows the installed one:
    to plugin discovery (importlib.metadata: the first distribution of a name wins) the plugin is not installed."""
    shadow = tmp_path / "plugrl_classifier_openai-0.1.0.dist-info"
    shadow.mkdir()
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: plugrl-classifier-openai\nVersion: 0.1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "classifier_openai" not in {p.name for p in installed_plugins()}
    cfg = run_config(tmp_path / "no_model")  # the error comes before the model path is looked at
    with pytest.raises(PluginError) as info:
        check_run(cfg, training=True)
    text = str(info.value)
    assert "algorithm.classifier is not set, so it defaults to 'openai'" in text
    assert "pip install plugrl-classifier-openai" in text and "pip install -e plugins/classifier_openai" in text
    assert "algorithm.classifier: off" in text  # or train without one
    assert cfg.plugins == ["advantages"]
    # named, it is the same plugin to install
    with pytest.raises(PluginError, match="algorithm.classifier is 'openai', the classifier of the plugin") as info:
        check_run(run_config(tmp_path / "no_model", classifier="openai"), training=True)
    assert "pip install plugrl-classifier-openai" in str(info.value)


@pytest.mark.parametrize("spelling", ["off", "OFF", " off ", False, "false", "none", "no"])
def test_the_off_switch_is_spelt_off(spelling):
    cfg = build_config({**MINIMAL, "algorithm": {"classifier": spelling}})
    assert cfg.algorithm.classifier == OFF == "off"
    # YAML reads `off` as false: the command line's override means the same
    assert build_config(MINIMAL, ["algorithm.classifier=off"]).algorithm.classifier == "off"
    assert build_config(MINIMAL, ["algorithm.classifier=none"]).algorithm.classifier == "off"
    # None is null in plugrl's YAML, as in Python: not set, so the default (a warning says so at start)
    assert build_config(MINIMAL, ["algorithm.classifier=None"]).algorithm.classifier is None
    assert build_config(MINIMAL, ["algorithm.classifier=null"]).algorithm.classifier is None  # unset: the default


def test_true_is_no_classifier_name():
    with pytest.raises(ConfigError) as info:
        build_config(MINIMAL, ["algorithm.classifier=on"])  # YAML: true
    text = str(info.value)
    assert "classifier true" in text and "algorithm.classifier" in text and "off to switch it off" in text


def test_classifier_off_switches_classifying_off(smollm2_path, monkeypatch, caplog):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # no key, no server: nothing asks for them
    cfg = run_config(smollm2_path, classifier="off", classifier_options={"base_url": "http://127.0.0.1:1/v1"})
    with caplog.at_level(logging.INFO, logger="plugrl.classify"):
        run = check_run(cfg, training=True)
    assert cfg.algorithm.classifier == "off" and cfg.plugins == ["advantages"]  # no classifier plugin added
    spec = run.registry.classifiers["off"]
    assert spec.fn is one_group_per_response and spec.plugin == "plugrl"
    said = [r.getMessage() for r in caplog.records if "classifying is off" in r.getMessage()]
    assert len(said) == 1 and "grpo_weighted_mul is plain grpo" in said[0]
    # what the trainer does with it: every response its own group, nothing fails
    ids, metrics = classify_groups(
        spec,
        ["p1", "p2"],
        [["a", "a", "b"], ["c", "c"]],
        options=cfg.algorithm.classifier_options,
        concurrency=2,
        retries=1,
    )
    assert ids == [0, 1, 2, 3, 4]
    assert metrics == {"classifier/failures": 0.0, "classifier/retries": 0.0, "classifier/groups_mean": 2.5}


def test_a_plugin_may_not_take_the_name_off(smollm2_path, local_plugin):
    name = local_plugin(
        "takes_off",
        """
        import plugrl

        @plugrl.solution_classifier("off")
        def everything_same(prompt, responses):
            return [0] * len(responses)
        """,
    )
    with pytest.raises(PluginError, match="plugin 'takes_off:' registers a solution classifier named 'off'"):
        check_run(run_config(smollm2_path, plugins=("advantages", f"{name}:"), classifier="off"), training=True)


def test_runs_that_classify_nothing_check_no_classifier(smollm2_path, monkeypatch, caplog):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # would be a start-time error if the classifier were used
    # plugrl eval of a creativity run: the same config, nothing classified, no key asked for
    cfg = run_config(smollm2_path, plugins=("advantages", "classifier_openai"), classifier="openai")
    check_run(cfg, training=False)
    assert cfg.algorithm.classifier is None
    # an estimator that groups nothing: the classifier named is not used, and a warning says so
    cfg = run_config(smollm2_path, plugins=("advantages", "classifier_openai"), classifier="openai")
    cfg.algorithm.adv_estimator = "grpo"
    with caplog.at_level(logging.WARNING, logger="plugrl.classify"):
        check_run(cfg, training=True)
    assert cfg.algorithm.classifier is None
    assert any("algorithm.classifier 'openai' is not used" in r.getMessage() for r in caplog.records)
