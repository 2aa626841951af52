"""ReDo, recycling dormant neurons (Sokar et al. 2023, "The dormant neuron phenomenon in deep RL"; the reference is
Dopamine's `labs/redo/weight_recyclers.py`, Plasticine's `plasticine_redo`).

On a batch of observations, every hidden unit (a Linear layer's output feature, a convolution's channel) whose score
s_i = E|h_i| / mean_k E|h_k| is at most tau is tau-dormant (`diagnostics.dormant_units`, the same definition as the
`plasticity/dormant_fraction` diagnostic). For each dormant unit:

1. its incoming weights and bias are re-initialised from the network's own initial distribution (the same rows of a
   freshly initialised copy of the network, seeded by the run's seed and the recycling count, so a resumed run
   recycles identically);
2. its outgoing weights are set to zero (in the next hidden layer, or in every head the last hidden layer feeds;
   through a Flatten, all the positions of a recycled channel; after a plasticity injection, in the frozen, new and
   frozen-copy heads alike), so the network's output does not change (without normalisation layers). A weight from a dormant unit to a dormant unit of the next layer is both outgoing and
   incoming: it is zero (all incoming weights are re-initialised first, then the outgoing ones zeroed), so a recycled
   unit never reads another recycled unit;
3. the optimizer's per-weight state of exactly those weights (incoming rows, bias entries, outgoing columns) is reset
   to zero: Adam's moments, RMSprop's square average, and AdamGnT's per-weight step count. Per-tensor step counts
   (torch.optim.Adam) are shared with the other weights and stay, as in Dopamine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

from continual.plasticity.diagnostics import ACTIVATIONS, dormant_units
from continual.plasticity.injection import head_linears


@dataclass
class HiddenLayer:
    name: str  # the incoming layer's module name
    layer: nn.Module  # Linear or Conv2d: one unit per output feature/channel
    act: nn.Module  # the activation whose output is the unit's value
    outs: list[nn.Module]  # the layers that read the units


def hidden_layers(agent: nn.Module) -> list[HiddenLayer]:
    """The hidden layers of `agent.network` (weight layer, its activation, the layers it feeds) in order."""
    mods = list(agent.network)
    names = [f"network.{i}" for i in range(len(mods))]
    weights = [i for i, m in enumerate(mods) if isinstance(m, (nn.Linear, nn.Conv2d))]
    heads = head_linears(agent)  # after a plasticity injection: every layer of the injected heads
    out = []
    for k, i in enumerate(weights):
        end = weights[k + 1] if k + 1 < len(weights) else len(mods)
        acts = [m for m in mods[i + 1:end] if isinstance(m, ACTIVATIONS)]
        if acts:
            out.append(HiddenLayer(names[i], mods[i], acts[0], [mods[end]] if end < len(mods) else heads))
    return out


def _in_mask(out_layer: nn.Module, mask: torch.Tensor) -> torch.Tensor:
    """The input columns of `out_layer` that carry the masked units (a Linear after a Flatten reads every position
    of a channel: channel-major, as nn.Flatten lays out (C, H, W))."""
    n_in = out_layer.in_channels if isinstance(out_layer, nn.Conv2d) else out_layer.in_features
    return torch.repeat_interleave(mask, n_in // mask.numel())


def _reset_state(optimizer: Optional[torch.optim.Optimizer], p: torch.Tensor, index) -> None:
    if optimizer is None:
        return
    for value in optimizer.state.get(p, {}).values():
        if torch.is_tensor(value) and value.shape == p.shape:
            value[index] = 0


@torch.no_grad()
def recycle(agent: nn.Module, obs: torch.Tensor, tau: float, fresh: nn.Module,
            optimizer: Optional[torch.optim.Optimizer] = None) -> dict[str, int]:
    """Recycle the tau-dormant units of `agent` measured on `obs` (a batch of observations, as `agent.features`
    takes them); `fresh`: a freshly initialised agent of the same architecture. Returns units recycled per layer."""
    layers = hidden_layers(agent)
    acts: dict[int, torch.Tensor] = {}
    hooks = [h.act.register_forward_hook(lambda m, i, o, k=k: acts.__setitem__(k, o)) for k, h in enumerate(layers)]
    try:
        agent.features(obs)
    finally:
        for h in hooks:
            h.remove()
    fresh_mods = dict(fresh.named_modules())
    masks = [dormant_units(acts[k], tau) for k in range(len(layers))]
    counts = {h.name: int(m.sum()) for h, m in zip(layers, masks)}
    for h, mask in zip(layers, masks):  # all incoming weights first ...
        if counts[h.name]:
            new = fresh_mods[h.name]
            h.layer.weight[mask] = new.weight[mask].to(h.layer.weight)
            _reset_state(optimizer, h.layer.weight, mask)
            if h.layer.bias is not None:
                h.layer.bias[mask] = new.bias[mask].to(h.layer.bias)
                _reset_state(optimizer, h.layer.bias, mask)
    for h, mask in zip(layers, masks):  # ... then the outgoing zeros, which win where a weight is both
        if counts[h.name]:
            for out in h.outs:
                cols = _in_mask(out, mask)
                out.weight[:, cols] = 0.0
                _reset_state(optimizer, out.weight, (slice(None), cols))
    return counts


def seeded_fresh(make_fresh: Callable[[], nn.Module], seed: int) -> nn.Module:
    """A fresh network from `make_fresh` under torch seed `seed`, leaving the global torch RNG as it was."""
    with torch.random.fork_rng():  # CUDA generators too: the rollout samples actions on the device
        torch.manual_seed(seed)
        return make_fresh()
