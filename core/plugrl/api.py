"""The plugin API: which plugins this kernel loads, and the forms of the contract that changed.

``PLUGIN_API`` numbers the plugin contract. It goes up (with the kernel's minor version, 0.x) when a
change can break a plugin written against the previous contract: a hook renamed, removed, or given other
arguments or another return form; a field of a record that plugins build or read (``RewardSpec`` and the
other specs, ``AdvantageBatch``, ``AdvantageResult``, ``Sample``, ``EnvStart``, ``EnvStep``, ``Turn``)
renamed, removed or retyped; a function plugins import from ``plugrl`` moved or removed. Additions (a new
hook, a new optional field or keyword) leave it as it is.

- API 1: plugrl 0.1.x.
- API 2: plugrl 0.2.x. ``AdvantageBatch.extras`` became the typed fields ``prompts``, ``responses`` and
  ``baseline_scores`` (``extras`` still reads, with a warning, until 0.3); a solution-grouping estimator asks the
  step context (``batch.context``) for its groups through plugrl-advantages' ``classify``, where the solution
  classifiers moved with their hook and record; ``plugrl.algorithms.grpo_outcome_advantage`` and
  ``gae_advantages`` moved into the advantages plugin; the optional parts moved into packages beside the kernel
  (:data:`MOVED` names each: the managed model server, the sandbox and tool pool, agents, rollout servers,
  vision-language models, LoRA, the policy losses beside ``vanilla``, ``plugrl eval``, the hub upload, the
  rollout correction, the shared-prompt attention kernels, tensor parallelism, the multi-turn episode runner, tool
  authoring, the rollouts generated ahead, the GPU placement of servers and of a reward model's own process).

A plugin says which kernels it works with. An installed plugin declares the range in its distribution's
dependencies (``dependencies = ["plugrl>=0.2,<0.3"]`` in its ``pyproject.toml``); a local ``module:`` plugin
may set ``PLUGRL_REQUIRES = ">=0.2,<0.3"`` in its module. The loader refuses a plugin whose range leaves out
the running kernel before importing it (:mod:`plugrl.plugins`), and warns about an installed plugin that
declares none. A form that an API change replaced keeps working for one release with a
:class:`PluginAPIWarning` that names the new form, and is removed in the next.

This module imports nothing of plugrl: the kernel's version is passed in (``plugrl.__version__``).
"""

from __future__ import annotations

import dis
import importlib
import inspect
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PLUGIN_API = 2


class PluginAPIWarning(DeprecationWarning):
    """A plugin uses a form of the plugin API that this kernel still accepts and the next release removes."""


# shown once per place in the code, also outside __main__ (Python hides DeprecationWarning there by default):
# the person who runs training must see it, not only the plugin's author
warnings.filterwarnings("default", category=PluginAPIWarning)


def running_version() -> str:
    """The running kernel's ``plugrl.__version__``, read from the loaded package (this module imports none of
    plugrl, so the modules below the package can use it)."""
    return sys.modules["plugrl"].__version__


def kernel(version: str) -> str:
    """``plugrl 0.2.0 (plugin API 2)``: how messages name the running kernel."""
    return f"plugrl {version} (plugin API {PLUGIN_API})"


def suggested_range(version: str) -> str:
    """The range a plugin built against kernel ``version`` declares: that version's minor series, ``>=0.2,<0.3``
    for any 0.2.x (a minor release may change the plugin API; ``plugrl new-plugin`` writes the same range)."""
    major, minor = (int(p) for p in re.findall(r"\d+", version)[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def required_range(requires: Iterable[str] | None) -> str | None:
    """The ``plugrl`` range among a distribution's ``Requires-Dist`` lines: ``">=0.2,<0.3"``; ``""`` when it
    depends on plugrl without a range; None when it does not depend on plugrl at all (or only under an extra)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    found: str | None = None
    for line in requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue  # not ours to judge; pip installed it
        if canonicalize_name(req.name) != "plugrl":
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        spec = str(req.specifier)
        found = spec if not found else ",".join(filter(None, (found, spec)))
    return found


def range_problem(spec: str, version: str, *, who: str, fix_plugin: str) -> str | None:
    """None when kernel ``version`` is in ``spec`` (``">=0.2,<0.3"``), else one line saying so and how to fix
    it; ``who`` names the plugin (``plugin 'x' (dist y 1.0)``), ``fix_plugin`` how to get another release of it."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        specs = SpecifierSet(spec)
    except InvalidSpecifier:
        return (
            f"{who} declares the plugrl range {spec!r}, which is not a version range: write one such as "
            f"{suggested_range(version)!r}"
        )
    try:
        running = Version(version)
    except InvalidVersion:  # a kernel built from an odd tree: nothing to compare against
        return None
    if specs.contains(running, prereleases=True):
        return None
    wanted = f"pip install 'plugrl{specs}'"
    if _kernel_too_old(specs, running):
        fix = f"upgrade plugrl ({wanted}), or {fix_plugin} made for plugrl {_series(running)}"
    else:
        fix = f"{fix_plugin} made for plugrl {_series(running)}, or install a plugrl it supports ({wanted})"
    return f"{who} requires plugrl{specs}; this is {kernel(version)}: {fix}"


def _series(version: Any) -> str:
    return f"{version.major}.{version.minor}.x"


def _kernel_too_old(specs: Any, running: Any) -> bool:
    """The range wants a newer kernel (a lower bound fails) rather than an older one."""
    from packaging.version import Version

    for s in specs:
        if s.contains(running, prereleases=True):
            continue
        if s.operator in (">", ">="):
            return True
        if s.operator in ("~=", "==", "===") and Version(s.version.removesuffix(".*")) > running:
            return True
    return False


# --------------------------------------------------------------------------- forms an API change replaced


@dataclass(frozen=True)
class OldForm:
    """An attribute a plugin function may still read, kept for one release after ``api`` replaced it."""

    name: str  # what plugins wrote, e.g. "AdvantageBatch.extras"
    attribute: str  # the attribute read, e.g. "extras"
    api: int  # the plugin API that replaced it
    new: str  # what to write instead
    removed_in: str  # the kernel release that drops it


EXTRAS = OldForm(
    name="AdvantageBatch.extras",
    attribute="extras",
    api=2,
    new="the typed fields batch.prompts, batch.responses and batch.baseline_scores "
    '(batch.extras["responses"] is batch.responses)',
    removed_in="0.3",
)

# the old forms an estimator function may use (checked at load, warned at use)
ESTIMATOR_OLD_FORMS = (EXTRAS,)

# names plugins imported from plugrl that plugin API 2 moved: (module, name) -> (api, where it is now); a name ""
# stands for the module itself. Each row: the module, the names that left it, where they are, their package.
_MOVES_API_2 = (
    ("plugrl.algorithms", "grpo_outcome_advantage", "plugrl_advantages.estimators.grpo", "plugrl-advantages"),
    ("plugrl.algorithms", "gae_advantages", "plugrl_advantages.estimators.gae", "plugrl-advantages"),
    ("plugrl", "solution_classifier ClassifierSpec", "plugrl_advantages.classify", "plugrl-advantages"),
    ("plugrl.specs", "solution_classifier ClassifierSpec", "plugrl_advantages.classify", "plugrl-advantages"),
    ("plugrl.classify", "", "plugrl_advantages.classify", "plugrl-advantages"),
    ("plugrl.servers", "", "plugrl_model_servers", "plugrl-model-servers"),
    ("plugrl.rollout.sandbox", "", "plugrl_tools.sandbox", "plugrl-tools"),
    ("plugrl.rollout.agents", "", "plugrl_agents", "plugrl-agents"),
    ("plugrl.rollout.agent_episodes", "", "plugrl_agents.episodes", "plugrl-agents"),
    ("plugrl.rollout.endpoint", "", "plugrl_agents.endpoint", "plugrl-agents"),
    ("plugrl.rollout.server", "", "plugrl_rollout_servers.server", "plugrl-rollout-servers"),
    ("plugrl.rollout.remote", "", "plugrl_rollout_servers.remote", "plugrl-rollout-servers"),
    ("plugrl.rollout.tools", "ToolExecutor call_in_process", "plugrl_tools.executor", "plugrl-tools"),
    ("plugrl.rollout.tools", "ToolCheck screen_call bad_arguments", "plugrl_tools.screening", "plugrl-tools"),
    (
        "plugrl.rollout.tools",
        "make_tool tool_schema check_schema is_importable tool_where strip_optional unannotate is_union",
        "plugrl_tools.authoring",
        "plugrl-tools",
    ),
    (
        "plugrl.algorithms",
        "gspo_policy_loss cispo_policy_loss sapo_policy_loss",
        "plugrl_advantages.losses",
        "plugrl-advantages",
    ),
    ("plugrl.policy_losses", "gspo luspo cispo sapo", "plugrl_advantages.losses", "plugrl-advantages"),
    ("plugrl.evaluate", "evaluate_cli", "plugrl_commands.evaluate", "plugrl-commands"),
    ("plugrl.hub", "", "plugrl_hub", "plugrl-hub"),
    ("plugrl.lora", "", "plugrl_lora.adapters", "plugrl-lora"),
    ("plugrl.config", "LoRAConfig", "plugrl_lora.fields", "plugrl-lora"),
    ("plugrl.config", "FilterGroupsConfig OverlongBufferConfig", "plugrl_dapo.fields", "plugrl-dapo"),
    ("plugrl.algorithms", "overlong_penalty", "plugrl_dapo.sampling", "plugrl-dapo"),
    (
        "plugrl.episodes",
        "group_metric check_group_metric varied_groups SCORE_METRICS FINAL_METRIC",
        "plugrl_dapo.sampling",
        "plugrl-dapo",
    ),
    ("plugrl.config", "RolloutCorrectionConfig", "plugrl_advantages.correction_fields", "plugrl-advantages"),
    (
        "plugrl.rollout.vllm_engine",
        "adapter_name_mapping POLICY_ADAPTER POLICY_ADAPTER_ID",
        "plugrl_lora.vllm",
        "plugrl-lora",
    ),
    ("plugrl.vision", "", "plugrl_vision", "plugrl-vision"),
    (
        "plugrl.rollout_correction",
        "rollout_correction RolloutCorrection importance_weights log_importance_weights "
        "truncate_weights reject correction_metrics takes_weights check_loss_takes_weights MODES LEVELS SAFETY_BOUND",
        "plugrl_advantages.rollout_correction",
        "plugrl-advantages",
    ),
    (
        "plugrl.attention",
        "NAME Tiles shared_prefix_attention FLEX_BLOCK prefix_block_mask flex_prefix_attention "
        "uses_flex attention_forward register",
        "plugrl_attention",
        "plugrl-attention",
    ),
    (
        "plugrl.tracking",
        "trl_aliases TRL_METRIC_ALIASES TRL_WANDB_PREFIX",
        "plugrl_compat.trl_metrics",
        "plugrl-compat",
    ),
    ("plugrl.tracking", "write_verl_samples", "plugrl_compat.verl_samples", "plugrl-compat"),
    ("plugrl.config", "reference_markdown write_reference", "plugrl_commands.config_reference", "plugrl-commands"),
    (
        "plugrl.parallel",
        "parallelize check_model VocabParallel vocab_parallel_logprobs vocab_parallel_entropy",
        "plugrl_tensor_parallel",
        "plugrl-tensor-parallel",
    ),
    ("plugrl.rollout.multiturn", "EpisodeRunner EnvironmentTimeout", "plugrl_multiturn.turns", "plugrl-multiturn"),
    ("plugrl.rollouts_ahead", "RolloutsAhead", "plugrl_off_policy", "plugrl-off-policy"),
    ("plugrl.rollout.chat", "", "plugrl_multiturn.chat", "plugrl-multiturn"),
    ("plugrl.rollout.first_prompts", "", "plugrl_multiturn.first_prompts", "plugrl-multiturn"),
    (
        "plugrl.rollout.routing",
        "environment_options load_environment_families",
        "plugrl_multiturn.routing",
        "plugrl-multiturn",
    ),
    (
        "plugrl.placement",
        "rollout_server_gpus ServerGPUs",
        "plugrl_rollout_servers.placement",
        "plugrl-rollout-servers",
    ),
    (
        "plugrl.placement",
        "launched_server_gpu own_gpu_fraction shared_gpu_fraction OWN_GPU_FRACTION SERVER_CONTEXT_BYTES "
        "TRAINING_HEADROOM",
        "plugrl_model_servers.placement",
        "plugrl-model-servers",
    ),
    ("plugrl.placement", "child_device", "plugrl_reward_model.scoring", "plugrl-rewards-model"),
)
MOVED = {
    **{
        (module, name): (2, f"{where}.{name} (package {package})" if name else f"{where} (package {package})")
        for module, names, where, package in _MOVES_API_2
        for name in names.split() or [""]
    },
    # the same thing under another name: a whole module, or the decorator now at the top of plugrl
    ("plugrl", "lora"): (2, "plugrl_lora.adapters (package plugrl-lora)"),
    ("plugrl.startup", "check_vision_run"): (2, "plugrl_vision.checks.check_config (package plugrl-vision)"),
    ("plugrl.startup", "check_multi_turn"): (2, "plugrl_multiturn.checks.check_config (package plugrl-multiturn)"),
    ("plugrl.startup", "check_off_policy"): (2, "plugrl_off_policy.check (package plugrl-off-policy)"),
    ("plugrl.specs", "tool"): (2, "plugrl.tool"),
    ("plugrl.rollout.tools", "tool"): (2, "plugrl.tool"),
}


def names_on_first_use(package: str, home: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` (PEP 562) for a package that imports its parts on first use of their names:
    ``home`` maps each name to the submodule it lives in; once loaded, a name is the package's own (pluggy finds
    hooks among those). For packages whose config fields (group ``plugrl.config_fields``) every run config imports,
    so that their ``__init__`` stays light."""

    def getattr_(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *home})

    return getattr_, dir_


def old_form_message(form: OldForm, version: str, where: str) -> str:
    """The warning for ``where`` (e.g. ``plugin 'x' estimator 'y'``) using ``form``."""
    return (
        f"{where} reads {form.name}, a form of plugin API {form.api - 1} that {kernel(version)} still accepts "
        f"and plugrl {form.removed_in} removes: read {form.new} instead"
    )


def reads_attribute(fn: Callable[..., Any], attribute: str) -> bool:
    """``fn``'s own code (nested functions and comprehensions included; not the functions it calls) reads
    ``something.<attribute>``."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    todo = [code] if isinstance(code, types.CodeType) else []
    while todo:
        code = todo.pop()
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == attribute:
                return True
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return False


_MISSING_NAME = (
    re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>plugrl[\w.]*)'"),
    re.compile(r"module '(?P<module>plugrl[\w.]*)' has no attribute '(?P<name>\w+)'"),
    re.compile(r"No module named '(?P<module>plugrl(?:\.[\w]+)*)'"),
)


def import_hint(error: BaseException, version: str) -> str:
    """For a plugin that failed to import because a name it takes from plugrl is gone: where that name went,
    or that the plugin was written for another kernel. Empty for any other failure."""
    if not isinstance(error, (ImportError, AttributeError)):
        return ""
    text = str(error)
    for pattern in _MISSING_NAME:
        m = pattern.search(text)
        if not m:
            continue
        module, name = m.group("module"), m.groupdict().get("name")
        if module.split(".")[0] != "plugrl" or (name is None and module == "plugrl"):
            return ""
        moved = MOVED.get((module, name or ""))
        missing = f"{module}.{name}" if name else module
        if moved:
            return f"; {missing} moved in plugin API {moved[0]}: import {moved[1]}"
        return (
            f"; {kernel(version)} has no {missing}: the plugin may be written for another plugrl: install a "
            "release of it made for this one"
        )
    return ""
