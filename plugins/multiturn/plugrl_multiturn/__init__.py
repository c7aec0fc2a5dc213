"""plugrl-multiturn: multi-turn episodes (``environment``, ``rollout.tools``), turn by turn, with environments and
tool calls.

The kernel finds this module through the entry-point group ``plugrl.episode_runners``
(:mod:`plugrl.rollout.episode_kit`) and calls, for multi-turn runs only: :func:`check_environments`,
:func:`check_config` and :func:`check_first_prompts` at start, before any model loads, and
:func:`make_episode_player` once per run, whose player plays each step's episodes
(:class:`plugrl.rollout.episode_kit.EpisodePlayer`). What a finished episode said
(:class:`plugrl.rollout.multiturn.Conversation`), which environment plays a sample's episodes
(:mod:`plugrl.rollout.routing`), the environment contract and the tool protocol stay in the kernel.

- :mod:`plugrl_multiturn.player`: a run's episodes from its config (environment per sample, the tools' workers).
- :mod:`plugrl_multiturn.turns`: :class:`EpisodeRunner`, every live episode one turn at a time, together.
- :mod:`plugrl_multiturn.records`: an episode in flight (:class:`EpisodeRecord`: its tokens as they will be
  trained), how it starts and its limits; agents fill them too.
- :mod:`plugrl_multiturn.env_results`: what an environment returns, checked against the contract.
- :mod:`plugrl_multiturn.chat`: :class:`ChatFormat`, the tokens appended between turns (token in, token out);
  agents (plugrl-agents) use it too.
- :mod:`plugrl_multiturn.routing`: ``family:id`` environments loaded, the checks of the environments and tools,
  the options each environment is made with.
- :mod:`plugrl_multiturn.checks`: the settings multi-turn episodes cannot honour (``data.apply_chat_template``,
  tensor parallelism, tools without plugrl-tools), refused at start.
- :mod:`plugrl_multiturn.first_prompts`: the longest first prompt with its tools' descriptions, measured at start.
- :mod:`plugrl_multiturn.fields`: the config keys (``rollout.max_turns``, ``rollout.tools``, ...), entry point
  ``multiturn`` of the group ``plugrl.config_fields``. Every run config has them, so this module imports the others
  on first use of their names.
"""

from __future__ import annotations

from plugrl.api import names_on_first_use

_HOME = {
    "check_config": "checks",
    "check_first_prompts": "first_prompts",
    "EpisodePlayer": "player",
    "make_episode_player": "player",
    "check_environments": "routing",
    "EnvironmentTimeout": "turns",
    "EpisodeRunner": "turns",
}
__all__ = sorted(_HOME)


__getattr__, __dir__ = names_on_first_use(__name__, _HOME)
