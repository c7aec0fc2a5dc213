"""Agents written with the real ``openai`` client play episodes against the run's engine through plugrl's own
endpoint on 127.0.0.1 (plugrl-agents: plugrl_agents.agents, episodes, endpoint): the exact tokens of every call are
recorded and trained on, calls of concurrent agents are batched, and what cannot be one sequence, or breaks a
limit, is refused with an error that says so.

The HF engine on a tiny random model where the sampled tokens are the point; a scripted engine (replies named
in advance, tokenized canonically) where the protocol is."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import threading
import time

import pytest

openai = pytest.importorskip("openai")

from plugrl.data import Sample  # noqa: E402
from plugrl.rollout.environment import EpisodeScore  # noqa: E402
from plugrl.rollout.tools import get_parser  # noqa: E402
from plugrl.rollout.types import Rollout, SamplingSettings  # noqa: E402
from plugrl_agents import openai_agent  # noqa: E402
from plugrl_agents.episodes import AgentRunner  # noqa: E402
from plugrl_multiturn.chat import ChatFormat  # noqa: E402
from plugrl_multiturn.records import EpisodeStart, MultiTurnLimits  # noqa: E402
from tiny_runs import train_two_steps  # noqa: E402

SAMPLING = SamplingSettings(n=1, max_tokens=64, temperature=1.0, seed=0)
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class Scripted:
    """Answers each prompt with the next reply scripted for its episode (found by the marker ``[k]`` in its
    first user message), canonical tokens closed by the EOS token, with made-up log-probs; records its calls."""

    def __init__(self, tokenizer, replies: dict[str, list[str]]):
        self.tok, self.replies = tokenizer, replies
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts, sampling):
        self.calls.append([list(p) for p in prompts])
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            key = next(k for k in self.replies if k in text)
            ids = self.tok(self.replies[key].pop(0), add_special_tokens=False)["input_ids"] + [self.eos]
            kept = ids[: sampling.max_tokens]
            logprobs = [-0.01 * (j + 1) for j in range(len(kept))]
            out.append([Rollout(list(p), kept, logprobs, "length" if len(ids) > len(kept) else "stop")])
        return out


def _runner(engine, tok, *, max_turns=4, turn_tokens=64, response_tokens=256, step_wise=False, batch_wait_s=0.5):
    """An AgentRunner; ``batch_wait_s`` (30 ms in runs) is long here so that a loaded test machine cannot split a
    round's calls into two batches."""
    limits = MultiTurnLimits(max_turns, turn_tokens, response_tokens, 8, max_prompt_tokens=512, step_wise=step_wise)
    chat = ChatFormat(tok, "SmolLM2")
    return AgentRunner(engine, chat, tok, limits, parser=get_parser("hermes"), batch_wait_s=batch_wait_s)


def _starts(solve, n: int, *, first: int = 0, **spec_kwargs) -> list[EpisodeStart]:
    """``n`` episodes of the agent ``solve``, their samples marked [first], [first + 1], ..."""
    spec = openai_agent(solve, name="solver", **spec_kwargs)
    starts = []
    for i in range(first, first + n):
        sample = Sample(prompt=[{"role": "user", "content": f"[{i}] question"}], data_source="t", ground_truth="")
        starts.append(EpisodeStart(sample, None, list(sample.prompt), spec.factory, "agent 'solver' (plugin test)"))
    return starts


def _play(runner, starts, sampling=SAMPLING):
    try:
        return runner.run(starts, sampling)
    finally:
        runner.close()


def _trained(rollout: Rollout) -> list[int]:
    return [t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if m]


# ---------------------------------------------------------------------------- tokens, exactly


def test_an_agents_calls_are_trained_on_the_engines_sampled_tokens(smol_tokenizer, tiny_model):
    """The real HF engine: two agents each call twice, running a tool of their own in between. The response is
    the first reply's sampled tokens, the chat template's tokens of the tool result (masked, log-prob 0.0), then
    the second reply's sampled tokens; the second call read the first call's context plus exactly those."""
    from plugrl.rollout.hf_engine import HFEngine

    tok = smol_tokenizer
    engine = HFEngine(str(tiny_model), "float32", "cpu", tok)
    sampled: list[tuple[list[int], Rollout]] = []
    real = engine.generate

    def recording(prompts, sampling):
        out = real(prompts, sampling)
        sampled.extend((list(p), g[0]) for p, g in zip(prompts, out, strict=True))
        return out

    engine.generate = recording
    usage = {}

    async def solve(client, sample):
        messages = list(sample.prompt)
        first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        messages += [first.choices[0].message, {"role": "tool", "content": f"len={len(messages)}"}]
        second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        usage[sample.prompt[0]["content"]] = (first.usage, second.usage)
        return 0.25

    runner = _runner(engine, tok, turn_tokens=8)
    played = _play(runner, _starts(solve, 2))
    assert runner.engine_calls == 2  # both agents' first calls together, then both second calls
    chat = ChatFormat(tok)
    for i, (rollout, conversation) in enumerate(played):
        assert (conversation.finish, conversation.error, conversation.reward) == ("done", None, 0.25)
        (p1, r1), (p2, r2) = [(p, r) for p, r in sampled if p[: len(rollout.prompt_ids)] == rollout.prompt_ids]
        first, second = r1.response_ids[:6], r2.response_ids[:6]
        between = chat.turn_end(first) + chat.continuation([{"role": "tool", "content": "len=1"}])
        assert p1 == rollout.prompt_ids and p2 == p1 + first + between  # append-only: never re-tokenized
        assert rollout.response_ids == first + between + second
        assert rollout.policy_mask == [1] * len(first) + [0] * len(between) + [1] * len(second)
        assert rollout.logprobs == r1.logprobs[:6] + [0.0] * len(between) + r2.logprobs[:6]
        one, two = usage[f"[{i}] question"]
        assert (one.prompt_tokens, one.completion_tokens) == (len(p1), len(first))
        assert (two.prompt_tokens, two.completion_tokens, two.total_tokens) == (len(p2), 6, len(p2) + 6)
        assert [m["role"] for m in conversation.messages] == ["user", "assistant", "tool", "assistant"]
        assert conversation.messages[-1]["content"] == tok.decode(second, skip_special_tokens=True)


def test_the_openai_reply_carries_the_parsed_tool_calls_and_the_agent_runs_them(smol_tokenizer):
    """A reply with a Hermes call comes back as OpenAI's tool_calls (JSON-string arguments, finish_reason
    tool_calls, the text before it as content); the agent runs the tool and answers with a tool message; the
    template describes the tools in the system message (SmolLM2's ignores tools=)."""
    tok = smol_tokenizer
    call = 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    engine = Scripted(tok, {"[0]": [call, "It is 5."]})
    seen = []

    async def solve(client, sample):
        messages = list(sample.prompt)
        reply = await client.chat.completions.create(model="any", messages=messages, tools=[ADD])
        message = reply.choices[0].message
        seen.append(reply)
        messages.append(message.model_dump(exclude_none=True))
        for c in message.tool_calls:
            arguments = json.loads(c.function.arguments)
            messages.append({"role": "tool", "tool_call_id": c.id, "content": str(arguments["a"] + arguments["b"])})
        reply = await client.chat.completions.create(model="any", messages=messages, tools=[ADD])
        seen.append(reply)
        return float(reply.choices[0].message.content == "It is 5.")

    ((rollout, conversation),) = _play(_runner(engine, tok), _starts(solve, 1))
    first, second = seen
    assert first.model == "any" and first.object == "chat.completion"
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Adding."
    (tool_call,) = choice.message.tool_calls
    assert tool_call.type == "function" and tool_call.function.name == "add"
    assert json.loads(tool_call.function.arguments) == {"a": 2, "b": 3}
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.tool_calls is None
    assert (conversation.finish, conversation.reward, conversation.turns, conversation.tool_calls) == (
        "done",
        1.0,
        2,
        1,
    )
    assert '"name": "add"' in tok.decode(rollout.prompt_ids)  # the tools, described in the system message
    replies = [tok(t, add_special_tokens=False)["input_ids"] + [engine.eos] for t in (call, "It is 5.")]
    assert _trained(rollout) == replies[0] + replies[1]
    untrained = [t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if not m]
    assert tok.decode(untrained) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    assert conversation.messages[-1] == {"role": "assistant", "content": "It is 5."}


def test_a_plain_def_agent_gets_a_sync_client_and_the_request_sampling_is_ignored(smol_tokenizer):
    """A plain def runs in a thread with openai.OpenAI; a request's temperature is not applied (the run's is),
    and the reply's headers say so; /v1/models lists the policy; an EpisodeScore scores with its parts."""
    tok = smol_tokenizer
    engine = Scripted(tok, {"[0]": ["fine"], "[1]": ["also fine"]})
    headers = {}

    def solve(client, sample):
        assert isinstance(client, openai.OpenAI) and threading.current_thread() is not threading.main_thread()
        assert [m.id for m in client.models.list()] == ["policy"]
        raw = client.chat.completions.with_raw_response.create(
            model="policy", messages=sample.prompt, temperature=0.0, top_p=0.5
        )
        headers[sample.prompt[0]["content"]] = raw.headers
        answered = 1.0 if raw.parse().choices[0].message.content else 0.0
        return EpisodeScore(answered, {"answered": answered}) if "[1]" in sample.prompt[0]["content"] else answered

    played = _play(_runner(engine, tok), _starts(solve, 2), SamplingSettings(n=1, max_tokens=64, temperature=0.7))
    assert [c.reward for _, c in played] == [1.0, 1.0] and len(engine.calls) == 1
    assert [c.reward_parts for _, c in played] == [{}, {"answered": 1.0}]  # an EpisodeScore's parts are kept
    h = headers["[0] question"]
    assert h["x-plugrl-ignored"] == "temperature, top_p" and "temperature=0.7" in h["x-plugrl-sampling"]


# ---------------------------------------------------------------------------- batching


def test_concurrent_agents_share_one_engine_call_per_round(smol_tokenizer):
    """Six agents, three calls each: three engine calls of six prompts, not eighteen of one."""
    tok = smol_tokenizer
    engine = Scripted(tok, {f"[{i}]": [f"a{i}", f"b{i}", f"c{i}"] for i in range(6)})

    async def solve(client, sample):
        messages = list(sample.prompt)
        for k in range(3):
            reply = await client.chat.completions.create(model="policy", messages=messages)
            messages += [reply.choices[0].message, {"role": "user", "content": f"more {k}"}]
        return 1.0

    played = _play(_runner(engine, tok), _starts(solve, 6))
    assert [len(c) for c in engine.calls] == [6, 6, 6]
    assert all(c.finish == "done" and c.turns == 3 for _, c in played)
    for i, (rollout, _) in enumerate(played):  # each episode got its own replies
        assert tok.decode(_trained(rollout)) == f"a{i}<|im_end|>b{i}<|im_end|>c{i}<|im_end|>"


def test_an_agent_busy_in_its_own_tool_does_not_hold_up_the_others(smol_tokenizer):
    tok = smol_tokenizer
    engine = Scripted(tok, {"[0]": ["x", "y"], "[1]": ["x", "y"]})
    finished = {}

    async def solve(client, sample):
        messages = list(sample.prompt)
        reply = await client.chat.completions.create(model="policy", messages=messages)
        if sample.prompt[0]["content"].startswith("[0]"):
            await asyncio.sleep(3.0)  # a slow tool of its own
        messages += [reply.choices[0].message, {"role": "user", "content": "again"}]
        await client.chat.completions.create(model="policy", messages=messages)
        finished[sample.prompt[0]["content"][:3]] = time.perf_counter()
        return 1.0

    started = time.perf_counter()
    _play(_runner(engine, tok, batch_wait_s=0.3), _starts(solve, 2))
    assert [len(c) for c in engine.calls] == [2, 1, 1]  # the second round did not wait for the busy agent
    assert finished["[1]"] - started < 2.0 < 3.0 < finished["[0]"] - started


# ---------------------------------------------------------------------------- history rewrites


def _rewriting(seen):
    async def solve(client, sample):
        messages = list(sample.prompt)
        await client.chat.completions.create(model="policy", messages=messages)
        summary = [{"role": "user", "content": sample.prompt[0]["content"] + " (summarised)"}]
        try:  # the history rewritten: the first reply is not sent back
            reply = await client.chat.completions.create(model="policy", messages=summary)
        except openai.BadRequestError as e:
            seen.append(e)
            raise
        return float(reply.choices[0].message.content == "second")

    return solve


def test_a_rewritten_history_is_refused_when_episodes_train_as_one_sequence(smol_tokenizer):
    tok = smol_tokenizer
    engine = Scripted(tok, {"[0]": ["first", "second"]})
    seen: list = []
    ((rollout, conversation),) = _play(_runner(engine, tok), _starts(_rewriting(seen), 1))
    (error,) = seen
    assert error.status_code == 400 and "rollout.step_wise: true" in error.message
    assert conversation.finish == "error" and "does not extend the previous call" in conversation.error
    assert conversation.reward is None and len(engine.calls) == 1 and conversation.turns == 1
    assert _trained(rollout) == tok("first", add_special_tokens=False)["input_ids"] + [engine.eos]


def test_a_rewritten_history_is_a_step_of_its_own_in_step_wise_runs(smol_tokenizer):
    tok = smol_tokenizer
    engine = Scripted(tok, {"[0]": ["first", "second"]})
    seen: list = []
    ((rollout, conversation),) = _play(_runner(engine, tok, step_wise=True), _starts(_rewriting(seen), 1))
    assert not seen and (conversation.finish, conversation.reward, conversation.context_edits) == ("done", 1.0, 1)
    one, two = rollout.steps
    chat = ChatFormat(tok)
    assert one.prompt_ids == chat.prompt_ids([{"role": "user", "content": "[0] question"}], None)
    assert two.prompt_ids == chat.prompt_ids([{"role": "user", "content": "[0] question (summarised)"}], None)
    assert tok.decode(one.response_ids) == "first<|im_end|>" and tok.decode(two.response_ids) == "second<|im_end|>"
    assert conversation.messages[0]["content"] == "[0] question (summarised)"  # the conversation as last sent


# ---------------------------------------------------------------------------- limits and failures


def test_max_turns_refuses_the_next_call_and_the_agent_may_still_score(smol_tokenizer):
    tok = smol_tokenizer
    engine = Scripted(tok, {"[0]": ["a", "b"]})
    errors = []

    async def solve(client, sample):
        messages = list(sample.prompt)
        for _ in range(3):
            try:
                reply = await client.chat.completions.create(model="policy", messages=messages)
            except openai.BadRequestError as e:
                errors.append(e.message)
                return 0.5
            messages += [reply.choices[0].message, {"role": "user", "content": "go on"}]

    ((rollout, conversation),) = _play(_runner(engine, tok, max_turns=2), _starts(solve, 1))
    assert "rollout.max_turns=2" in errors[0] and (conversation.finish, conversation.turns) == ("max_turns", 2)
    assert conversation.reward == 0.5 and rollout.policy_mask[-1] == 1  # nothing appended after the last reply


def test_token_limits_cut_replies_and_end_the_episode_at_the_response_budget(smol_tokenizer):
    """max_turn_tokens cuts a reply (finish_reason length; the episode goes on); max_tokens in the request only
    lowers it; a call with no room left in data.max_response_length is refused (code context_length_exceeded)
    and ends it as truncated."""
    tok = smol_tokenizer
    long = "one two three four five six seven eight nine ten"
    engine = Scripted(tok, {"[0]": [long, long, "x"]})
    out = []

    async def solve(client, sample):
        messages = list(sample.prompt)
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=100)
        out.append((reply.choices[0].finish_reason, reply.usage.completion_tokens))
        messages += [reply.choices[0].message, {"role": "user", "content": "again"}]
        reply = await client.chat.completions.create(model="policy", messages=messages, max_completion_tokens=2)
        out.append((reply.choices[0].finish_reason, reply.usage.completion_tokens))
        messages += [reply.choices[0].message, {"role": "user", "content": "and again"}]
        try:
            await client.chat.completions.create(model="policy", messages=messages)
        except openai.BadRequestError as e:
            out.append(e.message)
            out.append(e.code)
        return 1.0

    runner = _runner(engine, tok, turn_tokens=5, response_tokens=24)
    ((rollout, conversation),) = _play(runner, _starts(solve, 1))
    assert out[:2] == [("length", 5), ("length", 2)] and "data.max_response_length=24" in out[2]
    assert out[3] == "context_length_exceeded"  # OpenAI's code for a full context: agents can tell it apart
    assert (conversation.finish, conversation.cut_turns, conversation.reward) == ("truncated", 2, 1.0)
    assert len(rollout.response_ids) <= 24 and rollout.finish_reason == "length" and sum(rollout.policy_mask) == 7


def test_what_the_endpoint_refuses_and_agents_that_fail_end_only_their_episode(smol_tokenizer):
    """A stream request is answered whole (one chunk with the reply, a usage chunk, [DONE]); a wrong key is a
    401; an agent that raises, returns a non-number, returns without a call, or runs past its time limit ends its
    own episode as an error."""
    tok = smol_tokenizer
    engine = Scripted(tok, {f"[{i}]": ["ok"] for i in range(5)})
    notes = {}

    async def solve(client, sample):
        i = int(sample.prompt[0]["content"][1])
        if i == 3:
            return 1.0  # never called the model
        if i == 0:
            stranger = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="not-an-episode", max_retries=0)
            with pytest.raises(openai.AuthenticationError) as unknown:
                await stranger.chat.completions.create(model="policy", messages=sample.prompt)
            await stranger.close()
            stream = await client.chat.completions.create(
                model="policy", messages=sample.prompt, stream=True, stream_options={"include_usage": True}
            )
            notes.update(stream=[chunk async for chunk in stream], key=unknown.value.message)
        else:
            await client.chat.completions.create(model="policy", messages=sample.prompt)
        if i == 1:
            raise ValueError("the agent's own bug")
        return "good" if i == 2 else 1.0

    async def stalls(client, sample):
        await asyncio.sleep(30)

    starts = _starts(solve, 4) + _starts(stalls, 1, first=4, time_limit_s=0.5)
    played = _play(_runner(engine, tok, batch_wait_s=0.05), starts)
    reply, usage = notes["stream"]
    assert (reply.choices[0].delta.content, reply.choices[0].finish_reason) == ("ok", "stop")
    assert usage.choices == [] and usage.usage.completion_tokens == 2  # "ok" and <|im_end|>
    assert "unknown api key" in notes["key"]
    (ok, _), (_, raised), (_, wrong), (_, silent), (_, slow) = played
    assert ok.response_ids and played[0][1].finish == "done" and played[0][1].reward == 1.0
    assert [c.finish for c in (raised, wrong, silent, slow)] == ["error"] * 4
    assert "ValueError: the agent's own bug" in raised.error and raised.reward is None
    assert "return value must be a finite number, an EpisodeScore" in wrong.error and "got 'good'" in wrong.error
    assert "without calling the model" in silent.error and played[3][0].response_ids == []
    assert "time limit of 0.5 s" in slow.error
    assert all(c.environment == "agent 'solver' (plugin test)" for _, c in played)


def test_the_endpoint_reads_openai_requests_and_refuses_what_it_cannot_serve():
    from plugrl_agents.endpoint import RequestError, read_chat_request

    request = read_chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"x": 1}}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "2"},
            ],
            "max_tokens": 9,
            "max_completion_tokens": 5,
            "temperature": 0.3,
            "tool_choice": "auto",
        }
    )
    assert request.messages[0] == {"role": "system", "content": "Be brief."}
    assert (
        request.messages[1]["content"] == ""
        and request.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    )
    assert request.max_tokens == 5 and request.ignored == ("temperature", "tool_choice")
    bad = [
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n must be 1"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "only text"),
        ({"messages": [{"role": "function", "content": "x"}]}, "is not served"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "positive integer"),
    ]
    for body, message in bad:
        with pytest.raises(RequestError, match=message):
            read_chat_request(body)


def test_openai_agent_refuses_what_cannot_be_an_agent():
    with pytest.raises(TypeError, match=r"take two arguments, \(client, sample\)"):
        openai_agent(lambda client: None)
    with pytest.raises(ValueError, match="time_limit_s"):
        openai_agent(lambda client, sample: None, time_limit_s=0)
    spec = openai_agent(lambda client, sample: None, name="x")
    assert spec.name == "x" and spec.scores_episodes  # its data sources need no reward function


def test_a_step_mixing_agents_and_environments_keeps_its_episodes_in_order(smol_tokenizer):
    """EpisodePlayer.play routes the agent episodes to the agent runner and the others to the turn loop, and puts
    every result back where its prompt was; the endpoint stops with the player."""
    from types import SimpleNamespace

    from plugrl.prompts import EncodedPrompt
    from plugrl.rollout.environment import Environment
    from plugrl.specs import EnvironmentSpec
    from plugrl_multiturn import EpisodePlayer, EpisodeRunner

    tok = smol_tokenizer
    engine = Scripted(tok, {f"[{i}]": [f"reply {i}"] for i in range(4)})

    async def solve(client, sample):
        reply = await client.chat.completions.create(model="policy", messages=sample.prompt)
        return float(reply.choices[0].message.content == f"reply {sample.prompt[0]['content'][1]}")

    agent = openai_agent(solve, name="solver")
    environments = {"solver": agent, "env": EnvironmentSpec(name="env", factory=Environment)}
    cfg = SimpleNamespace(environment={"by_agent": "solver", "by_env": "env"}, environment_options={})
    chat = ChatFormat(tok, "SmolLM2")
    limits = MultiTurnLimits(2, 16, 64, 4)
    turns = EpisodeRunner(
        engine, chat, tok, limits, registered_tools={}, default_tools=(), parser=get_parser("hermes"), run_tools=None
    )
    player = EpisodePlayer(cfg, SimpleNamespace(environments=environments), turns, SimpleNamespace(close=lambda: None))
    prompts = []
    for i, source in enumerate(["by_env", "by_agent", "by_env", "by_agent"]):
        messages = [{"role": "user", "content": f"[{i}] question"}]
        sample = Sample(prompt=messages, data_source=source, ground_truth="")
        prompts.append(EncodedPrompt(sample, "", chat.prompt_ids(messages, None), messages))
    try:
        played = player.play(prompts, SAMPLING)
        assert next(iter(player.own.values())).endpoint.url is not None
    finally:
        player.close()
    assert next(iter(player.own.values())).endpoint.url is None
    assert [c.environment.split(" ")[0] for _, c in played] == ["environment", "agent", "environment", "agent"]
    assert [c.messages[-1]["content"] for _, c in played] == [f"reply {i}" for i in range(4)]
    assert [c.reward for _, c in played] == [None, 1.0, None, 1.0] and [len(c) for c in engine.calls] == [2, 2]
    assert player.timings["generate"] >= 0 and player.timings["env"] > 0


# ---------------------------------------------------------------------------- training


PLUGIN = textwrap.dedent(
    '''
    """An agent as its users write it: the openai client, a tool of its own, a reward."""
    import json

    from plugrl_agents import openai_agent

    TOOLS = [{"type": "function", "function": {"name": "double", "description": "Double a number.",
              "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]


    async def solve(client, sample):
        messages = list(sample.prompt)
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message)
        for call in message.tool_calls or []:
            x = json.loads(call.function.arguments).get("x", 0)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(2 * int(x))})
        if len(messages) == len(sample.prompt) + 1:
            messages.append({"role": "user", "content": "Use the tool, then answer."})
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        return len(reply.choices[0].message.content or "") / 100


    doubler = openai_agent(solve, name="doubler")
    '''
)


@pytest.mark.slow
def test_two_training_steps_with_an_openai_agent(tiny_model, tmp_path):
    """`plugrl train` with an agent from a local module, the tiny model on the HF engine, no reward function:
    two steps train on the agents' calls, the rewards are the agent's, no episode fails."""
    (tmp_path / "doubler_agents.py").write_text(PLUGIN)
    rows = [{"prompt": [{"role": "user", "content": f"Double {i}."}], "data_source": "double"} for i in range(4)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sys.path.insert(0, str(tmp_path))
    try:
        overrides = ["plugins=['doubler_agents:',advantages]", f"data.train_files=[{data}]", "environment=doubler"]
        metrics, rows = train_two_steps(tmp_path, tiny_model, "agent", overrides)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("doubler_agents", None)
    assert [m["step"] for m in metrics] == [1, 2] and all(m["actor/optimizer_steps"] >= 1 for m in metrics)
    assert all(m["env/errors"] == 0.0 and m["env/turns_mean"] == 2.0 for m in metrics)
    assert len(rows) == 4
    for row in rows:
        assert row["environment"] == "agent 'doubler' (plugin doubler_agents:)" and row["finish"] == "done"
        assert row["details"] == {"environment": row["env_reward"]} and row["reward"] == row["env_reward"]
        assert [s["trained"] for s in row["segments"]] == [True, False, True]
