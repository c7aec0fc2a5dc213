"""Grouping responses by strategy with a pluggable classifier: ids, retries, fallback."""

from __future__ import annotations

from plugrl.classify import classify_groups
from plugrl.specs import ClassifierSpec


def by_first_word(prompt, responses, **_):
    return [hash(r.split()[0]) % 1000 for r in responses]


def test_groups_are_renumbered_and_unique_across_prompts():
    spec = ClassifierSpec("words", by_first_word)
    ids, m = classify_groups(
        spec, ["p1", "p2"], [["add 1", "add 2", "mul 3"], ["sub 1", "sub 2"]], options={}, concurrency=2, retries=3
    )
    # prompt 1: {add, add, mul} -> 0, 0, 1; prompt 2 starts at offset 3: {sub, sub} -> 3, 3
    assert ids == [0, 0, 1, 3, 3]
    assert m == {"classifier/failures": 0.0, "classifier/retries": 0.0, "classifier/groups_mean": 1.5}


def test_retries_then_falls_back_to_one_group_per_response():
    calls = {"n": 0}

    def flaky(prompt, responses, **_):
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionError("server down")
        return [0] * len(responses)

    ids, m = classify_groups(ClassifierSpec("flaky", flaky), ["p"], [["a", "b"]], options={}, concurrency=1, retries=3)
    assert ids == [0, 0] and m["classifier/retries"] == 2 and m["classifier/failures"] == 0

    def garbage(prompt, responses, **_):
        return ["x"]  # wrong length and type

    ids, m = classify_groups(
        ClassifierSpec("g", garbage), ["p"], [["a", "b", "c"]], options={}, concurrency=1, retries=2
    )
    assert ids == [0, 1, 2] and m["classifier/failures"] == 1 and m["classifier/retries"] == 1


def test_async_classifier_and_options():
    async def by_option(prompt, responses, *, same: bool):
        return [0 if same else i for i in range(len(responses))]

    ids, _ = classify_groups(
        ClassifierSpec("a", by_option), ["p"], [["a", "b"]], options={"same": True}, concurrency=1, retries=1
    )
    assert ids == [0, 0]
