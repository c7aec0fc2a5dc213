"""Training on multi-turn episodes: one step of every registered advantage estimator through the real trainer
(tiny random model, HF engine, a local environment plugin), the step's logs, and the start-up checks."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from plugrl.config import ConfigError, load_config

PLUGIN = textwrap.dedent(
    '''
    import plugrl
    from plugrl_advantages.classify import solution_classifier  # the advantages plugin's own kind of record


    @plugrl.environment("retry")
    class Retry(plugrl.Environment):
        """Asks for a second answer once, then ends; the reward plugin scores the conversation."""

        def step(self, turn):
            if turn.index == 0:
                return [{"role": "user", "content": "Once more, in other words."}]
            return plugrl.EnvStep(done=True, info={"second_turn": 1.0})


    @plugrl.environment("window")
    class Window(plugrl.Environment):
        """Keeps the context to the question and a note on the last reply: trains step-wise only."""

        def step(self, turn):
            if turn.index == 0:
                first = next(i for i, m in enumerate(turn.messages) if m["role"] == "assistant")
                note = {"role": "user", "content": "Shorter, please."}
                return plugrl.EnvStep(context=turn.messages[:first], messages=[note])
            return plugrl.EnvStep(done=True, info={"second_turn": 1.0})


    @plugrl.reward("mt")
    def conversation_score(completion, ground_truth, messages=None):
        # depends on the reply and on the conversation reaching the reward: the groups' scores differ
        return (len(completion) % 5) / 5 + (0.1 if messages and len(messages) >= 4 else 0.0)


    @solution_classifier("by_length")
    def by_length(prompt, responses):
        return [len(r) % 2 for r in responses]
    '''
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("mt")
    (root / "mt_plugin.py").write_text(PLUGIN)
    rows = [
        {"prompt": [{"role": "user", "content": f"Say something about {w}."}], "data_source": "mt", "ground_truth": ""}
        for w in ("cats", "rain", "tea", "maps")
    ]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "base.yaml").write_text(f"model:\n  path: {tiny_model}\ndata:\n  train_files: [{data}]\n")
    sys.path.insert(0, str(root))
    yield root, data, tiny_model
    sys.path.remove(str(root))
    sys.modules.pop("mt_plugin", None)


def _overrides(model, data, out, name, extra=()):
    return [
        "plugins=['mt_plugin:',advantages]",
        f"model.path={model}",
        "model.dtype=float32",
        f"data.train_files=[{data}]",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=40",
        "rollout.name=hf",
        "rollout.n=2",
        "rollout.max_turns=2",
        "rollout.max_turn_tokens=8",
        "environment=retry",
        "trainer.total_steps=1",
        "trainer.save_freq=0",
        f"trainer.output_dir={out}",
        f"trainer.experiment_name={name}",
        "trainer.logger=[jsonl]",
        "actor.optim.lr=1e-4",
        *extra,
    ]


ESTIMATORS = {
    "grpo": ["trainer.test_freq=1"],  # and validation plays episodes too
    "gae": ["trainer.critic_warmup=0"],
    "rloo": [],
    "remax": [],
    "reinforce_plus_plus": [],
    "reinforce_plus_plus_baseline": [],
    "opo": [],
    "gpg": [],
    "grpo_passk": [],
    "grpo_weighted_add": ["algorithm.classifier=by_length"],
    "grpo_weighted_mul": ["algorithm.classifier=by_length"],
}


def test_every_registered_estimator_is_covered():
    from plugrl.plugins import load_plugins

    assert set(load_plugins(["advantages"]).estimators) == set(ESTIMATORS)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_one_multi_turn_step_of_each_estimator(setup, tmp_path, estimator):
    from plugrl.trainer import train

    root, data, model = setup
    cfg = load_config(
        root / "base.yaml",
        _overrides(
            model,
            data,
            tmp_path,
            estimator,
            [f"algorithm.adv_estimator={estimator}", f"data.val_files=[{data}]", *ESTIMATORS[estimator]],
        ),
    )
    train(cfg)
    run = tmp_path / estimator
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert m["env/turns_mean"] > 1.0 and m["env/errors"] == 0.0 and m["actor/optimizer_steps"] == 1
    assert m["timing/env"] >= 0.0 and "env/tool_calls" in m and "env/truncated" in m
    if estimator == "gae":
        assert "critic/vf_loss" in m
    if estimator == "grpo":
        assert m["val/mt/score_mean"] >= 0.0
        assert m["val/env/turns_mean"] >= 1.0 and m["val/env/errors"] == 0.0  # validation's episodes, as training's
        (val,) = [json.loads(line) for line in (run / "validation" / "step_000001.jsonl").read_text().splitlines()[:1]]
        assert val["environment"].startswith("environment 'retry'") and val["messages"][-1]["role"] == "assistant"
    rows = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        roles = [msg["role"] for msg in row["messages"]]
        assert roles[:2] == ["system", "user"] or roles[0] == "user"
        assert row["environment"].startswith("environment 'retry'")
        trained = [s for s in row["segments"] if s["trained"]]
        assert trained and row["segments"][0]["trained"]  # the response starts with the policy's first turn
        if row["turns"] == 2 and row["finish"] == "done":
            assert [s["trained"] for s in row["segments"]] == [True, False, True]
            assert "Once more, in other words." in row["segments"][1]["text"]


@pytest.mark.parametrize("estimator", ["grpo", pytest.param("reinforce_plus_plus", marks=pytest.mark.slow)])
def test_one_step_wise_step_with_an_environment_that_edits_the_context(setup, tmp_path, estimator):
    """rollout.step_wise: every turn a sample of its own (its prompt the edited context), trained with its
    episode's advantage; the rollout log lists the steps."""
    from plugrl.trainer import train

    root, data, model = setup
    extra = ["environment=window", "rollout.step_wise=true", f"algorithm.adv_estimator={estimator}"]
    train(load_config(root / "base.yaml", _overrides(model, data, tmp_path, "sw", extra)))
    (m,) = [json.loads(line) for line in (tmp_path / "sw" / "metrics.jsonl").read_text().splitlines()]
    assert m["actor/optimizer_steps"] == 1 and m["env/errors"] == 0.0 and m["env/context_edits"] > 0
    rows = [json.loads(line) for line in (tmp_path / "sw" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    two = [row for row in rows if row["turns"] == 2]
    assert two, "no episode reached its second turn"
    for row in two:
        first, second = row["steps"]
        assert row["messages"][-2] == {"role": "user", "content": "Shorter, please."}
        # the second turn read the question and the note, not the first reply
        assert second["prompt_tokens"] < first["prompt_tokens"] + first["response_tokens"] + 12


def test_multi_turn_settings_that_cannot_work_are_refused_at_start(setup, tmp_path):
    from plugrl.startup import check_run

    root, data, model = setup
    for extra, expected in [
        (["environment=retyr"], "environment names no registered environment: 'retyr'; did you mean 'retry'?"),
        (["rollout.tools=[calculator]"], "rollout.tools names no registered tool: 'calculator'"),
        (["environment_options={turns: 3}"], "environment_options is set, but the environment 'retry' declares no"),
        (["rollout.tool_parser=xml"], "rollout.tool_parser 'xml' is not a known tool-call format; known: hermes"),
        (["actor.tp_size=2"], "actor.tp_size=2: multi-turn episodes run with one engine per rank so far"),
    ]:
        cfg = load_config(root / "base.yaml", _overrides(model, data, tmp_path, "x", extra))
        with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
            check_run(cfg, training=True)


@pytest.mark.slow
def test_the_multi_turn_example_trains_with_vllm(tiny_model, tmp_path):
    """examples/countdown_multiturn.yaml as written (vLLM, the prefill, the stop string) on a tiny model."""
    from test_e2e import metrics, run_plugrl, tiny_overrides

    overrides = [*tiny_overrides(tiny_model, tmp_path, 1), "rollout.name=vllm", "data.max_response_length=48"]
    run_plugrl(["train", "examples/countdown_multiturn.yaml", *overrides, "rollout.max_turn_tokens=12"])
    (m,) = metrics(tmp_path / "e2e")
    assert m["actor/optimizer_steps"] == 1 and m["env/turns_mean"] >= 1.0 and m["env/errors"] == 0.0
    rows = [json.loads(line) for line in (tmp_path / "e2e" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    for row in rows:
        replies = [msg["content"] for msg in row["messages"] if msg["role"] == "assistant"]
        assert len(replies) == row["turns"] and all(r.startswith("<answer>") for r in replies)  # the prefill
        assert sum(s["trained"] for s in row["segments"]) == row["turns"]  # one trained segment per turn


def test_multi_turn_settings_in_a_single_turn_run_are_reported_as_ignored(setup, tmp_path, caplog):
    from plugrl.startup import check_run

    root, data, model = setup
    overrides = [o for o in _overrides(model, data, tmp_path, "x") if not o.startswith("environment=")]
    cfg = load_config(root / "base.yaml", overrides)
    with caplog.at_level("WARNING", logger="plugrl.startup"):
        check_run(cfg, training=True)
    single = (
        "episodes are single-turn (no environment and no rollout.tools); set environment or rollout.tools to use it"
    )
    assert f"rollout.max_turns ({single}); rollout.max_turn_tokens ({single})" in caplog.text
