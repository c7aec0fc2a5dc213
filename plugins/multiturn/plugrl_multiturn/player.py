"""A run's multi-turn episodes from its config: which environment each sample gets, the tools and their worker
processes, and which runner plays each episode.

The kernel calls :func:`make_episode_player` (through :func:`plugrl.rollout.play.make_episode_runner`) once per
run; the trainer and ``plugrl eval`` then call :meth:`EpisodePlayer.play` with a step's prompts.
:class:`plugrl_multiturn.turns.EpisodeRunner` runs the turns of environments; an environment that plays its own
episodes (its class's ``episode_runner``: the agents of plugrl-agents, which call the policy themselves) gets a
runner of its own (:func:`plugrl.rollout.environment.own_runner`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from plugrl.rollout.environment import Environment, EnvStep, Turn, own_runner
from plugrl.rollout.multiturn import Conversation
from plugrl.rollout.routing import environment_for
from plugrl.rollout.tools import ToolCall, ToolResult, ToolSpec, get_parser, tool_executor
from plugrl.rollout.types import Rollout, RolloutEngine, SamplingSettings
from plugrl_multiturn.chat import ChatFormat
from plugrl_multiturn.records import EpisodeStart, MultiTurnLimits
from plugrl_multiturn.routing import environment_options
from plugrl_multiturn.turns import EpisodeRunner


class _OneTurn(Environment):
    """A sample that no environment route matches, in a run without tools: one reply, then done."""

    def step(self, turn: Turn) -> EnvStep:
        return EnvStep(done=True)


class _ToolBox:
    """Runs (call, spec) pairs in one tool executor (:func:`plugrl.rollout.tools.tool_executor`); rebuilt, rarely,
    when an environment offers a tool function it had not seen (``EnvStart.tools``)."""

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
    """A run's multi-turn episodes: ``play(prompts, sampling)`` gives ``sampling.n`` episodes per prompt, group by
    group, each as (:class:`Rollout`, :class:`Conversation`). Episodes of an environment that plays them itself go
    to its runner (``own``: one per ``episode_runner``, made at its first episode), the others to ``runner``;
    ``timings`` adds up all of them for the last ``play``."""

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


def make_episode_player(
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
