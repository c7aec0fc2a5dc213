"""Grouping each prompt's responses by solution strategy with a plugin's classifier.

Used by estimators registered with ``needs_solution_groups`` (creativity-weighted
GRPO). At start-up :func:`resolve_classifier` settles ``algorithm.classifier``: the
default ``openai`` when none is set, ``off`` to switch classifying off. During the
run prompts are classified concurrently; a classifier that raises or answers with the
wrong number of ids is retried, then replaced by one group per response and counted,
so training never stops for it (whether its server answers at all is checked at start,
by the classifier's plugin).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from plugrl.plugins import PluginError, first_party, installed_plugins, load_plugins
from plugrl.policy_losses import BUILTIN
from plugrl.specs import ClassifierSpec, Registry

log = logging.getLogger("plugrl.classify")

OFF = "off"  # algorithm.classifier: off -- classifying off, every response its own group (not null: null is unset)
DEFAULT = "openai"  # the classifier of estimators that group by strategy when algorithm.classifier is not set
DEFAULT_PLUGIN = "classifier_openai"  # the plugin that registers it
DEFAULT_PACKAGE = "plugrl-classifier-openai"  # and the package that installs that plugin


def one_group_per_response(prompt: str, responses: list[str], **options: Any) -> list[int]:
    """The classifier ``off`` (``algorithm.classifier: off``): every response is a strategy of its own."""
    return list(range(len(responses)))


def resolve_classifier(cfg: Any, registry: Registry, *, training: bool) -> Registry:
    """Settle ``cfg.algorithm.classifier`` right after the plugins load, before the checks of the estimator and
    the plugins' options: afterwards it names the classifier the run calls, or is None when the run calls none.

    - An estimator registered with ``needs_solution_groups`` and no classifier set: the default, ``openai``. When no
      loaded plugin registers it (also when it is named), its plugin ``classifier_openai`` is added to
      ``cfg.plugins`` and the plugins are loaded again (the registry returned); when that plugin is not installed,
      a :class:`PluginError` naming ``algorithm.classifier`` and the package to install.
    - ``off``: classifying is off; the kernel's classifier ``off`` gives every response a group of its own, and
      one log line says so.
    - Evaluation, or an estimator that groups nothing: None (a classifier named for such an estimator gets a
      warning), so no plugin checks a classifier the run never calls.

    An estimator that is not registered is left to :func:`plugrl.plugins.check_algorithm` to report.
    """
    algorithm = cfg.algorithm
    estimator = registry.estimators.get(algorithm.adv_estimator)
    if estimator is None:
        return registry
    if not training or not estimator.needs_solution_groups:
        if training and algorithm.classifier not in (None, OFF):
            log.warning(
                "algorithm.classifier %r is not used: algorithm.adv_estimator %r does not group responses by "
                "strategy (grpo_weighted_add and grpo_weighted_mul do); remove algorithm.classifier",
                algorithm.classifier,
                estimator.name,
            )
        algorithm.classifier = None  # nothing calls it: plugrl eval, or an estimator that groups nothing
        return registry
    if algorithm.classifier == OFF:
        owner = registry.classifiers.get(OFF)
        if owner is not None and owner.plugin != BUILTIN:
            raise PluginError(
                f"plugin {owner.plugin!r} registers a solution classifier named {OFF!r}, the name that switches "
                f"classifying off (algorithm.classifier: {OFF}): the plugin must rename it"
            )
        registry.classifiers[OFF] = ClassifierSpec(OFF, one_group_per_response, plugin=BUILTIN)
        log.info(
            "algorithm.classifier is off: classifying is off, every response is a strategy group of its own for "
            "%s (creativity-weighted GRPO: every weight 1, so grpo_weighted_mul is plain grpo, grpo_weighted_add "
            "grpo + 1)",
            estimator.name,
        )
        return registry
    named = algorithm.classifier
    if named not in (None, DEFAULT):
        return registry  # check_algorithm checks that it is registered
    if DEFAULT not in registry.classifiers and DEFAULT_PLUGIN not in registry.plugins:
        if DEFAULT_PLUGIN not in {p.name for p in installed_plugins()}:
            why = f"is not set, so it defaults to {DEFAULT!r}" if named is None else f"is {DEFAULT!r}"
            folder = first_party().get(DEFAULT_PLUGIN, (None, None))[1]
            checkout = f", or pip install -e {folder} in a plugrl checkout" if folder else ""
            raise PluginError(
                f"algorithm.adv_estimator {estimator.name!r} groups responses by strategy and algorithm.classifier "
                f"{why}, the classifier of the plugin {DEFAULT_PLUGIN}, which is not installed: install it (pip "
                f"install {DEFAULT_PACKAGE}{checkout}), set algorithm.classifier to a classifier a plugin in "
                f"`plugins:` registers, or set algorithm.classifier: {OFF} to train without one (every response a "
                "group of its own)"
            )
        cfg.plugins = [*cfg.plugins, DEFAULT_PLUGIN]  # in the run's config.yaml too: what the run loaded
        registry = load_plugins(cfg.plugins)
    if named is None:
        # written as null (or None, YAML's and Python's null here): it reads like "no classifier", which is `off`
        written = "classifier" in algorithm.model_fields_set
        algorithm.classifier = DEFAULT
        log.log(
            logging.WARNING if written else logging.INFO,
            "algorithm.classifier %s: %s groups responses by strategy with the default classifier %r (plugin %s; its "
            "model and server: algorithm.classifier_options); set algorithm.classifier: %s to switch it off",
            "is null, which means not set" if written else "not set",
            estimator.name,
            DEFAULT,
            DEFAULT_PLUGIN,
            OFF,
        )
    return registry


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
