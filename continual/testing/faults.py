"""TEST HOOKS: fault injection at named points inside processes a test cannot patch, for tests/ and bench/ only.

Tests inject faults at named points through the environment variable `CONTINUAL_FAULT`, a
comma-separated list of `point:n` or `point:n@who` (fire on the n-th time the point is reached, counting from 1; with
`@who`, only in actor / env `who`), e.g. `CONTINUAL_FAULT=env_step:20@1` SIGKILLs env worker 1 at its 20th step.
Unset, `inject` costs one dictionary lookup. The hooks stay in the production code only where a monkeypatch cannot
reach: inside spawned processes (env workers, IMPALA actors: a patch in the trainer does not reach them) and in the
IMPALA learner's publish and switch broadcast (the tests run agents/impala.py as __main__, whose classes a patch made
before it starts cannot reach; a publish has no seam between two tensor copies). The trainer's own faults (checkpoint_write, switch, full disks)
are monkeypatches: tests/helpers/trainer_faults.py.

Points where the process that reaches them SIGKILLs itself:
- IMPALA actor `who` (agents/impala.py): `actor_wait` (waiting for a free slot), `actor_switch` (applying a regime
  switch), `actor_weights` (copying the published weights), `actor_step` (after an env step of an unroll);
- env `who` (continual/envs/vector.py SwitchHandle, inside the worker process of an async vector env): `env_step`,
  `env_reset`, `env_switch` (setting the modifications of a switch).
Points where the IMPALA learner SIGKILLs actor `who` (default: the last) and waits for its death (`kill_at`):
`publish` (in the middle of publishing the weights), `broadcast_switch` (in the middle of sending a switch).
With `CONTINUAL_FAULT_LOG=<file>`, every kill appends `<unix time> <point> <pid of the killed process>` to the file
first, so that a test knows when the fault happened.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Optional


def _parse(spec: str) -> dict[str, tuple[int, Optional[int]]]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, rest = item.partition(":")
        n, _, who = rest.partition("@")
        out[point] = (int(n or 1), int(who) if who else None)
    return out


_PLAN = _parse(os.environ.get("CONTINUAL_FAULT", ""))
_COUNTS: dict[str, int] = {}
_SELF_KILL = {"actor_wait", "actor_switch", "actor_weights", "actor_step", "env_step", "env_reset", "env_switch"}


def inject(point: str, who: Optional[int] = None) -> bool:
    """TEST HOOK: True when the planned fault at `point` fires now (self-kill points never return). `who`: the actor
    or env index of the caller, for plans that target one."""
    if point not in _PLAN:
        return False
    n, target = _PLAN[point]
    if target is not None and who is not None and who != target:
        return False
    _COUNTS[point] = _COUNTS.get(point, 0) + 1
    if _COUNTS[point] != n:
        return False
    if point in _SELF_KILL:
        _kill(point, os.getpid())
    return True


def _kill(point: str, pid: int) -> None:
    log = os.environ.get("CONTINUAL_FAULT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{time.time()} {point} {pid}\n")
    os.kill(pid, signal.SIGKILL)


def kill_at(point: str, processes: list) -> None:
    """TEST HOOK: when the planned fault at `point` fires, SIGKILL process `who` of `processes` (default: the last)
    and wait until it is dead, so that the caller goes on exactly as after an actor died at this moment."""
    if processes and inject(point):
        victim = processes[_PLAN[point][1] if _PLAN[point][1] is not None else -1]
        _kill(point, victim.pid)
        victim.join(timeout=30)
