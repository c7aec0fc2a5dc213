"""DAPO's dynamic sampling and soft overlong punishment, what the trainer calls when
``algorithm.filter_groups.enable`` or ``reward.overlong_buffer.enable`` is set (this module is the entry point of the
group ``plugrl.dynamic_sampling``; the keys are :mod:`plugrl_dapo.fields`'):

- :func:`collect` ``(generate, want, cfg, metrics)``: a step's episodes, only the groups whose
  ``filter_groups.metric`` varies, refilled from further prompts (``generate(round)``) for up to
  ``max_num_gen_batches`` rounds;
- :func:`penalties` ``(episodes, cfg)``: each episode's overlong penalty [E], added to its score;
- :func:`check_group_metric` ``(metric, routes)``: at start, a metric the rewards never return.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from plugrl.config import ConfigError
from plugrl.dist import all_reduce
from plugrl.episodes import Episode, StepRecord

# DAPO's filter metrics that are the reward itself (verl's names), not a field of the reward functions' results
SCORE_METRICS = ("score", "reward", "seq_reward")
FINAL_METRIC = "seq_final_reward"  # the reward with DAPO's overlong penalty (verl's token-level reward sum)


def overlong_penalty(
    response_lengths: torch.Tensor, max_length: int, buffer_length: int, factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025), as verl's ``overlong_buffer``.

    ``response_lengths`` [B] -> penalty [B] (<= 0), added to the score::

        expected = max_length - buffer_length
        penalty  = min(-(length - expected) / buffer_length * factor, 0)

    Responses shorter than ``expected`` get 0; one of ``max_length`` tokens gets ``-factor``.
    """
    expected = max_length - buffer_length
    exceed = response_lengths.float() - expected
    return torch.clamp(-exceed / buffer_length * factor, max=0.0)


def penalties(episodes: Sequence[Episode], cfg: Any) -> torch.Tensor:
    """[E] DAPO's overlong penalty of each episode (``reward.overlong_buffer``; 0 when it is off)."""
    ob = cfg.reward.overlong_buffer
    lengths = torch.tensor([len(e.rollout.response_ids) for e in episodes])
    if not ob.enable:
        return torch.zeros(len(episodes))
    return overlong_penalty(lengths, cfg.data.max_response_length, ob.len, ob.penalty_factor)


def group_metric(metric: str, penalty: Callable[[Episode], float] | None = None) -> Callable[[Episode], float]:
    """What DAPO's dynamic sampling compares within a group (``algorithm.filter_groups.metric``), as verl reads it:
    ``score`` (also ``reward``, ``seq_reward``) is the reward; ``seq_final_reward`` the reward plus ``penalty``
    (DAPO's overlong penalty, when on); ``acc`` the reward functions' ``acc`` field, or the reward of an episode
    whose rewards return a number (verl's dapo reward manager does so); any other name a field of the reward
    functions' dict results. A name an episode lacks is an error naming the fields it has."""
    if metric in SCORE_METRICS:
        return lambda e: e.score
    if metric == FINAL_METRIC:
        return lambda e: e.score + (penalty(e) if penalty is not None else 0.0)

    def field_of(e: Episode) -> float:
        if metric == "acc" and metric not in e.details:
            return e.score
        if metric not in e.details:
            have = ", ".join(sorted(e.details)) or "none"
            raise ConfigError(  # a one-line error at the command line, not a traceback
                f"algorithm.filter_groups.metric is {metric!r}, but the reward of data_source "
                f"{e.prompt.sample.data_source!r} returns no such field (its fields: {have}); use score, or a "
                "field every reward returns in its dict"
            )
        return float(e.details[metric])

    return field_of


def check_group_metric(metric: str, routes: dict[str, list[Any]]) -> None:
    """At start: ``algorithm.filter_groups.metric`` names a field that the rewards of some data source declare they
    never return (:attr:`plugrl.specs.RewardSpec.fields`) is a :class:`ConfigError`. ``routes``: each data source's
    reward specs. Rewards that declare nothing are checked when their first results come."""
    if metric in (*SCORE_METRICS, FINAL_METRIC, "acc"):
        return
    for data_source, specs in sorted(routes.items()):
        if specs and all(s.fields is not None and metric not in s.fields for s in specs):
            have = ", ".join(sorted({f for s in specs for f in (s.fields or ())})) or "none: they return a number"
            raise ConfigError(
                f"algorithm.filter_groups.metric is {metric!r}, but the rewards of data_source {data_source!r} "
                f"({', '.join(s.name for s in specs)}) return no such field (their fields: {have}); use score "
                "(the reward), acc, or a field they return"
            )


def varied_groups(record: StepRecord, metric: str, penalty: Callable[[Episode], float] | None = None) -> list[int]:
    """Indices of the groups whose episodes differ in ``metric``: the groups DAPO keeps (a group whose
    episodes all agree has zero advantage under group-relative estimators: nothing to learn)."""
    value = group_metric(metric, penalty)
    values = [[value(e) for e in group] for group in record.groups]
    return [g for g, v in enumerate(values) if max(v) > min(v)]


def collect(generate: Callable[[int], StepRecord], want: int, cfg: Any, metrics: dict[str, float]) -> StepRecord:
    """This rank's ``want`` groups of a step whose ``filter_groups.metric`` varies: ``generate(round)`` scores a
    round's prompts, round 0 first; further rounds refill until every rank has ``want`` groups or
    ``max_num_gen_batches`` rounds ran (0: no limit, verl). The reward metrics stay those of the first round (the
    policy's unfiltered performance). A step where every group agreed trains on the last round's first groups."""
    fg = cfg.algorithm.filter_groups
    first = record = generate(0)
    seen, rounds = len(record.prompts), 1

    def penalty(e: Episode) -> float:
        return float(penalties([e], cfg)[0])

    kept = record.select_groups(varied_groups(record, fg.metric, penalty)[:want])
    limit = fg.max_num_gen_batches or float("inf")
    while all_reduce([float(len(kept.prompts) >= want)], op="min")[0] == 0 and rounds < limit:
        last = generate(rounds)
        rounds, seen = rounds + 1, seen + len(last.prompts)
        varied = varied_groups(last, fg.metric, penalty)
        kept = kept.extend(last.select_groups(varied[: want - len(kept.prompts)]))
        record = last
    metrics["dapo/gen_rounds"] = float(rounds)
    metrics["dapo/kept_groups"] = float(len(kept.prompts))
    metrics["dapo/kept_frac"] = len(kept.prompts) / seen
    if not kept.prompts:  # every group agreed: nothing to learn from; train on the last round's first groups
        last = record.select_groups(range(min(want, len(record.prompts))))
        return StepRecord(last.prompts, last.episodes, last.n, first.reward_metrics)
    return kept
