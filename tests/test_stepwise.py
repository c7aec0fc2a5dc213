"""Step-wise multi-turn training (``rollout.step_wise``, SkyRL's step-wise trajectories): each policy turn a
sample of its own, with the whole context it saw as its prompt; environments that edit the context between
turns; every turn trained with its episode's advantage.

The real tokenizer (SmolLM2's); a scripted engine answers in call order, so a test knows every reply.
"""

from __future__ import annotations

import pytest
import torch

from plugrl.algorithms import step_wise_advantages
from plugrl.rollout import Rollout
from plugrl.rollout.environment import Environment, EnvStep
from plugrl_multiturn.chat import ChatFormat
from test_multiturn import SAMPLING, Echo, ScriptedEngine, _runner, _sample, _start


class InOrder:
    """Answers the k-th context of each call with the next reply of episode k (closed by EOS); records every
    context it was given."""

    def __init__(self, tokenizer, replies: list[list[str]], eos: int):
        self.tokenizer, self.replies, self.eos = tokenizer, replies, eos
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts, sampling):
        self.calls.append([list(p) for p in prompts])
        out = []
        for k, p in enumerate(prompts):
            ids = self.tokenizer(self.replies[k].pop(0), add_special_tokens=False)["input_ids"] + [self.eos]
            out.append([Rollout(list(p), ids[: sampling.max_tokens], None, "stop")])
        return out


class Window(Environment):
    """After each reply the context is only the question and a note on the last reply (a sliding window)."""

    def __init__(self, turns: int = 3):
        self.turns = turns
        self.question: list[dict] | None = None

    def step(self, turn):
        if self.question is None:
            self.question = turn.messages[: next(i for i, m in enumerate(turn.messages) if m["role"] == "assistant")]
        if turn.index + 1 >= self.turns:
            return EnvStep(done=True, reward=1.0)
        note = {"role": "user", "content": f"You said {turn.reply!r}. Again, shorter."}
        return EnvStep(context=list(self.question), messages=[note])


def test_each_turn_is_a_sample_with_the_context_it_saw(smol_tokenizer):
    """Without edits a step's prompt is the episode's sequence up to that turn; the steps' responses are
    exactly the policy's tokens of the episode, turn by turn."""
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(tok, {}, eos)
    starts = [_start(tok, _sample(i), lambda: Echo(3)) for i in range(2)]
    engine.prefixes = {i: s.prompt_ids for i, s in enumerate(starts)}
    engine.replies = {0: ["first answer", "second one", "done now"], 1: ["x = 1", "y", "z"]}
    runner, _, _ = _runner(engine, tok)
    runner.limits.step_wise = True
    played = runner.run(starts, SAMPLING)
    for k, (rollout, conv) in enumerate(played):
        assert conv.finish == "done" and len(rollout.steps) == conv.turns == 3
        whole = rollout.prompt_ids + rollout.response_ids
        assert [s.prompt_ids for s in rollout.steps] == [call[k] for call in engine.calls]
        for step in rollout.steps:  # no edit: every step is a prefix of the one sequence
            assert whole[: len(step.prompt_ids) + len(step.response_ids)] == step.prompt_ids + step.response_ids
            assert step.response_ids[-1] == eos and step.finish_reason == "stop"
        policy = [t for t, m in zip(rollout.response_ids, rollout.policy_mask, strict=True) if m]
        assert [t for s in rollout.steps for t in s.response_ids] == policy
        assert rollout.steps[0].prompt_ids == rollout.prompt_ids


def test_an_edited_context_is_what_the_next_turn_reads(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    chat = ChatFormat(tok)
    engine = InOrder(tok, [["a long first answer", "short", "shortest"]], eos)
    runner, _, _ = _runner(engine, tok)
    runner.limits.step_wise = True
    ((rollout, conv),) = runner.run([_start(tok, _sample(0), lambda: Window(3))], SAMPLING)
    assert conv.finish == "done" and conv.turns == 3 and conv.context_edits == 2 and conv.reward == 1.0
    question = list(_sample(0).prompt)
    second = question + [{"role": "user", "content": "You said 'a long first answer'. Again, shorter."}]
    third = question + [{"role": "user", "content": "You said 'short'. Again, shorter."}]
    # the engine read the edited contexts, rendered by the chat template as fresh prompts
    assert [call[0] for call in engine.calls] == [
        chat.prompt_ids(question, None),
        chat.prompt_ids(second, None),
        chat.prompt_ids(third, None),
    ]
    assert [s.prompt_ids for s in rollout.steps] == [call[0] for call in engine.calls]
    for step, reply in zip(rollout.steps, ["a long first answer", "short", "shortest"], strict=True):
        assert step.response_ids == tok(reply, add_special_tokens=False)["input_ids"] + [eos]
    # the conversation is the context as the model last saw it, with its last reply
    assert conv.messages == [*third, {"role": "assistant", "content": "shortest"}]


def test_an_edit_in_a_run_that_trains_whole_episodes_ends_that_episode(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = InOrder(tok, [["one", "two"], ["uno", "dos"]], eos)
    runner, _, _ = _runner(engine, tok)
    starts = [_start(tok, _sample(0), lambda: Window(3)), _start(tok, _sample(1), lambda: Echo(2))]
    (edited, c_edited), (other, c_other) = runner.run(starts, SAMPLING)
    assert c_edited.finish == "error" and "set rollout.step_wise: true" in c_edited.error
    assert "EnvStep.context" in c_edited.error and edited.steps is None
    assert c_other.finish == "done" and c_other.turns == 2  # the other episode is untouched


def test_an_edited_context_longer_than_prompt_plus_response_truncates_the_episode(smol_tokenizer):
    tok = smol_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    class Flood(Environment):
        def step(self, turn):
            return EnvStep(context=[{"role": "user", "content": "word " * 400}])

    engine = InOrder(tok, [["one", "two"]], eos)
    runner, _, _ = _runner(engine, tok, response_tokens=100)
    runner.limits.step_wise, runner.limits.max_prompt_tokens = True, 64
    ((rollout, conv),) = runner.run([_start(tok, _sample(0), Flood)], SAMPLING)
    assert conv.finish == "truncated" and len(rollout.steps) == 1 and len(engine.calls) == 1


def test_step_wise_advantages_by_hand():
    """Two episodes: the first's last turn has advantage 1.5 from its first policy token (outcome estimators
    give the turn one value), the second's -0.5. Rows: episode 0 has two turns, episode 1 one."""
    advantages = torch.tensor([[0.0, 1.5, 1.5], [-0.5, -0.5, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # episode 0's last turn starts one token in
    row_episode = torch.tensor([0, 0, 1])
    row_mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    expected = torch.tensor([[1.5, 1.5, 1.5, 0.0], [1.5, 1.5, 0.0, 0.0], [-0.5, 0.0, 0.0, 0.0]])
    assert torch.equal(step_wise_advantages(advantages, mask, row_episode, row_mask), expected)
    # an episode with no policy token (its environment failed at start) gives its rows nothing
    empty = step_wise_advantages(torch.tensor([[7.0, 7.0]]), torch.zeros(1, 2), torch.tensor([0]), torch.ones(1, 2))
    assert torch.equal(empty, torch.zeros(1, 2))


def test_record_rows_are_the_steps_in_order():
    from plugrl.episodes import Episode, StepRecord

    def episode(steps):
        return Episode(None, Rollout([1], [2, 3], None, "stop", steps=steps), "", 0.0)

    s1, s2, s3 = (Rollout([1, k], [k], None, "stop") for k in (5, 6, 7))
    record = StepRecord([None], [episode([s1, s2]), episode([s3])], 2)
    assert record.step_wise and record.rows() == [(0, s1), (0, s2), (1, s3)]
    plain = StepRecord([None], [episode(None), episode(None)], 2)
    assert not plain.step_wise and [i for i, _ in plain.rows()] == [0, 1]
    assert plain.rows()[0][1] is plain.episodes[0].rollout
    started_badly = StepRecord([None], [episode([]), episode([s3])], 2)  # no turn: its empty response, once
    assert [(i, r.response_ids) for i, r in started_badly.rows()] == [(0, [2, 3]), (1, [7])]


@pytest.mark.parametrize("bad", ["gae", "kl_in_reward"])
def test_step_wise_refuses_what_needs_one_sequence_per_episode(bad):
    from plugrl.config import Config, ConfigError
    from plugrl.plugins import load_plugins
    from plugrl.startup import check_step_wise

    estimators = load_plugins(["advantages"]).estimators
    cfg = Config.model_validate(
        {
            "model": {"path": "m"},
            "data": {"train_files": ["x.jsonl"]},
            "environment": "e",
            "rollout": {"step_wise": True},
            "algorithm": {"adv_estimator": "gae" if bad == "gae" else "grpo", "use_kl_in_reward": bad != "gae"},
        }
    )
    expected = "learns token values along one sequence" if bad == "gae" else "use actor.use_kl_loss"
    with pytest.raises(ConfigError, match=f"rollout.step_wise is true, but .*{expected}"):
        check_step_wise(cfg, estimators[cfg.algorithm.adv_estimator])
    check_step_wise(cfg.model_copy(update={"algorithm": type(cfg.algorithm)()}), estimators["grpo"])
