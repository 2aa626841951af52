"""Loss terms against plasticity loss, added to an agent's loss every minibatch (`PlasticityMethods.penalty`):

- `--l2`: L2 toward zero, coef * sum_i theta_i^2 over every trainable parameter (Kumar et al. 2023's L2 baseline);
- `--l2_init`: regenerative regularisation, L2 toward the initial weights, coef * sum_i (theta_i - theta0_i)^2
  (Kumar et al. 2023, "Maintaining plasticity in continual learning via regenerative regularization"; theta0 are
  the weights at initialisation, kept in checkpoints). Plasticine's version uses the unsquared norm; this is the
  paper's squared one;
- `--parseval`: Parseval regularisation (Chung et al. 2024), coef * sum_l ||W_l W_l^T - s I||_F^2 over the hidden
  layers of the torso (every layer but the heads, as the paper leaves the last layer out), W_l the (units, fan_in)
  weight matrix (a convolution's kernels flattened per output channel), s = `--parseval_scale`.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def l2(params: list[torch.Tensor]) -> torch.Tensor:
    return sum(p.pow(2).sum() for p in params)


def l2_to(params: list[torch.Tensor], refs: list[torch.Tensor]) -> torch.Tensor:
    return sum((p - r).pow(2).sum() for p, r in zip(params, refs))


def parseval(layers: list[nn.Module], scale: float = 1.0) -> torch.Tensor:
    total = 0.0
    for layer in layers:
        w = layer.weight.flatten(1)
        gram = w @ w.T
        total = total + (gram - scale * torch.eye(gram.shape[0], device=w.device, dtype=w.dtype)).pow(2).sum()
    return total
