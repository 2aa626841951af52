"""Which code a run ran: the git commit of the library's checkout and whether its tracked files had local changes.

Recorded in config.json (a new run) and in a `kind: "start"` record of metrics.jsonl at every start, resumes
included, so that an experiment resumed across sessions, machines or revisions says which code produced which steps.
Installed from a wheel (no checkout around the package), the revision is None and `library_version` is what is known.
"""

from __future__ import annotations

import os
import subprocess
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def code_revision(root: str = ROOT) -> Optional[dict]:
    """{"commit": sha, "dirty": bool} of the git checkout at `root` (the repository holding this package), or None
    outside a checkout or without git. `dirty`: tracked files differ from the commit (untracked files do not count)."""
    if not os.path.exists(os.path.join(root, ".git")):
        return None  # not our own checkout: never report an enclosing repository's commit
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if commit.returncode != 0 or status.returncode != 0:
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
