"""Multi-turn episodes in the kernel: token-in token-out contexts, the chat template's boundaries, limits,
tools, environment errors, and the trainer's batch (environment tokens in the context, out of the loss).

The real tokenizer (SmolLM2's) and, where sampling matters, the real HF engine on a tiny random model.
A scripted engine (``ScriptedEngine``) stands in for sampling only where a test needs replies it can
name in advance (the template-boundary check needs canonical tokenizations of known texts).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from plugrl.data import Sample
from plugrl.rollout import Rollout, SamplingSettings
from plugrl.rollout.environment import Environment, EnvStart, EnvStep, Turn
from plugrl.rollout.tools import get_parser
from plugrl_multiturn import EpisodeRunner
from plugrl_multiturn.chat import ChatFormat, ChatTemplateError
from plugrl_multiturn.records import EpisodeStart, MultiTurnLimits
from plugrl_tools.authoring import make_tool
from plugrl_tools.executor import ToolExecutor

SAMPLING = SamplingSettings(n=1, max_tokens=16, temperature=1.0, seed=0)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


class ScriptedEngine:
    """Answers each context with the next scripted reply of its episode (found by the context's prefix),
    tokenized canonically and closed by the EOS token: replies a test can name in advance."""

    def __init__(self, tokenizer, replies: dict[int, list[str]], eos: int):
        self.tokenizer, self.replies, self.eos = tokenizer, replies, eos
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts, sampling):
        self.calls.append([list(p) for p in prompts])
        out = []
        for p in prompts:
            episode = next(k for k in self.replies if p[: len(self.prefixes[k])] == self.prefixes[k])
            text = self.replies[episode].pop(0)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos]
            finish = "length" if len(ids) > sampling.max_tokens else "stop"
            out.append([Rollout(list(p), ids[: sampling.max_tokens], None, finish)])
        return out


class Echo(Environment):
    """Answers every turn with 'again <turn>' until its last turn."""

    def __init__(self, turns: int = 3):
        self.turns = turns

    def step(self, turn: Turn) -> EnvStep:
        if turn.index + 1 >= self.turns:
            return EnvStep(done=True, reward=0.5, info={"solved_by_turn2": 1.0})
        return EnvStep(messages=[{"role": "user", "content": f"again {turn.index}"}])


def _sample(i: int = 0) -> Sample:
    return Sample(
        prompt=[{"role": "user", "content": f"question {i}"}], data_source="t", ground_truth="", origin=f"row {i}"
    )


def _runner(engine, tok, *, max_turns=3, turn_tokens=16, response_tokens=200, tools=None, default_tools=(), prefill=""):
    chat = ChatFormat(tok, "SmolLM2")
    tools = tools or {}
    executor = ToolExecutor(tools, max_workers=2, time_limit_s=5) if tools else None

    def run_tools(pairs):
        return executor.run([c for c, _ in pairs])

    runner = EpisodeRunner(
        engine,
        chat,
        tok,
        MultiTurnLimits(max_turns, turn_tokens, response_tokens, 4, prefill=prefill),
        registered_tools=tools,
        default_tools=default_tools,
        parser=get_parser("hermes"),
        run_tools=run_tools,
    )
    return runner, chat, executor


def _start(tok, sample, make_env, chat=None):
    messages = list(sample.prompt)
    ids = ChatFormat(tok).prompt_ids(messages, None)
    return EpisodeStart(sample, ids, messages, make_env, "environment 'test'")


def test_a_conversation_is_the_chat_templates_own_tokens(smol_tokenizer):
    """With canonical replies, the episode's prompt + response tokens equal the chat template's rendering of
    the whole conversation: every separator between turns is the template's."""
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    starts = [_start(tok, _sample(i), lambda: Echo(3)) for i in range(2)]
    engine.prefixes = {i: s.prompt_ids for i, s in enumerate(starts)}
    engine.replies = {0: ["first answer", "second one", "done now"], 1: ["x = 1", "y", "z"]}
    runner, chat, _ = _runner(engine, tok)
    played = runner.run(starts, SAMPLING)
    assert len(engine.calls) == 3 and [len(c) for c in engine.calls] == [2, 2, 2]  # one call per turn, batched
    for rollout, conv in played:
        assert conv.turns == 3 and conv.finish == "done" and conv.reward == 0.5
        assert [m["role"] for m in conv.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
        rendered = chat.encode(chat.render(conv.messages, None, False))
        whole = rollout.prompt_ids + rollout.response_ids
        # the template closes the last reply with a newline after <|im_end|>: the episode ends at the EOS
        assert rendered[: len(whole)] == whole and tok.convert_ids_to_tokens(rendered[len(whole) :]) == ["Ċ"]
        # the policy's tokens are exactly the replies (+EOS); everything else is masked
        trained = [t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if m]
        replies = [m["content"] for m in conv.messages if m["role"] == "assistant"]
        assert trained == [t for r in replies for t in tok(r, add_special_tokens=False)["input_ids"] + [eos]]
        assert tok.decode([t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if not m]) == (
            "\n<|im_start|>user\nagain 0<|im_end|>\n<|im_start|>assistant\n"
            "\n<|im_start|>user\nagain 1<|im_end|>\n<|im_start|>assistant\n"
        )


def test_the_trained_tokens_are_the_engines_sampled_tokens(smol_tokenizer, tiny_model):
    """The real HF engine on a random model: every turn's sampled tokens (also when they are not the
    canonical tokenization of their text) appear unchanged in the training sequence, and every next
    context is the previous one plus appended tokens."""
    from plugrl.rollout.hf_engine import HFEngine

    tok = smol_tokenizer
    engine = HFEngine(str(tiny_model), "float32", "cpu", tok)
    seen: list[tuple[list[int], list[int]]] = []
    real = engine.generate

    def recording(prompts, sampling):
        out = real(prompts, sampling)
        seen.extend((list(p), list(g[0].response_ids)) for p, g in zip(prompts, out, strict=True))
        return out

    engine.generate = recording
    starts = [_start(tok, _sample(i), lambda: Echo(3)) for i in range(3)]
    runner, _, _ = _runner(engine, tok, turn_tokens=8, response_tokens=120)
    played = runner.run(starts, SAMPLING)
    for rollout, conv in played:
        whole = rollout.prompt_ids + rollout.response_ids
        mine = [(p, r) for p, r in seen if p == whole[: len(p)]]
        assert len(mine) == conv.turns >= 1
        for context, sampled in mine:
            kept = sampled[:8]
            assert whole[len(context) : len(context) + len(kept)] == kept
            assert all(rollout.policy_mask[len(context) - len(rollout.prompt_ids) + j] for j in range(len(kept)))
        assert sum(rollout.policy_mask) == sum(min(len(r), 8) for _, r in mine)


def test_a_turn_cut_at_its_limit_is_closed_and_the_response_budget_ends_an_episode(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    starts = [_start(tok, _sample(0), lambda: Echo(2)), _start(tok, _sample(1), lambda: Echo(5))]
    engine.prefixes = {i: s.prompt_ids for i, s in enumerate(starts)}
    long_reply = "one two three four five six seven eight nine ten eleven twelve"
    engine.replies = {0: [long_reply, "ok"], 1: ["ok", "ok", "ok", "ok", "ok"]}
    runner, _, _ = _runner(engine, tok, max_turns=5, turn_tokens=6, response_tokens=30)
    (cut, c_cut), (budget, c_budget) = runner.run(starts, SAMPLING)
    # the first turn is cut after 6 tokens, closed as the template closes a turn, and the episode goes on
    assert c_cut.cut_turns == 1 and c_cut.turns == 2 and c_cut.finish == "done"
    assert cut.policy_mask[:7] == [1] * 6 + [0]
    assert tok.decode(cut.response_ids[6:]).startswith("<|im_end|>\n<|im_start|>user\nagain 0")
    # the second runs out of response budget: never more than 30 response tokens, ends after its reply
    assert c_budget.finish == "truncated" and len(budget.response_ids) <= 30 and budget.policy_mask[-1] == 1
    assert budget.finish_reason == "length" and c_budget.reward is None


def test_max_turns_ends_an_episode_the_environment_did_not_end(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    starts = [_start(tok, _sample(0), lambda: Echo(10))]
    engine.prefixes = {0: starts[0].prompt_ids}
    engine.replies = {0: ["a", "b"]}
    seen_last = []

    class Watch(Echo):
        def step(self, turn):
            seen_last.append(turn.last)
            return super().step(turn)

    starts[0].make_env = lambda: Watch(10)
    runner, _, _ = _runner(engine, tok, max_turns=2)
    ((rollout, conv),) = runner.run(starts, SAMPLING)
    assert conv.finish == "max_turns" and conv.turns == 2 and seen_last == [False, True]
    assert rollout.policy_mask[-1] == 1  # nothing appended after the last reply


class Broken(Environment):
    def __init__(self, where: str):
        self.where = where

    def start(self, sample):
        if self.where == "start":
            raise RuntimeError("no start")
        if self.where == "type":
            return 42
        return None

    def step(self, turn):
        if self.where == "step":
            raise KeyError("boom")
        return "not an EnvStep"


def test_a_failing_environment_ends_only_its_episode(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    kinds = ["start", "type", "step", "wrong step type", "fine"]
    starts = [_start(tok, _sample(i), (lambda k=k: Echo(2) if k == "fine" else Broken(k))) for i, k in enumerate(kinds)]
    engine.prefixes = {i: s.prompt_ids for i, s in enumerate(starts)}
    engine.replies = {i: ["r1", "r2"] for i in range(len(kinds))}
    runner, _, _ = _runner(engine, tok)
    results = runner.run(starts, SAMPLING)
    convs = [c for _, c in results]
    assert [c.finish for c in convs] == ["error", "error", "error", "error", "done"]
    assert "start failed: RuntimeError: no start" in convs[0].error
    assert "start() must return an EnvStart" in convs[1].error and "got int" in convs[1].error
    assert "step failed at turn 0: KeyError" in convs[2].error
    assert "step() must return an EnvStep" in convs[3].error
    assert convs[0].turns == 0 and results[0][0].response_ids == []  # never generated


class Hangs(Environment):
    """Its step (async: a verifiers env_response awaiting a tool) or its start (a blocking call, run in a
    thread) never finishes in time."""

    def __init__(self, where: str):
        self.where = where

    def start(self, sample):
        if self.where == "start":
            import time

            time.sleep(3)  # blocks its thread; the episode must not wait for it
        return EnvStart()

    async def step(self, turn: Turn) -> EnvStep:
        if self.where == "step":
            await asyncio.sleep(30)
        return EnvStep(done=True, reward=1.0)


def test_an_environment_past_its_time_limit_ends_only_its_episode(smol_tokenizer):
    """rollout.env_time_limit_s bounds each environment call, what it awaits inside included (a verifiers tool
    in env_response): the episode ends as an error naming the key, the others go on, nobody waits 30 s."""
    import time

    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    kinds = ["start", "step", "fine"]
    starts = [_start(tok, _sample(i), (lambda k=k: Hangs(k))) for i, k in enumerate(kinds)]
    engine.prefixes = {i: s.prompt_ids for i, s in enumerate(starts)}
    engine.replies = {i: ["r1", "r2"] for i in range(len(kinds))}
    runner, _, _ = _runner(engine, tok)
    runner.limits = dataclasses.replace(runner.limits, env_time_limit_s=0.5)
    t0 = time.perf_counter()
    convs = [c for _, c in runner.run(starts, SAMPLING)]
    assert time.perf_counter() - t0 < 10  # the limits, not the 30 s sleep (the blocked thread ends at 3 s)
    assert [c.finish for c in convs] == ["error", "error", "done"]
    assert "start failed: EnvironmentTimeout: it ran past rollout.env_time_limit_s=0.5 s" in convs[0].error
    assert "step failed at turn 0: EnvironmentTimeout: it ran past rollout.env_time_limit_s=0.5 s" in convs[1].error
    assert convs[2].reward == 1.0


class Calculator(Environment):
    def start(self, sample):
        return EnvStart(tools=[add])


def test_tool_calls_run_and_their_results_are_context_not_loss(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    starts = [_start(tok, _sample(i), Calculator) for i in range(2)]
    engine.prefixes = {}
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    bad = '<tool_call>\n{"name": "mul", "arguments": {}}\n</tool_call>'
    tools = {"add": make_tool(add)}
    runner, chat, executor = _runner(engine, tok, tools=tools, turn_tokens=64)
    replies = {0: [call, "It is 5."], 1: [bad, "I give up."]}

    def generate(prompts, sampling):  # the prompts are re-rendered with the tools: find the episode by its text
        out = []
        for p in prompts:
            text = replies[0 if "question 0" in tok.decode(p) else 1].pop(0)
            ids = tok(text, add_special_tokens=False)["input_ids"] + [eos]
            out.append([Rollout(list(p), ids, None, "stop")])
        return out

    engine.generate = generate
    try:
        (good, c_good), (wrong, c_wrong) = runner.run(starts, SAMPLING)
    finally:
        executor.close()
    assert c_good.finish == "done", (c_good.finish, c_good.error)
    assert c_good.messages[0]["role"] == "system" and '"name": "add"' in c_good.messages[0]["content"]
    assert tok.decode(good.prompt_ids).count("<tool_call>") >= 1  # the format is explained in the prompt
    assert [m["role"] for m in c_good.messages[1:]] == ["user", "assistant", "tool", "assistant"]
    # Hermes calls carry no id: each gets one (turn, index), and its result names it
    assert c_good.messages[3] == {"role": "tool", "name": "add", "content": "5", "tool_call_id": "call_0_0"}
    assert c_good.tool_calls == 1 and c_good.tool_errors == 0 and c_good.finish == "done"
    assert c_wrong.tool_errors == 1 and "unknown tool 'mul'" in c_wrong.messages[3]["content"]
    untrained = tok.decode([t for t, m in zip(good.response_ids, good.policy_mask, strict=True) if not m])
    assert "<|im_start|>tool\n5<|im_end|>" in untrained
    trained = tok.decode([t for t, m in zip(good.response_ids, good.policy_mask, strict=True) if m])
    assert "5<|im_end|>" not in trained.replace("It is 5.<|im_end|>", "")


def test_async_environments_run_concurrently(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    state = {"running": 0, "peak": 0}

    class Slow(Environment):
        async def step(self, turn):
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
            await asyncio.sleep(0.2)
            state["running"] -= 1
            return EnvStep(done=True, reward=1.0)

    starts = [_start(tok, _sample(i), Slow) for i in range(8)]
    engine.prefixes = {i: s.prompt_ids for i, s in enumerate(starts)}
    engine.replies = {i: ["r"] for i in range(8)}
    runner, _, _ = _runner(engine, tok)
    results = runner.run(starts, SAMPLING)
    assert state["peak"] == 8 and all(c.reward == 1.0 for _, c in results)
    assert runner.timings["env"] < 1.0  # 8 x 0.2 s awaited together


def test_a_template_that_rewrites_earlier_turns_is_refused(smol_tokenizer):
    class Rewriting:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
            # drops every earlier assistant message once a later message follows (like reasoning stripping)
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
            shown = [m for i, m in enumerate(messages) if m["role"] != "assistant" or i == len(messages) - 1]
            del last
            text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in shown)
            return text + ("<assistant>" if add_generation_prompt else "")

    with pytest.raises(ChatTemplateError, match="not prefix-preserving"):
        ChatFormat(Rewriting(), "rewriter").close_ids()
    with pytest.raises(ChatTemplateError, match="has no chat template"):

        class NoTemplate:
            chat_template = None

        ChatFormat(NoTemplate(), "plain")


def test_the_batch_keeps_environment_tokens_out_of_the_loss():
    from plugrl.actor import TrainBatch

    batch = TrainBatch.from_sequences(
        [[1, 2, 10, 11, 12, 13, 14], [3, 20, 21]], [2, 1], policy_masks=[[1, 0, 0, 1, 1], None]
    )
    assert batch.response_mask.tolist() == [[1, 0, 0, 1, 1], [1, 1, 0, 0, 0]]
    with pytest.raises(ValueError, match="policy mask of 2 tokens for a 5-token response"):
        TrainBatch.from_sequences([[1, 2, 10, 11, 12, 13, 14]], [2], policy_masks=[[1, 0]])
    assert torch.equal(batch.response_mask.sum(1), torch.tensor([3.0, 2.0]))


def test_a_prefill_starts_every_turn_untrained_and_is_part_of_the_reply(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    chat = ChatFormat(tok)
    sample = _sample(0)
    start = EpisodeStart(
        sample,
        chat.prompt_ids(sample.prompt, None) + chat.encode("<answer>"),
        list(sample.prompt),
        lambda: Echo(2),
        "environment 'test'",
    )
    engine.prefixes = {0: start.prompt_ids}
    engine.replies = {0: ["1 + 2</answer>", "3</answer>"]}
    runner, _, _ = _runner(engine, tok, prefill="<answer>")
    ((rollout, conv),) = runner.run([start], SAMPLING)
    assert [m["content"] for m in conv.messages if m["role"] == "assistant"] == [
        "<answer>1 + 2</answer>",
        "<answer>3</answer>",
    ]
    untrained = tok.decode([t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if not m])
    assert untrained.endswith("<|im_start|>assistant\n<answer>")
    trained = tok.decode([t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if m])
    assert "<answer>" not in trained


def test_a_prompt_that_outgrows_max_prompt_length_with_its_tools_ends_its_episode(smol_tokenizer):
    tok = smol_tokenizer
    engine = ScriptedEngine(tok, {}, tok.convert_tokens_to_ids("<|im_end|>"))
    runner, _, executor = _runner(engine, tok, tools={"add": make_tool(add)})
    runner.limits.max_prompt_tokens = 60  # the prompt alone fits; with the tool's description it does not
    try:
        ((rollout, conv),) = runner.run([_start(tok, _sample(0), Calculator)], SAMPLING)
    finally:
        executor.close()
    assert conv.finish == "error" and "more than data.max_prompt_length=60" in conv.error
    assert engine.calls == [] and rollout.response_ids == []


def test_gae_steps_over_environment_tokens():
    """verl's rule for multi-turn GAE: environment tokens get no TD error and no value; the policy token before
    them bootstraps from the next policy token's value, one discount step away. By hand, gamma 0.5, lam 1,
    values [.1, 9, 9, .2, .3] (9: environment tokens, ignored), reward 1 on the last token:
    A4 = 1 - .3 = .7; A3 = .5 * .3 - .2 + .5 * .7 = .3; A0 = .5 * .2 - .1 + .5 * .3 = .15."""
    from plugrl_advantages.estimators.gae import gae_advantages

    mask = torch.tensor([[1.0, 0, 0, 1, 1]])
    values = torch.tensor([[0.1, 9.0, 9.0, 0.2, 0.3]])
    rewards = torch.tensor([[0.0, 0, 0, 0, 1]])
    adv, returns = gae_advantages(rewards, values, mask, gamma=0.5, lam=1.0, whiten=False)
    assert torch.allclose(adv, torch.tensor([[0.15, 0, 0, 0.3, 0.7]]))
    assert torch.allclose(returns, torch.tensor([[0.25, 0, 0, 0.5, 1.0]]))


def test_environment_routes_by_data_source():
    from types import SimpleNamespace

    from plugrl.rollout.routing import environment_for
    from plugrl.specs import EnvironmentSpec, Registry

    registry = Registry(environments={n: EnvironmentSpec(n, Environment) for n in ("exact", "globbed", "all")})
    cfg = SimpleNamespace(environment={"gsm8k": "exact", "math*": "globbed", "*_hard": "all"})
    assert environment_for(cfg, registry, "gsm8k").name == "exact"
    assert environment_for(cfg, registry, "math_lvl5").name == "globbed"
    assert environment_for(cfg, registry, "math_hard").name == "globbed"  # the first glob written wins
    assert environment_for(cfg, registry, "countdown_hard").name == "all"
    assert environment_for(cfg, registry, "countdown") is None  # single-turn
    assert environment_for(SimpleNamespace(environment="exact"), registry, "anything").name == "exact"
    assert environment_for(SimpleNamespace(environment=None), registry, "anything") is None


def test_an_environments_last_word_is_kept_in_the_conversation_not_the_tokens(smol_tokenizer):
    tok = smol_tokenizer
    engine = ScriptedEngine(tok, {}, tok.convert_tokens_to_ids("<|im_end|>"))

    class LastWord(Environment):
        def step(self, turn):
            return EnvStep(messages=[{"role": "user", "content": "Solved, well done."}], done=True, reward=1.0)

    start = _start(tok, _sample(0), LastWord)
    engine.prefixes, engine.replies = {0: start.prompt_ids}, {0: ["42"]}
    runner, _, _ = _runner(engine, tok)
    ((rollout, conv),) = runner.run([start], SAMPLING)
    assert conv.messages[-1] == {"role": "user", "content": "Solved, well done."} and conv.last_reply == "42"
    assert rollout.policy_mask == [1] * len(rollout.response_ids)  # nothing written after the last reply


def test_reward_metrics_cover_the_episodes_environments_scored():
    """Two episodes scored by their environment (1.0, 0.0), one by a reward function (0.5): reward/mean is
    over all three, reward/environment/mean over the two, the function's own mean over its one; with every
    episode scored by its environment the reward metrics are still there."""
    from plugrl.config import RewardConfig
    from plugrl.rewards import RewardRunner
    from plugrl.rollout.multiturn import Conversation
    from plugrl.rollout.play import score_episodes
    from plugrl.specs import Registry, RewardSpec

    def half(completion, ground_truth):
        return 0.5

    runner = RewardRunner(Registry(rewards=[RewardSpec("half", half, ("t",), plugin="p")]), RewardConfig(num_workers=0))

    class Prompt:
        sample, text = _sample(0), "question 0"

    def episode(reward):
        return (Prompt, Rollout([1], [2], None, "stop"), Conversation([], "env", reward=reward))

    out = score_episodes(runner, [episode(1.0), episode(None), episode(0.0)], ["a", "b", "c"])
    assert out.scores == [1.0, 0.5, 0.0] and out.details[0] == {"environment": 1.0}
    assert out.metrics["reward/mean"] == pytest.approx(0.5) and out.metrics["reward/half/mean"] == 0.5
    assert out.metrics["reward/std"] == pytest.approx((2 * 0.25 / 3) ** 0.5)
    assert out.metrics["reward/environment/mean"] == 0.5
    only_env = score_episodes(runner, [episode(1.0), episode(0.0)], ["a", "b"])
    assert only_env.metrics["reward/mean"] == 0.5 and only_env.metrics["reward/environment/mean"] == 0.5
