"""Multi-turn episodes whose prompt has images: every turn's engine call reads the images (the prompt part as the
engine takes it, one image token per image, the turns after it as they were sampled and answered), the trained
sequence is the processor's expansion of the prompt followed by the episode's tokens, and the trainer scores it with
the prompt's pixels. A prompt re-rendered for tools (their schemas) goes through the processor's chat template.

The real engines (HF, and vLLM on the test VLM) and the tiny test VLM (tests/tiny_models.py); the environment is a
small one written here."""

from __future__ import annotations

import pytest
import torch

from plugrl.data import Sample
from plugrl.rollout import SamplingSettings
from plugrl.rollout.environment import Environment, EnvStep, Turn
from plugrl.rollout.tools import get_parser
from plugrl.rollout.types import ImagePrompt
from plugrl_multiturn import EpisodeRunner
from plugrl_multiturn.chat import ChatFormat
from plugrl_multiturn.records import EpisodeStart, MultiTurnLimits
from plugrl_tools.authoring import make_tool
from plugrl_tools.executor import ToolExecutor
from plugrl_vision import VisionProcessor
from tiny_models import noise_image


class Again(Environment):
    """Answers every turn with 'look again <turn>' until its last turn."""

    def __init__(self, turns: int = 3):
        self.turns = turns

    def step(self, turn: Turn) -> EnvStep:
        if turn.index + 1 >= self.turns:
            return EnvStep(done=True, reward=1.0)
        return EnvStep(messages=[{"role": "user", "content": f"look again {turn.index}"}])


def count(n: int) -> int:
    """Count up to n.

    Args:
        n: the number
    """
    return n + 1


def _runner(engine, processor, *, tools=None, turn_tokens=8):
    tok = processor.tokenizer
    tools = tools or {}
    executor = ToolExecutor(tools, max_workers=1, time_limit_s=5) if tools else None
    runner = EpisodeRunner(
        engine,
        ChatFormat(tok, "the test VLM"),
        tok,
        MultiTurnLimits(3, turn_tokens, 120, 4),
        registered_tools=tools,
        default_tools=list(tools),
        parser=get_parser("hermes"),
        run_tools=lambda pairs: executor.run([c for c, _ in pairs]),
        processor=processor,
    )
    return runner, executor


def _starts(processor, n_images: list[int]) -> list[EpisodeStart]:
    starts = []
    for i, n in enumerate(n_images):
        images = [noise_image(10 * i + k, (40, 30)) for k in range(n)]
        messages = [{"role": "user", "content": "<image>" * n + f"How many squares? ({i})"}]
        engine_ids, ids, pixels = processor.encode(processor.render(messages), images)
        sample = Sample(prompt=messages, data_source="t", ground_truth="", origin=f"row {i}")
        image = ImagePrompt(engine_ids, images, ids, pixels)
        starts.append(EpisodeStart(sample, ids, messages, lambda: Again(3), "environment 'test'", image=image))
    return starts


class Recording:
    """An engine that records what each call was given."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, sampling):
        self.calls.append(list(prompts))
        return self.engine.generate(prompts, sampling)


@pytest.fixture(scope="module")
def processor(tiny_vlm):
    return VisionProcessor.load(str(tiny_vlm))


def _scored_by_the_trainer(policy, played, starts):
    """The trainer's log-probs of each episode's policy tokens, with its prompt's pixels."""
    from plugrl.actor import TrainBatch

    batch = TrainBatch.from_sequences(
        [r.prompt_ids + r.response_ids for r, _ in played],
        [len(r.prompt_ids) for r, _ in played],
        policy_masks=[r.policy_mask for r, _ in played],
        pixels=[s.image.pixels for s in starts],
    )
    return policy.compute_logprobs(batch, 1.0, 4096)


@pytest.mark.parametrize("engine_name", ["hf", "vllm"])
def test_every_turn_reads_the_images_and_the_trainer_scores_the_episode_as_the_engine_sampled_it(
    tiny_vlm, processor, engine_name
):
    """The HF engine and vLLM: each turn's call gets the prompt with one image token per image and the images, its
    model ids the context so far (vLLM's expansion is checked against them); the episode's sequence is the
    processor's prompt then the turns; the engine's log-probs of every policy token (turns 1-3) equal the trainer's
    within 1e-4 (float32), and another image changes them."""
    from plugrl.actor import PolicyModel
    from plugrl.config import ActorConfig, ModelConfig
    from plugrl.rollout.hf_engine import HFEngine

    if engine_name == "hf":
        real = HFEngine(str(tiny_vlm), "float32", "cpu", processor.tokenizer)
    else:
        from test_vllm_engine import _vllm as small_vllm_engine

        real = small_vllm_engine(tiny_vlm)
    engine = Recording(real)
    starts = _starts(processor, [1, 2])
    runner, _ = _runner(engine, processor)
    try:
        played = runner.run(starts, SamplingSettings(n=1, max_tokens=8, temperature=1.0, seed=0))
    finally:
        if engine_name == "vllm":
            real.close()
    image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    for call in engine.calls:
        for prompt, start in zip(call, starts, strict=False):
            if not isinstance(prompt, ImagePrompt):
                continue
            assert prompt.ids.count(image_token) == len(prompt.images) and prompt.images is start.image.images
            assert prompt.model_ids[: len(start.prompt_ids)] == start.prompt_ids
    turns = [[p for call in engine.calls for p in call if p.images is s.image.images] for s in starts]
    assert [len(t) for t in turns] == [3, 3] and all(c.turns == 3 and c.finish == "done" for _, c in played)
    for (rollout, _), start, mine in zip(played, starts, turns, strict=True):
        assert rollout.prompt_ids == start.prompt_ids
        whole = rollout.prompt_ids + rollout.response_ids
        assert all(whole[: len(p.model_ids)] == p.model_ids for p in mine)
    policy = PolicyModel(str(tiny_vlm), ModelConfig(path=str(tiny_vlm), dtype="float32"), ActorConfig(), "cpu")
    scored = _scored_by_the_trainer(policy, played, starts)
    for i, (rollout, _) in enumerate(played):
        policy_cols = [k for k, m in enumerate(rollout.policy_mask) if m]
        assert len(policy_cols) > 8  # all three turns
        sampled = torch.tensor([rollout.logprobs[k] for k in policy_cols])
        torch.testing.assert_close(scored[i, policy_cols], sampled, atol=1e-4, rtol=0)
    # the pixels matter to the last turn too: another image gives other log-probs of the same tokens
    from plugrl.actor import TrainBatch

    rollout = played[0][0]
    _, _, other_pixels = processor.encode(processor.render(starts[0].messages), [noise_image(99, (40, 30))])
    batch = TrainBatch.from_sequences([rollout.prompt_ids + rollout.response_ids], [len(rollout.prompt_ids)])
    batch.pixels = [other_pixels]
    other = policy.compute_logprobs(batch, 1.0, 4096)
    last = [k for k, m in enumerate(rollout.policy_mask) if m][-3:]
    assert (other[0, last] - scored[0, last]).abs().max() > 1e-4


def test_a_tool_prompt_is_rendered_by_the_processor_with_the_images_in_place(tiny_vlm, processor):
    """rollout.tools with an image prompt: the first prompt is rendered afresh with the tools' descriptions, by the
    processor's template (one image token per image for the engine, the expansion for the model)."""
    from plugrl.rollout.hf_engine import HFEngine

    tools = {"count": make_tool(count, plugin="test")}
    engine = Recording(HFEngine(str(tiny_vlm), "float32", "cpu", processor.tokenizer))
    (start,) = _starts(processor, [1])
    start = EpisodeStart(start.sample, start.prompt_ids, start.messages, Environment, start.where, image=start.image)
    runner, executor = _runner(engine, processor, tools=tools)
    try:
        ((rollout, conversation),) = runner.run([start], SamplingSettings(n=1, max_tokens=8, temperature=1.0, seed=0))
    finally:
        executor.close()
    first = engine.calls[0][0]
    assert isinstance(first, ImagePrompt) and len(first.model_ids) > len(start.prompt_ids)
    text = processor.tokenizer.decode(first.model_ids)
    assert '"count"' in text and "How many squares? (0)" in text
    assert rollout.prompt_ids == first.model_ids
    _, expected, _ = processor.encode(processor.tokenizer.decode(first.ids), start.image.images)
    assert first.model_ids == expected
    assert conversation.turns >= 1


def test_a_processor_template_that_drops_the_tools_ends_the_episode_with_an_error_saying_so(tiny_vlm, processor):
    """When the tokenizer's template writes the tools itself (so no tool prompt goes into the system message) but the
    processor's, which renders image prompts, does not: the policy would never see its tools. The episode ends at
    start with an error that says so."""
    tools = {"count": make_tool(count, plugin="test")}
    (start,) = _starts(processor, [1])
    start = EpisodeStart(start.sample, start.prompt_ids, start.messages, Environment, start.where, image=start.image)
    runner, executor = _runner(Recording(None), processor, tools=tools)
    runner.chat.shows_tools = lambda tools: True  # as a tokenizer template that renders tools= would
    try:
        ((_, conversation),) = runner.run([start], SamplingSettings(n=1, max_tokens=8))
    finally:
        executor.close()
    assert conversation.finish == "error" and "does not show the tools ['count']" in conversation.error


def test_an_environment_that_edits_an_image_prompts_context_ends_with_an_error_naming_it(processor):
    """Step-wise context edits re-render the conversation; with images that is not supported yet: the episode ends
    with an error that says so (the others go on)."""
    from plugrl.rollout import Rollout

    class Edits(Environment):
        def step(self, turn):
            return EnvStep(context=[{"role": "user", "content": "new"}])

    class Fixed:
        def generate(self, prompts, sampling):
            return [[Rollout(list(p.model_ids), [5, 6], [0.0, 0.0], "stop")] for p in prompts]

    (start,) = _starts(processor, [1])
    start = EpisodeStart(start.sample, start.prompt_ids, start.messages, Edits, start.where, image=start.image)
    runner, _ = _runner(Fixed(), processor)
    runner.limits.step_wise = True
    ((_, conversation),) = runner.run([start], SamplingSettings(n=1, max_tokens=8))
    assert conversation.finish == "error" and "edited the context" in conversation.error
    assert "images" in conversation.error


LOOK_AGAIN = """
import plugrl


@plugrl.environment("look_again")
class LookAgain(plugrl.Environment):
    \"\"\"Asks for a second look once, then ends; the math reward scores the last answer.\"\"\"

    def step(self, turn):
        if turn.index == 0:
            return [{"role": "user", "content": "Look at the image again. How many squares?"}]
        return plugrl.EnvStep(done=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("episodes", ["environment", "tools"])
def test_vlm_grpo_trains_multi_turn_episodes_with_vllm(tiny_vlm, tmp_path, episodes):
    """`plugrl train examples/vlm_grpo.yaml` with multi-turn episodes on vLLM, 2 steps: a local environment that asks
    for a second look (2 turns, both engine calls with the image), or the tool loop with the calculator (the prompt
    re-rendered with the tool's description); the rollout file holds the conversations."""
    import json
    import os

    from test_e2e import metrics, run_plugrl, tiny_overrides

    (tmp_path / "look_again_plugin.py").write_text(LOOK_AGAIN)
    if episodes == "environment":
        extra = ["plugins=['look_again_plugin:',shapes,math,advantages]", "environment=look_again"]
    else:
        extra = ["plugins=[shapes,math,advantages,math_tools]", "rollout.tools=[calculator]"]
    run_plugrl(
        [
            "train",
            "examples/vlm_grpo.yaml",
            *tiny_overrides(tiny_vlm, tmp_path, 2),
            "rollout.name=vllm",
            "rollout.cpu_kv_cache_gb=0.25",
            "rollout.max_turns=2",
            "rollout.max_turn_tokens=8",
            "data.max_prompt_length=512",
            "data.max_response_length=48",
            *extra,
        ],
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
    )
    m = metrics(tmp_path / "e2e")
    assert [x["step"] for x in m] == [1, 2] and all(x["actor/optimizer_steps"] == 1 for x in m)
    rollouts = tmp_path / "e2e" / "rollouts" / "step_000001.jsonl"
    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert len(rows) == 8 and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    if episodes == "environment":
        assert all(r["turns"] == 2 and r["finish"] == "done" for r in rows)
    else:
        assert all('"calculator"' in r["messages"][0]["content"] for r in rows)


def test_an_agent_environment_with_a_vision_model_is_refused_at_start_naming_it():
    """Agents reach the policy through the OpenAI-compatible endpoint, which takes text: with a vision-language model
    an environment that is an agent is refused at start, naming it (a turn-driven environment is not)."""
    from plugrl.config import Config, ConfigError
    from plugrl.specs import EnvironmentSpec, Registry
    from plugrl_agents import openai_agent
    from plugrl_vision.checks import check_config

    def solve(client, sample):
        return 0.0

    registry = Registry(
        environments={"solver": openai_agent(solve, name="solver"), "again": EnvironmentSpec("again", Again)}
    )
    base = {"model": {"path": "vlm"}, "data": {"train_files": ["train.jsonl"]}}
    cfg = Config.model_validate({**base, "environment": {"count*": "again", "*": "solver"}})
    with pytest.raises(ConfigError, match=r"their own episodes \(environment solver: .*endpoint, which takes text\)"):
        check_config(cfg, registry)
    check_config(Config.model_validate({**base, "environment": "again"}), registry)
