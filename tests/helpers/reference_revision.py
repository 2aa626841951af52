"""Behaviour pinned across machines (tests/helpers/extension_reference.py, dqn_reference.py). A recording is one
revision's outputs on one machine, and the same code gives other floats with other CPU kernels (oneDNN dispatches
its convolutions by instruction set, and a machine with new kernels plays other games from the third decimal on).
So a pinned case passes when it equals any recording of it: a change of behaviour that reproduces another machine's
floats bit for bit is not a risk. On a machine whose outputs equal none of them, the recorded revision runs here,
from a worktree of it (continual.launch.code: ~/.cache/continual/code/<commit>), and the case must equal what that
revision did on this machine; only a checkout without the revision (no git, a shallow clone) is compared with the
recording meant for its machine."""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def checkout(revision: str) -> Optional[str]:
    """This repository at `revision` (a worktree of it, made once); None when this checkout has no such revision."""
    from continual.errors import UserError
    from continual.launch import code

    try:
        return code.worktree(code.resolve(revision, ROOT), ROOT)
    except UserError:
        return None


def env_for(root: str, **extra: str) -> dict:
    """A child process's environment that imports the library from the checkout `root` first."""
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **extra, "PYTHONPATH": path}


def expected_for(got: dict, recordings: Sequence[dict], run_here: Callable[[], Optional[dict]],
                 meant_for_this_machine: Callable[[], dict], keys: Optional[Sequence[str]] = None) -> Optional[dict]:
    """None when `got` equals a recording (on `keys`, default all); else what the test compares it with: the
    recorded revision run here (`run_here`), or, in a checkout without it, the recording meant for this machine."""
    def same(r: dict) -> bool:
        return got == r if keys is None else all(got[k] == r[k] for k in keys)

    if any(same(r) for r in recordings):
        return None
    here = run_here()
    return meant_for_this_machine() if here is None else here
