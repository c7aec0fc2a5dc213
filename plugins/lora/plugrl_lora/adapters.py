"""LoRA adapters on the trained policy (``actor.lora``) and on the PPO critic (``critic.lora``), through peft: the
functions behind plugrl-lora's :class:`plugrl.model_adapters.AdapterKit` (:mod:`plugrl_lora`).

With ``actor.lora.r`` > 0 the policy is a transformers causal LM whose linear layers peft wraps in place
(``get_peft_model``: each target ``nn.Linear`` becomes a ``peft.tuners.lora.Linear`` holding the frozen
``base_layer`` and the trainable ``lora_A`` [r, in] and ``lora_B`` [out, r]). The wrapping comes before
FSDP2 (``fully_shard`` on the decoder layers, then the root), so each layer's unit holds frozen and trainable
parameters together; only ``requires_grad`` parameters (the adapters) go into the optimizer.

- Reference log-probs: the same model under ``PeftModel.disable_adapter()`` (no second copy).
- In one process under bf16 autocast the frozen base weights are held in bf16 (:func:`hold_frozen_bases`): the
  same forward, without a float32 copy at rest and a bf16 copy per forward.
- Weight sync: the rollout engine gets merged weights ``W + alpha / r * B @ A`` under the base names
  (``...q_proj.weight``), computed in float32 from the gathered full tensors and then cast.
- Checkpoints: the adapter in PEFT format (``adapter_config.json``, ``adapter_model.safetensors``), which
  ``PeftModel.from_pretrained(base, folder)`` loads; the base weights are not saved (they are ``model.path``).

Names: the policy's ``model`` is the inner transformers model, so its parameter names are the model's own with
peft's pieces inserted (``model.layers.0.self_attn.q_proj.base_layer.weight``,
``...q_proj.lora_A.default.weight``); a PEFT file names them ``base_model.model.`` + that, without ``default``.

The critic (a token-classification model: the trunk and a new, randomly initialised value head) gets adapters on
its trunk and trains its value head whole, as peft's ``modules_to_save``: the head becomes a
``ModulesToSaveWrapper`` holding the frozen ``original_module`` and the trained copy
``score.modules_to_save.default``, which a PEFT file names ``base_model.model.score.weight``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from plugrl.config import ConfigError
from plugrl_lora.fields import LoRAConfig

ADAPTER = "default"  # peft's name for the one adapter
PEFT_PREFIX = "base_model.model."  # what PeftModel puts before the inner model's names


def linear_module_names(model: nn.Module, value_head: str | None = None, frozen: str | None = None) -> list[str]:
    """The names of ``model``'s ``nn.Linear`` modules that LoRA may target: all but the output embedding
    (the LM head, often tied to the input embedding), a critic's ``value_head`` (trained whole) and those inside
    the module named ``frozen`` (a vision-language model's frozen vision encoder)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def inside(name: str, module: str | None) -> bool:  # the module itself, or inside it (peft's wrapper too)
        return module is not None and (name == module or name.startswith(module + "."))

    return [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and m is not head and not inside(n, value_head) and not inside(n, frozen)
    ]


def value_head_name(model: nn.Module) -> str:
    """The name of a token-classification model's head (``score`` in Llama and Qwen, ``classifier`` in others):
    its one ``nn.Linear`` child; the trunk is a module of its own."""
    heads = [n for n, m in model.named_children() if isinstance(m, nn.Linear)]
    if len(heads) != 1:
        raise ValueError(
            f"{type(model).__name__}: expected one linear head beside the trunk for critic.lora, found {heads}"
        )
    return heads[0]


def _matches(name: str, target: str) -> bool:
    """peft's rule for a name in a ``target_modules`` list: the module's name, or the end of its dotted path."""
    return name == target or name.endswith("." + target)


def resolve_targets(
    model: nn.Module,
    cfg: LoRAConfig,
    key: str = "actor.lora",
    value_head: str | None = None,
    frozen: str | None = None,
) -> list[str]:
    """The full names of the linear modules ``cfg.target_modules`` selects. A ConfigError naming
    ``{key}.target_modules`` and listing the model's linear modules when a name matches none of them."""
    linear = linear_module_names(model, value_head, frozen)
    never = "the LM head" if value_head is None else f"the value head ({value_head}: it trains whole)"
    if frozen is not None:
        never += f" and the frozen {frozen} (actor.freeze_vision_tower)"
    if cfg.target_modules == "all-linear":
        chosen = linear
    else:
        missing = [t for t in cfg.target_modules if not any(_matches(n, t) for n in linear)]
        if missing:
            short = sorted({n.rsplit(".", 1)[-1] for n in linear})
            raise ConfigError(
                f"{key}.target_modules: {missing} match no linear layer of {type(model).__name__} ({never} is "
                f"never a target). Its linear layers: {short} (full names like {linear[0] if linear else '-'}); "
                f"or use {key}.target_modules=all-linear"
            )
        chosen = [n for n in linear if any(_matches(n, t) for t in cfg.target_modules)]
    if not chosen:
        raise ConfigError(f"{key}.target_modules=all-linear: {type(model).__name__} has no linear layer but its head")
    return chosen


def wrap(
    model: nn.Module,
    cfg: LoRAConfig,
    key: str = "actor.lora",
    value_head: str | None = None,
    frozen: str | None = None,
):
    """Insert LoRA adapters into ``model`` in place (peft's ``get_peft_model``); returns the PeftModel around it.

    Base parameters are frozen, the adapters trainable: ``lora_A`` drawn from a generator seeded with
    ``torch.initial_seed()`` (peft's Kaiming init; the global RNG is left as it was), ``lora_B`` zero, so the
    wrapped model computes what the base model does. On a model built on the meta device the adapters are on
    the meta device too (filled in with the rest of the weights).

    ``value_head`` (a critic: a token-classification model): the name of its head, which gets no adapter and
    trains whole as peft's ``modules_to_save`` (a copy of it, the same values, requires grad).

    ``frozen`` (a vision-language model's vision encoder, kept frozen): the name of a module whose layers get no
    adapter; the adapter's config excludes it (peft's ``exclude_modules``, a pattern), so short target names
    such as ``q_proj``, which the encoder's attention has too, still leave it out when PEFT loads the adapter."""
    import re

    from peft import LoraConfig, get_peft_model

    chosen = resolve_targets(model, cfg, key, value_head, frozen)
    # the short names peft writes into adapter_config.json (q_proj, ...), as a PEFT adapter usually has them
    targets = (
        sorted({n.rsplit(".", 1)[-1] for n in chosen}) if cfg.target_modules == "all-linear" else cfg.target_modules
    )
    config = LoraConfig(
        r=cfg.r,
        lora_alpha=int(cfg.alpha) if float(cfg.alpha).is_integer() else cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(targets),
        # a critic: peft's token-classification task, so PeftModel.from_pretrained gives the critic's class back
        task_type="CAUSAL_LM" if value_head is None else "TOKEN_CLS",
        modules_to_save=None if value_head is None else [value_head],
        exclude_modules=None if frozen is None else re.escape(frozen) + r"\..*",
        bias="none",
    )
    # the adapters' init follows the seed alone (trainer.seed), not the draws before it: one process and a
    # sharded model (whose rank 0 builds its full copy after other work) start from the same lora_A
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch.initial_seed())
        peft_model = get_peft_model(model, config)
    if value_head is not None:
        saved = config.modules_to_save  # TOKEN_CLS appends peft's own head names (classifier, score): once each
        config.modules_to_save = list(dict.fromkeys(saved))
        if set(saved_modules(model)) != {value_head}:
            raise ConfigError(
                f"{key}: peft trains {sorted(saved_modules(model))} whole, not just the value head {value_head} of "
                f"{type(model).__name__} (module names that end like peft's head names, classifier and score): "
                f"this critic cannot take LoRA; set {key}.r=0 to train it whole"
            )
    wrapped = set(lora_layers(model))
    if wrapped != set(chosen):  # peft matched other modules than the check above: say which
        raise ConfigError(
            f"{key}.target_modules={cfg.target_modules}: peft put adapters on {sorted(wrapped ^ set(chosen))[:4]} "
            "unlike the linear layers these names select; name the layers more exactly"
        )
    return peft_model


def hold_frozen_bases(model: nn.Module, dtype: torch.dtype, skip: frozenset[int] = frozenset()) -> int:
    """Keep the frozen base weights and biases of ``model``'s LoRA linear layers in ``dtype`` (in place); returns
    the bytes this frees.

    For a forward under autocast to ``dtype`` the result is the same, bit for bit: autocast casts a linear layer's
    float32 weight to ``dtype`` before the matmul anyway. Without it that cast happens in every forward (autocast
    caches casts only of weights that require grad) and each cast copy is kept for the backward, so a frozen
    float32 base costs its float32 copy at rest and a ``dtype`` copy per forward. Skipped: a parameter the model
    uses elsewhere too (tied), and those whose ``id`` is in ``skip``."""
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    freed = 0
    for layer in lora_layers(model).values():
        base = layer.get_base_layer()
        if not isinstance(base, nn.Linear):
            continue
        for p in base.parameters(recurse=False):
            if p.requires_grad or p.dtype == dtype or uses[id(p)] > 1 or id(p) in skip:
                continue
            freed += p.numel() * (p.element_size() - dtype.itemsize)
            p.data = p.data.to(dtype)
    return freed


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """{module name: peft LoRA layer} of ``model``."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def saved_modules(model: nn.Module) -> list[str]:
    """The names of ``model``'s modules that peft trains whole (``modules_to_save``: a critic's value head)."""
    from peft.utils.other import ModulesToSaveWrapper

    return [n for n, m in model.named_modules() if isinstance(m, ModulesToSaveWrapper)]


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def is_peft_param(name: str) -> bool:
    """A parameter a PEFT adapter file holds: the adapters and the trained copy of a ``modules_to_save`` module
    (a critic's value head), not its frozen ``original_module``."""
    return is_adapter_param(name) or f".modules_to_save.{ADAPTER}." in name


@contextmanager
def adapters_off(peft_model):
    """The base model: every adapter skipped in the forward (the reference policy of a LoRA run)."""
    with peft_model.disable_adapter():
        yield


@contextmanager
def dropout_off(model: nn.Module):
    """The adapters' dropout in eval mode (log-prob passes are deterministic); the rest of the model as it is."""
    drops = [d for layer in lora_layers(model).values() for d in layer.lora_dropout.values()]
    modes = [d.training for d in drops]
    try:
        for d in drops:
            d.eval()
        yield
    finally:
        for d, mode in zip(drops, modes, strict=True):
            d.train(mode)


def full_tensor(p: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole of parameter ``p`` on ``device`` (a collective for an FSDP2 shard: every rank calls it); the
    local shard is moved to ``device`` first, so a CPU-offloaded shard is gathered over the device's backend."""
    from torch.distributed.tensor import DTensor

    t = p.detach()
    if isinstance(t, DTensor):
        local = t.to_local().to(device, dtype or t.dtype, non_blocking=True)
        t = DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
        t = t.full_tensor()
    return t.to(device, dtype or t.dtype)


def merged_parameters(
    model: nn.Module, device: torch.device, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, full tensor on ``device``) of every parameter of the model the adapters make: a LoRA layer's
    weight is ``W + scaling * B @ A`` ([out, in], merged in float32, then cast to ``dtype``) under the name the
    model had before wrapping; adapters themselves are not yielded. One parameter (or one layer's W, A and B)
    gathered at a time: a collective under FSDP2, in the same order on every rank."""
    layers = lora_layers(model)
    for name, p in model.named_parameters():
        if is_adapter_param(name):
            continue
        module_name, _, leaf = name.rpartition(".")
        owner, _, part = module_name.rpartition(".")
        if part == "base_layer" and owner in layers:
            base_name = f"{owner}.{leaf}"
            if leaf != "weight":  # a bias: not touched by LoRA
                yield base_name, full_tensor(p, device, dtype)
                continue
            layer = layers[owner]
            if layer.fan_in_fan_out:  # GPT-2's Conv1D stores W transposed
                raise NotImplementedError(f"{owner}: LoRA weight sync of fan_in_fan_out layers")
            w = full_tensor(p, device, torch.float32)
            a = full_tensor(layer.lora_A[ADAPTER].weight, device, torch.float32)  # [r, in]
            b = full_tensor(layer.lora_B[ADAPTER].weight, device, torch.float32)  # [out, r]
            merged = w + layer.scaling[ADAPTER] * (b @ a)
            # without a dtype: the model's own, float32 also where the frozen base is held in bf16
            yield base_name, merged.to(dtype or layer.lora_A[ADAPTER].weight.dtype)
        else:
            yield name, full_tensor(p, device, dtype)


def adapter_state(model: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """{inner name: full adapter tensor on the host}, gathered on the model's compute ``device`` (a collective
    under FSDP2: every rank gathers; the tensors are small, r x (in + out) per layer, and a critic's value head,
    hidden + 1)."""
    # a copy, also where the parameter is a host tensor already: a later update must not change what was taken
    return {n: full_tensor(p, device).cpu().clone() for n, p in model.named_parameters() if is_peft_param(n)}


def engine_adapter(peft_model, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """The adapter ``state`` ({inner name: full tensor}) as a PEFT file holds it ({``base_model.model.X.lora_A.
    weight``: tensor}) with its ``adapter_config.json`` as a dict: what vLLM's LoRA loader reads."""
    tensors = {PEFT_PREFIX + n.replace(f".{ADAPTER}.", "."): t for n, t in state.items()}
    config = peft_model.peft_config[ADAPTER].to_dict()
    for key, value in config.items():  # sets (target_modules) as sorted lists, as the JSON file has them
        if isinstance(value, set):
            config[key] = sorted(value)
    return tensors, config


def save_adapter(peft_model, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Write the adapter ``state`` ({inner name: full tensor}) in PEFT format: ``adapter_config.json`` and
    ``adapter_model.safetensors`` (peft's own writer, so ``PeftModel.from_pretrained(base, folder)`` loads it)."""
    peft_state = {PEFT_PREFIX + n: t for n, t in state.items()}
    peft_model.save_pretrained(str(folder), state_dict=peft_state, safe_serialization=True, save_embedding_layers=False)


def _inner_name(peft_key: str, saved: set[str] = frozenset()) -> str:
    """``base_model.model.X.lora_A.weight`` (a PEFT file's key) -> ``X.lora_A.default.weight`` (the policy's);
    ``base_model.model.score.weight`` of a module in ``saved`` (``modules_to_save``) ->
    ``score.modules_to_save.default.weight``."""
    key = peft_key.removeprefix(PEFT_PREFIX)
    head, _, leaf = key.rpartition(".")
    if head in saved:
        return f"{head}.modules_to_save.{ADAPTER}.{leaf}"
    return f"{head}.{ADAPTER}.{leaf}"


def load_adapter(folder: Path, model: nn.Module, key: str = "actor.lora") -> dict[str, torch.Tensor]:
    """{inner name: tensor} of the PEFT adapter in ``folder``; a ValueError naming ``key`` when its tensors are not
    exactly this model's adapters (another rank, other target modules)."""
    from safetensors.torch import load_file

    saved = set(saved_modules(model))
    weights = {_inner_name(k, saved): v for k, v in load_file(Path(folder) / "adapter_model.safetensors").items()}
    expected = {n: p.shape for n, p in model.named_parameters() if is_peft_param(n)}
    if set(weights) != set(expected):
        extra, missing = sorted(set(weights) - set(expected)), sorted(set(expected) - set(weights))
        raise ValueError(
            f"the adapter in {folder} does not fit this model's {key} settings: "
            f"{len(missing)} adapter tensors missing (e.g. {missing[:2]}), {len(extra)} unexpected (e.g. {extra[:2]})"
        )
    wrong = [n for n, t in weights.items() if t.shape != expected[n]]
    if wrong:
        raise ValueError(
            f"the adapter in {folder} has other shapes than this model's ({key}.r?): {wrong[0]} is "
            f"{tuple(weights[wrong[0]].shape)}, the model's {tuple(expected[wrong[0]])}"
        )
    return weights


def merge_to_folder(base_path: str | Path, adapter: Path, out: Path, dtype: torch.dtype | None = None) -> Path:
    """The base model at ``base_path`` with the PEFT adapter at ``adapter`` merged into its weights, written to
    ``out`` as a plain Hugging Face model in safetensors (with the adapter folder's tokenizer): what an engine
    loads to sample from a LoRA checkpoint (``plugrl eval`` of ``checkpoints/step_N``) and what ``plugrl export
    --merge`` writes. The merge runs in float32 (``W + alpha / r * B @ A``, as the weight sync computes it); the
    result is then cast to ``dtype`` (None: left in float32). Returns ``out``."""
    from peft import PeftModel
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoProcessor,
        AutoTokenizer,
    )

    from plugrl.models import is_vision_model

    # a vision-language model's adapter folder holds its processor (the tokenizer and the image settings)
    vlm = is_vision_model(AutoConfig.from_pretrained(str(base_path)))
    cls, preprocessor = (AutoModelForImageTextToText, AutoProcessor) if vlm else (AutoModelForCausalLM, AutoTokenizer)
    base = cls.from_pretrained(str(base_path), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    if dtype is not None and dtype != torch.float32:
        merged = merged.to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    preprocessor.from_pretrained(str(adapter)).save_pretrained(out)
    return out
