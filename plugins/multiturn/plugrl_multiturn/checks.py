"""Settings that single-turn runs accept and multi-turn episodes cannot honour, refused at start naming the key
(:func:`check_config`, the entry point's ``check_config``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from plugrl.config import ConfigError

if TYPE_CHECKING:
    from plugrl.config import Config

log = logging.getLogger("plugrl.startup")  # the start-up's: the line users saw when the kernel checked this


def check_config(cfg: Config) -> None:
    """Settings that single-turn runs accept and multi-turn episodes (``environment``, ``rollout.tools``)
    cannot honour: a :class:`ConfigError` naming them, rather than a run that quietly does something else (the
    kernel's call at start, :func:`plugrl.startup.check_run`, before any model loads)."""
    problems = []
    if not cfg.data.apply_chat_template:
        problems.append(
            "data.apply_chat_template is false, but multi-turn episodes are written with the chat template: "
            "set it to true"
        )
    if cfg.rollout.max_turn_tokens and cfg.rollout.max_turn_tokens > cfg.data.max_response_length:
        log.warning(
            "rollout.max_turn_tokens (%d) is more than data.max_response_length (%d), which bounds the whole "
            "multi-turn response: a turn gets at most %d tokens",
            cfg.rollout.max_turn_tokens,
            cfg.data.max_response_length,
            cfg.data.max_response_length,
        )
    for key, value in (
        ("actor.tp_size", cfg.actor.tp_size),
        ("rollout.tensor_model_parallel_size", cfg.rollout.tensor_model_parallel_size),
    ):
        if value > 1:  # the ranks of one engine would have to take every turn together; they do not yet
            problems.append(f"{key}={value}: multi-turn episodes run with one engine per rank so far; set it to 1")
    if cfg.rollout.tools:  # the tools run in plugrl-tools' worker processes: refused now, not at the first call
        from plugrl.rollout.tools import NoToolExecutor, tool_executor

        try:
            tool_executor()
        except NoToolExecutor as e:
            problems.append(f"rollout.tools={list(cfg.rollout.tools)}: {e}")
    if problems:
        raise ConfigError("; ".join(problems))
