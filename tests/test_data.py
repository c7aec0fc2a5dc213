"""Sample schema, loaders, row validation and the prompt batcher (plugrl.data)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from plugrl.config import DataConfig
from plugrl.data import (
    DataError,
    PromptBatcher,
    Sample,
    load_rows,
    load_samples,
    row_to_sample,
    shard_batch,
)
from plugrl.specs import DatasetSpec, Registry

VERL_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "Think step by step."},
            {"role": "user", "content": f"What is {i} + {i}?"},
        ],
        "ability": "math",
        "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
        "extra_info": {"index": i, "split": "train"},
    }
    for i in range(5)
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def good_row(i: int = 0) -> dict:
    return {"prompt": f"question {i}", "data_source": "toy", "ground_truth": str(i)}


# --------------------------------------------------------------------------- formats


def test_verl_parquet_as_is(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", VERL_ROWS)
    rows = list(load_rows(str(path), "train"))
    origin, row = rows[3]
    assert origin == f"{path} row 3"
    # nested columns come back as plain Python, not numpy
    assert isinstance(row["prompt"], list) and isinstance(row["prompt"][0], dict)
    assert isinstance(row["reward_model"], dict) and isinstance(row["extra_info"], dict)

    samples, counts = load_samples(DataConfig(train_files=[str(path)]), Registry())
    assert counts == {"data/rows": 5, "data/invalid_rows": 0, "data/samples": 5}
    s = samples[2]
    assert s.prompt == VERL_ROWS[2]["prompt"]
    assert s.ground_truth == "4"
    assert s.data_source == "openai/gsm8k"
    assert s.extra_info == {"index": 2, "split": "train"}
    assert s.row["ability"] == "math"
    assert s.origin == f"{path} row 2"
    assert len({x.uid for x in samples}) == 5
    # uids are stable: loading again gives the same ids
    again, _ = load_samples(DataConfig(train_files=[str(path)]), Registry())
    assert [x.uid for x in again] == [x.uid for x in samples]


def test_plugrl_schema_jsonl_keeps_other_columns(tmp_path):
    rows = [
        {"prompt": "Make 24 from 3 3 8 8", "data_source": "countdown", "ground_truth": 24, "nums": [3, 3, 8, 8]},
        {"prompt": [{"role": "user", "content": "hi"}], "data_source": "toy", "ground_truth": {"a": 1}},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    samples, _ = load_samples(DataConfig(train_files=[str(path)]), Registry())
    assert samples[0].prompt == "Make 24 from 3 3 8 8"
    assert samples[0].row["nums"] == [3, 3, 8, 8]
    assert samples[0].extra_info == {}
    assert samples[0].origin == f"{path} line 1"
    assert samples[1].prompt == [{"role": "user", "content": "hi"}]
    assert samples[1].ground_truth == {"a": 1}


def test_field_mapping_and_default_data_source(tmp_path):
    path = write_jsonl(
        tmp_path / "qa.jsonl", [{"question": "2+2?", "answer": "4"}, {"question": "3+3?", "answer": "6"}]
    )
    cfg = DataConfig(train_files=[str(path)], question_field="question", answer_field="answer", data_source="toy")
    samples, _ = load_samples(cfg, Registry())
    assert samples[0].prompt == [{"role": "user", "content": "2+2?"}]
    assert samples[0].ground_truth == "4"
    assert samples[1].data_source == "toy"


def test_row_data_source_wins_over_config_default():
    cfg = DataConfig(data_source="fallback")
    assert row_to_sample(good_row(), "x row 0", cfg).data_source == "toy"
    row = good_row()
    del row["data_source"]
    assert row_to_sample(row, "x row 0", cfg).data_source == "fallback"


def test_prompt_key(tmp_path):
    row = {"instruction": "Do it", "ground_truth": "ok", "data_source": "t"}
    s = row_to_sample(row, "r", DataConfig(prompt_key="instruction"))
    assert s.prompt == "Do it"


def test_json_list_and_hf_data_wrapper_and_json_lines(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps([good_row(0), good_row(1)]))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"data": [good_row(2)]}))
    c = write_jsonl(tmp_path / "c.json", [good_row(3), good_row(4)])  # JSON Lines under a .json name
    samples, counts = load_samples(DataConfig(train_files=[str(a), str(b), str(c)]), Registry())
    assert [s.ground_truth for s in samples] == ["0", "1", "2", "3", "4"]
    assert samples[1].origin == f"{a} row 1"
    assert counts["data/samples"] == 5


def test_json_of_wrong_shape(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(DataError, match=r"bad\.json.*list of rows"):
        list(load_rows(str(p), "train"))


def test_directory_reads_the_split_files(tmp_path):
    d = tmp_path / "ds"
    (d / "data").mkdir(parents=True)
    write_parquet(d / "data" / "train-00000-of-00001.parquet", VERL_ROWS[:3])
    write_parquet(d / "data" / "test-00000-of-00001.parquet", VERL_ROWS[3:])
    assert len(list(load_rows(str(d), "train"))) == 3
    assert len(list(load_rows(str(d), "test"))) == 2
    # without split names in file names, every file is read
    e = tmp_path / "plain"
    e.mkdir()
    write_jsonl(e / "a.jsonl", [good_row(0)])
    write_jsonl(e / "b.jsonl", [good_row(1)])
    assert [r["ground_truth"] for _, r in load_rows(str(e), "train")] == ["0", "1"]


def test_empty_directory(tmp_path):
    with pytest.raises(DataError, match="holds no"):
        list(load_rows(str(tmp_path), "train"))


def test_missing_local_file_does_not_try_the_hub(tmp_path, monkeypatch):
    import datasets

    def boom(*a, **k):
        raise AssertionError("hub must not be called for a local path")

    monkeypatch.setattr(datasets, "load_dataset", boom)
    with pytest.raises(DataError, match=r"nope\.parquet.*does not exist"):
        list(load_rows(str(tmp_path / "nope.parquet"), "train"))


def test_hub_failure_says_not_local_and_hub_unreachable(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    for ident in ("hub:someone/thing", "someone/thing"):
        with pytest.raises(DataError) as e:
            list(load_rows(ident, "train"))
        msg = str(e.value)
        assert "someone/thing" in msg and "does not exist locally" in msg and "hub" in msg and "no network" in msg


def test_hub_rows(monkeypatch):
    import datasets

    calls = []

    def fake(name, config=None, split=None):
        calls.append((name, config, split))
        return [good_row(0), good_row(1)]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    rows = list(load_rows("hub:me/toy:main", "test"))
    assert calls == [("me/toy", "main", "test")]
    assert rows[1][0] == "hub:me/toy:main [test] row 1"


# --------------------------------------------------------------------------- validation

INVALID = {
    "missing prompt": ({"data_source": "t", "ground_truth": "1"}, "'prompt'"),
    "null prompt": ({"prompt": None, "data_source": "t", "ground_truth": "1"}, "'prompt'"),
    "empty prompt": ({"prompt": "  ", "data_source": "t", "ground_truth": "1"}, "field 'prompt' is empty"),
    "empty messages": ({"prompt": [], "data_source": "t", "ground_truth": "1"}, "field 'prompt' is an empty list"),
    "blank messages": (
        {"prompt": [{"role": "user", "content": ""}], "data_source": "t", "ground_truth": "1"},
        "field 'prompt' is empty",
    ),
    "prompt wrong type": ({"prompt": 5, "data_source": "t", "ground_truth": "1"}, "field 'prompt' must be text"),
    "message not a dict": ({"prompt": ["hi"], "data_source": "t", "ground_truth": "1"}, r"'prompt'\[0\]"),
    "message without content": (
        {"prompt": [{"role": "user"}], "data_source": "t", "ground_truth": "1"},
        r"'prompt'\[0\] has no 'content'",
    ),
    "unknown role": (
        {"prompt": [{"role": "human", "content": "hi"}], "data_source": "t", "ground_truth": "1"},
        r"'prompt'\[0\] has role 'human'; known roles are system, user, assistant",
    ),
    "non-string content": (
        {"prompt": [{"role": "user", "content": 7}], "data_source": "t", "ground_truth": "1"},
        r"'prompt'\[0\]\.content must be a string or a list of parts, got int",
    ),
    "content parts that are not text or image": (
        {"prompt": [{"role": "user", "content": ["a", "b"]}], "data_source": "t", "ground_truth": "1"},
        r"'prompt'\[0\]\.content\[0\] must be \{'type': 'text', 'text': ...\} or \{'type': 'image'\}, got str",
    ),
    "missing ground truth": ({"prompt": "q", "data_source": "t"}, "no ground truth.*reward_model.ground_truth"),
    "null ground truth": ({"prompt": "q", "data_source": "t", "ground_truth": None}, "'ground_truth'.* is null"),
    "null verl ground truth": (
        {"prompt": "q", "data_source": "t", "reward_model": {"ground_truth": None, "style": "rule"}},
        "'reward_model.ground_truth'.* is null",
    ),
    "missing data_source": ({"prompt": "q", "ground_truth": "1"}, "no 'data_source'.*data.data_source"),
    "data_source not text": ({"prompt": "q", "ground_truth": "1", "data_source": 3}, "'data_source' must be text"),
    "extra_info not a mapping": (
        {"prompt": "q", "ground_truth": "1", "data_source": "t", "extra_info": [1]},
        "'extra_info' must be a mapping",
    ),
    "lone surrogate": ({"prompt": "q\ud800", "ground_truth": "1", "data_source": "t"}, "'prompt'.*lone surrogate"),
    "row not an object": ([1, 2], "must be a mapping"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_row_names_file_line_and_field(tmp_path, case):
    row, pattern = INVALID[case]
    path = write_jsonl(tmp_path / "bad.jsonl", [good_row(0), good_row(1), row])
    with pytest.raises(DataError, match=pattern) as e:
        load_samples(DataConfig(train_files=[str(path)]), Registry())
    assert f"{path} line 3: " in str(e.value)


PARQUET_INVALID = {
    "null ground truth": ({"reward_model": {"ground_truth": None, "style": "rule"}}, "'reward_model.ground_truth'"),
    "unknown role": ({"prompt": [{"role": "human", "content": "hi"}]}, r"'prompt'\[0\] has role 'human'"),
    "blank prompt": ({"prompt": [{"role": "user", "content": " "}]}, "field 'prompt' is empty"),
    "null data_source": ({"data_source": None}, "no 'data_source'"),
}


@pytest.mark.parametrize("case", list(PARQUET_INVALID))
def test_invalid_parquet_row_names_row(tmp_path, case):
    change, pattern = PARQUET_INVALID[case]
    rows = [VERL_ROWS[0], {**VERL_ROWS[1], **change}, VERL_ROWS[2]]
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(DataError, match=pattern) as e:
        load_samples(DataConfig(train_files=[str(path)]), Registry())
    assert f"{path} row 1: " in str(e.value)


def test_field_mapping_errors(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}, {"q": "x", "answer": "b"}])
    cfg = DataConfig(train_files=[str(path)], question_field="question", answer_field="answer", data_source="t")
    with pytest.raises(DataError, match=r"line 2: no field 'question' \(data.question_field\); the row has 'q'"):
        load_samples(cfg, Registry())
    path = write_jsonl(tmp_path / "qa2.jsonl", [{"question": "q"}])
    cfg = DataConfig(train_files=[str(path)], question_field="question", answer_field="answer", data_source="t")
    with pytest.raises(DataError, match=r"line 1: no field 'answer' \(data.answer_field\)"):
        load_samples(cfg, Registry())


def test_non_utf8_bytes_in_jsonl(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps({"question": "fine", "answer": "1"}).encode()
    bad = b'{"question": "caf\xe9 \xff", "answer": "2"}'
    path.write_bytes(good + b"\n" + bad + b"\n")
    cfg = DataConfig(train_files=[str(path)], question_field="question", answer_field="answer", data_source="t")
    with pytest.raises(DataError) as e:
        load_samples(cfg, Registry())
    msg = str(e.value)
    assert f"{path} line 2" in msg and "'question'" in msg and "0xe9" in msg and "UTF-8" in msg
    cfg = cfg.model_copy(update={"skip_invalid": True})
    samples, counts = load_samples(cfg, Registry())
    assert len(samples) == 1 and counts["data/invalid_rows"] == 1


def test_invalid_json_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(good_row()) + "\n{not json\n")
    with pytest.raises(DataError, match=r"broken\.jsonl line 2: not valid JSON"):
        load_samples(DataConfig(train_files=[str(path)]), Registry())
    with pytest.raises(DataError, match="line 2"):
        list(load_rows(str(path), "train"))


def test_skip_invalid_counts(tmp_path, caplog):
    rows = [good_row(0), INVALID["missing prompt"][0], good_row(1), INVALID["null ground truth"][0], good_row(2)]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    samples, counts = load_samples(DataConfig(train_files=[str(path)], skip_invalid=True), Registry())
    assert [s.ground_truth for s in samples] == ["0", "1", "2"]
    assert counts == {"data/rows": 5, "data/invalid_rows": 2, "data/samples": 3}
    assert "line 2" in caplog.text


def test_all_invalid_is_an_error_even_when_skipping(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [INVALID["missing prompt"][0]] * 2)
    with pytest.raises(DataError, match="all 2 rows were invalid.*line 1"):
        load_samples(DataConfig(train_files=[str(path)], skip_invalid=True), Registry())


def test_template_allows_rows_without_prompt():
    row = {"nums": [1, 2], "target": 3, "ground_truth": 3, "data_source": "countdown"}
    s = row_to_sample(row, "r", DataConfig(raw_template="Use {nums} to make {target}"))
    assert s.prompt == ""


def _optional_gt(completion, ground_truth=None, target=None, **context):  # reads a column when there is none
    return 1.0


def _completion_only(completion):
    return 1.0


def _needs_gt(completion, ground_truth, **context):
    return 1.0


def test_rewards_decide_whether_rows_need_a_ground_truth(tmp_path):
    """A row may leave the ground truth out when every reward of its data source scores without one: it
    gives ``ground_truth`` a default (countdown's reads TinyZero's columns then) or takes the completion alone.
    The rule is rewards.routing.ground_truth_optional, which start-up and plugrl_testing pass to load_samples."""
    import functools
    from types import SimpleNamespace

    from plugrl.rewards import trl_reward
    from plugrl.rewards.routing import ground_truth_optional
    from plugrl.specs import RewardSpec

    reg = Registry(
        rewards=[
            RewardSpec("opt", _optional_gt, ("opt", "mixed")),
            RewardSpec("fmt", _completion_only, ("fmt",)),
            RewardSpec("req", _needs_gt, ("req", "mixed")),
            trl_reward(lambda prompts, completions, **kw: [1.0] * len(prompts), name="batch", data_sources=["batch"]),
        ]
    )
    no_environment = SimpleNamespace(environment=None, environment_options={})
    rule = functools.partial(ground_truth_optional, no_environment, reg)

    def load(ds, **row):
        path = write_jsonl(tmp_path / f"{ds}.jsonl", [{"prompt": "q", "data_source": ds, "target": 3, **row}])
        return load_samples(DataConfig(train_files=[str(path)]), reg, ground_truth_optional=rule)[0]

    for ds in ("opt", "fmt"):
        [s] = load(ds)
        assert s.ground_truth is None and s.row["target"] == 3
    assert load("opt", ground_truth="3")[0].ground_truth == "3"  # one that is there is still read
    for ds in ("req", "batch", "mixed", "unrouted"):
        with pytest.raises(DataError, match=rf"{ds}.jsonl line 1: no ground truth"):
            load(ds)
    with pytest.raises(DataError, match="'ground_truth' .* is null"):  # a null one is still an error
        load("opt", ground_truth=None)
    # without the rule every row needs one
    path = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "q", "data_source": "opt"}])
    with pytest.raises(DataError, match="no ground truth"):
        load_samples(DataConfig(train_files=[str(path)]), reg)


def test_max_samples(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [good_row(i) for i in range(10)])
    samples, counts = load_samples(DataConfig(train_files=[str(path)], max_samples=4), Registry())
    assert len(samples) == 4 and counts["data/rows"] == 4


def test_files_argument_and_split(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [good_row(0)])
    val = write_jsonl(tmp_path / "val.jsonl", [good_row(1), good_row(2)])
    cfg = DataConfig(train_files=[str(train)], val_files=[str(val)])
    samples, _ = load_samples(cfg, Registry(), cfg.val_split, files=cfg.val_files)
    assert [s.ground_truth for s in samples] == ["1", "2"]


def test_dataset_from_registry():
    seen = {}

    def toy(split, n=3, prefix="q"):
        seen["split"] = split
        return ({"prompt": f"{prefix}{i}", "data_source": "toy", "ground_truth": i} for i in range(n))

    reg = Registry(datasets={"toy": DatasetSpec("toy", toy, plugin="toyplug")})
    cfg = DataConfig(dataset="toy", dataset_options={"n": 5, "prefix": "x"})
    samples, counts = load_samples(cfg, reg)
    assert seen["split"] == "train"
    assert [s.prompt for s in samples] == ["x0", "x1", "x2", "x3", "x4"]
    assert samples[4].origin == "dataset 'toy' [train] row 4"
    load_samples(cfg, reg, "test")
    assert seen["split"] == "test"


def test_dataset_errors():
    reg = Registry(datasets={"a": DatasetSpec("a", lambda split: []), "b": DatasetSpec("b", lambda split: [])})
    with pytest.raises(DataError, match="unknown dataset 'c'.*registered datasets: a, b"):
        load_samples(DataConfig(dataset="c"), reg)
    with pytest.raises(DataError, match="registered datasets: none"):
        load_samples(DataConfig(dataset="c"), Registry())

    def broken(split, **opts):
        raise FileNotFoundError("cache missing")

    reg = Registry(datasets={"x": DatasetSpec("x", broken, plugin="p")})
    with pytest.raises(DataError, match=r"dataset 'x' \(plugin p\) failed.*cache missing"):
        load_samples(DataConfig(dataset="x"), reg)
    reg = Registry(datasets={"y": DatasetSpec("y", lambda split: [{"prompt": "q", "data_source": "y"}])})
    with pytest.raises(DataError, match=r"dataset 'y' \[train\] row 0: no ground truth"):
        load_samples(DataConfig(dataset="y"), reg)


def test_dataset_and_files_together_is_ambiguous(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [good_row()])
    reg = Registry(datasets={"toy": DatasetSpec("toy", lambda split: [good_row()])})
    with pytest.raises(DataError, match="both data.dataset"):
        load_samples(DataConfig(dataset="toy", train_files=[str(path)]), reg)


def test_no_data():
    with pytest.raises(DataError, match="no data"):
        load_samples(DataConfig(), Registry())


# --------------------------------------------------------------------------- batching


def take(batcher: PromptBatcher, n: int) -> list[list[int]]:
    return [batcher.next_batch() for _ in range(n)]


def test_batcher_is_deterministic_and_epochwise():
    items = list(range(10))
    a, b = PromptBatcher(items, 3, seed=7), PromptBatcher(items, 3, seed=7)
    assert a.batches_per_epoch == 3
    assert take(a, 9) == take(b, 9)
    first = [x for batch in take(PromptBatcher(items, 3, seed=7), 3) for x in batch]
    assert len(set(first)) == 9  # one epoch: no repeats, the tail is dropped
    epochs = take(PromptBatcher(items, 3, seed=7), 6)
    assert epochs[:3] != epochs[3:]  # a new order per epoch
    assert take(PromptBatcher(items, 3, seed=8), 3) != take(PromptBatcher(items, 3, seed=7), 3)
    assert take(PromptBatcher(items, 5, shuffle=False), 2) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_batcher_iter_covers_the_rest_of_the_epoch():
    b = PromptBatcher(list(range(8)), 2, seed=1)
    assert len(list(b)) == 4 and b.state_dict()["epoch"] == 1
    b.next_batch()
    assert len(list(b)) == 3 and b.state_dict()["epoch"] == 2


def test_batcher_without_drop_last():
    b = PromptBatcher(list(range(5)), 2, shuffle=False, drop_last=False)
    assert b.batches_per_epoch == 3
    assert list(b) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4, 7])
def test_batcher_resume_continues_at_the_same_position(steps):
    items = [f"s{i}" for i in range(11)]
    run = PromptBatcher(items, 4, seed=3)
    take(run, steps)
    state = json.loads(json.dumps(run.state_dict()))  # survives a checkpoint round trip
    expected = take(run, 6)
    resumed = PromptBatcher(items, 4, seed=3)
    resumed.load_state_dict(state)
    assert take(resumed, 6) == expected


def test_batcher_resume_refuses_changed_data():
    state = PromptBatcher(list(range(10)), 2).state_dict()
    with pytest.raises(DataError, match="10 prompts, now there are 9"):
        PromptBatcher(list(range(9)), 2).load_state_dict(state)
    with pytest.raises(DataError, match="data.seed"):
        PromptBatcher(list(range(10)), 2, seed=5).load_state_dict(state)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_rank_shards_cover_the_global_batch_once(world):
    items = list(range(40))
    full = PromptBatcher(items, 8, seed=11)
    ranks = [PromptBatcher(items, 8, seed=11, rank=r, world_size=world) for r in range(world)]
    for _ in range(7):  # crosses an epoch boundary
        global_batch = full.next_global_batch()
        shares = [b.next_batch() for b in ranks]
        assert all(len(s) == 8 // world for s in shares)
        assert [x for s in shares for x in s] == global_batch  # contiguous, in order, each exactly once


def test_shard_batch_uneven():
    batch = list(range(7))
    shares = [shard_batch(batch, r, 3) for r in range(3)]
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]
    with pytest.raises(ValueError):
        shard_batch(batch, 3, 3)


def test_batcher_config_errors():
    with pytest.raises(DataError, match="not a multiple of the number of ranks"):
        PromptBatcher(list(range(10)), 3, world_size=2)
    with pytest.raises(DataError, match="only 2 prompts but data.train_batch_size is 4"):
        PromptBatcher([1, 2], 4)
    cfg = DataConfig(train_batch_size=2, seed=4, shuffle=False)
    b = PromptBatcher.from_config([Sample("p", "d", 1, origin="o")] * 4, cfg, rank=1, world_size=2)
    assert b.batch_size == 2 and b.seed == 4 and len(b.next_batch()) == 1
