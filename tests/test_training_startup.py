"""continual.training.startup: process settings a training run makes before its first env."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A PPO update's allocation pattern on CPU: a minibatch's float batch (256 Nature-CNN frames, 29 MB) made and freed
# again and again; prints the minor page faults the loop cost.
FAULT_PROBE = """
import resource, sys, torch
sys.path.insert(0, {root!r})
from continual.training.startup import retain_freed_memory
applied = retain_freed_memory() if sys.argv[1] == "retain" else None
frames = torch.randint(0, 256, (256, 4, 84, 84), dtype=torch.uint8)
for _ in range(3):
    (frames.float() * (1 / 255)).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    (frames.float() * (1 / 255)).sum()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def probe(mode: str, env: dict) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", FAULT_PROBE.format(root=ROOT), mode], capture_output=True,
                         text=True, env=env, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_retained_memory_removes_the_page_faults_of_repeated_large_allocations():
    """Without the setting every 29 MB batch is faulted in anew (>= 7,000 pages each time, 40 times); with it the
    heap keeps the pages (the loop's faults drop at least 20x). A malloc setting of the user's is left alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD",
                                                                                              "GLIBC_TUNABLES")}
    _, plain = probe("plain", env)
    applied, retained = probe("retain", env)
    assert applied == "True"
    assert plain > 40 * 7000
    assert retained * 20 < plain
    applied, _ = probe("retain", {**env, "MALLOC_ARENA_MAX": "2"})
    assert applied == "False"
