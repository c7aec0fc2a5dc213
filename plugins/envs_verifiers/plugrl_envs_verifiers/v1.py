"""verifiers v1 environments (verifiers 0.4, ``import verifiers.v1 as vf``), trained as their authors wrote them.

``environment: verifiers:<taskset id>`` names an installed v1 taskset package (``vf-init``'s layout: a package
exporting its ``vf.Taskset`` subclass in ``__all__``; a hub id ``owner/name@version`` imports as ``name``) or a
built-in one. ``environment_options`` is verifiers' ``[env]`` block as ``vf-eval`` reads it from TOML
(``taskset``: the taskset's options, ``agent``: the seat's harness, runtime and limits, ``timeout``, ...), plus
two keys of plugrl's own: ``sandbox`` (:class:`~plugrl_envs_verifiers.harness_runtime.HarnessLimits`) and
``eval_taskset`` (taskset options for a validation split).

verifiers loads and runs the environment (``vf.load_environment``: the taskset's own ``Env``, else
``SingleAgentEnv``), each episode as prime-rl's env server runs a dispatched task: the task rebuilt from its
data (``TaskData``, carried in the sample's row), ``env.run_slot(slot, ctx)`` inside ``env.serving()`` (the
taskset's shared MCP tool servers and the interception server, up for each step's episodes). The harness
program runs in the ``subprocess`` runtime under plugrl's sandbox limits
(:mod:`plugrl_envs_verifiers.harness_runtime`) and reaches the model as v1 reaches any: through verifiers'
interception server, whose client (``EvalClientConfig``) forwards each call to plugrl's rollout endpoint
(:mod:`plugrl_agents.endpoint`) with the episode's key. There plugrl samples the reply and records its exact
tokens (:mod:`plugrl_agents.episodes`): the trained tokens are the sampled ones; the harness's tool
results, user turns and chat-template tokens between calls are context, masked out of the loss.

The episode's score is verifiers' own: the trace's ``reward`` (its ``@vf.reward`` functions and plugged judges,
weighted), each reward's score and each metric logged as a part (``reward/<name>/mean``).

Refused at start, each naming what to change: a runtime other than ``subprocess`` (containers, hosted
sandboxes), built-in harnesses other than ``null`` and ``bash`` (their programs are installed from the network
and some speak other APIs), tasks that need a container, environments with more than one agent seat, a seat
that pins its own model or client, and retries (a retried rollout would be a second sample in one sequence).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from pydantic import ValidationError
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.utils.loaders import builtin_harness_ids, harness_class

from plugrl.rollout.environment import EpisodeScore
from plugrl.specs import DatasetSpec, EnvironmentSpec
from plugrl_agents.agents import AgentEpisode

from .harness_runtime import HarnessLimits, Sandbox, install, sandbox_for_episode

log = logging.getLogger("plugrl.envs.verifiers")

MODEL = "policy"  # the model name the traces record; plugrl's endpoint answers any name with the policy
RUNNABLE_HARNESSES = ("null", "bash")  # verifiers' bundled chat program: runs with the trainer's Python
OWN_KEYS = ("sandbox", "eval_taskset")  # environment_options keys of plugrl's, beside verifiers' [env] block


class ClassicEnvironment(Exception):
    """The id names an environment of verifiers' classic API (``load_environment``), not a v1 taskset."""


def load(env_id: str, options: dict[str, Any]) -> EnvironmentSpec:
    """The v1 environment of taskset ``env_id`` with ``options`` (see the module docstring)."""
    for noisy in ("verifiers", "aiohttp.access"):  # a line per rollout and per call, unless asked for
        if logging.getLogger(noisy).level == logging.NOTSET:
            logging.getLogger(noisy).setLevel(logging.WARNING)
    _refuse_classic(env_id)
    limits = _own(HarnessLimits, options.get("sandbox"), "sandbox")
    block = {k: v for k, v in options.items() if k not in OWN_KEYS}
    role, defaulted = _seat(env_id, block)
    config = _env_config(env_id, block)
    _check_seat(config, role, env_id)
    env = vf.load_environment(config)
    _check_tasks(env, env_id)
    sandbox = Sandbox.checked(limits)
    install()
    if defaulted:
        log.info(
            "verifiers:%s: environment_options.%s.runtime unset: plugrl runs the harness in the subprocess "
            "runtime under its sandbox limits (environment_options.sandbox: %s)",
            env_id,
            role,
            limits.model_dump(),
        )
    played = V1Environment(env, env_id, role, sandbox, options.get("eval_taskset"))
    episode = type(
        f"VerifiersV1_{type(env).__name__}",
        (V1Episode,),
        {"v1": played, "time_limit_s": limits.episode_s, "__doc__": f"An episode of verifiers v1 {env_id!r}."},
    )
    return EnvironmentSpec(name=env_id, factory=episode, dataset=DatasetSpec(name=env_id, fn=played.rows))


# ---------------------------------------------------------------------------- loading and checks


def _refuse_classic(env_id: str) -> None:
    """A classic-API environment (a module with ``load_environment``, or one that uses verifiers' classic classes,
    gone in 0.4) is refused in one line naming the verifiers that runs it."""
    try:
        module = vf.import_taskset(env_id)
    except (AttributeError, ImportError) as e:  # `class X(vf.MultiTurnEnv)`, `from verifiers import Parser`, ...
        if not _uses_classic_api(e):
            raise
        raise ClassicEnvironment(env_id) from e
    exported = [getattr(module, name, None) for name in getattr(module, "__all__", [])]
    is_taskset = any(isinstance(obj, type) and issubclass(obj, vf.Taskset) for obj in exported)
    if not is_taskset and callable(getattr(module, "load_environment", None)):
        raise ClassicEnvironment(env_id)


def _uses_classic_api(error: Exception) -> bool:
    """Whether importing a module failed on a name of verifiers' classic API, which 0.4 no longer has."""
    text = str(error)
    missing_module = "No module named 'verifiers." in text and "'verifiers.v1" not in text
    return missing_module or "module 'verifiers' has no attribute" in text or "from 'verifiers'" in text


def _own(model: type, value: Any, key: str) -> Any:
    try:
        return model.model_validate(value or {})
    except ValidationError as e:
        raise ValueError(_validation_message(e, f"environment_options.{key}")) from None


def _validation_message(error: ValidationError, prefix: str) -> str:
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in (prefix, *item["loc"]) if part != "")
        problems.append(f"{where}: {item['msg']}")
    return "; ".join(problems)


def _seat(env_id: str, block: dict[str, Any]) -> tuple[str, bool]:
    """The environment's one agent seat, and whether its runtime was left to plugrl (set to ``subprocess`` in
    ``block``). More than one seat, or a YAML ``null`` harness id, is refused."""
    config_cls = vf.env_config_type(env_id, block.get("id") or "")
    roles = [name for name, field in config_cls.model_fields.items() if isinstance(field.default, vf.AgentConfig)]
    if len(roles) != 1:
        raise ValueError(
            f"verifiers:{env_id} plays {len(roles)} agent seats ({', '.join(roles)}); plugrl trains environments "
            "with one seat (SingleAgentEnv and single-seat Env subclasses): an episode is one sequence of the policy"
        )
    role = roles[0]
    seat = block.get(role) or {}
    if not isinstance(seat, dict):
        raise ValueError(f"environment_options.{role} must be a mapping of the seat's options (harness, runtime, ...)")
    harness = seat.get("harness")
    if isinstance(harness, dict) and "id" in harness and harness["id"] is None:
        raise ValueError(
            f"environment_options.{role}.harness.id is YAML's null (nothing), so verifiers would pick its default "
            f"harness; for verifiers' null harness write the name in quotes: {role}: {{harness: {{id: 'null'}}}}"
        )
    defaulted = "runtime" not in seat
    if defaulted:
        block[role] = {**seat, "runtime": {"type": "subprocess"}}
    return role, defaulted


def _env_config(env_id: str, block: dict[str, Any]) -> Any:
    taskset = block.get("taskset") or {}
    if not isinstance(taskset, dict):
        raise ValueError("environment_options.taskset must be a mapping of the taskset's options")
    if taskset.get("id") not in (None, env_id):
        raise ValueError(
            f"environment_options.taskset.id={taskset['id']!r}: the taskset is the one named in "
            f"`environment: verifiers:{env_id}`; leave taskset.id out"
        )
    try:
        return vf.resolve_env_config({**block, "taskset": {**taskset, "id": env_id}})
    except ValidationError as e:
        raise ValueError(_validation_message(e, "environment_options")) from None


def _check_seat(config: Any, role: str, env_id: str) -> None:
    seat = getattr(config, role)
    where = f"environment_options.{role}"
    kind = seat.runtime.type
    if kind != "subprocess":
        what = "a hosted sandbox" if kind in ("prime", "modal", "e2b") else "a container"
        raise ValueError(
            f"{where}.runtime.type={kind!r} is {what}, which cannot start here; plugrl runs harnesses in the "
            f"subprocess runtime under its sandbox limits: set {role}: {{runtime: {{type: subprocess}}}} or leave "
            "it out"
        )
    harness = config.agent_harnesses()[role]
    if harness.id in builtin_harness_ids() and harness.id not in RUNNABLE_HARNESSES:
        raise ValueError(
            f"{where}.harness.id={harness.id!r}: verifiers' {harness.id} harness cannot run here (its program is "
            "installed from the network at setup, and may speak another API than chat completions); plugrl runs "
            f"the {' and '.join(RUNNABLE_HARNESSES)} harnesses and harnesses of your own that run without a container"
        )
    if harness_class(harness.id).NEEDS_CONTAINER:
        raise ValueError(f"{where}.harness.id={harness.id!r} needs a container, which cannot start here")
    for key in ("model", "client"):
        if getattr(seat, key) is not None:
            raise ValueError(
                f"{where}.{key} pins the seat to another model or endpoint; the seat is the policy plugrl trains: "
                f"leave {key} out"
            )
    for label, retries in ((f"{where}.retries", seat.retries), ("environment_options.retries", config.retries)):
        if retries.max_retries or any(rule.max_retries for rule in retries.rules):
            raise ValueError(
                f"{label} retries failed rollouts; a retry would be a second sample of the policy in one episode's "
                "sequence: leave retries out"
            )


def _check_tasks(env: Any, env_id: str) -> None:
    task_cls = type(env.taskset).task_type()
    if task_cls.NEEDS_CONTAINER:
        raise ValueError(f"verifiers:{env_id}'s tasks ({task_cls.__name__}) need a container, which cannot start here")
    data_cls = task_cls.data_type()
    excluded = [name for name, field in data_cls.model_fields.items() if field.exclude]
    if excluded:  # the row carries the task's data: an excluded field would come back defaulted
        raise ValueError(
            f"{data_cls.__name__} excludes {excluded} from serialization; a task must survive its row whole, as it "
            "must verifiers' env server's wire (drop exclude=True)"
        )


# ---------------------------------------------------------------------------- playing


class V1Environment:
    """A loaded v1 environment: its rows (:meth:`rows`) and its episodes (:meth:`play`)."""

    def __init__(self, env: Any, env_id: str, role: str, sandbox: Sandbox, eval_taskset: Any) -> None:
        self.env, self.env_id, self.role, self.sandbox = env, env_id, role, sandbox
        self.eval_taskset = eval_taskset
        self.task_configs = {"train": env.config.taskset.task}  # each split's TaskConfig, by the rows' task_split
        self.serving = StepServing(env)

    @property
    def seat(self) -> Any:
        return getattr(self.env.config, self.role)

    def rows(self, split: str) -> Iterator[dict[str, Any]]:
        """The taskset's tasks as rows: the first messages (system prompt and prompt), the environment's id as
        ``data_source``, the task's data (``task_data``) and the split whose task options score it."""
        taskset = self.env.taskset if split == "train" else self._eval_taskset(split)
        for task in taskset:
            yield {
                "prompt": _messages(task.data, f"verifiers:{self.env_id} task {task.data.idx}"),
                "data_source": self.env_id,
                "task_data": task.data.model_dump(mode="json"),
                "task_split": split,
            }

    def _eval_taskset(self, split: str) -> Any:
        if self.eval_taskset is None:
            raise ValueError(
                f"verifiers:{self.env_id} is a v1 taskset, which has no {split!r} split: set "
                "environment_options.eval_taskset to the taskset options that load the validation tasks (e.g. "
                "{split: test}), or name them with data.val_files"
            )
        if not isinstance(self.eval_taskset, dict):
            raise ValueError("environment_options.eval_taskset must be a mapping of taskset options")
        base = self.env.config.taskset
        try:
            config = type(base).model_validate({**base.model_dump(), **self.eval_taskset, "id": base.id})
        except ValidationError as e:
            raise ValueError(_validation_message(e, "environment_options.eval_taskset")) from None
        self.task_configs[split] = config.task
        return vf.load_taskset(config)

    def task(self, row: dict[str, Any]) -> Any:
        """The row's task, rebuilt as verifiers' env server rebuilds a dispatched one."""
        task_cls = type(self.env.taskset).task_type()
        data = task_cls.data_type().model_validate(row["task_data"])
        return task_cls(data, self.task_configs.get(row.get("task_split", "train"), self.task_configs["train"]))

    async def play(self, client: Any, row: dict[str, Any]) -> EpisodeScore:
        """One episode of the row's task, its model calls answered through ``client``'s endpoint and key."""
        task = self.task(row)
        # verifiers reads a client's key from the environment variable its config names: one per episode
        key_var = f"PLUGRL_EPISODE_{secrets.token_hex(8)}_API_KEY"
        os.environ[key_var] = client.api_key
        try:
            with sandbox_for_episode(self.sandbox):
                async with self.serving:
                    ctx = vf.ModelContext(
                        model=MODEL,
                        client=vf.EvalClientConfig(base_url=str(client.base_url).rstrip("/"), api_key_var=key_var),
                        sampling=vf.SamplingConfig(),
                    )
                    (slot,) = self.env.slots(task)
                    episode = await self.env.run_slot(slot, ctx)
        finally:
            os.environ.pop(key_var, None)
        return episode_score(episode)


class V1Episode(AgentEpisode):
    """One episode of a v1 environment (``v1``, set on the subclass :func:`load` makes): an agent the kernel plays
    through its rollout endpoint."""

    v1: V1Environment
    is_async = True

    async def solve(self, client: Any, sample: Any) -> EpisodeScore:  # type: ignore[override]
        return await self.v1.play(client, sample.row)


class StepServing:
    """``env.serving()`` (shared tool servers, the interception server) held while episodes play: entered by the
    first episode on an event loop, left by the last. Each step's agents run on a loop of their own, which the
    servers' sockets and tasks belong to."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock: asyncio.Lock | None = None
        self.users = 0
        self.context: Any = None

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # a new step: the last step's loop, and what it served, are gone
            self.loop, self.lock, self.users, self.context = loop, asyncio.Lock(), 0, None
        assert self.lock is not None
        async with self.lock:
            if self.users == 0:
                context = self.env.serving()
                await context.__aenter__()
                self.context = context
            self.users += 1

    async def __aexit__(self, *exc: object) -> None:
        assert self.lock is not None
        async with self.lock:
            self.users -= 1
            if self.users == 0 and self.context is not None:
                context, self.context = self.context, None
                await context.__aexit__(None, None, None)


def episode_score(episode: Any) -> EpisodeScore:
    """The episode's score as verifiers computed it: the trace's weighted reward, each reward's score and each
    metric as a part. An episode that failed (no scored trace) raises with verifiers' error, which ends the
    plugrl episode as an error."""
    traces = episode.traces
    if len(traces) > 1:
        raise RuntimeError(f"the episode ran {len(traces)} agent runs; plugrl trains one per episode")
    trace = traces[0] if traces else None
    if trace is None or not trace.ok or not episode.ok:
        errors = [*episode.errors, *(trace.errors if trace is not None else [])]
        why = f"{errors[-1].type}: {errors[-1].message}" if errors else "no trace"
        raise RuntimeError(f"the verifiers rollout failed: {why}")
    parts = {name: reward.score for name, reward in trace.rewards.items() if reward is not None}
    parts.update({name: value for name, value in trace.metrics.items() if value is not None and name not in parts})
    return EpisodeScore(trace.reward, parts)


def _messages(data: Any, where: str) -> list[dict[str, str]]:
    """The task's first messages as plain chat: its system prompt, then its prompt (text, or messages)."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if data.prompt is None:
        raise ValueError(
            f"{where} has no prompt (the user opens its conversation); plugrl trains tasks whose prompt opens it"
        )
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    for message in data.prompt:
        wire = message_to_wire(message)
        content = wire.get("content")
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise ValueError(f"{where}: its prompt holds images; plugrl's agents take text prompts")
            content = "".join(part["text"] for part in content)
        messages.append({"role": wire["role"], "content": content or ""})
    return messages


# ---------------------------------------------------------------------------- the run's limits


def check_run(config: Any, loaded: dict[str, V1Environment]) -> list[str]:
    """At start: the seat's turn limit follows ``rollout.max_turns`` (verifiers then stops the rollout itself,
    scored, before plugrl would refuse a call), said when it lowers the environment's own; an infinite taskset
    needs ``data.max_samples``."""
    problems = []
    for name, played in loaded.items():
        seat, limit = played.seat, config.rollout.max_turns
        if seat.max_turns is None or seat.max_turns > limit:
            log.warning(
                "%s allows %s turns, rollout.max_turns=%d: its rollouts stop at %d turns; raise rollout.max_turns to "
                "give them the environment's own limit",
                name,
                "unlimited" if seat.max_turns is None else seat.max_turns,
                limit,
                limit,
            )
            seat.max_turns = limit
        if not played.env.taskset.bounded and config.data.max_samples is None and not config.data.train_files:
            problems.append(
                f"{name}'s taskset is infinite (it generates tasks forever): bound the run's data with "
                "data.max_samples (verifiers' -n)"
            )
    return problems
