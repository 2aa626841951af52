"""Faults a long run must survive or report clearly: dead env workers, non-finite losses or parameters.

Tests inject faults at named points through the environment variable `CONTINUAL_FAULT`, a comma-separated list of
`point:n` (fire on the n-th time the point is reached, counting from 1), e.g.
`CONTINUAL_FAULT=checkpoint_write:2` SIGKILLs the process after the 2nd checkpoint's temporary file is written and
before it is renamed. Points: `checkpoint_write`, `switch` (just before the envs switch), `nan_loss` (the PPO loss
becomes NaN in that update). Unset, `inject` costs one dictionary lookup.
"""

from __future__ import annotations

import math
import os
import signal
from typing import Optional

import torch
import torch.nn as nn

from continual.errors import TrainingError


class EnvWorkerError(TrainingError):
    pass


class NumericalError(TrainingError):
    def __init__(self, message: str, weights_ok: bool = True):
        super().__init__(message)
        self.weights_ok = weights_ok  # False: the parameters themselves are broken, do not checkpoint them


def _parse(spec: str) -> dict[str, int]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, n = item.partition(":")
        out[point] = int(n or 1)
    return out


_PLAN = _parse(os.environ.get("CONTINUAL_FAULT", ""))
_COUNTS: dict[str, int] = {}


def inject(point: str) -> bool:
    """True when the planned fault at `point` fires now (kill points never return)."""
    if point not in _PLAN:
        return False
    _COUNTS[point] = _COUNTS.get(point, 0) + 1
    if _COUNTS[point] != _PLAN[point]:
        return False
    if point in ("checkpoint_write", "switch"):
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def check_losses(step: int, **losses: torch.Tensor) -> None:
    """Raise NumericalError naming the step and the first non-finite loss."""
    # called every minibatch: one host sync for all tensor losses (on a GPU each float() waits for the device)
    tensors = [v.detach().reshape(()).double() for v in losses.values() if torch.is_tensor(v)]
    floats = [float(v) for v in losses.values() if not torch.is_tensor(v)]
    if (not tensors or bool(torch.isfinite(torch.stack(tensors)).all())) and all(map(math.isfinite, floats)):
        return
    for name, value in losses.items():
        v = float(value.detach()) if torch.is_tensor(value) else float(value)
        if not math.isfinite(v):
            raise NumericalError(f"non-finite {name} ({v}) at step {step}")


def check_parameters(model: nn.Module, step: int) -> None:
    for name, p in model.named_parameters():
        if not bool(torch.isfinite(p).all()):
            raise NumericalError(f"non-finite values in parameter {name} at step {step}", weights_ok=False)


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
