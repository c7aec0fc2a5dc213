"""verifiers v1 environments (verifiers 0.4, ``import verifiers.v1 as vf``) train as their authors wrote them
(plugin ``plugrl-envs-verifiers``, :mod:`plugrl_envs_verifiers.v1`).

The environments are written here in v1's style (none copied from verifiers): a single-turn taskset scored by
reward functions, a multi-turn taskset whose model uses an MCP toolset and meets a ``@vf.stop``, a judge-scored
taskset (a judge in the task's code and one plugged in by config), and a task for the ``bash`` harness whose
reward reads the file the model wrote. Each is loaded by verifiers' own loader through ``environment:
verifiers:<taskset id>`` and played by plugrl's agent runner: verifiers' real harness program, in the subprocess
runtime under plugrl's sandbox limits, calls the policy through verifiers' interception server and plugrl's
rollout endpoint; a scripted engine gives the policy's replies (their tokens are the point: they must be trained
exactly). Then verifiers' own evaluation (``run_eval``, the function behind ``vf-eval``) plays the same tasks on
the same completions, a replay server answering each call with the reply plugrl's endpoint gave, and the scores
must be equal.

Stand-ins, each because the real thing cannot run here: the judge is an OpenAI-compatible server on 127.0.0.1
that answers as a judge would (no judge model runs on this CPU); and verifiers' own evaluation runs its harness
program in plugrl's runtime, with the packages installed here, because verifiers' subprocess runtime would fetch
them with ``uv`` from the network (where the program runs changes neither what it sends nor how it is scored).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import re
import sys
import textwrap
from concurrent.futures import Future
from pathlib import Path

import pytest

from episode_helpers import environment_config, tool_call

vf = pytest.importorskip("verifiers.v1")

from plugrl.config import ConfigError  # noqa: E402
from plugrl.data import load_samples  # noqa: E402
from plugrl.rollout.routing import environment_for  # noqa: E402
from plugrl.rollout.tools import get_parser  # noqa: E402
from plugrl_agents.endpoint import ChatEndpoint  # noqa: E402
from plugrl_agents.episodes import AgentRunner  # noqa: E402
from plugrl_multiturn.chat import ChatFormat  # noqa: E402
from plugrl_multiturn.records import EpisodeStart, MultiTurnLimits  # noqa: E402
from stand_in_openai import StandInOpenAI  # noqa: E402
from test_agents import SAMPLING, Scripted  # noqa: E402

SUMS = '''
"""Single turn: add two numbers. Two weighted rewards and a metric."""
import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.reward(weight=0.25)
    async def brief(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 3)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 4


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            data = SumData(prompt=f"[{i}] What is {i} + {i + 1}?", system_prompt="Answer with the number only.",
                           answer=str(2 * i + 1))
            yield SumTask(data, self.config.task)


__all__ = ["SumTaskset"]
'''

CALC = '''
"""An MCP toolset: the calculator the harness installs (tools are named calc_<method>)."""
import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


if __name__ == "__main__":
    CalcToolset.run()
'''

ADDER = '''
"""Multi-turn: add with the calculator toolset, then say the sum; a rollout stops after two turns."""
import verifiers.v1 as vf
from vf1_calc import CalcToolset


class AddData(vf.TaskData):
    answer: str


class AddTask(vf.Task[AddData]):
    @vf.stop
    async def two_turns(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 2

    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class AddConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class AddTaskset(vf.Taskset[AddTask, AddConfig]):
    @classmethod
    def toolsets(cls, config):
        return [CalcToolset(config.tools)]

    def load(self):
        for i in (1, 2):
            prompt = f"[{i}] Add {10 * i} and {i} with the calculator, then say the sum."
            yield AddTask(AddData(prompt=prompt, answer=str(11 * i)), self.config.task)


__all__ = ["AddTaskset"]
'''

JUDGED = '''
"""Judge-scored: a judge the task's code calls, and verifiers' reference judge plugged in by config."""
import verifiers.v1 as vf


class CapitalJudge(vf.Judge[bool]):
    prompt = "Question: {question}\\nReference: {answer}\\nResponse: {response}\\nCorrect? Reply yes or no."

    def parse(self, response: vf.JudgeResponse[bool]) -> bool:
        return response.text.strip().lower().startswith("yes")


class CapitalData(vf.TaskData):
    answer: str


class CapitalTaskConfig(vf.TaskConfig):
    judge: vf.JudgeConfig = vf.JudgeConfig(model="judge")


class CapitalTask(vf.Task[CapitalData, vf.State, CapitalTaskConfig]):
    @vf.reward
    async def judged(self, trace: vf.Trace) -> float:
        verdict = await CapitalJudge(self.config.judge).evaluate(
            trace=trace, question=self.data.prompt_text, answer=self.data.answer, response=trace.last_reply
        )
        return float(verdict.parsed)


class CapitalConfig(vf.TasksetConfig):
    task: CapitalTaskConfig = CapitalTaskConfig()


class CapitalTaskset(vf.Taskset[CapitalTask, CapitalConfig]):
    def load(self):
        for i, (country, city) in enumerate((("France", "Paris"), ("Italy", "Rome"))):
            yield CapitalTask(CapitalData(prompt=f"[{i}] The capital of {country}?", answer=city), self.config.task)


__all__ = ["CapitalTaskset"]
'''

FILES = '''
"""For the bash harness (verifiers' default): write the answer into a file; the reward reads it back."""
import verifiers.v1 as vf


class FileData(vf.TaskData):
    answer: str


class FileTask(vf.Task[FileData]):
    @vf.reward
    async def wrote(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        try:
            data = await runtime.read("answer.txt")
        except Exception:
            return 0.0
        return float(data.decode().strip() == self.data.answer)


class FileTaskset(vf.Taskset[FileTask, vf.TasksetConfig]):
    def load(self):
        for i in (1, 2):
            data = FileData(prompt=f"[{i}] Write {7 * i} into answer.txt.", answer=str(7 * i))
            yield FileTask(data, self.config.task)


__all__ = ["FileTaskset"]
'''

MODULES = {"vf1_sums": SUMS, "vf1_calc": CALC, "vf1_adder": ADDER, "vf1_judged": JUDGED, "vf1_files": FILES}
NULL = {"agent": {"harness": {"id": "null"}}}  # verifiers' tool-less chat loop


@pytest.fixture
def v1_envs(tmp_path, monkeypatch):
    """The environments as modules on the path, of this process and of the programs it starts (tool servers)."""
    folder = tmp_path / "envs"
    folder.mkdir()
    for name, text in MODULES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    yield folder
    for name in [*MODULES, "vf1_pair", "vf1_classic"]:
        sys.modules.pop(name, None)


def _marker(messages: list[dict]) -> str:
    return next(m for m in re.findall(r"\[\d\]", " ".join(str(x.get("content")) for x in messages)))


def _play(tok, cfg, registry, script, *, max_turns=4, turn_tokens=64, response_tokens=1024):
    """plugrl's agent runner plays the environment's samples, the engine answering each episode (found by the
    marker [i] in its prompt) with its scripted replies. Returns the samples, the played (rollout,
    conversation) pairs, the engine (its calls) and the replies the endpoint gave, by marker."""
    samples, _ = load_samples(cfg.data, registry, split="train", ground_truth_optional=lambda ds: True)
    spec = environment_for(cfg, registry, samples[0].data_source)
    engine = Scripted(tok, {k: list(v) for k, v in script.items()})
    limits = MultiTurnLimits(max_turns, turn_tokens, response_tokens, 8, max_prompt_tokens=2048)
    runner = AgentRunner(engine, ChatFormat(tok, "SmolLM2"), tok, limits, parser=get_parser("hermes"), batch_wait_s=0.5)
    answered: dict[str, list] = {}
    submit = runner.submit

    def recording(key, request):
        future = submit(key, request)
        replies = answered.setdefault(_marker(request.messages), [])

        def keep(done: Future) -> None:
            if done.exception() is None:
                replies.append(done.result())

        future.add_done_callback(keep)
        return future

    runner.submit = recording
    starts = [EpisodeStart(s, None, list(s.prompt), spec.factory, "verifiers v1 (test)") for s in samples]
    try:
        played = runner.run(starts, SAMPLING)
    finally:
        runner.close()
    return samples, played, engine, answered


class _Replay:
    """A backend for plugrl's endpoint that answers call k of an episode (found by its marker) with the k-th reply
    plugrl's run gave it: the same completions, for verifiers' own evaluation."""

    def __init__(self, answered: dict[str, list]):
        self.answered = answered

    def knows(self, key: str) -> bool:
        return True

    def submit(self, key, request) -> Future:
        future: Future = Future()
        calls = sum(m["role"] == "assistant" for m in request.messages)
        future.set_result(self.answered[_marker(request.messages)][calls])
        return future


def _verifiers_eval(env_id: str, options: dict, answered: dict, out, limits: dict | None = None) -> dict:
    """verifiers' own evaluation of the taskset (``run_eval``, one rollout per task; ``options``: its [env] block)
    on the replies plugrl's run gave, its harness program under ``limits``: its traces, by task marker."""
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    from plugrl_envs_verifiers.harness_runtime import HarnessLimits, Sandbox, install, sandbox_for_episode

    endpoint = ChatEndpoint(_Replay(answered))
    url = endpoint.start()
    env = {**options, "taskset": {**options.get("taskset", {}), "id": env_id}}
    seat = env.setdefault("agent", {})
    env["agent"] = {**seat, "runtime": {"type": "subprocess"}}
    config = EvalConfig.model_validate(
        {
            "env": env,
            "model": "policy",
            "client": {"type": "eval", "base_url": url, "api_key_var": "REPLAY_API_KEY"},
            "rich": None,
            "push": False,
            "output_dir": str(out),
        }
    )
    install()

    async def evaluate():
        with sandbox_for_episode(Sandbox.checked(HarnessLimits(**(limits or {})))):
            return await run_eval(config)

    try:
        episodes = asyncio.run(evaluate())
    finally:
        endpoint.close()
    return {_marker([{"content": e.traces[0].task.data.prompt}]): e.traces[0] for e in episodes}


def _parts(trace) -> dict[str, float]:
    parts = {name: r.score for name, r in trace.rewards.items() if r is not None}
    return parts | {name: v for name, v in trace.metrics.items() if v is not None}


def _trained(rollout) -> list[int]:
    return [t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if m]


def _between(rollout) -> list[int]:
    return [t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if not m]


def _same_scores(samples, played, reference) -> None:
    for sample, (_, conversation) in zip(samples, played, strict=True):
        trace = reference[_marker(sample.prompt)]
        assert trace.ok and conversation.finish == "done", conversation.error
        assert conversation.reward == pytest.approx(trace.reward)
        assert conversation.reward_parts == pytest.approx(_parts(trace))


# ---------------------------------------------------------------------------- the four environments


def test_a_single_turn_taskset_trains_the_sampled_tokens_and_scores_as_verifiers_eval(
    smol_tokenizer, v1_envs, monkeypatch, tmp_path
):
    """The taskset's tasks are the run's data (system prompt and prompt, the task's data carried in the row);
    the null harness sends them; the trained response is exactly the engine's sampled tokens, with their
    log-probs; the weighted reward and each reward and metric equal verifiers' own evaluation's."""
    monkeypatch.setenv("REPLAY_API_KEY", "replay")
    tok = smol_tokenizer
    options = {"taskset": {"num_tasks": 3}, **NULL}
    cfg, registry = environment_config("verifiers:vf1_sums", options)
    assert registry.environments["verifiers:vf1_sums"].scores_episodes and cfg.data.dataset == "verifiers:vf1_sums"
    script = {"[0]": ["1"], "[1]": ["four"], "[2]": ["the answer is 5"]}
    samples, played, engine, answered = _play(tok, cfg, registry, script)
    assert [s.prompt for s in samples][0] == [
        {"role": "system", "content": "Answer with the number only."},
        {"role": "user", "content": "[0] What is 0 + 1?"},
    ]
    assert samples[2].row["task_data"]["answer"] == "5" and samples[2].data_source == "vf1_sums"
    for sample, (rollout, _) in zip(samples, played, strict=True):
        (call,) = [p for batch in engine.calls for p in batch if p == rollout.prompt_ids]  # one call, this prompt
        assert tok.decode(call).endswith(f"{sample.prompt[1]['content']}<|im_end|>\n<|im_start|>assistant\n")
        sampled = tok(script[_marker(sample.prompt)][0], add_special_tokens=False)["input_ids"] + [engine.eos]
        assert rollout.response_ids == sampled and rollout.policy_mask == [1] * len(sampled)
        assert rollout.logprobs == [-0.01 * (j + 1) for j in range(len(sampled))]
    assert [c.reward for _, c in played] == [1.25, 0.0, 0.0]
    assert played[1][1].reward_parts == {"correct": 0.0, "brief": 0.0, "reply_chars": 4.0}
    _same_scores(samples, played, _verifiers_eval("vf1_sums", options, answered, tmp_path / "vf-eval"))


@pytest.mark.slow
def test_a_multi_turn_taskset_with_an_mcp_toolset_and_a_stop(smol_tokenizer, v1_envs, monkeypatch, tmp_path):
    """The taskset's MCP toolset is shown to the model (calc_add) and run by the harness; the tool's result is
    context (masked), the replies are trained token for token, each call reading the previous context plus
    exactly those tokens; the task's @vf.stop ends a rollout after two turns (the third call is refused before
    it reaches the policy), scored. Scores equal verifiers'."""
    monkeypatch.setenv("REPLAY_API_KEY", "replay")
    tok = smol_tokenizer
    cfg, registry = environment_config("verifiers:vf1_adder", NULL)
    script = {
        "[1]": [tool_call("calc_add", a=10, b=1), "11"],
        "[2]": [tool_call("calc_add", a=20, b=2), tool_call("calc_add", a=22, b=0), "never asked"],
    }
    samples, played, engine, answered = _play(tok, cfg, registry, script)
    (r1, c1), (r2, c2) = played
    assert '"name": "calc_add"' in tok.decode(r1.prompt_ids)  # the toolset's tool, described to the model
    replies = [tok(t, add_special_tokens=False)["input_ids"] + [engine.eos] for t in script["[1]"]]
    assert _trained(r1) == replies[0] + replies[1]
    assert tok.decode(_between(r1)) == "\n<|im_start|>tool\n11<|im_end|>\n<|im_start|>assistant\n"
    first, second = [p for batch in engine.calls for p in batch if p[: len(r1.prompt_ids)] == r1.prompt_ids]
    assert second == first + r1.response_ids[: len(second) - len(first)]  # append-only: never re-tokenized
    assert (c1.turns, c1.tool_calls, c1.reward, c1.reward_parts) == (2, 1, 1.0, {"exact": 1.0, "calls": 1.0})
    # the stop, scored: the trace holds the first tool result (the second came with the refused call)
    assert (c2.turns, c2.reward, c2.reward_parts) == (2, 0.0, {"exact": 0.0, "calls": 1.0})
    assert engine.replies["[2]"] == ["never asked"]  # the stop refused the third call before it reached the policy
    _same_scores(samples, played, _verifiers_eval("vf1_adder", NULL, answered, tmp_path / "vf-eval"))


def _judge_reply(record: dict) -> str:
    """The stand-in judge: 'yes' when the response holds the reference answer (either judge's prompt)."""
    text = record["body"]["messages"][-1]["content"]
    found = re.search(r"Reference: (.*)\nResponse: (.*)\n", text) or re.search(
        r"Reference answer:\n```\n(.*?)\n```.*Response:\n```\n(.*?)\n```", text, re.DOTALL
    )
    return "yes" if found and found.group(1).lower() in found.group(2).lower() else "no"


def test_a_judge_scored_taskset_calls_its_judges(smol_tokenizer, v1_envs, monkeypatch, tmp_path):
    """The task's own judge and a plugged reference judge (both on a local OpenAI-compatible server, named by
    environment_options) score each episode; verifiers' evaluation of the same completions agrees."""
    monkeypatch.setenv("REPLAY_API_KEY", "replay")
    monkeypatch.setenv("JUDGE_API_KEY", "judge-key")
    with StandInOpenAI(_judge_reply, models=("judge", "grader")) as judge:
        endpoint = {"base_url": judge.base_url, "api_key_var": "JUDGE_API_KEY"}
        options = {
            "taskset": {
                "task": {
                    "judge": {"model": "judge", **endpoint},  # a mapping replaces the default whole
                    "judges": [{"id": "reference", "model": "grader", "weight": 0.5, **endpoint}],
                }
            },
            **NULL,
        }
        cfg, registry = environment_config("verifiers:vf1_judged", options)
        samples, played, _, answered = _play(smol_tokenizer, cfg, registry, {"[0]": ["Paris."], "[1]": ["Milan"]})
        assert [(c.reward, c.reward_parts) for _, c in played] == [
            (1.5, {"judged": 1.0, "reference": 1.0}),
            (0.0, {"judged": 0.0, "reference": 0.0}),
        ]
        assert {r["body"]["model"] for r in judge.requests} == {"judge", "grader"} and len(judge.requests) == 4
        assert all(r["auth"] == "Bearer judge-key" for r in judge.requests)
        _same_scores(samples, played, _verifiers_eval("vf1_judged", options, answered, tmp_path / "vf-eval"))


def test_the_bash_harness_runs_the_models_commands_in_plugrls_sandbox(smol_tokenizer, v1_envs, monkeypatch, tmp_path):
    """verifiers' default harness (bash) runs the commands the model asks for in a throw-away folder, under the
    sandbox's limits (CPU seconds, address space: ulimit shows them; a command past the memory limit fails),
    as an unprivileged user when the trainer is root (it cannot remove the trainer's files), with no secret of the
    trainer's in its environment; the reward reads the file back through the runtime. Scores equal verifiers'
    own evaluation's."""
    monkeypatch.setenv("REPLAY_API_KEY", "replay")
    monkeypatch.setenv("PLUGRL_TEST_SECRET_TOKEN", "hunter2")
    options = {"sandbox": {"cpu_s": 30, "memory_mb": 1024}}
    cfg, registry = environment_config("verifiers:vf1_files", options)
    victim = tmp_path / "the-trainers-file"
    victim.write_text("keep me")
    probe = "echo 7 > answer.txt; ulimit -t; ulimit -v; pwd; id -un; env"
    hog = f"python3 -c 'bytearray(2 * 2**30)' 2>&1 | tail -1; rm -f {victim}; echo 15 > answer.txt"
    script = {"[1]": [tool_call("bash", command=probe), "done"], "[2]": [tool_call("bash", command=hog), "done"]}
    samples, played, _, answered = _play(smol_tokenizer, cfg, registry, script, turn_tokens=160)
    (r1, c1), (r2, c2) = played
    assert "You are a coding agent" in smol_tokenizer.decode(r1.prompt_ids)  # the bash harness's own prompt
    (shown,) = [m["content"] for m in c1.messages if m["role"] == "tool"]
    cpu, memory, folder, user, *env = shown.splitlines()
    assert (cpu, memory) == ("30", str(1024 * 1024))  # ulimit -v counts KiB
    dropped = registry.environments["verifiers:vf1_files"].factory.v1.sandbox.owner is not None
    assert user == ("nobody" if dropped else getpass.getuser())  # root drops to nobody where nobody can run Python
    assert not dropped or victim.read_text() == "keep me"
    assert folder.startswith("/tmp/plugrl-harness-") and f"HOME={folder}" in env
    assert not any("hunter2" in line or "API_KEY" in line for line in env)
    assert "MemoryError" in [m["content"] for m in c2.messages if m["role"] == "tool"][0]
    assert (c1.reward, c2.reward) == (1.0, 0.0)
    assert not Path(folder).exists()  # removed with the rollout
    reference = _verifiers_eval("vf1_files", {}, answered, tmp_path / "vf-eval", options["sandbox"])
    _same_scores(samples, played, reference)


# ---------------------------------------------------------------------------- the run's limits


@pytest.mark.slow
def test_the_runs_limits_end_a_rollout_as_verifiers_ends_its_own(smol_tokenizer, v1_envs):
    """rollout.max_turns below the environment's own becomes the seat's max_turns (said at start), so verifiers
    refuses the next call itself and scores the rollout; a call past data.max_response_length is refused with
    OpenAI's context_length_exceeded, on which verifiers' chat harness ends its run cleanly, scored. Neither is
    an error: a refusal verifiers did not know for a limit would fail its rollout, unscored."""
    tok = smol_tokenizer
    call = tool_call("calc_add", a=10, b=1)
    cfg, registry = environment_config("verifiers:vf1_adder", NULL, rollout={"max_turns": 1})
    assert registry.environments["verifiers:vf1_adder"].factory.v1.seat.max_turns == 1
    _, played, _, _ = _play(tok, cfg, registry, {"[1]": [call, "11"], "[2]": [call, "22"]}, max_turns=1)
    for _, conversation in played:
        assert (conversation.finish, conversation.turns, conversation.error) == ("done", 1, None)
        assert (conversation.reward, conversation.reward_parts) == (0.0, {"exact": 0.0, "calls": 0.0})
    reply = len(tok(call, add_special_tokens=False)["input_ids"]) + 1
    cfg, registry = environment_config("verifiers:vf1_adder", NULL)
    _, played, _, _ = _play(tok, cfg, registry, {"[1]": [call, "11"], "[2]": [call, "22"]}, response_tokens=reply + 3)
    for rollout, conversation in played:
        assert (conversation.finish, conversation.turns, conversation.error) == ("truncated", 1, None)
        assert conversation.reward == 0.0 and conversation.reward_parts["exact"] == 0.0
        assert len(rollout.response_ids) == reply and rollout.policy_mask == [1] * reply


# ---------------------------------------------------------------------------- refused at start


PAIR = """
import verifiers.v1 as vf
from vf1_sums import SumTaskset


class PairTaskset(SumTaskset):
    pass


class PairConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    checker: vf.AgentConfig = vf.AgentConfig()


class PairEnv(vf.Env[PairConfig]):
    async def run(self, task, agents):
        await agents.solver.run(task)
        await agents.checker.run(task)


__all__ = ["PairTaskset", "PairEnv"]
"""

CLASSIC = """
import verifiers as vf


class Guess(vf.MultiTurnEnv):
    pass


def load_environment():
    return Guess()
"""


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"agent": {"runtime": {"type": "docker"}}}, r"agent.runtime.type='docker' is a container, which cannot start"),
        (
            {"agent": {"runtime": {"type": "prime"}}},
            r"agent.runtime.type='prime' is a hosted sandbox.*type: subprocess",
        ),
        ({"agent": {"harness": {"id": "codex"}}}, r"agent.harness.id='codex': verifiers' codex harness cannot run"),
        ({"agent": {"harness": {"id": None}}}, r"harness.id is YAML's null.*write the name in quotes.*'null'"),
        ({"agent": {"model": "gpt-x"}}, r"agent.model pins the seat to another model or endpoint"),
        ({"agent": {"retries": {"max_retries": 2}}}, r"agent.retries retries failed rollouts.*second sample"),
        ({"taskset": {"num_taks": 2}}, r"environment_options.taskset.num_taks: Extra inputs are not permitted"),
        ({"sandbox": {"memory": 10}}, r"environment_options.sandbox.memory: Extra inputs"),
        ({"taskset": {"id": "other"}}, r"taskset.id='other': the taskset is the one named in"),
    ],
)
def test_what_cannot_run_here_is_refused_at_start_naming_the_key(v1_envs, options, message):
    with pytest.raises(ConfigError, match=message):
        environment_config("verifiers:vf1_sums", options)


def test_environments_plugrl_does_not_train_are_refused_in_one_line(v1_envs, monkeypatch):
    """Several agent seats; an unknown taskset; a classic-API environment under verifiers 0.4 (one line naming
    the version that runs it); a verifiers version plugrl does not drive; the library missing."""
    (v1_envs / "vf1_pair.py").write_text(textwrap.dedent(PAIR))
    (v1_envs / "vf1_classic.py").write_text(textwrap.dedent(CLASSIC))
    with pytest.raises(
        ConfigError, match=r"plays 2 agent seats \(solver, checker\); plugrl trains environments with one"
    ):
        environment_config("verifiers:vf1_pair")
    with pytest.raises(ConfigError, match=r"taskset 'no-such-taskset' not found \(tried to import 'no_such_taskset'\)"):
        environment_config("verifiers:no-such-taskset")
    with pytest.raises(ConfigError, match=r"written for verifiers' classic API.*pip install 'verifiers==0.2.0'"):
        environment_config("verifiers:vf1_classic")
    import plugrl_envs_verifiers

    monkeypatch.setattr(plugrl_envs_verifiers.importlib.metadata, "version", lambda name: "0.3.1")
    with pytest.raises(ConfigError, match=r"verifiers 0.3.1 is installed; plugrl trains the v1 API of verifiers 0.4"):
        environment_config("verifiers:vf1_sums")
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "verifiers", None)  # what `import verifiers` meets where it is not installed
    with pytest.raises(ConfigError, match=r"verifiers library does not import.*pip install plugrl-envs-verifiers"):
        environment_config("verifiers:vf1_sums")


def test_validation_tasks_come_from_eval_taskset(v1_envs):
    """A v1 taskset has no splits: the validation split's tasks load with environment_options.eval_taskset over
    the taskset's options, and without it the error names the key."""
    from plugrl.data import DataError

    cfg, registry = environment_config(
        "verifiers:vf1_sums", {"taskset": {"num_tasks": 4}, "eval_taskset": {"num_tasks": 2}}
    )
    train, _ = load_samples(cfg.data, registry, split="train", ground_truth_optional=lambda ds: True)
    test, _ = load_samples(cfg.data, registry, split="test", ground_truth_optional=lambda ds: True)
    assert (len(train), len(test)) == (4, 2) and test[1].row["task_split"] == "test"
    cfg, registry = environment_config("verifiers:vf1_sums")
    with pytest.raises(DataError, match=r"has no 'test' split: set environment_options.eval_taskset"):
        load_samples(cfg.data, registry, split="test", ground_truth_optional=lambda ds: True)


# ---------------------------------------------------------------------------- the harness's runtime


def test_the_harness_runtime_starts_every_process_in_the_sandbox(tmp_path, monkeypatch):
    """What a v1 harness runs (HarnessRuntime): each process under the limits (CPU seconds: a spinning shell is
    killed; file size; address space), in a fresh folder removed at the end, with PATH, LANG, HOME, TMPDIR and
    what the harness passes only; for a root trainer as an unprivileged user (nobody), who owns the folder and
    the files the task writes there, and cannot remove the trainer's files. A PEP 723 program runs with the
    trainer's Python when what it declares is installed here, and is refused naming what is not."""
    import pwd
    import signal

    from verifiers.v1.errors import SandboxError

    from plugrl_envs_verifiers.harness_runtime import HarnessLimits, HarnessRuntime, Sandbox

    monkeypatch.setenv("PLUGRL_TEST_SECRET_TOKEN", "hunter2")
    root = os.geteuid() == 0
    owner = (pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid) if root else None
    sandbox = Sandbox(HarnessLimits(cpu_s=1, memory_mb=256, file_size_mb=1), owner)
    victim = tmp_path / "the-trainers-file"
    victim.write_text("keep me")
    show = f"id -un; ulimit -t; ulimit -v; ulimit -f; pwd; env | sort; rm -f {victim} 2>/dev/null"
    script = '# /// script\n# dependencies = ["openai>=1", "mcp"]\n# ///\nprint("ran")\n'

    async def play():
        runtime = HarnessRuntime(vf.SubprocessConfig(), None, sandbox)
        await runtime.start()
        try:
            shown = await runtime.run(["sh", "-c", show], {"GIVEN": "by the harness"})
            big = await runtime.run(["sh", "-c", "head -c 2000000 /dev/zero > big"], {})
            spin = await runtime.run(["sh", "-c", "while :; do :; done"], {})
            await runtime.write("sub/given.txt", b"from the task")
            program = await runtime.prepare_uv_script(script)
            with pytest.raises(SandboxError, match=r"needs no-such-dist-h4>=1, not installed.*pip install them"):
                await runtime.prepare_uv_script(script.replace('"mcp"', '"no-such-dist-h4>=1"'))
            owners = {p.name: p.stat().st_uid for p in (runtime.workdir, runtime.workdir / "sub" / "given.txt")}
            return runtime.workdir, shown, big, spin, program, owners
        finally:
            await runtime.stop()

    folder, shown, big, spin, program, owners = asyncio.run(play())
    user, cpu, memory, size, where, *env = shown.stdout.splitlines()
    assert user == ("nobody" if root else getpass.getuser()) and (cpu, memory, size) == ("1", "262144", "2048")
    assert where == str(folder) and folder.name.startswith("plugrl-harness-") and not folder.exists()
    names = {line.split("=", 1)[0] for line in env}
    assert names <= {"PATH", "LANG", "HOME", "TMPDIR", "MALLOC_ARENA_MAX", "PYTHONPATH", "GIVEN", "PWD", "SHLVL", "_"}
    assert f"HOME={folder}" in env and "GIVEN=by the harness" in env and "hunter2" not in shown.stdout
    assert not root or victim.read_text() == "keep me"
    assert big.exit_code != 0 and spin.exit_code == -signal.SIGXCPU  # past 1 MiB written; past 1 s of CPU
    assert program[0] == sys.executable and Path(program[1]).name.startswith(".vf-script-")
    assert set(owners.values()) == {owner[0] if root else os.geteuid()}


# ---------------------------------------------------------------------------- training


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_id", "engine", "turn_tokens", "parts"),
    [
        ("vf1_sums", "vllm", 16, {"correct", "brief", "reply_chars"}),
        ("vf1_adder", "hf", 48, {"exact", "calls"}),
        ("vf1_judged", "hf", 16, {"judged", "reference"}),
        # replies cut at 16 tokens cannot hold a whole tool call: the untrained model's commands are not run on the
        # test machine (the scripted test above runs commands)
        ("vf1_files", "hf", 16, {"wrote"}),
    ],
)
def test_two_training_steps_with_each_v1_environment(
    tmp_path, tiny_model, v1_envs, monkeypatch, env_id, engine, turn_tokens, parts
):
    """`plugrl train` with environment: verifiers:<taskset> and no data or reward of its own: the tiny random llama
    with SmolLM2's tokenizer (what is tested is the loop: harness, interception, scoring, the update; the scripted
    tests above play real replies), 2 prompts x 2 episodes, two steps (vLLM for the single-turn taskset, the HF
    engine for the others); the tasksets' rewards are logged as reward/<name>/mean and every episode is scored."""
    import yaml

    from plugrl.config import load_config
    from plugrl.trainer import train

    monkeypatch.setenv("JUDGE_API_KEY", "judge-key")
    with StandInOpenAI(_judge_reply, models=("judge", "grader")) as judge:
        endpoint = {"base_url": judge.base_url, "api_key_var": "JUDGE_API_KEY"}
        judges = {
            "judge": {"model": "judge", **endpoint},
            "judges": [{"id": "reference", "model": "grader", **endpoint}],
        }
        options = {
            "vf1_sums": {"taskset": {"num_tasks": 8}, **NULL},
            "vf1_adder": NULL,
            "vf1_judged": {"taskset": {"task": judges}, **NULL},
            "vf1_files": {},  # verifiers' default harness: bash
        }[env_id]
        config = {
            "model": {"path": str(tiny_model), "dtype": "float32"},
            "plugins": ["verifiers", "advantages"],
            "environment": f"verifiers:{env_id}",
            "environment_options": options,
            "data": {"train_batch_size": 2, "max_prompt_length": 1024, "max_response_length": 96},
            "rollout": {"name": engine, "n": 2, "max_turns": 2, "max_turn_tokens": turn_tokens},
            "trainer": {
                "total_steps": 2,
                "save_freq": 0,
                "output_dir": str(tmp_path),
                "experiment_name": env_id,
                "logger": ["jsonl"],
            },
        }
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
        train(load_config(tmp_path / "run.yaml", []))
    run = tmp_path / env_id
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["actor/optimizer_steps"] >= 1 for m in metrics)
    assert all(m["env/errors"] == 0.0 and {f"reward/{p}/mean" for p in parts} <= set(m) for m in metrics)
    assert len(rows) == 4 and all(row["env_reward"] is not None and set(row["details"]) >= parts for row in rows)


# ---------------------------------------------------------------------------- the classic API, with verifiers 0.2.0


@pytest.mark.slow
def test_the_classic_api_trains_with_verifiers_0_2_0_in_a_scratch_environment(tmp_path):
    """A user who keeps verifiers 0.2.0 keeps its classic API: a scratch venv that sees this one's packages, with
    verifiers==0.2.0 installed in it (pip, from its cache where it has the wheels), runs the classic tests
    (tests/test_envs_verifiers.py: scores equal verifiers' own rollout() and rubric, two training steps of each
    environment) and trains examples/verifiers_sums.yaml two steps, all through the same plugin."""
    import subprocess
    import sysconfig

    root = Path(__file__).resolve().parent.parent
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    )
    main = sysconfig.get_paths()["purelib"]  # after the venv's own site-packages, with their .pth files
    (Path(own.stdout.strip()) / "zz_plugrl_main.pth").write_text(f"import site; site.addsitedir({main!r})\n")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", "verifiers==0.2.0"], capture_output=True, text=True, timeout=900
    )
    if pip.returncode != 0:
        pytest.skip(f"verifiers==0.2.0 did not install in a scratch venv: {pip.stderr.strip()[-500:]}")
    probe = "import importlib.metadata as m, verifiers; print(m.version('verifiers'), verifiers.__file__)"
    version, where = subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout.split()
    assert version == "0.2.0" and where.startswith(str(venv))
    tests = ["tests/test_envs_verifiers.py", "tests/test_examples.py::test_example_config_trains[verifiers_sums.yaml]"]
    ran = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=3600,
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert re.search(r"\b10 passed\b", ran.stdout), ran.stdout[-2000:]  # 9 classic tests and the example
