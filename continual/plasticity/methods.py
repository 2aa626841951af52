"""The plasticity methods of a run, one extension per agent (`PlasticityMethods`, built by `continual.methods`):

    optimizer = plastic_optimizer(agent.make_optimizer(lr), args)   # --trac (where the optimizer is made)
    loss_terms                 every minibatch: L2, L2 Init, Parseval (regularizers.py)
    after_step                 after every optimizer step: NaP's projection (nap.py)
    after_update(batch)        once per iteration, after the update, with its observations (batch["obs"]):
                               ReDo (redo.py), layer resets (resets.py), injection, when due
    scalars                    in the iteration's scalars (units recycled)

Methods that act "at switches" (ReDo, layer resetting with their `--*_every 0`) are due at every regime switch of
the curriculum, never before the first regime: a layer reset happens when the envs run the new regime; ReDo at the
end of the first update of the new regime, on that regime's observations (the units dormant on the new task).
With `--*_every N` they act on the first update at or after each multiple of N steps. Plasticity injection
(injection.py) acts at switches as a layer reset does, or on the first update at or after each multiple of
`--injection_every` steps, or once on the first update at or after `--injection_step`; a resumed run rebuilds the
injected heads from the checkpoint's weights (`load_injected`, the agent's model loader). Network options (LayerNorm,
CReLU, Fourier features) change the network where it is built (networks.py), TRAC wraps the optimizer where it is
made (`plastic_optimizer`, trac.py); shrink & perturb and optimizer resets
stay in shrink_perturb.py, CBP in cbp.py.

Fresh weights (ReDo's re-initialised units, reset layers) come from a new network built by `make_fresh` under a
seed of (run seed, method, count), so a resumed run does exactly what the uninterrupted one did.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn

from continual.errors import UserError
from continual.plasticity import nap, regularizers
from continual.plasticity.injection import inject
from continual.plasticity.redo import hidden_layers, recycle, seeded_fresh
from continual.plasticity.resets import layer_groups, reset_last_layers
from continual.plasticity.trac import TRAC
from continual.training.extensions import Extension, SwitchEvent


class PlasticityMethods(Extension):
    """The run's plasticity methods (per its flags) for `agent` trained by `optimizer`; does nothing without them."""

    state_key = "plasticity_methods"

    def __init__(self, session, agent: nn.Module, optimizer: torch.optim.Optimizer,
                 make_fresh: Callable[[], nn.Module], followers: Sequence[nn.Module] = ()):
        self.session, self.args = session, session.args
        self.agent, self.optimizer, self.make_fresh = agent, optimizer, make_fresh
        self.followers = tuple(followers)  # networks injected with the agent (DQN's target network)
        a = self.args
        self.params = [p for p in agent.parameters() if p.requires_grad]
        self.init_params = [p.detach().clone() for p in self.params] if a.l2_init else []
        self.parseval_layers = [h.layer for h in hidden_layers(agent)] if a.parseval else []
        self.nap_modules = nap.projected_modules(agent, a.nap_project_heads) if a.nap else []
        self.nap_norms = [nap.norms(m) for m in self.nap_modules]
        if a.reset_layers > len(layer_groups(agent)):
            raise UserError(f"reset_layers: this network has {len(layer_groups(agent))} layers (heads included), "
                            f"got {a.reset_layers}")
        self.redo_count = self.reset_count = self.inject_count = 0
        self.redo_pending = False
        self._last_step = session.global_step
        self.log: dict[str, float] = {}  # what after_update did since the last take_log (the iteration's scalars)

    @property
    def active(self) -> bool:
        a = self.args
        return bool(a.redo or a.l2 or a.l2_init or a.parseval or a.reset_layers or a.nap
                    or a.plasticity_injection != "none")

    @property
    def injection_step(self) -> int:
        """--plasticity_injection step: the step of the one injection (0: half of the run, as Plasticine)."""
        return self.args.injection_step or self.session.total_timesteps // 2

    def penalty(self):
        """The regularisation terms of the loss (0.0 without any)."""
        a, total = self.args, 0.0
        if a.l2:
            total = total + a.l2_coef * regularizers.l2(self.params)
        if a.l2_init:
            total = total + a.l2_init_coef * regularizers.l2_to(self.params, self.init_params)
        if a.parseval:
            total = total + a.parseval_coef * regularizers.parseval(self.parseval_layers, a.parseval_scale)
        return total

    def loss_terms(self, agent, batch: dict) -> dict:
        penalty = self.penalty()
        return {} if isinstance(penalty, float) else {"plasticity": penalty}

    def after_step(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """After every optimizer step: NaP's projection."""
        if self.nap_modules:
            nap.project(self.nap_modules, self.nap_norms)

    def _due(self, every: int, step: int) -> bool:
        return bool(every) and step // every != self._last_step // every

    def on_switch_end(self, event: SwitchEvent) -> None:
        a = self.args
        if a.redo and not a.redo_every:
            self.redo_pending = True
        if a.reset_layers and not a.reset_every:
            self._reset()
        if a.plasticity_injection == "at_switches":
            self._inject()

    def _inject(self) -> None:
        self.inject_count += 1
        fresh = seeded_fresh(self.make_fresh, self.args.seed * 1_000_003 + 500_009 + self.inject_count)
        inject(self.agent, fresh, self.optimizer, self.followers)
        # the penalties act on the trainable parameters: the frozen heads leave them, the new head joins them (its
        # L2 Init anchor: its values at injection, i.e. the frozen copy)
        init = {id(p): q for p, q in zip(self.params, self.init_params)} if self.init_params else {}
        self.params = [p for p in self.agent.parameters() if p.requires_grad]
        if self.args.l2_init:
            self.init_params = [init[id(p)] if id(p) in init else p.detach().clone() for p in self.params]
        self.log["plasticity/injections"] = float(self.inject_count)

    def _reset(self) -> None:
        self.reset_count += 1
        fresh = seeded_fresh(self.make_fresh, self.args.seed * 1_000_003 + 2 * self.reset_count)
        reset_last_layers(self.agent, self.args.reset_layers, fresh, self.optimizer)

    def after_update(self, batch: dict) -> None:
        self.maintain(batch["obs"], batch.get("step"))

    @torch.no_grad()
    def maintain(self, obs: torch.Tensor, step: Optional[int] = None) -> None:
        """Once per iteration after the update; `obs`: its observations (steps, envs, ...) or (batch, ...); `step`:
        the run's step count once this update is counted (default: the session's, already counted)."""
        a = self.args
        step = self.session.global_step if step is None else step
        if a.redo and (self.redo_pending or self._due(a.redo_every, step)):
            self.redo_pending = False
            self.redo_count += 1
            fresh = seeded_fresh(self.make_fresh, a.seed * 1_000_003 + 2 * self.redo_count + 1)
            batch = obs.reshape((-1,) + tuple(self.agent.obs_shape))
            counts = recycle(self.agent, batch, a.redo_tau, fresh, self.optimizer)
            self.log["plasticity/redo_recycled"] = self.log.get("plasticity/redo_recycled", 0.0) + sum(counts.values())
        if a.reset_layers and self._due(a.reset_every, step):
            self._reset()
        if a.plasticity_injection == "every" and self._due(a.injection_every, step):
            self._inject()
        if a.plasticity_injection == "step" and not self.inject_count and step >= self.injection_step:
            self._inject()
        self._last_step = step

    def scalars(self) -> dict[str, float]:
        return self.take_log()

    def take_log(self) -> dict[str, float]:
        """Scalars of what acted since the last call (units recycled; TRAC's scale S), for the iteration's log."""
        out, self.log = self.log, {}
        if isinstance(self.optimizer, TRAC):
            out["plasticity/trac_scale"] = self.optimizer.scale
        return out

    def state_dict(self) -> dict:
        return {"init_params": [p.cpu() for p in self.init_params], "redo_count": self.redo_count,
                "reset_count": self.reset_count, "redo_pending": self.redo_pending, "nap_norms": self.nap_norms,
                "inject_count": self.inject_count}

    def load_state_dict(self, state: Optional[dict]) -> None:
        if not state:
            return
        if self.init_params and state["init_params"]:
            self.init_params = [p.to(q.device) for p, q in zip(state["init_params"], self.init_params)]
        self.redo_count, self.reset_count = state["redo_count"], state["reset_count"]
        self.redo_pending = state["redo_pending"]
        norms = state.get("nap_norms", self.nap_norms)
        if len(norms) != len(self.nap_norms):
            raise UserError(f"nap: the checkpoint holds {len(norms)} projected norms, this network "
                            f"{len(self.nap_norms)}")
        self.nap_norms = norms
        self.inject_count = state.get("inject_count", 0)


def plastic_optimizer(optimizer: torch.optim.Optimizer, args):
    """The agent's optimizer, wrapped by TRAC with --trac (call it on the fresh optimizer, before loading a
    checkpoint's state into it)."""
    return TRAC(optimizer, s_init=args.trac_s_init, keep_base=args.trac_keep_base) if args.trac else optimizer

