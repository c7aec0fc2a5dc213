"""Adapters on a trained model (LoRA: ``actor.lora``, ``critic.lora``): what the kernel calls, and where it finds
the package that implements it.

The kernel keeps the calls; plugrl-lora brings both the settings (its config keys ``actor.lora``, ``critic.lora``,
``rollout.lora_sync``, through the group ``plugrl.config_fields``; the kernel reads them with :func:`settings`) and
the implementation (through peft), the entry point of group ``plugrl.model_adapters``: an object with
:class:`AdapterKit`'s functions (plugrl-lora's module ``plugrl_lora.kit``). A run without adapters never imports
the implementation; a config that sets the keys without the package is refused, naming the key and the package.

Who calls what:

- The policy and the critic (:class:`plugrl.actor.PackedModel`): ``add_adapters`` puts the adapters into the model
  in place, before FSDP2 shards it, and returns the model's :class:`Adapted`, through which they run the log-prob
  passes (``dropout_off``; ``adapters_off``: the reference policy), sync the engine (``merged_parameters``, or
  ``engine_adapter(state(device))`` with ``rollout.lora_sync=adapter``) and hold the frozen bases in bf16.
- The checkpoint (:mod:`plugrl.checkpoint`): ``state``, ``save`` (``policy_adapter/``, ``critic_adapter/`` in PEFT
  format) and ``load``.
- The vLLM engine (``rollout.lora_sync=adapter``): ``vllm_load_adapter``, whose ``lora_request`` every generation
  then passes.
- ``plugrl eval`` and ``plugrl export`` of a LoRA checkpoint: :func:`base_model_path` and :func:`merge_to_folder`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from plugrl.config import ConfigError
from plugrl.plugin_errors import implementation, package_hint

if TYPE_CHECKING:
    import torch
    from torch import nn


GROUP = "plugrl.model_adapters"
PACKAGE = "plugrl-lora"


class NoAdapters(ConfigError):
    """No installed package implements adapters; the message names the key that asks for them and the package."""


class Adapted(Protocol):
    """One model's adapters (what ``AdapterKit.add_adapters`` returns). ``state`` and ``merged_parameters`` are
    collectives under FSDP2 (every rank calls them, in the same order).

    - ``hold_frozen_bases(dtype, skip)``: the frozen base weights under the adapters held in ``dtype`` (not the
      parameters whose ``id`` is in ``skip``), the forward under autocast to ``dtype`` unchanged, and the parameters
      still on the model file's memory mapping given memory of their own; the bytes freed.
    - ``dropout_off()``: the adapters' dropout off (log-prob and value passes); ``adapters_off()``: the base model,
      every adapter skipped (a LoRA run's reference policy). Context managers.
    - ``merged_parameters(device, dtype)``: (base name, full tensor on ``device``) of every parameter of the model
      the adapters make, merged in: what a full weight sync sends.
    - ``state(device)``: {name: full tensor on the host} of the trained parameters (adapters, a critic's value head);
      ``engine_adapter(state)``: it as the engine loads it, {PEFT name: tensor} and the adapter's config;
      ``save(state, folder)`` writes it (PEFT format), ``load(folder, key)`` reads it back, a ValueError naming
      ``key`` when it does not fit this model.
    """

    def hold_frozen_bases(self, dtype: torch.dtype, skip: frozenset[int]) -> int: ...
    def dropout_off(self) -> AbstractContextManager[None]: ...
    def adapters_off(self) -> AbstractContextManager[None]: ...
    def merged_parameters(
        self, device: torch.device, dtype: torch.dtype | None
    ) -> Iterator[tuple[str, torch.Tensor]]: ...
    def state(self, device: torch.device) -> dict[str, torch.Tensor]: ...
    def engine_adapter(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]: ...
    def save(self, state: dict[str, torch.Tensor], folder: Path) -> None: ...
    def load(self, folder: Path, key: str) -> dict[str, torch.Tensor]: ...


class AdapterKit(Protocol):
    """The entry point of group ``plugrl.model_adapters``.

    - ``add_adapters(model, cfg, key=, value_head=, frozen=)``: adapters into ``model`` in place as ``cfg`` (the
      settings under ``key``) says, only they trainable (and, with ``value_head``, the critic's head, whole), none
      in the module named ``frozen`` (a VLM's frozen encoder); a ConfigError naming ``key`` for settings that do not
      fit the model.
    - ``merge_to_folder(base_path, adapter, out, dtype=None)``: the base model with an adapter folder merged in,
      written to ``out`` as a plain model (see :func:`merge_to_folder`).
    - ``vllm_load_adapter(llm, tensors, config)``: vLLM's ``LLM`` serves the adapter (``engine_adapter``'s) from now
      on, in place of the last; returns the ``lora_request`` a generation passes. A RuntimeError naming the modules
      vLLM cannot serve adapters on (then nothing changed).
    """

    def add_adapters(
        self, model: nn.Module, cfg: Any, *, key: str, value_head: bool, frozen: str | None
    ) -> Adapted: ...
    def merge_to_folder(self, base_path: str | Path, adapter: Path, out: Path, dtype: Any = None) -> Path: ...
    def vllm_load_adapter(self, llm: Any, tensors: dict[str, torch.Tensor], config: dict) -> Any: ...


def kit(key: str) -> AdapterKit:
    """The installed implementation; a :class:`NoAdapters` naming ``key`` (what asked for adapters) and the package
    when there is none."""
    missing = f"{key}: LoRA adapters are in the package {PACKAGE}, which is not installed: "
    return implementation(GROUP, NoAdapters(missing + package_hint(PACKAGE)))


def settings(section: Any) -> Any | None:
    """A section's LoRA settings (``actor.lora``, ``critic.lora``) when they ask for adapters (r > 0), else None;
    None too where plugrl-lora, which adds these keys to the config, is not installed."""
    lora = getattr(section, "lora", None)
    return lora if lora is not None and lora.r > 0 else None


def run_config_path(ckpt: Path) -> Path:
    """``RUN_DIR/config.yaml`` for the checkpoint ``RUN_DIR/checkpoints/step_N``: the resolved config of the run that
    wrote it (the run directory holds it, not the checkpoint)."""
    return Path(ckpt).parent.parent / "config.yaml"


def base_model_path(ckpt: Path, overrides: Sequence[str] = ()) -> str:
    """The base model of the LoRA checkpoint ``ckpt``: ``model.path`` of the run that wrote it (its
    :func:`run_config_path`, with ``overrides``), a ``local:`` name resolved to its prepared copy. The adapter's
    own ``base_model_name_or_path`` is not used: the run's config is what ``plugrl eval`` and ``plugrl export``
    agree on, and an override (``model.path=...``) changes it."""
    from plugrl.config import load_config
    from plugrl.models import resolve_model_path

    return resolve_model_path(load_config(run_config_path(ckpt), list(overrides), run_record=True).model.path)


def merge_to_folder(base_path: str | Path, adapter: Path, out: Path, dtype: Any = None) -> Path:
    """The base model at ``base_path`` with the adapter folder ``adapter`` (a checkpoint's ``policy_adapter/``)
    merged into its weights, written to ``out`` as a plain Hugging Face model (with the adapter folder's tokenizer),
    cast to ``dtype`` (None: float32): what ``plugrl eval`` samples from and ``plugrl export --merge`` writes.
    Returns ``out``."""
    return kit(f"{adapter} (a LoRA checkpoint's adapter)").merge_to_folder(base_path, adapter, out, dtype=dtype)
