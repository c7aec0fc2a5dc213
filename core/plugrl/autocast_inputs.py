"""One autocast cast of a float32 tensor that several linear layers read.

Under ``torch.autocast`` each matmul casts its float32 input to bf16 itself, and one that needs its input for the
backward (to form its weight's gradient) keeps that cast. Where several linear layers read the same tensor (q, k
and v read the normalised hidden states, gate and up the next ones, a LoRA layer's ``lora_A`` what its base
reads) the backward so keeps several copies of the same values: in a Llama layer three bf16 copies of the
attention input and two of the MLP input where one would do. :func:`share_input_casts` makes the first linear
layer that reads a float32 tensor cast it and the others take that cast.

Nothing changes in the numbers: the forward takes the same bf16 values autocast would make; in the backward each
reader's gradient goes back to float32 on its own, as through autocast's cast, before they are summed.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn


class _SharedCast(torch.autograd.Function):
    """``cast`` (``x`` cast to a lower dtype, made once) as one reader's input: a view, so readers that keep it
    keep one storage; the gradient goes back to ``x``'s dtype, as autocast's own cast sends it."""

    @staticmethod
    def forward(ctx, x, cast):
        ctx.dtype = x.dtype
        return cast.view_as(cast)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None


class _Casts:
    """float32 tensor -> its cast, while both are alive: weak references, so the table keeps nothing alive (a
    reader that keeps its input for the backward keeps the cast; once none does, the next reader casts anew)."""

    def __init__(self) -> None:
        self._table: dict[tuple[int, torch.dtype], tuple[weakref.ref, weakref.ref]] = {}

    def get(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        key = (id(x), dtype)
        entry = self._table.get(key)
        if entry is not None:
            source, cast = entry[0](), entry[1]()
            if source is x and cast is not None:
                return cast
        with torch.no_grad():
            cast = x.to(dtype)
        if len(self._table) >= 1024:  # drop dead entries now and then
            self._table = {k: e for k, e in self._table.items() if e[0]() is not None and e[1]() is not None}
        self._table[key] = (weakref.ref(x), weakref.ref(cast))
        return cast


def share_input_casts(model: nn.Module) -> int:
    """Make ``model``'s ``nn.Linear`` layers share the autocast cast of a float32 input they read alike (a
    forward pre-hook on each). Does nothing outside autocast, with no gradient (nothing is kept then), or for a
    DTensor input (tensor parallelism). Returns how many layers got the hook."""
    casts = _Casts()

    def cast_input(module: nn.Module, args: tuple):
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or not torch.is_grad_enabled():
            return None
        device = x.device.type
        if not (torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)):
            return None
        dtype = torch.get_autocast_dtype(device)
        if dtype == torch.float32 or type(x) is not torch.Tensor:
            return None  # a tensor subclass (DTensor under tensor parallelism): autocast as it is
        return (_SharedCast.apply(x, casts.get(x, dtype)), *args[1:])

    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for layer in layers:
        layer.register_forward_pre_hook(cast_input)
    return len(layers)
