"""The first prompts of a run's multi-turn episodes, measured at start: with the tools' descriptions a prompt that
fit ``data.max_prompt_length`` on its own may not, and every episode of it would fail at its start.

:class:`plugrl_multiturn.turns.EpisodeRunner` renders an episode's first prompt afresh when it offers tools
(their schemas go into the chat template, or into the system message of a template that ignores them) or when
the prompt is raw text (a user message for the chat template). Before the first step this module renders the
run's prompts the same way with the tools known then: ``rollout.tools`` and those an environment's tool options
name (:attr:`plugrl.specs.EnvironmentSpec.tool_options`). Tools or messages an environment's ``start()`` adds
are known only once it runs: an episode whose prompt they push over the limit fails alone, counted
(``rollout/failed_episodes``). Agents and prompts with images render their own prompts and are not measured.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plugrl.rollout.environment import own_runner
from plugrl.rollout.routing import environment_for
from plugrl_multiturn.chat import ChatFormat
from plugrl_multiturn.routing import environment_options

log = logging.getLogger("plugrl.rollout")

MEASURED_PER_TOOL_SET = 16  # the longest prompts by their own length, rendered with each set of tools


@dataclass(frozen=True)
class LongestPrompt:
    tokens: int  # the first prompt's length with the tools' descriptions (and data.prefill)
    origin: str  # where its row is (file and row, or dataset and index)
    tools: tuple[str, ...]  # the tools described in it


def _tool_names(cfg: Any, registry: Any, data_source: str) -> tuple[str, ...] | None:
    """The tools a sample's episodes offer from the start; None for an environment that plays its own episodes
    (an agent: it renders its own prompts)."""
    spec = environment_for(cfg, registry, data_source)
    names = list(cfg.rollout.tools)
    if spec is not None:
        if own_runner(spec.factory) is not None:
            return None
        options = environment_options(cfg, spec)
        for key in spec.tool_options:
            value = options.get(key)
            names += [value] if isinstance(value, str) else list(value or ())
    return tuple(dict.fromkeys(n for n in names if n in registry.tools))


def longest_first_prompt(cfg: Any, registry: Any, tokenizer: Any, prompts: Sequence[Any]) -> LongestPrompt | None:
    """The longest first prompt among ``prompts`` (encoded prompts) as their episodes' first turn will read it;
    None when no episode renders its prompt afresh (no tools, chat messages given) or there are none. Of each
    set of tools, the :data:`MEASURED_PER_TOOL_SET` prompts longest on their own are rendered (the tools'
    descriptions add the same text to each)."""
    groups: dict[tuple[str, ...], list[Any]] = {}
    for p in prompts:
        if getattr(p, "engine_ids", None) is not None:  # an image prompt: the processor renders it
            continue
        names = _tool_names(cfg, registry, p.sample.data_source)
        if names is None or (not names and p.messages is not None):  # an agent; or the prompt's own ids serve
            continue
        groups.setdefault(names, []).append(p)
    if not groups:
        return None
    chat = ChatFormat(tokenizer, cfg.model.tokenizer_path or cfg.model.path, cfg.data.apply_chat_template_kwargs)
    prefill = len(chat.encode(cfg.data.prefill)) if cfg.data.prefill else 0
    longest: LongestPrompt | None = None
    for names, members in groups.items():
        schemas = [registry.tools[n].schema for n in names] or None
        for p in heapq.nlargest(MEASURED_PER_TOOL_SET, members, key=lambda q: len(q.ids)):
            messages = p.messages if p.messages is not None else [{"role": "user", "content": p.text}]
            tokens = len(chat.prompt_ids(chat.with_tool_prompt(list(messages), schemas), schemas)) + prefill
            if longest is None or tokens > longest.tokens:
                longest = LongestPrompt(tokens, str(p.sample.origin), names)
    return longest


def check_first_prompts(cfg: Any, registry: Any, tokenizer: Any, prompts: Sequence[Any]) -> str | None:
    """Measure the longest first prompt (:func:`longest_first_prompt`) and log it; return why the run cannot
    start when it is over ``data.max_prompt_length`` (every episode of that prompt would fail at its start), or
    None. With ``data.filter_overlong_prompts`` such episodes are left to fail alone, counted, with a warning. The
    kernel calls it (the entry point's ``check_first_prompts``) with a run's prompts before any model loads."""
    longest = longest_first_prompt(cfg, registry, tokenizer, prompts)
    if longest is None:
        return None
    limit = cfg.data.max_prompt_length
    tools = ", ".join(longest.tools) or "none"
    log.info(
        "longest first prompt of an episode: %d tokens with the tools' descriptions (tools: %s; %s), "
        "data.max_prompt_length=%d",
        longest.tokens,
        tools,
        longest.origin,
        limit,
    )
    if longest.tokens <= limit:
        return None
    problem = (
        f"the first prompt of {longest.origin} is {longest.tokens} tokens with the descriptions of its tools "
        f"({tools}), more than data.max_prompt_length={limit}: each of its episodes would fail at its start. "
        f"Raise data.max_prompt_length to at least {longest.tokens}, or offer fewer tools"
    )
    if cfg.data.filter_overlong_prompts:
        log.warning("%s; data.filter_overlong_prompts: such episodes fail alone, counted in rollout/failed_episodes",
                    problem)  # fmt: skip
        return None
    return problem + ", or turn on data.filter_overlong_prompts to let such episodes fail alone (counted)"
