"""Tests for the GSM8K plugin (plugins/rewards_gsm8k), on hand-written cases and OpenAI's public data."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import plugrl_gsm8k
from fixture_paths import PUBLIC_DATA
from plugrl.config import DataConfig, RewardConfig
from plugrl.data import DataError, load_samples
from plugrl.plugins import load_plugins
from plugrl.prompts import render_prompt
from plugrl.rewards import RewardError, RewardItem, RewardRunner
from plugrl.specs import DatasetSpec, RewardSpec, TemplateSpec, specs_of
from plugrl_gsm8k import (
    INSTRUCTION,
    extract_answer,
    final_answer,
    ground_truth_answer,
    gsm8k_dataset,
    gsm8k_reward,
    gsm8k_template,
)

# the full public GSM8K, in the data folder beside the repository (not in it): these tests skip without it
GSM8K_DIR = PUBLIC_DATA / "gsm8k"
TRAIN = GSM8K_DIR / "train.jsonl"
TEST = GSM8K_DIR / "test.jsonl"
SOLUTIONS = GSM8K_DIR / "example_model_solutions.jsonl"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"the public GSM8K set is not at {path}: these tests read it from the data folder beside the repo")
    return path


def score(completion, ground_truth="18", **kw):
    return gsm8k_reward(completion, ground_truth, **kw)["score"]


# --------------------------------------------------------------------------- extraction and scoring


@pytest.mark.parametrize(
    ("completion", "ground_truth", "strict", "flexible"),
    [
        # the GSM8K format itself
        ("She makes 9 * 2 = $18 every day.\n#### 18", "18", 1.0, 1.0),
        ("#### 18", "18", 1.0, 1.0),
        # commas and dollar signs are stripped, on both sides
        ("#### 1,000", "1000", 1.0, 1.0),
        ("#### 1000", "1,000", 1.0, 1.0),
        ("so the total is 1,000", "1000", 0.0, 1.0),  # verl's flexible mode would keep the comma
        ("#### $18", "18", 1.0, 1.0),  # verl's strict pattern cannot read past the '$'
        ("She makes $18.", "18", 0.0, 1.0),
        ("#### 18.", "18", 1.0, 1.0),  # a sentence period is not part of the number
        # negative numbers
        ("The change is -5\n#### -5", "-5", 1.0, 1.0),
        ("#### 5", "-5", 0.0, 0.0),
        ("#### -5", "5", 0.0, 0.0),
        # decimals compare as strings, as in verl: 2.50 is not 2.5, 18.0 is not 18
        ("#### 2.5", "2.5", 1.0, 1.0),
        ("#### 2.50", "2.5", 0.0, 0.0),
        ("#### 18.0", "18", 0.0, 0.0),
        (".5 of it\n#### .5", "0.5", 0.0, 0.0),
        # strict needs '#### ' with one space (verl's pattern); flexible takes the last number
        ("The answer is 18", "18", 0.0, 1.0),
        ("####18", "18", 0.0, 1.0),
        ("#### 18 eggs in 3 baskets", "18", 1.0, 0.0),
        ("#### 18\n\nI hope that helps...", "18", 1.0, 1.0),  # '...' is not a number
        ("#### 18, done.", "18", 1.0, 1.0),
        # nothing to extract
        ("", "18", 0.0, 0.0),
        ("I don't know.", "18", 0.0, 0.0),
        ("#### eighteen", "18", 0.0, 0.0),
        ("#### . , ...", "18", 0.0, 0.0),
    ],
)
def test_strict_and_flexible(completion, ground_truth, strict, flexible):
    assert score(completion, ground_truth, method="strict") == strict
    assert score(completion, ground_truth, method="flexible") == flexible


def test_last_hash_wins():
    assert score("#### 17\nwait, let me recheck.\n#### 18") == 1.0
    assert score("#### 18\nwait, let me recheck.\n#### 17") == 0.0
    assert extract_answer("#### 1\n#### 2\n#### 3") == "3"
    # a later '####' without a number does not hide the last one that has one
    assert extract_answer("#### 18\n#### ?") == "18"
    assert extract_answer("#### 18\n#### 17 then 16", "flexible") == "16"


def test_result_dict_and_scores():
    assert gsm8k_reward("#### 18", "18") == {"score": 1.0, "extracted": "18", "method": "strict"}
    assert gsm8k_reward("#### 17", "18") == {"score": 0.0, "extracted": "17", "method": "strict"}
    assert gsm8k_reward("no answer", "18", method="flexible") == {"score": 0.0, "extracted": None, "method": "flexible"}
    # format_score: an extracted but wrong answer; nothing extracted stays 0
    assert score("#### 17", format_score=0.1) == 0.1
    assert score("The answer is 17", format_score=0.1) == 0.0  # strict: no '####', no format credit
    assert score("The answer is 17", format_score=0.1, method="flexible") == 0.1
    assert score("nothing here", format_score=0.1, method="flexible") == 0.0
    assert score("#### 18", format_score=0.1, correct_score=2.0) == 2.0
    assert isinstance(score("#### 18", correct_score=1), float)


def test_ground_truth_forms():
    full = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    assert ground_truth_answer(full) == "72"  # a full GSM8K solution: the part after the last '####'
    assert ground_truth_answer(" 1,000 ") == "1000"
    assert ground_truth_answer("$18") == "18"
    assert ground_truth_answer(72) == "72"
    assert ground_truth_answer(72.0) == "72"
    assert ground_truth_answer(2.5) == "2.5"
    assert score("#### 72", full) == 1.0
    assert score("#### 24", full) == 0.0  # intermediate results in the solution do not count
    for bad in ("", "#### ", None, ["72"]):
        with pytest.raises(ValueError):
            gsm8k_reward("#### 72", bad)


def test_clip_chars_like_verl():
    tail = "x" * 300
    # verl looks at the last 300 characters only: an answer followed by 300 more has none
    assert score("#### 18\n" + tail) == 0.0
    assert score("#### 18\n" + tail, clip_chars=None) == 1.0
    assert score("#### 18\n" + tail, clip_chars=0) == 1.0
    assert score("#### 18\n" + "x" * 290) == 1.0


def test_bad_method():
    with pytest.raises(ValueError, match="strict, flexible"):
        gsm8k_reward("#### 18", "18", method="lenient")


def test_non_text_completion_has_no_answer():
    assert gsm8k_reward(None, "18") == {"score": 0.0, "extracted": None, "method": "strict"}


def test_hostile_completions_are_fast():
    start = time.perf_counter()
    for method in ("strict", "flexible"):
        for text in ("#### " * 200_000, "1," * 500_000, "-" * 1_000_000, "9" * 1_000_000):
            gsm8k_reward(text, "18", method=method)
            gsm8k_reward(text, "18", method=method, clip_chars=None)
    assert time.perf_counter() - start < 2.0


# --------------------------------------------------------------------------- OpenAI's graded model solutions


def _final(text: str) -> str:
    """The final answer of a solution in example_model_solutions.jsonl, which end with 'A: 18' (not '#### 18')."""
    return re.search(r"A:\s*(.+?)\s*$", text).group(1)


def test_agreement_with_graded_model_solutions():
    """``flexible`` scoring of 4 GPT-3 models' solutions to the 1,319 test problems vs the data's is_correct.

    The solutions end with ``A: <answer>``, the labels come from comparing that final answer with the
    reference's, so a faithful last-number extractor should agree almost exactly. Measured: 1319/1319
    for every model (5276/5276). verl's exact rule (commas kept in flexible mode) measures 5274/5276:
    it misses two correct 175b_finetuning answers written ``A: 3,000`` and ``A: 6,250``. The threshold,
    at most 1 disagreement per model in 1,319, keeps that comma handling tested.
    """
    rows = [json.loads(line) for line in need(SOLUTIONS).read_text().splitlines() if line.strip()]
    assert len(rows) == 1319
    models = sorted(k for k, v in rows[0].items() if isinstance(v, dict))
    assert models == ["175b_finetuning", "175b_verification", "6b_finetuning", "6b_verification"]
    total = agree_total = 0
    for model in models:
        agree = correct = 0
        for row in rows:
            result = gsm8k_reward(row[model]["solution"], _final(row["ground_truth"]), method="flexible")
            label = row[model]["is_correct"]
            assert isinstance(label, bool)
            agree += (result["score"] == 1.0) == label
            correct += label
        rate = agree / len(rows)
        print(f"gsm8k flexible vs is_correct, {model}: {agree}/{len(rows)} = {rate:.4f} ({correct} labelled correct)")
        assert rate >= 1 - 1 / len(rows), model
        total += len(rows)
        agree_total += agree
    print(f"gsm8k flexible vs is_correct, all models: {agree_total}/{total} = {agree_total / total:.4f}")
    assert agree_total >= total - 2


def test_strict_needs_the_hash_format():
    """The same solutions write 'A: 18', not '#### 18': strict mode finds no answer in any of them."""
    rows = [json.loads(line) for line in need(SOLUTIONS).read_text().splitlines()[:50]]
    for row in rows:
        for key, value in row.items():
            if isinstance(value, dict):
                assert gsm8k_reward(value["solution"], _final(row["ground_truth"]))["extracted"] is None, key


# --------------------------------------------------------------------------- dataset


def test_dataset_local_train():
    rows = list(gsm8k_dataset("train", path=str(need(TRAIN))))
    assert len(rows) == 7473
    first = rows[0]
    question = (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?"
    )
    # by hand: 48 in April, 48 / 2 = 24 in May, 48 + 24 = 72
    assert first["ground_truth"] == "72"
    assert first["prompt"] == [{"role": "user", "content": f"{question} {INSTRUCTION}"}]
    assert INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'
    assert first["data_source"] == "openai/gsm8k"
    assert first["extra_info"]["split"] == "train" and first["extra_info"]["index"] == 0
    assert first["extra_info"]["question"] == question
    assert first["extra_info"]["answer"].endswith("#### 72")
    assert [r["extra_info"]["index"] for r in rows[:3]] == [0, 1, 2]
    json.dumps(first)  # plain data only


def test_dataset_ground_truth_matches_verl_preprocessing_and_reference_solutions_score():
    """verl's preprocessing takes ``#### (-?[0-9.,]+)`` minus commas; and every reference solution,
    scored strictly against its own row's ground truth, gets full marks (8,792 rows)."""
    verl = re.compile(r"#### (\-?[0-9\.\,]+)")
    for path in (need(TRAIN), need(TEST)):
        for row in gsm8k_dataset("x", path=str(path)):
            answer = row["extra_info"]["answer"]
            assert row["ground_truth"] == verl.search(answer).group(1).replace(",", "")
            assert re.fullmatch(r"-?[0-9]+", row["ground_truth"]), row["ground_truth"]  # integers only
            result = gsm8k_reward(answer, row["ground_truth"])
            assert (result["score"], result["extracted"]) == (1.0, row["ground_truth"])


def test_dataset_directory_picks_the_split_file():
    need(TRAIN)
    test_rows = list(gsm8k_dataset("test", path=str(GSM8K_DIR)))
    assert len(test_rows) == 1319
    assert test_rows[0]["ground_truth"] == "18" and test_rows[0]["extra_info"]["split"] == "test"
    assert len(list(gsm8k_dataset("train", path=str(GSM8K_DIR)))) == 7473


def test_dataset_bad_rows_and_paths(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        gsm8k_dataset("train", path=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl line 2: field 'answer' must be text"):
        list(gsm8k_dataset("train", path=str(bad)))
    bad.write_text(json.dumps({"question": "1+1?", "answer": "it is 2"}) + "\n")
    with pytest.raises(DataError, match=r"line 1: field 'answer'.*'####'"):
        list(gsm8k_dataset("train", path=str(bad)))
    bad.write_text(json.dumps({"question": " ", "answer": "#### 2"}) + "\n")
    with pytest.raises(DataError, match="'question' must be non-empty"):
        list(gsm8k_dataset("train", path=str(bad)))
    assert final_answer("a\n#### 1,234 ") == "1234"


def test_dataset_hub_offline_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"openai/gsm8k.*dataset_options\.path"):
        gsm8k_dataset("train")


def test_dataset_hub_rows(monkeypatch):
    import datasets

    calls = []

    def fake(name, config, split):
        calls.append((name, config, split))
        return [{"question": "What is 6 * 7?", "answer": "6 * 7 = <<6*7=42>>42\n#### 42"}]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    rows = list(gsm8k_dataset("test", hub_id="openai/gsm8k", config="socratic"))
    assert calls == [("openai/gsm8k", "socratic", "test")]
    assert rows[0]["ground_truth"] == "42" and rows[0]["extra_info"]["split"] == "test"


# --------------------------------------------------------------------------- through the kernel


def test_load_samples_with_the_registered_dataset():
    registry = load_plugins(["gsm8k"])
    assert registry.plugins["gsm8k"]
    cfg = DataConfig(dataset="gsm8k", dataset_options={"path": str(need(TRAIN))})
    samples, counts = load_samples(cfg, registry)
    assert counts == {"data/rows": 7473, "data/invalid_rows": 0, "data/samples": 7473}
    s = samples[0]
    assert s.data_source == "openai/gsm8k" and s.ground_truth == "72"
    assert s.prompt[0]["role"] == "user" and s.prompt[0]["content"].endswith(INSTRUCTION)
    assert s.origin == "dataset 'gsm8k' [train] row 0"
    assert len({x.uid for x in samples}) == len(samples)
    assert [r.name for r in registry.rewards] == ["gsm8k_reward"]
    assert registry.rewards[0].data_sources == ("openai/gsm8k",)


def test_template_with_train_files():
    """Users' own GSM8K-format files: data.template gsm8k, the full answer text as ground truth."""
    registry = load_plugins(["gsm8k"])
    cfg = DataConfig(
        train_files=[str(need(TRAIN))],
        template="gsm8k",
        answer_field="answer",
        data_source="openai/gsm8k",
        max_samples=5,
    )
    samples, _ = load_samples(cfg, registry)
    assert len(samples) == 5 and samples[0].prompt == ""
    messages = gsm8k_template(samples[0])
    assert messages == list(gsm8k_dataset("train", path=str(TRAIN)))[0]["prompt"]
    text = render_prompt(samples[0], cfg, None, registry)  # no tokenizer: 'role: content' lines
    assert text.startswith("user: Natalia sold clips") and text.endswith(f"{INSTRUCTION}\nassistant:")
    assert gsm8k_reward("... #### 72", samples[0].ground_truth)["score"] == 1.0


def test_template_reads_extra_info_and_rejects_rows_without_question():
    sample = SimpleNamespace(row={}, extra_info={"question": "2+2?"})
    assert gsm8k_template(sample) == [{"role": "user", "content": f"2+2? {INSTRUCTION}"}]
    assert gsm8k_template({"question": "3+3?"})[0]["content"].startswith("3+3? ")
    with pytest.raises(ValueError, match="'question'"):
        gsm8k_template(SimpleNamespace(row={"problem": "x"}, extra_info={}))


def _item(completion, ground_truth="18"):
    sample = SimpleNamespace(prompt="Q", data_source="openai/gsm8k", ground_truth=ground_truth, extra_info={}, row={})
    return RewardItem(sample, "Q", completion)


def test_reward_runner_options():
    registry = load_plugins(["gsm8k"])
    cfg = RewardConfig(num_workers=0, options={"gsm8k_reward": {"method": "flexible", "format_score": 0.1}})
    with RewardRunner(registry, cfg) as runner:
        out = runner.score([_item("#### 18"), _item("The answer is 18."), _item("It is 17"), _item("no idea")])
    assert out.scores == [1.0, 1.0, 0.1, 0.0]
    assert out.details[1]["gsm8k_reward/extracted"] == "18"
    assert out.details[1]["gsm8k_reward/method"] == "flexible"
    with pytest.raises(RewardError, match="methd"):
        RewardRunner(registry, RewardConfig(num_workers=0, options={"gsm8k_reward": {"methd": "flexible"}}))


def test_module_exposes_specs():
    found = {}
    for name in dir(plugrl_gsm8k):
        for spec in specs_of(getattr(plugrl_gsm8k, name)):
            found[(type(spec), spec.name)] = spec
    assert set(found) == {(DatasetSpec, "gsm8k"), (TemplateSpec, "gsm8k"), (RewardSpec, "gsm8k_reward")}
