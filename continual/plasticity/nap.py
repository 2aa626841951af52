"""Normalize-and-Project (NaP; Lyle et al. 2024, "Normalization and effective learning rates in reinforcement
learning"): the network gets LayerNorm before every hidden activation (`--nap` implies `--layer_norm`,
networks.py), and after every optimizer step each weight matrix of the torso and the heads (a convolution's kernel
as one tensor) is projected back to its Frobenius norm at initialisation,

    W <- W * ||W_0|| / ||W||,

so the effective learning rate does not decay as the weights grow; each normalisation layer's scale and offset are
projected jointly, [gamma, beta] <- [gamma, beta] * ||[gamma_0, beta_0]|| / ||[gamma, beta]|| (Lyle et al.'s
treatment for homogeneous activations; Plasticine's). Biases of the weight layers are left free. The initial norms
are kept in checkpoints."""

from __future__ import annotations

import torch
import torch.nn as nn


def projected_modules(agent: nn.Module) -> list[nn.Module]:
    return [m for m in agent.modules() if isinstance(m, (nn.Linear, nn.Conv2d, nn.LayerNorm, nn.GroupNorm))]


def norms(module: nn.Module) -> float:
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
        return float(torch.cat([module.weight.detach().flatten(), module.bias.detach().flatten()]).double().norm())
    return float(module.weight.detach().double().norm())


@torch.no_grad()
def project(modules: list[nn.Module], targets: list[float]) -> None:
    for m, target in zip(modules, targets):
        current = norms(m)
        if current <= 0:
            continue
        factor = target / current
        m.weight.mul_(factor)
        if isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
            m.bias.mul_(factor)
