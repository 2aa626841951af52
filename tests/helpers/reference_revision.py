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
from typing import Optional

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
