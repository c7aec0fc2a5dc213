"""The step record: episodes grouped by prompt, selected by whole groups, and DAPO's group filter."""

from __future__ import annotations

import pytest

from plugrl.data import Sample
from plugrl.episodes import Episode, StepRecord
from plugrl.prompts import EncodedPrompt
from plugrl.rollout import Rollout
from plugrl_dapo.sampling import varied_groups


def record(scores: list[list[float]], details: list[list[dict]] | None = None) -> StepRecord:
    prompts = [
        EncodedPrompt(Sample(prompt=f"q{g}", data_source="src", ground_truth=""), f"q{g}", [g])
        for g in range(len(scores))
    ]
    episodes = [
        Episode(
            p,
            Rollout([g], [g, j], None, "length" if j == 0 else "stop"),
            f"a{g}{j}",
            s,
            (details or {}) and details[g][j],
        )
        for g, (p, group) in enumerate(zip(prompts, scores, strict=True))
        for j, s in enumerate(group)
    ]
    return StepRecord(prompts, episodes, len(scores[0]), {"reward/mean": 0.5})


def test_groups_and_selection_keep_episodes_with_their_prompt():
    r = record([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert [[e.text for e in g] for g in r.groups] == [["a00", "a01"], ["a10", "a11"], ["a20", "a21"]]
    picked = r.select_groups([2, 0])
    assert [p.text for p in picked.prompts] == ["q2", "q0"]
    assert picked.texts == ["a20", "a21", "a00", "a01"] and picked.scores == [0.0, 1.0, 1.0, 0.0]
    assert all(e.prompt is p for p, g in zip(picked.prompts, picked.groups, strict=True) for e in g)
    both = picked.extend(r.select_groups([1]))
    assert both.texts[-2:] == ["a10", "a11"] and both.reward_metrics == {"reward/mean": 0.5}
    assert [e.truncated for e in r.episodes[:2]] == [True, False]
    with pytest.raises(ValueError, match="3 episodes for 2 prompts x n=2"):
        StepRecord(r.prompts[:2], r.episodes[:3], 2)


def test_dapo_keeps_the_groups_whose_metric_varies():
    r = record([[1.0, 0.0], [1.0, 1.0], [0.5, 0.5], [0.0, 0.2]])
    assert varied_groups(r, "score") == [0, 3]
    assert varied_groups(r, "seq_reward") == [0, 3]  # verl's name for the same
    # verl's usual `metric: acc`: a field of the reward's dict result, which may agree where scores differ
    acc = [[{"acc": 1}, {"acc": 0}], [{"acc": 1}, {"acc": 1}], [{"acc": 0}, {"acc": 1}], [{"acc": 0}, {"acc": 0}]]
    assert varied_groups(record([[1.0, 0.0], [1.0, 1.0], [0.5, 0.5], [0.0, 0.2]], acc), "acc") == [0, 2]


def test_a_metric_the_rewards_do_not_return_names_what_they_do():
    r = record([[1.0, 0.0]], [[{"acc": 1, "format": 1}, {"acc": 0, "format": 0}]])
    with pytest.raises(
        ValueError,
        match=r"metric is 'accuracy', but the reward of data_source 'src' returns no such "
        r"field \(its fields: acc, format\)",
    ):
        varied_groups(r, "accuracy")
