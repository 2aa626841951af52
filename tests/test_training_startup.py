"""continual.training.startup: process settings a training run makes before its first env."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# glibc's own account of the heap (mallinfo2, glibc >= 2.33) around the allocation a PPO minibatch makes on CPU
# (256 Nature-CNN frames as float32: 29 MB), then freed. Prints: applied, mmapped bytes while the block lives, heap
# bytes after it was freed.
HEAP_PROBE = """
import ctypes, sys
import torch
sys.path.insert(0, {root!r})
from continual.training.startup import retain_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = retain_freed_memory() if sys.argv[1] == "retain" else None
batch = torch.empty((256, 4, 84, 84), dtype=torch.float32)
mmapped = libc.mallinfo2().hblkhd
del batch
print(applied, mmapped, libc.mallinfo2().arena)
"""
BATCH = 256 * 4 * 84 * 84 * 4


def probe(mode: str, env: dict) -> tuple[str, int, int]:
    out = subprocess.run([sys.executable, "-c", HEAP_PROBE.format(root=ROOT), mode], capture_output=True,
                         text=True, env=env, check=True).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_retained_memory_keeps_a_minibatch_in_the_heap_across_frees():
    """glibc's documented defaults: a fresh process maps a 29 MB block with mmap (128 KB threshold), so freeing it
    unmaps it and the next batch is faulted in anew. With the setting the block comes from the heap and the heap keeps
    it after the free (no trim). (Whether the next batch reuses it also depends on what else allocates in between, so
    the page faults themselves are measured in bench/RESULTS.md, not here.) A malloc setting of the user's is left
    alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD",
                                                                                              "GLIBC_TUNABLES")}
    applied, mmapped, _ = probe("plain", env)
    assert applied == "None" and mmapped >= BATCH
    applied, mmapped, heap_after_free = probe("retain", env)
    assert applied == "True"
    assert mmapped < BATCH
    assert heap_after_free >= BATCH
    applied, *_ = probe("retain", {**env, "MALLOC_ARENA_MAX": "2"})
    assert applied == "False"
