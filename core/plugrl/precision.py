"""The compute dtype a device runs fast: what ``model.dtype: auto`` becomes (and ``rollout.dtype: auto``, the model's).

bf16 pays off only where the hardware multiplies bf16 natively: CUDA GPUs of compute capability 8.0 or newer,
and CPUs for which oneDNN has bf16 kernels (AVX512-core, AVX512_BF16, AMX on x86; BF16 on Arm). Elsewhere torch
runs bf16 matmuls on a reference path: on an AVX2-only AMD EPYC (Zen 1, 2026-11-24) a 2048x2048 bf16 matmul
took 99 s against 0.39 s in float32, a policy update 17.7x and vLLM's generation 3.2x the float32 time
(``python bench/dtype.py``).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Literal

import torch

log = logging.getLogger(__name__)

Dtype = Literal["float32", "bfloat16"]

# /proc/cpuinfo flags of CPUs with oneDNN bf16 kernels (used when torch does not say)
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "avx512bw", "bf16")


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True when this CPU multiplies bf16 with native (or AVX-512 emulated) kernels, not torch's reference path."""
    probe = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    if probe is not None:
        try:
            return bool(probe())
        except RuntimeError:  # a torch built without oneDNN
            pass
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = {word for line in text.splitlines() if line.startswith(("flags", "Features")) for word in line.split()}
    return any(flag in flags for flag in _CPU_BF16_FLAGS)


def has_fast_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` computes bf16 natively (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return cpu_has_fast_bf16()
    return True  # other accelerators (xpu, npu, mps): their bf16 is native where torch offers it


def resolve_dtype(name: str, device: torch.device | str, key: str = "model.dtype") -> Dtype:
    """``auto`` -> ``bfloat16`` where ``device`` computes it natively, else ``float32``; an explicit
    ``bfloat16`` stays, with a warning on hardware without bf16 kernels (it is correct there, only slow)."""
    fast = has_fast_bf16(device)
    if name == "auto":
        return "bfloat16" if fast else "float32"
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"{key}={name!r}: expected auto, float32 or bfloat16")
    if name == "bfloat16" and not fast:
        _warn_slow_bf16(key, torch.device(device).type)
    return name  # type: ignore[return-value]


@functools.cache  # once per key and device type: the policy, critic and reference all resolve model.dtype
def _warn_slow_bf16(key: str, device_type: str) -> None:
    log.warning(
        "%s=bfloat16 on this %s, which has no bf16 kernels: bf16 matmuls take torch's reference path (measured on an "
        "AVX2-only CPU: an update 18x, generation 3x the float32 time; python bench/dtype.py). "
        "Set %s=auto (float32 here) or %s=float32.",
        key,
        device_type.upper(),
        key,
        key,
    )


def resolve_config_dtypes(cfg, device: torch.device | str) -> None:
    """Make ``cfg.model.dtype`` and ``cfg.rollout.dtype`` concrete for ``device`` (a rollout ``auto`` follows the
    model's), so the run's config.yaml records what ran."""
    given = cfg.model.dtype
    cfg.model.dtype = resolve_dtype(given, device)
    if given == "auto":
        kind = torch.device(device).type
        why = "it has bf16 kernels" if cfg.model.dtype == "bfloat16" else "it has no bf16 kernels"
        log.info("model.dtype=auto: %s on this %s (%s)", cfg.model.dtype, kind.upper(), why)
    if cfg.rollout.dtype == "auto":
        cfg.rollout.dtype = cfg.model.dtype
    else:
        cfg.rollout.dtype = resolve_dtype(cfg.rollout.dtype, device, key="rollout.dtype")
