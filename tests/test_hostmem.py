"""plugrl.hostmem: freed activations are reused instead of page-faulted in again (run in child processes,
because mallopt changes the whole process)."""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
import resource, sys, torch
from plugrl.hostmem import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = (64 << 20) // 4  # 64 MiB of float32: over glibc's largest mmap threshold (32 MiB)
for _ in range(2):
    torch.ones(block)
before = faults()
for _ in range(10):
    torch.ones(block)
print(faults() - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    default, kept = _faults("default"), _faults("keep")
    # glibc's default: each 64 MiB block is a fresh mmap, faulted in page by page (16,384 4-KiB pages;
    # 32 with transparent huge pages always on)
    assert default >= 10 * 32, default
    assert kept * 10 < default, (kept, default)
