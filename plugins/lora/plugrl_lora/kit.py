"""LoRA adapters through peft, behind the kernel's :mod:`plugrl.model_adapters`.

This module is the entry point of group ``plugrl.model_adapters`` (an :class:`plugrl.model_adapters.AdapterKit`):
:func:`add_adapters` wraps a model and returns its :class:`LoRAAdapters`; :func:`merge_to_folder`, and the vLLM side
(:mod:`.vllm`: ``vllm_load_adapter``). The peft code itself is :mod:`.adapters`. Importing this
module imports neither peft nor vLLM: they load when a model is wrapped or an engine takes an adapter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from plugrl_lora import adapters as lora
from plugrl_lora.adapters import merge_to_folder
from plugrl_lora.fields import LoRAConfig
from plugrl_lora.vllm import load_adapter as vllm_load_adapter

__all__ = ["LoRAAdapters", "add_adapters", "merge_to_folder", "vllm_load_adapter"]


class LoRAAdapters:
    """One model's LoRA adapters (:class:`plugrl.model_adapters.Adapted`): ``peft`` is the PeftModel around
    ``model``, which peft changed in place (and FSDP2 may shard after)."""

    def __init__(self, peft_model: Any):
        self.peft = peft_model
        self.model: nn.Module = peft_model.base_model.model

    def hold_frozen_bases(self, dtype: torch.dtype, skip: frozenset[int] = frozenset()) -> int:
        freed = lora.hold_frozen_bases(self.model, dtype, skip)
        # the cast read the float32 bases through the model file's mapping (safetensors maps it; pages come in as
        # touched): the parameters still on it get memory of their own, so that the mapping and the pages the
        # cast brought in go (on SmolLM2-135M the process's RSS 1,105 -> 809 MiB)
        with torch.no_grad():
            for p in self.model.parameters():
                if p.device.type == "cpu" and not p.untyped_storage().resizable():
                    p.data = p.data.clone()
        return freed

    def dropout_off(self) -> AbstractContextManager[None]:
        return lora.dropout_off(self.model)

    def adapters_off(self) -> AbstractContextManager[None]:
        return lora.adapters_off(self.peft)

    def merged_parameters(
        self, device: torch.device, dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        return lora.merged_parameters(self.model, device, dtype)

    def state(self, device: torch.device) -> dict[str, torch.Tensor]:
        return lora.adapter_state(self.model, device)

    def engine_adapter(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
        return lora.engine_adapter(self.peft, state)

    def save(self, state: dict[str, torch.Tensor], folder: Path) -> None:
        lora.save_adapter(self.peft, state, folder)

    def load(self, folder: Path, key: str) -> dict[str, torch.Tensor]:
        return lora.load_adapter(folder, self.model, key=key)


def add_adapters(
    model: nn.Module, cfg: LoRAConfig, *, key: str, value_head: bool = False, frozen: str | None = None
) -> LoRAAdapters:
    """LoRA adapters into ``model`` in place (:func:`plugrl_lora.adapters.wrap`): with ``value_head`` (a critic) its
    head, found by :func:`plugrl_lora.adapters.value_head_name`, gets none and trains whole."""
    head = lora.value_head_name(model) if value_head else None
    return LoRAAdapters(lora.wrap(model, cfg, key=key, value_head=head, frozen=frozen))
