"""The keys of multi-turn episodes, which this package adds to the run config's ``rollout`` section (entry-point
group ``plugrl.config_fields``): the turns and their tokens (``max_turns``, ``max_turn_tokens``, ``step_wise``), the
tools offered and how their calls are read and run (``tools``, ``tool_parser``, time limits, workers, limits), the
environments' time limit. Episodes are multi-turn when ``environment`` (the kernel's key) or ``rollout.tools`` is
set (docs/environments.md); in a single-turn run these keys do nothing, which is said at start."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from plugrl.config import ConfigFields, Section


class MultiTurnKeys(Section):
    max_turns: int = Field(
        4,
        ge=1,
        description="Policy turns per multi-turn episode (verl's multi_turn.max_assistant_turns). The episode's "
        "whole response (every turn, tool and environment messages included) stays within "
        "data.max_response_length, so its context within max_prompt_length + max_response_length.",
    )
    max_turn_tokens: int | None = Field(
        None, ge=1, description="Tokens of one policy turn in a multi-turn episode; default data.max_response_length."
    )
    step_wise: bool = Field(
        False,
        description="Train each turn of a multi-turn episode as its own sample (its prompt: the whole context that "
        "turn saw; SkyRL's generator.step_wise_trajectories), every turn with its episode's advantage; needed when "
        "an environment edits the context between turns. false: one sequence per episode, the environment's and "
        "tools' tokens masked.",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Registered tools offered to the model in every episode (with or without an environment).",
    )
    tool_parser: str = Field("hermes", description="How tool calls are read from a reply (verl's multi_turn.format).")
    tool_time_limit_s: float = Field(10.0, gt=0.0, description="Wall-clock limit of one tool call.")
    env_time_limit_s: float = Field(
        60.0,
        gt=0.0,
        description="Wall-clock limit of each call of an environment's start, step, reward and close (with what it "
        "runs inside, such as a verifiers tool in env_response); past it the episode ends as an error, counted.",
    )
    tool_workers: int = Field(4, ge=1, description="Worker processes that run tool calls.")
    max_tool_calls_per_turn: int = Field(
        8, ge=1, description="Tool calls run per reply; later ones get an error answer (verl's max_parallel_calls)."
    )
    max_tool_response_chars: int = Field(
        4000, ge=1, description="A tool's answer is cut to this many characters (verl's max_tool_response_length)."
    )


def ignored(cfg: Any) -> list[str]:
    """The multi-turn keys a single-turn run sets (no ``environment``, no ``rollout.tools``): they do nothing."""
    if cfg.multi_turn:
        return []
    why = "episodes are single-turn (no environment and no rollout.tools); set environment or rollout.tools to use it"
    return [f"rollout.{key} ({why})" for key in MultiTurnKeys.model_fields if key in cfg.rollout.model_fields_set]


FIELDS = ConfigFields(sections={"rollout": MultiTurnKeys}, ignored=ignored)
