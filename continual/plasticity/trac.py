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

with the paper's betas (0.9, 0.99, ..., 0.999999), s_init = 1e-8 (`--trac_s_init`), eps = 1e-8. The reference
code recovers theta_base from the scaled weights by dividing by (S + eps); here theta_base is kept explicitly (the
same update without that division's rounding; one more copy of the weights in memory and in checkpoints).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

BETAS = (0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999)


class TRAC:
    """Wraps a torch optimizer (duck-typed as one: step, zero_grad, param_groups, state, state_dict)."""

    def __init__(self, base: torch.optim.Optimizer, s_init: float = 1e-8, eps: float = 1e-8,
                 betas: tuple[float, ...] = BETAS):
        self.base, self.s_init, self.eps = base, s_init, eps
        self.betas = np.asarray(betas, dtype=np.float64)
        self.params = [p for g in base.param_groups for p in g["params"]]
        self.ref = [p.detach().clone() for p in self.params]
        self.theta_base = [p.detach().clone() for p in self.params]
        self.v = np.zeros_like(self.betas)
        self.sigma = np.zeros_like(self.betas)
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
        h = float(sum((self.params[i].grad.double() * (self.theta_base[i] - self.ref[i]).double()).sum()
                      for i in with_grad)) if with_grad else 0.0
        scaled = [p.detach().clone() for p in self.params]
        for p, b in zip(self.params, self.theta_base):  # the base optimizer steps its own iterate
            p.copy_(b)
        self.base.step()
        for p, b in zip(self.params, self.theta_base):
            b.copy_(p)
        self.v = self.betas ** 2 * self.v + h * h
        self.sigma = self.betas * self.sigma - h
        from scipy.special import erfi  # here: scipy's import costs every run ~0.15 s

        self.s = self.s_init / erfi(1.0 / np.sqrt(2.0)) * erfi(self.sigma / (np.sqrt(2.0 * self.v) + self.eps))
        scale = self.scale
        for i, (p, b, r) in enumerate(zip(self.params, self.theta_base, self.ref)):
            if self.params[i].grad is None:
                p.copy_(scaled[i])  # untouched this step (the base optimizer skipped it too)
            else:
                p.copy_(r + (b - r) * scale)

    def state_dict(self) -> dict:
        return {"base": self.base.state_dict(), "trac": {
            "ref": [t.cpu().clone() for t in self.ref], "theta_base": [t.cpu().clone() for t in self.theta_base],
            "v": self.v.tolist(), "sigma": self.sigma.tolist(), "s": self.s.tolist()}}

    def load_state_dict(self, state: dict) -> None:
        self.base.load_state_dict(state["base"])
        t = state["trac"]
        self.ref = [x.to(p.device) for x, p in zip(t["ref"], self.params)]
        self.theta_base = [x.to(p.device) for x, p in zip(t["theta_base"], self.params)]
        self.v, self.sigma, self.s = (np.asarray(t[k], dtype=np.float64) for k in ("v", "sigma", "s"))
