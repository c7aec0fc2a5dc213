"""Grouping each prompt's responses by solution strategy with a plugin's classifier.

Used by estimators registered with ``needs_solution_groups`` (creativity-weighted
GRPO). Prompts are classified concurrently; a classifier that raises or answers
with the wrong number of ids is retried, then replaced by one group per response
and counted, so training never stops for it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from plugrl.specs import ClassifierSpec

log = logging.getLogger("plugrl.classify")


def _valid(ids: Any, n: int) -> list[int] | None:
    if not isinstance(ids, (list, tuple)) or len(ids) != n:
        return None
    try:
        out = [int(i) for i in ids]
    except (TypeError, ValueError):
        return None
    return out if all(float(a) == float(b) for a, b in zip(out, ids, strict=True)) else None


def _attempts(spec: ClassifierSpec, prompt: str, responses: Sequence[str], options: dict, retries: int):
    """Run ``spec.fn`` up to ``retries`` times; (ids or None, attempts used, last error)."""
    error = ""
    for attempt in range(1, retries + 1):
        try:
            result = spec.fn(prompt, list(responses), **options)
            if inspect.isawaitable(result):
                result = asyncio.run(result)
            ids = _valid(result, len(responses))
            if ids is not None:
                return ids, attempt, ""
            error = f"returned {result!r:.200}, not {len(responses)} integer group ids"
        except Exception as e:  # any failure of the classifier is retried, then replaced
            error = f"{type(e).__name__}: {e}"
    return None, retries, error


def classify_groups(
    spec: ClassifierSpec,
    prompts: Sequence[str],
    responses: Sequence[Sequence[str]],
    *,
    options: dict[str, Any],
    concurrency: int,
    retries: int,
) -> tuple[list[int], dict[str, float]]:
    """Strategy group ids for every response (flattened in prompt order, unique across prompts), and metrics.

    ``responses[i]`` are the responses to ``prompts[i]``. Metrics: ``classifier/failures``
    (prompts that fell back to one group per response), ``classifier/retries``,
    ``classifier/groups_mean`` (distinct strategies per prompt).
    """
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        jobs = zip(prompts, responses, strict=True)
        results = list(pool.map(lambda job: _attempts(spec, job[0], job[1], options, retries), jobs))
    flat: list[int] = []
    failures, extra_attempts, groups = 0, 0, []
    offset = 0
    for (ids, attempts, error), resp in zip(results, responses, strict=True):
        extra_attempts += attempts - 1
        if ids is None:
            failures += 1
            log.warning(
                "solution classifier %r failed %d times (%s); one group per response", spec.name, attempts, error
            )
            ids = list(range(len(resp)))
        # renumber 0..k-1 within the prompt, then shift so ids never collide across prompts
        remap: dict[int, int] = {}
        local = [remap.setdefault(i, len(remap)) for i in ids]
        groups.append(len(remap))
        flat += [offset + i for i in local]
        offset += len(resp)
    metrics = {
        "classifier/failures": float(failures),
        "classifier/retries": float(extra_attempts),
        "classifier/groups_mean": sum(groups) / len(groups) if groups else 0.0,
    }
    return flat, metrics
