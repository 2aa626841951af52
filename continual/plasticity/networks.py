"""Network options against plasticity loss, applied to a built agent by one call where the agent is made
(`apply_network_options(agent, args)`), so the architectures keep their one definition:

- `--layer_norm` (Lyle et al. 2024, "Disentangling the causes of plasticity loss"; Plasticine's LN option): a
  normalisation between every hidden layer's pre-activations and its activation: LayerNorm over the units of a
  Linear layer, GroupNorm with one group (LayerNorm over channels and positions, one scale and offset per channel)
  for a convolution;
- `--activation crelu` (Abbas et al. 2023, "Loss of plasticity in continual deep RL"): CReLU(x) = [relu(x), relu(-x)]
  concatenated over features/channels;
- `--activation fourier` (Lewandowski et al. 2024, "Plastic learning with deep Fourier features"): [sin(x), cos(x)].

Both activations double a layer's outputs; as in Abbas et al. and Plasticine the hidden layers keep their
pre-activation units and the layer after each (the next hidden layer or the heads) takes twice the inputs, freshly
initialised as the original was: orthogonal with the original's gain (read from its weights, exact at
initialisation: an orthogonal matrix's squared Frobenius norm is gain^2 * min(rows, columns)) and its constant bias,
or PyTorch's default initialisation for networks that use it (DQN).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

HEADS = ("actor", "critic", "q_head")  # the layers fed by an agent's torso (`agent.network`)


class CReLU(nn.Module):
    kind = "relu"  # its entries are active when positive, as ReLU's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((torch.relu(x), torch.relu(-x)), dim=1)


class FourierFeatures(nn.Module):
    kind = "fourier"  # bounded and never zero on an interval: no active/inactive split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((torch.sin(x), torch.cos(x)), dim=1)


def _weight_layers(seq: nn.Sequential) -> list[int]:
    return [i for i, m in enumerate(seq) if isinstance(m, (nn.Linear, nn.Conv2d))]


def _widened(layer: nn.Module, orthogonal: bool) -> nn.Module:
    """A fresh layer like `layer` with twice its inputs, initialised as `layer` was."""
    bias = layer.bias is not None
    if isinstance(layer, nn.Conv2d):
        new = nn.Conv2d(2 * layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.padding,
                        bias=bias)
    else:
        new = nn.Linear(2 * layer.in_features, layer.out_features, bias=bias)
    if orthogonal:
        w = layer.weight.detach().flatten(1)
        gain = math.sqrt(float(w.double().pow(2).sum()) / min(w.shape))
        nn.init.orthogonal_(new.weight, gain)
        if bias:
            nn.init.constant_(new.bias, float(layer.bias.detach().mean()))
    return new.to(device=layer.weight.device, dtype=layer.weight.dtype)


def _norm(layer: nn.Module) -> nn.Module:
    if isinstance(layer, nn.Conv2d):
        return nn.GroupNorm(1, layer.out_channels)
    return nn.LayerNorm(layer.out_features)


def network_options(args) -> tuple[bool, str]:
    # NaP (nap.py) is LayerNorm plus a projection
    return bool(getattr(args, "layer_norm", False) or getattr(args, "nap", False)), getattr(args, "activation", "default")


def apply_network_options(agent: nn.Module, args, orthogonal: bool = True) -> nn.Module:
    """Rewrite `agent.network` (an nn.Sequential torso of weight layers, each followed by its activation) and the
    heads it feeds per --layer_norm and --activation; returns the agent. Call it on a freshly built agent only.
    `orthogonal`: the agent initialises its layers orthogonally (ppo.Agent); False: PyTorch's default (DQN)."""
    layer_norm, activation = network_options(args)
    if not layer_norm and activation == "default":
        return agent
    mods = list(agent.network)
    weights = _weight_layers(agent.network)
    # the layout the agent chose for its convolutions (channels-last for pixel images) is kept for the new layers
    keep_channels_last = any(isinstance(m, nn.Conv2d) and not m.weight.is_contiguous()
                             and m.weight.is_contiguous(memory_format=torch.channels_last) for m in mods)
    out: list[nn.Module] = []
    widen_next = False
    for i, m in enumerate(mods):
        if isinstance(m, (nn.Linear, nn.Conv2d)) and widen_next:
            m, widen_next = _widened(m, orthogonal), False
        if isinstance(m, (nn.ReLU, nn.Tanh)) and any(w < i for w in weights):
            prev = mods[max(w for w in weights if w < i)]
            if layer_norm:
                out.append(_norm(prev).to(prev.weight.device))
            if activation != "default":
                m, widen_next = (CReLU() if activation == "crelu" else FourierFeatures()), True
        out.append(m)
    agent.network = nn.Sequential(*out)
    if widen_next:  # the last hidden layer doubled: the heads take twice the inputs
        for name in HEADS:
            head = getattr(agent, name, None)
            if isinstance(head, nn.Linear):
                setattr(agent, name, _widened(head, orthogonal))
    if keep_channels_last:
        agent.to(memory_format=torch.channels_last)
    return agent
