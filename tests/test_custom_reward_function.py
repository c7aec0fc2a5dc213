"""verl's custom reward function, unchanged (issue 38, point 3): ``custom_reward_function.path=FILE
custom_reward_function.name=NAME`` (verl's legacy top-level section) and ``reward.custom_reward_function.*`` (verl
0.9's) load the user's file and call ``compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)``
for every sample, as verl's reward loop does (verl 0.9.1: ``verl/trainer/ppo/reward.py`` get_custom_reward_fn merges
``custom_reward_function.reward_kwargs`` over the call's keywords; ``experimental/reward_loop/reward_manager/naive.py``
calls with keywords only). The reward files are written here, in verl's spelling; the reward workers are real
processes that load them by path.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from plugrl.cli import main
from plugrl.config import RewardConfig, build_config
from plugrl.plugins import load_plugins
from plugrl.rewards import RewardError, RewardItem, RewardRunner
from plugrl.specs import Registry
from plugrl_compat.custom_reward import CustomScore, custom_reward_spec, use_custom_reward

REWARD_FILE = """\
import asyncio, os

CALLS = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    # verl's signature; returns a dict whose extra fields are logged
    right = solution_str.strip().endswith(str(ground_truth))
    return {"score": 1.0 if right else kwargs.get("wrong_score", 0.0), "source_len": len(data_source),
            "pid": os.getpid(), "bonus": kwargs.get("bonus", 0.0), "split": (extra_info or {}).get("split")}

def plain(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)

def two_args(solution_str, ground_truth):
    return 0.5

async def async_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    await asyncio.sleep(0)
    return 0.25

def needs_scale(data_source, solution_str, ground_truth, extra_info, scale):
    return scale

def positional_only(data_source, solution_str, ground_truth, extra_info, /):
    return 1.0

not_a_function = 3
"""


def reward_file(tmp_path: Path, text: str = REWARD_FILE) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(text)
    return path


def item(completion: str, data_source: str = "openai/gsm8k", ground_truth: str = "72") -> RewardItem:
    from plugrl.data import Sample

    sample = Sample(prompt="q", data_source=data_source, ground_truth=ground_truth, extra_info={"split": "train"})
    return RewardItem(sample, "q", completion)


def test_verl_spellings_land_in_one_section(tmp_path):
    path = reward_file(tmp_path)
    legacy = build_config(
        {"model": {"path": "m"}, "data": {"dataset": "countdown"}},
        [f"custom_reward_function.path={path}", "custom_reward_function.name=plain"],
    )
    section = legacy.reward.custom_reward_function
    assert (section.path, section.name, section.reward_kwargs) == (str(path), "plain", {})
    new = build_config(
        {"model": {"path": "m"}, "data": {"dataset": "countdown"}},
        [f"reward.custom_reward_function.path={path}", "+reward.custom_reward_function.reward_kwargs.bonus=0.5"],
    )
    section = new.reward.custom_reward_function
    assert (section.path, section.name, section.reward_kwargs) == (str(path), "compute_score", {"bonus": 0.5})
    # verl 0.9's legacy section writes name: null; verl's default name then
    assert (
        build_config(
            {
                "model": {"path": "m"},
                "data": {"dataset": "countdown"},
                "custom_reward_function": {"path": str(path), "name": None},
            }
        ).reward.custom_reward_function.name
        == "compute_score"
    )


def test_the_function_scores_every_sample_in_the_worker_pool_with_verls_keywords(tmp_path):
    path = reward_file(tmp_path)
    spec = custom_reward_spec(str(path), "compute_score", {"bonus": 0.5, "wrong_score": -1.0})
    assert spec.data_sources == ("*",) and spec.name == "compute_score"
    with RewardRunner(Registry(rewards=[spec]), RewardConfig(num_workers=1)) as runner:
        out = runner.score([item("so #### 72"), item("nope", data_source="polaris"), item("x 72", "math_dapo")])
    assert out.scores == [1.0, -1.0, 1.0]  # reward_kwargs reach the function; they win over the call's keywords
    first = out.details[0]
    assert first["compute_score/bonus"] == 0.5 and first["compute_score/split"] == "train"
    assert first["compute_score/source_len"] == len("openai/gsm8k")
    import os

    assert first["compute_score/pid"] != os.getpid()  # a reward worker loaded the file by its path
    assert out.metrics["reward/compute_score/mean"] == pytest.approx(1 / 3)


def test_plain_async_and_two_argument_functions(tmp_path):
    path = str(reward_file(tmp_path))
    for name, completion, expected in (("plain", "72", 1.0), ("two_args", "x", 0.5), ("async_score", "x", 0.25)):
        spec = custom_reward_spec(path, name, {})
        with RewardRunner(Registry(rewards=[spec]), RewardConfig(num_workers=1)) as runner:
            assert runner.score([item(completion)]).scores == [expected], name
    scale = custom_reward_spec(path, "needs_scale", {"scale": 3.0})
    assert scale.fn("a", "b", data_source="d", extra_info={}) == 3.0


def test_it_replaces_the_plugins_rewards_as_in_verl(tmp_path, caplog):
    path = reward_file(tmp_path)
    cfg = build_config(
        {"model": {"path": "m"}, "data": {"dataset": "countdown"}, "plugins": ["gsm8k"]},
        [f"custom_reward_function.path={path}"],
    )
    registry = load_plugins(cfg.plugins)
    with caplog.at_level("INFO", logger="plugrl.rewards"):
        spec = use_custom_reward(cfg, registry)
    from plugrl.rewards.routing import rewards_for

    assert [r.name for r in rewards_for(registry, "openai/gsm8k")] == ["compute_score"] == [spec.name]
    assert [r.name for r in rewards_for(registry, "anything")] == ["compute_score"]
    assert f"custom_reward_function.path={path}: compute_score scores every sample" in caplog.text
    assert "gsm8k_reward (gsm8k) route no data source" in caplog.text
    # reward.extra keeps a plugin's reward beside it
    cfg = build_config(
        {
            "model": {"path": "m"},
            "data": {"dataset": "countdown"},
            "plugins": ["gsm8k"],
            "reward": {"extra": ["gsm8k_reward"]},
        },
        [f"custom_reward_function.path={path}"],
    )
    registry = load_plugins(cfg.plugins)
    use_custom_reward(cfg, registry)
    registry.extra_rewards = ("gsm8k_reward",)
    assert [r.name for r in rewards_for(registry, "openai/gsm8k")] == ["compute_score", "gsm8k_reward"]


def test_custom_score_pickles_as_path_and_name(tmp_path):
    import pickle

    spec = custom_reward_spec(str(reward_file(tmp_path)), "plain", {})
    copy = pickle.loads(pickle.dumps(spec.fn))
    assert isinstance(copy, CustomScore) and copy._fn is None and copy("72", "72", data_source="d") == 1.0


BOOM = "raise RuntimeError('boom at import')\n"
DEFINED = "it defines: async_score, compute_score, needs_scale, plain, positional_only, two_args"
ERRORS = [
    ("legacy", "compute_score", None, "custom_reward_function.path='{missing}': no such file"),
    ("0.9", "compute_score", None, "reward.custom_reward_function.path='{missing}': no such file"),
    ("legacy", "compute_score", BOOM, "importing the file raised RuntimeError: boom at import"),
    ("legacy", "compute", REWARD_FILE, "custom_reward_function.name='compute': {file} defines no function named"),
    ("legacy", "compute", REWARD_FILE, DEFINED),
    ("0.9", "not_a_function", REWARD_FILE, "reward.custom_reward_function.name='not_a_function': {file} defines"),
    ("legacy", "needs_scale", REWARD_FILE, "it requires scale, which verl's call does not pass (set them in "),
    ("legacy", "needs_scale", REWARD_FILE, "set them in custom_reward_function.reward_kwargs"),
    (
        "legacy",
        "positional_only",
        REWARD_FILE,
        "takes data_source, solution_str, ground_truth, extra_info positionally",
    ),
]


@pytest.mark.parametrize(("spelling", "name", "text", "expected"), ERRORS)
def test_errors_name_the_key_as_typed_and_the_file_before_any_model_loads(
    tmp_path, capsys, monkeypatch, spelling, name, text, expected
):
    import plugrl.trainer as trainer_module

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the custom reward function was checked")

    monkeypatch.setattr(trainer_module, "PolicyModel", no_model)
    file = reward_file(tmp_path, text) if text is not None else tmp_path / "missing.py"
    prefix = "custom_reward_function" if spelling == "legacy" else "reward.custom_reward_function"
    config = tmp_path / "run.yaml"
    config.write_text("plugins: [countdown, advantages]\ndata: {dataset: countdown}\nmodel: {path: local:nope}\n")
    argv = ["train", str(config), f"{prefix}.path={file}", f"{prefix}.name={name}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected.format(missing=file, file=file) in err, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_one_training_step_scored_by_the_users_function(tmp_path, tiny_model, capsys):
    """`plugrl train` with verl's legacy keys: every rollout of the countdown data is scored by the file's function,
    its dict's fields are in the rollouts and the metrics."""
    path = reward_file(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(
        "plugins: [countdown, advantages]\n"
        f"model: {{path: {tiny_model}, dtype: float32}}\n"
        "rollout: {name: hf, n: 2}\n"
        "data: {dataset: countdown, train_batch_size: 2, max_response_length: 8}\n"
        f"trainer: {{output_dir: {tmp_path / 'runs'}, experiment_name: x, total_steps: 1, save_freq: 0}}\n"
    )
    argv = ["train", str(config), f"custom_reward_function.path={path}", "custom_reward_function.name=compute_score",
            "+custom_reward_function.reward_kwargs.bonus=2.0"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    run = tmp_path / "runs" / "x"
    rows = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert set(k for k in row["details"] if "/" not in k) == {"compute_score", "error", "timeout"}
        assert row["details"]["compute_score/bonus"] == 2.0 and row["data_source"] == "countdown"
    (metrics,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics["reward/compute_score/bonus"] == 2.0 and "reward/compute_score/mean" in metrics


def test_the_runner_rejects_nothing_it_accepts(tmp_path):
    """A function without **kwargs gets only the keywords it declares (as plugrl's verl adapter), never an error."""
    spec = custom_reward_spec(str(reward_file(tmp_path)), "plain", {})
    assert spec.fn.accepts == frozenset({"data_source", "solution_str", "ground_truth", "extra_info"})
    with pytest.raises(RewardError, match="sets bonus, which it does not take"):
        custom_reward_spec(str(reward_file(tmp_path)), "plain", {"bonus": 1})


def test_reward_kwargs_in_a_yaml_file_stay_one_mapping(tmp_path):
    path = reward_file(tmp_path)
    text = textwrap.dedent(f"""\
        model: {{path: m}}
        data: {{dataset: countdown}}
        custom_reward_function:
          path: {path}
          name: compute_score
          reward_kwargs: {{bonus: 0.5, wrong_score: -1}}
        """)
    import yaml

    cfg = build_config(yaml.safe_load(text))
    assert cfg.reward.custom_reward_function.reward_kwargs == {"bonus": 0.5, "wrong_score": -1}
