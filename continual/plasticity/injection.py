"""Plasticity injection (Nikishin et al. 2023, "Deep reinforcement learning with plasticity injection"; Plasticine's
`plasticine_plasticity_injection`).

The network is an encoder phi (the agent's torso, `agent.network`) and a head h_theta on top of it (the output
layers the torso feeds: PPO's actor and critic, DQN's Q head). At an injection the head's parameters theta are
frozen and two copies of a freshly initialised head theta' are added, one trainable and one frozen (theta'^-):

    output(x) = h_theta(phi(x)) + h_theta'(phi(x)) - h_theta'^-(phi(x)),        theta'^- = theta' at injection

so the output is unchanged at the injection (to float rounding) and the trainable head is new. As in the paper the
encoder keeps learning, and it gets the gradient of all three terms (the frozen heads' parameters take no gradient,
their inputs do: at injection the new and frozen copies' input gradients cancel). A second injection freezes the
whole injected head and wraps it again (`old` is then itself an `InjectedHead`).

Choices (the table in docs/plasticity.md says them in short):
- the head is the output layers (one Linear per head), as Plasticine injects; the paper's Atari DQN treats the
  convolutions as the encoder and its fully connected layers as the head (the public reproduction
  timoklein/plasticity-injection-torch injects the 512-unit layer and the output layer). Our torsos end in their
  hidden layer, which stays in the (learning) encoder;
- the fresh head is the network's own initialisation (a newly built agent's heads, seeded by the run's seed and the
  injection count, so a resumed run injects identically); Plasticine uses nn.Linear's default initialisation;
- the new parameters join the optimizer's first parameter group (so learning-rate annealing reaches them) with no
  optimizer state; the frozen parameters stay in the optimizer without gradients, so their Adam moments stay as
  they were and are not used. Plasticine never adds the new head to the optimizer and never freezes the old head
  (its PPO and C51 scripts build the optimizer once, before the injection, and never add a parameter group): its
  new head never moves and the old head goes on learning, so its injection changes only the compute;
- DQN's target network is injected with the same fresh head, so targets are unchanged too (as the paper and the
  reproduction do), and the soft/hard target update pairs the same parameters;
- IMPALA's (and CLEAR's) actors act with a network in shared memory built before any injection: they get the
  injected heads folded into one layer each (`folded_state_dict`: W_old + W_new - W_frozen), the same function to
  float rounding; V-trace corrects for the actors' policy lag anyway. The learner trains the injected structure.

Checkpoints hold the injected structure: its module names (`actor.old.weight`, `actor.new.weight`,
`actor.frozen.weight`, one more `old.` per earlier injection) tell `restore_injection` how many injections to
rebuild before the weights are loaded (training resume, continual evaluation, eval.py).
"""

from __future__ import annotations

import copy
import re
from typing import Iterable, Optional

import torch
import torch.nn as nn

from continual.plasticity.networks import HEADS


class InjectedHead(nn.Module):
    """old(z) + new(z) - frozen(z): `old` and `frozen` have no trainable parameters."""

    def __init__(self, old: nn.Module, new: nn.Module, frozen: nn.Module):
        super().__init__()
        self.old, self.new, self.frozen = old, new, frozen

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.old(z) + self.new(z) - self.frozen(z)


def head_names(agent: nn.Module) -> list[str]:
    """The agent's heads (the layers its torso feeds), plain or injected."""
    return [h for h in HEADS if isinstance(getattr(agent, h, None), (nn.Linear, InjectedHead))]


def head_linears(agent: nn.Module) -> list[nn.Linear]:
    """Every Linear layer that reads the torso's output: the heads, or all the layers of the injected heads."""
    out = []
    for h in head_names(agent):
        out += [m for m in getattr(agent, h).modules() if isinstance(m, nn.Linear)]
    return out


def injection_count(agent: nn.Module) -> int:
    """How many injections `agent`'s heads have had (0: plain heads)."""
    n, head = 0, getattr(agent, head_names(agent)[0]) if head_names(agent) else None
    while isinstance(head, InjectedHead):
        n, head = n + 1, head.old
    return n


def _innermost(head: nn.Module) -> nn.Module:
    while isinstance(head, InjectedHead):
        head = head.old
    return head


def _freeze(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        p.requires_grad_(False)
    return module


@torch.no_grad()
def inject(agent: nn.Module, fresh: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
           followers: Iterable[nn.Module] = ()) -> list[nn.Parameter]:
    """Inject plasticity into `agent`'s heads: freeze them and add `fresh`'s heads (a newly initialised agent of the
    same architecture) as the trainable head and its frozen copy. The new parameters join `optimizer`'s first
    parameter group; `followers` (DQN's target network) get the same fresh heads. Returns the new parameters."""
    names = head_names(agent)
    if not names:
        raise ValueError("plasticity injection: this network has no head to inject into")
    device = next(agent.parameters()).device
    new_params: list[nn.Parameter] = []
    for model in (agent, *followers):
        for h in names:
            fresh_head = _innermost(getattr(fresh, h))
            new = copy.deepcopy(fresh_head).to(device).requires_grad_(True)
            frozen = _freeze(copy.deepcopy(fresh_head).to(device))
            old = getattr(model, h)
            setattr(model, h, InjectedHead(_freeze(old), new, frozen))
            for m in model.modules():  # PPO_CBP's unit tracker of the last hidden layer reads the heads it feeds
                outs = getattr(m, "out_layers", None)
                if isinstance(outs, list):
                    outs[:] = [getattr(model, h) if o is old else o for o in outs]
            if model is agent:
                new_params += list(new.parameters())
    if optimizer is not None:
        optimizer.param_groups[0]["params"].extend(new_params)
    return new_params


@torch.no_grad()
def _folded(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(head, InjectedHead):
        (w_old, b_old), (w_new, b_new), (w_frz, b_frz) = _folded(head.old), _folded(head.new), _folded(head.frozen)
        return w_old + w_new - w_frz, b_old + b_new - b_frz
    return head.weight, head.bias


@torch.no_grad()
def folded_state_dict(agent: nn.Module) -> dict:
    """`agent.state_dict()` in the structure the network was built with: each injected head folded into one layer,
    W = W_old + W_new - W_frozen (and the biases alike). Its outputs are the injected head's to float rounding (the
    sum is taken over the weights instead of the outputs). For IMPALA's actors, whose shared-memory network keeps
    the built structure."""
    state = agent.state_dict()
    injected = [h for h in head_names(agent) if isinstance(getattr(agent, h), InjectedHead)]
    if not injected:
        return state
    out = {k: v for k, v in state.items() if k.split(".", 1)[0] not in injected}
    for h in injected:
        out[f"{h}.weight"], out[f"{h}.bias"] = _folded(getattr(agent, h))
    return out


def saved_injections(state_dict: dict, prefix: str = "") -> int:
    """How many injections a saved model (`agent.state_dict()`) had: one `new.weight` per injection per head."""
    pattern = re.compile(re.escape(prefix) + r"(%s)\.(old\.)*new\.weight$" % "|".join(HEADS))
    per_head: dict[str, int] = {}
    for k in state_dict:
        m = pattern.match(k)
        if m:
            per_head[m.group(1)] = per_head.get(m.group(1), 0) + 1
    return max(per_head.values(), default=0)


def restore_injection(agent: nn.Module, state_dict: dict, optimizer: Optional[torch.optim.Optimizer] = None,
                      followers: Iterable[nn.Module] = ()) -> int:
    """Rebuild in `agent` (and `followers`) the injected structure that `state_dict` was saved with, so that it loads;
    the new trainable parameters join `optimizer` in the order the run added them, so its saved state loads too.
    The values are placeholders until `load_state_dict`. Call on a freshly built agent; returns the count."""
    n = saved_injections(state_dict) - injection_count(agent)
    for _ in range(n):
        inject(agent, agent, optimizer, followers)  # shapes only: load_state_dict overwrites every value
    return max(n, 0)


def load_injected(agent: nn.Module, state_dict: dict, optimizer: Optional[torch.optim.Optimizer] = None,
                  followers: Iterable[nn.Module] = ()) -> None:
    """`agent.load_state_dict(state_dict)` once the injected structure it was saved with is rebuilt
    (`restore_injection`): what an agent registers as its model's loader (`session.register("model", ...)`)."""
    restore_injection(agent, state_dict, optimizer, followers)
    agent.load_state_dict(state_dict)
