"""Plasticity diagnostics, logged under `plasticity/*` at every switch (the network at the end of the outgoing
regime) and every `--diagnostics_every` steps:

- `plasticity/dormant_fraction/<layer>`: share of tau-dormant units (Sokar et al. 2023): unit i is dormant when
  s_i = E|h_i| / mean_k E|h_k| <= tau (`--dormant_tau`), E over the probe batch (and positions for conv channels),
  the mean over the units k of the same layer; `plasticity/dormant_fraction/all`: dormant units of every hidden
  layer over all their units (as Sokar et al. count them; not the mean of the per-layer fractions, which would
  weigh a 32-channel conv layer like a 512-unit one);
- `plasticity/effective_rank`: effective rank of the penultimate features on the probe batch, exp(H(p)) with
  p = sigma / sum(sigma) the normalised singular values (Roy & Vetterli 2007);
- `plasticity/weight_norm/<layer>`, `plasticity/grad_norm/<layer>` (last minibatch of the last update, before
  clipping);
- `plasticity/replaced/<layer>`: units replaced so far (PPO_CBP).

All are computed on a fixed probe batch: observations sampled from the first rollout, then kept (and saved in
checkpoints) so values are comparable over the whole run.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn as nn

from continual.training.callbacks import Callback, SwitchEvent

PROBE_SIZE = 256


def dormant_units(act: torch.Tensor, tau: float) -> torch.Tensor:
    """Boolean mask of the tau-dormant units of one layer; act: (batch, units) or (batch, channels, h, w)."""
    dims = (0, 2, 3) if act.dim() == 4 else (0,)
    score = act.abs().mean(dim=dims)
    mean = score.mean()
    if mean <= 0:
        return torch.ones_like(score, dtype=torch.bool)
    return score / mean <= tau


def dormant_fraction(act: torch.Tensor, tau: float) -> float:
    """act: (batch, units) or (batch, channels, h, w) activations."""
    return float(dormant_units(act, tau).float().mean())


def effective_rank(features: torch.Tensor) -> float:
    """exp of the entropy of the normalised singular values of a (batch, features) matrix."""
    s = torch.linalg.svdvals(features.double())
    total = s.sum()
    if total <= 0:
        return 0.0
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


class PlasticityMonitor(Callback):
    """Plasticity diagnostics of `agent` (dormant units, effective rank, gradient norms), logged every
    --diagnostics_every steps (`maybe_log`, called by the agent after each iteration) and right before every switch
    (as a session callback: `session.add_callback(PlasticityMonitor(session, agent))`)."""

    def __init__(self, session, agent: nn.Module):
        self.session, self.agent = session, agent
        self.args = session.args
        self.probe: Optional[torch.Tensor] = None
        self._grad_names: list[str] = []
        self._grad_norms: Optional[torch.Tensor] = None  # on the model's device until logged
        self._last_step = session.global_step
        self._logged_at: Optional[int] = None

    def on_switch_start(self, event: SwitchEvent) -> None:
        self.log()

    def observe(self, obs: torch.Tensor) -> None:
        """Take the probe batch from the first rollout (obs: (steps, envs, ...))."""
        if self.probe is None:
            flat = obs.reshape((-1,) + obs.shape[2:])
            idx = self.session.np_rng.choice(len(flat), size=min(PROBE_SIZE, len(flat)), replace=False)
            self.probe = flat[torch.as_tensor(np.sort(idx), device=flat.device)].clone()

    def record_grads(self) -> None:
        # called every minibatch: the norms stay on the device (a float() per layer would wait for the GPU six times
        # per minibatch) and reach the host only when logged
        layers = [(n, m.weight.grad) for n, m in _layers(self.agent) if m.weight.grad is not None]
        self._grad_names = [n for n, _ in layers]
        self._grad_norms = torch.stack([g.detach().norm() for _, g in layers]) if layers else None

    @property
    def grad_norms(self) -> dict[str, float]:
        """Gradient norm per layer at the last `record_grads` call."""
        if self._grad_norms is None:
            return {}
        return dict(zip(self._grad_names, self._grad_norms.tolist()))

    def maybe_log(self) -> None:
        every = self.args.diagnostics_every
        if every and self.session.global_step // every != self._last_step // every:
            self.log()
        self._last_step = self.session.global_step

    @torch.no_grad()
    def compute(self) -> dict[str, float]:
        if self.probe is None:
            return {}
        acts: dict[str, torch.Tensor] = {}
        hooks = []
        index = 0
        for _, module in self.agent.network.named_modules():
            if isinstance(module, (nn.ReLU, nn.Tanh)):
                name = f"layer{index}"
                index += 1
                hooks.append(module.register_forward_hook(lambda m, i, o, name=name: acts.__setitem__(name, o)))
        try:
            features = self.agent.features(self.probe)
        finally:
            for h in hooks:
                h.remove()
        masks = {k: dormant_units(v, self.args.dormant_tau) for k, v in acts.items()}
        out = {f"plasticity/dormant_fraction/{k}": float(m.float().mean()) for k, m in masks.items()}
        n_units = sum(m.numel() for m in masks.values())
        out["plasticity/dormant_fraction/all"] = sum(int(m.sum()) for m in masks.values()) / n_units if n_units else 0.0
        out["plasticity/effective_rank"] = effective_rank(features.flatten(1))
        for name, module in _layers(self.agent):
            out[f"plasticity/weight_norm/{name}"] = float(module.weight.norm())
        for name, g in self.grad_norms.items():
            out[f"plasticity/grad_norm/{name}"] = g
        cbp = getattr(self.agent, "cbp", None)
        if cbp is not None:
            for name, n in cbp.replaced().items():
                out[f"plasticity/replaced/{name}"] = n
        return out

    def log(self) -> None:
        if self._logged_at == self.session.global_step:  # a switch and the periodic cadence can meet
            return
        self._logged_at = self.session.global_step
        values = self.compute()
        if values:
            self.session.logger.scalars(values, self.session.global_step)
            self.session.logger.record("plasticity", self.session.global_step,
                                       modification=self.session.modification, **values)

    def state_dict(self) -> dict:
        return {"probe": None if self.probe is None else self.probe.cpu()}

    def load_state_dict(self, state: dict) -> None:
        probe = state.get("probe")
        self.probe = None if probe is None else probe.to(next(self.agent.parameters()).device)
