"""Run configuration: YAML + dotted overrides, verl spellings, error messages, redaction."""

from __future__ import annotations

import copy
import functools
import re
import string
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrl.config import (
    Config,
    ConfigError,
    build_config,
    dump_config,
    ignored_keys,
    load_config,
    parse_override,
    redact,
)

BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}


def write(tmp_path, text: str, name: str = "run.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tree=BASE, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(copy.deepcopy(tree), list(overrides))
    return str(info.value)


# --- YAML + overrides ------------------------------------------------------------------------------------------


def test_yaml_file_and_dotted_overrides(tmp_path):
    path = write(
        tmp_path,
        """
        plugins: [countdown, advantages]
        model:
          path: /models/policy
        data:
          dataset: countdown
          train_batch_size: 8
        rollout:
          n: 4
        actor:
          optim:
            lr: 2.0e-6
        """,
    )
    cfg = load_config(
        path,
        [
            "rollout.n=2",
            "data.train_batch_size=4",
            r'rollout.stop=[</answer>, "\n\n"]',  # as typed on a shell: YAML escapes in double quotes
            "trainer.val_before_train=true",
            "actor.optim.lr=1e-6",
            "+algorithm.norm_adv_by_std_in_grpo=false",  # hydra's "+key=value"
            "trainer.experiment_name=",  # empty value: the empty string
        ],
    )
    assert isinstance(cfg, Config)
    assert cfg.plugins == ["countdown", "advantages"]
    assert cfg.model.path == "/models/policy"
    assert cfg.data.dataset == "countdown"
    assert cfg.rollout.n == 2  # the override wins over the file
    assert cfg.data.train_batch_size == 4
    assert cfg.rollout.stop == ["</answer>", "\n\n"]
    assert cfg.trainer.val_before_train is True
    assert cfg.actor.optim.lr == pytest.approx(1e-6)
    assert isinstance(cfg.actor.optim.lr, float)
    assert cfg.algorithm.norm_adv_by_std_in_grpo is False
    assert cfg.trainer.experiment_name == ""
    assert cfg.mini_batch_size == 4  # defaults to the batch size
    assert cfg._ignored_verl_keys == []


def test_override_values_are_parsed_as_yaml():
    assert parse_override("rollout.stop=[a, b]") == ("rollout.stop", ["a", "b"])
    assert parse_override("trainer.val_before_train=true") == ("trainer.val_before_train", True)
    assert parse_override("actor.optim.lr=1e-6") == ("actor.optim.lr", 1e-6)
    assert parse_override("rollout.n=8") == ("rollout.n", 8)
    assert parse_override("+data.dataset=countdown") == ("data.dataset", "countdown")
    assert parse_override("data.system_prompt=a=b") == ("data.system_prompt", "a=b")  # only the first '=' splits
    assert parse_override("data.dataset_options={size: 10, seed: 3}") == (
        "data.dataset_options",
        {"size": 10, "seed": 3},
    )


def test_overrides_create_nested_options_and_keep_the_callers_tree():
    tree = copy.deepcopy(BASE)
    tree["reward"] = {"options": {"judge": {"model": "small"}}}
    before = copy.deepcopy(tree)
    cfg = build_config(tree, ["reward.options.judge.temperature=0.5", "reward.weights.judge=2", "algorithm.my_knob=3"])
    assert cfg.reward.options == {"judge": {"model": "small", "temperature": 0.5}}
    assert cfg.reward.weights == {"judge": 2.0}
    assert cfg.algorithm.model_extra == {"my_knob": 3}  # estimators read their own extra keys
    assert tree == before


def test_empty_yaml_file_needs_overrides(tmp_path):
    path = write(tmp_path, "")
    cfg = load_config(path, ["model.path=/m", "data.dataset=countdown"])
    assert cfg.model.path == "/m"


# --- verl spellings --------------------------------------------------------------------------------------------


def test_verl_style_yaml_lands_at_our_keys(tmp_path):
    path = write(
        tmp_path,
        """
        data:
          train_files: [train.parquet]
          val_files: [test.parquet]
          train_batch_size: 32
          val_batch_size: 64
        actor_rollout_ref:
          model:
            path: /models/policy
            enable_gradient_checkpointing: true
          actor:
            optim:
              lr: 3.0e-6
              lr_warmup_steps: 5
            ppo_mini_batch_size: 16
            ppo_micro_batch_size_per_gpu: 8
            use_kl_loss: true
          rollout:
            n: 5
            engine: hf
            temperature: 0.7
          ref:
            log_prob_micro_batch_size_per_gpu: 4
        algorithm:
          adv_estimator: grpo
        reward_model:
          reward_manager: naive
          reward_kwargs:
            judge: {temperature: 0.0}
        trainer:
          total_epochs: 2
          default_local_dir: /tmp/ckpts
          resume_mode: disable
        """,
    )
    cfg = load_config(path)
    assert cfg.model.path == "/models/policy"
    assert cfg.model.enable_gradient_checkpointing is True
    assert cfg.actor.optim.lr == pytest.approx(3e-6)
    assert cfg.actor.optim.warmup_steps == 5
    assert cfg.actor.ppo_mini_batch_size == 16
    assert cfg.actor.use_kl_loss is True
    assert cfg.rollout.n == 5
    assert cfg.rollout.name == "hf"
    assert cfg.rollout.temperature == pytest.approx(0.7)
    # verl hands reward_kwargs to its reward manager; plugrl to the custom reward function (none here: said at start)
    assert cfg.reward.custom_reward_function.reward_kwargs == {"judge": {"temperature": 0.0}}
    said = "reward_model.reward_kwargs.judge.temperature (keywords of a custom"
    assert any(k.startswith(said) for k in ignored_keys(cfg))
    assert cfg.trainer.run_dir == Path("/tmp/ckpts")
    assert cfg.trainer.resume == "disable"
    assert cfg.trainer.total_epochs == 2
    assert sorted(cfg._ignored_verl_keys) == sorted(
        [
            "data.val_batch_size",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        ]
    )
    # naive is what plugrl's reward runner does: acted on, not named as ignored
    assert {f.key: f.kind for f in cfg._key_fates}["reward_model.reward_manager"] == "acted"


def test_verl_override_strings_land_at_our_keys():
    cfg = build_config(
        copy.deepcopy(BASE),
        [
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "trainer.default_local_dir=/tmp/out",
            "trainer.resume_mode=disable",
            "actor_rollout_ref.rollout.engine=hf",
            "actor_rollout_ref.model.path=/models/other",
            "actor_rollout_ref.actor.optim.lr=5e-7",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "+actor_rollout_ref.actor.use_dynamic_bsz=true",
        ],
    )
    assert cfg.rollout.n == 4
    assert cfg.actor.ppo_mini_batch_size == 8
    assert cfg.mini_batch_size == 8
    assert cfg.trainer.run_dir == Path("/tmp/out")  # verl's default_local_dir is the run directory itself
    assert cfg.trainer.resume == "disable"
    assert cfg.rollout.name == "hf"
    assert cfg.model.path == "/models/other"
    assert cfg.actor.optim.lr == pytest.approx(5e-7)
    assert cfg._ignored_verl_keys == [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.use_dynamic_bsz",
    ]


def test_the_seed_documents_verl_settings_load_as_written():
    """TinyV's verl fork sets its verifier under reward_model.*, and verl's dump directories come as hydra's
    `+key=value`: they land where plugrl reads them (issue 18, point 2)."""
    cfg = build_config(
        copy.deepcopy(BASE),
        [
            "reward_model.tinyv_setup=mixed",
            "reward_model.tinyv_weight=0.25",
            "+trainer.rollout_data_dir=/tmp/rollout_dumps",
            "trainer.validation_data_dir=/tmp/val_dumps",
        ],
    )
    assert cfg.reward.options == {"tinyv": {"setup": "mixed", "weight": 0.25}}
    assert cfg.trainer.rollout_data_dir == "/tmp/rollout_dumps"
    assert cfg.trainer.validation_data_dir == "/tmp/val_dumps"


def test_the_creativity_documents_batch_pair_gets_verls_error():
    """The Creativity document sets data.train_batch_size=4 with ppo_mini_batch_size=64: verl's trainer refuses
    it (train_batch_size must be >= ppo_mini_batch_size, both in prompts); so does plugrl, in verl's words, naming
    the keys as typed."""
    msg = error_of(overrides=["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=64"])
    assert "data.train_batch_size (4) must be >= actor_rollout_ref.actor.ppo_mini_batch_size (64)" in msg
    assert "set actor_rollout_ref.actor.ppo_mini_batch_size to at most 4" in msg


def test_a_refusal_names_the_key_as_typed_and_suggests_only_keys_of_the_same_meaning():
    """A bad value under a verl spelling is named as typed; a verl key plugrl cannot honour says why; an unknown
    key gets no suggestion that only looks alike."""
    msg = error_of(overrides=["actor_rollout_ref.actor.optim.lr=fast"])
    assert "actor_rollout_ref.actor.optim.lr: " in msg and "'fast'" in msg
    msg = error_of(overrides=["actor_rollout_ref.hybrid_engine=False"])
    assert "actor_rollout_ref.hybrid_engine=False is not supported: plugrl's engine runs in each training" in msg
    assert "did you mean" not in msg
    assert "did you mean" not in error_of(overrides=["actor_rollout_ref.hybrid_engin=True"])
    assert "did you mean 'actor.optim.lr'" in error_of(overrides=["actor.optim.lrr=1"])


def test_our_own_aliases():
    cfg = build_config(copy.deepcopy(BASE), ["rollout.engine=hf", "actor.optim.lr_warmup_steps=3"])
    assert cfg.rollout.name == "hf"
    assert cfg.actor.optim.warmup_steps == 3


def test_verl_key_still_validated_at_its_new_place():
    msg = error_of(overrides=["actor_rollout_ref.rollout.n=zero"])
    assert "rollout.n" in msg and "'zero'" in msg


# --- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "unknown", "suggestion"),
    [
        ("trainer.total_step=10", "trainer.total_step", "trainer.total_steps"),
        ("actor.optim.lrr=1e-5", "actor.optim.lrr", "actor.optim.lr"),
        ("rollout.temprature=0.5", "rollout.temprature", "rollout.temperature"),
        ("data.train_file=[a.parquet]", "data.train_file", "data.train_files"),
    ],
)
def test_unknown_key_suggests_the_right_one(override, unknown, suggestion):
    msg = error_of(overrides=[override])
    assert f"unknown key '{unknown}'" in msg
    assert f"did you mean '{suggestion}'" in msg


def test_unknown_section_is_an_error():
    msg = error_of(overrides=["traner.total_steps=3"])
    assert "traner" in msg and "unknown key" in msg


@pytest.mark.parametrize(
    ("override", "key", "bad"),
    [
        ("data.train_batch_size=many", "data.train_batch_size", "'many'"),
        ("rollout.n=0", "rollout.n", "0"),
        ("actor.optim.lr=-1", "actor.optim.lr", "-1"),
        ("trainer.logger=[console, jsonl, printer]", "trainer.logger", "['console', 'jsonl', 'printer']"),
        ("model.dtype=float16", "model.dtype", "'float16'"),
        ("trainer.val_before_train=maybe", "trainer.val_before_train", "'maybe'"),
    ],
)
def test_wrong_type_names_key_and_value(override, key, bad):
    msg = error_of(overrides=[override])
    assert key in msg
    assert f"(got {bad})" in msg


def test_mini_batch_larger_than_batch():
    msg = error_of(overrides=["data.train_batch_size=8", "actor.ppo_mini_batch_size=16"])
    assert "actor.ppo_mini_batch_size (16)" in msg and "data.train_batch_size (8)" in msg
    assert "at most" in msg


def test_batch_not_divisible_by_mini_batch():
    msg = error_of(overrides=["data.train_batch_size=12", "actor.ppo_mini_batch_size=5"])
    assert "not a multiple" in msg and "data.train_batch_size (12)" in msg and "ppo_mini_batch_size (5)" in msg
    assert "divides" in msg


def test_missing_model_path():
    for tree in ({"data": {"train_files": ["t.parquet"]}}, {"model": {}, "data": {"train_files": ["t.parquet"]}}):
        msg = error_of(tree)
        assert "'model.path' is required" in msg
        assert "model.path=" in msg  # how to set it


def test_no_training_data():
    msg = error_of({"model": {"path": "/m"}})
    assert "no training data" in msg and "data.train_files" in msg and "data.dataset" in msg


@pytest.mark.parametrize("bad", ["foo", "=3", "+=3", "  =x"])
def test_malformed_override(bad):
    msg = error_of(overrides=[bad])
    assert repr(bad) in msg and "key.sub=value" in msg


@pytest.mark.parametrize("bad", ["rollout.stop=[a, b", "x.y=!!float abc", "x.y=!!int abc", "x.y=!!timestamp abc"])
def test_override_value_that_is_not_yaml(bad):
    msg = error_of(overrides=[bad])
    assert repr(bad) in msg and "not valid YAML" in msg


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_yaml_file_that_is_not_a_mapping(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match="must hold a mapping") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_invalid_yaml(tmp_path):
    path = write(tmp_path, "model:\n  path: [unclosed\ndata: {\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_error_names_the_file_and_overrides(tmp_path):
    path = write(tmp_path, "model: {path: /m}\ndata: {dataset: countdown}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["rollout.n=lots"])
    msg = str(info.value)
    assert str(path) in msg and "rollout.n=lots" in msg


def test_every_error_is_reported_at_once():
    msg = error_of(overrides=["rollout.n=x", "trainer.total_step=3"])
    assert "rollout.n" in msg and "trainer.total_step" in msg


# --- redaction -------------------------------------------------------------------------------------------------

SECRET = "sk-PLANTED-s3cr3t-9f8e7d"


def test_dump_config_redacts_secrets_and_keeps_env_var_names():
    cfg = build_config(
        copy.deepcopy(BASE),
        [
            f"reward.options.judge.api_key={SECRET}",
            f"reward.options.judge.openai_api_key={SECRET}1",
            f"reward.options.judge.token={SECRET}2",
            f"reward.options.judge.password={SECRET}3",
            f"reward.options.judge.headers={{Authorization: x, hf_token: {SECRET}4}}",
            f"reward.options.judge.client_secret=[{SECRET}5]",
            f"reward.options.judge.credentials={{user: me, pass: {SECRET}6}}",  # a secret key holding a mapping
            "reward.options.judge.api_key_env=OPENAI_API_KEY",
            "reward.options.judge.model=gpt-judge",
            f"algorithm.api_key={SECRET}7",
            f"algorithm.auth_token={SECRET}8",
            "algorithm.api_key_env=MY_PROVIDER_KEY",
            "model.tokenizer_path=/models/tok",  # "token" inside a name is not a secret
            "actor.ppo_max_token_len_per_gpu=4096",
            "rollout.max_num_batched_tokens=2048",
        ],
    )
    dumped = dump_config(cfg)
    assert SECRET not in dumped
    assert "s3cr3t" not in dumped
    tree = yaml.safe_load(dumped)
    judge = tree["reward"]["options"]["judge"]
    assert judge["api_key"] == judge["openai_api_key"] == judge["token"] == judge["password"] == "***"
    assert judge["headers"] == {"Authorization": "***", "hf_token": "***"}
    assert judge["client_secret"] == judge["credentials"] == "***"
    assert judge["api_key_env"] == "OPENAI_API_KEY"
    assert judge["model"] == "gpt-judge"
    assert tree["algorithm"]["api_key"] == tree["algorithm"]["auth_token"] == "***"
    assert tree["algorithm"]["api_key_env"] == "MY_PROVIDER_KEY"
    # ordinary settings survive the round trip
    assert tree["model"]["tokenizer_path"] == "/models/tok"
    assert tree["actor"]["ppo_max_token_len_per_gpu"] == 4096
    assert tree["ref"]["log_prob_max_token_len_per_gpu"] == 16384
    assert tree["rollout"]["max_num_batched_tokens"] == 2048
    # the live config still holds the real value: only the dump is redacted
    assert cfg.reward.options["judge"]["api_key"] == SECRET


def test_dumped_config_loads_back(tmp_path):
    cfg = build_config(copy.deepcopy(BASE), ["rollout.n=3", "actor_rollout_ref.actor.ppo_mini_batch_size=4"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again.model_dump() == cfg.model_dump()


def test_redact_python_dump_keeps_shapes():
    cfg = build_config(copy.deepcopy(BASE), [f"algorithm.password={SECRET}"])
    tree = redact(cfg.model_dump())  # what the trainer hands the trackers
    assert tree["algorithm"]["password"] == "***"
    assert tree["actor"]["optim"]["betas"] == (0.9, 0.999)
    assert SECRET not in repr(tree)


def test_empty_secret_is_left_alone():
    assert redact({"api_key": "", "token": None}) == {"api_key": "", "token": None}


# --- property: nothing but ConfigError -------------------------------------------------------------------------

KNOWN_KEYS = [
    "model.path",
    "data.train_batch_size",
    "data.train_files",
    "data.dataset_options",
    "rollout.n",
    "rollout.stop",
    "actor.ppo_mini_batch_size",
    "actor.optim.lr",
    "actor.optim.betas",
    "algorithm.adv_estimator",
    "algorithm",
    "reward.options",
    "reward.options.judge",
    "reward.options.judge.api_key",
    "reward.weights",
    "trainer.logger",
    "trainer.resume_mode",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.engine",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "reward_model.reward_kwargs",
    "model",
    "plugins",
]
YAMLISH = st.sampled_from(
    ["1", "-1", "0", "1e-6", "true", "null", "~", "[a, b]", "{a: 1}", "[", "}", "!!float x", "!!binary x",
     "&a [*a]", "'", "\"", ":", "- x", "2024-01-01", ".inf", ".nan", "9" * 5000, "{a: {b: [1, {c: d}]}}"]
)  # fmt: skip
KEY_CHARS = st.sampled_from(string.ascii_lowercase + "._+-=[]{}: \t\n#&*!%@`|>'\"\\0é€")
KEYS = st.one_of(
    st.sampled_from(KNOWN_KEYS),
    st.text(KEY_CHARS, max_size=20),
    st.text(max_size=20),
    st.tuples(st.sampled_from(KNOWN_KEYS), st.text(KEY_CHARS, max_size=8)).map(lambda t: t[0] + "." + t[1]),
)
VALUES = st.one_of(YAMLISH, st.text(max_size=30), st.text(string.printable, max_size=30))
OVERRIDES = st.one_of(
    st.tuples(KEYS, VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.text(max_size=30),  # anything at all, '=' or not
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OVERRIDES, max_size=6), st.booleans())
def test_random_overrides_raise_only_config_error(overrides, with_base):
    tree = copy.deepcopy(BASE) if with_base else {}
    try:
        cfg = build_config(tree, overrides)
    except ConfigError as e:
        assert str(e)  # always a message
    else:
        assert isinstance(cfg, Config)


# Impossible combinations, drawn on purpose (random overrides rarely hit them): the batch sizes (in prompts,
# so rollout.n divides nothing and cannot clash with them), the overlong buffer against the response limit,
# and estimators with and without the critic or classifier they need (the critic is built from `critic.*`
# whenever the estimator needs one; a classifier is looked up in the registry at start-up, by its plugin).
COMBINATIONS = st.fixed_dictionaries(
    {
        "data.train_batch_size": st.integers(1, 48),
        "actor.ppo_mini_batch_size": st.one_of(st.none(), st.integers(1, 96)),
        "rollout.n": st.integers(1, 16),
        "data.max_response_length": st.integers(1, 300),
        "reward.overlong_buffer.enable": st.booleans(),
        "reward.overlong_buffer.len": st.integers(1, 400),
        "algorithm.adv_estimator": st.sampled_from(["grpo", "gae", "rloo", "grpo_passk", "strategy_grpo"]),
        "algorithm.classifier": st.one_of(st.none(), st.sampled_from(["openai", "nope"])),
        "critic.ppo_epochs": st.one_of(st.none(), st.integers(1, 3)),
    }
)


@settings(max_examples=200, deadline=None)
@given(COMBINATIONS)
def test_impossible_combinations_are_named(values):
    overrides = [f"{k}={'null' if v is None else v}" for k, v in values.items()]
    batch, mini = (
        values["data.train_batch_size"],
        values["actor.ppo_mini_batch_size"] or values["data.train_batch_size"],
    )
    buffer_too_long = (
        values["reward.overlong_buffer.enable"]
        and values["reward.overlong_buffer.len"] >= values["data.max_response_length"]
    )
    try:
        cfg = build_config(copy.deepcopy(BASE), overrides)
    except ConfigError as e:
        msg = str(e)
        if mini > batch:
            assert f"data.train_batch_size ({batch}) must be >= actor.ppo_mini_batch_size ({mini})" in msg
        elif batch % mini:
            assert f"data.train_batch_size ({batch}) is not a multiple of actor.ppo_mini_batch_size ({mini})" in msg
        else:
            assert buffer_too_long, msg
            assert "reward.overlong_buffer.len" in msg and "data.max_response_length" in msg
    else:
        assert mini <= batch and batch % mini == 0 and not buffer_too_long
        assert cfg.mini_batch_size == mini and cfg.rollout.n == values["rollout.n"]


@functools.cache
def real_plugins():
    from plugrl.plugins import load_plugins

    return load_plugins(["advantages", "classifier_openai", "tinyv"])


@settings(max_examples=60, deadline=None)
@given(
    estimator=st.sampled_from(["grpo", "gae", "rloo", "grpo_weighted_add", "grpo_weighted_mul", "nope", ""]),
    classifier=st.one_of(st.none(), st.sampled_from(["openai", "nope", ""])),
)
def test_estimator_without_what_it_needs_is_named_before_any_model_loads(estimator, classifier):
    """The start-up checks: an unknown estimator is a PluginError naming the key (plugrl.plugins.check_algorithm);
    a strategy-grouping one without a registered classifier is a problem naming the key, found by the check of the
    plugin whose estimators call the classifier (plugrl_advantages.classify.classifier_problems); a critic
    estimator gets its critic."""
    from plugrl.plugins import PluginError, check_algorithm
    from plugrl_advantages.classify import classifier_problems, groups_by_strategy

    registry = real_plugins()
    tree = {**copy.deepcopy(BASE), "algorithm": {"adv_estimator": estimator, "classifier": classifier}}
    cfg = build_config(tree, []).algorithm
    try:
        spec = check_algorithm(cfg, registry)
    except PluginError as e:
        msg = str(e)
        assert estimator not in registry.estimators
        assert f"algorithm.adv_estimator {estimator!r} is not registered" in msg and "grpo" in msg
        return
    assert spec is registry.estimators[estimator]
    if not groups_by_strategy(spec) or classifier is None:
        return  # nothing to classify, or not set: the default (openai), settled at start
    problems = classifier_problems(cfg, spec, registry)
    if classifier == "openai":
        assert problems == []
    else:
        (msg,) = problems
        assert "needs algorithm.classifier" in msg and f"got {classifier!r}" in msg and "openai" in msg


OPTION_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**20),
    st.floats(),  # nan and inf included
    st.text(max_size=12),
    st.sampled_from(["http://127.0.0.1:1/v1", "ftp://x/v1", "localhost:8000", "", "  ", "tinyv_only", "rubric"]),
    st.sampled_from(["rule", "zero", "OPENAI_API_KEY", "sk-not-a-name", "https://api.openai.com/v1", "1e309"]),
    st.lists(st.one_of(st.text(max_size=6), st.integers()), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(
    options=st.dictionaries(
        st.sampled_from(["setup", "weight", "template", "base_url", "model", "api_key_env", "temperature"])
        | st.sampled_from(["max_tokens", "request_timeout_s", "retries", "backoff_s", "fallback", "launch_args"])
        | st.sampled_from(["launch_timeout_s", "max_question_chars", "max_answer_chars", "api_key", "url", ""])
        | st.sampled_from(["max_prompt_tokens", "tokenizer_path"]),
        OPTION_VALUES,
        max_size=7,
    ),
    launch=st.sampled_from([False, "no", 0, "maybe", None, 2, "absent"]),  # never a real launch
)
def test_random_verifier_options_stop_the_run_with_a_clear_message(options, launch):
    """reward.options.tinyv through the real run-start hook: valid, or an OptionError naming the option (a
    missing model or verifier URL included), never another exception, and never echoing an api_key value.
    The kernel's check before any model loads (against the reward's declared options, plugrl_tinyv.Options)
    names the same option, as a ConfigError."""
    from plugrl.plugins import check_config
    from plugrl_tinyv import OptionError

    options = dict(options, wait_s=0)  # no verifier server is up: valid options end at its one try, not a wait
    if launch != "absent":
        options["launch"] = launch
    tree = {**copy.deepcopy(BASE), "plugins": ["tinyv"], "reward": {"options": {"tinyv": options}}}
    cfg = build_config(tree, [])
    try:
        check_config(cfg, real_plugins())
        early = None
    except ConfigError as e:
        early = str(e)
    try:
        real_plugins().hooks.plugrl_run_start(config=cfg, run_dir=None)
    except OptionError as e:
        msg = str(e)
        assert msg.startswith("tinyv: ") and "reward.options.tinyv" in msg, msg
        if "did not answer GET /models (wait_s: 0, no wait)" in msg:  # options valid; the server is not up
            _assert_accepted(options, early)
            return
        if isinstance(options.get("api_key"), str) and len(options["api_key"]) > 3:
            assert options["api_key"] not in msg
        if "api_key" in options:  # refused without its value (other lines may quote other options' values)
            assert [line for line in early.splitlines() if ".api_key:" in line] == [
                "  reward.options.tinyv.api_key: keep keys out of configs; put it in an environment variable and "
                "name that variable in reward.options.tinyv.api_key_env"
            ]
        if "environment variable" not in msg:  # the API key's presence is checked at run start only
            unknown = re.match(r"tinyv: unknown reward\.options\.tinyv: ([^;,]*)[;,]", msg)
            named = re.search(r"reward\.options\.tinyv\.\w+", msg)
            key = f"'reward.options.tinyv.{unknown.group(1)}'" if unknown else named.group(0)
            assert early is not None and key in early, (msg, early)
    else:
        _assert_accepted(options, early)


def _assert_accepted(options: dict, early: str | None) -> None:
    """Options the run start took: the kernel's check took them too, with a model and an http(s) verifier URL."""
    assert early is None, early
    model, url = options.get("model"), options.get("base_url", "http://127.0.0.1:8000/v1")
    assert isinstance(model, str) and model.strip(), "a verifier without a model name was accepted"
    assert isinstance(url, str) and url.startswith(("http://", "https://")), f"base_url {url!r} was accepted"


def test_missing_verifier_model_or_url_is_named():
    from plugrl_tinyv import OptionError

    for options, named in (
        ({"base_url": "http://127.0.0.1:8000/v1"}, "reward.options.tinyv.model is required"),
        ({"model": "m", "base_url": ""}, "reward.options.tinyv.base_url must be an http(s) URL"),
        ({"model": "m", "base_url": None}, "reward.options.tinyv.base_url must be an http(s) URL"),
        ({"model": "m", "retries": float("inf")}, "reward.options.tinyv.retries must be"),  # was an OverflowError
        ({"model": "m", "max_tokens": "1e309"}, "reward.options.tinyv.max_tokens must be"),
    ):
        tree = {**copy.deepcopy(BASE), "plugins": ["tinyv"], "reward": {"options": {"tinyv": options}}}
        with pytest.raises(OptionError, match=re.escape(named)):
            real_plugins().hooks.plugrl_run_start(config=build_config(tree, []), run_dir=None)


def test_configuration_reference_in_docs_is_up_to_date():
    from pathlib import Path

    from plugrl_commands.config_reference import reference_markdown

    doc = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    current = doc.split("<!-- config:begin -->\n", 1)[1].split("<!-- config:end -->", 1)[0]
    assert current == reference_markdown(), (
        "docs/configuration.md is stale: regenerate with python -m plugrl_commands.config_reference "
        "docs/configuration.md"
    )


def test_python_none_means_null_in_overrides_and_files():
    from plugrl.config import parse_override

    assert parse_override("data.prefill=None") == ("data.prefill", None)
    assert parse_override("data.prefill=null") == ("data.prefill", None)
    assert parse_override("data.system_prompt='None'") == ("data.system_prompt", "None")  # quoted: the text


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("reward.timeout_s=.inf", "reward.timeout_s"),  # crashed the first reward call before
        ("actor.clip_ratio_c=.nan", "actor.clip_ratio_c"),
        ("actor.optim.lr=-.inf", "actor.optim.lr"),
        ("algorithm.kl_ctrl.kl_coef=nan", "algorithm.kl_ctrl.kl_coef"),
        ("trainer.dist_timeout_s=.inf", "trainer.dist_timeout_s"),
    ],
)
def test_infinite_and_nan_numbers_are_refused_by_key(override, key):
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: Input should be a finite number"):
        load_config(Path(__file__).resolve().parent.parent / "examples" / "countdown_grpo.yaml", [override])


@pytest.mark.parametrize("mode", ["gspo", "sapo"])
def test_a_loss_that_fixes_its_aggregation_refuses_a_loss_agg_mode_it_would_ignore(mode):
    """gspo and sapo (plugrl-advantages) declare their papers' seq-mean-token-mean in their records: the start-up
    check reads the record, the kernel names no loss."""
    from plugrl.plugins import check_policy_loss, load_plugins
    from plugrl.policy_losses import check_agg_mode

    spec = check_policy_loss(mode, load_plugins(["advantages"]))
    assert spec.agg_mode == "seq-mean-token-mean"
    base = {"model": {"path": "m"}, "data": {"train_files": ["d.jsonl"]}}
    overrides = [f"actor.loss_mode={mode}", "actor.loss_agg_mode=token-mean"]
    cfg = build_config(base, overrides)
    refused = rf"actor.loss_mode {mode} always aggregates seq-mean-token-mean .*=token-mean would be ignored"
    with pytest.raises(ConfigError, match=refused):
        check_agg_mode(cfg.actor, spec)
    from plugrl.trainer import Trainer

    with pytest.raises(ConfigError, match=refused):  # at start (no `plugins:`: plugrl-advantages), before any model
        Trainer(build_config({**base, "model": {"path": "no_such_model"}}, overrides))
    assert build_config(base, [f"actor.loss_mode={mode}"]).actor.loss_agg_mode == "token-mean"  # the default: unread
    check_agg_mode(build_config(base, [f"actor.loss_mode={mode}"]).actor, spec)
    same = build_config(base, [f"actor.loss_mode={mode}", "actor.loss_agg_mode=seq-mean-token-mean"])
    check_agg_mode(same.actor, spec)
    luspo = check_policy_loss("luspo", load_plugins(["advantages"]))  # follows loss_agg_mode: nothing to refuse
    check_agg_mode(build_config(base, ["actor.loss_mode=luspo", "actor.loss_agg_mode=token-mean"]).actor, luspo)


def test_secrets_are_redacted_by_their_shape_under_any_key(caplog):
    """A key in a URL, an authorization header or a provider token is masked wherever it sits: config.yaml,
    the dict wandb gets (redact), log lines (RedactSecrets) and the command line's one-line errors."""
    import logging

    from plugrl.config import RedactSecrets, redact_text

    cfg = build_config(
        copy.deepcopy(BASE),
        [
            "reward.options.judge.base_url=https://me:hunter2pass@judge.example.com/v1",
            "reward.options.judge.extra_headers={X-Auth: Bearer abcd1234efgh5678}",
            "reward.options.judge.key=plain-key-value",
            "reward.options.judge.fallback_url=http://127.0.0.1:8000/v1",
            "algorithm.note=use hf_abcdefghijklmnopqrstuvwx or sk-abcdefghijklmnopqrstuv",
        ],
    )
    for text in (dump_config(cfg), repr(redact(cfg.model_dump()))):
        for secret in ("hunter2pass", "abcd1234efgh5678", "plain-key-value", "hf_abcdefghij", "sk-abcdefghij"):
            assert secret not in text
        assert "https://me:***@judge.example.com/v1" in text and "Bearer ***" in text
        assert "http://127.0.0.1:8000/v1" in text  # no user part: nothing to mask
    assert redact_text("the Token embeddings are tied; 512 tokens") == "the Token embeddings are tied; 512 tokens"

    handler = logging.StreamHandler()
    handler.addFilter(RedactSecrets())
    logger = logging.getLogger("plugrl.test_redaction")
    logger.addHandler(caplog.handler)
    caplog.handler.addFilter(RedactSecrets())
    try:
        logger.warning("calling %s with %s", "https://u:p4ssw0rd@h/v1", "Authorization: Bearer zzzz9999yyyy")
    finally:
        caplog.handler.removeFilter(caplog.handler.filters[-1])
        logger.removeHandler(caplog.handler)
    assert "p4ssw0rd" not in caplog.text and "zzzz9999" not in caplog.text
    assert "https://u:***@h/v1" in caplog.text


def test_a_one_line_error_masks_a_secret_it_quotes(tmp_path, capsys):
    from plugrl.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(
        "plugins: [advantages]\nmodel: {path: 'https://me:hunter2pass@hub.example.com/m'}\n"
        "data: {train_files: [d.jsonl]}\n"
    )
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "hunter2pass" not in err and "me:***@hub.example.com" in err


def test_a_plain_string_is_one_data_file():
    """verl's scripts pass `data.train_files=$HOME/data/gsm8k/train.parquet`: one file, not a list."""
    cfg = build_config({"model": {"path": "m"}, "data": {"val_files": "v.parquet"}}, ["data.train_files=t.parquet"])
    assert (cfg.data.train_files, cfg.data.val_files) == (["t.parquet"], ["v.parquet"])


def test_the_reference_shows_a_sections_own_defaults():
    """The critic's optimizer defaults to lr 1e-5 (OptimConfig(lr=1e-5)), not OptimConfig's 1e-6: the generated
    reference reads the section's default instance, so docs/configuration.md says what the code does."""
    from plugrl.config import Config
    from plugrl_commands.config_reference import reference_markdown

    table = reference_markdown()
    critic_lr = Config.model_fields["critic"].default_factory().optim.lr
    actor_lr = Config.model_fields["actor"].default_factory().optim.lr
    assert critic_lr == 1e-5 and actor_lr == 1e-6
    assert f"| `critic.optim.lr` | `float` | `{critic_lr!r}` |" in table
    assert f"| `actor.optim.lr` | `float` | `{actor_lr!r}` |" in table


def test_the_algorithms_page_names_every_policy_loss_plugrl_registers():
    """docs/algorithms.md once said plugrl had no GSPO loss mode while the kernel registered one."""
    from plugrl.plugins import load_plugins

    text = (Path(__file__).resolve().parent.parent / "docs" / "algorithms.md").read_text()
    for name in load_plugins(["advantages"]).policy_losses:
        assert f"`{name}`" in text, name
    assert "the kernel registers `vanilla`" in text


def test_verls_reward_model_keys_become_the_reward_model_plugin():
    """verl's `reward_model.enable=True reward_model.model.path=...` scores with a discriminative reward model:
    the reward_model plugin, for every data source no rule reward claims (reward.default); its micro-batch keys
    are named as not acted on (it batches by token budget)."""
    cfg = build_config(
        copy.deepcopy(BASE),
        [
            "plugins=[gsm8k, advantages]",
            "reward_model.enable=True",
            "reward_model.model.path=/models/rm",
            "reward_model.forward_max_token_len_per_gpu=4096",
            "reward_model.micro_batch_size_per_gpu=8",
        ],
    )
    assert cfg.plugins == ["gsm8k", "advantages", "reward_model"]
    assert cfg.reward.default == "reward_model"
    assert cfg.reward.options["reward_model"] == {"path": "/models/rm", "max_tokens_per_batch": 4096}
    assert cfg._ignored_verl_keys == ["reward_model.micro_batch_size_per_gpu"]
    off = build_config(copy.deepcopy(BASE), ["reward_model.enable=False", "reward.default=x"])
    assert "reward_model" not in off.plugins and off.reward.default == "x"
