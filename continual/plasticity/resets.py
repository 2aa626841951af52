"""Layer resetting (Nikishin et al. 2022, "The primacy bias in deep RL"): the last k layers of the network are
re-initialised, with their optimizer state, at every regime switch or every N steps (`--reset_layers k`,
`--reset_every N`). Layers count from the output: the heads (actor and critic, or the Q head) are the last layer,
then the torso's weight layers backwards (a normalisation right after a reset layer is reset with it). The fresh
weights are those of a newly initialised network (seeded by the run's seed and the reset count)."""

from __future__ import annotations

import torch
import torch.nn as nn

from continual.plasticity.networks import HEADS


def layer_groups(agent: nn.Module) -> list[list[str]]:
    """Module names of the network's layers from the output backwards: [heads], [last torso layer (+ its norm)], ..."""
    groups = [[h for h in HEADS if isinstance(getattr(agent, h, None), nn.Linear)]]
    mods = list(agent.network)
    for i in reversed(range(len(mods))):
        if isinstance(mods[i], (nn.Linear, nn.Conv2d)):
            group = [f"network.{i}"]
            if i + 1 < len(mods) and isinstance(mods[i + 1], (nn.LayerNorm, nn.GroupNorm)):
                group.append(f"network.{i + 1}")
            groups.append(group)
    return groups


@torch.no_grad()
def reset_last_layers(agent: nn.Module, k: int, fresh: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Copy the last `k` layers' parameters from `fresh` into `agent` and drop their optimizer state (a reset
    parameter restarts Adam as a new one would). Returns the reset modules' names."""
    names = [n for group in layer_groups(agent)[:k] for n in group]
    mods, fresh_mods = dict(agent.named_modules()), dict(fresh.named_modules())
    for name in names:
        for (pname, p), q in zip(mods[name].named_parameters(), fresh_mods[name].parameters()):
            p.copy_(q)
            optimizer.state.pop(p, None)
    return names
