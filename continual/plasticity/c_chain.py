"""C-CHAIN, Continual Churn Approximated Reduction (Tang, Obando-Ceron, Castro, Courville, Berseth, "Mitigating
Plasticity Loss in Continual Reinforcement Learning by Reducing Churn", ICML 2025; code bluecontra/C-CHAIN),
`--c_chain` on DQN and PPO.

Churn is how much one update changes the network's outputs on data outside its minibatch. C-CHAIN adds to the
agent's loss, at every update, a churn-reduction term on a reference batch drawn independently of the training
minibatch, against the network as it was before the previous update (theta_{k-1} while the update starts from
theta_k):

    loss = main + coef * churn,
    DQN:  churn = mean over batch x actions of (Q_theta_k(s_ref, a) - Q_theta_{k-1}(s_ref, a))^2
          (crl_minatar/agents/double_dqn_c_chain.py, `reg_loss = F.mse_loss(reg_q, frozen_q)`; s_ref: a second
          uniform batch of the replay buffer, of the training batch's size)
    PPO:  churn = mean over batch of -sum_a pi_theta_{k-1}(a|s_ref) log(pi_theta_k(a|s_ref) + 1e-8)
          (crl_procgen/agents/ppo.py, `train_with_churn_reduction`; s_ref: a minibatch of the rollout drawn by a
          permutation of its own, of the training minibatch's size; the policy only, not the value)

and sets coef automatically so that the churn term stays a fixed fraction (`--c_chain_target_rel_loss_scale`) of
the main loss:

    coef = target * mean |main|  /  (mean churn + 1e-8)   over the last `window` records, once `warmup` are in

A record is one update for DQN (main = the TD loss, the churn record of every update that had a reference; the
coefficient is recomputed after every update from update 10,000 on, over the last 50,000 records, starting from 50:
crl_minatar, lines 144-188) and one iteration for PPO (main = the mean policy loss of its minibatches, churn = the
mean of their churn terms, 0 for a minibatch without a reference; recomputed after each iteration from the 21st of
a task on, over the last 200 iterations of the task, never below 1, starting from 10; the coefficient and its
records restart at every task: crl_procgen/vis_train_procgen_c_chain.py, lines 146-191). The reference network is
the one before the previous update, so the first update has none (DQN); the ProcGen code adds the term from the
third minibatch of the run on (`len(his_policy_list) <= 2`), as here. `--c_chain_coef` replaces the starting
coefficient, and with `--c_chain_target_rel_loss_scale 0` it stays fixed.

Where the paper's code deep-copies the network after every update and keeps the last 10-20 copies, this keeps one
copy, overwritten with the weights just before each optimizer step (the same theta_{k-1}), and rolling windows whose
means are numpy means of the same values in the same order as the paper's `np.mean(list[-W:])` (bit-identical).
The state (the copy, the coefficient, the records) is in every checkpoint; a resumed run continues exactly.

Not ported: the DMC form for continuous actions (mean squared change of the Gaussian means, the coefficient times
the learning-rate annealing fraction); `--c_chain` on PPO with Box actions is refused.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from continual.training.extensions import Extension


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The automatic coefficient's constants in one form of the paper's code (see the module docstring)."""

    target: float  # target relative loss scale
    initial: float  # the coefficient before `warmup` records
    window: int  # records averaged
    warmup: int  # records (since the last restart) before the coefficient adapts
    floor: float = 0.0  # the coefficient's minimum once adapting
    restart_at_switch: bool = False  # coefficient and records restart at every task
    first_update: int = 1  # updates (since the run started) without a churn term


# crl_minatar/crl_run_double_dqn_c_chain.py (--target_rel_loss_scale 0.01) and agents/double_dqn_c_chain.py
DQN_SCHEDULE = Schedule(target=0.01, initial=50.0, window=50_000, warmup=10_000)
# crl_procgen/vis_train_procgen_c_chain.py (--target_p_rel_loss_scale 10000) and agents/ppo.py
PPO_SCHEDULE = Schedule(target=10_000.0, initial=10.0, window=200, warmup=21, floor=1.0, restart_at_switch=True,
                        first_update=2)


def schedule_for(preset: Schedule, target: Optional[float], coef: Optional[float]) -> Schedule:
    """`preset` with `--c_chain_target_rel_loss_scale` / `--c_chain_coef` where given."""
    out = preset if target is None else dataclasses.replace(preset, target=float(target))
    return out if coef is None else dataclasses.replace(out, initial=float(coef))


@dataclasses.dataclass(frozen=True)
class ChurnForm:
    """An agent's C-CHAIN, declared in its file: the schedule, the outputs whose churn is reduced and the churn term;
    `per_iteration`: PPO's form (a record per iteration; the reference minibatches a permutation of the batch drawn
    each epoch), else DQN's (a record per update; the reference batch `batch["reference_obs"]()`)."""

    schedule: Schedule
    outputs: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    churn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    per_iteration: bool = False
    refuse_box_actions: bool = False


def q_churn(q: torch.Tensor, q_ref: torch.Tensor) -> torch.Tensor:
    """DQN's churn term: the mean squared change of every Q-value, (B, A) against the reference network's (B, A)."""
    return F.mse_loss(q, q_ref)


def policy_churn(logits: torch.Tensor, logits_ref: torch.Tensor) -> torch.Tensor:
    """PPO's churn term: the cross-entropy of the current policy under the reference one,
    mean_b -sum_a pi_ref(a|s_b) log(pi(a|s_b) + 1e-8), from (B, A) logits (the ProcGen code's form, probabilities
    from a softmax)."""
    return (-torch.softmax(logits_ref, dim=-1) * torch.log(torch.softmax(logits, dim=-1) + 1e-8)).sum(-1).mean()


class _Window:
    """The last `size` values in order, readable as one contiguous array (each value is stored twice, `size` apart,
    so the window never wraps): np.mean of it is np.mean of the same list slice, summed in the same order."""

    def __init__(self, size: int):
        self.size = size
        self.buf = np.zeros(2 * size, np.float64)
        self.count = 0

    def append(self, value: float) -> None:
        i = self.count % self.size
        self.buf[i] = self.buf[i + self.size] = value
        self.count += 1

    def values(self) -> np.ndarray:
        if self.count <= self.size:
            return self.buf[:self.count]
        i = self.count % self.size
        return self.buf[i:i + self.size]

    def state_dict(self) -> dict:
        return {"buf": torch.from_numpy(self.buf.copy()), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.buf[:] = state["buf"].numpy()
        self.count = int(state["count"])


class AutoCoefficient:
    """coef = target * mean|main| / (mean churn + 1e-8) over the last `window` records once `warmup` records are in
    (since the last restart), never below `floor`; `initial` before (and always, with target 0)."""

    def __init__(self, schedule: Schedule):
        self.s = schedule
        self.restart()

    def restart(self) -> None:
        self.coef = self.s.initial
        self.main, self.churn = _Window(self.s.window), _Window(self.s.window)
        self.records = 0

    def record(self, main: float, churn: Optional[float]) -> None:
        """One record: the main loss and the churn term (None: the record had none, as the first DQN update)."""
        self.main.append(main)
        if churn is not None:
            self.churn.append(churn)
        self.records += 1
        if self.s.target > 0 and self.records >= self.s.warmup:
            running_main = np.mean(np.abs(self.main.values()))
            running_churn = np.mean(self.churn.values())
            # float(): the coefficient is a Python number wherever it goes (logs, checkpoints, a seed group's coefs)
            self.coef = float(max(self.s.target * running_main / (running_churn + 1e-8), self.s.floor))

    def state_dict(self) -> dict:
        return {"coef": self.coef, "records": self.records, "main": self.main.state_dict(),
                "churn": self.churn.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.records = float(state["coef"]), int(state["records"])
        self.main.load_state_dict(state["main"])
        self.churn.load_state_dict(state["churn"])


class CChain(Extension):
    """One agent's C-CHAIN: the reference network (the weights before the previous update), the churn term and the
    automatic coefficient. As the agent's extension:

        loss_terms     once it has a reference: coef * churn(net(s_ref), reference(s_ref))  (the form's churn)
        before_step    the reference for the next update: the weights now, before this step
        after_step     the record (main, churn): DQN every update; PPO `add` every minibatch,
        after_update   and `end_iteration` once
    """

    state_key = "c_chain"

    def __init__(self, agent: nn.Module, schedule: Schedule, form: Optional[ChurnForm] = None):
        self.agent, self.schedule, self.form = agent, schedule, form
        self._ref_inds: Optional[np.ndarray] = None  # PPO: this epoch's reference permutation
        self._record: Optional[tuple] = None  # this update's (main loss, churn)
        self.ref = copy.deepcopy(agent).requires_grad_(False)
        self.coefficient = AutoCoefficient(schedule)
        self.updates = 0  # optimizer steps seen
        self._main: list[float] = []  # this iteration's (PPO): main losses and churn terms of its minibatches
        self._churn: list[float] = []

    @property
    def coef(self) -> float:
        return self.coefficient.coef

    def has_reference(self) -> bool:
        return self.updates >= self.schedule.first_update

    @torch.no_grad()
    def reference(self, fn, *inputs) -> torch.Tensor:
        """`fn(reference network, *inputs)`: the reference network's outputs (no gradient)."""
        return fn(self.ref, *inputs)

    @torch.no_grad()
    def before_step(self) -> None:
        """Call after the backward pass, before optimizer.step(): the weights now are the next update's reference."""
        for r, p in zip(self.ref.parameters(), self.agent.parameters()):
            r.copy_(p)
        for r, b in zip(self.ref.buffers(), self.agent.buffers()):
            r.copy_(b)
        self.updates += 1

    def record(self, main: float, churn: Optional[float]) -> None:
        """DQN: after every update (churn None when it had no reference)."""
        self.coefficient.record(main, churn)

    def add(self, main: float, churn: Optional[float]) -> None:
        """PPO: after every minibatch update (churn None, counted as 0, when it had no reference)."""
        self._main.append(main)
        self._churn.append(0.0 if churn is None else churn)

    def end_iteration(self) -> None:
        """PPO: after the iteration's update, its record: the means of its minibatches."""
        if self._main:
            self.coefficient.record(float(np.mean(self._main)), float(np.mean(self._churn)))
        self._main, self._churn = [], []

    def on_switch(self) -> None:
        if self.schedule.restart_at_switch:
            self.coefficient.restart()

    # --- the extension's hooks (the form's loop) ---------------------------------------------------------------------
    def on_switch_end(self, event) -> None:
        self.on_switch()

    def loss_terms(self, agent, batch: dict) -> dict:
        """batch: "main_loss"; PPO: "batch" (the iteration's, its "obs" and "size"), "start" and "size" of the
        minibatch; DQN: "reference_obs" (draws a reference batch)."""
        form = self.form
        if form.per_iteration and batch["start"] == 0:  # a permutation of its own each epoch
            self._ref_inds = self.session.np_rng.permutation(batch["batch"]["size"])
        churn = None
        if self.has_reference():
            if form.per_iteration:
                full, start = batch["batch"]["obs"], batch["start"]
                ref_obs = full[torch.as_tensor(self._ref_inds[start:start + batch["size"]], device=full.device)]
            else:
                ref_obs = batch["reference_obs"]()
            churn = form.churn(form.outputs(agent, ref_obs), self.reference(form.outputs, ref_obs))
        self._record = (batch["main_loss"], churn)
        return {} if churn is None else {"c_chain": self.coef * churn}

    def after_step(self, optimizer) -> None:
        main, churn = self._record
        (self.add if self.form.per_iteration else self.record)(main.item(), None if churn is None else churn.item())

    def after_update(self, batch: dict) -> None:
        if self.form.per_iteration:
            self.end_iteration()

    def scalars(self) -> dict[str, float]:
        return self.log()

    def state_dict(self) -> dict:
        return {"ref": {k: v.detach().cpu() for k, v in self.ref.state_dict().items()}, "updates": self.updates,
                "coefficient": self.coefficient.state_dict()}

    def load_state_dict(self, state: Optional[dict]) -> None:
        if not state:
            return
        self.ref.load_state_dict(state["ref"])
        self.updates = int(state["updates"])
        self.coefficient.load_state_dict(state["coefficient"])

    def log(self) -> dict[str, float]:
        return {"plasticity/c_chain_coef": float(self.coef)}

