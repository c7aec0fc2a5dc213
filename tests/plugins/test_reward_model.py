"""The reward_model plugin: a sequence classifier scoring (prompt, response) pairs as a reward.

The reward model of these tests is built here, for tests only: SmolLM2-135M-Instruct with a randomly initialised
one-output score head (``tests/tiny_models.make_reward_model``). Its scores mean nothing; what is checked is that
plugrl computes them exactly as a direct transformers call does, batched or not, normalised and clipped as
configured, and that GRPO trains on them, alone and mixed with countdown's rule reward.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from plugrl.config import ConfigError, RewardConfig, build_config
from plugrl.data import Sample
from plugrl.plugins import check_config, load_plugins
from plugrl.rewards import RewardItem, RewardRunner
from plugrl.specs import Registry
from plugrl_reward_model import (
    Options,
    RunningStats,
    normalize,
    release,
    reset_stats,
    reward_model,
    reward_model_spec,
    scorer,
    token_batches,
)

SYSTEM = {"role": "system", "content": "You are a careful grader."}
PROMPTS: list = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [SYSTEM, {"role": "user", "content": "Write one sentence about the sea, please, in plain words."}],
    [{"role": "user", "content": "Name a prime number."}],
    "Plain text prompt without a chat template:",
]
RESPONSES = [
    "4",
    "The sea is wide and grey, and it moves all day under the wind that comes from the west.",
    "Seven is a prime number, and so is eleven.",
    " an answer in plain text",
]


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory, smollm2_path) -> Path:
    from tiny_models import make_reward_model

    return make_reward_model(tmp_path_factory.mktemp("reward_model") / "rm", smollm2_path)


@pytest.fixture(scope="module")
def direct(rm_path):
    """The reference: transformers' own model and tokenizer, one text per call, float32, no padding."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(rm_path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(rm_path)

    cache: dict[str, float] = {}

    def score(prompt, response: str) -> float:
        key = json.dumps([prompt, response])
        if key not in cache:
            cache[key] = reference(prompt, response)
        return cache[key]

    def reference(prompt, response: str) -> float:
        if isinstance(prompt, list):  # chat: the reward model's own template over prompt + reply (as TRL does)
            text = tok.apply_chat_template([*prompt, {"role": "assistant", "content": response}], tokenize=False)
        else:
            text = prompt + response
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            return float(model(**enc).logits[0, 0])

    return score


@pytest.fixture(autouse=True)
def _fresh_stats():
    reset_stats()
    yield
    reset_stats()


@pytest.fixture(scope="module", autouse=True)
def _unload():
    yield
    release()


def want(direct) -> list[float]:
    """The reference scores of PROMPTS x RESPONSES."""
    return [direct(p, r) for p, r in zip(PROMPTS, RESPONSES, strict=True)]


def completions_of(prompts, responses):
    """What the kernel hands a batch reward: a chat prompt's completion as an assistant message."""
    return [
        [{"role": "assistant", "content": r}] if isinstance(p, list) else r
        for p, r in zip(prompts, responses, strict=True)
    ]


def runner_scores(rm_path: Path, **options) -> list[dict]:
    """Score PROMPTS x RESPONSES through the kernel's reward runner (the batch lane), as a run scores them."""
    spec = reward_model_spec("chat")
    opts = Options(path=str(rm_path), **options).model_dump(mode="json")
    cfg = RewardConfig(options={"reward_model": opts}, num_workers=0)
    items = [
        RewardItem(Sample(p, "chat", "", {}, {"prompt": p}, origin=f"test {i}"), str(p), r)
        for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True))
    ]
    with RewardRunner(Registry(rewards=[spec]), cfg) as runner:
        out = runner.score(items)
    assert out.metrics["reward/errors"] == 0, out.details
    return out.details


# --------------------------------------------------------------------------- scores as transformers gives them


def test_scores_equal_a_direct_transformers_call(rm_path, direct):
    expected = want(direct)
    got = runner_scores(rm_path, dtype="float32", device="cpu")
    assert [d["reward_model"] for d in got] == pytest.approx(expected, abs=1e-5, rel=1e-5)
    assert [d["reward_model/raw"] for d in got] == [d["reward_model"] for d in got]  # normalize: none
    assert not any(d["reward_model/truncated"] for d in got)
    assert len({round(w, 4) for w in expected}) == len(expected)  # distinct scores: a mix-up of samples would show


def test_batching_by_token_budget_gives_the_scores_of_one_by_one(rm_path, direct):
    opts = Options(path=str(rm_path), dtype="float32", device="cpu")
    local = scorer(opts)
    assert scorer(opts.model_copy(update={"max_tokens_per_batch": 1, "max_length": 99})) is local  # not reloaded
    ids, _ = local.encode(PROMPTS, completions_of(PROMPTS, RESPONSES), opts)
    lengths = [len(r) for r in ids]
    assert len(set(lengths)) == len(lengths)  # different lengths: batches hold padding
    singles = local.forward(ids, budget=1)  # one sequence per forward, no padding
    assert singles == pytest.approx(want(direct), abs=1e-5, rel=1e-5)
    for budget in (max(lengths) * 2, 10_000):  # two by two; all at once
        batches = token_batches(lengths, budget)
        assert len(batches) < len(ids) and sorted(i for b in batches for i in b) == list(range(len(ids)))
        assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= budget for b in batches)
        assert local.forward(ids, budget) == pytest.approx(singles, abs=1e-5, rel=1e-5)


def test_token_batches():
    assert token_batches([], 10) == []
    assert token_batches([5, 3, 4], 100) == [[0, 2, 1]]
    assert token_batches([5, 3, 4], 9) == [[0], [2, 1]]  # 2 x 4 = 8 fits, 2 x 5 = 10 does not
    assert token_batches([50, 3], 9) == [[0], [1]]  # one too long for the budget: alone


def test_max_length_keeps_the_end_of_the_text(rm_path):
    opts = Options(path=str(rm_path), dtype="float32", device="cpu", max_length=8)
    local = scorer(opts)
    prompts, completions = PROMPTS[1:2], completions_of(PROMPTS[1:2], RESPONSES[1:2])
    raw, cut = local.score(prompts, completions, opts)
    full, whole = local.encode(prompts, completions, opts.model_copy(update={"max_length": None}))
    assert cut == [True] and whole == [False] and len(full[0]) > 8
    assert raw == pytest.approx(local.forward([full[0][-8:]], budget=100), abs=1e-6)


# --------------------------------------------------------------------------- normalisation and clipping


def test_fixed_normalisation_and_clipping_by_hand(rm_path, direct):
    raw = want(direct)
    shift, scale, clip = raw[0], 0.01, 3.0
    got = runner_scores(rm_path, dtype="float32", normalize="fixed", shift=shift, scale=scale, clip=clip)
    expected = [min(clip, max(-clip, (r - shift) / scale)) for r in raw]
    assert [d["reward_model"] for d in got] == pytest.approx(expected, abs=1e-3)
    assert [d["reward_model/raw"] for d in got] == pytest.approx(raw, abs=1e-5)
    assert got[0]["reward_model"] == pytest.approx(0.0, abs=1e-3)


def test_running_normalisation_by_hand():
    opts = Options(path="unused", normalize="running")
    first, second = [1.0, 2.0, 3.0], [10.0, 0.0]
    # after the first batch: mean 2, population std sqrt(2/3)
    assert normalize(first, opts) == pytest.approx([(v - 2.0) / math.sqrt(2 / 3) for v in first])
    # the second batch is normalised with the statistics of all five scores
    seen = first + second
    mean = sum(seen) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in seen) / 5)
    assert normalize(second, opts) == pytest.approx([(v - mean) / std for v in second])
    clipped = opts.model_copy(update={"clip": 0.5})  # other options: statistics of their own
    assert normalize([4.0, 4.0], clipped) == [0.0, 0.0]  # equal scores: 0, not a division by zero
    assert normalize([0.0], clipped) == [-0.5]  # mean 8/3, std ~1.9: -1.4 clipped to -0.5


def test_running_stats_match_a_single_pass():
    stats = RunningStats()
    values = [0.3, -1.2, 5.0, 2.2, 2.2, -0.7, 9.1]
    for part in (values[:2], values[2:3], [], values[3:]):
        stats.update(part)
    mean = sum(values) / len(values)
    assert stats.count == 7 and stats.mean == pytest.approx(mean)
    assert stats.std == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)))


def test_the_reward_called_as_a_function(rm_path, direct):
    out = reward_model(PROMPTS, completions_of(PROMPTS, RESPONSES), path=str(rm_path), dtype="float32", nums=[1])
    assert [o["score"] for o in out] == pytest.approx(want(direct), abs=1e-5)


def test_a_separate_process_scores_the_same(rm_path, direct):
    got = runner_scores(rm_path, dtype="float32", device="cpu", process="separate")
    assert [d["reward_model"] for d in got] == pytest.approx(want(direct), abs=1e-5, rel=1e-5)


# --------------------------------------------------------------------------- options checked at start


def check(options: dict) -> str:
    """The start-up check of a config that loads the plugin with these options: the ConfigError's text."""
    tree = {
        "plugins": ["reward_model"],
        "model": {"path": "unused"},
        "data": {"train_files": ["unused.jsonl"]},  # read later: the check comes before any data loads
        "reward": {"options": {"reward_model": options}},
    }
    cfg = build_config(tree)
    with pytest.raises(ConfigError) as e:
        check_config(cfg, load_plugins(cfg.plugins))
    return str(e.value)


def test_a_missing_path_names_the_key():
    assert "'reward.options.reward_model.path' is required" in check({})


@pytest.mark.parametrize(
    ("options", "key", "says"),
    [
        ({"max_tokens_per_batch": 0}, "max_tokens_per_batch", "must be >= 1"),
        ({"device": "gpu"}, "device", "auto, cpu, cuda or cuda:N"),
        ({"dtype": "int8"}, "dtype", "auto"),
        ({"clip": -1}, "clip", "must be > 0"),
        ({"shift": 1.0}, "", "shift and scale apply only with normalize: fixed"),
        ({"normalise": "running"}, "normalise", "did you mean 'reward.options.reward_model.normalize'"),
    ],
)
def test_bad_values_name_the_key(rm_path, options, key, says):
    text = check({"path": str(rm_path), **options})
    assert f"reward.options.reward_model{'.' + key if key else ''}" in text and says in text, text


def test_a_model_with_two_labels_is_refused_at_start(tmp_path, smollm2_path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2_path, num_labels=2)
    config.architectures = ["LlamaForSequenceClassification"]
    config.save_pretrained(tmp_path)  # the config alone: the check loads no weights
    text = check({"path": str(tmp_path)})
    assert "reward.options.reward_model.path" in text and "num_labels=2" in text, text


def test_a_causal_lm_is_refused_at_start(smollm2_path):
    text = check({"path": str(smollm2_path)})
    assert "reward.options.reward_model.path" in text and "LlamaForCausalLM, not a sequence classifier" in text


def test_a_path_without_a_model_is_refused_at_start(tmp_path):
    text = check({"path": str(tmp_path / "nothing")})
    assert "reward.options.reward_model.path" in text and "no model config loads" in text


# --------------------------------------------------------------------------- GRPO on the reward model


def countdown_rows(path: Path, n: int) -> Path:
    from plugrl_countdown.problems import countdown_dataset

    rows = countdown_dataset("train", size=n, min_numbers=2, max_numbers=2, max_number=10, max_target=20, ops="+-")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_two_steps(tmp_path: Path, policy: Path, plugins: list[str], overrides: list[str]) -> tuple[list, list]:
    from plugrl.config import load_config
    from plugrl.trainer import train

    data = countdown_rows(tmp_path / "countdown.jsonl", 4)
    (tmp_path / "run.yaml").write_text(json.dumps({"plugins": plugins, "model": {"path": str(policy)}}))
    train(
        load_config(
            tmp_path / "run.yaml",
            [
                "model.dtype=float32",
                f"data.train_files=[{data}]",
                "data.train_batch_size=2",
                "data.max_prompt_length=128",
                "data.max_response_length=12",
                "rollout.name=hf",
                "rollout.n=2",
                "trainer.total_steps=2",
                "trainer.save_freq=0",
                "trainer.logger=[jsonl]",
                f"trainer.output_dir={tmp_path}",
                "trainer.experiment_name=rm",
                *overrides,
            ],
        )
    )
    run = tmp_path / "rm"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    messages = {json.dumps(r["ground_truth"], sort_keys=True): r["prompt"] for r in map(json.loads, data.open())}
    for row in rows:  # the data's chat prompt of each rollout, for the reference scores
        row["messages"] = messages[json.dumps(row["ground_truth"], sort_keys=True)]
    return metrics, rows


def test_grpo_trains_on_the_reward_model_alone(tmp_path, tiny_model, rm_path, direct):
    metrics, rows = train_two_steps(
        tmp_path,
        tiny_model,
        ["reward_model", "advantages"],
        # countdown rows, but no countdown plugin: reward.default sends every data source to the reward model
        ["reward.default=reward_model", f"reward.options.reward_model={{path: {rm_path}, dtype: float32}}"],
    )
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("reward/reward_model/mean" in m and m["reward/errors"] == 0 for m in metrics)
    assert len(rows) == 4
    for row in rows:
        expected = direct(row["messages"], row["completion"])
        assert row["reward"] == pytest.approx(expected, abs=1e-4) and row["details"]["reward_model"] == row["reward"]


def test_grpo_trains_on_the_reward_model_mixed_with_the_countdown_rule(tmp_path, tiny_model, rm_path):
    """The countdown plugin routes its rows to its rule reward; reward.extra adds the reward model to every sample,
    and reward.weights sums them (TRL's reward_funcs=[rule, model id] with reward_weights)."""
    metrics, rows = train_two_steps(
        tmp_path,
        tiny_model,
        ["countdown", "reward_model", "advantages"],
        [
            f"reward.options.reward_model={{path: {rm_path}, dtype: float32, normalize: fixed, scale: 2.0, clip: 1}}",
            "reward.extra=[reward_model]",
            "reward.weights={countdown_reward: 1.0, reward_model: 0.5}",
        ],
    )
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert {"reward/countdown_reward/mean", "reward/reward_model/mean", "reward/reward_model/raw"} <= set(m)
        assert m["reward/errors"] == 0
    for row in rows:
        d = row["details"]
        assert d["reward_model"] == pytest.approx(min(1.0, max(-1.0, d["reward_model/raw"] / 2.0)))
        assert row["reward"] == pytest.approx(1.0 * d["countdown_reward"] + 0.5 * d["reward_model"])


def test_the_plugin_keeps_the_kernel_contracts():
    from plugrl_testing import check_plugin

    registry = check_plugin("reward_model")  # loaded by its entry point, as a run loads it
    [spec] = registry.rewards
    assert spec.name == "reward_model" and spec.data_sources == ("reward_model",) and spec.options is Options
    assert getattr(spec.fn, "plugrl_batch", False)  # the kernel calls it once per batch, in the trainer's process


@pytest.mark.slow
def test_the_gsm8k_example_with_a_reward_model_trains(tmp_path, tiny_model, rm_path):
    """examples/gsm8k_grpo_rm.yaml (verl's rule + a reward model through reward.extra) for 2 steps on the tiny llama,
    the GSM8K rows of the test fixture and the test reward model instead of the hub's."""
    from fixture_paths import GSM8K_FIXTURE
    from test_e2e import metrics, run_plugrl, tiny_overrides

    run_plugrl(
        [
            "train",
            "examples/gsm8k_grpo_rm.yaml",
            *tiny_overrides(tiny_model, tmp_path, 2),
            f"data.dataset_options.path={GSM8K_FIXTURE}",
            f"reward.options.reward_model.path={rm_path}",
            "reward.options.reward_model.dtype=float32",
        ]
    )
    m = metrics(tmp_path / "e2e")
    assert [x["step"] for x in m] == [1, 2]
    for x in m:
        assert {"reward/gsm8k_reward/mean", "reward/reward_model/mean", "reward/reward_model/raw"} <= set(x)
        assert x["reward/errors"] == 0
    rows = [json.loads(line) for line in (tmp_path / "e2e" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    for row in rows:
        d = row["details"]
        assert row["reward"] == pytest.approx(1.0 * d["gsm8k_reward"] + 0.2 * d["reward_model"], abs=1e-6)
        assert -3.0 <= d["reward_model"] <= 3.0  # normalised, then clipped at 3
