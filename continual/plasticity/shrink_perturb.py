"""Plasticity remedies applied at regime switches, for every architecture: shrink & perturb and optimizer resets.

Shrink & perturb (Ash & Adams 2020), two forms (`--perturb_mode`):
  noise:       theta <- lambda * theta + sigma * eps,        eps ~ N(0, I)      (the seed project's form)
  fresh_init:  theta <- lambda * theta + p * theta_fresh,    theta_fresh = a new initialisation of the network
with lambda = `--shrink_factor`, sigma / p = `--noise_scale`. Every trainable parameter (weights and biases) is
shrunk once; buffers (e.g. CBP utilities and ages) are untouched. The first regime is never perturbed because the
hooks only run at switches.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn

from continual.training.extensions import Extension, SwitchEvent


@torch.no_grad()
def shrink_and_perturb(model: nn.Module, shrink: float, scale: float, mode: str = "noise",
                       fresh: Optional[nn.Module] = None, generator: Optional[torch.Generator] = None) -> None:
    if mode == "fresh_init":
        if fresh is None:
            raise ValueError("perturb_mode fresh_init needs a freshly initialised model")
        fresh_params = dict(fresh.named_parameters())
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.mul_(shrink).add_(fresh_params[name].to(p.device), alpha=scale)
        return
    for p in model.parameters():
        if p.requires_grad:
            noise = torch.randn(p.shape, generator=generator, device="cpu", dtype=p.dtype).to(p.device)
            p.mul_(shrink).add_(noise, alpha=scale)


def reset_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Forget moments and step counts; the learning rate and other hyper-parameters stay."""
    optimizer.state.clear()


class SwitchRemedies(Extension):
    """Shrink & perturb and/or an optimizer reset once the envs run the new regime, per the run's flags. The noise
    comes from a generator seeded by (seed, switch count), so a resumed run perturbs identically."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, make_fresh: Callable[[], nn.Module]):
        self.model, self.optimizer, self.make_fresh = model, optimizer, make_fresh

    def on_switch_end(self, event: SwitchEvent) -> None:
        args = self.session.args
        if args.shrink_and_perturb:
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + event.count)
            fresh = None
            if args.perturb_mode == "fresh_init":
                torch_state = torch.get_rng_state()
                torch.manual_seed(args.seed * 1_000_003 + event.count)
                fresh = self.make_fresh()
                torch.set_rng_state(torch_state)
            shrink_and_perturb(self.model, args.shrink_factor, args.noise_scale, args.perturb_mode, fresh, gen)
        if args.reset_optimizer_on_switch:
            reset_optimizer_state(self.optimizer)

