"""Seed 003 exactly (issue 38, point 8): TinyV's verl fork with an RRM-style verifier model, with the seed's keys
(``reward_model.tinyv_setup`` / ``tinyv_weight``, data sources ``*_tinyv``, a verifier served beside training).

- The seed's keys set no template; a rubric reward model answers the default ``tinyv`` template's True/False
  question with ``Total Score: 7/10``. Today's failure: every reply was ``NoVerdict`` and scored 0 in silence.
  Now the run start asks the verifier one known question and stops, naming ``reward.options.tinyv.template``.
- The seed's script waits for ``vllm serve`` (50 tries 10 s apart) and exits when it never answers: the run start
  waits (``wait_s``, with progress lines) and stops with an error naming ``base_url``.
- Verifications that keep failing (``max_failures_in_a_row``) stop the run naming the server, before it trains on
  fallback scores.

The verifier is ``StandInOpenAI`` (tests/stand_in_openai.py) on 127.0.0.1: a real RRM model cannot run on this
CPU-only machine, so the stand-in answers as one does (a review ending in ``Total Score: x/10``). Everything else is
real: the tinyv plugin's hooks, its OpenAI client, the kernel's reward runner, and ``plugrl train`` in the slow test.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from types import SimpleNamespace

import pytest

import plugrl_tinyv as tv
from plugrl.config import RewardConfig, build_config
from plugrl.data import Sample
from plugrl.plugins import check_config, load_plugins
from plugrl.rewards import RewardItem, RewardRunner, StopRun
from plugrl_tinyv import readiness
from stand_in_openai import StandInOpenAI, error

RRM = "rubric-model"  # the seed's VERIFIER_MODEL ("rubric model path"), served under that name
RRM_REPLY = "The answer matches the reference and the steps are sound.\nTotal Score: 7/10"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed_options(base_url: str, **more) -> dict:
    """reward.options.tinyv as the seed's keys make it (reward_model.tinyv_setup/tinyv_weight), with the verifier's
    name and URL (the fork hard-codes http://localhost:8000)."""
    cfg = build_config(
        {"model": {"path": "m"}, "data": {"train_files": ["x.parquet"]}, "plugins": ["tinyv"]},
        [
            "reward_model.tinyv_setup=tinyv_only",
            "reward_model.tinyv_weight=1.0",
            f"+reward.options.tinyv.model={RRM}",
            f"+reward.options.tinyv.base_url={base_url}",
            *[f"+reward.options.tinyv.{k}={v}" for k, v in more.items()],
        ],
    )
    assert check_config(cfg, load_plugins(cfg.plugins)) is None or True  # validated: defaults filled in
    return cfg.reward.options["tinyv"]


def run_start(options: dict) -> None:
    tv.plugrl_run_start(config=SimpleNamespace(reward=RewardConfig(options={"tinyv": options})), run_dir=None)


def items(n: int) -> list[RewardItem]:
    sample = Sample(prompt="What is 7 + 5?", data_source="polaris_tinyv", ground_truth="12")
    return [RewardItem(sample, "What is 7 + 5?", f"The answer is \\boxed{{{12 + i}}}.") for i in range(n)]


def test_the_seeds_keys_with_a_rubric_model_stop_at_start_naming_the_template_key():
    with StandInOpenAI(RRM_REPLY, models={RRM: 15000}) as rrm:
        opts = seed_options(rrm.base_url)
        assert (opts["setup"], opts["weight"], opts["template"]) == ("tinyv_only", 1.0, "tinyv")
        with pytest.raises(tv.OptionError) as e:
            run_start(opts)
        asked = [r["body"]["model"] for r in rrm.requests]
    message = str(e.value)
    assert "the verifier answers the tinyv template with a rubric score (Total Score: x/10)" in message
    assert "set reward.options.tinyv.template: rubric" in message and "Total Score: 7/10" in message
    assert asked == [RRM]  # one probe request
    # the fix the message names: the rubric template; the probe passes and the verdict is the rubric's
    with StandInOpenAI(RRM_REPLY, models={RRM: 15000}) as rrm:
        opts = seed_options(rrm.base_url, template="rubric")
        run_start(opts)
        registry = load_plugins(["tinyv"])
        with RewardRunner(registry, RewardConfig(options={"tinyv": opts}, num_workers=0)) as runner:
            out = runner.score(items(2))
    assert out.scores == [pytest.approx(0.7)] * 2 and out.metrics["reward/tinyv/verifier_failed"] == 0.0


def test_a_reply_cut_before_its_verdict_is_probed_in_the_other_template():
    """A rubric model under the tinyv template's 16-token budget writes no Total Score in its first reply: the
    probe asks the rubric template too, and the start names the key to set."""

    def answer(request):
        return RRM_REPLY if request["body"]["max_tokens"] >= 512 else "The answer matches the reference and"

    with StandInOpenAI(answer, models={RRM: 15000}) as rrm:
        with pytest.raises(tv.OptionError, match="set reward.options.tinyv.template: rubric"):
            run_start(seed_options(rrm.base_url))
        assert [r["body"]["max_tokens"] for r in rrm.requests] == [16, 512]


def test_a_true_false_verifier_under_the_rubric_template_is_named_too(caplog):
    with StandInOpenAI("True", models={"tinyv-1.5b": 4096}) as verifier:
        opts = seed_options(verifier.base_url, template="rubric", model="tinyv-1.5b")
        with pytest.raises(tv.OptionError, match="a True/False verifier; set reward.options.tinyv.template: tinyv"):
            run_start(opts)
    with StandInOpenAI("I cannot tell.", models={RRM: 4096}) as vague, caplog.at_level(logging.WARNING):
        run_start(seed_options(vague.base_url))  # neither form: logged, not stopped
    assert "answered the probe question with no verdict of either form" in caplog.text


def test_a_verifier_that_is_not_up_is_waited_for_with_progress(monkeypatch, caplog):
    monkeypatch.setattr(readiness, "WAIT_EVERY_S", 0.2)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    servers = []  # refused until it starts, a second in

    def serve() -> None:
        servers.append(StandInOpenAI(RRM_REPLY, models={RRM: 15000}, port=port).start())

    timer = threading.Timer(1.0, serve)
    timer.start()
    try:
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="plugrl.tinyv"):
            run_start(seed_options(base_url, template="rubric", wait_s=30))
        waited = time.monotonic() - started
    finally:
        timer.join()
        for server in servers:
            server.stop()
    lines = [r.getMessage() for r in caplog.records if "waiting for the verifier" in r.getMessage()]
    assert (
        lines and lines[0] == f"tinyv: waiting for the verifier server at {base_url} to answer GET /models... (1/150)"
    )
    assert 0.8 < waited < 10


def test_a_verifier_that_never_answers_stops_the_run_naming_base_url(monkeypatch, caplog):
    monkeypatch.setattr(readiness, "WAIT_EVERY_S", 0.2)
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="plugrl.tinyv"), pytest.raises(tv.OptionError) as e:
        run_start(seed_options(base_url, wait_s=1))
    assert time.monotonic() - started < 5
    assert str(e.value).startswith(
        f"tinyv: the verifier server at {base_url} (reward.options.tinyv.base_url) did not answer GET /models within "
        "1s (reward.options.tinyv.wait_s)"
    )
    assert "waiting for the verifier" in caplog.text and "(5/5)" in caplog.text


def test_failures_in_a_row_stop_the_run_naming_the_server():
    """The server answers GET /models but every verification fails (HTTP 503): the batch that reaches the limit
    raises StopRun out of the runner (the trainer stops there, before training on it); below the limit the
    fallback scores as before."""
    with StandInOpenAI(lambda request: error(503, "overloaded"), models={RRM: 15000}) as down:
        opts = seed_options(down.base_url, template="rubric", retries=0, max_failures_in_a_row=4, probe=False)
        run_start(opts)
        registry = load_plugins(["tinyv"])
        with RewardRunner(registry, RewardConfig(options={"tinyv": opts}, num_workers=0)) as runner:
            out = runner.score(items(3))  # 3 in a row: scored with the fallback, marked
            assert out.scores == [0.0] * 3 and out.metrics["reward/tinyv/verifier_failed"] == 1.0
            with pytest.raises(StopRun) as e:
                runner.score(items(2))
    message = str(e.value)
    assert f"the verifier {RRM!r} at {down.base_url} failed" in message and "verifications in a row" in message
    assert "max_failures_in_a_row=4" in message and "HTTP 503" in message and "max_failures_in_a_row: 0" in message


def test_a_success_resets_the_count_and_zero_never_stops():
    replies = iter([error(503), error(503), RRM_REPLY] + [error(503)] * 10)
    with StandInOpenAI(lambda request: next(replies), models={RRM: 15000}) as flaky:
        opts = seed_options(flaky.base_url, template="rubric", retries=0, max_failures_in_a_row=3, probe=False)
        run_start(opts)
        registry = load_plugins(["tinyv"])
        with RewardRunner(registry, RewardConfig(options={"tinyv": opts}, num_workers=0, max_concurrency=1)) as r:
            assert r.score(items(3)).scores == [0.0, 0.0, pytest.approx(0.7)]  # 2 failures, then a verdict
            r.score(items(2))  # 2 in a row: under 3
            with pytest.raises(StopRun):
                r.score(items(1))
        never = {**opts, "max_failures_in_a_row": 0}
        with RewardRunner(registry, RewardConfig(options={"tinyv": never}, num_workers=0)) as r:
            assert r.score(items(5)).scores == [0.0] * 5


def test_a_template_mismatch_at_run_time_is_named_in_every_failure():
    """With the probe off, a rubric reply under the tinyv template is a failure that is not retried, whose reason
    names the key to set; enough of them stop the run with that reason."""
    with StandInOpenAI(RRM_REPLY, models={RRM: 15000}) as rrm:
        opts = seed_options(rrm.base_url, probe=False, max_failures_in_a_row=2)
        run_start(opts)
        registry = load_plugins(["tinyv"])
        with RewardRunner(registry, RewardConfig(options={"tinyv": opts}, num_workers=0, max_concurrency=1)) as r:
            out = r.score(items(1))
            assert out.details[0]["tinyv/requests"] == 1  # not retried: the same reply would come back
            assert "set reward.options.tinyv.template: rubric" in out.details[0]["tinyv/failure"]
            with pytest.raises(StopRun, match="set reward.options.tinyv.template: rubric"):
                r.score(items(1))


def _seed_run(tmp_path, tiny_model, verifier_url: str, *extra: str) -> list[str]:
    """`plugrl train` of seed 003's keys (tinyv_only, weight 1.0, `*_tinyv` and `polaris` rows, Prime Math as the
    fallback), cut to one GRPO step of the tiny model on the HF engine."""
    from test_seeds import verl_row, write_parquet

    rows = [verl_row("polaris_tinyv", "What is 7 + 5?", "12", i) for i in range(2)]
    rows += [verl_row("polaris", "What is 6 + 6?", "12", 2 + i) for i in range(2)]
    train = write_parquet(tmp_path / "train_polaris.parquet", rows)
    config = tmp_path / "seed003.yaml"
    config.write_text(
        "plugins: [tinyv, verl_default, advantages]\n"
        f"reward: {{default: verl_prime_math, options: {{tinyv: {{model: {RRM}, base_url: '{verifier_url}'}}}}}}\n"
    )
    return [
        "train",
        str(config),
        f"data.train_files={train}",
        "data.train_batch_size=4",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={tiny_model}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "reward_model.reward_manager=prime",
        "reward_model.tinyv_setup=tinyv_only",
        "reward_model.tinyv_weight=1.0",
        "model.dtype=float32",
        "trainer.total_steps=1",
        "trainer.save_freq=0",
        f"trainer.output_dir={tmp_path / 'runs'}",
        "trainer.experiment_name=seed003",
        *extra,
    ]


def _steps(metrics) -> list[dict]:
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


@pytest.mark.slow
def test_plugrl_train_with_the_seeds_keys(tmp_path, tiny_model, capsys):
    """The seed's keys with a rubric model: the start stops naming the template key (exit 2, no step); with it set,
    the run trains one step, polaris scored by Prime Math; a verifier that then fails every request stops the run
    naming the server, before the step trains."""
    from plugrl.cli import main

    metrics = tmp_path / "runs" / "seed003" / "metrics.jsonl"
    with StandInOpenAI(RRM_REPLY, models={RRM: 15000}) as rrm:
        assert main(_seed_run(tmp_path, tiny_model, rrm.base_url)) == 2
        err = capsys.readouterr().err
        assert "set reward.options.tinyv.template: rubric" in err and not _steps(metrics)
        assert main(_seed_run(tmp_path, tiny_model, rrm.base_url, "+reward.options.tinyv.template=rubric")) == 0
    (m,) = _steps(metrics)
    assert m["reward/tinyv/mean"] == pytest.approx(0.7) and m["reward/tinyv/verifier_failed"] == 0.0
    assert "reward/verl_prime_math/mean" in m

    with StandInOpenAI(lambda request: error(503, "overloaded"), models={RRM: 15000}) as down:
        argv = _seed_run(
            tmp_path,
            tiny_model,
            down.base_url,
            "+reward.options.tinyv.template=rubric",
            "+reward.options.tinyv.retries=0",
            "+reward.options.tinyv.max_failures_in_a_row=4",
            "trainer.experiment_name=seed003_down",
        )
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"the verifier {RRM!r} at {down.base_url} failed 4 verifications in a row" in err
    assert not _steps(tmp_path / "runs" / "seed003_down" / "metrics.jsonl")  # no step trained on fallback zeros
