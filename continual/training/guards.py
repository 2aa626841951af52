"""Numerical guards: a non-finite loss or parameter stops the run with the step and the name, before the optimizer
step spreads it (NumericalError says whether the weights can still be checkpointed)."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn

from continual.errors import NumericalError


def check_losses(step: int, *, combined: Optional[torch.Tensor] = None, **losses: torch.Tensor) -> None:
    """Raise NumericalError naming the step and the first non-finite loss. `combined`: a weighted sum of the losses
    (PPO's loss): any non-finite loss makes it non-finite (NaN and infinities survive sums and products, by 0
    included), so when it is finite there is nothing more to check: one float, not the losses' stack."""
    if combined is not None and math.isfinite(float(combined.detach())):
        return
    # called every minibatch: one host sync for all tensor losses (on a GPU each float() waits for the device); one
    # loss (DQN's, every env step): its float, without the stack's five small ops
    if len(losses) == 1:
        (name, value), = losses.items()
        v = float(value.detach()) if torch.is_tensor(value) else float(value)
        if not math.isfinite(v):
            raise NumericalError(f"non-finite {name} ({v}) at step {step}")
        return
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
