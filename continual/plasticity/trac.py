"""TRAC (Muppidi et al. 2024, "Fast TRAC: a parameter-free optimizer for lifelong RL"; reference code:
ComputationalRobotics/TRAC, vendored by Plasticine as `plasticine/trac.py`): a base optimizer (the agent's Adam)
runs on its own iterate theta_base, and the network's weights are that iterate's displacement from a reference
theta_ref (the initial weights), scaled by a learned, data-dependent factor S:

    g_t = grad L(theta_t)                                       (at the scaled weights)
    h_t = <g_t, theta_base_t - theta_ref>
    theta_base_{t+1} = BASE(theta_base_t, g_t)
    for each beta_j:  v_j <- beta_j^2 v_j + h_t^2,   sigma_j <- beta_j sigma_j - h_t,
                      s_j = s_init / erfi(1/sqrt 2) * erfi(sigma_j / (sqrt(2 v_j) + eps))
    theta_{t+1} = theta_ref + (theta_base_{t+1} - theta_ref) * max(sum_j s_j, 0)

with the paper's betas (0.9, 0.99, ..., 0.999999), s_init = 1e-8 (`--trac_s_init`), eps = 1e-8.

Two forms, which differ where S is small:
- the reference code's (the default; the code behind the paper's results and Plasticine's): theta_base is not kept
  but recovered from the weights every step, theta_base - theta_ref = (theta_t - theta_ref) / (sum_j s_j + eps), and
  sigma starts at 1e-8. Where S is a few eps the recovered iterate shrinks toward theta_ref, and whenever S falls
  to 0 or below (the weights are then theta_ref) the base iterate restarts from theta_ref: a reset that the
  written algorithm does not have;
- the paper's Algorithm 1 as written (`--trac_keep_base`): theta_base is kept explicitly (one more copy of the
  weights in memory and in checkpoints), sigma starts at 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

BETAS = (0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999)


class TRAC:
    """Wraps a torch optimizer (duck-typed as one: step, zero_grad, param_groups, state, state_dict)."""

    def __init__(self, base: torch.optim.Optimizer, s_init: float = 1e-8, eps: float = 1e-8,
                 betas: tuple[float, ...] = BETAS, keep_base: bool = False):
        self.base, self.s_init, self.eps, self.keep_base = base, s_init, eps, keep_base
        self.betas = np.asarray(betas, dtype=np.float64)
        self.params = [p for g in base.param_groups for p in g["params"]]
        self.ref = [p.detach().clone() for p in self.params]
        self.theta_base = [p.detach().clone() for p in self.params] if keep_base else []
        self.v = np.zeros_like(self.betas)
        self.sigma = np.zeros_like(self.betas) if keep_base else np.full_like(self.betas, 1e-8)
        self.s = np.zeros_like(self.betas)

    @property
    def param_groups(self) -> list[dict]:
        return self.base.param_groups

    @property
    def state(self) -> Any:
        return self.base.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)

    @property
    def scale(self) -> float:
        return max(float(self.s.sum()), 0.0)

    @torch.no_grad()
    def step(self) -> None:
        with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
        if self.keep_base:
            offsets = [self.theta_base[i] - self.ref[i] for i in with_grad]
        else:  # the reference code's recovery; the weights are exactly theta_ref whenever S <= 0, so 0 / (S + eps) = 0
            denominator = float(self.s.sum()) + self.eps
            offsets = [(self.params[i] - self.ref[i]) / denominator if denominator else
                       torch.zeros_like(self.params[i]) for i in with_grad]
        h = float(sum((self.params[i].grad.double() * d.double()).sum() for i, d in zip(with_grad, offsets)))
        before = [p.detach().clone() for p in self.params]
        if self.keep_base:  # the base optimizer steps its own iterate
            for p, b in zip(self.params, self.theta_base):
                p.copy_(b)
        self.base.step()
        if self.keep_base:
            for p, b in zip(self.params, self.theta_base):
                b.copy_(p)
        else:  # the base optimizer stepped the scaled weights; its step is added to the recovered displacement
            offsets = [d + (self.params[i] - before[i]) for i, d in zip(with_grad, offsets)]
        self.v = self.betas ** 2 * self.v + h * h
        self.sigma = self.betas * self.sigma - h
        from scipy.special import erfi  # here: scipy's import costs every run ~0.15 s

        self.s = self.s_init / erfi(1.0 / np.sqrt(2.0)) * erfi(self.sigma / (np.sqrt(2.0 * self.v) + self.eps))
        scale = self.scale
        for i, p in enumerate(self.params):
            if p.grad is None:
                p.copy_(before[i])  # untouched this step (the base optimizer skipped it too)
        for k, i in enumerate(with_grad):
            d = self.theta_base[i] - self.ref[i] if self.keep_base else offsets[k]
            self.params[i].copy_(self.ref[i] + d * scale)

    def state_dict(self) -> dict:
        return {"base": self.base.state_dict(), "trac": {
            "ref": [t.cpu().clone() for t in self.ref], "theta_base": [t.cpu().clone() for t in self.theta_base],
            "v": self.v.tolist(), "sigma": self.sigma.tolist(), "s": self.s.tolist()}}

    def load_state_dict(self, state: dict) -> None:
        self.base.load_state_dict(state["base"])
        t = state["trac"]
        self.ref = [x.to(p.device) for x, p in zip(t["ref"], self.params)]
        if self.keep_base:
            self.theta_base = [x.to(p.device) for x, p in zip(t["theta_base"], self.params)]
        self.v, self.sigma, self.s = (np.asarray(t[k], dtype=np.float64) for k in ("v", "sigma", "s"))
