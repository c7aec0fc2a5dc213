"""skyrl-gym's environments train unchanged through the plugin ``skyrl_gym`` (plugins/envs_skyrl_gym):
``environment: skyrl_gym:<id>`` loads the id from skyrl-gym's own registry, and each episode makes the
environment with the sample's row as SkyRL's ``extras``.

On the real library (skyrl-gym 0.4.0), no mocks: episodes run through the kernel's EpisodeRunner with
scripted replies (the helpers of tests/test_multiturn.py and tests/test_trl_environments.py), and their
scores and observations are compared with the same environment made and stepped directly with
``skyrl_gym.make`` on the same replies. Then the bad inputs (an unknown id, the library missing, rows without
the fields an environment reads, servers and files it needs), and two training steps end to end."""

from __future__ import annotations

import copy
import json
import re
import socket
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from plugrl.config import DataConfig, load_config
from plugrl.data import row_to_sample
from plugrl.plugins import load_plugins
from plugrl_envs_skyrl_gym import plugrl_run_start
from plugrl_envs_skyrl_gym import skyrl_gym as skyrl_gym_family
from plugrl_multiturn.routing import load_environment_families
from test_multiturn import SAMPLING, _runner, _start
from test_trl_environments import _scripted
from tiny_runs import train_two_steps

GUESS = "plugrl_test_guess"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


class Guess(BaseTextEnv):
    """A skyrl-gym environment as its users write one: guess ``reward_spec.ground_truth``. Each reply earns
    0.1 for a number and 1.0 for the right one (per-turn rewards); a wrong one gets a hint (the words come
    from ``env_config``); done when right or after ``max_turns`` replies."""

    closed: ClassVar[list[int]] = []

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = extras or {}
        assert "reward_spec" in extras, "reward_spec field is required"
        self.secret = int(extras["reward_spec"]["ground_truth"])
        self.max_turns = extras.get("max_turns", 3)
        self.up = (env_config or {}).get("up", "Higher.")

    def init(self, prompt):
        return [{"role": "system", "content": "Guess the number."}, *prompt], {"secret_digits": 2}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        numbers = re.findall(r"-?\d+", action)
        guess = int(numbers[-1]) if numbers else None
        right = guess == self.secret
        done = right or self.turns >= self.max_turns
        hint = self.up if guess is None or guess < self.secret else "Lower."
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": "user", "content": hint}],
            reward=1.0 if right else 0.1 if guess is not None else 0.0,
            done=done,
            metadata={"guess": -1 if guess is None else guess, "right": right, "history": [action]},
        )

    def close(self):
        Guess.closed.append(self.secret)


@pytest.fixture(scope="module", autouse=True)
def registered_guess():
    skyrl_gym.register(id=GUESS, entry_point=Guess)
    yield
    skyrl_gym.envs.registration.deregister(GUESS)


@pytest.fixture(autouse=True)
def reset_closed():
    Guess.closed.clear()


# --------------------------------------------------------------------------- helpers


def skyrl_row(question: str, answer: str, env_class: str | None = None, **extra: Any) -> dict[str, Any]:
    """A row as SkyRL's dataset scripts write one (examples/train/gsm8k/gsm8k_dataset.py)."""
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "reward_spec": {"method": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": 0, **extra},
    }
    if env_class:
        row["env_class"] = env_class
    return row


def sample_of(row: dict[str, Any], origin: str):
    return row_to_sample(row, origin, DataConfig(), ground_truth_optional=lambda _: True)


def run_config(tmp_path: Path, environment: str, *overrides: str):
    (tmp_path / "run.yaml").write_text("plugins: [skyrl_gym, advantages]\nmodel: {path: none}\n")
    return load_config(tmp_path / "run.yaml", [f"environment={environment}", *overrides])


def load(tmp_path: Path, environment: str, *overrides: str):
    """The run's config and what the kernel's start-up loads for ``environment`` (its problems, if any)."""
    cfg = run_config(tmp_path, environment, *overrides)
    registry = load_plugins(["skyrl_gym"])
    problems: list[str] = []
    load_environment_families(cfg, registry, problems)
    return cfg, registry.environments.get(environment), problems


def library_play(env_id: str, row: dict[str, Any], replies: list[str], env_config=None, max_turns=None):
    """The environment made and stepped directly with skyrl-gym, as SkyRL's generator does: extras are the
    row less prompt and env_class, plus max_turns. Returns (the summed reward, the observations, done)."""
    extras = {k: copy.deepcopy(v) for k, v in row.items() if k not in ("prompt", "env_class")}
    if max_turns is not None:
        extras["max_turns"] = max_turns
    env = skyrl_gym.make(env_id, env_config=env_config if env_config is not None else {}, extras=extras)
    env.init(copy.deepcopy(row["prompt"]))
    total, observations, done = 0.0, [], False
    for reply in replies:
        out = env.step(reply)
        total += out["reward"]
        observations += out["observations"]
        done = out["done"]
        if done:
            break
    env.close()
    return total, observations, done


def play(tok, spec, samples, replies: dict[str, list[str]], max_turns: int = 3):
    """Each sample's episode through the kernel's EpisodeRunner, the policy's replies scripted by prompt text."""
    runner, _, _ = _runner(_scripted(tok, {k: list(v) for k, v in replies.items()}), tok, max_turns=max_turns)
    return [c for _, c in runner.run([_start(tok, s, spec.factory) for s in samples], SAMPLING)]


def env_messages(conversation) -> list[dict[str, str]]:
    """The environment's messages between the policy's turns (after the first reply)."""
    first = next(i for i, m in enumerate(conversation.messages) if m["role"] == "assistant")
    return [m for m in conversation.messages[first:] if m["role"] != "assistant"]


# --------------------------------------------------------------------------- a registered environment


def test_a_registered_environment_scores_as_the_library_does(smol_tokenizer, tmp_path):
    """Two episodes at once, each with its own environment: init's messages open the conversation, the
    observations follow each reply, the score is the sum of the per-turn rewards, the numbers and text of
    the metadata are the episode's info, environment_options reach env_config, and close() runs at the end."""
    cfg, spec, problems = load(tmp_path, f"skyrl_gym:{GUESS}", "environment_options.up=Go up.")
    assert problems == [] and spec.scores_episodes and spec.family == "skyrl_gym"
    rows = [skyrl_row("Guess 0: a number.", "42"), skyrl_row("Guess 1: a number.", "7")]
    replies = {"Guess 0": ["Is it 10?", "Then 50.", "42"], "Guess 1": ["no idea", "7"]}
    played = play(smol_tokenizer, spec, [sample_of(r, f"rows.jsonl line {i + 1}") for i, r in enumerate(rows)], replies)
    assert sorted(Guess.closed) == [7, 42]  # each episode's environment, once
    for row, key, c in zip(rows, replies, played, strict=True):
        total, observations, done = library_play(GUESS, row, replies[key], env_config={"up": "Go up."})
        assert (c.finish, c.error) == ("done", None) and done
        assert c.reward == pytest.approx(total)
        assert env_messages(c) == observations
        assert c.messages[:2] == [{"role": "system", "content": "Guess the number."}, *row["prompt"]]
        assert [m["content"] for m in c.messages if m["role"] == "assistant"] == replies[key][: c.turns]
    assert played[0].reward == pytest.approx(1.2) and played[1].reward == pytest.approx(1.0)
    assert env_messages(played[0]) == [{"role": "user", "content": "Go up."}, {"role": "user", "content": "Lower."}]
    assert played[0].info == {"guess": 42, "right": 1.0}  # the list in the metadata is left out


def test_plugrls_limits_end_an_episode_with_the_rewards_so_far(smol_tokenizer, tmp_path):
    """rollout.max_turns below the environment's own limit: the episode ends as max_turns, reward() gives the
    sum of the rewards its steps gave (the library's sum for the same replies) and closes it. After run start
    (plugrl_run_start) extras carry max_turns = rollout.max_turns, as SkyRL's generator sets them, and the
    environment itself ends the episode at that turn."""
    row = skyrl_row("Guess 0: a number.", "42")
    replies = ["1", "2", "3"]
    cfg, spec, _ = load(tmp_path, f"skyrl_gym:{GUESS}", "rollout.max_turns=2")
    (cut,) = play(smol_tokenizer, spec, [sample_of(row, "rows.jsonl line 1")], {"Guess 0": replies}, max_turns=2)
    assert (cut.finish, cut.turns) == ("max_turns", 2)
    assert Guess.closed == [42]  # by reward()
    assert cut.reward == pytest.approx(library_play(GUESS, row, replies[:2])[0]) == pytest.approx(0.2)

    plugrl_run_start(cfg, None)
    assert spec.factory.max_turns == 2
    (ended,) = play(smol_tokenizer, spec, [sample_of(row, "rows.jsonl line 1")], {"Guess 0": replies}, max_turns=2)
    total, _, done = library_play(GUESS, row, replies, max_turns=2)
    assert (ended.finish, ended.turns, ended.reward) == ("done", 2, pytest.approx(total)) and done


# --------------------------------------------------------------------------- built-in environments


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("6 * 12 = 72 eggs.\n#### 72", 1.0), ("6 * 12 = 71.\n#### 71", 0.0), ("It is 72.", 0.0)],
    ids=["right", "wrong", "unformatted"],
)
def test_gsm8k_scores_as_the_library_does(smol_tokenizer, tmp_path, reply, expected):
    """The built-in gsm8k (one turn): plugrl's score is what skyrl_gym.make('gsm8k').step gives the same
    reply; the sample's own prompt is kept (init returns it unchanged)."""
    _, spec, problems = load(tmp_path, "skyrl_gym:gsm8k")
    assert problems == []
    row = skyrl_row(f"A box holds 6 rows of 12 eggs. How many eggs? {INSTRUCTION}", "72", env_class="gsm8k")
    (c,) = play(smol_tokenizer, spec, [sample_of(row, "train.parquet row 0")], {"How many eggs": [reply]})
    library = skyrl_gym.make("gsm8k", env_config={}, extras={"reward_spec": row["reward_spec"]}).step(reply)
    assert (c.finish, c.turns, c.error) == ("done", 1, None)
    assert c.reward == float(library["reward"]) == expected
    assert c.messages[0] == row["prompt"][0]


def test_gsm8k_multi_turn_sums_its_turn_rewards_as_the_library_gives_them(smol_tokenizer, tmp_path):
    """The built-in gsm8k_multi_turn: a per-turn reward (a format credit of 0.2 / max_turns, 1.0 when right),
    a question after each wrong answer; plugrl's score is the sum of the library's rewards for the same
    replies, with max_turns = rollout.max_turns as SkyRL's generator sets it."""
    cfg, spec, _ = load(tmp_path, "skyrl_gym:gsm8k_multi_turn", "rollout.max_turns=3")
    plugrl_run_start(cfg, None)
    rows = [
        skyrl_row(f"Tom has 5 apples and buys 4. How many? {INSTRUCTION}", "9", env_class="gsm8k_multi_turn"),
        skyrl_row(f"What is 3 times 4? {INSTRUCTION}", "12", env_class="gsm8k_multi_turn"),
    ]
    replies = {"How many?": ["#### 8", "Let me think.", "5 + 4 = 9\n#### 9"], "3 times 4": ["#### 11", "#### 13", "x"]}
    samples = [sample_of(r, f"train.jsonl line {i + 1}") for i, r in enumerate(rows)]
    played = play(smol_tokenizer, spec, samples, replies)
    for row, key, c in zip(rows, replies, played, strict=True):
        total, observations, _ = library_play("gsm8k_multi_turn", row, replies[key], max_turns=3)
        assert c.error is None and c.reward == pytest.approx(total)
        assert env_messages(c) == observations
        assert c.info == {"steps": 3}  # get_metrics()
    assert played[0].finish == "done" and played[0].reward == pytest.approx(0.2 / 3 + 1.0)
    assert played[1].reward == pytest.approx(2 * 0.2 / 3)  # the third turn ends it without an answer
    assert env_messages(played[0])[-1]["content"].startswith("Now provide only the final numeric answer")


# --------------------------------------------------------------------------- bad input


def test_an_unknown_id_is_a_start_up_error_listing_the_registered_ones(tmp_path):
    _, spec, problems = load(tmp_path, "skyrl_gym:gsm8kk")
    assert spec is None and len(problems) == 1
    assert "environment 'skyrl_gym:gsm8kk' (plugin 'skyrl_gym') failed to load" in problems[0]
    assert "no environment 'gsm8kk' (did you mean 'gsm8k'?)" in problems[0]
    registered = problems[0].split("registered: ", 1)[1].split(". ", 1)[0].split(", ")
    assert {"aime", "gsm8k", "gsm8k_multi_turn", "lcb", "search", "searchcode", "text2sql", GUESS} <= set(registered)
    assert registered == sorted(registered)  # other modules may have registered more (the docs' `multiply`)
    assert "skyrl_gym.register(" in problems[0]


def test_the_library_missing_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)  # `import skyrl_gym` fails as when it is not installed
    _, spec, problems = load(tmp_path, "skyrl_gym:gsm8k")
    assert spec is None and len(problems) == 1
    assert "ModuleNotFoundError" in problems[0] and "`pip install plugrl-envs-skyrl-gym`" in problems[0]
    assert "skyrl-gym==0.4.0" in problems[0]


def test_environment_options_must_fit_the_environments_config_dataclass(tmp_path):
    """text2sql declares Text2SQLEnvConfig: its defaults fill env_config, and an unknown key is refused."""
    _, spec, problems = load(tmp_path, "skyrl_gym:text2sql", "environment_options.db_pat=/data")
    assert spec is None and "Key 'db_pat' not in 'Text2SQLEnvConfig'" in problems[0] and "db_path" in problems[0]
    _, spec, problems = load(tmp_path, "skyrl_gym:text2sql")
    assert problems == [] and spec.factory.env_config.db_path == "/home/ray/default/sql_data"


def test_a_row_without_the_fields_the_environment_reads_fails_its_episode_only(smol_tokenizer, tmp_path):
    """A row in plugrl's own schema (ground_truth, no reward_spec) for gsm8k: its episode ends at start as an
    error naming the row and the field; the other episode of the step plays on."""
    _, spec, _ = load(tmp_path, "skyrl_gym:gsm8k")
    good = skyrl_row(f"What is 2 + 3? {INSTRUCTION}", "5")
    bad = {"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "data_source": "x", "ground_truth": "2"}
    samples = [sample_of(good, "train.jsonl line 1"), sample_of(bad, "train.jsonl line 2")]
    ok, failed = play(smol_tokenizer, spec, samples, {"2 + 3": ["#### 5"], "1 + 1": ["#### 2"]})
    assert (ok.finish, ok.reward) == ("done", 1.0)
    assert failed.finish == "error" and failed.turns == 0
    assert "start failed: ValueError: skyrl-gym environment 'gsm8k' cannot start on train.jsonl line 2" in failed.error
    assert (
        "reward_spec field is required" in failed.error and "['data_source', 'ground_truth', 'prompt']" in failed.error
    )


def test_data_the_environment_cannot_read_stops_the_run_at_start(tmp_path):
    """plugrl_run_start makes the environment for the first row of each data file: a missing field (a verl
    row for gsm8k), an env_class naming another environment, or a missing database (text2sql) stops the run
    there, naming the file and row."""
    verl = {
        "prompt": [{"role": "user", "content": "1 + 1?"}],
        "data_source": "d",
        "reward_model": {"ground_truth": "2"},
    }
    other = skyrl_row("1 + 1?", "2", env_class="gsm8k_multi_turn")
    sql = {**skyrl_row("List the users.", "SELECT * FROM users"), "db_id": "shop", "data": "spider"}
    data = tmp_path / "train.jsonl"
    for name, options, row, message in [
        ("gsm8k", [], verl, "train.jsonl line 1: AssertionError: reward_spec field is required"),
        ("gsm8k", [], other, "train.jsonl line 1: the row's env_class is 'gsm8k_multi_turn'"),
        (
            "text2sql",
            ["environment_options.db_path=/no/such/dir"],
            sql,
            "FileNotFoundError: Database file not found at: /no/such/dir/spider/database/shop",
        ),
    ]:
        data.write_text(json.dumps(row) + "\n" + json.dumps(skyrl_row("2 + 2?", "4")) + "\n")
        cfg, _, problems = load(tmp_path, f"skyrl_gym:{name}", f"data.train_files=[{data}]", *options)
        assert problems == []
        with pytest.raises(ValueError, match=re.escape(message)) as info:
            plugrl_run_start(cfg, None)
        assert f"environment 'skyrl_gym:{name}' refuses the data" in str(info.value)
    data.write_text(json.dumps(skyrl_row("2 + 2?", "4")) + "\n")
    cfg, _, _ = load(tmp_path, "skyrl_gym:gsm8k", f"data.train_files=[{data}]")
    plugrl_run_start(cfg, None)  # SkyRL's rows pass


def test_a_search_environment_without_its_server_stops_at_start(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/retrieve"
    cfg, spec, problems = load(tmp_path, "skyrl_gym:search", f"environment_options.search_url={url}")
    assert problems == [] and spec.factory.env_config.topk == 3  # SearchEnvConfig's defaults fill the rest
    with pytest.raises(ConnectionError, match=f"nothing answers at {re.escape(url)} \\(environment_options.search_url"):
        plugrl_run_start(cfg, None)


def test_the_family_needs_an_id():
    """`environment: skyrl_gym:` (no id) names the registered ids."""
    with pytest.raises(ValueError, match="as 'skyrl_gym:<id>'; registered: .*gsm8k_multi_turn"):
        skyrl_gym_family("")


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_two_training_steps_on_skyrl_rows_with_no_reward_function(tiny_model, tmp_path):
    """`plugrl.trainer.train` on SkyRL-format rows (no data_source column: data.data_source names one) with
    skyrl_gym:gsm8k_multi_turn and no reward plugin: two steps train, no episode fails, the rewards are the
    environment's, and max_turns reached the environment (its last-turn question after the first answer)."""
    rows = [skyrl_row(f"What is {i} + {i}? {INSTRUCTION}", str(2 * i), env_class="gsm8k_multi_turn") for i in range(4)]
    for r in rows:
        del r["data_source"]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [
        "plugins=[skyrl_gym,advantages]",
        f"data.train_files=[{data}]",
        "data.data_source=gsm8k_skyrl",
        "environment=skyrl_gym:gsm8k_multi_turn",
    ]
    metrics, rows = train_two_steps(tmp_path, tiny_model, "skyrl", overrides)
    assert [m["step"] for m in metrics] == [1, 2] and all(m["actor/optimizer_steps"] >= 1 for m in metrics)
    assert all(m["env/errors"] == 0.0 and "reward/environment/mean" in m for m in metrics)
    assert all(r["env_reward"] is not None and r["details"] == {"environment": r["env_reward"]} for r in rows)
    asked = [r["messages"][2]["content"] for r in rows if len(r["messages"]) > 2]
    assert asked and all(a.startswith("Now provide only the final numeric answer") for a in asked)


@pytest.mark.slow
def test_two_training_steps_with_an_environment_registered_here(tiny_model, tmp_path):
    """The environment this module registers with skyrl_gym.register trains two steps through
    skyrl_gym:<its id>: its per-turn rewards are the episodes' scores and its metadata their info."""
    rows = [skyrl_row(f"Guess {i}: a number.", str(i)) for i in range(4)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = ["plugins=[skyrl_gym,advantages]", f"data.train_files=[{data}]", f"environment=skyrl_gym:{GUESS}"]
    metrics, rows = train_two_steps(tmp_path, tiny_model, "guess", overrides)
    assert [m["step"] for m in metrics] == [1, 2] and all(m["actor/optimizer_steps"] >= 1 for m in metrics)
    assert all(m["env/errors"] == 0.0 and "env/info/guess" in m for m in metrics)
    assert all(r["env_reward"] is not None and r["details"] == {"environment": r["env_reward"]} for r in rows)
    assert len(Guess.closed) >= 8  # every episode's environment closed: 2 steps x 2 prompts x 2 episodes
