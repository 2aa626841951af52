"""Worker processes of the library (env workers, IMPALA actors, background evaluation): how they are started, how a
failure is described, how they are stopped."""

from __future__ import annotations

from typing import Optional


def dead_workers(processes) -> list[str]:
    """'env i (pid p) exited with code c' for every worker process that is no longer alive."""
    out = []
    for i, p in enumerate(processes or []):
        if not p.is_alive():
            out.append(f"env {i} (pid {p.pid}) exited with code {p.exitcode}")
    return out


def describe_worker_failure(processes, error: Optional[BaseException]) -> str:
    dead = dead_workers(processes)
    if dead:
        return "environment worker died: " + "; ".join(dead)
    first = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else type(error).__name__
    return f"environment worker failed: {first}"
