"""``plugrl new-plugin``: scaffold a plugin package; ``python -m plugrl_commands.scaffold --hook-reference``: hook docs.

:func:`scaffold` writes ``<directory>/<name>/``, a package that installs and trains as it is:

- ``pyproject.toml``: distribution ``plugrl-<name with dashes>``, module ``plugrl_<name>``, the
  entry point ``<name> = "plugrl_<name>"`` in group ``plugrl`` (how a run config finds it), and
  the same ruff settings as plugrl;
- ``plugrl_<name>/__init__.py``: a small working implementation of the chosen kind, written with
  the decorators (``@plugrl.reward``, ``@plugrl.dataset``, ``@plugrl.template``,
  ``@plugrl.advantage_estimator``; an ``environment`` plugin is a multi-turn guessing game:
  ``@plugrl.environment`` with its options model, plus a ``@plugrl.dataset`` of games and a
  ``@plugrl.reward`` for the episodes a token limit cuts before the environment scores them);
- ``tests/test_<name>.py``: tests of that function, and :mod:`plugrl_testing`'s checks of the plugin against the
  kernel's contracts (loaded through its entry point, called as a run calls it), which pass as generated;
- ``README.md``: how to install, test and use it;
- ``example.yaml`` (``environment`` only): a run config that trains on the game as it is.

:func:`hook_reference` renders, as markdown, every hook in :mod:`plugrl.hookspecs`, the
decorators and the records of :mod:`plugrl.specs`, and the objects those hooks hand over
(:class:`plugrl.data.Sample`, :class:`plugrl.algorithms.AdvantageBatch`,
:class:`plugrl.algorithms.AdvantageResult`), all from their signatures and docstrings.
``docs/plugins.md`` holds that text between ``<!-- hooks:begin -->`` and ``<!-- hooks:end -->``;
``python -m plugrl_commands.scaffold --hook-reference --update docs/plugins.md`` refreshes it and
``--check`` fails when it is stale.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
import json
import keyword
import re
import secrets
import shutil
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

KINDS = ("reward", "dataset", "template", "advantage", "environment")
NAME_RE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
DATA_SOURCE_RE = re.compile(r"^[A-Za-z0-9_.:/@+*?\[\]-]{1,64}$")
MAX_NAME = 32
BEGIN_MARK = "<!-- hooks:begin -->"
END_MARK = "<!-- hooks:end -->"


class ScaffoldError(ValueError):
    """A plugin cannot be scaffolded (bad name, existing directory, ...); the message says why."""


@dataclass(frozen=True)
class Scaffolded:
    path: Path  # the package folder
    files: list[Path]
    message: str  # what was made and what to do next, for the terminal


# --------------------------------------------------------------------------- names


def validate_name(name: str) -> None:
    """A plugin name is a Python identifier in snake case: lowercase letters, digits, single underscores."""
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > MAX_NAME:
        raise ScaffoldError(
            f"invalid plugin name {name!r}: use lowercase letters, digits and underscores, starting with a "
            f"letter, without leading, trailing or double underscores, at most {MAX_NAME} characters "
            "(e.g. my_task); it names the entry point, the module plugrl_<name> and plugrl-<name> on PyPI"
        )
    if keyword.iskeyword(name):
        raise ScaffoldError(f"invalid plugin name {name!r}: it is a Python keyword")


def validate_data_source(data_source: str) -> None:
    if not isinstance(data_source, str) or not DATA_SOURCE_RE.match(data_source):
        raise ScaffoldError(
            f"invalid data_source {data_source!r}: use at most 64 letters, digits and _ . : / @ + - "
            "(and * ? [ ] for a reward's glob), e.g. my_task or openai/gsm8k"
        )


def _py(text: str) -> str:
    """A double-quoted Python string literal (JSON escapes are valid Python escapes)."""
    return json.dumps(text)


# --------------------------------------------------------------------------- package files

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "plugrl plugin: {summary}"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["{requirement}"{more_requirements}]

[project.optional-dependencies]
test = ["pytest>=8", "plugrl-testing"]  # plugrl_testing: the test kit its tests use

# how plugrl finds the plugin: a run config lists `{name}` under `plugins:`
[project.entry-points.plugrl]
{name} = "{module}"

[tool.setuptools]
packages = ["{module}"]

[tool.pytest.ini_options]
testpaths = ["tests"]

[tool.ruff]
line-length = 120
target-version = "py310"

[tool.ruff.lint]
select = ["E", "F", "W", "I", "B", "UP"]
"""

_REWARD = '''\
"""plugrl plugin `{name}`: an exact-match reward.

Scores the samples whose `data_source` is {ds_md},
with the function `{fn}` below.

The plugin loader collects the functions decorated with `@plugrl.reward` (and friends) from
this module. To use it, name the plugin in a run config:

    plugins: [{name}, advantages]

Rewards run in worker processes: keep them module-level functions that use no global state
of the trainer.
"""

from __future__ import annotations

import plugrl


def normalize(text: str) -> str:
    """Whitespace collapsed and the ends stripped: how a completion and its answer are compared."""
    return " ".join(str(text).split())


@plugrl.reward({ds})
def {fn}(completion: str, ground_truth: str, ignore_case: bool = False) -> float:
    """1.0 when the completion equals the ground truth (both normalized), else 0.0.

    `ignore_case` is an option, set in the run config:

        reward: {{options: {{{fn}: {{ignore_case: true}}}}}}

    A reward may also return a dict with `score` and extra fields to log, and may take the
    keywords `data_source`, `extra_info`, `prompt` and `sample`.
    """
    got, want = normalize(completion), normalize(ground_truth)
    if ignore_case:
        got, want = got.casefold(), want.casefold()
    return 1.0 if got == want else 0.0
'''

_REWARD_TEST = '''\
"""Tests of the `{name}` plugin; run `pytest` after `pip install -e .`."""

from plugrl_testing import check_plugin, check_reward

from {module} import {fn}

PLUGIN = {name_lit}


def test_exact_match():
    assert {fn}("42", "42") == 1.0
    assert {fn}("  42\\n", "42") == 1.0
    assert {fn}("the answer is  42", "the answer is 42") == 1.0
    assert {fn}("41", "42") == 0.0
    assert {fn}("", "42") == 0.0


def test_the_kernel_scores_it():
    """Called as a run calls it (by the reward runner, with options from the run config), picklable."""
    check_reward({fn}, [("42", "42", 1.0), ("41", "42", 0.0), ("Paris", "paris", 0.0)])
    check_reward({fn}, [("Paris", "paris", 1.0)], options={{"ignore_case": True}})


def test_the_plugin_keeps_the_contracts():
    registry = check_plugin(PLUGIN)  # through its entry point: the package must be installed
    (spec,) = registry.rewards
    assert spec.fn is {fn}
    assert spec.data_sources == ({ds},)
'''

_DATASET = '''\
"""plugrl plugin `{name}`: a tiny in-memory dataset.

Its rows have the `data_source` {ds_md}.

Rows are in plugrl's sample schema: `prompt` (text or chat messages), `data_source` (routes the
row to its reward functions), `ground_truth` (what the reward compares against) and
`extra_info`. To use it, name it in a run config, with a reward plugin for its data_source:

    plugins: [{name}, my_reward_plugin, advantages]
    data: {{dataset: {name}, dataset_options: {{size: 16}}}}
"""

from __future__ import annotations

from typing import Any

import plugrl

DATA_SOURCE = {ds}

# (question, answer) pairs: replace them with your task, or read your files here
PROBLEMS = {{
    "train": [
        ("What is 2 + 3?", "5"),
        ("What is 7 - 4?", "3"),
        ("What is 3 * 3?", "9"),
        ("What is 8 / 2?", "4"),
    ],
    "test": [
        ("What is 6 + 1?", "7"),
        ("What is 9 - 9?", "0"),
    ],
}}


@plugrl.dataset({name_lit})
def {fn}(split: str = "train", size: int | None = None) -> list[dict[str, Any]]:
    """The rows of `split` ("train" or "test"), cycled up to `size` rows when given.

    `size` is an option, set in the run config under `data.dataset_options`. The kernel
    calls this once per rank and shuffles the rows itself; a dataset that draws random rows
    must take a `seed` option and be deterministic for it.
    """
    if split not in PROBLEMS:
        raise ValueError(f"unknown split {{split!r}}; this dataset has {{', '.join(PROBLEMS)}}")
    problems = PROBLEMS[split]
    count = len(problems) if size is None else size
    rows = []
    for i in range(count):
        question, answer = problems[i % len(problems)]
        rows.append(
            {{
                "prompt": [{{"role": "user", "content": f"{{question}} Answer with the number only."}}],
                "data_source": DATA_SOURCE,
                "ground_truth": answer,
                "extra_info": {{"split": split, "index": i}},
            }}
        )
    return rows
'''

_DATASET_TEST = '''\
"""Tests of the `{name}` plugin; run `pytest` after `pip install -e .`."""

import pytest
from plugrl_testing import check_dataset, check_plugin

from {module} import DATA_SOURCE, {fn}

PLUGIN = {name_lit}


def test_rows():
    rows = {fn}("train")
    assert len(rows) == 4 and len({fn}("test")) == 2
    assert {{row["data_source"] for row in rows}} == {{DATA_SOURCE}}
    assert len({fn}("train", size=10)) == 10


def test_unknown_split():
    with pytest.raises(ValueError, match="unknown split"):
        {fn}("validation")


def test_the_kernel_loads_it():
    """The rows validate as a run validates them, the same on every call (every rank calls the dataset)."""
    check_plugin(PLUGIN)  # through its entry point: the package must be installed
    # routed=False: the reward of DATA_SOURCE is another plugin's; to check the route too, name both:
    # check_dataset(PLUGIN, plugin=[PLUGIN, "my_reward_plugin"])
    samples = check_dataset(PLUGIN, options={{"size": 6}}, n=6, routed=False)
    assert len(samples) == 6
    assert all(s.data_source == DATA_SOURCE and s.ground_truth for s in samples)
    assert len(check_dataset(PLUGIN, split="test", routed=False)) == 2
'''

_TEMPLATE = '''\
"""plugrl plugin `{name}`: a prompt template.

A template turns each sample into its prompt: raw text, or chat messages that the kernel
renders with the tokenizer's chat template (and the configured system prompt and assistant
prefill). To use it, name it in a run config:

    plugins: [{name}, ...]
    data: {{template: {name}}}
"""

from __future__ import annotations

from typing import Any

import plugrl

INSTRUCTION = "Think step by step, then give only the final answer inside <answer> </answer> tags."


def question_of(sample: Any) -> str:
    """The row's `question` field when it has one, else the prompt (its last user message)."""
    question = sample.row.get("question")
    if isinstance(question, str) and question.strip():
        return question.strip()
    if isinstance(sample.prompt, str):
        return sample.prompt.strip()
    users = [m["content"] for m in sample.prompt if m.get("role") == "user"]
    return users[-1].strip() if users else ""


@plugrl.template({name_lit})
def {fn}(sample: Any) -> list[dict[str, str]]:
    """One user message: the question, a blank line, then INSTRUCTION.

    `sample` is a `plugrl.data.Sample` (`prompt`, `data_source`, `ground_truth`,
    `extra_info`, and `row`, the original row with all its fields).
    """
    return [{{"role": "user", "content": f"{{question_of(sample)}}\\n\\n{{INSTRUCTION}}"}}]
'''

_TEMPLATE_TEST = '''\
"""Tests of the `{name}` plugin; run `pytest` after `pip install -e .`."""

from plugrl.data import Sample
from plugrl_testing import check_plugin, check_template

from {module} import INSTRUCTION, {fn}

PLUGIN = {name_lit}


def test_chat_prompt():
    prompt = [{{"role": "user", "content": "What is 2 + 3?"}}]
    (message,) = {fn}(Sample(prompt=prompt, data_source="x", ground_truth="5"))
    assert message["role"] == "user"
    assert message["content"] == f"What is 2 + 3?\\n\\n{{INSTRUCTION}}"


def test_question_field_and_text_prompt():
    sample = Sample(prompt="", data_source="x", ground_truth="5", row={{"question": "What is 1 + 4?"}})
    assert {fn}(sample)[0]["content"].startswith("What is 1 + 4?")
    sample = Sample(prompt="Name a prime.", data_source="x", ground_truth="2")
    assert {fn}(sample)[0]["content"].startswith("Name a prime.")


def test_the_kernel_renders_it():
    check_plugin(PLUGIN)  # through its entry point: the package must be installed
    row = {{"question": "What is 1 + 4?", "data_source": "x", "ground_truth": "5"}}  # a row as a dataset gives it
    (message,) = check_template(PLUGIN, row)
    assert message == {{"role": "user", "content": f"What is 1 + 4?\\n\\n{{INSTRUCTION}}"}}
'''

_ADVANTAGE = '''\
"""plugrl plugin `{name}`: an advantage estimator with a mean baseline.

An estimator turns the rewards of a step into one advantage per response token. To use it,
name it in a run config:

    plugins: [{name}, ...]
    algorithm: {{adv_estimator: {name}}}
"""

from __future__ import annotations

from typing import Any

import plugrl
import torch
from plugrl.algorithms import AdvantageBatch, AdvantageResult, group_mean_std, masked_mean


def {pure}(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """`A_i = r_i - mean_g`: each sample's score minus the mean score of its group.

    Shapes: `scores` [B], `group_ids` [B] (the samples of one prompt share an id); returns [B].
    A group of one sample gets 0. Unlike GRPO, nothing is divided by the group's std.
    """
    mean, _, _ = group_mean_std(scores, group_ids)
    return scores.float() - mean


@plugrl.advantage_estimator({name_lit})
def {fn}(batch: AdvantageBatch, config: Any) -> AdvantageResult:
    """The mean-baseline advantage of each sample, put on every response token (0 on padding).

    `config` is the run's `algorithm` section; options of your own (e.g.
    `algorithm.my_option`) are in `config.model_extra`.
    """
    with torch.no_grad():
        seq = {pure}(batch.scores, batch.group_ids)
        advantages = seq.unsqueeze(-1) * batch.response_mask.float()
        metrics = {{"adv/mean": float(masked_mean(advantages, batch.response_mask))}}
    return AdvantageResult(advantages=advantages, returns=advantages, metrics=metrics)
'''

_ADVANTAGE_TEST = '''\
"""Tests of the `{name}` plugin; run `pytest` after `pip install -e .`."""

import torch
from plugrl.algorithms import AdvantageBatch
from plugrl.config import AlgorithmConfig
from plugrl_testing import check_estimator, check_plugin

from {module} import (
    {fn},
    {pure},
)

PLUGIN = {name_lit}


def test_mean_baseline():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2])
    got = {pure}(scores, groups)
    assert torch.allclose(got, torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0]))


def test_estimator_on_a_batch():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    rewards = torch.zeros_like(mask)
    rewards[0, 1], rewards[1, 2], rewards[2, 0], rewards[3, 1] = 1.0, 0.0, 3.0, 1.0  # on each last token
    batch = AdvantageBatch(token_level_rewards=rewards, response_mask=mask, group_ids=torch.tensor([7, 7, 9, 9]))
    result = {fn}(batch, AlgorithmConfig())
    expected = torch.tensor([0.5, -0.5, 1.0, -1.0]).unsqueeze(-1) * mask
    assert torch.allclose(result.advantages, expected)


def test_the_kernel_can_use_it():
    """Called as the trainer calls it: [B, T] finite advantages that leave the padding out."""
    check_plugin(PLUGIN)  # through its entry point (the package must be installed); checks the estimator too
    result = check_estimator(PLUGIN, scores=[1.0, 0.0, 3.0, 1.0], group_size=2)
    assert result.advantages[:, 0].tolist() == [0.5, -0.5, 1.0, -1.0]
'''

_ENVIRONMENT = '''\
"""plugrl plugin `{name}`: a number-guessing game, played over several turns.

The policy guesses a secret whole number; after each wrong guess the environment says whether it
was too low or too high, until the policy finds the number or runs out of guesses. The plugin
registers three things, found by the plugin loader through their decorators:

- the environment `{name}` (`{cls}Env`): the kernel makes one per episode, which holds that
  episode's state, and calls `start` before the first turn and `step` after each;
- the dataset `{name}`: games in plugrl's sample schema, the secret as `ground_truth`;
- the reward `{name}_reward` for data_source {ds_md}: the environment scores every episode it
  ends, this scores the others (those a token limit cut first) by their last reply.

To use it, name it in a run config (`example.yaml` beside this package is a whole one):

    plugins: [{name}, advantages]
    environment: {name}
    data: {{dataset: {name}}}
"""

from __future__ import annotations

import random
import re
from typing import Any

import plugrl
from pydantic import BaseModel, Field

DATA_SOURCE = {name_lit}
NUMBER = re.compile(r"-?\\d+")


class {cls}Options(BaseModel):
    """`environment_options` of `{name}`, checked at start-up and passed to `{cls}Env` as keywords."""

    max_guesses: int = Field(4, ge=1, description="Guesses per episode; set rollout.max_turns to match.")


def read_guess(reply: str) -> int | None:
    """The last whole number in a reply, or None when it holds none."""
    numbers = NUMBER.findall(reply)
    return int(numbers[-1]) if numbers else None


@plugrl.environment({name_lit}, options={cls}Options)
class {cls}Env(plugrl.Environment):
    """One game. `start` keeps the sample's prompt; `step` judges each reply's guess.

    Methods may also be `async def`. Many episodes run at once: keep state on `self`, never in globals.
    """

    def __init__(self, max_guesses: int = 4):
        self.max_guesses = max_guesses
        self.guesses = 0
        self.secret: int | None = None

    def start(self, sample: Any) -> plugrl.EnvStart:
        self.secret = int(sample.ground_truth)  # a bad row fails here, which ends only its own episode
        return plugrl.EnvStart()  # the sample's prompt, as the data config renders it; no tools of its own

    def step(self, turn: plugrl.Turn) -> plugrl.EnvStep:
        self.guesses += 1
        guess = read_guess(turn.reply)
        info = {{"guesses": self.guesses, "solved": float(guess == self.secret)}}  # logged; numbers -> env/info/*
        if guess == self.secret:
            return plugrl.EnvStep(done=True, reward=1.0, info=info)
        if self.guesses >= self.max_guesses or turn.last:  # out of guesses, or of rollout.max_turns
            return plugrl.EnvStep(done=True, reward=0.0, info=info)
        if guess is None:
            hint = "That is not a number. Reply with one whole number."
        else:
            hint = f"{{guess}} is too {{'low' if guess < self.secret else 'high'}}. Guess again."
        # the hint is appended as a user message: in the context the policy reads, never trained on
        return plugrl.EnvStep(messages=[{{"role": "user", "content": hint}}], info=info)


@plugrl.dataset({name_lit})
def {name}_dataset(split: str = "train", size: int = 64, seed: int = 0, high: int = 20) -> list[dict[str, Any]]:
    """`size` games, each with a secret from 1 to `high`, drawn with `seed` (the splits differ).

    The options are set in the run config under `data.dataset_options`.
    """
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {{split!r}}; this dataset has train and test")
    rng = random.Random(f"{{split}}-{{seed}}")
    prompt = (
        f"I am thinking of a whole number from 1 to {{high}}. Guess it: reply with one number. "
        "After each wrong guess I will tell you whether it is too low or too high."
    )
    return [
        {{
            "prompt": [{{"role": "user", "content": prompt}}],
            "data_source": DATA_SOURCE,
            "ground_truth": str(rng.randint(1, high)),
            "extra_info": {{"split": split, "index": i}},
        }}
        for i in range(size)
    ]


@plugrl.reward(DATA_SOURCE)
def {name}_reward(completion: str, ground_truth: str) -> float:
    """1.0 when the guess in `completion` is the secret, else 0.0.

    In a multi-turn episode `completion` is the last reply (the keyword `messages` would give the
    whole conversation). The kernel calls this only for the episodes that its environment did not
    score: those the response budget cut first (`env/truncated`), or whose environment failed.
    """
    return 1.0 if read_guess(completion) == int(ground_truth) else 0.0
'''

_ENVIRONMENT_TEST = '''\
"""Tests of the `{name}` plugin; run `pytest` after `pip install -e .`."""

from pathlib import Path

import plugrl
import pytest
from plugrl.config import load_config
from plugrl.data import Sample
from plugrl.plugins import check_options, load_plugins
from plugrl_testing import check_dataset, check_environment, check_plugin, check_reward

from {module} import (
{env_imports})

PLUGIN = {name_lit}
EXAMPLE = Path(__file__).resolve().parent.parent / "example.yaml"
ROW = {{"prompt": "Guess.", "data_source": DATA_SOURCE, "ground_truth": "7"}}


def play(env, replies, secret="7"):
    """Drive `env` by hand: `start`, then one `step` per reply until it says done."""
    sample = Sample(prompt="Guess.", data_source=DATA_SOURCE, ground_truth=secret)
    env.start(sample)
    steps = []
    for i, reply in enumerate(replies):
        turn = plugrl.Turn(index=i, reply=reply, tool_calls=[], tool_results=[], messages=[], sample=sample)
        steps.append(env.step(turn))
        if steps[-1].done:
            break
    return steps


def test_read_guess():
    assert read_guess("I guess 12.") == 12
    assert read_guess("3? No: 5") == 5
    assert read_guess("no idea") is None


def test_a_game_won_at_the_second_guess():
    first, second = play({cls}Env(), ["10", "Then 7"])
    assert not first.done and first.messages == [{{"role": "user", "content": "10 is too high. Guess again."}}]
    assert second.done and second.reward == 1.0
    assert second.info == {{"guesses": 2, "solved": 1.0}}


def test_the_kernel_plays_it():
    """Whole episodes through plugrl's episode loop, scripted replies standing in for the model."""
    won = check_environment(PLUGIN, ROW, ["10", "Then 7"], expected_score=1.0)
    assert won.conversation.turns == 2
    assert won.conversation.messages[2] == {{"role": "user", "content": "10 is too high. Guess again."}}
    lost = check_environment(PLUGIN, ROW, ["1", "no idea"], options={{"max_guesses": 2}}, expected_score=0.0)
    assert lost.conversation.info == {{"guesses": 2, "solved": 0.0}}
    assert "too low" in lost.conversation.messages[2]["content"]


def test_rows_and_reward():
    rows = {name}_dataset(size=8, seed=1)
    assert len(rows) == 8 and all(1 <= int(r["ground_truth"]) <= 20 for r in rows)
    with pytest.raises(ValueError, match="unknown split"):
        {name}_dataset("validation")
    samples = check_dataset(PLUGIN, options={{"size": 4}})  # valid rows, routed to the reward below
    assert all(s.data_source == DATA_SOURCE for s in samples)
    check_reward({name}_reward, [("I say 7", "7", 1.0), ("8", "7", 0.0), ("", "7", 0.0)])


def test_the_plugin_keeps_the_contracts():
    registry = check_plugin(PLUGIN)  # through its entry point: the package must be installed
    assert registry.environments[PLUGIN].factory is {cls}Env
    assert registry.datasets[PLUGIN].fn is {name}_dataset


def test_the_example_config_is_valid():
    cfg = load_config(EXAMPLE)
    assert check_options(cfg, load_plugins(cfg.plugins)) == []  # environment_options fit the options model
    assert cfg.environment == PLUGIN and cfg.multi_turn
    assert cfg.rollout.max_turns == cfg.environment_options["max_guesses"]
'''

_ENVIRONMENT_EXAMPLE = """\
# plugrl train {folder}/example.yaml: GRPO on the `{name}` guessing game with SmolLM2-135M-Instruct.
# Every sample's episodes play the environment `{name}`; it scores the episodes it ends.
plugins: [{name}, advantages]
model: {{path: local:SmolLM2-135M-Instruct}}

environment: {name}
environment_options: {{max_guesses: 4}}

data:
  dataset: {name}
  dataset_options: {{size: 512, seed: 0, high: 20}}
  train_batch_size: 8
  max_response_length: 160   # the whole episode: every guess, and every hint between them

rollout:
  name: vllm
  n: 8
  max_turns: 4         # = environment_options.max_guesses
  max_turn_tokens: 24  # one guess; a longer turn is cut there, and answered like any other

trainer: {{total_steps: 50, experiment_name: {name}}}
"""

# the generated READMEs' install section (its fields filled with the rest of the README's)
_README_INSTALL = """\
## Install and test

```
pip install -e {folder}
pytest {folder}/tests
plugrl plugins        # lists `{name}` and what it registers
```

In a plugrl checkout, `make setup` installs every folder under `plugins/` (editable).
"""

_ENVIRONMENT_README = """\
# {dist}

A plugrl environment plugin, `{name}`: {summary}.

| file | what |
| --- | --- |
| `pyproject.toml` | distribution `{dist}`; the entry point `{name} = "{module}"` (group `plugrl`) |
| `{module}/__init__.py` | environment `{cls}Env` (`{cls}Options`), dataset `{name}_dataset`, reward `{name}_reward` |
| `tests/test_{name}.py` | tests of the game, the rows and the reward, and `plugrl_testing`'s checks of them |
| `example.yaml` | a run config that trains on the game as it is |

{install}
## Use

```
plugrl train {folder}/example.yaml
```

or, in a run config of your own:

```yaml
{usage}
```

## The episode

The kernel calls `{cls}Env(**environment_options)` once per episode. `start(sample)` reads the
secret from the sample's `ground_truth` and keeps its prompt. After every policy turn, `step(turn)`
reads the last number in `turn.reply`: the secret ends the episode with reward 1.0; a wrong guess
gets a user message (`10 is too high. Guess again.`) and another turn, until `max_guesses` (or the
run's `rollout.max_turns`) is reached, which ends it with reward 0.0. Only the policy's own tokens
are trained on; the hints are in its context but out of the loss.

An episode that runs out of `data.max_response_length` before the environment ends it is scored
by `{name}_reward` on its last reply. `EnvStep.info` is logged with each episode (`env_info` in
`rollouts/step_N.jsonl`) and its numbers averaged per step (`env/info/guesses`, `env/info/solved`).

plugrl's `docs/environments.md` describes environments, tools and the multi-turn settings;
`docs/plugins.md` every hook, decorator and option.
"""

_README = """\
# {dist}

A plugrl {kind} plugin, `{name}`: {summary}.

| file | what |
| --- | --- |
| `pyproject.toml` | distribution `{dist}`; the entry point `{name} = "{module}"` (group `plugrl`) |
| `{module}/__init__.py` | the implementation: `{fn}`, registered with `@plugrl.{decorator}(...)` |
| `tests/test_{name}.py` | tests of `{fn}`, and `plugrl_testing`'s checks of the plugin against the kernel's contracts |

{install}
## Use

```yaml
{usage}
```

plugrl's `docs/plugins.md` describes every hook, decorator and option.
"""

_KIND_INFO: dict[str, dict[str, str]] = {
    "reward": {
        "fn": "{name}_reward",
        "decorator": "reward",
        "summary": "an exact-match reward for data_source `{ds}`",
        "usage": "plugins: [{name}, advantages]   # rows with data_source {ds} are scored by {name}_reward",
    },
    "dataset": {
        "fn": "{name}_dataset",
        "decorator": "dataset",
        "summary": "a tiny in-memory dataset of arithmetic questions, data_source `{ds}`",
        "usage": (
            "plugins: [{name}, my_reward_plugin, advantages]   # plus a reward plugin for data_source {ds}\n"
            "data:\n  dataset: {name}\n  dataset_options: {{size: 16}}"
        ),
    },
    "template": {
        "fn": "{name}_template",
        "decorator": "template",
        "summary": "a prompt template asking for the answer in <answer> tags",
        "usage": "plugins: [{name}, ...]\ndata:\n  template: {name}",
    },
    "advantage": {
        "fn": "{name}_advantage",
        "decorator": "advantage_estimator",
        "summary": "a mean-baseline advantage estimator",
        "usage": "plugins: [{name}, ...]\nalgorithm:\n  adv_estimator: {name}",
    },
    "environment": {
        "fn": "{cls}Env",
        "decorator": "environment",
        "summary": "a multi-turn number-guessing game (environment, dataset and reward), data_source `{ds}`",
        "usage": (
            "plugins: [{name}, advantages]\n"
            "environment: {name}\n"
            "environment_options: {{max_guesses: 4}}\n"
            "data:\n  dataset: {name}\n  max_response_length: 160   # the whole episode\n"
            "rollout:\n  max_turns: 4   # = max_guesses\n  max_turn_tokens: 24   # one guess"
        ),
    },
}

_SOURCES = {
    "reward": (_REWARD, _REWARD_TEST),
    "dataset": (_DATASET, _DATASET_TEST),
    "template": (_TEMPLATE, _TEMPLATE_TEST),
    "advantage": (_ADVANTAGE, _ADVANTAGE_TEST),
    "environment": (_ENVIRONMENT, _ENVIRONMENT_TEST),
}


def plugrl_requirement() -> str:
    """The plugrl versions a new plugin declares: the running kernel's minor series (``plugrl>=0.2,<0.3`` for
    any 0.2.x), :func:`plugrl.api.suggested_range`."""
    import plugrl
    from plugrl.api import suggested_range

    return "plugrl" + suggested_range(plugrl.__version__)


def class_name(name: str) -> str:
    """``my_game`` -> ``MyGame``: the stem of an environment plugin's class names."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def plugin_files(name: str, kind: str, data_source: str | None = None, folder: str | None = None) -> dict[str, str]:
    """The files of a ``kind`` plugin called ``name``: ``{relative path: text}``."""
    validate_name(name)
    if kind not in KINDS:
        raise ScaffoldError(f"unknown plugin kind {kind!r}; choose one of {', '.join(KINDS)}")
    if data_source is not None and kind not in ("reward", "dataset"):
        raise ScaffoldError(f"--data-source applies to reward and dataset plugins, not to a {kind} plugin")
    ds = name if data_source is None else data_source
    validate_data_source(ds)
    if kind == "dataset" and any(c in ds for c in "*?["):
        raise ScaffoldError(f"a dataset's data_source must be a plain name, not a glob: {ds!r}")
    module = f"plugrl_{name}"
    dist = "plugrl-" + name.replace("_", "-")
    cls = class_name(name)
    info = {k: v.format(name=name, ds=ds, cls=cls) for k, v in _KIND_INFO[kind].items()}
    fields = {
        "name": name,
        "name_lit": _py(name),
        "module": module,
        "dist": dist,
        "ds": _py(ds),
        "ds_md": f"`{ds}`",
        "fn": info["fn"],
        "pure": f"{name}_baseline_advantage",
        "kind": kind,
        "summary": info["summary"],
        "decorator": info["decorator"],
        "usage": info["usage"],
        "folder": folder or f"plugins/{name}",
        "cls": cls,
        "requirement": plugrl_requirement(),
        # an environment's episodes are played by plugrl-multiturn
        "more_requirements": ', "plugrl-multiturn"' if kind == "environment" else "",
        # the environment test's imports, in the order ruff's isort wants whatever the name
        "env_imports": "".join(
            f"    {n},\n"
            for n in ["DATA_SOURCE", f"{cls}Env", *sorted([f"{name}_dataset", f"{name}_reward", "read_guess"])]
        ),
    }
    source, test = _SOURCES[kind]
    files = {
        "pyproject.toml": _PYPROJECT.format(**{**fields, "summary": info["summary"].replace("`", "")}),
        "README.md": (_ENVIRONMENT_README if kind == "environment" else _README).format(
            **fields, install=_README_INSTALL.format(**fields)
        ),
        f"{module}/__init__.py": source.format(**fields),
        f"tests/test_{name}.py": test.format(**fields),
    }
    if kind == "environment":
        files["example.yaml"] = _ENVIRONMENT_EXAMPLE.format(**fields)
    return files


def _clashes(name: str) -> list[str]:
    """Installed things a new plugin of this name would collide with (a warning, not an error)."""
    notes = []
    try:
        from plugrl.plugins import installed_plugins

        found = [p for p in installed_plugins() if p.name == name]
    except Exception:  # the scaffold must work even if metadata is odd
        found = []
    if found:
        notes.append(
            f"warning: a plugin called {name!r} is already installed ({found[0].distribution}); "
            "two installed packages may not declare the same entry point"
        )
    elif importlib.util.find_spec(f"plugrl_{name}") is not None:
        notes.append(f"warning: a module plugrl_{name} is already importable; installing this one would shadow it")
    return notes


def scaffold(name: str, kind: str, directory: str | Path = "plugins", *, data_source: str | None = None) -> Scaffolded:
    """Write the package of a new ``kind`` plugin called ``name`` into ``directory/name``.

    Refuses to touch an existing ``directory/name``. Files are written into a temporary
    folder beside it and moved into place at the end, so a failure leaves nothing behind.
    """
    directory = Path(directory)
    target = directory / name
    files = plugin_files(name, kind, data_source, folder=target.as_posix())
    if target.exists() or target.is_symlink():
        raise ScaffoldError(f"{target} already exists; choose another name or --dir (nothing was written)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        staging = directory / f".{name}-{secrets.token_hex(4)}.tmp"
        staging.mkdir()  # an ordinary folder (the umask applies), unlike tempfile.mkdtemp's private one
    except OSError as e:
        raise ScaffoldError(f"cannot create {target}: {e}") from e
    try:
        for rel, text in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        staging.rename(target)  # atomic; fails if a non-empty target appeared meanwhile
    except BaseException as e:  # leave nothing behind, whatever went wrong
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError):
            raise ScaffoldError(f"cannot create {target}: {e}") from e
        raise
    written = [target / rel for rel in files]
    ds = name if data_source is None else data_source
    fn = _KIND_INFO[kind]["fn"].format(name=name, cls=class_name(name))
    usage = _KIND_INFO[kind]["usage"].format(name=name, ds=ds)
    lines = [
        f"created {kind} plugin {name!r} in {target}/ (distribution plugrl-{name.replace('_', '-')}, "
        f"module plugrl_{name}, {'class' if kind == 'environment' else 'function'} {fn}):",
        *(f"  {p}" for p in written),
        *_clashes(name),
        "next:",
        f"  pip install -e {target}",
        f"  pytest {target}/tests",
        *([f"  plugrl train {target}/example.yaml"] if kind == "environment" else []),
        "  then in a run config:" if kind != "environment" else "  or in a run config of your own:",
        textwrap.indent(usage, "    "),
    ]
    return Scaffolded(target, written, "\n".join(lines))


# --------------------------------------------------------------------------- hook reference


class _Raw:
    """An annotation shown as written (postponed annotations are strings; inspect would quote them)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(fn: Callable[..., Any], *, returns: bool = True) -> str:
    sig = inspect.signature(fn)

    def raw(annotation: Any) -> Any:
        if annotation is inspect.Parameter.empty:
            return annotation
        return _Raw(annotation if isinstance(annotation, str) else inspect.formatannotation(annotation))

    params = [p.replace(annotation=raw(p.annotation)) for p in sig.parameters.values()]
    ret = raw(sig.return_annotation) if returns else inspect.Signature.empty
    return str(sig.replace(parameters=params, return_annotation=ret))


_ROLE_RE = re.compile(r":(?:class|func|mod|meth|data|attr|obj):`~?([^`]+)`")


def _doc(obj: Any) -> str:
    """The docstring as markdown: Sphinx roles become code spans, ``rst`` literals stay (they render)."""
    text = inspect.getdoc(obj) or ""
    return _ROLE_RE.sub(r"`\1`", text).strip()


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    factory = f.default_factory
    if factory is not dataclasses.MISSING:
        if factory in (dict, list, set, tuple):
            return f"`{factory()!r}`"
        return f"`{getattr(factory, '__name__', 'factory')}()`"
    return "required"


def _field_notes(cls: type) -> tuple[str, dict[str, str]]:
    """``(the class docstring without its field entries, {field: description})``.

    A field's description is the attribute docstring under it, else its trailing comment,
    else its ``name: text`` entry in the class docstring (continued on indented lines; one
    line may hold several entries separated by ``;``). Entries used are left out of the
    returned docstring, so the table does not repeat it.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    notes: dict[str, str] = {}
    kept: list[str] = []
    entry: str | None = None
    starts = re.compile(r"(?:^|;\s+)(\w+): ")
    for line in (inspect.getdoc(cls) or "").splitlines():
        found = [m for m in starts.finditer(line) if m.group(1) in names]
        if found and found[0].start() == 0:
            for m, nxt in zip(found, [*found[1:], None], strict=True):
                end = nxt.start() if nxt is not None else len(line)
                notes[m.group(1)] = line[m.end() : end].strip()
            entry = found[-1].group(1)
        elif entry and line.startswith((" ", "\t")) and line.strip():
            notes[entry] += " " + line.strip()
        else:
            entry = None
            kept.append(line)
    try:
        source = textwrap.dedent("".join(inspect.getsourcelines(cls)[0]))
        body = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError):
        body = None
    if isinstance(body, ast.ClassDef):
        src_lines = source.splitlines()
        for i, node in enumerate(body.body):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            name = node.target.id
            nxt = body.body[i + 1] if i + 1 < len(body.body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                notes[name] = " ".join(inspect.cleandoc(nxt.value.value).split())
                continue
            line = src_lines[node.end_lineno - 1]
            if "#" in line:
                comment = line.split("#", 1)[1].strip()
                if comment and not comment.startswith(("noqa", "type:")):
                    notes[name] = comment
    doc = _ROLE_RE.sub(r"`\1`", "\n".join(kept)).strip()
    return doc, {k: _ROLE_RE.sub(r"`\1`", v).replace("|", "\\|") for k, v in notes.items()}


def _record(cls: type, qualname: str) -> list[str]:
    doc, notes = _field_notes(cls)
    out = [f"#### `{qualname}`", "", doc, ""]
    fields = dataclasses.fields(cls)
    if any(notes.get(f.name) for f in fields):
        out += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{f.name}` | `{_md_type(f.type)}` | {_default(f)} | {notes.get(f.name, '')} |" for f in fields]
    else:
        out += ["| field | type | default |", "| --- | --- | --- |"]
        out += [f"| `{f.name}` | `{_md_type(f.type)}` | {_default(f)} |" for f in fields]
    return [*out, ""]


def _md_type(t: Any) -> str:
    text = t if isinstance(t, str) else inspect.formatannotation(t)
    return text.replace("|", "\\|")


def _hookspecs(module: ModuleType) -> list[Callable[..., Any]]:
    return [v for v in vars(module).values() if inspect.isfunction(v) and hasattr(v, f"{module.PROJECT}_spec")]


def hook_reference() -> str:
    """The hook reference (markdown): hooks, decorators, records, and what the hooks receive."""
    import plugrl
    from plugrl import algorithms, data, hookspecs, specs
    from plugrl.rollout import environment, tools

    out = [
        "<!-- generated by `python -m plugrl_commands.scaffold --hook-reference --update docs/plugins.md`;"
        " do not edit -->",
        "",
        "### Hooks (`plugrl.hookspecs`)",
        "",
        _doc(hookspecs),
        "",
        "A plugin implements a hook with a function of the same name decorated with `@plugrl.hookimpl`,",
        "at module level or as a method of an instance. It takes the arguments shown, or any of them",
        "(pluggy passes only the ones it names). The hooks that register things (`plugrl_rewards` to",
        "`plugrl_tools`) take none and return a list of records.",
        "",
    ]
    for fn in _hookspecs(hookspecs):
        out += [f"#### `{fn.__name__}{_signature(fn)}`", "", _doc(fn), ""]
    out += [
        "### Decorators (`plugrl`)",
        "",
        _doc(specs),
        "",
    ]
    decorators = (
        specs.reward,
        specs.dataset,
        specs.template,
        specs.advantage_estimator,
        specs.policy_loss,
        specs.environment,
        specs.environment_family,
        plugrl.tool,
        specs.rollout_engine,
    )
    for deco in decorators:
        out += [f"#### `@plugrl.{deco.__name__}{_signature(deco, returns=False)}`", "", _doc(deco), ""]
    out += ["### Records (`plugrl.specs`)", ""]
    records = (
        specs.RewardSpec,
        specs.DatasetSpec,
        specs.TemplateSpec,
        specs.EstimatorSpec,
        specs.PolicyLossSpec,
        specs.EnvironmentSpec,
        specs.EngineSpec,
    )
    for cls in records:
        out += _record(cls, f"plugrl.{cls.__name__}")
    out += _record(tools.ToolSpec, "plugrl.rollout.tools.ToolSpec")
    out += ["### What the hooks hand to plugin functions", ""]
    out += _record(data.Sample, "plugrl.data.Sample")
    out += _record(algorithms.AdvantageBatch, "plugrl.algorithms.AdvantageBatch")
    out += _record(algorithms.StepContext, "plugrl.algorithms.StepContext")
    out += _record(algorithms.PromptGroup, "plugrl.algorithms.PromptGroup")
    out += _record(algorithms.AdvantageResult, "plugrl.algorithms.AdvantageResult")
    out += _record(environment.EnvStart, "plugrl.EnvStart")
    out += _record(environment.EnvStep, "plugrl.EnvStep")
    out += _record(environment.EpisodeScore, "plugrl.EpisodeScore")
    out += _record(environment.Turn, "plugrl.Turn")
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


def extract_reference(doc: str) -> str | None:
    """The text between the markers of a document (None when they are missing)."""
    start, end = doc.find(BEGIN_MARK), doc.find(END_MARK)
    if start < 0 or end < start:
        return None
    return doc[start + len(BEGIN_MARK) : end].strip("\n") + "\n"


def update_reference(path: str | Path) -> bool:
    """Rewrite the reference between the markers in ``path``; return whether it changed."""
    path = Path(path)
    doc = path.read_text(encoding="utf-8")
    start, end = doc.find(BEGIN_MARK), doc.find(END_MARK)
    if start < 0 or end < start:
        raise ScaffoldError(f"{path}: no {BEGIN_MARK} ... {END_MARK} markers to write the hook reference between")
    new = doc[: start + len(BEGIN_MARK)] + "\n" + hook_reference() + doc[end:]
    if new == doc:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plugrl_commands.scaffold", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hook-reference", action="store_true", help="print the hook reference (markdown)")
    parser.add_argument("--update", metavar="DOC", help="write it between the markers of DOC instead")
    parser.add_argument("--check", metavar="DOC", help="exit 1 when DOC's reference is not up to date")
    args = parser.parse_args(argv)
    if not args.hook_reference:
        parser.error("nothing to do: pass --hook-reference (scaffold plugins with `plugrl new-plugin`)")
    try:
        if args.check:
            current = extract_reference(Path(args.check).read_text(encoding="utf-8"))
            if current != hook_reference():
                fix = f"{parser.prog} --hook-reference --update {args.check}"
                print(f"{args.check}: the hook reference is out of date; run {fix}", file=sys.stderr)
                return 1
            return 0
        if args.update:
            changed = update_reference(args.update)
            print(f"{args.update}: {'updated' if changed else 'already up to date'}")
            return 0
    except (OSError, ScaffoldError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(hook_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _run(args: Any) -> int:
    try:
        result = scaffold(args.name, args.kind, args.dir, data_source=args.data_source)
    except ScaffoldError as e:
        print(f"plugrl: error: {e}", file=sys.stderr)
        return 2
    print(result.message)
    return 0


def register(commands: Any) -> None:
    """``plugrl new-plugin``: added to the kernel's command line (entry point ``new-plugin`` in plugrl.commands)."""
    n = commands.add_parser(
        "new-plugin", help="scaffold a plugin package: reward, dataset, template, advantage or environment"
    )
    n.add_argument("name", help="plugin name: lowercase letters, digits and underscores, e.g. my_task")
    n.add_argument("--kind", required=True, choices=["reward", "dataset", "template", "advantage", "environment"])
    n.add_argument("--dir", default="plugins", help="where the package folder goes (default: plugins)")
    n.add_argument(
        "--data-source",
        default=None,
        help="reward/dataset: the data_source scored or emitted (default: the plugin name)",
    )
    n.set_defaults(fn=_run)
