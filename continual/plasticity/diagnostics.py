"""Plasticity diagnostics, logged under `plasticity/*` at every switch (the network at the end of the outgoing
regime) and every `--diagnostics_every` steps:

- `plasticity/dormant_fraction/<layer>`: share of tau-dormant units (Sokar et al. 2023): unit i is dormant when
  s_i = E|h_i| / mean_k E|h_k| <= tau (`--dormant_tau`), E over the probe batch (and positions for conv channels),
  the mean over the units k of the same layer; `plasticity/dormant_fraction/all`: dormant units of every hidden
  layer over all their units (as Sokar et al. count them; not the mean of the per-layer fractions, which would
  weigh a 32-channel conv layer like a 512-unit one);
- `plasticity/effective_rank`: effective rank of the penultimate features on the probe batch, exp(H(p)) with
  p = sigma / sum(sigma) the normalised singular values (Roy & Vetterli 2007);
- `plasticity/stable_rank`: srank_delta of the penultimate features (Kumar et al. 2021, "Implicit
  under-parameterization"; Plasticine's `compute_stable_rank`): the least k with
  sum_{i<=k} sigma_i >= (1 - delta) * sum_i sigma_i, delta = 0.01, singular values in decreasing order;
- `plasticity/active_fraction/<layer>` and `.../all`: fraction of active units (Plasticine's
  `compute_active_units`, per hidden layer rather than on the last one only): the share of (sample, unit[, position])
  entries that are active on the probe batch: h > 0 for ReLU (and each half of a CReLU), |h| <= 0.99 (not saturated)
  for tanh; `all` pools the entries of every hidden layer;
- `plasticity/weight_change/init` and `plasticity/weight_change/switch`: root-mean-square change of every trainable
  parameter, sqrt(sum (theta - theta_ref)^2 / n) (Plasticine's `compute_l2_norm_difference`), against the weights at
  initialisation and against those at the start of the current regime (the last switch; the start of the run before
  the first). At a switch the value logged is the change over the regime that ends;
- `plasticity/weight_norm/<layer>`, `plasticity/grad_norm/<layer>` (last minibatch of the last update, before
  clipping);
- `plasticity/replaced/<layer>`: units replaced so far (PPO_CBP).

All are computed on a fixed probe batch: observations sampled from the first rollout, then kept (and saved in
checkpoints, with the reference weights of the weight change) so values are comparable over the whole run.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.nn as nn

from continual.plasticity.networks import CReLU, FourierFeatures
from continual.training.extensions import Extension, SwitchEvent

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


def stable_rank(features: torch.Tensor, delta: float = 0.01) -> int:
    """srank_delta of a (batch, features) matrix: the least k whose k largest singular values hold a (1 - delta)
    share of their sum (0 for an all-zero matrix)."""
    s = torch.linalg.svdvals(features.double())
    total = s.sum()
    if total <= 0:
        return 0
    return int((torch.cumsum(s, 0) < (1.0 - delta) * total).sum()) + 1


def active_mask(act: torch.Tensor, kind: str) -> torch.Tensor:
    """Boolean mask of the active entries of one layer's activations: relu (CReLU too): h > 0; tanh: |h| <= 0.99."""
    if kind == "tanh":
        return act.abs() <= 0.99
    return act > 0


def active_fraction(act: torch.Tensor, kind: str) -> float:
    return float(active_mask(act, kind).double().mean())


def weight_change(model: nn.Module, reference: dict[str, torch.Tensor]) -> float:
    """sqrt(sum (theta - theta_ref)^2 / n) over the trainable parameters that `reference` holds (by name), float64."""
    total, n = 0.0, 0
    for name, p in model.named_parameters():
        if p.requires_grad and name in reference:
            total += float((p.detach().double().cpu() - reference[name].double()).pow(2).sum())
            n += p.numel()
    return math.sqrt(total / n) if n else 0.0


def weight_snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


ACTIVATIONS = (nn.ReLU, nn.Tanh, CReLU, FourierFeatures)  # modules whose outputs are a hidden layer's units


def activation_kind(module: nn.Module) -> str:
    return "tanh" if isinstance(module, nn.Tanh) else getattr(module, "kind", "relu")


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


class PlasticityMonitor(Extension):
    """Plasticity diagnostics of `agent` (dormant units, effective rank, gradient norms), logged every
    --diagnostics_every steps (once the iteration's checkpoints are written) and right before every switch. Its probe
    batch comes from the first iteration's observations (`observe`), the gradient norms from every backward pass
    (`before_step`)."""

    state_key = "plasticity"

    def __init__(self, session, agent: nn.Module):
        self.session, self.agent = session, agent
        self.args = session.args
        self.probe: Optional[torch.Tensor] = None
        self._grad_names: list[str] = []
        self._grad_norms: Optional[torch.Tensor] = None  # on the model's device until logged
        self._last_step = session.global_step
        self._logged_at: Optional[int] = None
        # reference weights of the weight change (checkpoints hold them: a resumed run measures from the same ones)
        self.init_weights = weight_snapshot(agent)
        self.switch_weights = self.init_weights

    def on_switch_start(self, event: SwitchEvent) -> None:
        self.log()
        self.switch_weights = weight_snapshot(self.agent)

    def observe(self, batch: dict) -> None:
        """Take the probe batch from the first rollout (batch["obs"]: (steps, envs, ...))."""
        obs = batch["obs"]
        if self.probe is None:
            flat = obs.reshape((-1,) + obs.shape[2:])
            idx = self.session.np_rng.choice(len(flat), size=min(PROBE_SIZE, len(flat)), replace=False)
            self.probe = flat[torch.as_tensor(np.sort(idx), device=flat.device)].clone()

    def before_step(self) -> None:
        self.record_grads()

    def record_grads(self) -> None:
        # called every minibatch: the norms stay on the device (a float() per layer would wait for the GPU six times
        # per minibatch) and reach the host only when logged
        layers = [(n, m.weight.grad) for n, m in _layers(self.agent) if m.weight.grad is not None]
        self._grad_names = [n for n, _ in layers]
        grads = [g.detach() for _, g in layers]
        if not grads:
            self._grad_norms = None
        elif grads[0].device.type == "cpu":  # there foreach runs each tensor's norm kernel: the same numbers, one call
            self._grad_norms = torch.stack(torch._foreach_norm(grads))
        else:  # CUDA's foreach norm reduces in another order
            self._grad_norms = torch.stack([g.norm() for g in grads])

    @property
    def grad_norms(self) -> dict[str, float]:
        """Gradient norm per layer at the last `record_grads` call."""
        if self._grad_norms is None:
            return {}
        return dict(zip(self._grad_names, self._grad_norms.tolist()))

    def on_iteration_saved(self) -> None:
        self.maybe_log()

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
        kinds: dict[str, str] = {}
        hooks = []
        index = 0
        for _, module in self.agent.network.named_modules():
            if isinstance(module, ACTIVATIONS):
                name = f"layer{index}"
                index += 1
                kinds[name] = activation_kind(module)
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
        active = {k: active_mask(v, kinds[k]) for k, v in acts.items() if kinds[k] != "fourier"}
        for k, m in active.items():
            out[f"plasticity/active_fraction/{k}"] = float(m.double().mean())
        n_entries = sum(m.numel() for m in active.values())
        if n_entries:
            out["plasticity/active_fraction/all"] = sum(int(m.sum()) for m in active.values()) / n_entries
        out["plasticity/effective_rank"] = effective_rank(features.flatten(1))
        out["plasticity/stable_rank"] = stable_rank(features.flatten(1))
        out["plasticity/weight_change/init"] = weight_change(self.agent, self.init_weights)
        out["plasticity/weight_change/switch"] = weight_change(self.agent, self.switch_weights)
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
        return {"probe": None if self.probe is None else self.probe.cpu(), "init_weights": self.init_weights,
                "switch_weights": self.switch_weights}

    def load_state_dict(self, state: dict) -> None:
        # checkpoints written before the weight change was measured: from the resumed weights on
        self.init_weights = state.get("init_weights") or weight_snapshot(self.agent)
        self.switch_weights = state.get("switch_weights") or self.init_weights
        probe = state.get("probe")
        self.probe = None if probe is None else probe.to(next(self.agent.parameters()).device)
