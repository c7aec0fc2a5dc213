"""plugrl plugin: ``shapes``, a synthetic vision task generated on the fly: how many squares are in the image?

Each row is a white image with 1 to ``max_count`` filled squares of one colour, drawn into distinct cells of a
grid so they never touch; the prompt asks for their number, the ground truth is that number, and the data
source ``math`` routes the rows to ``plugrl-rewards-math``'s accuracy reward (the answer in ``<answer>`` tags
or ``\\boxed{}``). Rows hold the image as a ``PIL.Image`` in ``images`` and mark its place with ``<image>``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

from PIL import Image, ImageDraw

from plugrl import dataset

COLORS = {"red": (215, 40, 40), "green": (40, 150, 60), "blue": (40, 80, 210)}
QUESTION = "<image>How many {color} squares are in the image? Answer with the number in <answer> </answer> tags."


def split_seed(seed: int, split: str) -> int:
    """A 64-bit seed from ``seed`` and the split name: splits differ, runs repeat."""
    return int.from_bytes(hashlib.sha256(f"plugrl-shapes:{int(seed)}:{split}".encode()).digest()[:8], "big")


def draw_squares(rng: random.Random, count: int, color: str, image_size: int, grid: int) -> Image.Image:
    """``count`` squares of ``color`` in distinct cells of a ``grid`` x ``grid`` layout, each placed at random
    within its cell, a pixel short of its right and bottom edges (so no two squares touch)."""
    img = Image.new("RGB", (image_size, image_size), "white")
    draw = ImageDraw.Draw(img)
    cell = image_size // grid
    side = max(2, cell * 2 // 3)
    for slot in rng.sample(range(grid * grid), count):
        x0 = (slot % grid) * cell + rng.randint(0, cell - side - 1)
        y0 = (slot // grid) * cell + rng.randint(0, cell - side - 1)
        draw.rectangle([x0, y0, x0 + side - 1, y0 + side - 1], fill=COLORS[color])
    return img


@dataset("shapes")
def shapes_dataset(
    split: str,
    *,
    size: int = 1000,
    seed: int = 0,
    max_count: int = 4,
    image_size: int = 64,
    grid: int = 3,
    colors: str = "red",
) -> Iterator[dict[str, Any]]:
    """``size`` rows for ``split``, generated lazily and deterministically (row ``i`` is the same for any
    ``size > i``). ``colors``: comma-separated names from red, green, blue (one drawn per row)."""
    names = [c.strip() for c in colors.split(",") if c.strip()]
    if size < 0:
        raise ValueError(f"shapes: size must be >= 0, got {size}")
    if not names or set(names) - set(COLORS):
        raise ValueError(f"shapes: colors must name some of {', '.join(COLORS)}, got {colors!r}")
    if not 1 <= max_count <= grid * grid:
        raise ValueError(f"shapes: max_count must be in 1..grid*grid ({grid * grid}), got {max_count}")
    if image_size < 3 * grid:
        raise ValueError(f"shapes: image_size must be at least 3 x grid ({3 * grid}), got {image_size}")
    return _rows(split, size, random.Random(split_seed(seed, split)), names, max_count, image_size, grid)


def _rows(split, size, rng, names, max_count, image_size, grid) -> Iterator[dict[str, Any]]:
    for index in range(size):
        count = rng.randint(1, max_count)
        color = rng.choice(names)
        yield {
            "prompt": [{"role": "user", "content": QUESTION.format(color=color)}],
            "images": [draw_squares(rng, count, color, image_size, grid)],
            "ground_truth": str(count),
            "data_source": "math",
            "extra_info": {"split": split, "index": index, "color": color},
        }


__all__ = ["COLORS", "draw_squares", "shapes_dataset"]
