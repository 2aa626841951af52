"""The one way continual behaviour enters a run: an `Extension` overrides the hooks it needs; a run's extensions are
called in order by their composite, `Extensions` (`session.extensions`).

Two kinds of hooks, one class:

Run events (the session calls them; an agent file never does), in the form of Stable-Baselines3's callbacks:
  on_switch_start(event)  the curriculum asked for a new regime; the envs still run the old one
  on_switch_end(event)    the envs run the new regime
  on_iteration_end()      an iteration has been logged; checkpoints requested here are written right after
  on_iteration_saved()    those checkpoints are written (the plasticity monitor's periodic log)
  on_checkpoint(path, name)  a checkpoint was written
  on_training_end()       the last iteration is done (or a signal stopped the run), before the final checkpoint
  on_close()              the run ends, whatever the reason (release processes and files here)

Loop hooks (the agent's loop calls the composite, `ext.<hook>(...)`; Plasticine's explicit style):
  rollout (PPO's, for HER; the loop calls them through `agent_inputs` and `env_step`, the composite's):
    observations(obs)     what the envs returned (reset, switch, step) -> the stored observation
    policy_inputs()       extra keyword arguments of the policy's forward pass
    rewards(step, ...)    the rewards of rollout step `step` (called before that step's next observations)
    final_observations(step, cut, infos)  what the time-limited episodes ended on (their bootstrap)
  observe(batch)          once per iteration, the data the update trains on ("obs": the iteration's observations)
  extend_batch(agent, batch, rollout)  may add samples (HER's relabelled ones, CLEAR's replayed unrolls)
  before_update()         before the iteration's update (CBP: capture activations); PPO calls these three through
                          `update_batch`
  minibatch(batch, inds)  a minibatch's observations, policy inputs and the mean its per-sample losses take
                          (torch.mean; HER weights its relabelled samples)
  loss(loss, agent, batch)  the loss to minimise: by default the loss plus `loss_terms(agent, batch)`, added in
                          order (EWC's penalty, L2/Parseval, C-CHAIN's churn, CLEAR's cloning); P&C replaces it
  before_step()           after the backward pass, before gradient clipping and the optimizer step
  after_step(optimizer)   after every optimizer step (NaP's projection, CBP's unit replacement)
  after_update(batch)     after the iteration's update (ReDo, layer resets, CLEAR's buffer insert)
  scalars()               joins the iteration's log (`RunSession.end_iteration` asks for them)

State: `state_key` names what `state_dict()` is saved under in every checkpoint (`continual.methods` registers it;
a resumed run loads it there).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

Reduction = Callable[[torch.Tensor], torch.Tensor]  # per-sample losses -> the loss


@dataclasses.dataclass
class SwitchEvent:
    old: str
    new: str
    global_step: int
    count: int  # switches so far, this one included


class Extension:
    """Base class: override the hooks you need (each does nothing here)."""

    session: Any = None  # the continual.training.session.RunSession that added it (`attach`)
    state_key: Optional[str] = None  # checkpoint key of `state_dict()` (None: nothing saved)
    state_optional: bool = True  # a checkpoint may lack it (older checkpoints, a feature that was off)

    def attach(self, session: Any) -> None:
        self.session = session

    # --- run events ----------------------------------------------------------------------------------------------
    def on_switch_start(self, event: SwitchEvent) -> None:
        pass

    def on_switch_end(self, event: SwitchEvent) -> None:
        pass

    def on_iteration_end(self) -> None:
        pass

    def on_iteration_saved(self) -> None:
        pass

    def on_checkpoint(self, path: str, name: str) -> None:
        pass

    def on_training_end(self) -> None:
        pass

    def on_close(self) -> None:
        pass

    # --- rollout -------------------------------------------------------------------------------------------------
    def observations(self, obs):
        """What the envs returned (reset, switch, step) -> the stored observation (HER takes the goal out)."""
        return obs

    def policy_inputs(self) -> dict:
        """Extra keyword arguments of the policy's forward pass (HER: the goal)."""
        return {}

    def rewards(self, step: int, scaled: np.ndarray, next_obs, terminations, truncations, infos) -> np.ndarray:
        """The rewards of rollout step `step` (the envs' `next_obs` are not yet through `observations`)."""
        return scaled

    def final_observations(self, step: int, cut: np.ndarray, infos: dict) -> Optional[tuple[torch.Tensor, dict]]:
        """The observations (and policy inputs) the time-limited episodes `cut` ended on; None: the envs' own."""
        return None

    # --- update --------------------------------------------------------------------------------------------------
    def observe(self, batch: dict) -> None:
        pass

    def extend_batch(self, agent: Any, batch: dict, rollout: dict) -> dict:
        return batch

    def before_update(self) -> None:
        pass

    def minibatch(self, batch: dict, mb_inds: torch.Tensor) -> Optional[tuple[torch.Tensor, dict, Reduction]]:
        """(observations, policy inputs, the mean of its per-sample policy and value losses) of a minibatch; None:
        the batch's own observations, no extra inputs, `torch.mean`."""
        return None

    def loss_terms(self, agent: Any, batch: dict) -> dict[str, Any]:
        return {}

    def loss(self, loss: torch.Tensor, agent: Any, batch: dict) -> torch.Tensor:
        for term in self.loss_terms(agent, batch).values():
            loss = loss + term
        return loss

    def before_step(self) -> None:
        pass

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def after_update(self, batch: dict) -> None:
        pass

    def scalars(self) -> dict[str, float]:
        return {}

    # --- state ---------------------------------------------------------------------------------------------------
    def state_dict(self) -> Any:
        return None

    def load_state_dict(self, state: Any) -> None:
        pass


class Extensions(Extension):
    """A run's extensions, each hook called on every one in order; where a hook answers (final observations,
    minibatch) the last answer wins, and without one the plain answer is used."""

    def __init__(self, extensions: Sequence[Extension] = (), device: Optional[torch.device] = None):
        self.extensions, self.device = list(extensions), device

    def add(self, extension: Extension, before: Optional[Extension] = None) -> Extension:
        at = self.extensions.index(before) if before in self.extensions else len(self.extensions)
        self.extensions.insert(at, extension)
        return extension

    def __iter__(self):
        return iter(self.extensions)

    def on_switch_start(self, event):
        for e in self.extensions:
            e.on_switch_start(event)

    def on_switch_end(self, event):
        for e in self.extensions:
            e.on_switch_end(event)

    def on_iteration_end(self):
        for e in self.extensions:
            e.on_iteration_end()

    def on_iteration_saved(self):
        for e in self.extensions:
            e.on_iteration_saved()

    def on_checkpoint(self, path, name):
        for e in self.extensions:
            e.on_checkpoint(path, name)

    def on_training_end(self):
        for e in self.extensions:
            e.on_training_end()

    def on_close(self):
        for e in self.extensions:
            e.on_close()

    def observations(self, obs):
        for e in self.extensions:
            obs = e.observations(obs)
        return obs

    def policy_inputs(self) -> dict:
        out: dict = {}
        for e in self.extensions:
            out.update(e.policy_inputs())
        return out

    def rewards(self, step, scaled, next_obs, terminations, truncations, infos):
        for e in self.extensions:
            scaled = e.rewards(step, scaled, next_obs, terminations, truncations, infos)
        return scaled

    def final_observations(self, step, cut, infos):
        answer = None
        for e in self.extensions:
            answer = e.final_observations(step, cut, infos) or answer
        return answer or (torch.as_tensor(np.stack([infos["final_obs"][i] for i in cut]), device=self.device), {})

    def observe(self, batch):
        for e in self.extensions:
            e.observe(batch)

    def extend_batch(self, agent, batch, rollout):
        for e in self.extensions:
            batch = e.extend_batch(agent, batch, rollout)
        return batch

    def before_update(self):
        for e in self.extensions:
            e.before_update()

    def minibatch(self, batch, mb_inds):
        answer = None
        for e in self.extensions:
            answer = e.minibatch(batch, mb_inds) or answer
        return answer or (batch["obs"].index_select(0, mb_inds), {}, torch.mean)  # faster than indexing on CPU

    def loss(self, loss, agent, batch):
        for e in self.extensions:
            loss = e.loss(loss, agent, batch)
        return loss

    def before_step(self):
        for e in self.extensions:
            e.before_step()

    def after_step(self, optimizer):
        for e in self.extensions:
            e.after_step(optimizer)

    def after_update(self, batch):
        for e in self.extensions:
            e.after_update(batch)

    def scalars(self) -> dict[str, float]:
        out: dict = {}
        for e in self.extensions:
            out.update(e.scalars())
        return out

    # --- the points where PPO's rollout and update meet the hooks above ---------------------------------------------
    def agent_inputs(self, obs) -> tuple[torch.Tensor, dict]:
        """Where the envs' observations enter the agent (reset, switch, step): the stored observation (a tensor on
        the run's device) and the policy's extra inputs."""
        return torch.as_tensor(self.observations(obs), device=self.device), self.policy_inputs()

    def env_step(self, step, next_obs, scaled, terminations, truncations, infos
                 ) -> tuple[torch.Tensor, dict, Any, np.ndarray, Optional[tuple[torch.Tensor, dict]]]:
        """After the envs' step at rollout step `step`: the next observation and its policy inputs
        (`agent_inputs`), the rewards to train on, the envs whose episode hit its time limit (`cut`, truncated and
        not terminated) and, where there are any, what those episodes ended on (`final_observations`: their
        observations and policy inputs, for the bootstrap; None when `cut` is empty)."""
        scaled = self.rewards(step, scaled, next_obs, terminations, truncations, infos)
        obs, inputs = self.agent_inputs(next_obs)
        cut = np.flatnonzero(truncations & ~terminations)
        return obs, inputs, scaled, cut, self.final_observations(step, cut, infos) if len(cut) else None

    def update_batch(self, agent, batch: dict, rollout: dict, observed: dict) -> dict:
        """The iteration's data, before its update: `observed` to every extension, then the batch as they extend
        it, then `before_update`."""
        self.observe(observed)
        batch = self.extend_batch(agent, batch, rollout)
        self.before_update()
        return batch
