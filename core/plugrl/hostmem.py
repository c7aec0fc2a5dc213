"""Keep freed host memory in the process instead of handing it back to the kernel (glibc malloc).

PyTorch's CPU allocator is plain ``malloc``. glibc serves blocks over its mmap threshold (at most 32 MiB)
with fresh ``mmap`` pages and unmaps them on ``free``, so every large activation of every training step
is page-faulted in and zeroed again by the kernel: ~330,000 minor faults per policy update of
bench/update_beside_vllm.py alone and twice that beside an in-process vLLM engine, and the elementwise
ops that first touch those pages run up to 2x slower (docs/performance.md). With mmap off and no
trimming, freed blocks stay in the heap and are reused; peak RSS stays that of the largest step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4  # glibc malloc.h
_TOP_PAD = 64 << 20


def keep_freed_memory() -> bool:
    """Configure glibc malloc to reuse freed memory: no mmap'd blocks, never trim the heap, grow it 64 MiB
    at a time. Returns False (and changes nothing) off glibc Linux. Affects allocations made afterwards."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(opt, val) == 1 for opt, val in ((_M_MMAP_MAX, 0), (_M_TOP_PAD, _TOP_PAD)))
    # M_TRIM_THRESHOLD takes an int: the largest one means never
    ok = ok and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    if not ok:
        log.warning("glibc mallopt refused a setting: freed host memory may be returned to the kernel")
    return ok


def wanted(setting: bool | None, device_type: str) -> bool:
    """``trainer.keep_freed_host_memory``: unset, on where training runs on the CPU (the activations are host
    memory); off on accelerators, where the host heap holds mostly offloaded shards and pinned staging buffers,
    whose peaks a heap that never shrinks would keep for the rest of the run."""
    return device_type == "cpu" if setting is None else setting
