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
for _ in range(5):
    torch.ones(block)
before = faults()
for _ in range(30):
    torch.ones(block)
print(faults() - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    default, kept = _faults("default"), _faults("keep")
    # glibc's default: each 64 MiB block is a fresh mmap, faulted in page by page (16,384 4-KiB pages;
    # 32 with transparent huge pages always on): ~491,000 faults for 30 blocks here
    assert default >= 30 * 32, default
    # kept: the heap may still grow once or twice while small allocations settle around the block (CI once
    # saw 32,768 faults for 10 blocks, two blocks' worth); after that the block is reused
    assert kept * 5 < default, (kept, default)
