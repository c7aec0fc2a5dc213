"""The records a plugin hands to the kernel, and the decorators that make them.

A plugin either decorates plain functions (``@plugrl.reward("countdown")``) or
implements the hooks in :mod:`plugrl.hookspecs` and returns these records itself.
The decorators leave the function unchanged, so it stays a plain, testable
function; they only attach a ``__plugrl_spec__`` attribute that the plugin loader
collects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # a plugin function's options are declared once, as a pydantic model
    from pydantic import BaseModel

F = TypeVar("F", bound=Callable[..., Any])


SPEC_ATTR = "__plugrl_spec__"


@dataclass(frozen=True)
class RewardSpec:
    """A reward function for one or more data sources.

    ``fn(completion, ground_truth, **context) -> float | dict``; ``context`` may hold
    ``data_source``, ``extra_info``, ``prompt`` (the rendered prompt text),
    ``sample`` (the :class:`plugrl.data.Sample`), ``messages`` (in a multi-turn episode: the whole
    conversation; ``completion`` is then its last reply) and the options configured for this
    reward under ``reward.options.<name>``. Only the keyword arguments that ``fn``
    declares are passed, unless it takes ``**kwargs``. A dict result must hold
    ``score``; its other fields are logged and saved with the rollouts. ``casefold``: its exact names also
    match a ``data_source`` after ``strip().lower()`` (verl's default scorer routes ``grade`` so).
    ``fields``: the fields besides ``score`` its dict result always holds (``acc``, ``pred``), so that settings
    that read one (``algorithm.filter_groups.metric``) are checked at start; None: not declared (checked when the
    first results come).
    """

    name: str
    fn: Callable[..., Any]
    data_sources: tuple[str, ...]
    weight: float = 1.0
    plugin: str = ""
    options: type[BaseModel] | None = None
    casefold: bool = False
    fields: tuple[str, ...] | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """A named dataset: ``fn(split: str, **options) -> Iterable[Mapping]``.

    Each row is a mapping in the sample schema (``prompt``, ``data_source``,
    ``ground_truth``, ``extra_info``) or in verl's parquet schema
    (``reward_model.ground_truth``); the kernel validates every row.
    ``options`` come from ``data.dataset_options`` in the run config.
    """

    name: str
    fn: Callable[..., Iterable[Mapping[str, Any]]]
    plugin: str = ""
    options: type[BaseModel] | None = None


@dataclass(frozen=True)
class TemplateSpec:
    """A prompt template: ``fn(sample) -> str | list[dict]``.

    Returns raw prompt text, or chat messages (``[{"role": ..., "content": ...}]``)
    that the kernel renders with the tokenizer's chat template. The kernel adds the
    configured system prompt and assistant prefill around it.
    """

    name: str
    fn: Callable[..., str | list[dict[str, str]]]
    plugin: str = ""


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator: ``fn(batch: AdvantageBatch, config) -> AdvantageResult``.

    ``batch`` (:class:`plugrl.algorithms.AdvantageBatch`) is the step context, the one thing the kernel hands the
    estimator each step: the rewards, masks and prompt groups of one rank's samples, their texts (per prompt:
    ``batch.prompt_groups()``), the inputs the estimator declared, and ``batch.context`` (the run's registry, and
    ``share`` for work the ranks of a tensor-parallel group must agree on). ``config`` is the run's ``algorithm``
    section (:class:`plugrl.config.AlgorithmConfig`); the keys the estimator reads beyond it are declared by
    ``options`` (a pydantic model), validated at start-up and set on ``config`` (``config.weight_power``).

    Declared inputs, which only the kernel can provide: ``needs_critic`` makes it build and train a value model and
    pass its values in ``batch.values``; ``needs_greedy_baseline`` makes it generate one greedy response per prompt
    with the rollout engine, score it, and pass the scores (repeated per sample, [B]) in ``batch.baseline_scores``.
    Anything else an estimator needs it computes itself from the batch (a plugin's own service, such as an LLM that
    groups the responses, called through ``batch.context``).
    """

    name: str
    fn: Callable[..., Any]
    needs_critic: bool = False
    needs_greedy_baseline: bool = False
    plugin: str = ""
    options: type[BaseModel] | None = None


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss, chosen by ``actor.loss_mode``:
    ``fn(logprob, old_logprob, advantages, response_mask, config, *, num_tokens, num_seqs, norm_length)
    -> (loss, metrics)``.

    Shapes: ``logprob`` [B, T] (the current policy; carries the gradient), ``old_logprob`` [B, T] (the
    policy that sampled), ``advantages`` [B, T], ``response_mask`` [B, T] (1.0 on response tokens).
    ``config`` is the ``actor`` section (:class:`plugrl.config.ActorConfig`: ``clip_low``, ``clip_high``,
    ``clip_ratio_c``, ``loss_agg_mode``). The keywords normalise the aggregation over the whole
    mini-batch (see :func:`plugrl.algorithms.agg_loss`). Returns the scalar loss of this micro-batch and
    its metrics as floats, among them ``actor/pg_loss`` (the loss value). Called by the actor once per
    micro-batch inside the backward pass: it must be a pure function of its inputs.

    With ``algorithm.rollout_correction.mode`` truncate or mask the actor also passes
    ``rollout_is_weights`` [B, T] (detached importance weights, 0 off the mask): multiply each token's loss by it
    before aggregating. A loss without that keyword parameter stops such a run at start, naming
    ``actor.loss_mode``; runs without a correction never pass it.

    ``agg_mode``: the aggregation the loss always uses (its paper's), whatever ``actor.loss_agg_mode`` says; a run
    that sets ``actor.loss_agg_mode`` to another is refused at start. None: the loss follows ``loss_agg_mode``.
    """

    name: str
    fn: Callable[..., Any]
    plugin: str = ""
    agg_mode: str | None = None


@dataclass(frozen=True)
class EngineSpec:
    """A rollout engine, chosen by ``rollout.name``: ``factory(**kwargs) -> engine``.

    The trainer (and ``plugrl eval``) calls ``factory`` once per process with the keywords ``model_path`` (the
    policy's weights at start), ``cfg`` (the ``rollout`` section, :class:`plugrl.config.RolloutConfig`), ``dtype``,
    ``max_model_len`` (prompt + response tokens), ``device`` ("cpu" or "cuda"), ``world_size`` and ``rank`` (of the
    launch), ``trainer_seed``, ``tokenizer``, ``lora_rank`` (> 0: the policy arrives as a LoRA adapter),
    ``hf_overrides`` (``model.override_config``), ``syncs_weights`` (False for evaluation), and in training
    ``run_config`` (the whole :class:`plugrl.config.Config`) and ``log_dir`` (the run directory); a factory takes
    what it needs and ``**_`` for the rest. The engine it returns keeps the contract of
    :class:`plugrl.rollout.types.RolloutEngine`: ``generate`` (token ids in, token ids and texts out, exactly the
    tokens sampled), ``load_weights`` / ``load_adapter`` (the policy after each update), ``sleep`` / ``wake_up``
    and ``close``. The kernel registers ``vllm`` and ``hf`` itself (plugin ``plugrl``); with ``rollout.mode:
    server`` the trainer builds the engine ``server`` (the package plugrl-rollout-servers registers it).
    """

    name: str
    factory: Callable[..., Any]
    plugin: str = ""


TOOL_SCHEMA_FORM = "{'type': 'function', 'function': {'name': ..., 'description': ..., 'parameters': {...}}}"


@dataclass(frozen=True)
class ToolSpec:
    """A tool the policy may call: ``fn(**arguments)`` (plain or ``async def``), shown to the model as ``schema``.

    ``plugin``: who registered it (for error messages). ``time_limit_s``: its per-call limit, None for the
    executor's. ``in_process``: an episode's own tool (a method of its environment, a closure), called in the
    trainer's process where its state lives (the tool executor's ``call_in_process``), not in a worker process.
    Build one with ``@plugrl.tool`` (or ``plugrl_tools.authoring.make_tool``, package plugrl-tools), which derives
    or checks the schema.
    """

    name: str
    fn: Callable[..., Any]
    schema: dict
    plugin: str = ""
    time_limit_s: float | None = None
    in_process: bool = False

    def __post_init__(self) -> None:
        where = f"plugin {self.plugin!r}, tool {self.name!r}" if self.plugin else f"tool {self.name!r}"
        if not callable(self.fn):
            raise ValueError(f"{where}: fn must be callable, got {type(self.fn).__name__}")
        function = self.schema.get("function") if isinstance(self.schema, dict) else None
        if not isinstance(function, dict) or function.get("name") != self.name:
            raise ValueError(
                f"{where}: schema must be {TOOL_SCHEMA_FORM} with function.name {self.name!r}; use make_tool"
            )
        if self.time_limit_s is not None and not (
            isinstance(self.time_limit_s, (int, float)) and self.time_limit_s > 0
        ):
            raise ValueError(f"{where}: time_limit_s must be a positive number of seconds or None")

    def __hash__(self) -> int:
        return hash((self.name, self.plugin))

    @property
    def description(self) -> str:
        return self.schema["function"].get("description", "")


@dataclass(frozen=True)
class EnvironmentSpec:
    """An environment for multi-turn episodes (see :mod:`plugrl.rollout.environment`).

    ``factory(**options)`` is called once per episode and returns the object that holds the episode's
    state, with ``start(sample)`` and ``step(turn)`` (plain or ``async def``). ``options`` models
    ``environment_options``; the kernel validates them at start-up. ``tool_options`` names the options
    whose values are registered tool names (the tools ``start`` will ask for): checked at start-up too.
    """

    name: str
    factory: Callable[..., Any] | None
    plugin: str = ""
    options: type[BaseModel] | None = None
    tool_options: tuple[str, ...] = ()
    # a family of environments (``@plugrl.environment_family``): ``load(env_id, **options)`` returns the
    # spec of ``name:env_id``; the kernel calls it once per run, at start-up
    load: Callable[..., Any] | None = None
    # what a family loaded: its name (the options went to ``load``, not to ``factory``)
    family: str = ""
    # the samples the environment brings (verifiers' datasets): the run's data when the config names none
    dataset: DatasetSpec | None = None

    @property
    def scores_episodes(self) -> bool:
        """Its class has ``reward()``: the environment scores every episode it does not fail on, so the data
        sources routed to it need no reward function."""
        return isinstance(self.factory, type) and callable(getattr(self.factory, "reward", None))

    @property
    def writes_prompt(self) -> bool:
        """Its class says its ``start`` writes the prompt (``plugrl_writes_prompt``: TRL's ``environment_factory``
        classes, whose ``reset()`` returns it): rows routed to it may have no prompt."""
        return bool(getattr(self.factory, "plugrl_writes_prompt", False))

    @property
    def fn(self) -> Callable[..., Any]:  # what the registry's checks call every record's function
        return self.load or self.factory


Spec = (
    RewardSpec | DatasetSpec | TemplateSpec | EstimatorSpec | PolicyLossSpec | EngineSpec | EnvironmentSpec | ToolSpec
)


def mark(fn: F, spec: Spec) -> F:
    """Attach ``spec`` to ``fn`` (what every decorator here does), leaving ``fn`` unchanged."""
    specs = list(getattr(fn, SPEC_ATTR, ()))
    specs.append(spec)
    setattr(fn, SPEC_ATTR, tuple(specs))
    return fn


def _options_model(options: Any, where: str) -> Any:
    """``options`` if it is a pydantic model class (or None); a TypeError for the plugin's author otherwise."""
    if options is None:
        return None
    from pydantic import BaseModel

    if not (isinstance(options, type) and issubclass(options, BaseModel)):
        raise TypeError(f"{where}(options=...) takes a pydantic BaseModel subclass, got {options!r}")
    return options


def reward(
    *data_sources: str,
    name: str | None = None,
    weight: float = 1.0,
    options: type[BaseModel] | None = None,
    casefold: bool = False,
    fields: Iterable[str] | None = None,
) -> Callable[[F], F]:
    """Register ``fn`` as a reward for ``data_sources`` (exact names or globs like ``*_tinyv``).

    ``options``: a pydantic model of the options ``reward.options.<name>`` may set; the kernel validates
    them at start-up and passes the validated values as keywords. ``casefold``: the exact names also match
    a ``data_source`` after ``strip().lower()`` (``" Grade"`` routes to ``grade``). ``fields``: the fields its
    dict result always holds besides ``score`` (:class:`RewardSpec`); ``()`` for a function that returns a number.
    """
    if not data_sources:
        raise TypeError("plugrl.reward needs at least one data_source name or glob, e.g. @plugrl.reward('countdown')")
    model = _options_model(options, "plugrl.reward")

    def deco(fn: F) -> F:
        spec = RewardSpec(
            name=name or fn.__name__,
            fn=fn,
            data_sources=tuple(data_sources),
            weight=weight,
            options=model,
            casefold=casefold,
            fields=None if fields is None else tuple(fields),
        )
        return mark(fn, spec)

    return deco


def dataset(name: str, *, options: type[BaseModel] | None = None) -> Callable[[F], F]:
    """Register ``fn(split, **options)`` as the dataset called ``name``; ``options`` models
    ``data.dataset_options``."""
    model = _options_model(options, "plugrl.dataset")
    return lambda fn: mark(fn, DatasetSpec(name=name, fn=fn, options=model))


def template(name: str) -> Callable[[F], F]:
    """Register ``fn(sample)`` as the prompt template called ``name``."""
    return lambda fn: mark(fn, TemplateSpec(name=name, fn=fn))


def advantage_estimator(
    name: str,
    *,
    needs_critic: bool = False,
    needs_greedy_baseline: bool = False,
    options: type[BaseModel] | None = None,
) -> Callable[[F], F]:
    """Register ``fn(batch, config)`` as the advantage estimator called ``name``.

    ``needs_critic`` / ``needs_greedy_baseline``: the inputs the kernel provides in ``batch.values`` /
    ``batch.baseline_scores`` (:class:`EstimatorSpec`). ``options``: a pydantic model of the keys the estimator
    reads from the ``algorithm`` section beyond the kernel's (e.g. ``algorithm.weight_power``); the kernel
    validates them at start-up, refuses keys that neither it nor the estimator knows, and sets the validated
    values on ``config``.
    """
    model = _options_model(options, "plugrl.advantage_estimator")
    return lambda fn: mark(
        fn,
        EstimatorSpec(
            name=name,
            fn=fn,
            needs_critic=needs_critic,
            needs_greedy_baseline=needs_greedy_baseline,
            options=model,
        ),
    )


def policy_loss(name: str, *, agg_mode: str | None = None) -> Callable[[F], F]:
    """Register ``fn`` (see :class:`PolicyLossSpec`) as the policy loss called ``name`` (``actor.loss_mode``);
    ``agg_mode``: the aggregation it always uses, whatever ``actor.loss_agg_mode`` says."""
    return lambda fn: mark(fn, PolicyLossSpec(name=name, fn=fn, agg_mode=agg_mode))


def rollout_engine(name: str) -> Callable[[F], F]:
    """Register ``factory`` (see :class:`EngineSpec`) as the rollout engine called ``name`` (``rollout.name``)."""
    return lambda factory: mark(factory, EngineSpec(name=name, factory=factory))


def environment(
    name: str, *, options: type[BaseModel] | None = None, tool_options: Sequence[str] = ()
) -> Callable[[F], F]:
    """Register a class (or factory) as the environment called ``name``: the kernel calls ``factory(**options)``
    once per episode (:mod:`plugrl.rollout.environment`); ``options`` models ``environment_options``;
    ``tool_options`` names the options that list registered tools (``("tools",)``), checked at start-up."""
    model = _options_model(options, "plugrl.environment")
    unknown = [k for k in tool_options if model is None or k not in model.model_fields]
    if unknown:
        raise TypeError(f"plugrl.environment({name!r}): tool_options {unknown} are not fields of its options model")
    spec = EnvironmentSpec(name=name, factory=None, options=model, tool_options=tuple(tool_options))
    return lambda factory: mark(factory, replace(spec, factory=factory))


def environment_family(name: str, *, options: type[BaseModel] | None = None) -> Callable[[F], F]:
    """Register ``load`` as a family of environments, named ``name:<id>`` in the config
    (``environment: verifiers:wordle``): the kernel calls ``load(id, **options)`` once per run, at start-up,
    with ``environment_options`` (validated by ``options`` when given), and trains the
    :class:`EnvironmentSpec` it returns (or the class: an environment without options). What ``load``
    raises is a start-up error naming the environment: a missing library, an unknown id."""
    model = _options_model(options, "plugrl.environment_family")
    spec = EnvironmentSpec(name=name, factory=None, options=model)
    return lambda load: mark(load, replace(spec, load=load))


def specs_of(obj: Any) -> tuple[Spec, ...]:
    """The specs attached to ``obj`` by the decorators above (empty if none)."""
    found = getattr(obj, SPEC_ATTR, ())
    return found if isinstance(found, tuple) else ()


def with_plugin(spec: Spec, plugin: str) -> Spec:
    return replace(spec, plugin=plugin)


@dataclass
class Registry:
    """Everything the loaded plugins registered, keyed by name."""

    rewards: list[RewardSpec] = field(default_factory=list)
    datasets: dict[str, DatasetSpec] = field(default_factory=dict)
    templates: dict[str, TemplateSpec] = field(default_factory=dict)
    estimators: dict[str, EstimatorSpec] = field(default_factory=dict)
    policy_losses: dict[str, PolicyLossSpec] = field(default_factory=dict)
    environments: dict[str, EnvironmentSpec] = field(default_factory=dict)
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    engines: dict[str, EngineSpec] = field(default_factory=dict)
    plugins: dict[str, str] = field(default_factory=dict)  # plugin name -> where it came from
    default_reward: str | None = None  # reward.default: the reward of every data_source no pattern matches
    extra_rewards: tuple[str, ...] = ()  # reward.extra: scored on every sample besides its routed rewards
    hooks: Any = None  # the plugin manager's hook relay, for the lifecycle hooks
    # records of kinds the kernel does not know, which a plugin defines for other plugins to register with its own
    # decorator (made with :func:`mark`): every one marked on a loaded plugin's functions, its ``plugin`` field (if
    # it has one) set. The plugin that defines the kind finds them here, and checks them (clashes included).
    plugin_records: list[Any] = field(default_factory=list)

    def named(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """``(kind, {name: record})`` of the tables keyed by name (every one but the rewards, a list routed by
        ``data_source``): what ``plugrl plugins`` lists and :func:`plugrl.plugins.check_registry` checks."""
        return (
            ("dataset", self.datasets),
            ("template", self.templates),
            ("estimator", self.estimators),
            ("policy loss", self.policy_losses),
            ("environment", self.environments),
            ("tool", self.tools),
            ("rollout engine", self.engines),
        )
