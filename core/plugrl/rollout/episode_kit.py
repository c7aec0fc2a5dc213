"""The seam to the package that plays multi-turn episodes (``environment``, ``rollout.tools``): plugrl-multiturn, the
entry point of group ``plugrl.episode_runners``, an object with :class:`EpisodeKit`'s functions (plugrl-multiturn's
is its module ``plugrl_multiturn``).

The kernel calls it for multi-turn runs only: the start-up checks of the environments and tools
(:func:`plugrl.rollout.routing.check_environment_options`) and of the settings multi-turn episodes cannot honour
(:func:`plugrl.startup.check_run`), the first prompts measured
(:func:`plugrl.startup.load_run_data`) and the run's player (:func:`plugrl.rollout.play.make_episode_runner`). A
single-turn run never imports the package; a multi-turn run without it is refused at start, naming the key that
made it multi-turn (:func:`check_installed`). Below the loader, so that its options check can reach the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from plugrl.config import ConfigError
from plugrl.plugin_errors import implementation, package_hint

if TYPE_CHECKING:
    from plugrl.rollout.multiturn import Conversation
    from plugrl.rollout.types import Rollout, RolloutEngine, SamplingSettings

GROUP = "plugrl.episode_runners"
PACKAGE = "plugrl-multiturn"


class NoEpisodeRunner(ConfigError):
    """No installed package plays multi-turn episodes; the message names the keys that ask for them and the
    package."""


class EpisodePlayer(Protocol):
    """A run's multi-turn episodes. ``play(prompts, sampling)``: ``sampling.n`` episodes per prompt (encoded
    prompts), group by group, each as (:class:`Rollout`, :class:`Conversation`); ``timings``: seconds spent
    generating (``generate``) and in environments and tools (``env``) in the last ``play``; ``close()`` stops
    what the episodes started (tool workers, agents' endpoints)."""

    timings: dict[str, float]

    def play(self, prompts: Sequence[Any], sampling: SamplingSettings) -> list[tuple[Rollout, Conversation]]: ...
    def close(self) -> None: ...


class EpisodeKit(Protocol):
    """The entry point of group ``plugrl.episode_runners``.

    - ``check_environments(config, registry, problems)``: at start, before any model loads: loads the ``family:id``
      environments the config names into ``registry``, checks ``environment``, ``environment_options``, the tools
      named and ``rollout.tool_parser``, and adds what is wrong to ``problems``.
    - ``check_config(cfg)``: at start, before any model loads: a :class:`ConfigError` naming the settings
      multi-turn episodes cannot honour (``data.apply_chat_template`` false, ``actor.tp_size`` or
      ``rollout.tensor_model_parallel_size`` > 1, ``rollout.tools`` without plugrl-tools).
    - ``check_first_prompts(cfg, registry, tokenizer, prompts)``: at start, with the run's encoded prompts: why the
      run cannot start (a first prompt over ``data.max_prompt_length`` with its tools' descriptions), or None.
    - ``make_episode_player(cfg, registry, engine, tokenizer, processor)``: the run's :class:`EpisodePlayer`, from
      its config (``environment``, ``rollout.max_turns`` and the tool settings) and its plugins' environments and
      tools; ``processor``: a vision-language model's (:class:`plugrl.vlm.Processor`), which renders the first
      prompt of an episode with images.
    """

    def check_environments(self, config: Any, registry: Any, problems: list[str]) -> None: ...
    def check_config(self, cfg: Any) -> None: ...
    def check_first_prompts(self, cfg: Any, registry: Any, tokenizer: Any, prompts: Sequence[Any]) -> str | None: ...
    def make_episode_player(
        self, cfg: Any, registry: Any, engine: RolloutEngine, tokenizer: Any, processor: Any = None
    ) -> EpisodePlayer: ...


def multi_turn_keys(cfg: Any) -> list[str]:
    """The keys, as the user typed them, that make ``cfg``'s episodes multi-turn (empty: single-turn)."""
    keys = [f"environment={cfg.environment}"] if cfg.environment else []
    tools = getattr(cfg.rollout, "tools", None)  # plugrl-multiturn's key
    return keys + ([f"rollout.tools={list(tools)}"] if tools else [])


def kit(keys: str) -> EpisodeKit:
    """The installed implementation; a :class:`NoEpisodeRunner` naming ``keys`` (what made the run multi-turn) and
    the package when there is none."""
    missing = f"{keys}: multi-turn episodes are played by the package {PACKAGE}, which is not installed: "
    return implementation(GROUP, NoEpisodeRunner(missing + package_hint(PACKAGE)))


def run_kit(cfg: Any) -> EpisodeKit | None:
    """The implementation for a multi-turn ``cfg`` (a :class:`NoEpisodeRunner` naming its keys without one); None,
    and nothing looked up, for a single-turn one."""
    keys = multi_turn_keys(cfg)
    return kit(", ".join(keys)) if keys else None


def check_installed(cfg: Any) -> None:
    """A multi-turn run without the package that plays its episodes: refused now, naming the keys, rather than
    when its first step starts."""
    run_kit(cfg)
