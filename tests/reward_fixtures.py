"""Reward functions for tests/test_rewards.py, and helpers the reward plugins' tests share.

Module-level, so the reward worker processes (spawn/forkserver) can import them by
reference. The async and batch functions run in the test process, so they may
record what they saw in module globals.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeSample:
    """Stand-in for plugrl.data.Sample (same fields)."""

    prompt: Any
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    uid: str = ""


def exact(completion, ground_truth):
    return float(completion.strip() == str(ground_truth))


def behave(completion, ground_truth):
    """Misbehaves on request: the completion says how."""
    if completion == "hang":
        time.sleep(60)
    elif completion == "slow":
        time.sleep(0.3)
    elif completion == "raise":
        raise ValueError("boom")
    elif completion == "crash":
        os._exit(1)
    elif completion == "nan":
        return math.nan
    elif completion == "inf":
        return {"score": math.inf}
    elif completion == "text":
        return "1.0"
    elif completion == "none":
        return None
    elif completion == "nodict":
        return {"value": 1.0}
    elif completion == "exit":
        raise SystemExit(3)
    return float(completion == str(ground_truth))


def worker_pid(completion, ground_truth):
    """:func:`behave`, plus the id of the process that ran it (tells whether the pool's workers were replaced)."""
    return {"score": behave(completion, ground_truth), "pid": os.getpid()}


def length_bonus(completion, ground_truth, scale=1.0):
    return {"score": scale * min(len(completion), 10) / 10, "length": len(completion)}


def uses_context(completion, ground_truth, data_source, prompt, nums, target, extra_info=None):
    seen = f"{data_source}|{prompt}|{nums}|{target}|{extra_info}"
    return {"score": float(sum(nums) == target), "seen": seen}


def takes_kwargs(completion, ground_truth, **kwargs):
    return {"score": 0.5, "keys": ",".join(sorted(kwargs))}


def sample_kind(completion, ground_truth, sample):
    return {"score": 1.0, "kind": type(sample).__name__, "uid": sample.uid}


def constant(completion, ground_truth):
    return 0.25


def no_ground_truth(completion):  # a format-style reward: no ground truth needed
    return 1.0


# ---- async: runs on the runner's event loop in the test process

ASYNC_STATE = {"running": 0, "peak": 0, "calls": 0}


async def async_judge(completion, ground_truth, delay=0.2):
    ASYNC_STATE["calls"] += 1
    ASYNC_STATE["running"] += 1
    ASYNC_STATE["peak"] = max(ASYNC_STATE["peak"], ASYNC_STATE["running"])
    try:
        if completion == "hang":
            await asyncio.sleep(60)
        await asyncio.sleep(delay)
        if completion == "raise":
            raise RuntimeError("judge unavailable")
        return {"score": float(completion == str(ground_truth)), "judge": "fake"}
    finally:
        ASYNC_STATE["running"] -= 1


# ---- TRL style: one call per batch, in the test process

TRL_CALLS: list[dict[str, Any]] = []


def trl_accuracy(prompts, completions, solution, **kwargs):
    """TRL-style: None where the sample has no solution."""
    TRL_CALLS.append({"prompts": prompts, "completions": completions, "solution": solution, "kwargs": kwargs})
    out = []
    for c, s in zip(completions, solution, strict=True):
        text = c[0]["content"] if isinstance(c, list) else c
        out.append(None if s is None else float(text == s))
    return out


def trl_wrong_length(prompts, completions, **kwargs):
    return [1.0]


def trl_strict(completions, solution):  # no **kwargs: gets only what it names
    return [float(c == s) for c, s in zip(completions, solution, strict=True)]


# ---- verl style


def verl_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0):
    if "####" not in solution_str:
        return format_score
    answer = solution_str.split("####")[-1].strip()
    split = (extra_info or {}).get("split")
    return {"score": float(answer == ground_truth), "acc": answer == ground_truth, "split": split}


async def verl_async_score(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0)
    return float(solution_str == ground_truth)


def best_time(fn, repeat: int = 3) -> float:
    """Fastest of ``repeat`` runs of ``fn``, so a GC pause or a busy machine doesn't fail a check that hostile
    input is rejected quickly (a bound against denial of service, not a speed measurement)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
