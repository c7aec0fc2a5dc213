"""A TRL ``GRPOConfig`` YAML as a plugrl config: ``plugrl train --trl-config grpo.yaml [overrides]``.

:func:`translate` is a pure function from the YAML's mapping (TRL's ``GRPOConfig`` and ``TrainingArguments``
keys, and the keys of TRL's ``grpo.py`` script: ``ModelConfig``, ``ScriptArguments``, ``datasets``, and the
math guide's ``field_mapping``) to a plugrl config tree, plus every key it could not map, each with the reason
(:class:`Translation`). :func:`load_trl_config` reads the file, applies overrides and validates the tree as
:func:`plugrl.config.build_config` does any config; the start-up log names the keys not mapped on one line.

Keys missing from the file take TRL's defaults where those decide what is trained and differ from plugrl's
(:data:`TRL_DEFAULTS`: 8 completions per device, 8 generations, 512 completion tokens, learning rate 1e-6,
3 epochs, seed 42, gradient checkpointing on, TRL's linear schedule, which plugrl does not have and says so).

Batches (``P`` = processes: ``WORLD_SIZE``, as torchrun and accelerate set it, else 1; ``b`` =
``per_device_train_batch_size``; ``GA`` = ``gradient_accumulation_steps``; ``G`` = ``num_generations``;
``S`` = ``steps_per_generation``, default ``GA``, or ``generation_batch_size / (b * P)``). TRL generates
``b * P * S`` completions at a time, ``G`` per prompt, and takes one optimizer step per ``b * P * GA`` of them
(``GA`` micro-batches of ``b`` on each process), ``num_iterations`` times over each generation batch. A plugrl
step generates ``data.train_batch_size`` prompts x ``rollout.n`` and takes one optimizer step per
``actor.ppo_mini_batch_size`` prompts (its micro-batches, by token budget, accumulate gradients), for
``actor.ppo_epochs`` epochs. So:

- ``rollout.n = G``; ``data.train_batch_size = b * P * S / G``; ``actor.ppo_mini_batch_size = b * P * GA / G``;
  ``actor.ppo_epochs = num_iterations``. Both must be whole numbers of prompts (TRL refuses the first too;
  plugrl's optimizer steps take whole groups, so it refuses the second), and ``S`` a multiple of ``GA``.
- One plugrl step is ``k = num_iterations * S / GA`` optimizer steps, as many as TRL takes per generation
  batch; TRL counts optimizer steps, so ``max_steps``, ``save_steps``, ``logging_steps``, ``eval_steps`` and
  ``warmup_steps`` are divided by ``k`` (rounded up, and said when not exact). plugrl's schedule advances
  once per step: with ``k > 1`` each of its learning rates holds for ``k`` optimizer steps.

Everything else, one key to one key: see the table in docs/coming_from_trl.md (``--trl-config``).
``beta: 0`` loads no reference model (``actor.use_kl_loss: false``), as in TRL. A ``plugrl:`` mapping in the
file holds plugrl keys (plugins, rewards, data_source) merged over the translation; its ``plugins`` always
include ``advantages``, which holds GRPO's estimator. ``env:`` sets environment variables, as TRL's parser does.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from plugrl.config import Config, ConfigError, build_config, is_secret_key, parse_override, read_yaml_mapping
from plugrl.readers import Fate as KeyFate
from plugrl_compat.trl_keys import KEYS, NO_SETTING
from plugrl_compat.trl_reward_funcs import trl_reward_name

log = logging.getLogger("plugrl.trl_config")  # the name the start-up lines carry (docs/coming_from_trl.md)

# TRL's defaults (GRPOConfig over transformers' TrainingArguments) that decide what is trained and differ from
# plugrl's own: applied when the file leaves the key out
TRL_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 8,
    "num_iterations": 1,
    "max_completion_length": 512,
    "learning_rate": 1e-6,
    "lr_scheduler_type": "linear",
    "num_train_epochs": 3,
    "seed": 42,
    "gradient_checkpointing": True,
    "logging_steps": 10,
    "save_steps": 500,
    "output_dir": "trainer_output",
    "beta": 0.0,
    "epsilon": 0.2,
    "loss_type": "dapo",
    "hub_strategy": "every_save",
    "use_bias_correction_kl": True,  # read with beta > 0 only
    # TRL corrects for the vLLM/trainer mismatch by default; plugrl's own default is off (_rollout_correction)
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_max": 3.0,
}

# TRL's loss_type at importance_sampling_level token -> (actor.loss_mode, actor.loss_agg_mode), read off
# GRPOTrainer._compute_loss: the per-token loss, then how it is normalised
LOSS_TYPES: dict[str, tuple[str, str]] = {
    "grpo": ("vanilla", "seq-mean-token-mean"),  # each sequence's token mean, then the mean over sequences
    "dr_grpo": ("vanilla", "seq-mean-token-sum-norm"),  # token sums over (sequences x max_completion_length)
    "dapo": ("vanilla", "token-mean"),  # over the active tokens of the whole accumulated batch
    "bnpo": ("vanilla", "token-mean"),
    "luspo": ("vanilla", "seq-mean-token-sum"),  # each sequence's token sum, then the mean over sequences
    "cispo": ("cispo", "token-mean"),  # normalised as dapo
    "sapo": ("sapo", "seq-mean-token-mean"),  # normalised as grpo
}
# ... and at importance_sampling_level sequence (the GSPO family)
SEQUENCE_LOSS_TYPES = {"grpo": "gspo", "luspo": "luspo"}
REFUSED_LOSS_TYPES = {
    "vespo": "plugrl has no VESPO loss (gamma-weighted sequence ratios); the nearest is loss_type cispo (a clipped, "
    "detached importance weight on each token's log-probability)",
}
# TRL's vllm_importance_sampling_mode -> algorithm.rollout_correction (mode, level)
IS_MODES = {
    "token_truncate": ("truncate", "token"),
    "token_mask": ("mask", "token"),
    "sequence_truncate": ("truncate", "sequence"),
    "sequence_mask": ("mask", "sequence"),
}
IS_KEYS = (
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_cap",
)
DTYPES = {"bfloat16": "bfloat16", "float32": "float32", "auto": "auto"}
SCHEDULERS = {"constant": "constant", "constant_with_warmup": "constant", "cosine": "cosine"}
ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_hf")  # plugrl's optimizer is torch's AdamW


@dataclass
class Translation:
    """A translated TRL config: the plugrl tree, the TRL keys not acted on as ``"key=value (why)"``, the
    environment variables of its ``env:`` mapping, and the optimizer steps one plugrl step takes."""

    tree: dict[str, Any]
    unmapped: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    optimizer_steps_per_step: int = 1
    batch_text: str = ""


def _shown(key: str, value: Any) -> str:
    if is_secret_key(key):
        return f"{key}=***"
    text = repr(value) if not isinstance(value, str) else value
    return f"{key}={text if len(text) <= 60 else text[:60] + '...'}"


class _Translator:
    """The state of one translation: the values (the file's over TRL's defaults), what was read, the tree."""

    def __init__(self, trl: Mapping[str, Any], num_processes: int):
        self.given = dict(trl)
        self.values = {**TRL_DEFAULTS, **self.given}
        self.num_processes = num_processes
        self.used: set[str] = set()
        self.tree: dict[str, Any] = {}
        self.notes: list[str] = []
        self.batch_text = ""  # how data.train_batch_size was computed, for the messages of load_trl_config
        self.reward_model = False  # a reward_funcs entry named a model: the reward_model plugin joins plugins

    # ---- reading
    def has(self, key: str) -> bool:
        return key in self.given

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        value = self.values.get(key, default)
        return default if value is None else value

    def number(self, key: str, kind: type, default: Any = None, *, positive: bool = False) -> Any:
        value = self.get(key, default)
        if value is None:
            return None
        try:
            if isinstance(value, bool):
                raise ValueError
            out = kind(value)
            if kind is int and out != float(value):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"TRL key '{key}' must be {'an integer' if kind is int else 'a number'}, got {value!r}; fix it in "
                f"the file or as `{key}=...`"
            ) from None
        if positive and out <= 0:
            raise ConfigError(f"TRL key '{key}' must be above 0, got {value!r}; fix it in the file or as `{key}=...`")
        return out

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(
                f"TRL key '{key}' must be true or false, got {value!r}; fix it in the file or as `{key}=...`"
            )
        return value

    # ---- writing
    def put(self, dotted: str, value: Any) -> None:
        node = self.tree
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value

    def note(self, key: str, why: str) -> None:
        """``key`` is not acted on (or only partly): said at start."""
        self.used.add(key)
        if key in self.values:
            shown = _shown(key, self.values[key])
            default = "" if self.has(key) else ", TRL's default"
            self.notes.append(f"{shown} ({why}{default})")
        else:
            self.notes.append(f"{key} ({why})")


def _ceil_div(t: _Translator, key: str, steps: float, k: int) -> int:
    """TRL's optimizer steps as plugrl steps of ``k`` optimizer steps each, rounded up (and said when not exact)."""
    out = max(1, math.ceil(steps / k))
    if steps != out * k and t.has(key):
        t.notes.append(
            f"{_shown(key, t.values[key])} (one plugrl step takes {k} optimizer steps: {out} steps, "
            f"{out * k} optimizer steps)"
        )
    return out


# ------------------------------------------------------------------------------------------ groups of keys


def _batches(t: _Translator) -> int:
    """data.train_batch_size, rollout.n, actor.ppo_mini_batch_size and ppo_epochs; returns the optimizer steps
    of one plugrl step (``k`` in the module docstring)."""
    p = t.num_processes
    b = t.number("per_device_train_batch_size", int, positive=True)
    ga = t.number("gradient_accumulation_steps", int, positive=True)
    g = t.number("num_generations", int, positive=True)
    iterations = t.number("num_iterations", int, positive=True)
    spg = t.number("steps_per_generation", int, positive=True)
    gen_batch = t.number("generation_batch_size", int, positive=True)
    world = f"per_device_train_batch_size ({b}) x {p} process{'es' if p > 1 else ''}"
    if spg and gen_batch:
        raise ConfigError(
            "TRL keys 'generation_batch_size' and 'steps_per_generation' are both set; TRL refuses that too: keep one"
        )
    if gen_batch:
        if gen_batch % (b * p):
            raise ConfigError(
                f"TRL key 'generation_batch_size' ({gen_batch}) must be a multiple of {world} = {b * p}, as TRL "
                "requires; change one of them"
            )
        spg = gen_batch // (b * p)
    spg = spg or ga
    if g < 2:
        raise ConfigError(
            f"TRL key 'num_generations' is {g}; GRPO needs at least 2 completions per prompt (TRL refuses it too)"
        )
    if spg < ga and ga % spg == 0 and iterations == 1:
        # an optimizer step takes ga / spg generation batches, all sampled by the same weights (no step comes
        # between them): the same as one generation batch of b * P * ga completions
        t.notes.append(
            f"steps_per_generation={spg} (below gradient_accumulation_steps ({ga}): TRL samples each optimizer "
            f"step's completions in {ga // spg} batches of the same weights; plugrl samples them at once, the same)"
        )
        spg = ga
    if spg % ga:
        raise ConfigError(
            f"steps_per_generation ({spg}) is not a multiple of gradient_accumulation_steps ({ga})"
            + (f" with num_iterations {iterations}" if spg < ga else "")
            + ": an optimizer step would take completions of two generation batches, which a plugrl step cannot; "
            "make it a multiple" + (" (or a divisor, with num_iterations 1)" if spg < ga and iterations == 1 else "")
        )
    completions, per_update = b * p * spg, b * p * ga
    if completions % g:
        raise ConfigError(
            f"{world} x {'gradient_accumulation_steps' if spg == ga else 'steps_per_generation'} ({spg}) = "
            f"{completions} completions per generation batch is not a multiple of num_generations ({g}); TRL "
            "refuses this too (generation_batch_size must be divisible by num_generations). Raise "
            "gradient_accumulation_steps or per_device_train_batch_size, run more processes, or lower "
            "num_generations"
        )
    if per_update % g:
        raise ConfigError(
            f"{world} x gradient_accumulation_steps ({ga}) = {per_update} completions per optimizer step is not a "
            f"multiple of num_generations ({g}): plugrl's optimizer steps take whole groups of a prompt's "
            "completions. Raise gradient_accumulation_steps, or make steps_per_generation smaller"
        )
    t.batch_text = (
        f"{world} x {'gradient_accumulation_steps' if spg == ga else 'steps_per_generation'} ({spg}) / "
        f"num_generations ({g}) = {completions // g} prompts per step"
    )
    t.put("rollout.n", g)
    t.put("data.train_batch_size", completions // g)
    t.put("actor.ppo_mini_batch_size", per_update // g)
    t.put("actor.ppo_epochs", iterations)
    return iterations * (spg // ga)


def _schedule(t: _Translator, k: int) -> int | None:
    """trainer.total_steps / total_epochs; returns TRL's optimizer steps when max_steps fixes them."""
    max_steps = t.number("max_steps", int, -1)
    epochs = t.number("num_train_epochs", float, positive=True)
    if max_steps is not None and max_steps > 0:
        if t.has("num_train_epochs"):
            t.note("num_train_epochs", "max_steps decides, as in TRL")
        t.put("trainer.total_steps", _ceil_div(t, "max_steps", max_steps, k))
        return max_steps
    whole = max(1, math.ceil(epochs))
    if whole != epochs:
        t.note("num_train_epochs", f"plugrl trains whole epochs: {whole}")
    t.put("trainer.total_epochs", whole)
    return None


def _optimizer(t: _Translator, k: int, total: int | None) -> None:
    t.put("actor.optim.lr", t.number("learning_rate", float, positive=True))
    for key, dotted in (("weight_decay", "actor.optim.weight_decay"), ("adam_epsilon", "actor.optim.eps")):
        if t.has(key):
            t.put(dotted, t.number(key, float))
    if t.has("adam_beta1") or t.has("adam_beta2"):
        t.put("actor.optim.betas", [t.number("adam_beta1", float, 0.9), t.number("adam_beta2", float, 0.999)])
    if t.has("optim") and t.get("optim") not in ADAMW:
        t.note("optim", "plugrl's optimizer is torch's AdamW")
    if t.has("max_grad_norm"):
        norm = t.number("max_grad_norm", float)
        if norm > 0:
            t.put("actor.grad_clip", norm)
        else:
            t.note("max_grad_norm", "plugrl always clips the gradient norm; actor.grad_clip stays 1.0")
    _scheduler(t)
    warmup = t.number("warmup_steps", float) if t.has("warmup_steps") else None
    ratio = t.number("warmup_ratio", float) if t.has("warmup_ratio") else None
    if warmup is not None and warmup >= 1:
        t.put("actor.optim.warmup_steps", _ceil_div(t, "warmup_steps", warmup, k))
        if ratio:
            t.note("warmup_ratio", "warmup_steps decides, as in transformers")
        return
    ratio = warmup if warmup else ratio  # transformers reads a warmup_steps below 1 as a ratio
    key = "warmup_steps" if warmup else "warmup_ratio"
    if ratio:
        if total is None:
            t.note(key, "a warm-up ratio needs max_steps; set actor.optim.warmup_steps (plugrl steps)")
        else:
            t.put("actor.optim.warmup_steps", max(1, math.ceil(math.ceil(ratio * total) / k)))


def _scheduler(t: _Translator) -> None:
    name = t.get("lr_scheduler_type")
    kwargs = t.get("lr_scheduler_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        t.note("lr_scheduler_kwargs", "not a mapping")
        kwargs = {}
    if name == "cosine_with_min_lr":
        rate = kwargs.get("min_lr_rate")
        if rate is None and kwargs.get("min_lr") is not None:
            rate = float(kwargs["min_lr"]) / t.number("learning_rate", float)
        t.put("actor.optim.lr_scheduler", "cosine")
        t.put("actor.optim.min_lr_ratio", float(rate or 0.0))
        kwargs = {k: v for k, v in kwargs.items() if k not in ("min_lr_rate", "min_lr")}
    elif name in SCHEDULERS:
        t.put("actor.optim.lr_scheduler", SCHEDULERS[name])
    else:
        t.note("lr_scheduler_type", "plugrl has constant and cosine schedules: constant used")
    if kwargs and dict(kwargs) != {"num_cycles": 0.5}:  # plugrl's cosine is TRL's half cycle
        t.note("lr_scheduler_kwargs", "plugrl's schedules take no extra arguments")


def _loss(t: _Translator) -> None:
    beta = t.number("beta", float)
    t.put("actor.use_kl_loss", beta > 0)  # beta 0: no reference model, as in TRL
    if beta > 0:
        t.put("actor.kl_loss_coef", beta)
        t.put("actor.kl_loss_type", "low_var_kl")  # TRL's per-token KL is Schulman's k3
        if t.get("use_bias_correction_kl"):
            t.note("use_bias_correction_kl", "plugrl's KL term is not weighted by the importance ratio")
    else:
        t.used.add("use_bias_correction_kl")  # TRL reads it only with a KL term
    loss_type = t.get("loss_type")
    if loss_type in REFUSED_LOSS_TYPES:
        raise ConfigError(f"TRL key 'loss_type' {loss_type!r}: {REFUSED_LOSS_TYPES[loss_type]}")
    if loss_type not in LOSS_TYPES:
        raise ConfigError(
            f"TRL key 'loss_type' is {loss_type!r}; TRL 1.16's loss types are "
            f"{', '.join([*LOSS_TYPES, *REFUSED_LOSS_TYPES])}: fix it in the file or as `loss_type=...`"
        )
    mode, agg = LOSS_TYPES[loss_type]
    level = t.get("importance_sampling_level", "token")
    if level not in ("token", "sequence"):
        raise ConfigError(
            f"TRL key 'importance_sampling_level' is {level!r}; TRL's levels are token and sequence: fix it in the "
            "file or as `importance_sampling_level=...`"
        )
    if level == "sequence":
        if loss_type in ("cispo", "sapo"):
            raise ConfigError(
                f"TRL keys 'loss_type' {loss_type} with 'importance_sampling_level' sequence: plugrl's {loss_type} "
                "takes token-level ratios; remove importance_sampling_level (token, TRL's default), or use "
                "loss_type grpo (GSPO) or luspo"
            )
        mode = SEQUENCE_LOSS_TYPES.get(loss_type, "gspo")
        agg = None  # gspo and luspo aggregate as their papers do
        if loss_type not in SEQUENCE_LOSS_TYPES:
            t.note(
                "loss_type",
                "with importance_sampling_level sequence plugrl trains GSPO, a mean over each sequence's tokens; "
                f"TRL's {loss_type} sums them (TRL warns about this too)",
            )
    elif loss_type == "bnpo":
        t.note(
            "loss_type",
            "normalised over each optimizer step's tokens, as dapo; TRL's bnpo normalises each device's micro-batch",
        )
    t.put("actor.loss_mode", mode)
    if agg is not None:
        t.put("actor.loss_agg_mode", agg)
    _clips(t, mode)
    if t.has("scale_rewards"):
        scale = {True: "group", False: "none"}.get(t.get("scale_rewards"), t.get("scale_rewards"))
        if scale in ("group", "none"):
            t.put("algorithm.norm_adv_by_std_in_grpo", scale == "group")
        else:
            t.note("scale_rewards", "plugrl's grpo divides by each group's std (group) or not at all (none)")
    if t.has("mask_truncated_completions"):
        t.put("actor.mask_truncated_completions", t.flag("mask_truncated_completions"))
    if t.has("entropy_coef"):
        t.put("actor.entropy_coeff", t.number("entropy_coef", float))


def _clips(t: _Translator, mode: str) -> None:
    """epsilon, epsilon_high, delta and SAPO's temperatures: the parameters of the loss ``mode`` reads."""
    eps = t.number("epsilon", float, positive=True)
    high = t.number("epsilon_high", float, eps, positive=True)  # TRL: epsilon_high defaults to epsilon
    if mode == "cispo":  # TRL clamps the ratio at epsilon_high and below not at all
        t.put("actor.clip_ratio_low", 1.0)
        t.put("actor.clip_ratio_high", high - 1.0)
        t.used.add("epsilon")
    else:
        t.put("actor.clip_ratio_low", eps)
        t.put("actor.clip_ratio_high", high)
    if mode == "vanilla":
        # TRL's clip bounds nothing for negative advantages; its delta caps every ratio, which for A < 0 is the
        # dual clip at delta and for A > 0 changes nothing (the clip is below it)
        delta = t.number("delta", float) if t.get("delta") is not None else None
        if delta is not None and delta <= 1.0 + high:
            raise ConfigError(
                f"TRL key 'delta' ({delta}) must be above 1 + epsilon_high ({1.0 + high}) for plugrl's dual clip "
                "(actor.clip_ratio_c), which TRL's two-sided clip is then: raise it or remove it"
            )
        t.put("actor.clip_ratio_c", delta)  # null: no dual clip
    elif t.get("delta") is not None:
        t.note("delta", f"TRL reads it for the clipped losses only, not {mode}")
    if mode == "sapo":
        t.put("actor.tau_pos", t.number("sapo_temperature_pos", float, 1.0, positive=True))
        t.put("actor.tau_neg", t.number("sapo_temperature_neg", float, 1.05, positive=True))
    else:
        t.used.update({"sapo_temperature_pos", "sapo_temperature_neg"})  # TRL reads them with sapo only


def _generation(t: _Translator) -> None:
    t.put("data.max_response_length", t.number("max_completion_length", int, positive=True))
    if t.has("max_prompt_length") and t.get("max_prompt_length") is not None:
        t.put("data.max_prompt_length", t.number("max_prompt_length", int, positive=True))
    for key in ("temperature", "top_p"):
        if t.has(key):
            t.put(f"rollout.{key}", t.number(key, float))
    if t.has("top_k"):
        top_k = t.number("top_k", int, 0)
        t.put("rollout.top_k", top_k if top_k > 0 else -1)  # TRL's 0 (or null) is plugrl's -1: no top-k
    if t.has("use_vllm"):
        t.put("rollout.name", "vllm" if t.flag("use_vllm") else "hf")
    else:  # a default of TRL's plugrl does not follow: said
        t.notes.append(
            "use_vllm not set (TRL's default, false, generates with transformers; plugrl generates with vLLM, the "
            "same sampling; use_vllm: false picks plugrl's HF engine)"
        )
    if t.values.get("vllm_mode") == "colocate":
        t.used.add("vllm_mode")
    elif t.values.get("vllm_mode") == "server":  # TRL's `trl vllm-serve`: here `plugrl rollout-serve` at that address
        t.used.add("vllm_mode")
        t.put("rollout.mode", "server")
        url = t.get("vllm_server_base_url")
        if not url:
            host = str(t.get("vllm_server_host", "0.0.0.0"))
            host = "127.0.0.1" if host in ("0.0.0.0", "") else host  # TRL's default host: this machine
            url = f"http://{host}:{t.number('vllm_server_port', int, 8000, positive=True)}"
        t.put("rollout.server_urls", [str(url).rstrip("/")])
        t.note("vllm_mode", "the server there must be `plugrl rollout-serve MODEL`, not `trl vllm-serve`")
        if t.has("vllm_server_timeout"):
            t.put("rollout.server_timeout_s", t.number("vllm_server_timeout", float, positive=True))
    for key, dotted in (
        ("vllm_gpu_memory_utilization", "rollout.gpu_memory_utilization"),
        ("vllm_tensor_parallel_size", "rollout.tensor_model_parallel_size"),
        ("vllm_enable_sleep_mode", "rollout.free_cache_engine"),
    ):
        if t.has(key):
            t.put(dotted, t.get(key))
    if t.has("num_generations_eval"):
        t.put("rollout.val_kwargs.n", t.number("num_generations_eval", int, positive=True))
    if t.get("max_tool_calling_iterations") is not None:  # replies = tool rounds + the first reply
        t.put("rollout.max_turns", t.number("max_tool_calling_iterations", int, positive=True) + 1)
    kwargs = t.get("chat_template_kwargs")
    if kwargs:
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"TRL key 'chat_template_kwargs' must be a mapping, got {kwargs!r}")
        t.put("data.apply_chat_template_kwargs", dict(kwargs))


def _rollout_correction(t: _Translator) -> None:
    """TRL's importance-sampling correction of the vLLM/trainer mismatch -> ``algorithm.rollout_correction``.

    TRL applies it whenever vLLM generates (``vllm_importance_sampling_correction`` defaults to true): so does
    the translation, whenever it keeps plugrl's vLLM engine (``use_vllm`` not false). ``*_truncate``: mode
    truncate, ``cap = clip_max`` (no lower bound in plugrl); ``*_mask``: mode mask, ``[low, high] = [clip_min or
    0, clip_max]``. The deprecated ``vllm_importance_sampling_cap`` wins over ``clip_max``, as in TRL.
    """
    vllm = t.flag("use_vllm") if t.has("use_vllm") else True  # not set: plugrl keeps its vLLM engine
    if not vllm or not t.flag("vllm_importance_sampling_correction"):
        t.used.update(IS_KEYS)  # TRL reads none of them then either
        return
    name = t.get("vllm_importance_sampling_mode")
    if name not in IS_MODES:
        raise ConfigError(
            f"TRL key 'vllm_importance_sampling_mode' is {name!r}; TRL's modes are {', '.join(IS_MODES)}: fix it in "
            "the file or as `vllm_importance_sampling_mode=...`"
        )
    mode, level = IS_MODES[name]
    cap_key = "vllm_importance_sampling_cap" if t.get("vllm_importance_sampling_cap") is not None else None
    max_key = cap_key or "vllm_importance_sampling_clip_max"
    clip_max = t.number(max_key, float)
    clip_min = t.number("vllm_importance_sampling_clip_min", float)
    t.used.update(IS_KEYS)
    fix = "fix it in the file or as a `key=...` override"
    if mode == "truncate":
        if clip_min is not None:
            raise ConfigError(
                f"TRL key 'vllm_importance_sampling_clip_min' with vllm_importance_sampling_mode {name} raises weights "
                "below it to it; plugrl truncates from above only (algorithm.rollout_correction.cap): remove it, "
                "or use a *_mask mode"
            )
        if clip_max is None or clip_max <= 1.0:
            raise ConfigError(f"TRL key '{max_key}' must be above 1 for {name} (plugrl's cap), got {clip_max!r}; {fix}")
        t.put("algorithm.rollout_correction", {"mode": "truncate", "level": level, "cap": clip_max})
    else:
        low = clip_min or 0.0
        if not 0.0 <= low < 1.0:
            raise ConfigError(
                f"TRL key 'vllm_importance_sampling_clip_min' must be in [0, 1) for {name}, got {clip_min!r}: "
                f"on-policy tokens (weight 1) would be masked; {fix}"
            )
        if clip_max is not None and clip_max <= 1.0:
            raise ConfigError(
                f"TRL key '{max_key}' must be above 1 for {name}, got {clip_max!r}: on-policy tokens (weight 1) "
                f"would be masked; {fix}"
            )
        t.put("algorithm.rollout_correction", {"mode": "mask", "level": level, "low": low, "high": clip_max})


def _model_init_kwargs(t: _Translator) -> None:
    """TRL's ``model_init_kwargs`` over the script's ModelConfig keys (as grpo.py merges them): the keys plugrl
    loads the model with are read as the top-level keys of the same names; the others are said."""
    kwargs = t.get("model_init_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"TRL key 'model_init_kwargs' must be a mapping, got {kwargs!r}")
    for key, value in kwargs.items():
        if key in ("dtype", "torch_dtype", "attn_implementation", "trust_remote_code"):
            t.given[key] = t.values[key] = value  # grpo.py: model_init_kwargs win over ModelConfig's
        else:
            t.notes.append(f"{_shown(f'model_init_kwargs.{key}', value)} (plugrl loads the model itself: model.*)")


def _model(t: _Translator) -> None:
    _model_init_kwargs(t)
    if t.has("model_name_or_path"):
        t.put("model.path", str(t.get("model_name_or_path")))
    for key in ("trust_remote_code", "attn_implementation"):
        if t.has(key) and t.get(key) is not None:
            t.put(f"model.{key}", t.get(key))
    t.put("model.enable_gradient_checkpointing", t.flag("gradient_checkpointing"))
    if t.has("gradient_checkpointing_kwargs"):
        if (t.get("gradient_checkpointing_kwargs") or {}) not in ({}, {"use_reentrant": False}):
            t.note("gradient_checkpointing_kwargs", "plugrl always checkpoints with use_reentrant false")
    if t.flag("use_peft"):  # TRL's ModelConfig LoRA keys -> actor.lora (defaults: TRL's, r 16, alpha 32)
        t.put("actor.lora.r", t.number("lora_r", int, 16, positive=True))
        t.put("actor.lora.alpha", t.number("lora_alpha", float, 32, positive=True))
        t.put("actor.lora.dropout", t.number("lora_dropout", float, 0.05))
        targets = t.get("lora_target_modules")
        if targets:
            t.put("actor.lora.target_modules", targets)
    load = t.get("torch_dtype") if t.has("torch_dtype") else t.get("dtype") if t.has("dtype") else None
    load_key = "torch_dtype" if t.has("torch_dtype") else "dtype"
    if t.has("bf16"):
        bf16 = t.flag("bf16")
        t.put("model.dtype", "bfloat16" if bf16 else "float32")  # fp32 master weights either way
        if load is not None and DTYPES.get(load, load) not in ("auto", "bfloat16" if bf16 else "float32"):
            t.note(load_key, "model.dtype follows bf16; plugrl keeps fp32 master weights")
    elif load is not None:
        if load in DTYPES:
            t.put("model.dtype", DTYPES[load])
        else:
            t.note(load_key, "plugrl computes in bfloat16 or float32")


FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")  # 1..5
_TRUE = ("true", "1", "yes")


@dataclass
class _Sharding:
    """What a launcher or TrainingArguments asks of the sharding, as plugrl's FSDP2 can do it."""

    offload: bool | None = None  # parameters, gradients and optimizer state in host memory
    reshard: bool | None = None  # free the gathered parameters after the forward (FULL_SHARD / ZeRO-3)
    checkpointing: bool | None = None
    said: list[str] = field(default_factory=list)


def _fsdp1_strategy(value: str, where: str) -> bool:
    """An FSDP1 sharding strategy (name or number) as reshard_after_forward; the others are refused."""
    name = value.strip().upper()
    if name.isdigit() and 1 <= int(name) <= len(FSDP1_STRATEGIES):
        name = FSDP1_STRATEGIES[int(name) - 1]
    if name in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return name == "FULL_SHARD"
    raise ConfigError(
        f"{where} is {value!r}: plugrl shards with FSDP2 over all data-parallel ranks (no hybrid sharding, no "
        "replication); use FULL_SHARD (plugrl's default) or SHARD_GRAD_OP (actor.fsdp_config.reshard_after_forward: "
        "false)"
    )


def _accelerate_fsdp(env: Mapping[str, str], out: _Sharding) -> None:
    """``accelerate launch --config_file`` with ``distributed_type: FSDP``: the ``FSDP_*`` variables it sets."""
    version = env.get("FSDP_VERSION", "1")
    strategy = env.get("FSDP_SHARDING_STRATEGY")
    reshard = env.get("FSDP_RESHARD_AFTER_FORWARD")
    if version == "1" and strategy not in (None, "", "None"):
        out.reshard = _fsdp1_strategy(strategy, "accelerate's fsdp_sharding_strategy (FSDP_SHARDING_STRATEGY)")
    elif reshard is not None:
        where = "accelerate's fsdp_reshard_after_forward (FSDP_RESHARD_AFTER_FORWARD)"
        is_bool = reshard.lower() in (*_TRUE, "false", "0", "no")
        out.reshard = reshard.lower() in _TRUE if is_bool else _fsdp1_strategy(reshard, where)
    out.offload = env.get("FSDP_OFFLOAD_PARAMS", "false").lower() in _TRUE
    if env.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() in _TRUE:
        out.checkpointing = True
    if env.get("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "false").lower() in _TRUE:
        out.said.append(
            "accelerate FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD=true (plugrl keeps checkpointed activations "
            "on the device)"
        )
    if env.get("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP") not in ("TRANSFORMER_BASED_WRAP", "NO_WRAP"):
        out.said.append(
            f"accelerate FSDP_AUTO_WRAP_POLICY={env['FSDP_AUTO_WRAP_POLICY']} (plugrl wraps each decoder layer)"
        )
    if env.get("FSDP_IGNORED_MODULES"):
        out.said.append("accelerate FSDP_IGNORED_MODULES (plugrl shards every module)")


def _deepspeed(stage: Any, param_device: Any, optimizer_device: Any, where: str, out: _Sharding) -> None:
    """DeepSpeed's ZeRO stage and offload devices as FSDP2: ZeRO-3 is FULL_SHARD, ZeRO-2 SHARD_GRAD_OP; ZeRO-0/1
    (no sharding of parameters or gradients) become SHARD_GRAD_OP, and that is said."""
    stage = int(stage) if stage not in (None, "", "None") else 3
    out.reshard = stage == 3
    if stage < 2:
        out.said.append(
            f"{where} ZeRO stage {stage} (plugrl's FSDP2 shards parameters and gradients too: ZeRO-2's layout)"
        )
    devices = {str(d).lower() for d in (param_device, optimizer_device) if d not in (None, "", "None", "none")}
    if "nvme" in devices:
        raise ConfigError(f"{where} offloads to nvme: plugrl offloads to host memory only; use cpu")
    if devices:
        out.offload = True
        if len({str(param_device).lower(), str(optimizer_device).lower()}) > 1:
            out.said.append(
                f"{where} offloads the parameters or the optimizer state (plugrl's FSDP2 offloads both together)"
            )


def _deepspeed_json(config: Any, where: str, out: _Sharding) -> None:
    """A DeepSpeed JSON config (a mapping, or the path of a file): its zero_optimization section."""
    if isinstance(config, (str, os.PathLike)):
        path = Path(config).expanduser()
        try:
            import json

            config = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{where}: cannot read the DeepSpeed config {str(path)!r} ({e})") from None
    zero = (config or {}).get("zero_optimization") or {}
    _deepspeed(
        zero.get("stage"),
        (zero.get("offload_param") or {}).get("device"),
        (zero.get("offload_optimizer") or {}).get("device"),
        where,
        out,
    )


def _launcher(env: Mapping[str, str]) -> _Sharding:
    """The sharding ``accelerate launch --config_file FILE`` asks for, read from the variables it sets."""
    out = _Sharding()
    if env.get("ACCELERATE_USE_FSDP", "false").lower() in _TRUE:
        _accelerate_fsdp(env, out)
    elif env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in _TRUE:
        if env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") not in (None, "", "None"):
            _deepspeed_json(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"], "accelerate's deepspeed_config_file", out)
        else:
            _deepspeed(
                env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"),
                env.get("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"),
                env.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"),
                "accelerate's DeepSpeed",
                out,
            )
    return out


def _training_arguments_sharding(t: _Translator, out: _Sharding) -> None:
    """TrainingArguments' own ``fsdp`` (options in a string or list), ``fsdp_config`` and ``deepspeed``."""
    options = t.get("fsdp") or []
    options = options.split() if isinstance(options, str) else [str(o) for o in options]
    for option in options:
        if option in ("full_shard", "shard_grad_op"):
            out.reshard = option == "full_shard"
        elif option == "offload":
            out.offload = True
        elif option in ("hybrid_shard", "hybrid_shard_zero2", "no_shard"):
            _fsdp1_strategy(option, "TRL key 'fsdp'")
        elif option != "auto_wrap":
            out.said.append(f"fsdp={option} (plugrl shards with FSDP2, one decoder layer a unit)")
    config = t.get("fsdp_config") or {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"TRL key 'fsdp_config' must be a mapping, got {config!r}")
    for raw, value in config.items():
        key = str(raw).removeprefix("fsdp_")
        if key == "offload_params":
            out.offload = bool(value) if isinstance(value, bool) else str(value).lower() in _TRUE
        elif key == "reshard_after_forward":
            is_bool = isinstance(value, bool) or str(value).lower() in (*_TRUE, "false", "0", "no")
            flag = value if isinstance(value, bool) else str(value).lower() in _TRUE
            out.reshard = flag if is_bool else _fsdp1_strategy(str(value), f"TRL key 'fsdp_config.{raw}'")
        elif key == "activation_checkpointing":
            out.checkpointing = bool(value)
        elif key != "version":
            out.said.append(
                f"{_shown(f'fsdp_config.{raw}', value)} (plugrl shards with FSDP2, one decoder layer a unit)"
            )
    if t.get("deepspeed"):
        _deepspeed_json(t.get("deepspeed"), "TRL key 'deepspeed'", out)


def _sharding(t: _Translator, env: Mapping[str, str]) -> None:
    """``actor.fsdp_config`` from the launcher's accelerate config (FSDP or DeepSpeed), then TrainingArguments'
    ``fsdp`` / ``fsdp_config`` / ``deepspeed`` (which win, as transformers reads them over accelerate's)."""
    out = _launcher(env)
    _training_arguments_sharding(t, out)
    if out.offload is not None:
        t.put("actor.fsdp_config.param_offload", out.offload)
        t.put("actor.fsdp_config.optimizer_offload", out.offload)
    if out.reshard is not None:
        t.put("actor.fsdp_config.reshard_after_forward", out.reshard)
    if out.checkpointing:
        t.put("model.enable_gradient_checkpointing", True)
    t.notes.extend(out.said)


def _mixed_precision(t: _Translator, env: Mapping[str, str]) -> None:
    """accelerate's ``mixed_precision`` (``ACCELERATE_MIXED_PRECISION``) applies, as in transformers, only when the
    file turns both bf16 and fp16 off: TRL's bf16 defaults to true otherwise, and wins over it."""
    precision = env.get("ACCELERATE_MIXED_PRECISION")
    if precision in (None, ""):
        return
    bf16_off = t.has("bf16") and t.get("bf16") is False
    if not bf16_off or t.get("fp16"):
        if precision != "bf16" and not t.get("fp16"):
            t.notes.append(
                f"accelerate mixed_precision={precision} (TRL's bf16, true unless the file turns it off, "
                "wins over it, as in TRL)"
            )
        return
    if precision == "bf16":
        t.put("model.dtype", "bfloat16")
    elif precision != "no":
        t.notes.append(
            f"accelerate mixed_precision={precision} (plugrl computes in bfloat16 or float32: float32 "
            "used, as bf16: false asks)"
        )


def _source_name(text: str) -> str:
    """The data_source of rows read from ``text``: a hub id as written, a local file's name without suffix."""
    looks_local = text.lower().endswith((".jsonl", ".json", ".parquet")) or text.startswith(("/", ".", "~"))
    return PurePosixPath(text).stem if looks_local else text


def _datasets(t: _Translator) -> str | None:
    """data.train_files from ``datasets`` (TRL's mixture) or ``dataset_name``; returns the first dataset's name."""
    mixture = t.get("datasets")
    if mixture:
        for key in ("dataset_name", "dataset_config", "dataset_train_split"):
            if t.has(key):
                t.note(key, "datasets decides, as in TRL")
        if not isinstance(mixture, Sequence) or isinstance(mixture, str):
            raise ConfigError("TRL key 'datasets' must be a list of {path, split, ...} entries")
        files, splits, first = [], set(), None
        for i, entry in enumerate(mixture):
            if not isinstance(entry, Mapping) or "path" not in entry:
                raise ConfigError(f"TRL key 'datasets[{i}]' needs a path (a hub id, a local file or directory)")
            path, data_files = str(entry["path"]), entry.get("data_files")
            if path in ("json", "parquet") and data_files:  # load_dataset("json", data_files=...): local files
                names = [data_files] if isinstance(data_files, str) else list(data_files)
                files += [str(f) for f in names]
            else:
                files.append(path + (f":{entry['name']}" if entry.get("name") else ""))
            first = first or (files[-1] if files else None)
            splits.add(str(entry.get("split", "train")))
            for extra in sorted(set(entry) - {"path", "name", "split", "data_files"}):
                t.note(f"datasets[{i}].{extra}", "plugrl reads every row and column of the files")
        if len(splits) > 1:
            raise ConfigError(
                f"TRL key 'datasets' reads the splits {sorted(splits)}; plugrl reads one split (data.split) from "
                "every file: give every entry the same split"
            )
        t.put("data.train_files", files)
        t.put("data.split", splits.pop())
        return first
    name = t.get("dataset_name")
    if not name:
        return None
    config = t.get("dataset_config")
    t.put("data.train_files", [f"{name}:{config}" if config else str(name)])
    t.put("data.split", t.get("dataset_train_split", "train"))
    return str(name)


def _data(t: _Translator) -> None:
    first = _datasets(t)
    if first:
        t.put("data.data_source", _source_name(first.split(":")[0]))
    mapping = t.get("field_mapping") or {}
    if not isinstance(mapping, Mapping):
        raise ConfigError("TRL key 'field_mapping' must be a mapping: {question_field: ..., answer_field: ...}")
    for key in ("question_field", "answer_field"):
        if mapping.get(key):
            t.put(f"data.{key}", str(mapping[key]))
    for extra in sorted(set(mapping) - {"question_field", "answer_field"}):
        t.note(f"field_mapping.{extra}", "plugrl maps question_field and answer_field")
    if t.has("shuffle_dataset"):
        t.put("data.shuffle", t.flag("shuffle_dataset"))
    seed = t.number("seed", int)
    t.put("trainer.seed", seed)
    t.put("rollout.seed", None)  # null: trainer.seed
    t.put("data.seed", t.number("data_seed", int, seed) if t.has("data_seed") else seed)


def _logging(t: _Translator, k: int, total: int | None) -> None:
    logging_steps = t.number("logging_steps", float, positive=True)
    if logging_steps >= 1:
        t.put("trainer.log_freq", _ceil_div(t, "logging_steps", logging_steps, k))
    elif total is not None:  # transformers reads a value below 1 as a share of the run
        t.put("trainer.log_freq", max(1, math.ceil(logging_steps * total / k)))
    else:
        t.note("logging_steps", "a share of the run needs max_steps; console line every step")
    if t.has("report_to"):
        report = t.get("report_to")
        report = [report] if isinstance(report, str) else list(report or [])
        if "all" in report:
            report = ["wandb", "tensorboard"]
        loggers = ["console", "jsonl"] + [r for r in ("wandb", "tensorboard") if r in report]
        t.put("trainer.logger", loggers)
        others = [r for r in report if r not in ("wandb", "tensorboard", "none")]
        if others:
            t.note("report_to", f"plugrl logs to console, jsonl, wandb and tensorboard, not {', '.join(others)}")
    if t.has("log_completions"):
        t.put("trainer.save_rollouts", t.flag("log_completions"))
    if not t.get("log_completions") or t.values.get("log_multimodal", True) is False:  # read with log_completions
        t.used.add("log_multimodal")
    t.put("trainer.metric_aliases", "trl")  # TRL's metric names beside plugrl's, for dashboards built on them


def _output(t: _Translator, k: int) -> None:
    out = PurePosixPath(str(t.get("output_dir")).rstrip("/") or "trainer_output")
    # the run directory is output_dir itself: plugrl writes to trainer.output_dir / trainer.experiment_name
    t.put("trainer.output_dir", str(out.parent))
    t.put("trainer.experiment_name", out.name)
    strategy = t.get("save_strategy", "steps")
    save_steps = t.number("save_steps", float, positive=True)
    if strategy == "no":
        t.put("trainer.save_freq", "end")  # TRL's grpo script still saves the final model
    elif strategy == "steps" and save_steps >= 1:
        t.put("trainer.save_freq", _ceil_div(t, "save_steps", save_steps, k))
    else:
        t.note("save_strategy" if strategy != "steps" else "save_steps", "plugrl saves at the end only")
        t.put("trainer.save_freq", "end")
    if t.has("save_total_limit") and t.get("save_total_limit"):
        t.put("trainer.max_checkpoints", t.number("save_total_limit", int, positive=True))
    if t.has("resume_from_checkpoint") and t.get("resume_from_checkpoint") not in (None, False):
        resume = t.get("resume_from_checkpoint")
        t.put("trainer.resume", "auto" if resume is True else str(resume))
    if t.flag("push_to_hub"):
        t.put("trainer.push_to_hub", True)
        t.put("trainer.hub_model_id", str(t.get("hub_model_id") or out.name))  # TRL's default: output_dir's name
        if t.has("hub_private_repo") and t.get("hub_private_repo") is not None:
            t.put("trainer.hub_private_repo", t.flag("hub_private_repo"))
    else:  # TRL reads none of these without push_to_hub either
        t.used.update({"hub_model_id", "hub_private_repo", "hub_strategy", "hub_token", "hub_revision"})
    if t.flag("push_to_hub") and t.get("hub_strategy") != "end":  # TRL's default uploads every save
        t.note("hub_strategy", KEYS["hub_strategy"].text)
    if t.has("ddp_timeout"):
        t.put("trainer.dist_timeout_s", t.number("ddp_timeout", float, positive=True))


def _evaluation(t: _Translator, k: int) -> None:
    strategy = t.get("eval_strategy", "no")
    if strategy in ("no", None):  # TRL reads none of these without evaluation either
        t.used.update({"eval_steps", "dataset_test_split", "per_device_eval_batch_size", "num_generations_eval"})
        if t.has("eval_on_start") and t.get("eval_on_start"):
            t.note("eval_on_start", "eval_strategy no: nothing to validate on")
        return
    if t.has("eval_on_start"):
        t.put("trainer.val_before_train", t.flag("eval_on_start"))
    if strategy != "steps":
        t.note("eval_strategy", "plugrl validates every N steps (trainer.test_freq)")
        return
    steps = t.number("eval_steps", float) or t.number("logging_steps", float)
    t.put("trainer.test_freq", _ceil_div(t, "eval_steps", steps, k) if steps >= 1 else 1)
    files = t.tree.get("data", {}).get("train_files")
    if files:
        t.put("data.val_files", files)
        t.put("data.val_split", t.get("dataset_test_split", "test"))
    temperature = t.number("temperature", float, 1.0)  # TRL evaluates with its training sampling
    t.put("rollout.val_kwargs.temperature", temperature)


def _is_reward_model(entry: Any) -> bool:
    """A ``reward_funcs`` entry that names a model (a hub id ``owner/name`` or a local directory), not a function."""
    return isinstance(entry, str) and ("/" in entry or Path(entry).is_dir())


def _rewards(t: _Translator) -> None:
    """``reward_funcs``: TRL's own reward names and the paths of the user's functions go to ``reward.reward_funcs``
    (loaded at start, each scores every sample); a model id or path becomes the reward_model plugin scoring every
    sample beside them (``reward.extra``). ``reward_weights`` weigh them in TRL's order: ``reward_model_name_or_path``
    first, then ``reward_funcs``. Every reward, a plugin's included, weighs 1.0 unless weighted: TRL's default."""
    funcs = t.get("reward_funcs")
    funcs = [funcs] if isinstance(funcs, str) else list(funcs or [])
    if not all(isinstance(f, str) and f.strip() for f in funcs):
        raise ConfigError(
            "TRL key 'reward_funcs' must be a list of names: trl.rewards names, module.function paths or "
            f"reward model ids; got {funcs!r}"
        )
    legacy = t.get("reward_model_name_or_path")
    entries = ([str(legacy)] if legacy else []) + [str(f) for f in funcs]  # TRL's order
    models = list(dict.fromkeys(f for f in entries if f == legacy or _is_reward_model(f)))
    if len(models) > 1:
        raise ConfigError(
            f"TRL keys 'reward_funcs'/'reward_model_name_or_path' name {len(models)} reward models ({models}); "
            "plugrl's reward_model plugin scores with one: keep one"
        )
    if models:
        t.put("reward.options.reward_model.path", models[0])
        t.put("reward.extra", ["reward_model"])
        tokenizer = t.get("reward_processing_classes")
        if isinstance(tokenizer, str):
            t.put("reward.options.reward_model.tokenizer_path", tokenizer)
        t.reward_model = True
    functions = [f for f in entries if f not in models]
    names = ["reward_model" if f in models else trl_reward_name(f) for f in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"TRL key 'reward_funcs' names {', '.join(twice)} twice; each reward is weighted and logged by its name: "
            "keep one of each"
        )
    if functions:
        t.put("reward.reward_funcs", functions)
    t.put("reward.default_weight", 1.0)  # TRL weighs every reward function 1.0 unless reward_weights says
    weights = t.get("reward_weights")
    if weights is None:
        return
    if not isinstance(weights, Sequence) or isinstance(weights, str):
        raise ConfigError(f"TRL key 'reward_weights' must be a list of numbers, got {weights!r}")
    if not names:
        t.note("reward_weights", "without reward_funcs to name them; set reward.weights.<name>")
        return
    if len(weights) != len(names):
        raise ConfigError(
            f"TRL keys 'reward_weights' ({len(weights)}) and 'reward_funcs' ({len(names)}"
            + (", reward_model_name_or_path first" if legacy else "")
            + ") differ in length; TRL refuses this too"
        )
    t.put("reward.weights", {n: float(w) for n, w in zip(names, weights, strict=True)})


def _rest(t: _Translator) -> None:
    """Every key of the file not read yet, by its fate (:data:`plugrl_compat.trl_keys.KEYS`): silent at a value plugrl
    follows anyway, named with why it is not acted on, or refused; a key TRL's script does not have (a typo, or
    a key of the user's own script) is named with the nearest TRL key."""
    for key in sorted(set(t.given) - t.used - {"plugrl", "env"}):
        fate = KEYS.get(key)
        value = t.given[key]
        if fate is None:
            close = difflib.get_close_matches(key, sorted(KEYS), n=1, cutoff=0.8)
            hint = f"; did you mean {close[0]}?" if close else ""
            t.note(key, f"no plugrl setting{hint}")
        elif fate.kind in ("mapped", "same") or _quiet(value, fate.quiet):
            continue  # mapped keys not read here: TRL does not read them in this file either (lora_r without use_peft)
        elif fate.kind == "refused":
            raise ConfigError(f"TRL key '{key}' is {value!r}: {fate.text}")
        else:
            t.note(key, fate.text)


def _quiet(value: Any, quiet: tuple[Any, ...]) -> bool:
    """``value`` is one of ``quiet`` (booleans only as themselves: ``True`` is not the number 1 here)."""
    return any(value is q or (bool not in (type(value), type(q)) and value == q) for q in quiet)


def translate(
    trl: Mapping[str, Any], num_processes: int = 1, launcher_env: Mapping[str, str] | None = None
) -> Translation:
    """The plugrl config tree of a TRL ``GRPOConfig`` mapping (the rules: the module docstring). Raises
    :class:`ConfigError` for settings no plugrl run can reproduce (batch sizes that split a prompt's group).
    ``launcher_env``: the variables ``accelerate launch --config_file`` set (its FSDP or DeepSpeed settings and
    mixed precision); none by default."""
    if num_processes < 1:
        raise ConfigError(f"the process count must be at least 1, got {num_processes}")
    env = launcher_env or {}
    t = _Translator(trl, num_processes)
    k = _batches(t)
    total = _schedule(t, k)
    _optimizer(t, k, total)
    _loss(t)
    _generation(t)
    _rollout_correction(t)
    _model(t)
    _sharding(t, env)
    _mixed_precision(t, env)
    _data(t)
    _logging(t, k, total)
    _output(t, k)
    _evaluation(t, k)
    _rewards(t)
    _rest(t)
    extra = trl.get("plugrl") or {}
    if not isinstance(extra, Mapping):
        raise ConfigError("the TRL file's 'plugrl' key must be a mapping of plugrl sections (plugins, data, reward...)")
    tree = _merge(t.tree, extra)
    plugins = list(tree.get("plugins") or [])
    for needed in ["advantages"] + ["reward_model"] * t.reward_model:  # GRPO's estimator; a reward model's plugin
        plugins += [needed] * (needed not in plugins)
    tree["plugins"] = plugins
    env = trl.get("env") or {}
    if not isinstance(env, Mapping):
        raise ConfigError("the TRL file's 'env' key must be a mapping of environment variables")
    return Translation(tree, t.notes, {str(k): str(v) for k, v in env.items()}, k, t.batch_text)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def split_overrides(overrides: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Command-line ``key=value`` overrides: TRL keys (no dot, not a plugrl section: ``learning_rate=1e-6``),
    applied to the file before translation, and plugrl keys (``actor.optim.lr=1e-6``), applied after."""
    trl: dict[str, Any] = {}
    plugrl: list[str] = []
    for text in overrides:
        key, value = parse_override(text)
        if "." in key or key in Config.model_fields:
            plugrl.append(text)
        else:
            trl[key] = value
    return trl, plugrl


def looks_like_trl_config(tree: Mapping[str, Any]) -> bool:
    """A config mapping that is a TRL GRPOConfig YAML: it names TRL keys (:data:`plugrl_compat.trl_keys.KEYS`) and no
    plugrl section (``data``, ``actor``, ``trainer``...), which no TRL file has."""
    keys = set(tree) - {"plugrl", "env"}
    return bool(keys & set(KEYS)) and not keys & set(Config.model_fields)


def is_trl_config_file(path: str | os.PathLike[str]) -> bool:
    """``path`` is a readable YAML mapping that :func:`looks_like_trl_config`; False for anything else (reading it as
    a plugrl config then says what is wrong with it)."""
    try:
        tree = read_yaml_mapping(Path(path), "config file", "plugrl config keys")
    except (ConfigError, OSError):
        return False
    return looks_like_trl_config(tree)


def key_fates(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> list[KeyFate]:
    """Each key of a TRL file and each TRL override as typed, with its fate (:data:`plugrl_compat.trl_keys.KEYS`),
    in the form ``plugrl train --check`` prints; the plugrl overrides' own fates come from the config they build. A
    key TRL does not know is said, as the start-up says it (no plugrl setting, and the key it may mean)."""
    trl_overrides, _ = split_overrides(overrides)
    try:
        tree = {**read_yaml_mapping(Path(path), "TRL config file", "GRPOConfig keys"), **trl_overrides}
    except ConfigError:
        return []
    out = []
    for key, value in tree.items():
        fate = KEYS.get(key)
        if key in ("plugrl", "env"):
            out.append(KeyFate(key, value, "acted", why="plugrl keys / environment variables of the file"))
        elif fate is None:
            close = difflib.get_close_matches(key, list(KEYS), n=1, cutoff=0.8)
            out.append(
                KeyFate(key, value, "not acted", why=f"{NO_SETTING}{f'; did you mean {close[0]}?' if close else ''}")
            )
        elif fate.kind == "mapped":
            out.append(KeyFate(key, value, "acted", why=fate.text))
        elif fate.kind == "refused" and value not in fate.quiet:
            out.append(KeyFate(key, value, "refused", why=fate.text))
        elif fate.kind in ("said", "same") and value not in fate.quiet:
            out.append(KeyFate(key, value, "not acted", why=fate.text))
        else:
            out.append(KeyFate(key, value, "acted", why="what plugrl does"))
    return out


def load_trl_config(
    path: str | os.PathLike[str], overrides: Sequence[str] = (), num_processes: int | None = None
) -> Config:
    """Read a TRL GRPO YAML, apply overrides (TRL keys before, plugrl keys after translation) and validate.
    ``num_processes``: default ``WORLD_SIZE`` (torchrun, accelerate), else 1. Logs the keys not mapped."""
    p = Path(path)
    trl_overrides, plugrl_overrides = split_overrides(overrides)
    trl = {**read_yaml_mapping(p, "TRL config file", "GRPOConfig keys"), **trl_overrides}
    if num_processes is None:
        num_processes = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        result = translate(trl, num_processes, os.environ)
    except ConfigError as e:
        raise ConfigError(f"TRL config {p}: {e}") from None
    if "path" not in result.tree.get("model", {}) and not any(o.startswith("model.path=") for o in plugrl_overrides):
        raise ConfigError(
            f"TRL config {p}: model_name_or_path is missing; add `model_name_or_path: <hub id or local directory>` "
            "to the file, or `model_name_or_path=...` on the command line"
        )
    os.environ.update(result.env)  # as TRL's parser does with the file's env: mapping
    cfg = build_config(result.tree, plugrl_overrides, origin=f"translated from the TRL config {p}")
    dp = max(1, num_processes // cfg.actor.tp_size)
    if cfg.data.train_batch_size % dp and cfg.data.train_batch_size == result.tree["data"]["train_batch_size"]:
        raise ConfigError(
            f"TRL config {p}: {result.batch_text} do not split over {dp} data-parallel processes: plugrl gives each "
            "process whole prompts with all their completions (TRL may split a prompt's completions over "
            f"processes). Raise per_device_train_batch_size or gradient_accumulation_steps until the prompts per step "
            f"are a multiple of {dp}"
        )
    cfg._trl_unmapped = result.unmapped  # type: ignore[attr-defined]
    if result.unmapped:  # accepted so that TRL's file loads as written, but never silent
        log.warning("TRL settings not mapped: %s", "; ".join(result.unmapped))
    return cfg
