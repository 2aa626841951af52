"""Normalize-and-Project (NaP; Lyle et al. 2024, "Normalization and effective learning rates in reinforcement
learning"): the network gets LayerNorm before every hidden activation (`--nap` implies `--layer_norm`,
networks.py), and after every optimizer step each weight matrix of the torso (a convolution's kernel as one tensor)
is projected back to its Frobenius norm at initialisation,

    W <- W * ||W_0|| / ||W||,

so the effective learning rate does not decay as the weights grow; each normalisation layer's scale and offset are
projected jointly, [gamma, beta] <- [gamma, beta] * ||[gamma_0, beta_0]|| / ||[gamma, beta]|| (Lyle et al.'s
treatment for homogeneous activations; Plasticine's). Biases of the weight layers are left free. The initial norms
are kept in checkpoints.

The output heads are left free unless `--nap_project_heads` (Plasticine projects them too). The projection leaves
the function unchanged only for a layer whose output is normalised; a head's norm is its outputs' scale. CleanRL's
actor head starts at norm 0.01 * sqrt(actions), and held there it bounds every logit by that times ||features||: on
permuted MinAtar Breakout (128 features) the policy stayed near uniform (median entropy 0.97-1.04 per seed; ln 3 =
1.10), and PPO with its heads projected returned 0.6-0.8 per regime against plain PPO's 1.6-5.7 (docs/results/plasticity.md)."""

from __future__ import annotations

import torch
import torch.nn as nn

from continual.plasticity.networks import HEADS


def projected_modules(agent: nn.Module, heads: bool = False) -> list[nn.Module]:
    """The weight and normalisation layers NaP projects: all of the agent's but its heads' (all with `heads`)."""
    skip = set() if heads else {id(m) for h in HEADS if isinstance(getattr(agent, h, None), nn.Module)
                                for m in getattr(agent, h).modules()}
    return [m for m in agent.modules()
            if isinstance(m, (nn.Linear, nn.Conv2d, nn.LayerNorm, nn.GroupNorm)) and id(m) not in skip]


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
