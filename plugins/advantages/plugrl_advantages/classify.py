"""Solution classifiers: each prompt's responses grouped by solution strategy, for the estimators that weigh rare
strategies (creativity-weighted GRPO, :mod:`plugrl_advantages.estimators.weighted`).

This plugin owns all of it; the kernel knows no classifier:

- the record :class:`ClassifierSpec` and its decorator :func:`solution_classifier`, with which a plugin registers a
  classifier (the kernel collects such records of a plugin's own kind in ``Registry.plugin_records``);
- the ``algorithm`` keys ``classifier``, ``classifier_options``, ``classifier_concurrency`` and
  ``classifier_retries``, declared by :class:`SolutionGroupsOptions`, the options of every estimator that groups
  responses by strategy (the kernel validates them as the estimator's options);
- at start, before any model loads (hooks :func:`plugrl_configure` and :func:`plugrl_check_config`): the default
  classifier ``openai`` when none is set (its plugin ``classifier_openai`` added to ``plugins:``), the switch
  ``off``, and the checks of the classifier named and of its options;
- each step (:func:`solution_groups`, called by the estimator through its step context): the prompts classified
  concurrently; a classifier that raises or answers with the wrong number of ids is retried, then replaced by one
  group per response and counted (``classifier/failures``), so training never stops for it (whether its server
  answers at all is checked at start, by the classifier's plugin).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from plugrl.hookspecs import hookimpl
from plugrl.specs import mark

if TYPE_CHECKING:
    from plugrl.algorithms import AdvantageBatch
    from plugrl.specs import EstimatorSpec, Registry

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("plugrl.advantages")

PLUGIN = "advantages"  # this plugin's entry-point name: the owner of the classifier `off`
OFF = "off"  # algorithm.classifier: off -- classifying off, every response its own group (not null: null is unset)
DEFAULT = "openai"  # the classifier of estimators that group by strategy when algorithm.classifier is not set
DEFAULT_PLUGIN = "classifier_openai"  # the plugin that registers it
KEYS = ("classifier", "classifier_options", "classifier_concurrency", "classifier_retries")
_OFF_SPELLINGS = ("off", "false", "none", "no")  # YAML reads off and no as false; none is the word, not null


@dataclass(frozen=True)
class ClassifierSpec:
    """A solution classifier: ``fn(prompt: str, responses: list[str], **options) -> list[int]``.

    Groups the responses to one prompt by solution strategy: one group id per response, equal ids for responses
    that take the same approach. May be ``async def``. ``options`` (a pydantic model) declares the keys of
    ``algorithm.classifier_options``: validated at start, before any model loads, and passed as keywords. It may
    raise; the call is then retried (``algorithm.classifier_retries``), and at last every response gets its own
    group and a failure is counted (``classifier/failures``).
    """

    label: ClassVar[str] = "classifiers"  # what `plugrl plugins` lists these records under

    name: str
    fn: Callable[..., Any]
    plugin: str = ""
    options: type[BaseModel] | None = None


def solution_classifier(name: str, *, options: type[BaseModel] | None = None) -> Callable[[F], F]:
    """Register ``fn(prompt, responses, **options) -> list[int]`` as the solution classifier called ``name``
    (``algorithm.classifier: <name>``); ``options`` models ``algorithm.classifier_options``. The function is left
    unchanged: the plugin loader finds the record marked on it in every plugin of ``plugins:``."""
    if options is not None and not (isinstance(options, type) and issubclass(options, BaseModel)):
        raise TypeError(f"solution_classifier(options=...) takes a pydantic BaseModel subclass, got {options!r}")
    return lambda fn: mark(fn, ClassifierSpec(name=name, fn=fn, options=options))


def one_group_per_response(prompt: str, responses: list[str], **options: Any) -> list[int]:
    """The classifier ``off`` (``algorithm.classifier: off``): every response is a strategy of its own."""
    return list(range(len(responses)))


OFF_SPEC = ClassifierSpec(OFF, one_group_per_response, plugin=PLUGIN)


def classifier_setting(value: Any) -> Any:
    """``algorithm.classifier`` as the run means it: one spelling for classifying off, ``off`` (YAML reads ``off``
    and ``no`` as the boolean false; ``none`` is the word, null is "not set"), anything else as written. True (YAML's
    ``on``, ``yes``) names no classifier: a ValueError saying what to write."""
    if value is False or (isinstance(value, str) and value.strip().lower() in _OFF_SPELLINGS):
        return OFF
    if value is True:
        raise ValueError(
            "classifier true (YAML reads on and yes as true) names no classifier: set algorithm.classifier to "
            f"a classifier's name ({DEFAULT}), leave it unset for that default, or set it to off to switch it off"
        )
    return value


class SolutionGroupsOptions(BaseModel):
    """The ``algorithm`` keys of an estimator that groups each prompt's responses by strategy. An estimator whose
    options model derives from this one gets the classifier settled and checked at start (this plugin's hooks) and
    its groups from :func:`solution_groups`."""

    # inf and nan kept as they are when the kernel writes the validated values back: classifier_options reach the
    # classifier's own check as written, which names a bad value (JSON's null would hide it)
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    classifier: str | None = Field(
        None,
        description=f"Solution classifier. Not set (or null): {DEFAULT} (plugin {DEFAULT_PLUGIN}, added to plugins "
        "when installed; default model gpt-4o-mini). off (also false, none) switches it off: every response is its "
        "own group, so every creativity weight is 1.",
    )
    classifier_options: dict[str, Any] = Field(default_factory=dict, description="Keyword options for it.")
    classifier_concurrency: int = Field(8, ge=1, description="Prompts classified at once.")
    classifier_retries: int = Field(3, ge=1, description="Attempts per prompt before one group per response.")

    @field_validator("classifier", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        return classifier_setting(value)


def groups_by_strategy(estimator: EstimatorSpec | None) -> bool:
    """Whether ``estimator`` groups responses by strategy: its options derive from :class:`SolutionGroupsOptions`."""
    options = getattr(estimator, "options", None)
    return isinstance(options, type) and issubclass(options, SolutionGroupsOptions)


def settings(config: Any) -> SolutionGroupsOptions:
    """The classifier keys of the ``algorithm`` section ``config``, validated (the kernel has done so at start-up and
    set them on ``config``; a config built by hand gets the defaults: no classifier)."""
    extra = getattr(config, "model_extra", None) or {}
    return SolutionGroupsOptions.model_validate({k: extra[k] for k in KEYS if k in extra})


def registered_classifiers(registry: Registry | None) -> dict[str, list[ClassifierSpec]]:
    """The classifiers the loaded plugins register, by name (a name with several records: a clash)."""
    found: dict[str, list[ClassifierSpec]] = {}
    for record in getattr(registry, "plugin_records", None) or ():
        if isinstance(record, ClassifierSpec):
            found.setdefault(record.name, []).append(record)
    return found


# --------------------------------------------------------------------------- start-up


def _grouping_estimators(registry: Registry) -> str:
    names = sorted(name for name, spec in registry.estimators.items() if groups_by_strategy(spec))
    return " and ".join(names) or "none loaded"


def _drop_unused(algorithm: Any, estimator: EstimatorSpec, registry: Registry, training: bool) -> None:
    """The classifier keys of a run that classifies nothing: for an estimator that groups nothing they are removed
    (named in a warning when a classifier was named for training); ``plugrl eval`` of a grouping estimator keeps
    them but calls no classifier (``classifier`` None), so no plugin checks one."""
    extra = algorithm.model_extra
    given = [k for k in KEYS if k in extra]
    declared = set(estimator.options.model_fields) if estimator.options is not None else set()
    if groups_by_strategy(estimator):
        extra["classifier"] = None  # plugrl eval: nothing is classified
        return
    if not given or declared & set(given):
        return  # nothing to drop, or the keys are that estimator's own (not ours)
    named = extra.get("classifier")
    if training and named is not None and classifier_setting_or_none(named) != OFF:
        log.warning(
            "algorithm.classifier %r is not used: algorithm.adv_estimator %r does not group responses by strategy "
            "(%s do); remove algorithm.classifier",
            named,
            estimator.name,
            _grouping_estimators(registry),
        )
    for key in given:
        del extra[key]


def classifier_setting_or_none(value: Any) -> Any:
    """:func:`classifier_setting`, None for a value it refuses (reported by the options' check)."""
    try:
        return classifier_setting(value)
    except ValueError:
        return None


@hookimpl
def plugrl_configure(config: Any, registry: Registry, training: bool) -> dict[str, str] | None:
    """Settle ``algorithm.classifier`` before the checks; ask for the default classifier's plugin when the run needs
    it. Training an estimator that groups by strategy: not set (or null) is the default ``openai`` (one log line
    says so; a warning for null, which reads like "no classifier"), and its plugin ``classifier_openai`` is asked
    for when no loaded plugin registers ``openai``. Otherwise (``plugrl eval``, another estimator) nothing calls a
    classifier: see :func:`_drop_unused`. Asked twice, it answers the same and logs nothing more."""
    algorithm = getattr(config, "algorithm", None)
    extra = getattr(algorithm, "model_extra", None)
    estimator = registry.estimators.get(getattr(algorithm, "adv_estimator", None))
    if extra is None or estimator is None:
        return None  # an estimator that is not registered: check_algorithm names it
    if not training or not groups_by_strategy(estimator):
        _drop_unused(algorithm, estimator, registry, training)
        return None
    named = classifier_setting_or_none(extra.get("classifier"))
    if named is None and extra.get("classifier") is not None:
        return None  # a value the options' check refuses (true)
    if named not in (None, DEFAULT):
        return None  # off, or another classifier: the check looks for it among the registered ones
    if named is None:
        written = "classifier" in extra  # null, written: reads like "no classifier", so a warning
        extra["classifier"] = DEFAULT
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
    if DEFAULT in registered_classifiers(registry) or DEFAULT_PLUGIN in registry.plugins:
        return None
    why = f"is not set, so it defaults to {DEFAULT!r}" if named is None else f"is {DEFAULT!r}"
    return {
        DEFAULT_PLUGIN: f"algorithm.adv_estimator {estimator.name!r} groups responses by strategy and "
        f"algorithm.classifier {why}, the classifier of the plugin {DEFAULT_PLUGIN}. To train without it, set "
        "algorithm.classifier to a classifier a plugin in `plugins:` registers, or algorithm.classifier: "
        f"{OFF} (every response a group of its own)"
    }


def _signature_problem(spec: ClassifierSpec) -> str | None:
    """Why ``spec.fn`` cannot be called as ``fn(prompt, responses, **options)``, or None."""
    try:
        params = list(inspect.signature(spec.fn).parameters.values())
    except (TypeError, ValueError):
        return None  # builtins and C callables: nothing to check
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    if len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 2:
        return None
    return (
        f"the solution classifier {spec.name!r} of plugin {spec.plugin!r} is called as "
        f"fn(prompt, responses, **options), but its signature is {spec.name}{inspect.signature(spec.fn)}"
    )


def classifier_problems(algorithm: Any, estimator: EstimatorSpec, registry: Registry) -> list[str]:
    """The problems of the classifier ``algorithm.classifier`` names for ``estimator`` (empty when all is well),
    after which ``algorithm.classifier_options`` holds the values its options model validated (defaults filled in).
    ``off``: no plugin may register a classifier of that name (it switches classifying off; one log line says so).
    Any other name: exactly one loaded plugin registers it, callable as the estimator calls it."""
    from plugrl.plugin_options import validate_options

    name = getattr(algorithm, "classifier", None)
    found = registered_classifiers(registry)
    if name == OFF:
        if OFF in found:
            return [
                f"plugin {found[OFF][0].plugin!r} registers a solution classifier named {OFF!r}, the name that "
                f"switches classifying off (algorithm.classifier: {OFF}): the plugin must rename it"
            ]
        log.info(
            "algorithm.classifier is off: classifying is off, every response is a strategy group of its own for "
            "%s (creativity-weighted GRPO: every weight 1, so grpo_weighted_mul is plain grpo, grpo_weighted_add "
            "grpo + 1)",
            estimator.name,
        )
        return []
    specs = found.get(name, [])
    if not specs:
        known = ", ".join(sorted(found)) or "none (load a plugin that registers one)"
        return [
            f"algorithm.adv_estimator {estimator.name!r} groups responses by strategy and needs algorithm.classifier; "
            f"got {name!r}, registered classifiers: {known}"
        ]
    if len({s.plugin for s in specs}) > 1:
        owners = " and ".join(repr(s.plugin) for s in specs)
        return [f"solution classifier {name!r} is registered by two plugins: {owners}; load only one in `plugins:`"]
    spec = specs[0]
    problem = _signature_problem(spec)
    if problem:
        return [problem]
    if spec.options is None:
        return []
    raw = getattr(algorithm, "classifier_options", None) or {}
    value, problems = validate_options(spec.options, raw, "algorithm.classifier_options")
    if value is not None:
        algorithm.classifier_options = value.model_dump(mode="json")
    return problems


@hookimpl
def plugrl_check_config(config: Any, registry: Registry) -> list[str] | None:
    """The classifier of an estimator that groups by strategy (:func:`classifier_problems`), when the run calls one
    (``algorithm.classifier`` set: training; ``plugrl eval`` calls none)."""
    algorithm = getattr(config, "algorithm", None)
    estimator = registry.estimators.get(getattr(algorithm, "adv_estimator", None)) if registry else None
    if not groups_by_strategy(estimator) or getattr(algorithm, "classifier", None) is None:
        return None
    return classifier_problems(algorithm, estimator, registry)


# --------------------------------------------------------------------------- each step


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


def find_classifier(registry: Registry | None, name: str) -> ClassifierSpec:
    """The classifier ``name`` among those the run's plugins register; a ValueError naming the registered ones."""
    if name == OFF:
        return OFF_SPEC
    specs = registered_classifiers(registry).get(name)
    if not specs:
        where = "the batch has no registry (batch.context.registry)" if registry is None else "no loaded plugin"
        known = ", ".join(sorted(registered_classifiers(registry))) or "none"
        raise ValueError(
            f"algorithm.classifier {name!r}: {where} registers it (registered: {known}); the plugrl trainer passes "
            "the run's registry, a test builds the batch with context=StepContext(registry=load_plugins([...]))"
        )
    return specs[0]


def solution_groups(batch: AdvantageBatch, config: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """[B] int64 strategy ids of ``batch``'s responses (equal within a prompt: the same strategy), and the metrics
    ``classifier/failures``, ``classifier/retries``, ``classifier/groups_mean`` and ``timing/classify``.

    The classifier is the one ``config.classifier`` names (settled at start), asked once per prompt with the
    prompt's text and its responses' (:meth:`plugrl.algorithms.AdvantageBatch.prompt_groups`), concurrently
    (``classifier_concurrency``), each prompt retried up to ``classifier_retries`` times before its responses get a
    group each. The first rank of a tensor-parallel group asks, the others receive its answer (``batch.context.share``):
    an LLM may answer each rank differently. ``off``, and None (a config no start-up settled, e.g. a test's), give
    every response its own group without asking anyone."""
    t0 = time.perf_counter()
    opts = settings(config)
    name = opts.classifier or OFF
    rows = batch.prompt_rows()
    if name == OFF:  # nothing to ask: the same for every rank
        texts = [""] * len(rows), [[""] * len(r) for r in rows]
        ids, metrics = classify_groups(OFF_SPEC, *texts, options={}, concurrency=1, retries=1)
    else:
        spec = find_classifier(batch.context.registry, name)
        groups = batch.prompt_groups()

        def classify() -> tuple[list[int], dict[str, float]]:
            return classify_groups(
                spec,
                [g.prompt for g in groups],
                [g.responses for g in groups],
                options=dict(opts.classifier_options),
                concurrency=opts.classifier_concurrency,
                retries=opts.classifier_retries,
            )

        ids, metrics = batch.context.share(classify)
    out = torch.empty(len(batch.group_ids), dtype=torch.int64)
    out[torch.tensor([r for group in rows for r in group], dtype=torch.int64)] = torch.tensor(ids, dtype=torch.int64)
    return out, {**metrics, "timing/classify": time.perf_counter() - t0}
