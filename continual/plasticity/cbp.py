"""Continual Backpropagation (Dohare et al., Nature 2024): keep hidden units plastic by re-initialising, at a small
rate, the mature units that contribute least.

One `UnitTracker` per hidden layer. A layer is described by its incoming module (Linear or Conv2d: one unit per
output feature/channel), the activation module whose output we observe, and its outgoing modules (one or several:
a layer feeding both the actor and critic heads is tracked ONCE, over both heads). After every optimizer update
(`CBP.step`):

1. contribution of unit j on the latest minibatch: c_j = mean|h_j| * sum_k |w_out[k, j]|   ("contribution"),
   or c_j = mean|h_j - f_j| * sum_k |w_out[k, j]| with f_j the running mean activation ("mean_contribution");
   for conv units the mean is over batch and positions and the sum over every outgoing weight of the channel;
2. running average u_j <- eta*u_j + (1 - eta)*c_j with eta = --decay_rate, used bias-corrected:
   u_j / (1 - eta^age_j) (the paper's correction, so young units are not judged on a zero-initialised average);
3. age_j += 1 (ages count optimizer updates, whatever the batch and minibatch sizes);
4. a fraction rho (--replacement_rate) of the *mature* units (age > --maturity_threshold) is replaced: rho*n_eligible
   accumulates and each whole unit is replaced, lowest utility first. Replacing unit j: fresh incoming weights
   (--init), zero incoming bias, zero outgoing weights (the network's function is unchanged), its mean
   contribution f_j * w_out[:, j] moved into the outgoing layers' biases, age/utility reset, and the Adam state
   (moments AND step count) of every replaced weight reset: incoming weights and bias, outgoing weights (as the
   reference implementation does; the outgoing biases keep theirs). A unit fed by several layers (HER's fused layer:
   image features and goal) gets ALL its incoming weights re-initialised.

The step count must be per weight for that reset to mean anything: `AdamGnT` is Adam with a step count per element
(the reference's optimizer of the same name, but textbook Adam: the reference's discards its bias-correction result,
`bias_correction.sqrt().div_(...)` on a copy, so its steps scale with 1 - beta2^t; its RL runs use torch's Adam).
Fresh incoming weights use `--init`'s bound for convolutions too (`init_bound`; kaiming: 2.45x the reference's
conv bound, sqrt(1 / fan_in) whatever the init). With torch.optim.Adam's one step count per tensor, a weight whose
moments restart at zero late in training gets the bias correction of a long-trained one, and its first updates are
several times larger than Adam's (about 3x on the first update after replacement with the default betas).

After a plasticity injection (injection.py) the last hidden layer's outgoing modules are the injected heads
h + h' - h'^-: the contribution uses their effective weights w_old + w_new - w_frozen, and a replacement zeroes the
unit's columns and moves its mean contribution into the biases of all three (frozen ones included), which keeps the
injected output as it keeps a plain one.

All statistics are module buffers, so they are saved in checkpoints and restored with the weights.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn as nn


class AdamGnT(torch.optim.Optimizer):
    """Adam (Kingma & Ba 2015) with one step count per weight, so that a weight re-initialised by CBP restarts its
    moments AND its bias correction (Dohare et al.'s AdamGnT). Equal to torch.optim.Adam (no weight decay, no
    amsgrad) while nothing is reset. State per parameter: `step` (float tensor shaped like it), `exp_avg`,
    `exp_avg_sq`."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"AdamGnT: invalid lr {lr}, eps {eps} or betas {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                step = state["step"]
                if step.shape != p.shape or step.device != p.device:
                    # a checkpoint of torch.optim.Adam (one step count per tensor), or loaded onto the CPU
                    step = state["step"] = torch.zeros_like(p, dtype=torch.float32).add_(step.to(p.device))
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                step.add_(1)
                exp_avg.lerp_(p.grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                # bias corrections per element, in float64 (torch.optim.Adam computes its scalar ones in Python floats)
                t = step.double()
                step_size = (group["lr"] / (1 - beta1 ** t)).to(p.dtype)
                bias_correction2_sqrt = (1 - beta2 ** t).sqrt_().to(p.dtype)
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
                p.addcdiv_(exp_avg * step_size, denom, value=-1.0)
        return loss


def init_bound(layer: nn.Module, init: str, extra_fan_in: int = 0) -> float:
    """Uniform bound for fresh incoming weights, by initialisation scheme. `extra_fan_in`: inputs of the unit that
    come through other layers (HER's goal embedding summed into the fused layer)."""
    if isinstance(layer, nn.Conv2d):
        fan_in = layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
        fan_out = layer.out_channels * layer.kernel_size[0] * layer.kernel_size[1]
    else:
        fan_in, fan_out = layer.in_features, layer.out_features
    fan_in += extra_fan_in
    gain = math.sqrt(2.0)  # ReLU/Tanh networks here use sqrt(2) orthogonal init
    if init == "kaiming":
        return gain * math.sqrt(3.0 / fan_in)
    if init == "xavier":
        return gain * math.sqrt(6.0 / (fan_in + fan_out))
    if init == "lecun":
        return math.sqrt(3.0 / fan_in)
    return math.sqrt(1.0 / fan_in)  # "default": PyTorch's Linear/Conv bound


class UnitTracker(nn.Module):
    """CBP state and replacement for one hidden layer."""

    def __init__(self, name: str, in_layer: nn.Module, act: nn.Module, out_layers: Sequence[nn.Module],
                 replacement_rate: float, maturity_threshold: int, decay_rate: float, init: str, utility: str,
                 extra_in_layers: Sequence[nn.Linear] = ()):
        """`extra_in_layers`: Linear layers whose outputs are summed into `in_layer`'s before `act` (HER's goal
        embedding): their rows are incoming weights of the same units."""
        super().__init__()
        self.name = name
        # plain references, not submodules: the layers belong to the network (no duplicated state_dict entries)
        object.__setattr__(self, "in_layer", in_layer)
        object.__setattr__(self, "out_layers", list(out_layers))
        object.__setattr__(self, "extra_in_layers", list(extra_in_layers))
        self.rate, self.maturity, self.eta = replacement_rate, maturity_threshold, decay_rate
        self.init, self.utility_kind = init, utility
        n = in_layer.out_channels if isinstance(in_layer, nn.Conv2d) else in_layer.out_features
        self.n_units = n
        self.register_buffer("utility", torch.zeros(n))
        self.register_buffer("mean_act", torch.zeros(n))
        self.register_buffer("age", torch.zeros(n, dtype=torch.long))
        self.register_buffer("to_replace", torch.zeros((), dtype=torch.float64))
        self.register_buffer("replaced", torch.zeros((), dtype=torch.long))
        self._act_abs: Optional[torch.Tensor] = None
        self._act_mean: Optional[torch.Tensor] = None
        self._act_centred: Optional[torch.Tensor] = None
        self.capture = False
        act.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs, output: torch.Tensor) -> None:
        if not self.capture:
            return
        h = output.detach()
        dims = (0, 2, 3) if h.dim() == 4 else (0,)
        self._act_mean = h.mean(dim=dims)
        self._act_abs = h.abs().mean(dim=dims)
        if self.utility_kind == "mean_contribution":
            shape = (1, -1, 1, 1) if h.dim() == 4 else (1, -1)
            self._act_centred = (h - self._bias_corrected_mean().view(shape)).abs().mean(dim=dims)

    def _bias_corrected_mean(self) -> torch.Tensor:
        corr = 1.0 - self.eta ** self.age.clamp(min=1).double()
        return self.mean_act / corr.to(self.mean_act.dtype)

    def _out_weight_mass(self) -> torch.Tensor:
        """sum over outgoing weights of |w| per unit, over every outgoing layer."""
        total = torch.zeros(self.n_units, device=self.utility.device)
        for out in self.out_layers:
            w = effective_weight(out).detach().abs()
            if isinstance(out, nn.Conv2d):
                total += w.sum(dim=(0, 2, 3))
            elif isinstance(self.in_layer, nn.Conv2d):  # conv -> flatten -> linear: columns grouped per channel
                total += w.view(w.shape[0], self.n_units, -1).sum(dim=(0, 2))
            else:
                total += w.sum(dim=0)
        return total

    @torch.no_grad()
    def step(self, optimizer: Optional[torch.optim.Optimizer]) -> int:
        """Update utilities and ages after an optimizer update; replace units; return how many were replaced."""
        if self._act_abs is None:
            return 0
        act = self._act_centred if self.utility_kind == "mean_contribution" else self._act_abs
        contribution = act * self._out_weight_mass()
        self.utility.mul_(self.eta).add_(contribution, alpha=1 - self.eta)
        self.mean_act.mul_(self.eta).add_(self._act_mean, alpha=1 - self.eta)
        self.age += 1
        self._act_abs = self._act_mean = self._act_centred = None
        eligible = torch.nonzero(self.age > self.maturity).flatten()
        if len(eligible) == 0 or self.rate <= 0:
            return 0
        self.to_replace += self.rate * len(eligible)
        k = int(self.to_replace.item())
        if k == 0:
            return 0
        self.to_replace -= k
        corrected = self.utility[eligible] / (1.0 - self.eta ** self.age[eligible].double()).to(self.utility.dtype)
        units = eligible[torch.topk(-corrected, k).indices]
        self._replace(units, optimizer)
        self.replaced += k
        return k

    def _replace(self, units: torch.Tensor, optimizer: Optional[torch.optim.Optimizer]) -> None:
        mean = self._bias_corrected_mean()[units]
        for out in [leaf for o in self.out_layers for leaf in weight_leaves(o)]:
            w = out.weight
            if isinstance(out, nn.Conv2d):
                if out.bias is not None:
                    out.bias += (w[:, units] * mean.view(1, -1, 1, 1)).sum(dim=(1, 2, 3))
                w[:, units] = 0.0
                _reset_state(optimizer, w, (slice(None), units))
            elif isinstance(self.in_layer, nn.Conv2d):
                w3 = w.view(w.shape[0], self.n_units, -1)
                if out.bias is not None:
                    out.bias += (w3[:, units] * mean.view(1, -1, 1)).sum(dim=(1, 2))
                w3[:, units] = 0.0
                cols = (torch.arange(w3.shape[2], device=units.device) + units.view(-1, 1) * w3.shape[2]).flatten()
                _reset_state(optimizer, w, (slice(None), cols))
            else:
                if out.bias is not None:
                    out.bias += w[:, units] @ mean
                w[:, units] = 0.0
                _reset_state(optimizer, w, (slice(None), units))
        # one linear layer on the concatenated inputs: one bound over the unit's whole fan-in
        bound = init_bound(self.in_layer, self.init, sum(m.in_features for m in self.extra_in_layers))
        for layer in (self.in_layer, *self.extra_in_layers):
            w_in = layer.weight
            w_in[units] = torch.empty_like(w_in[units]).uniform_(-bound, bound)
            _reset_state(optimizer, w_in, (units,))
            if layer.bias is not None:
                layer.bias[units] = 0.0
                _reset_state(optimizer, layer.bias, (units,))
        self.utility[units] = 0.0
        self.mean_act[units] = 0.0
        self.age[units] = 0


def effective_weight(out: nn.Module) -> torch.Tensor:
    """An outgoing layer's weight; an injected head's (old + new - frozen, as it computes its output)."""
    if hasattr(out, "frozen"):  # injection.InjectedHead (not imported: injection.py imports nothing of CBP's)
        return effective_weight(out.old) + effective_weight(out.new) - effective_weight(out.frozen)
    return out.weight


def weight_leaves(out: nn.Module) -> list[nn.Module]:
    """The weight layers an outgoing module is made of: itself, or every layer of an injected head."""
    return [m for m in out.modules() if isinstance(m, (nn.Linear, nn.Conv2d))] if hasattr(out, "frozen") else [out]


def _reset_state(optimizer: Optional[torch.optim.Optimizer], param: torch.Tensor, index) -> None:
    """Zero the optimizer's moments of param[index], and its step counts where they are per element (AdamGnT;
    torch.optim.Adam's single step count cannot be reset for a part of a tensor)."""
    if optimizer is None:
        return
    state = optimizer.state.get(param)
    if not state:
        return
    for key in ("step", "exp_avg", "exp_avg_sq", "square_avg", "momentum_buffer"):
        if key in state and torch.is_tensor(state[key]) and state[key].shape == param.shape:
            state[key][index] = 0.0


class CBP(nn.Module):
    """All trackers of a network; `capture(True)` during the update's forward passes, `step(optimizer)` after each
    optimizer update."""

    def __init__(self, trackers: Sequence[UnitTracker]):
        super().__init__()
        self.trackers = nn.ModuleList(trackers)

    def capture(self, on: bool) -> None:
        for t in self.trackers:
            t.capture = on

    def step(self, optimizer: Optional[torch.optim.Optimizer]) -> dict[str, int]:
        return {t.name: t.step(optimizer) for t in self.trackers}

    def replaced(self) -> dict[str, int]:
        return {t.name: int(t.replaced) for t in self.trackers}
