"""Playing a step's multi-turn episodes from the run config: which environment each sample gets, the tools
and their worker processes, and what a conversation adds to the metrics and the rollout logs.

The trainer and ``plugrl eval`` build one :class:`EpisodePlayer` per run (:func:`make_episode_runner`) and
call :meth:`EpisodePlayer.play` with a step's prompts; :mod:`plugrl.rollout.multiturn` runs the turns of
environments; an environment that plays its own episodes (its class's ``episode_runner``: the agents of
plugrl-agents, which call the policy themselves) gets a runner of its own
(:func:`plugrl.rollout.environment.own_runner`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from plugrl.rollout.chat import ChatFormat
from plugrl.rollout.environment import Environment, EnvStep, Turn, own_runner
from plugrl.rollout.multiturn import Conversation, EpisodeRunner, EpisodeStart, MultiTurnLimits
from plugrl.rollout.routing import environment_for, environment_options
from plugrl.rollout.tools import ToolCall, ToolResult, ToolSpec, get_parser, tool_executor
from plugrl.rollout.types import Rollout, RolloutEngine, SamplingSettings


class _OneTurn(Environment):
    """A sample that no environment route matches, in a run without tools: one reply, then done."""

    def step(self, turn: Turn) -> EnvStep:
        return EnvStep(done=True)


class _ToolBox:
    """Runs (call, spec) pairs in one tool executor (:func:`plugrl.rollout.tools.tool_executor`: plugrl-tools'
    worker processes); rebuilt, rarely, when an environment offers a tool function it had not seen
    (``EnvStart.tools``)."""

    def __init__(self, registered: dict[str, ToolSpec], **executor_kwargs: Any):
        self.tools = dict(registered)
        self.kwargs = executor_kwargs
        self.executor: Any = None

    def run(self, pairs: list[tuple[ToolCall, ToolSpec | None]]) -> list[ToolResult]:
        new = {s.name: s for _, s in pairs if s is not None and self.tools.get(s.name) is not s}
        for name, spec in new.items():
            if name in self.tools and self.tools[name].fn is not spec.fn:
                raise ValueError(
                    f"two tools are called {name!r} ({self.tools[name].plugin or 'registered'} and {spec.plugin}); "
                    "give the environment's tool another name"
                )
            self.tools[name] = spec
        if self.executor is None or new:
            self.close()
            self.executor = tool_executor()(self.tools, **self.kwargs)
        # a call the parser could not read goes to the executor too: its answer explains what was wrong
        known = [i for i, (c, s) in enumerate(pairs) if s is not None or c.error is not None]
        ran = iter(self.executor.run([pairs[i][0] for i in known]))
        results = []
        for call, spec in pairs:
            if spec is None and call.error is None:
                results.append(
                    ToolResult(call, f"Error: unknown tool {call.name!r}: it is not offered here", "unknown_tool")
                )
            else:
                results.append(next(ran))
        return results

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None


class EpisodePlayer:
    """A run's multi-turn episodes: ``play(prompts, sampling)`` gives ``sampling.n`` episodes per prompt,
    group by group, each as (:class:`Rollout`, :class:`Conversation`). Episodes of an environment that plays
    them itself go to its runner (``own``: one per ``episode_runner``, made when its first episode plays, e.g.
    an agent runner, which starts the rollout endpoint), the others to ``runner``; ``timings`` adds up all of them
    for the last ``play``."""

    def __init__(self, cfg: Any, registry: Any, runner: EpisodeRunner, toolbox: _ToolBox):
        self.cfg, self.registry, self.runner, self.toolbox = cfg, registry, runner, toolbox
        self.own: dict[Any, Any] = {}  # episode_runner -> the runner it made
        self.timings: dict[str, float] = {"generate": 0.0, "env": 0.0}

    def play(self, prompts: Sequence[Any], sampling: SamplingSettings) -> list[tuple[Rollout, Conversation]]:
        starts = [start for p in prompts for start in self._starts(p, sampling.n)]
        by_runner: dict[Any, list[int]] = {}
        for i, start in enumerate(starts):
            by_runner.setdefault(own_runner(start.make_env), []).append(i)
        played: list[Any] = [None] * len(starts)
        self.timings = {"generate": 0.0, "env": 0.0}
        # each runner takes its turn on the engine, in batches of its own: one step rarely mixes them
        for make_runner, indices in by_runner.items():
            run = self.runner if make_runner is None else self._own_runner(make_runner)
            for i, result in zip(indices, run.run([starts[i] for i in indices], sampling), strict=True):
                played[i] = result
            for key, seconds in run.timings.items():
                self.timings[key] = self.timings.get(key, 0.0) + seconds
        return played

    def _own_runner(self, make_runner: Any) -> Any:
        if make_runner not in self.own:
            r = self.runner
            self.own[make_runner] = make_runner(r.engine, r.chat, r.tokenizer, r.limits, parser=r.parser)
        return self.own[make_runner]

    def _starts(self, prompt: Any, n: int) -> list[EpisodeStart]:
        """``n`` episode starts of ``prompt``; a prompt with images shares its decoded images among them."""
        start = self._start(prompt)
        if getattr(prompt, "engine_ids", None) is not None:
            if own_runner(start.make_env) is not None:
                raise ValueError(
                    f"{prompt.sample.origin}: {start.where} plays its own episodes, and those do not take prompts "
                    "with images yet (their calls reach the policy as text, through the OpenAI-compatible "
                    "endpoint); use an environment or rollout.tools with image prompts"
                )
            if prompt.messages is None:
                raise ValueError(
                    f"{prompt.sample.origin}: a multi-turn episode of a prompt with images needs chat messages "
                    "(data.prompt_key holding messages, or a chat template), not raw text"
                )
            start = replace(start, image=prompt.engine_prompt)
        return [replace(start) for _ in range(n)]

    def _start(self, prompt: Any) -> EpisodeStart:
        spec = environment_for(self.cfg, self.registry, prompt.sample.data_source)
        if spec is not None:
            make_env = functools.partial(spec.factory, **environment_options(self.cfg, spec))
            kind = getattr(spec.factory, "kind", "environment") if own_runner(spec.factory) else "environment"
            where = f"{kind} {spec.name!r} (plugin {spec.plugin})"
        else:
            make_env = Environment if self.cfg.rollout.tools else _OneTurn
            where = "the tool loop" if self.cfg.rollout.tools else "a single-turn episode"
        if prompt.messages is not None:
            return EpisodeStart(prompt.sample, list(prompt.ids), prompt.messages, make_env, where)
        # a raw-text prompt: the conversation starts with it as the user's message, rendered by the chat template
        return EpisodeStart(prompt.sample, None, [{"role": "user", "content": prompt.text}], make_env, where)

    def close(self) -> None:
        self.toolbox.close()
        for runner in self.own.values():
            runner.close()


def make_episode_runner(
    cfg: Any, registry: Any, engine: RolloutEngine, tokenizer: Any, processor: Any = None
) -> EpisodePlayer:
    """The run's :class:`EpisodePlayer`, from its config (``environment``, ``rollout.max_turns`` and the
    tool settings) and its plugins' environments and tools; ``processor``: a vision-language model's
    (:class:`plugrl.vlm.Processor`), which renders the first prompt of an episode with images."""
    r = cfg.rollout
    toolbox = _ToolBox(
        registry.tools,
        max_workers=r.tool_workers,
        time_limit_s=r.tool_time_limit_s,
        max_output_chars=r.max_tool_response_chars,
    )
    limits = MultiTurnLimits(
        max_turns=r.max_turns,
        max_turn_tokens=r.max_turn_tokens or cfg.data.max_response_length,
        max_response_tokens=cfg.data.max_response_length,
        max_tool_calls_per_turn=r.max_tool_calls_per_turn,
        prefill=cfg.data.prefill or "",
        max_prompt_tokens=cfg.data.max_prompt_length,
        step_wise=r.step_wise,
        tool_time_limit_s=r.tool_time_limit_s,
        max_tool_output_chars=r.max_tool_response_chars,
        env_time_limit_s=r.env_time_limit_s,
    )
    chat = ChatFormat(tokenizer, cfg.model.tokenizer_path or cfg.model.path, cfg.data.apply_chat_template_kwargs)
    chat.close_ids()  # refuses a template that is not prefix-preserving, before the first step
    runner = EpisodeRunner(
        engine,
        chat,
        tokenizer,
        limits,
        registered_tools=registry.tools,
        default_tools=r.tools,
        parser=get_parser(r.tool_parser),
        run_tools=toolbox.run,
        processor=processor,
    )
    return EpisodePlayer(cfg, registry, runner, toolbox)


# ---------------------------------------------------------------------------- what a step logs


def conversation_metrics(conversations: Sequence[Conversation]) -> dict[str, float]:
    """``env/*`` metrics of a step's episodes: turns, tool calls and turns cut at ``rollout.max_turn_tokens``
    per episode, and context edits (step-wise runs); the share of episodes that the response budget cut
    (``env/truncated``), whose environment failed (``env/errors``) or ended them (``env/done``); and the
    mean of every numeric field environments put in ``EnvStep.info`` (``env/info/<field>``, over the
    episodes that report it)."""
    n = max(len(conversations), 1)
    fields: dict[str, list[float]] = {}
    for c in conversations:
        for key, value in c.info.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                fields.setdefault(f"env/info/{key}", []).append(float(value))
    return {
        **{key: sum(v) / len(v) for key, v in fields.items()},
        "env/turns_mean": sum(c.turns for c in conversations) / n,
        "env/tool_calls": sum(c.tool_calls for c in conversations) / n,
        "env/tool_errors": sum(c.tool_errors for c in conversations) / n,
        "env/truncated": sum(c.finish == "truncated" for c in conversations) / n,
        "env/cut_turns": sum(c.cut_turns for c in conversations) / n,
        "env/context_edits": sum(c.context_edits for c in conversations) / n,
        "env/errors": sum(c.finish == "error" for c in conversations) / n,
        "env/done": sum(c.finish == "done" for c in conversations) / n,
    }


def conversation_row(conversation: Conversation, rollout: Rollout, tokenizer: Any) -> dict[str, Any]:
    """The fields a multi-turn episode adds to its row in ``rollouts/step_N.jsonl``: the whole conversation,
    how it ended, and the response as segments of trained (the policy's) and untrained (tools', the
    environment's) tokens."""
    mask = rollout.policy_mask or [1] * len(rollout.response_ids)
    segments: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            text = tokenizer.decode(rollout.response_ids[start:i], skip_special_tokens=False)
            segments.append({"trained": bool(mask[start]), "tokens": i - start, "text": text})
            start = i
    return {
        "messages": conversation.messages,
        "environment": conversation.environment,
        "turns": conversation.turns,
        "finish": conversation.finish,
        "env_reward": conversation.reward,
        "env_error": conversation.error,
        "env_info": conversation.info,
        "tool_calls": conversation.tool_calls,
        "tool_errors": conversation.tool_errors,
        "segments": segments,
        **({} if rollout.steps is None else {"steps": [_step_row(s, tokenizer) for s in rollout.steps]}),
    }


def _step_row(step: Rollout, tokenizer: Any) -> dict[str, Any]:
    """A step-wise sample in the rollout log: how long its context was, and what the policy said."""
    return {
        "prompt_tokens": len(step.prompt_ids),
        "response_tokens": len(step.response_ids),
        "response": tokenizer.decode(step.response_ids, skip_special_tokens=False),
    }


# ---------------------------------------------------------------------------- generating and scoring


def generate_scored(
    engine: RolloutEngine,
    tokenizer: Any,
    prompts: Sequence[Any],
    rewards: Any,
    sampling: SamplingSettings,
    *,
    prefill: str | None = None,
    player: EpisodePlayer | None = None,
) -> tuple[list[tuple[Any, Rollout, Conversation | None]], list[str], Any]:
    """``sampling.n`` episodes of each prompt, generated and scored: ``(prompt, rollout, conversation)``
    per episode (group by group), the text each was scored on, and the reward runner's
    :class:`plugrl.rewards.RewardOutput`. With ``player``, whole multi-turn episodes: the last reply is
    the completion, the conversation goes to the rewards as ``messages``, and an episode whose environment
    returned a reward keeps it (``details["environment"]``). Used by the trainer and by validation."""
    from plugrl.rewards import RewardOutput
    from plugrl.rollout.types import response_texts

    if player is None:  # every rank calls the engine, with or without prompts: TP ranks generate together
        groups = engine.generate([p.engine_prompt for p in prompts], sampling)
    if not prompts:  # the later ranks of a TP group: they receive the first rank's record
        return [], [], RewardOutput([], [], {})
    if player is not None:
        played = player.play(prompts, sampling)
        episodes = [(p, r, c) for p, (r, c) in zip(_each(prompts, sampling.n), played, strict=True)]
        texts = [c.last_reply for _, _, c in episodes]
    else:
        episodes = [(p, r, None) for p, g in zip(prompts, groups, strict=True) for r in g]
        texts = response_texts(tokenizer, [r for _, r, _ in episodes], sampling)
        if prefill:  # the prefill is the start of the assistant's answer: score it with the rest
            texts = [prefill + t for t in texts]
    return episodes, texts, score_episodes(rewards, episodes, texts)


def score_episodes(rewards: Any, episodes: Sequence[tuple[Any, Rollout, Conversation | None]], texts: list[str]) -> Any:
    """The reward plugins' scores of ``episodes``; one whose environment returned a reward keeps that one,
    and one that only its environment could score but did not (it failed) gets 0 (``details["unscored"]``).
    ``reward/mean`` and ``reward/std`` cover every episode, ``reward/environment/mean`` those the
    environments scored (``reward/<part>/mean`` the parts of their scores), ``reward/unscored`` the share
    nobody could score."""
    from plugrl.rewards import RewardItem, RewardOutput

    own = [c is not None and c.reward is not None for _, _, c in episodes]
    # only an environment scores these (its class has reward()), and it did not: its episode failed, or
    # reward() returned None. They count as failures, with 0.
    scorable = {ds: rewards.can_score(ds) for ds in {p.sample.data_source for p, _, c in episodes if c is not None}}
    unscored = [
        not o and c is not None and not scorable[p.sample.data_source]
        for (p, _, c), o in zip(episodes, own, strict=True)
    ]
    items = [
        RewardItem(p.sample, p.text, t, None, r.response_ids)
        if c is None
        else RewardItem(p.sample, p.text, t, c.messages, r.response_ids, c.trl_prompt, c.trl_completion())
        for (p, r, c), t, o, u in zip(episodes, texts, own, unscored, strict=True)
        if not (o or u)
    ]
    scored = rewards.score(items) if items else RewardOutput([], [], {})
    if not any(own) and not any(unscored):
        return scored
    theirs = iter(zip(scored.scores, scored.details, strict=True))
    scores, details = [], []
    for (_, _, c), o, u in zip(episodes, own, unscored, strict=True):
        if o:  # the environment's score, and its parts (a rubric's functions) beside it
            score, detail = c.reward, {"environment": c.reward, **c.reward_parts}
        else:
            score, detail = (0.0, {"unscored": 0.0}) if u else next(theirs)
        scores.append(score)
        details.append(detail)
    # reward/mean and reward/std are over every episode; the reward functions' own means over those they scored
    metrics = dict(scored.metrics)
    every = [float(x) for x in scores if x is not None]
    mean = sum(every) / len(every) if every else 0.0
    by_env = [float(c.reward) for (_, _, c), o in zip(episodes, own, strict=True) if o]
    metrics["reward/mean"] = mean
    metrics["reward/std"] = math.sqrt(sum((x - mean) ** 2 for x in every) / len(every)) if every else 0.0
    if by_env:
        metrics["reward/environment/mean"] = sum(by_env) / len(by_env)
    parts: dict[str, list[float]] = {}
    for (_, _, c), o in zip(episodes, own, strict=True):
        for name, value in (c.reward_parts if o else {}).items():
            parts.setdefault(name, []).append(value)
    for name, values in parts.items():
        metrics.setdefault(f"reward/{name}/mean", sum(values) / len(values))
    if any(unscored):
        metrics["reward/unscored"] = sum(unscored) / len(unscored)
    return RewardOutput(scores, details, metrics)


def _each(items: Sequence[Any], n: int) -> list[Any]:
    """Each item n times in a row: the prompts of a step's episodes, group by group."""
    return [x for x in items for _ in range(n)]
