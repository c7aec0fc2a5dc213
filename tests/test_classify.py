"""Grouping responses by strategy with a pluggable classifier (the advantages plugin's own kind of record): ids,
retries, fallback; algorithm.classifier at start-up: the default (openai) for estimators that group by strategy,
the off switch (off); and the groups an estimator gets through its step context."""

from __future__ import annotations

import logging

import pytest
import torch

from plugrl.algorithms import AdvantageBatch, StepContext, response_mask
from plugrl.config import ConfigError, build_config
from plugrl.plugins import PluginError, check_config, installed_plugins, load_plugins
from plugrl.startup import check_run
from plugrl_advantages.classify import (
    OFF,
    OFF_SPEC,
    ClassifierSpec,
    classify_groups,
    find_classifier,
    one_group_per_response,
    settings,
    solution_groups,
)

LOGGER = "plugrl.advantages"


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
    assert "classifier" not in cfg.algorithm.model_extra  # a key of the plugin: the kernel has no default for it
    with caplog.at_level(logging.INFO, logger=LOGGER):
        run = check_run(cfg, training=True)
    assert cfg.algorithm.classifier == "openai"
    assert cfg.plugins == ["advantages", "classifier_openai"]  # added, so the run's config.yaml says what ran
    spec = find_classifier(run.registry, "openai")
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
    assert find_classifier(check_run(cfg, training=True).registry, "openai").plugin == "classifier_openai"
    assert cfg.plugins == ["advantages", "classifier_openai"]


def test_a_classifier_written_as_null_gets_the_default_with_a_warning(smollm2_path, monkeypatch, caplog):
    """null (None, ~) is "not set": the default classifier. It reads like "no classifier", so a warning says so."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    cfg = build_config(
        {**MINIMAL, "model": {"path": str(smollm2_path)}, "rollout": {"name": "hf"}, "plugins": ["advantages"]},
        ["algorithm.adv_estimator=grpo_weighted_add", "algorithm.classifier=None"],
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
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


WEIGHTED = {**MINIMAL, "plugins": ["advantages"], "algorithm": {"adv_estimator": "grpo_weighted_mul"}}


def checked(tree, overrides=()):
    """The config after the start-up check of its options (the estimator's, which declare the classifier keys)."""
    cfg = build_config(tree, list(overrides))
    check_config(cfg, load_plugins(cfg.plugins))
    return cfg


@pytest.mark.parametrize("spelling", ["off", "OFF", " off ", False, "false", "none", "no"])
def test_the_off_switch_is_spelt_off(spelling):
    cfg = checked({**WEIGHTED, "algorithm": {**WEIGHTED["algorithm"], "classifier": spelling}})
    assert cfg.algorithm.classifier == OFF == "off"
    # YAML reads `off` as false: the command line's override means the same
    assert checked(WEIGHTED, ["algorithm.classifier=off"]).algorithm.classifier == "off"
    assert checked(WEIGHTED, ["algorithm.classifier=none"]).algorithm.classifier == "off"
    # None is null in plugrl's YAML, as in Python: not set, so the default (a warning says so at start)
    assert build_config(WEIGHTED, ["algorithm.classifier=None"]).algorithm.classifier is None
    assert build_config(WEIGHTED, ["algorithm.classifier=null"]).algorithm.classifier is None  # unset: the default


def test_true_is_no_classifier_name():
    with pytest.raises(ConfigError) as info:
        checked(WEIGHTED, ["algorithm.classifier=on"])  # YAML: true
    text = str(info.value)
    assert "before any model was loaded" in text  # the options' check at start, as every plugin key's
    assert "classifier true" in text and "algorithm.classifier" in text and "off to switch it off" in text


def test_the_classifier_keys_keep_their_defaults():
    cfg = checked(WEIGHTED)
    assert (cfg.algorithm.classifier_options, cfg.algorithm.classifier_concurrency) == ({}, 8)
    assert cfg.algorithm.classifier_retries == 3 and cfg.algorithm.classifier is None  # settled at start (openai)
    for key, value in (("classifier_concurrency", 0), ("classifier_retries", 0)):
        with pytest.raises(ConfigError, match=f"algorithm.{key}: Input should be greater than or equal to 1"):
            checked(WEIGHTED, [f"algorithm.{key}={value}"])


def test_classifier_off_switches_classifying_off(smollm2_path, monkeypatch, caplog):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # no key, no server: nothing asks for them
    cfg = run_config(smollm2_path, classifier="off", classifier_options={"base_url": "http://127.0.0.1:1/v1"})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        run = check_run(cfg, training=True)
    assert cfg.algorithm.classifier == "off" and cfg.plugins == ["advantages"]  # no classifier plugin added
    spec = find_classifier(run.registry, "off")
    assert spec is OFF_SPEC and spec.fn is one_group_per_response and spec.plugin == "advantages"
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
        from plugrl_advantages.classify import solution_classifier

        @solution_classifier("off")
        def everything_same(prompt, responses):
            return [0] * len(responses)
        """,
    )
    with pytest.raises(ConfigError, match="plugin 'takes_off:' registers a solution classifier named 'off'"):
        check_run(run_config(smollm2_path, plugins=("advantages", f"{name}:"), classifier="off"), training=True)


def test_runs_that_classify_nothing_check_no_classifier(smollm2_path, monkeypatch, caplog):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # would be a start-time error if the classifier were used
    # plugrl eval of a creativity run: the same config, nothing classified, no key asked for
    cfg = run_config(smollm2_path, plugins=("advantages", "classifier_openai"), classifier="openai")
    check_run(cfg, training=False)
    assert cfg.algorithm.classifier is None
    # an estimator that groups nothing: the classifier named is not used, and a warning says so
    cfg = run_config(
        smollm2_path, plugins=("advantages", "classifier_openai"), classifier="openai", classifier_retries=2
    )
    cfg.algorithm.adv_estimator = "grpo"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        check_run(cfg, training=True)  # grpo declares no classifier keys: they are removed, not refused
    assert getattr(cfg.algorithm, "classifier", None) is None and "classifier_retries" not in cfg.algorithm.model_extra
    assert any(
        "algorithm.classifier 'openai' is not used" in r.getMessage()
        and "grpo_weighted_add and grpo_weighted_mul do" in r.getMessage()
        for r in caplog.records
    )


def test_a_name_nothing_registers_is_named_at_start(smollm2_path):
    with pytest.raises(ConfigError) as info:
        check_run(
            run_config(smollm2_path, plugins=("advantages", "classifier_openai"), classifier="opneai"), training=True
        )
    assert (
        "plugin 'advantages': algorithm.adv_estimator 'grpo_weighted_mul' groups responses by strategy and needs "
        "algorithm.classifier; got 'opneai', registered classifiers: openai"
    ) in str(info.value)


# =========================================================================== a plugin's classifier and its options

CLASSIFIER_PLUGIN = """
from pydantic import BaseModel, Field
from plugrl_advantages.classify import solution_classifier

class ScaleOptions(BaseModel):
    scale: float = Field(1.0, gt=0)
    label: str = "x"

@solution_classifier("cls", options=ScaleOptions)
def cls(prompt, responses, scale, label):
    return [0] * len(responses)

@solution_classifier("one_arg")
def one_arg(prompt):
    return [0]
"""


def test_a_plugins_classifier_options_are_validated_and_filled_in(local_plugin):
    name = f"{local_plugin('cls_opts', CLASSIFIER_PLUGIN)}:"
    tree = {**MINIMAL, "plugins": ["advantages", name]}
    cfg = checked({**tree, "algorithm": {"adv_estimator": "grpo_weighted_add", "classifier": "cls"}})
    assert cfg.algorithm.classifier_options == {"scale": 1.0, "label": "x"}  # defaults filled in
    registry = load_plugins(cfg.plugins)
    assert find_classifier(registry, "cls").plugin == name
    for options, problem in (
        ({"scale": -1}, "algorithm.classifier_options.scale: Input should be greater than 0 (got -1)"),
        ({"scael": 2}, "unknown key 'algorithm.classifier_options.scael'; did you mean"),
    ):
        algorithm = {"adv_estimator": "grpo_weighted_add", "classifier": "cls", "classifier_options": options}
        with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            checked({**tree, "algorithm": algorithm})
    with pytest.raises(ConfigError, match=r"is called as fn\(prompt, responses, \*\*options\), but its signature is"):
        checked({**tree, "algorithm": {"adv_estimator": "grpo_weighted_add", "classifier": "one_arg"}})


def test_two_plugins_registering_one_name_is_a_clash(local_plugin):
    a, b = (f"{local_plugin(n, CLASSIFIER_PLUGIN)}:" for n in ("cls_a", "cls_b"))
    tree = {**MINIMAL, "plugins": ["advantages", a, b]}
    with pytest.raises(ConfigError, match="solution classifier 'cls' is registered by two plugins"):
        checked({**tree, "algorithm": {"adv_estimator": "grpo_weighted_add", "classifier": "cls"}})


def test_plugrl_plugins_lists_a_plugins_classifiers():
    from plugrl_commands.plugins_list import describe

    assert describe(load_plugins(["classifier_openai"]))["classifier_openai"] == {"classifiers": ["openai"]}


# =========================================================================== through the estimator's step context


def batch_of(groups, texts=True, registry=None, **context):
    """Responses of 1 token, one prompt per group id; response i's text ``r<i % 2>`` (two strategies a prompt)."""
    n = len(groups)
    return AdvantageBatch(
        token_level_rewards=torch.zeros(n, 1),
        response_mask=response_mask([1] * n),
        group_ids=torch.tensor(groups),
        prompts=[f"p{g}" for g in groups] if texts else [],
        responses=[f"r{i % 2}" for i in range(n)] if texts else [],
        context=StepContext(registry=registry, **context),
    )


def by_text(prompt, responses, **_):
    return [int(r[1:]) for r in responses]


def test_solution_groups_scatter_each_prompts_ids_back_to_its_rows():
    registry = load_plugins([])
    registry.plugin_records.append(ClassifierSpec("by_text", by_text, plugin="t"))
    cfg = build_config({**MINIMAL, "algorithm": {"classifier": "by_text", "classifier_concurrency": 2}}).algorithm
    # rows of prompt 0: 0, 2, 3 (texts r0, r0, r1): ids 0, 0, 1; of prompt 1 (from offset 3): 1, 4 (r1, r0): 3, 4
    ids, metrics = solution_groups(batch_of([0, 1, 0, 0, 1], registry=registry), cfg)
    assert ids.dtype == torch.int64 and ids.tolist() == [0, 3, 0, 1, 4]
    assert metrics["classifier/groups_mean"] == 2.0 and metrics["classifier/failures"] == 0.0
    assert metrics["timing/classify"] >= 0.0
    # the classifier is found through the registry of the step context: none, a clear error
    with pytest.raises(ValueError, match="batch.context.registry"):
        solution_groups(batch_of([0, 0]), cfg)
    # and it needs the texts of each prompt's responses
    with pytest.raises(ValueError, match="batch.prompts holds 0 texts for 2 rows"):
        solution_groups(batch_of([0, 0], texts=False, registry=registry), cfg)


def test_off_and_unsettled_need_no_classifier_nor_texts():
    for algorithm in ({"classifier": "off"}, {}):  # {}: a config no start-up settled (a test's)
        cfg = build_config({**MINIMAL, "algorithm": algorithm}).algorithm
        assert settings(cfg).classifier in (None, OFF)
        ids, metrics = solution_groups(batch_of([0, 0, 1], texts=False), cfg)
        assert ids.tolist() == [0, 1, 2] and metrics["classifier/groups_mean"] == 1.5


def test_the_first_rank_of_a_tensor_parallel_group_classifies_for_all():
    """StepContext.share: the lead computes, the others take what the group's broadcast gives them."""
    registry = load_plugins([])
    calls = []

    def counted(prompt, responses, **_):
        calls.append(prompt)
        return [0] * len(responses)

    registry.plugin_records.append(ClassifierSpec("counted", counted, plugin="t"))
    cfg = build_config({**MINIMAL, "algorithm": {"classifier": "counted"}}).algorithm
    sent = []

    def broadcast(obj):  # the group's broadcast, as the trainer makes it: the lead's object for every rank
        sent.append(obj)
        return sent[0]

    lead_ids, _ = solution_groups(batch_of([0, 0], registry=registry, tp_lead=True, tp_broadcast=broadcast), cfg)
    other_ids, _ = solution_groups(batch_of([0, 0], registry=registry, tp_lead=False, tp_broadcast=broadcast), cfg)
    assert calls == ["p0"] and sent[1] is None and other_ids.tolist() == lead_ids.tolist() == [0, 0]
