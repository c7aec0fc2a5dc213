"""The record of a step's rollouts: every scored episode, grouped by prompt.

One :class:`Episode` per response, one :class:`StepRecord` per step: what the trainer generates, scores,
filters, trains on and logs travels as this one record, never as parallel lists. A multi-turn episode
(environments, tools) grows :class:`Episode`; it is not a second record.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plugrl.config import ConfigError
from plugrl.prompts import EncodedPrompt
from plugrl.rollout import Rollout
from plugrl.rollout.multiturn import Conversation


@dataclass
class Episode:
    """One response to one prompt, decoded and scored.

    ``text`` is what the rewards scored (the prefill, when ``data.prefill`` is set, in front; in a multi-turn
    episode the last reply); ``details`` the reward functions' extra fields for this episode.
    ``conversation``: a multi-turn episode's messages, turns and tool calls (None for one response); its
    ``rollout`` then holds every turn's tokens, with ``policy_mask`` marking the policy's.
    """

    prompt: EncodedPrompt
    rollout: Rollout
    text: str
    score: float
    details: dict[str, Any] = field(default_factory=dict)
    conversation: Conversation | None = None

    @property
    def truncated(self) -> bool:
        """Cut at max_response_length (``finish_reason == "length"``)."""
        return self.rollout.finish_reason == "length"

    @property
    def failure(self) -> str | None:
        """Why the episode failed, or None: its environment or agent failed, or its first prompt did not fit
        (``Conversation.finish == "error"``, the message in ``Conversation.error``)."""
        c = self.conversation
        if c is None or c.finish != "error":
            return None
        return " ".join((c.error or "the episode ended as an error").split())  # one line

    @property
    def trainable(self) -> bool:
        """Whether the episode holds a token the policy sampled: one that failed at its start holds none."""
        mask = self.rollout.policy_mask
        return any(mask) if mask is not None else bool(self.rollout.response_ids)


@dataclass
class StepRecord:
    """A step's episodes, ``n`` per prompt, group by group: ``episodes[g * n : (g + 1) * n]`` answer
    ``prompts[g]``. ``reward_metrics`` are the reward runner's metrics of the first generation round
    (the policy's unfiltered performance)."""

    prompts: list[EncodedPrompt]
    episodes: list[Episode]
    n: int
    reward_metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.episodes) != len(self.prompts) * self.n:
            raise ValueError(f"{len(self.episodes)} episodes for {len(self.prompts)} prompts x n={self.n}")

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def groups(self) -> list[list[Episode]]:
        """[G][n] the episodes of each prompt."""
        return [self.episodes[g * self.n : (g + 1) * self.n] for g in range(len(self.prompts))]

    @property
    def scores(self) -> list[float]:
        return [e.score for e in self.episodes]

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.episodes]

    @property
    def step_wise(self) -> bool:
        """Whether the episodes train turn by turn (``rollout.step_wise``): their rollouts hold ``steps``."""
        return any(e.rollout.steps is not None for e in self.episodes)

    def rows(self) -> list[tuple[int, Rollout]]:
        """The sequences the step trains on, each with the index of its episode: one per episode, or in
        step-wise runs one per policy turn, in order (an episode that ended before its first turn keeps its
        empty response). An episode's last row holds the turn its score belongs to."""
        return [(i, r) for i, e in enumerate(self.episodes) for r in (e.rollout.steps or [e.rollout])]

    def select_groups(self, keep: Sequence[int]) -> StepRecord:
        """The record of the groups ``keep`` (indices into ``prompts``), in that order."""
        groups = self.groups
        return StepRecord(
            [self.prompts[g] for g in keep], [e for g in keep for e in groups[g]], self.n, self.reward_metrics
        )

    def extend(self, other: StepRecord) -> StepRecord:
        """This record's groups followed by ``other``'s (the reward metrics stay this record's)."""
        return StepRecord(self.prompts + other.prompts, self.episodes + other.episodes, self.n, self.reward_metrics)


FAILURE_CHARS = 300  # of a failure's message, as the console and the run summary show it


def failure_kind(message: str) -> str:
    """A failure's message without its particulars (what it quotes, its numbers): the failures of one kind (one
    place, one exception, one wording) count together whatever row or value they name."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", message))[:FAILURE_CHARS]


@dataclass
class FailureTally:
    """A run's failed episodes (:attr:`Episode.failure`) by kind (:func:`failure_kind`): how many, the first
    message of each kind as it was seen, and the step that saw it first."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    first_step: dict[str, int] = field(default_factory=dict)

    def add(self, messages: Iterable[str], step: int = 0) -> tuple[Counter[str], list[str]]:
        """Count ``messages`` of step ``step``: (their counts by kind, the kinds seen for the first time)."""
        counted: Counter[str] = Counter()
        new = []
        for message in messages:
            kind = failure_kind(message)
            if kind not in self.examples:
                self.examples[kind] = message[:FAILURE_CHARS]
                self.first_step[kind] = step
                new.append(kind)
            counted[kind] += 1
        self.counts.update(counted)
        return counted, new

    def by_reason(self) -> list[tuple[str, int]]:
        """(a message of the kind, its count), the most frequent kind first."""
        return [(self.examples[kind], count) for kind, count in self.counts.most_common()]


SAMPLING_GROUP = "plugrl.dynamic_sampling"  # plugrl-dapo's module: DAPO's dynamic sampling and overlong penalty


def dapo_settings(cfg: Any) -> tuple[bool, bool]:
    """(dynamic sampling on, overlong penalty on): ``algorithm.filter_groups.enable`` and
    ``reward.overlong_buffer.enable``, keys of plugrl-dapo (group plugrl.config_fields); both off without it."""
    fg, ob = getattr(cfg.algorithm, "filter_groups", None), getattr(cfg.reward, "overlong_buffer", None)
    return bool(fg and fg.enable), bool(ob and ob.enable)


def dynamic_sampling() -> Any:
    """plugrl-dapo's module (entry-point group ``plugrl.dynamic_sampling``): ``collect(generate, want, cfg,
    metrics)``, a step's groups that vary; ``penalties(episodes, cfg)`` [E], the overlong penalty;
    ``check_group_metric(metric, routes)`` at start."""
    from plugrl.plugin_errors import implementation, package_hint

    missing = "DAPO's dynamic sampling and overlong penalty are in the package plugrl-dapo, which is not installed"
    return implementation(SAMPLING_GROUP, ConfigError(f"{missing}: {package_hint('plugrl-dapo')}"))
