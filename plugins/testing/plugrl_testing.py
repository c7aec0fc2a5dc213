"""A test kit for plugin authors: check a plugin against the kernel's contracts from its own test suite.

Each check loads or calls the plugin's records through the code a run uses (the kernel's plugin loader, reward
runner, row validation and prompt rendering; plugrl-multiturn's episode loop), without a model and without
downloading anything, and raises :class:`AssertionError` naming the plugin, the record and the rule it
breaks. They are plain functions: call them in a ``test_*`` function of pytest (or of any runner)::

    from plugrl_testing import check_plugin, check_reward

    from plugrl_my_task import my_task_reward


    def test_my_task_keeps_the_contracts():
        check_plugin("my_task")  # the entry point: the package must be installed
        check_reward(my_task_reward, [("42", "42", 1.0), ("41", "42", 0.0)])

A record is named by its decorated object (``my_task_reward``, a class decorated with
``@plugrl.environment``), found on its module as ``plugins: ["module:name"]`` would find it, or by its
registered name with ``plugin=``: the entry-point name of an installed plugin, ``"module:"`` for a local
one, a list of them (a dataset with the plugin of its reward), or the registry that :func:`check_plugin`
returned.

``check_template``, ``check_dataset`` and ``check_environment`` render prompts with a tokenizer made in
memory (:func:`chat_tokenizer`: one token per UTF-8 byte and a ChatML chat template), so they need no model
files; ``check_environment(tokenizer=...)`` takes a real model's tokenizer, to check an environment against
that model's own chat template. Importing this module imports no torch; the estimator and environment
checks do.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from plugrl import hookspecs
from plugrl.config import Config, ConfigError, RewardConfig, build_config
from plugrl.data import DataError, Sample, load_samples, row_to_sample
from plugrl.plugins import (
    HOOK_OF,
    PluginError,
    build_registry,
    check_options,
    check_registry,
    load_plugins,
)
from plugrl.prompts import encode_prompts
from plugrl.rewards import RewardError, RewardItem, RewardRunner, check_routes
from plugrl.rewards.routing import ground_truth_optional, rewards_for
from plugrl.rollout.routing import scored_by_environment
from plugrl.specs import (
    DatasetSpec,
    EnvironmentSpec,
    EstimatorSpec,
    Registry,
    RewardSpec,
    TemplateSpec,
    specs_of,
    with_plugin,
)

if TYPE_CHECKING:
    from plugrl.algorithms import AdvantageResult
    from plugrl.rollout.multiturn import Conversation
    from plugrl.rollout.types import Rollout

__all__ = [
    "PlayedEpisode",
    "chat_tokenizer",
    "check_dataset",
    "check_environment",
    "check_estimator",
    "check_plugin",
    "check_reward",
    "check_template",
]

# prompt and response budgets of the checks: one token per byte, and the checks are about the plugin, not lengths
_LIMIT = 1 << 16
_KINDS = {  # kind -> (record, decorator, the registry's field)
    "reward": (RewardSpec, "reward", "rewards"),
    "dataset": (DatasetSpec, "dataset", "datasets"),
    "template": (TemplateSpec, "template", "templates"),
    "estimator": (EstimatorSpec, "advantage_estimator", "estimators"),
    "environment": (EnvironmentSpec, "environment", "environments"),
}


# --------------------------------------------------------------------------- finding records


def _load(plugin: Any) -> Registry:
    """The registry of ``plugin`` (a name, ``"module:"``, a module, a list of them, or a registry)."""
    if isinstance(plugin, Registry):
        return plugin
    items = [plugin] if isinstance(plugin, (str, ModuleType)) else list(plugin)
    names = [f"{p.__name__}:" if isinstance(p, ModuleType) else p for p in items]
    try:
        return load_plugins(names)
    except PluginError as e:  # the loader's message names the plugin and how to install it
        raise AssertionError(f"plugrl_testing: {e}") from None


def _reachable(obj: Any) -> str | None:
    """``module:name`` when that is how the plugin loader finds ``obj`` (defined at module level)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is obj else None


def _find(kind: str, target: Any, plugin: Any = None) -> tuple[Registry, Any]:
    """(registry, record) of the ``kind`` record ``target`` (a registered name, or the decorated object), whose
    function's signature fits how the kernel calls it (:func:`plugrl.plugins.check_registry`)."""
    registry, spec = _lookup(kind, target, plugin)
    problems = check_registry(Registry(**{_KINDS[kind][2]: [spec] if kind == "reward" else {spec.name: spec}}))
    if problems:
        raise AssertionError(f"{_what(kind, spec)}: its signature does not fit how the kernel calls it: {problems[0]}")
    return registry, spec


def _lookup(kind: str, target: Any, plugin: Any) -> tuple[Registry, Any]:
    record, decorator, _ = _KINDS[kind]
    if isinstance(target, str):
        try:
            registry = _load(target if plugin is None else plugin)
        except AssertionError as e:
            if plugin is not None:
                raise
            raise AssertionError(
                f"{e}\n(the {kind} {target!r} was looked for in the plugin of that name: pass "
                "plugin=... to name the plugin that registers it)"
            ) from None
        spec = _table(kind, registry).get(target)
        if spec is None:
            known = ", ".join(sorted(_table(kind, registry))) or "none"
            raise AssertionError(
                f"plugrl_testing: plugin(s) {', '.join(registry.plugins)} register no {kind} {target!r} "
                f"(registered: {known}); name the plugin that does with plugin=..."
            )
        return registry, spec
    if plugin is not None:
        registry = _load(plugin)
        spec = next((s for s in _table(kind, registry).values() if s.fn is target), None)
        if spec is None:
            raise AssertionError(f"plugrl_testing: plugin(s) {', '.join(registry.plugins)} do not register {target!r}")
        return registry, spec
    specs = [s for s in specs_of(target) if isinstance(s, record)]
    if not specs and kind == "environment" and callable(target):  # a factory the kernel could train as it is
        specs = [EnvironmentSpec(name=getattr(target, "__name__", "environment"), factory=target)]
    if not specs:
        raise AssertionError(
            f"plugrl_testing: {target!r} is not registered as a {kind}: decorate it with @plugrl.{decorator}(...), "
            "or the plugin loader will not find it"
        )
    where = _reachable(target)
    if where is not None and specs_of(target):  # loaded as `plugins: ["module:name"]` would load it
        registry = _load(where)
    else:  # a function or class the loader cannot reach by name (defined inside a function)
        where = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"
        registry = build_registry([with_plugin(s, where) for s in specs], {where: where})
    return registry, next(s for s in _table(kind, registry).values() if s.fn is target)


def _table(kind: str, registry: Registry) -> dict[str, Any]:
    """The registry's records of ``kind`` by name (a reward: the first registered under that name)."""
    records = getattr(registry, _KINDS[kind][2])
    return {s.name: s for s in reversed(records)} if kind == "reward" else records


def _what(kind: str, spec: Any) -> str:
    return f"{kind} {spec.name!r} of plugin {spec.plugin!r}"


def _config(what: str, registry: Registry, **sections: Any) -> Config:
    """A run config for the checks (placeholder model and data), with the plugins' options validated by the
    kernel's :func:`plugrl.plugins.check_options` (defaults filled in, as a run gets them)."""
    data = {"max_prompt_length": _LIMIT, "max_response_length": _LIMIT, **sections.pop("data", {})}
    if not data.get("dataset"):
        data["train_files"] = ["plugrl-testing.jsonl"]  # never read
    tree = {"plugins": list(registry.plugins), "model": {"path": "plugrl-testing"}, "data": data, **sections}
    try:
        cfg = build_config(tree)
    except ConfigError as e:
        raise AssertionError(f"{what}: {e}") from None
    problems = check_options(cfg, registry)
    if problems:
        raise AssertionError(f"{what}: the options are refused at start-up:\n  " + "\n  ".join(problems))
    return cfg


def _as_sample(sample: Any, cfg: Config, registry: Registry, what: str) -> Sample:
    """``sample`` itself, or a row validated into one as the kernel validates rows."""
    if isinstance(sample, Sample):
        return sample
    try:
        return row_to_sample(sample, "the sample given to plugrl_testing", cfg.data, _routing(cfg, registry)[0])
    except DataError as e:
        raise AssertionError(f"{what}: {e}") from None


def _routing(cfg: Config, registry: Registry) -> tuple[Any, Any]:
    """(the data sources whose rows need no ground truth, those an environment scores): start-up's rules
    (:func:`plugrl.rewards.routing.ground_truth_optional`, :func:`plugrl.rollout.routing.scored_by_environment`)."""
    optional = functools.partial(ground_truth_optional, cfg, registry)
    return optional, functools.partial(scored_by_environment, cfg, registry)


@functools.cache
def chat_tokenizer() -> Any:
    """A tokenizer made in memory, nothing downloaded: one token per UTF-8 byte, ``<|im_start|>`` and
    ``<|im_end|>`` (its EOS), and a ChatML chat template that ignores ``tools=`` (so the kernel describes an
    episode's tools in its system message, as it does for such models). What the checks render prompts with."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=template,
    )


# --------------------------------------------------------------------------- the plugin as a whole


def check_plugin(plugin: str | ModuleType | Sequence[str]) -> Registry:
    """Load ``plugin`` as a run does (an installed entry-point name, ``"module:"`` for a local module) and check
    what needs no input from the test: it registers something or implements a hook; every function's
    signature fits how the kernel calls it (:func:`plugrl.plugins.check_registry`); every reward can be planned
    by the reward runner (its signature read, and sent to a worker process: picklable); every advantage
    estimator passes :func:`check_estimator` on the kit's batch (those whose options have no defaults are left
    to a ``check_estimator`` call with ``options=``). Datasets, templates and environments need inputs (or I/O):
    check them with their own functions. Returns the registry, for ``plugin=`` of the other checks."""
    registry = _load(plugin)
    names, label = set(registry.plugins), ", ".join(registry.plugins)
    tables = (registry.datasets, registry.templates, registry.estimators)
    tables += (registry.policy_losses, registry.environments, registry.tools)
    records = [*registry.rewards, *(spec for table in tables for spec in table.values()), *registry.plugin_records]
    if not any(getattr(s, "plugin", None) in names for s in records) and not _implements_hooks(registry, names):
        raise AssertionError(
            f"plugin {label}: registers nothing and implements no hook; decorate its functions "
            "(@plugrl.reward, ...) or implement a hook with @plugrl.hookimpl"
        )
    problems = [p for p in check_registry(registry) if any(p.startswith(f"{name}: ") for name in names)]
    if problems:
        listed = "\n  ".join(problems)
        raise AssertionError(f"plugin(s) {label}: signatures the kernel cannot call:\n  {listed}")
    rewards = [r for r in registry.rewards if r.plugin in names]
    if rewards:
        try:  # planned for the worker pool (no process starts): signature read, function picklable
            RewardRunner(Registry(rewards=rewards, plugins=registry.plugins), RewardConfig()).close()
        except RewardError as e:
            raise AssertionError(str(e)) from None
    for name, spec in registry.estimators.items():
        required = spec.options is not None and any(f.is_required() for f in spec.options.model_fields.values())
        if spec.plugin in names and not required:
            check_estimator(name, plugin=registry)
    return registry


def _implements_hooks(registry: Registry, names: set[str]) -> bool:
    """Some plugin of ``names`` implements a hook beyond the registering ones (a lifecycle or config check)."""
    hooks = [h for h in dir(hookspecs) if h.startswith("plugrl_") and h not in HOOK_OF.values()]
    return any(
        impl.plugin_name.split("#", 1)[0] in names
        for hook in hooks
        for impl in getattr(registry.hooks, hook).get_hookimpls()
    )


# --------------------------------------------------------------------------- rewards


def check_reward(
    reward: Any,
    cases: Sequence[tuple[Any, ...]],
    *,
    plugin: Any = None,
    options: Mapping[str, Any] | None = None,
    data_source: str | None = None,
    **context: Any,
) -> list[float]:
    """Score ``cases`` with ``reward`` as a run scores rollouts, and check what comes back.

    ``cases``: ``(completion, ground_truth, expected)`` tuples; ``expected`` is the score (compared within
    1e-6), a dict with ``score`` and extra fields the result must hold, or left out (only the contract is
    checked). The reward runner calls the function as in a run (its context keywords, ``options`` as
    ``reward.options.<name>``, validated by its options model), inline; it must plan to send the function to a
    worker process (picklable, module-level). The result must normalise as the kernel normalises it (a finite
    float, or a dict with a finite ``score``). ``data_source``: the sample's (default: the reward's first, which
    must then be no glob); ``context``: the rest of the sample: ``prompt``, ``extra_info``, ``messages`` and
    row columns (``nums=[3, 5]``). Returns the scores.
    """
    registry, spec = _find("reward", reward, plugin)
    what = _what("reward", spec)
    ds = data_source or spec.data_sources[0]
    if spec not in rewards_for(Registry(rewards=[spec]), ds):
        raise AssertionError(
            f"{what}: data_source {ds!r} is not among its patterns {list(spec.data_sources)}: "
            "pass the data_source of a sample it scores"
        )
    own = Registry(rewards=[spec], plugins=registry.plugins)
    cfg = _config(what, own, reward={"options": {spec.name: dict(options)}} if options else {})
    try:  # planned for the worker pool (no process starts): the function must be picklable
        RewardRunner(own, cfg.reward.model_copy(update={"num_workers": 1})).close()
        with RewardRunner(own, cfg.reward.model_copy(update={"num_workers": 0})) as runner:
            out = runner.score([_reward_item(i, case, ds, context) for i, case in enumerate(cases)])
    except RewardError as e:
        raise AssertionError(str(e)) from None
    for i, (case, details) in enumerate(zip(cases, out.details, strict=True)):
        _check_score(f"{what}, case {i} (completion {case[0]!r:.60})", spec.name, details, case[2:])
    return [d[spec.name] for d in out.details]


def _reward_item(i: int, case: Sequence[Any], data_source: str, context: dict[str, Any]) -> RewardItem:
    if not 2 <= len(case) <= 3:
        raise TypeError(f"case {i}: give (completion, ground_truth) or (completion, ground_truth, expected)")
    ctx = dict(context)
    prompt, extra, messages = ctx.pop("prompt", ""), ctx.pop("extra_info", None) or {}, ctx.pop("messages", None)
    row = {**ctx, "prompt": prompt, "data_source": data_source, "ground_truth": case[1], "extra_info": extra}
    sample = Sample(prompt, data_source, case[1], extra, row, origin=f"plugrl_testing case {i}")
    text = prompt if isinstance(prompt, str) else "\n".join(f"{m['role']}: {m['content']}" for m in prompt)
    return RewardItem(sample, text, case[0], messages)


def _check_score(where: str, name: str, details: dict[str, Any], expected: Sequence[Any]) -> None:
    """The runner's outcome of one call: no error, the expected score and fields."""
    if details.get("timeout") or f"{name}/error" in details:
        raise AssertionError(f"{where}: {details.get(f'{name}/error', 'timed out')}")
    if not expected or expected[0] is None:
        return
    want = expected[0] if isinstance(expected[0], Mapping) else {"score": expected[0]}
    got = {"score": details[name], **{k.split("/", 1)[1]: v for k, v in details.items() if k.startswith(name + "/")}}
    for key, value in want.items():
        if key not in got:
            raise AssertionError(f"{where}: the result has no field {key!r} (it has {', '.join(sorted(got))})")
        close = isinstance(value, (int, float)) and isinstance(got[key], (int, float)) and not isinstance(value, bool)
        if not (math.isclose(got[key], value, abs_tol=1e-6) if close else got[key] == value):
            raise AssertionError(f"{where}: {key} is {got[key]!r}, expected {value!r}")


# --------------------------------------------------------------------------- datasets and templates


def check_dataset(
    dataset: Any,
    split: str = "train",
    options: Mapping[str, Any] | None = None,
    n: int = 4,
    *,
    plugin: Any = None,
    template: str | None = None,
    environment: str | None = None,
    routed: bool = True,
) -> list[Sample]:
    """Load the first ``n`` rows of ``dataset`` as a run loads them, and check them: ``options`` validated as
    ``data.dataset_options``; every row valid for the kernel's row validation (prompt, ``data_source``, a
    ground truth unless only an environment that scores episodes reads the data source: ``environment``, as
    the run config's); the same rows from a second call (every rank calls the dataset and must get the
    same); with ``routed``, every data source routed to a reward function of the loaded plugins (pass
    ``plugin=[dataset's plugin, reward's plugin]``; ``routed=False`` for rows scored by another package); every
    prompt rendered (with ``template`` when given). Returns the samples."""
    registry, spec = _find("dataset", dataset, plugin)
    what = _what("dataset", spec)
    data = {"dataset": spec.name, "dataset_options": dict(options or {}), "max_samples": n, "template": template}
    cfg = _config(what, registry, data=data, environment=environment)
    gt_optional, scored_by_environment = _routing(cfg, registry)
    try:  # the steps of plugrl.startup.load_prompts
        samples, _ = load_samples(cfg.data, registry, split, ground_truth_optional=gt_optional)
        again, _ = load_samples(cfg.data, registry, split, ground_truth_optional=gt_optional)
        if routed:
            check_routes(registry, {s.data_source for s in samples if not scored_by_environment(s.data_source)})
        # no model here: image rows render as text (their images were decoded and matched to their places)
        encode_prompts([dataclasses.replace(s, images=[]) for s in samples], cfg.data, chat_tokenizer(), registry)
    except (DataError, RewardError) as e:
        raise AssertionError(f"{what}: {e}") from None
    first, second = ([(s.prompt, s.data_source, s.ground_truth, s.row, s.images) for s in x] for x in (samples, again))
    if first != second:
        i = next(
            (k for k, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), min(len(first), len(second))
        )
        raise AssertionError(
            f"{what}: two calls with the same options give different rows (from row {i} on); every rank calls "
            "the dataset and must get the same rows: draw them from a `seed` option, not from global state"
        )
    return samples


def check_template(template: Any, sample: Any, *, plugin: Any = None) -> str | list[dict[str, str]]:
    """Render ``sample`` (a :class:`plugrl.data.Sample` or a row) with ``template`` as a run renders prompts
    (``data.template``): the result must be non-empty text or valid chat messages, which the chat template
    can render. Returns what the template returned, as the kernel took it."""
    registry, spec = _find("template", template, plugin)
    what = _what("template", spec)
    cfg = _config(what, registry, data={"template": spec.name})
    try:
        (prompt,), _ = encode_prompts([_as_sample(sample, cfg, registry, what)], cfg.data, chat_tokenizer(), registry)
    except DataError as e:
        raise AssertionError(f"{what}: {e}") from None
    return prompt.messages if prompt.messages is not None else prompt.text


# --------------------------------------------------------------------------- advantage estimators


def check_estimator(
    estimator: Any,
    scores: Sequence[float] = (1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.25, 1.0),
    group_size: int = 4,
    *,
    plugin: Any = None,
    options: Mapping[str, Any] | None = None,
) -> AdvantageResult:
    """Call ``estimator`` as the trainer does, on an :class:`plugrl.algorithms.AdvantageBatch` built from
    ``scores`` (one per response, ``group_size`` responses per prompt, responses of 2 to 6 tokens, each score
    on its last token) with the inputs it declared (critic values, greedy baselines), and
    ``options`` validated as keys of the ``algorithm`` section. The result must be an ``AdvantageResult``
    whose ``advantages`` (and ``returns``, required with ``needs_critic``) have the batch's [B, T] shape and
    are finite everywhere, and whose metrics are numbers. The response mask must be respected: the same
    batch with more padding gives the same advantages on the response tokens. Returns the result."""
    registry, spec = _find("estimator", estimator, plugin)
    what = _what("advantage estimator", spec)
    if group_size < 1 or not scores or len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not make groups of {group_size}")
    cfg = _config(what, registry, algorithm={"adv_estimator": spec.name, **dict(options or {})})
    batch = _advantage_batch(scores, group_size, spec, padding=1)
    result = _estimate(spec, batch, cfg, what)
    wider = _estimate(spec, _advantage_batch(scores, group_size, spec, padding=4), cfg, what)
    mask, width = batch.response_mask, batch.response_mask.shape[1]
    if not (result.advantages * mask).allclose(wider.advantages[:, :width] * mask, atol=1e-5):
        raise AssertionError(
            f"{what}: the advantages of the response tokens change when the batch has more padding; leave the "
            "padding out of every statistic (batch.response_mask is 1.0 on response tokens, 0.0 on padding)"
        )
    return result


def _advantage_batch(scores: Sequence[float], group_size: int, spec: EstimatorSpec, padding: int) -> Any:
    import torch

    from plugrl.algorithms import AdvantageBatch, response_mask

    lengths = [2 + (3 * i) % 5 for i in range(len(scores))]
    width = max(lengths) + padding
    mask = response_mask(lengths, width=width)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(scores)), torch.tensor(lengths) - 1] = torch.tensor(scores, dtype=torch.float32)
    batch = AdvantageBatch(
        token_level_rewards=rewards,
        response_mask=mask,
        group_ids=torch.arange(len(scores)) // group_size,
        prompts=[f"prompt {i // group_size}" for i in range(len(scores))],
        responses=[f"response {i}" for i in range(len(scores))],
    )
    if spec.needs_critic:  # the value of each response token (0 on padding), the same whatever the padding
        steps = torch.arange(width).float().unsqueeze(0) + torch.arange(len(scores)).float().unsqueeze(1)
        batch.values = torch.sin(steps) * 0.5 * mask
    if spec.needs_greedy_baseline:
        batch.baseline_scores = torch.full((len(scores),), 0.5)
    return batch


def _estimate(spec: EstimatorSpec, batch: Any, cfg: Config, what: str) -> AdvantageResult:
    import torch

    from plugrl.algorithms import AdvantageResult

    try:
        result = spec.fn(batch, cfg.algorithm)
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}") from e
    if not isinstance(result, AdvantageResult):
        raise AssertionError(f"{what} must return a plugrl.algorithms.AdvantageResult, got {type(result).__name__}")
    shape = tuple(batch.response_mask.shape)
    fields = {"advantages": result.advantages, "returns": result.returns}
    if spec.needs_critic and result.returns is None:
        raise AssertionError(f"{what} needs a critic: it must return the critic's targets as `returns` [B, T]")
    for name, value in fields.items():
        if value is None and name == "returns":
            continue
        if not (isinstance(value, torch.Tensor) and value.is_floating_point() and tuple(value.shape) == shape):
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise AssertionError(
                f"{what}: {name} must be a float tensor of the batch's shape [B, T] = {shape}, got {got}"
            )
        if not torch.isfinite(value).all():
            row, col = (~torch.isfinite(value)).nonzero()[0].tolist()
            raise AssertionError(
                f"{what}: {name}[{row}, {col}] is {value[row, col].item()}; every entry must be finite, padding "
                "included (the trainer multiplies by the mask, and NaN * 0 is NaN)"
            )
    bad = {k: v for k, v in result.metrics.items() if not isinstance(k, str) or not _is_number(v)}
    if bad:
        raise AssertionError(f"{what}: metrics must be {{name: number}}, got {bad!r:.200}")
    return result


def _is_number(value: Any) -> bool:
    try:
        return not isinstance(value, (bool, str)) and isinstance(float(value), float)
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------- environments


@dataclass
class PlayedEpisode:
    """What :func:`check_environment` played: the ``conversation`` (messages, turns, ``finish``, the
    environment's ``reward`` and ``info``), the ``score`` a run would train on (the environment's reward, or
    the reward plugins' score of the last reply; None where nothing scored it), the reward ``details``, and the
    token-level ``rollout``."""

    conversation: Conversation
    score: float | None
    details: dict[str, Any] = field(default_factory=dict)
    rollout: Rollout | None = None


class _OutOfReplies(Exception):
    pass


class _ScriptedEngine:
    """Answers each turn with the next scripted reply, tokenized and closed by the EOS token."""

    def __init__(self, tokenizer: Any, replies: Sequence[str]):
        self.tokenizer, self.replies, self.turns = tokenizer, list(replies), 0

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[list[Any]]:
        from plugrl.rollout.types import Rollout

        if self.turns >= len(self.replies):
            raise _OutOfReplies
        text = self.replies[self.turns]
        self.turns += 1
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
        finish = "length" if len(ids) > sampling.max_tokens else "stop"
        return [[Rollout(list(p), ids[: sampling.max_tokens], None, finish)] for p in prompts]

    def close(self) -> None:
        pass


def check_environment(
    environment: Any,
    sample: Any,
    replies: Sequence[str],
    *,
    plugin: Any = None,
    options: Mapping[str, Any] | None = None,
    template: str | None = None,
    tools: Sequence[str] = (),
    max_turns: int | None = None,
    expected_score: float | None = None,
    tokenizer: Any = None,
) -> PlayedEpisode:
    """Play one episode of ``environment`` on ``sample`` (a :class:`plugrl.data.Sample` or a row) through the
    episode loop a run uses (plugrl-multiturn's), the policy's turns being ``replies`` in order, and score it as a
    run does.

    Covers what a run does with an environment: ``options`` validated as ``environment_options``; the factory
    called with them; ``start``, ``step`` after each reply (its tool calls parsed and run first: ``tools`` are
    the run's ``rollout.tools``, and those ``start`` offers), ``reward()`` and ``close()``, plain or
    ``async def``, their results checked by the contract's validators; the prompt rendered (``template``
    as ``data.template``) and every turn written with the chat template; then the episode scored (the
    environment's reward, or the reward functions of the loaded plugins for its data source). The episode must
    not end in an error, and its score must be ``expected_score`` when that is given. ``max_turns``
    (``rollout.max_turns``) defaults to the number of replies, so the last reply's turn is the last
    (``Turn.last``); more turns than replies is an error. ``tokenizer``: a model's own, to check its chat
    template (default :func:`chat_tokenizer`)."""
    from plugrl.rollout.play import generate_scored, make_episode_runner
    from plugrl.rollout.types import sampling_settings

    if isinstance(environment, str) and ":" in environment:  # a family's member: loaded by the options check
        registry, name = _load(plugin or environment.partition(":")[0]), environment
    else:
        registry, spec = _find("environment", environment, plugin)
        name = spec.name
    rollout = {"max_turns": max_turns or max(len(replies), 1), "tools": list(tools)}
    sections = {"environment": name, "environment_options": dict(options or {}), "rollout": rollout}
    cfg = _config(f"environment {name!r}", registry, data={"template": template}, **sections)
    what = _what("environment", registry.environments[name])
    tok = tokenizer or chat_tokenizer()
    try:
        (prompt,), _ = encode_prompts([_as_sample(sample, cfg, registry, what)], cfg.data, tok, registry)
    except DataError as e:
        raise AssertionError(f"{what}: {e}") from None
    engine = _ScriptedEngine(tok, replies)
    player = make_episode_runner(cfg, registry, engine, tok)
    rewards = RewardRunner(registry, cfg.reward.model_copy(update={"num_workers": 0}))
    try:
        ((_, rolled, conversation),), _, out = generate_scored(
            engine, tok, [prompt], rewards, sampling_settings(cfg, "train", n=1), player=player
        )
    except _OutOfReplies:
        raise AssertionError(
            f"{what}: the episode asks for turn {engine.turns + 1}, but replies holds {len(replies)}: give more "
            "replies, or lower max_turns"
        ) from None
    except RewardError as e:
        raise AssertionError(f"{what}: {e}") from None
    finally:
        player.close()
        rewards.close()
    if conversation.finish == "error":
        raise AssertionError(conversation.error)
    details = out.details[0]
    score = None if "unscored" in details else out.scores[0]
    errors = [f"{k}: {v}" for k, v in details.items() if k.endswith("/error")]
    if errors:
        raise AssertionError(f"{what}: its episode's reward failed: " + "; ".join(errors))
    if expected_score is not None and score is None:
        raise AssertionError(
            f"{what}: nothing scored the episode: the environment gave no reward, and plugin(s) "
            f"{', '.join(registry.plugins)} register no reward for data_source {prompt.sample.data_source!r} "
            "(name the plugin of that reward too: plugin=[...])"
        )
    if expected_score is not None and not math.isclose(score, expected_score, abs_tol=1e-6):
        raise AssertionError(f"{what}: the episode scored {score!r}, expected {expected_score!r}")
    return PlayedEpisode(conversation, score, details, rolled)
