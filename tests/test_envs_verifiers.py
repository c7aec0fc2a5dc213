"""Prime Intellect's verifiers environments of the classic API train unchanged (plugin ``plugrl-envs-verifiers``,
:mod:`plugrl_envs_verifiers.classic`), with verifiers 0.2.0 installed.

``make setup`` installs verifiers 0.4, which has only the v1 API (tests/test_envs_verifiers_v1.py); there this
file is skipped, and a slow test of that file runs it in a scratch environment with verifiers 0.2.0.

The environments are written here with verifiers' own classes, as a published environment package writes
them (a module with ``load_environment``): a single-turn one with a weighted rubric, a multi-turn game with
``env_response`` and a ``@vf.stop`` condition, and a ``ToolEnv``. Each is loaded by the library's loader
through ``environment: verifiers:<id>``, driven by plugrl's episode loop with scripted replies, and scored;
the reference is verifiers' own ``rollout()`` + rubric on the same replies (a scripted verifiers client
answers them), so the two must agree. The real library, no mocks: only the policy's replies are scripted.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import textwrap
import time

import pytest

from episode_helpers import environment_config, tool_call

vf = pytest.importorskip("verifiers")
if importlib.metadata.version("verifiers") != "0.2.0":
    pytest.skip(
        f"the classic API needs verifiers 0.2.0, not {importlib.metadata.version('verifiers')} (the scratch "
        "environment test of tests/test_envs_verifiers_v1.py runs this file with it)",
        allow_module_level=True,
    )

from plugrl.config import Config, ConfigError  # noqa: E402
from plugrl.data import load_samples  # noqa: E402
from plugrl.plugins import check_config, load_plugins  # noqa: E402
from plugrl.rollout.routing import environment_for  # noqa: E402
from plugrl.rollout.types import Rollout  # noqa: E402
from test_multiturn import SAMPLING, _runner, _start  # noqa: E402
from tiny_runs import train_two_steps  # noqa: E402

ENVS = textwrap.dedent(
    '''
    """Three verifiers environments, as environment packages write them."""
    import verifiers as vf
    from datasets import Dataset


    def _sums(n):
        return Dataset.from_list(
            [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1), "info": {"i": i}} for i in range(n)]
        )


    # ---- single turn: a weighted rubric, a system prompt, few-shot
    def load_environment(num_examples: int = 4, bonus: float = 0.25):
        parser = vf.XMLParser(["answer"], answer_field="answer")

        def correct(completion, answer, **kwargs) -> float:
            return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

        def tagged(completion, **kwargs) -> float:
            return 1.0 if "<answer>" in completion[-1]["content"] else 0.0

        rubric = vf.Rubric(funcs=[correct, tagged], weights=[1.0, bonus], parser=parser)
        return vf.SingleTurnEnv(
            dataset=_sums(num_examples),
            eval_dataset=_sums(2),
            system_prompt="Answer in <answer></answer> tags.",
            few_shot=[
                {"role": "user", "content": "What is 1 + 1?"},
                {"role": "assistant", "content": "<answer>2</answer>"},
            ],
            parser=parser,
            rubric=rubric,
        )
    '''
)

GUESS = textwrap.dedent(
    '''
    """Multi-turn: guess the row's number; the environment says higher or lower."""
    import verifiers as vf
    from datasets import Dataset


    class Guess(vf.MultiTurnEnv):
        async def setup_state(self, state):
            state["secret"] = int(state["answer"])
            state["solved"] = False
            return state

        @vf.stop
        async def solved(self, state) -> bool:
            return state["solved"]

        async def env_response(self, messages, state, **kwargs):
            try:
                guess = int(messages[-1].content.strip())
            except ValueError:
                return [vf.UserMessage(content="Say a number.")]
            if guess == state["secret"]:  # the environment's last word: no turn answers it
                state["solved"] = True
                state["final_env_response"] = [vf.UserMessage(content="Correct!")]
                return state["final_env_response"]
            return [vf.UserMessage(content="Higher." if guess < state["secret"] else "Lower.")]


    def load_environment(max_turns: int = 4):
        rows = [
            {"prompt": [{"role": "user", "content": f"Guess my number ({i})."}], "answer": str(3 + i)} for i in range(2)
        ]

        def solved(state) -> float:
            return 1.0 if state["solved"] else 0.0

        def speed(state) -> float:
            return 1.0 / len(state["trajectory"])

        rubric = vf.Rubric(funcs=[solved, speed], weights=[1.0, 0.5])
        return Guess(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=max_turns)
    '''
)

TOOLS = textwrap.dedent(
    '''
    """A ToolEnv: the model may call add(); the rubric checks the final answer."""
    import verifiers as vf
    from datasets import Dataset


    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b


    def load_environment():
        rows = [{"question": f"Add {10 * i} and {i}.", "answer": str(11 * i)} for i in range(1, 3)]

        def exact(completion, answer, **kwargs) -> float:
            return 1.0 if completion[-1]["content"].strip() == answer else 0.0

        return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[add], rubric=vf.Rubric(funcs=[exact]), max_turns=3)
    '''
)


@pytest.fixture
def env_modules(tmp_path, monkeypatch):
    for name, text in (("vf_sums", ENVS), ("vf_guess", GUESS), ("vf_adder", TOOLS)):
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("vf_sums", "vf_guess", "vf_adder"):
        sys.modules.pop(name, None)


class _Scripted:
    """A plugrl engine that answers each episode (found by a text of its prompt) with its next reply."""

    def __init__(self, tok, replies: dict[str, list[str]]):
        self.tok, self.replies = tok, {k: list(v) for k, v in replies.items()}
        self.eos = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, sampling):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            key = next(k for k in self.replies if k in text)
            ids = self.tok(self.replies[key].pop(0), add_special_tokens=False)["input_ids"] + [self.eos]
            out.append([Rollout(list(p), ids[: sampling.max_tokens], None, "stop")])
        return out


def _reference(env, row: dict, replies: list[str], calls: list[list[dict]] | None = None):
    """verifiers' own rollout() and rubric on ``replies`` (a scripted verifiers client gives them)."""
    from verifiers.clients import Client
    from verifiers.types import Response, ResponseMessage, ToolCall

    script = list(replies)
    tool_calls = list(calls or [[] for _ in replies])

    class ScriptedClient(Client):
        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools, **kwargs):
            k = len(replies) - len(script)
            made = [
                ToolCall(id=f"call_{k}_{j}", name=c["name"], arguments=json.dumps(c["arguments"]))
                for j, c in enumerate(tool_calls[k])
            ]
            message = ResponseMessage(
                content=script.pop(0), tool_calls=made or None, finish_reason="stop", is_truncated=False
            )
            return Response(id="r", created=int(time.time()), model=model, message=message)

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

    import asyncio

    async def run():
        state = await env.rollout(dict(row), ScriptedClient(None), "m", {})
        await env.rubric.score_rollout(state)
        return state

    return asyncio.run(run())


def _play(tok, cfg, registry, replies: dict[str, list[str]], split="train", max_turns=4):
    samples, _ = load_samples(cfg.data, registry, split=split, ground_truth_optional=lambda ds: True)
    spec = environment_for(cfg, registry, samples[0].data_source)
    runner, _, _ = _runner(_Scripted(tok, replies), tok, turn_tokens=64, max_turns=max_turns)
    played = runner.run([_start(tok, s, spec.factory) for s in samples], SAMPLING)
    return samples, played


def test_a_single_turn_environment_brings_its_data_and_its_rubric_scores(smol_tokenizer, env_modules):
    """verifiers:<module> loads through verifiers' loader with environment_options as load_environment's
    arguments; its dataset is the run's data (system prompt and few-shot in every prompt, answer and info
    kept); the rubric's weighted sum is the reward and each function is a part, equal to verifiers' own."""
    cfg, registry = environment_config("verifiers:vf_sums", {"num_examples": 3, "bonus": 0.5})
    assert cfg.data.dataset == "verifiers:vf_sums" and registry.environments["verifiers:vf_sums"].scores_episodes
    replies = {"0 + 1": ["<answer>1</answer>"], "1 + 2": ["<answer>4</answer>"], "2 + 3": ["5"]}
    samples, played = _play(smol_tokenizer, cfg, registry, {k: list(v) for k, v in replies.items()})
    assert len(samples) == 3 and {s.data_source for s in samples} == {"vf_sums"}
    first = samples[0].prompt
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user"]
    assert first[0]["content"] == "Answer in <answer></answer> tags." and first[2]["content"] == "<answer>2</answer>"
    scores = {s.row["question"]: (c.reward, c.reward_parts) for s, (_, c) in zip(samples, played, strict=True)}
    assert [scores[f"What is {i} + {i + 1}?"][0] for i in range(3)] == [1.5, 0.5, 0.0]
    env = sys.modules["vf_sums"].load_environment(num_examples=3, bonus=0.5)
    for s, (_, c) in zip(samples, played, strict=True):
        key = next(k for k in replies if k in s.row["question"])
        ref = _reference(env, s.row, replies[key])
        assert c.reward == pytest.approx(ref["reward"]) and c.reward_parts == pytest.approx(ref["metrics"])
        assert c.turns == 1 and c.finish == "done"
    val, _ = load_samples(cfg.data, registry, split="test", ground_truth_optional=lambda ds: True)
    assert len(val) == 2  # the eval_dataset


def test_a_multi_turn_environment_answers_and_stops_as_in_verifiers(smol_tokenizer, env_modules):
    """env_response's messages are what the policy reads next; the @vf.stop condition ends the episode; the
    rubric reads the state the rollout built. Scores equal verifiers' own rollout on the same replies."""
    cfg, registry = environment_config("verifiers:vf_guess", rollout={"max_turns": 4})
    script = {"(0)": ["1", "5", "3"], "(1)": ["x", "9", "8", "7"]}
    samples, played = _play(smol_tokenizer, cfg, registry, {k: list(v) for k, v in script.items()})
    (r0, c0), (r1, c1) = played
    assert [m["content"] for m in c0.messages if m["role"] == "user"][1:] == ["Higher.", "Lower.", "Correct!"]
    assert (c0.turns, c0.finish, c0.reward) == (3, "done", pytest.approx(1.0 + 0.5 / 3))
    assert c0.messages[-1] == {"role": "user", "content": "Correct!"}  # kept in the log, not in the tokens
    assert "Correct!" not in smol_tokenizer.decode(r0.response_ids)
    assert (c1.turns, c1.finish) == (4, "done")  # verifiers' own max_turns=4 stop condition
    assert c1.reward == pytest.approx(0.5 / 4) and c1.reward_parts["solved"] == 0.0
    env = sys.modules["vf_guess"].load_environment()
    for s, (_, c), key in zip(samples, played, ["(0)", "(1)"], strict=True):
        ref = _reference(env, s.row, script[key])
        assert c.reward == pytest.approx(ref["reward"]) and c.reward_parts == pytest.approx(ref["metrics"])
    assert sum(r0.policy_mask) < len(r0.policy_mask)  # the feedback is context, not trained


def test_a_tool_environment_runs_its_own_tools(smol_tokenizer, env_modules):
    """ToolEnv's tools are shown to the model and run by verifiers' env_response (not by plugrl's workers);
    the episode ends at the first reply without a call (its no_tools_called stop); scores equal verifiers'."""
    cfg, registry = environment_config("verifiers:vf_adder", rollout={"max_turns": 3})
    replies = {"Add 10 and 1": [tool_call("add", a=10, b=1), "11"], "Add 20 and 2": [tool_call("add", a=20, b=2), "23"]}
    samples, played = _play(smol_tokenizer, cfg, registry, {k: list(v) for k, v in replies.items()})
    (r0, c0), (r1, c1) = played
    assert '"name": "add"' in smol_tokenizer.decode(r0.prompt_ids)  # the schema reached the prompt
    tool_msgs = [m for m in c0.messages if m["role"] == "tool"]
    assert [(m["content"], m["name"], m["tool_call_id"]) for m in tool_msgs] == [("11", "add", "call_0_0")]
    assert (c0.finish, c0.reward, c0.tool_calls, c0.tool_errors) == ("done", 1.0, 1, 0)
    assert (c1.reward, c1.reward_parts["add_calls"]) == (0.0, 1.0)
    env = sys.modules["vf_adder"].load_environment()
    for s, (_, c), key in zip(samples, played, replies, strict=True):
        a, b = (10, 1) if key.startswith("Add 10") else (20, 2)
        ref = _reference(env, s.row, replies[key], calls=[[{"name": "add", "arguments": {"a": a, "b": b}}], []])
        assert c.reward == pytest.approx(ref["reward"]) and c.reward_parts == pytest.approx(ref["metrics"])


def test_bad_input_is_one_clear_error_at_start(env_modules, tmp_path):
    """An unknown id, a family named without an id, a plugin that is not loaded, an environment plugrl cannot
    drive, and a dataset whose prompts are not chat messages: each an error at start naming the fix."""
    with pytest.raises(ConfigError, match=r"verifiers:no_such_env.*failed to load.*Could not import 'no_such_env'"):
        environment_config("verifiers:no_such_env")
    with pytest.raises(ConfigError, match=r"'verifiers' is a family of environments.*'verifiers:<id>'"):
        environment_config("verifiers", data={"dataset": "x"})
    hint = r"family 'verifiers' is not loaded; add plugin 'verifiers'.*plugrl-envs-verifiers"
    with pytest.raises(ConfigError, match=hint):
        cfg = Config.model_validate({"model": {"path": "x"}, "plugins": [], "environment": "verifiers:vf_sums"})
        check_config(cfg, load_plugins(cfg.plugins))
    (tmp_path / "vf_group.py").write_text(
        "import verifiers as vf\nfrom vf_sums import load_environment as one\n\n"
        "def load_environment():\n    return vf.EnvGroup(envs=[one(), one()], env_names=['a', 'b'])\n"
    )
    with pytest.raises(ConfigError, match=r"returned a EnvGroup; plugrl drives verifiers' MultiTurnEnv family"):
        environment_config("verifiers:vf_group")
    (tmp_path / "vf_grouped.py").write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n\n"
        "def load_environment():\n"
        "    def rank(completions, **kw):\n        return [0.0 for _ in completions]\n"
        "    ds = Dataset.from_list([{'question': 'q', 'answer': 'a'}])\n"
        "    return vf.SingleTurnEnv(dataset=ds, rubric=vf.Rubric(funcs=[rank]))\n"
    )
    with pytest.raises(ConfigError, match=r"group-level reward functions \(rank\)"):
        environment_config("verifiers:vf_grouped")
    sys.modules.pop("vf_group", None)
    sys.modules.pop("vf_grouped", None)


def test_the_library_missing_names_the_install_command(env_modules, monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # what `import verifiers` meets where it is not installed
    with pytest.raises(ConfigError, match=r"verifiers library does not import.*pip install plugrl-envs-verifiers"):
        environment_config("verifiers:vf_sums")


def test_a_dataset_without_prompts_stops_the_run_at_start(env_modules, tmp_path):
    from plugrl.data import DataError

    (tmp_path / "vf_noprompt.py").write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n\n"
        "class Bare(vf.SingleTurnEnv):\n"
        "    def _format_dataset_source(self, dataset):\n        return dataset\n\n"
        "def load_environment():\n"
        "    return Bare(dataset=Dataset.from_list([{'question': 'q', 'answer': 'a'}]))\n"
    )
    cfg, registry = environment_config("verifiers:vf_noprompt")
    with pytest.raises(DataError, match=r"verifiers:vf_noprompt's train dataset has no 'prompt' column"):
        load_samples(cfg.data, registry, ground_truth_optional=lambda ds: True)
    sys.modules.pop("vf_noprompt", None)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_id", "turns", "parts"),
    [
        ("vf_sums", 1, {"correct", "tagged"}),
        ("vf_guess", 4, {"solved", "speed"}),
        ("vf_adder", 3, {"exact", "add_calls"}),
    ],
)
def test_two_training_steps_with_a_verifiers_environment(tiny_model, tmp_path, env_modules, env_id, turns, parts):
    """`plugrl train` with environment: verifiers:<id> and no data or reward plugin of its own, for the
    single-turn, the multi-turn and the tool environment: the environment's dataset and rubric train two
    steps, and the rubric's functions are logged as reward/<name>/mean."""
    overrides = [
        "plugins=[verifiers,advantages]",
        f"environment=verifiers:{env_id}",
        "data.max_prompt_length=256",
        "data.max_response_length=48",
        f"rollout.max_turns={turns}",
        "rollout.max_turn_tokens=8",
    ]
    metrics, rows = train_two_steps(tmp_path, tiny_model, "vf", overrides)
    assert [m["step"] for m in metrics] == [1, 2] and all(m["actor/optimizer_steps"] >= 1 for m in metrics)
    assert all(m["env/errors"] == 0.0 and {f"reward/{p}/mean" for p in parts} <= set(m) for m in metrics)
    assert all(row["env_reward"] is not None and set(row["details"]) >= {"environment", *parts} for row in rows)
