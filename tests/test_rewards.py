"""plugrl.rewards: routing, weights, arguments, adapters, and failure handling in the worker pool."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the reward workers import reward_fixtures by name, via the parent's sys.path
    sys.path.insert(0, str(HERE))

import reward_fixtures as fx  # noqa: E402
from plugrl.config import RewardConfig  # noqa: E402
from plugrl.rewards import (  # noqa: E402
    RewardError,
    RewardItem,
    RewardRunner,
    check_routes,
    trl_reward,
    verl_compute_score,
)
from plugrl.rewards import pool as reward_pool  # noqa: E402
from plugrl.specs import Registry, RewardSpec  # noqa: E402


def spec(fn, *sources, name=None, weight=1.0, plugin="p"):
    return RewardSpec(name=name or fn.__name__, fn=fn, data_sources=sources, weight=weight, plugin=plugin)


def item(completion, data_source="x", ground_truth="a", prompt="Q?", **row):
    sample = fx.FakeSample(prompt=prompt, data_source=data_source, ground_truth=ground_truth, row=row, uid="u1")
    return RewardItem(sample, f"<rendered>{prompt}", completion)


def inline(*specs, **cfg):
    return RewardRunner(Registry(rewards=list(specs)), RewardConfig(num_workers=0, **cfg))


# --------------------------------------------------------------------------- routing


def test_check_routes_lists_every_missing_source_and_the_patterns():
    reg = Registry(rewards=[spec(fx.exact, "countdown", plugin="cd"), spec(fx.constant, "*_tinyv", plugin="tv")])
    routes = check_routes(reg, {"countdown", "math_tinyv"})
    assert [s.name for s in routes["countdown"]] == ["exact"]
    assert [s.name for s in routes["math_tinyv"]] == ["constant"]
    with pytest.raises(RewardError) as e:
        check_routes(reg, {"countdown", "gsm8k", "aime"})
    msg = str(e.value)
    assert "'aime', 'gsm8k'" in msg and "'countdown'" not in msg.splitlines()[0]
    assert "exact (cd): countdown" in msg and "constant (tv): *_tinyv" in msg
    assert "plugins:" in msg


def test_check_routes_reports_globs_of_two_plugins():
    reg = Registry(rewards=[spec(fx.exact, "math_t*", plugin="a"), spec(fx.constant, "*_tinyv", plugin="b")])
    with pytest.raises(RewardError, match="several plugins: a, b"):
        check_routes(reg, {"math_tinyv"})
    with pytest.raises(RewardError, match="no reward function.*'y'"):
        check_routes(Registry(), {"y"})


def test_exact_before_glob_weights_and_dict_results():
    reg_specs = [
        spec(fx.exact, "countdown"),
        spec(fx.length_bonus, "countdown", weight=0.5),
        spec(fx.constant, "*"),
    ]
    with inline(*reg_specs, weights={"exact": 2.0}, options={"length_bonus": {"scale": 2.0}}) as r:
        out = r.score([item("a", "countdown"), item("bbbbb", "countdown"), item("a", "other")])
    # exact (weight 2 from cfg) + length_bonus (spec weight 0.5, scale 2)
    assert out.scores == pytest.approx([2.0 + 0.5 * 0.2, 0.0 + 0.5 * 1.0, 0.25])
    assert out.details[0] == {
        "exact": 1.0,
        "length_bonus": pytest.approx(0.2),
        "length_bonus/length": 1,
        "error": False,
        "timeout": False,
    }
    assert "exact" not in out.details[2] and out.details[2]["constant"] == 0.25
    m = out.metrics
    assert m["reward/exact/mean"] == 0.5 and m["reward/length_bonus/mean"] == pytest.approx(0.6)
    assert m["reward/constant/mean"] == 0.25
    assert m["reward/mean"] == pytest.approx(sum(out.scores) / 3)
    assert m["reward/std"] > 0 and m["reward/errors"] == 0 and m["reward/timeouts"] == 0 and m["reward/time_s"] >= 0


def test_unrouted_data_source_raises():
    with inline(spec(fx.exact, "x")) as r, pytest.raises(RewardError, match="'nope'"):
        r.score([item("a", "nope")])


def test_empty_batch():
    with inline(spec(fx.exact, "x")) as r:
        out = r.score([])
    assert out.scores == [] and out.metrics["reward/mean"] == 0.0


# --------------------------------------------------------------------------- arguments


def test_context_keywords_row_columns_and_options():
    specs = [spec(fx.uses_context, "cd"), spec(fx.takes_kwargs, "cd"), spec(fx.sample_kind, "cd")]
    with inline(*specs, options={"takes_kwargs": {"mode": "strict"}}) as r:
        it = item("x", "cd", prompt="P", nums=[1, 2], target=3, ground_truth_col="ignored")
        it.sample.extra_info = {"split": "train"}
        out = r.score([it])
    d = out.details[0]
    assert d["uses_context"] == 1.0
    assert d["uses_context/seen"] == "cd|<rendered>P|[1, 2]|3|{'split': 'train'}"
    # **kwargs gets every context keyword, every extra column and its options
    assert d["takes_kwargs/keys"] == "data_source,extra_info,ground_truth_col,mode,nums,prompt,sample,target"
    assert d["sample_kind/kind"] == "FakeSample" and d["sample_kind/uid"] == "u1"


def test_row_columns_named_like_context_keys_are_not_passed_twice():
    with inline(spec(fx.takes_kwargs, "x")) as r:
        it = item("a", prompt="P")
        it.sample.row = {"prompt": "raw", "data_source": "x", "sample": "row", "completion": "c", "ground_truth": "g"}
        out = r.score([it])
    assert out.details[0]["takes_kwargs/keys"] == "data_source,extra_info,prompt,sample"
    assert out.scores == [0.5]


def test_bad_options_and_signatures_fail_at_construction():
    with pytest.raises(RewardError, match=r"options.exact sets scale, which reward 'exact' of plugin 'p' does not"):
        inline(spec(fx.exact, "x"), options={"exact": {"scale": 1}})
    with pytest.raises(RewardError, match="which the kernel passes itself"):
        inline(spec(fx.takes_kwargs, "x"), options={"takes_kwargs": {"prompt": "p"}})

    def takes_nothing():
        return 1.0

    with pytest.raises(RewardError, match="must take .completion, ground_truth"):
        inline(spec(takes_nothing, "x"))
    inline(spec(fx.takes_kwargs, "x"), options={"takes_kwargs": {"anything": 1}})  # **kwargs takes any option
    verl = verl_compute_score(fx.verl_score, data_sources=["g"])
    with pytest.raises(RewardError, match="sets bogus, which reward .verl_score. does not take; it takes: format_s"):
        inline(verl, options={"verl_score": {"bogus": 1}})
    with pytest.raises(ValueError, match="fork is unsafe"):
        RewardRunner(Registry(), RewardConfig(), start_method="fork")


def test_a_reward_without_ground_truth_gets_the_completion_alone():
    with inline(spec(fx.no_ground_truth, "x")) as runner:
        out = runner.score([item("anything", "x", ground_truth="ignored")])
    assert out.scores == [1.0]


def test_unpicklable_function_needs_inline_mode():
    local = lambda completion, ground_truth: 1.0  # noqa: E731
    with pytest.raises(RewardError, match="module-level function.*num_workers=0"):
        RewardRunner(Registry(rewards=[spec(local, "x", name="local")]), RewardConfig(num_workers=1))
    with inline(spec(local, "x", name="local")) as r:
        assert r.score([item("a")]).scores == [1.0]


@pytest.mark.parametrize(
    ("completion", "message"),
    [
        ("raise", "ValueError: boom"),
        ("nan", "non-finite"),
        ("inf", "non-finite"),
        ("text", "returned str '1.0', expected a float"),
        ("none", "returned NoneType"),
        ("nodict", "without 'score'"),
        ("exit", "SystemExit: 3"),
    ],
)
def test_bad_results_score_error_score_inline(completion, message):
    with inline(spec(fx.behave, "x"), error_score=-1.0) as r:
        out = r.score([item(completion), item("a")])
    assert out.scores == [-1.0, 1.0]
    assert out.details[0]["error"] is True and out.details[0]["timeout"] is False
    assert message in out.details[0]["behave/error"]
    assert out.metrics["reward/errors"] == 1 and out.metrics["reward/behave/mean"] == 0.0


# --------------------------------------------------------------------------- worker pool


def test_pool_timeout_errors_and_adapters():
    reg = Registry(
        rewards=[
            spec(fx.behave, "x"),
            verl_compute_score(fx.verl_score, data_sources=["openai/gsm8k"]),
            spec(fx.sample_kind, "kind"),
        ]
    )
    # 3 s: the first call of a fresh worker imports the fixtures, which took over 1 s on a loaded 2-core machine
    cfg = RewardConfig(num_workers=2, timeout_s=3.0, error_score=-1.0, options={"verl_score": {"format_score": 0.1}})
    with RewardRunner(reg, cfg) as r:
        completions = ["hang", "a", "raise", "b", "nan", "slow", "a", "exit", "a"]
        t0 = time.perf_counter()
        out = r.score([item(c) for c in completions])
        elapsed = time.perf_counter() - t0
        assert elapsed < 9.0  # one timeout (3 s) plus a pool restart
        assert out.scores == [-1.0, 1.0, -1.0, 0.0, -1.0, 0.0, 1.0, -1.0, 1.0]
        hang = out.details[0]
        assert hang["timeout"] is True and hang["error"] is False and "timed out after 3s" in hang["behave/error"]
        assert out.details[2]["behave/error"] == "ValueError: boom"
        assert "SystemExit" in out.details[7]["behave/error"]
        m = out.metrics
        assert (m["reward/timeouts"], m["reward/errors"], m["reward/pool_restarts"]) == (1, 3, 1)

        # the fresh pool works; verl adapter and a real pickled sample go through the workers
        gsm = [
            item("so #### 42", "openai/gsm8k", "42"),
            item("no marker", "openai/gsm8k", "42"),
            item("#### 41", "openai/gsm8k", "42"),
        ]
        gsm[0].sample.extra_info = {"split": "test"}
        out = r.score([*gsm, item("a", "kind")])
        assert out.scores == [1.0, 0.1, 0.0, 1.0]
        assert out.details[0]["verl_score/acc"] is True and out.details[0]["verl_score/split"] == "test"
        assert out.details[3]["sample_kind/kind"] == "FakeSample"
        assert out.metrics["reward/pool_restarts"] == 0 and out.metrics["reward/errors"] == 0
        assert r.pool_restarts == 1


def test_pool_survives_a_worker_that_dies():
    reg = Registry(rewards=[spec(fx.behave, "x")])
    with RewardRunner(reg, RewardConfig(num_workers=2, timeout_s=5.0, error_score=-1.0)) as r:
        out = r.score([item(c) for c in ["a", "crash", "a", "b", "a", "a"]])
        # only the sample that killed its worker scores error_score; the others that were running are rerun
        assert out.scores == [1.0, -1.0, 1.0, 0.0, 1.0, 1.0]
        assert "worker process died" in out.details[1]["behave/error"]
        assert out.metrics["reward/errors"] == 1 and out.metrics["reward/pool_restarts"] >= 1
        later = r.score([item("a"), item("b"), item("a")])
        assert later.scores == [1.0, 0.0, 1.0] and later.metrics["reward/pool_restarts"] == 0


def test_function_that_keeps_killing_workers_is_given_up(monkeypatch):
    monkeypatch.setattr(reward_pool, "CRASH_LIMIT", 1)
    reg = Registry(rewards=[spec(fx.behave, "x"), spec(fx.exact, "y")])
    with RewardRunner(reg, RewardConfig(num_workers=2, timeout_s=5.0)) as r:
        out = r.score([item("crash"), item("crash"), item("a", "y"), item("crash")])
    assert out.scores == [0.0, 0.0, 1.0, 0.0]
    assert sum("not run" in d.get("behave/error", "") for d in out.details) == 2
    assert out.metrics["reward/errors"] == 3


def _pids(out):
    return {d["worker_pid/pid"] for d in out.details if "worker_pid/pid" in d}


def _same_workers(runner, batches=3):
    """The worker pids over several batches of plain calls, none of which restarts the pool."""
    pids = set()
    for _ in range(batches):
        out = runner.score([item("a") for _ in range(6)])
        assert out.scores == [1.0] * 6 and out.metrics["reward/pool_restarts"] == 0
        pids |= _pids(out)
    return pids


def test_pool_is_built_once_and_replaced_only_after_a_crash_or_a_timeout():
    reg = Registry(rewards=[spec(fx.worker_pid, "x")])
    cfg = RewardConfig(num_workers=2, timeout_s=1.0, error_score=-1.0)
    with RewardRunner(reg, cfg) as r:
        first = _same_workers(r)
        assert 1 <= len(first) <= 2  # the same workers served every batch: no pool per score() call
        assert r.pool_restarts == 0

        out = r.score([item("crash")])  # alone in the pool: it killed its worker
        assert out.scores == [-1.0] and out.metrics["reward/pool_restarts"] == 1
        second = _same_workers(r)
        assert 1 <= len(second) <= 2 and not second & first  # a fresh pool, then kept again

        out = r.score([item("hang")])
        assert out.details[0]["timeout"] is True and out.metrics["reward/pool_restarts"] == 1
        third = _same_workers(r)
        assert 1 <= len(third) <= 2 and not third & (first | second)
        assert r.pool_restarts == 2

    # without start(): the pool is built on the first batch and kept, not built per batch
    lazy = RewardRunner(reg, cfg)
    try:
        assert 1 <= len(_same_workers(lazy)) <= 2 and lazy.pool_restarts == 0
    finally:
        lazy.close()


def test_real_sample_pickles_to_workers():
    data = pytest.importorskip("plugrl.data")
    sample = data.Sample(prompt="p", data_source="kind", ground_truth="g", row={"a": 1}, origin="t row 0")
    with RewardRunner(Registry(rewards=[spec(fx.sample_kind, "kind")]), RewardConfig(num_workers=1)) as r:
        out = r.score([RewardItem(sample, "p", "c")])
    assert out.details[0]["sample_kind/kind"] == "Sample" and out.details[0]["sample_kind/uid"] == sample.uid


# --------------------------------------------------------------------------- async


@pytest.mark.parametrize("max_concurrency", [10, 3])
def test_async_runs_concurrently_under_the_semaphore(max_concurrency):
    fx.ASYNC_STATE.update(running=0, peak=0, calls=0)
    with inline(spec(fx.async_judge, "x"), max_concurrency=max_concurrency) as r:
        out = r.score([item("a" if i % 2 else "b") for i in range(10)])
    assert fx.ASYNC_STATE["calls"] == 10 and fx.ASYNC_STATE["peak"] == max_concurrency
    assert out.scores == [0.0, 1.0] * 5
    assert out.details[1]["async_judge/judge"] == "fake" and out.metrics["reward/async_judge/mean"] == 0.5


def test_async_timeout_and_errors_alongside_the_pool():
    reg = Registry(rewards=[spec(fx.async_judge, "x"), spec(fx.exact, "x")])
    cfg = RewardConfig(num_workers=1, timeout_s=0.5, error_score=-1.0, options={"async_judge": {"delay": 0.01}})
    with RewardRunner(reg, cfg) as r:
        out = r.score([item("hang"), item("raise"), item("a")])
        again = r.score([item("a")])  # the loop is kept across batches
    assert out.scores == [-1.0 + 0.0, -1.0 + 0.0, 2.0]
    assert out.details[0]["timeout"] is True and out.details[1]["error"] is True
    assert "judge unavailable" in out.details[1]["async_judge/error"]
    m = out.metrics
    assert (m["reward/timeouts"], m["reward/errors"], m["reward/pool_restarts"]) == (1, 1, 0)
    assert again.scores == [2.0]


def test_async_verl_adapter():
    s = verl_compute_score(fx.verl_async_score, data_sources=("math",))
    assert s.name == "verl_async_score"
    with inline(s) as r:
        assert r.score([item("4", "math", "4"), item("5", "math", "4")]).scores == [1.0, 0.0]


# --------------------------------------------------------------------------- TRL batch functions


def test_trl_batch_function_with_none_and_conversational_prompts():
    fx.TRL_CALLS.clear()
    reg = Registry(rewards=[trl_reward(fx.trl_accuracy, data_sources=("x",), weight=2.0), spec(fx.constant, "x")])
    chat = [{"role": "user", "content": "2+2?"}]
    with RewardRunner(reg, RewardConfig(num_workers=0, options={"trl_accuracy": {"flag": True}})) as r:
        out = r.score(
            [
                item("4", prompt=chat, solution="4"),
                item("5", prompt=chat, solution=None),
                item("3", prompt=chat, solution="4"),
            ]
        )
    assert len(fx.TRL_CALLS) == 1  # once per batch
    call = fx.TRL_CALLS[0]
    assert call["prompts"] == [chat] * 3
    assert call["completions"][0] == [{"role": "assistant", "content": "4"}]
    assert call["kwargs"]["flag"] is True and call["kwargs"]["ground_truth"] == ["a"] * 3
    assert out.scores == [2.0 + 0.25, 0.25, 0.25]  # None: trl_accuracy does not count for that sample
    assert out.details[1]["trl_accuracy"] is None
    assert out.metrics["reward/trl_accuracy/mean"] == 0.5  # over the two samples it scored


def test_trl_adapter_filters_keywords_and_reports_bad_batches():
    reg = Registry(
        rewards=[
            trl_reward(fx.trl_strict, data_sources=("s",)),
            trl_reward(fx.trl_wrong_length, name="wrong", data_sources=("w",)),
        ]
    )
    with RewardRunner(reg, RewardConfig(num_workers=0, error_score=-1.0)) as r:
        out = r.score([item("4", "s", solution="4"), item("x", "w"), item("y", "w")])
    assert out.scores == [1.0, -1.0, -1.0]
    assert "returned 1 scores for 2 completions" in out.details[1]["wrong/error"]
    assert out.metrics["reward/errors"] == 2


def test_adapters_are_picklable_specs():
    import pickle

    for s in (trl_reward(fx.trl_accuracy), verl_compute_score(fx.verl_score, data_sources=["a"], name="v")):
        clone = pickle.loads(pickle.dumps(s.fn))
        assert type(clone) is type(s.fn) and clone.fn is s.fn.fn
    assert trl_reward(fx.trl_accuracy).data_sources == ("*",)
    with pytest.raises(TypeError):
        verl_compute_score(fx.verl_score, data_sources="gsm8k")
