"""Worker processes of the library (env workers, IMPALA actors, background evaluation): how they are started, how a
failure is described, how they are stopped."""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.context import BaseContext
from typing import Optional, Sequence

# What the forkserver imports once, so that workers fork warm (a fork of the learner would copy torch's thread pools;
# spawn would re-import hackatari in every worker, ~3 s each). `set_forkserver_preload` is one setting for the whole
# process, read when the server starts: every kind of worker gets this one list (+ the Atari stack for Atari games).
PRELOAD = ["torch", "gymnasium", "continual.envs.vector", "continual.training.rewards"]
ATARI_PRELOAD = ["continual.envs.backends", "continual.envs.modifications", "hackatari.core", "ocatari.core",
                 "stable_baselines3.common.atari_wrappers"]


def mp_context(atari: bool = True, extra: Sequence[str] = ()) -> BaseContext:
    """The forkserver context every worker process of the library is started with (env workers, IMPALA actors,
    background evaluation). `extra`: modules of the caller to preload too (an agent file passes its own)."""
    mp.set_forkserver_preload(PRELOAD + (ATARI_PRELOAD if atari else []) + [m for m in extra if m not in PRELOAD])
    return mp.get_context("forkserver")


def stop_processes(processes: Sequence, join_timeout: float = 0.0, kill_timeout: float = 5.0) -> None:
    """Stop worker processes for good: wait up to `join_timeout` seconds (all together) for them to exit by
    themselves, then SIGTERM those still alive, then SIGKILL (waiting up to `kill_timeout` after each signal). No
    process outlives the call."""
    deadline = time.monotonic() + join_timeout
    for p in processes:
        if join_timeout > 0:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
    for signal_them in ("terminate", "kill"):
        alive = [p for p in processes if p.is_alive()]
        for p in alive:
            getattr(p, signal_them)()
        deadline = time.monotonic() + kill_timeout
        for p in alive:
            p.join(timeout=max(0.1, deadline - time.monotonic()))


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
