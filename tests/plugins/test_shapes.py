"""plugrl-datasets-shapes: the synthetic image-counting task of examples/vlm_grpo.yaml."""

from __future__ import annotations

import pytest

import plugrl_math
import plugrl_shapes
from plugrl_shapes import COLORS, shapes_dataset
from plugrl_testing import check_dataset


def _squares(img, color) -> int:
    """The number of squares of ``color``: the pixels of that colour that start a square (none above or left)."""
    px = img.load()
    w, h = img.size
    want = COLORS[color]
    return sum(
        1
        for x in range(w)
        for y in range(h)
        if px[x, y] == want and (x == 0 or px[x - 1, y] != want) and (y == 0 or px[x, y - 1] != want)
    )


def test_each_image_holds_as_many_squares_as_its_answer_says():
    rows = list(shapes_dataset("train", size=40, seed=3, max_count=4, colors="red,green,blue"))
    counts = set()
    for row in rows:
        color = row["extra_info"]["color"]
        (img,) = row["images"]
        assert img.size == (64, 64) and row["prompt"][0]["content"].startswith("<image>How many " + color)
        assert _squares(img, color) == int(row["ground_truth"])
        counts.add(int(row["ground_truth"]))
    assert counts == {1, 2, 3, 4}


def test_rows_repeat_for_a_seed_and_differ_between_splits_and_seeds():
    def first(split, seed):
        return [r["images"][0].tobytes() for r in shapes_dataset(split, size=5, seed=seed)]

    assert first("train", 0) == first("train", 0)
    assert first("train", 0) != first("test", 0) and first("train", 0) != first("train", 1)


def test_the_kit_loads_the_rows_as_a_run_does_and_routes_them_to_the_math_reward():
    samples = check_dataset("shapes", options={"size": 6}, n=6, plugin=[plugrl_shapes, plugrl_math])
    assert all(len(s.images) == 1 and s.data_source == "math" for s in samples)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"size": -1}, "size must be >= 0"),
        ({"colors": "pink"}, "colors must name some of red, green, blue"),
        ({"max_count": 10}, "max_count must be in 1..grid\\*grid \\(9\\)"),
        ({"image_size": 6}, "image_size must be at least 3 x grid"),
    ],
)
def test_bad_options_name_the_option(options, error):
    with pytest.raises(ValueError, match=error):
        shapes_dataset("train", **options)
