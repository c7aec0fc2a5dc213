"""Countdown problems: the seeded generator, the dataset and the prompt templates."""

from __future__ import annotations

import hashlib
import json
import math
import operator
import random
import reprlib
from collections.abc import Iterator, Mapping
from typing import Any

from plugrl.specs import dataset, template

DATA_SOURCE = "countdown"
ALLOWED_OPS = "+-*/"
MAX_ATTEMPTS = 10_000  # per row; only absurd option combinations get near this

# how an unusable ground truth is shown in errors: 4 levels deep at most (reprlib: no recursion past them)
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 4, 200, 200

R1_PREAMBLE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer."
)


def _clean_number(x: Any) -> int | float:
    """``3``, ``3.0``, ``numpy.int64(3)`` -> ``3``; non-integral values stay floats; NaN/inf are refused."""
    if isinstance(x, bool):
        raise TypeError(f"{x!r} is not a number")
    try:
        return operator.index(x)
    except TypeError:
        pass
    f = float(x)
    if not math.isfinite(f):
        raise ValueError(f"{x!r} is not finite")
    return int(f) if f.is_integer() else f


def parse_ground_truth(ground_truth: Any, numbers: Any = None) -> tuple[int | float, list[int | float]]:
    """``(target, numbers)`` from a dict, or from the same dict JSON-encoded (verl style).

    ``numbers`` (a row's TinyZero ``nums`` column) completes a ground truth that is the target alone, as
    ``data.answer_field: target`` makes it.
    """
    gt = ground_truth
    if isinstance(gt, (str, bytes)):
        try:
            gt = json.loads(gt)
        except RecursionError:  # JSON nested deeper than Python's recursion limit
            raise ValueError(
                "countdown ground_truth is JSON nested too deep to read; it must be {'target': t, 'numbers': [...]}"
            ) from None
        except ValueError as e:
            raise ValueError(f"countdown ground_truth is not valid JSON: {e}") from None
    if numbers is not None and not isinstance(gt, Mapping):  # the target alone
        gt = {"target": gt, "numbers": numbers}
    if not isinstance(gt, Mapping) or "target" not in gt or "numbers" not in gt:
        raise ValueError(
            f"countdown ground_truth must hold 'target' and 'numbers', got {_SHOWN.repr(ground_truth)}; or leave it "
            "out and give the row TinyZero's 'target' and 'nums' columns"
        )
    try:
        return _clean_number(gt["target"]), [_clean_number(n) for n in gt["numbers"]]
    except (TypeError, ValueError) as e:
        raise ValueError(f"countdown ground_truth has a non-numeric target or numbers: {e}") from None


def row_problem(
    ground_truth: Any, target: Any = None, nums: Any = None, numbers: Any = None
) -> tuple[int | float, list[int | float]]:
    """``(target, numbers)`` of a row: from its ground truth, else from its TinyZero columns ``target`` and
    ``nums`` (or ``numbers``), which is how the raw TinyZero data (``Jiayi-Pan/Countdown-Tasks-3to4``) and
    the single-file trainers built on it hold a problem."""
    nums = nums if nums is not None else numbers
    if ground_truth is not None:
        return parse_ground_truth(ground_truth, nums)
    if target is None or nums is None:
        missing = " and ".join(repr(k) for k, v in (("target", target), ("nums", nums)) if v is None)
        raise ValueError(
            f"countdown: the row has no ground truth and no {missing} column; give it TinyZero's 'target' and "
            "'nums' columns, or a ground truth {'target': ..., 'numbers': [...]} ('ground_truth' or verl's "
            "'reward_model.ground_truth')"
        )
    return parse_ground_truth({"target": target, "numbers": nums})


def countdown_instruction(numbers: list[int | float], target: float) -> str:
    """The TinyZero countdown task statement."""
    return (
        f"Using the numbers {list(numbers)}, create an equation that equals {target}. "
        "You may use the basic arithmetic operations (+, -, *, /), and each number can only be used once. "
        "Show your work in <think> </think> tags, and give the final equation in <answer> </answer> tags, "
        "for example <answer> (1 + 2) / 3 </answer>."
    )


def countdown_messages(numbers: list[int | float], target: float) -> list[dict[str, str]]:
    return [{"role": "user", "content": countdown_instruction(numbers, target)}]


def sample_problem(sample: Any) -> tuple[int | float, list[int | float]]:
    """``(target, numbers)`` of a :class:`plugrl.data.Sample` (or of a row mapping): its ground truth, else
    its row's TinyZero columns (:func:`row_problem`)."""
    if isinstance(sample, Mapping):
        gt, row = sample.get("ground_truth"), sample
    else:
        gt, row = sample.ground_truth, getattr(sample, "row", None) or {}
    return row_problem(gt, row.get("target"), row.get("nums"), row.get("numbers"))


@template("countdown")
def countdown_template(sample: Any) -> list[dict[str, str]]:
    """Chat messages for a chat/instruct model."""
    target, numbers = sample_problem(sample)
    return countdown_messages(numbers, target)


@template("countdown_r1")
def countdown_r1_template(sample: Any) -> str:
    """Raw text in the R1/TinyZero base-model style, ending inside an opened ``<think>``."""
    target, numbers = sample_problem(sample)
    return (
        f"{R1_PREAMBLE}\nUser: {countdown_instruction(numbers, target)}\n"
        "Assistant: Let me solve this step by step.\n<think>"
    )


def split_seed(seed: int, split: str) -> int:
    """A 64-bit seed derived from ``seed`` and the split name (stable across processes)."""
    digest = hashlib.sha256(f"plugrl-countdown:{int(seed)}:{split}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _apply(op: str, a: int, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b if b != 0 and a % b == 0 else None  # "/" only when exact


def _combine(rng: random.Random, numbers: list[int], ops: str, max_target: int) -> int | None:
    """Fold ``numbers`` (each used once, in a random order and tree shape) with random ops.

    Each step picks an op at random among those that are valid there (division only when
    exact; the last step also needs a result in ``[1, max_target]``). None if no op fits.
    """
    pool = numbers[:]
    rng.shuffle(pool)
    while len(pool) > 1:
        i = rng.randrange(len(pool) - 1)
        a, b = pool[i], pool[i + 1]
        last = len(pool) == 2
        results = [v for op in ops if (v := _apply(op, a, b)) is not None and (not last or 1 <= v <= max_target)]
        if not results:
            return None
        pool[i : i + 2] = [rng.choice(results)]
    return pool[0]


def generate_problem(
    rng: random.Random, *, min_numbers: int, max_numbers: int, max_number: int, max_target: int, ops: str
) -> tuple[list[int], int]:
    """Draw numbers in ``[1, max_number]`` and a target in ``[1, max_target]`` reachable from them."""
    k = rng.randint(min_numbers, max_numbers)
    for _ in range(MAX_ATTEMPTS):
        numbers = [rng.randint(1, max_number) for _ in range(k)]
        target = _combine(rng, numbers, ops, max_target)
        if target is not None:
            return numbers, target
    raise ValueError(
        f"countdown: no reachable target in [1, {max_target}] after {MAX_ATTEMPTS} draws "
        f"(numbers={min_numbers}..{max_numbers} up to {max_number}, ops={ops!r}); loosen the options"
    )


def _rows(split: str, size: int, rng: random.Random, gen: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for index in range(size):
        numbers, target = generate_problem(rng, **gen)
        yield {
            "prompt": countdown_messages(numbers, target),
            "data_source": DATA_SOURCE,
            "ground_truth": {"target": target, "numbers": list(numbers)},
            "extra_info": {"split": split, "index": index},
            "nums": list(numbers),
            "target": target,
        }


@dataset("countdown")
def countdown_dataset(
    split: str,
    *,
    size: int = 10000,
    seed: int = 0,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 99,
    max_target: int = 100,
    ops: str = "+-*/",
    **_: Any,
) -> Iterator[dict[str, Any]]:
    """``size`` countdown problems for ``split``, generated lazily and deterministically.

    The stream is seeded from ``seed`` and the split name, so every split differs and
    row ``i`` is the same for any ``size > i``. ``ops`` only restricts how targets are
    built (repeat a character to weight it, e.g. ``"++-*/"``); answers may always use
    all four operations.
    """
    if size < 0:
        raise ValueError(f"countdown: size must be >= 0, got {size}")
    if not 2 <= min_numbers <= max_numbers:
        raise ValueError(f"countdown: need 2 <= min_numbers <= max_numbers, got {min_numbers}, {max_numbers}")
    if max_number < 1 or max_target < 1:
        raise ValueError(f"countdown: max_number and max_target must be >= 1, got {max_number}, {max_target}")
    if not ops or set(ops) - set(ALLOWED_OPS):
        raise ValueError(f"countdown: ops must be a non-empty subset of {ALLOWED_OPS!r}, got {ops!r}")
    gen = {
        "min_numbers": min_numbers,
        "max_numbers": max_numbers,
        "max_number": max_number,
        "max_target": max_target,
        "ops": ops,
    }
    return _rows(split, size, random.Random(split_seed(seed, split)), gen)
