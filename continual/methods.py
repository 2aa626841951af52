"""Every continual component of a run, built in one call from the flags and the agent's form.

An agent declares once, in its file, how its network meets the continual methods (`AgentForm`: EWC's policy head and
batch loss, C-CHAIN's churn, whether it runs the plasticity methods), and calls `add_continual` once its model and
optimizer are built: it registers them with the session (their checkpoint states) and adds the run's extensions, in
this order (the order every hook is
called in, `continual.training.extensions`):

    HerExtension       --her (continual/her.py); agents whose form has HER (PPO's)
    first              the agent variant's own (PPO_CBP's units)
    PlasticityMonitor  diagnostics (continual/plasticity/diagnostics.py); every agent
    SwitchRemedies     --shrink_and_perturb, --reset_optimizer_on_switch (continual/plasticity/shrink_perturb.py)
    EWC                --ewc (continual/plasticity/ewc.py); agents with an EWC form
    PlasticityMethods  --redo, --l2, --l2_init, --parseval, --reset_layers, --nap, --plasticity_injection
                       (continual/plasticity/methods.py); agents whose form has them
    CChain             --c_chain (continual/plasticity/c_chain.py); agents with a churn form
    last               the learner variant's own (CLEAR's replay, Progress & Compress)
    ContinualEvaluator --eval_every, --eval_at_switches (continual/evaluation/continual.py); it evaluates step 0 of
                       a new run at once

A new method is one extension here and in its own module; no agent changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn

from continual.errors import UserError
from continual.evaluation.continual import attach as attach_evaluator
from continual.her import HerExtension
from continual.plasticity.c_chain import CChain, ChurnForm, schedule_for
from continual.plasticity.diagnostics import PlasticityMonitor
from continual.plasticity.ewc import EWC, BatchLoss, PolicyHead
from continual.plasticity.injection import load_injected
from continual.plasticity.methods import PlasticityMethods
from continual.plasticity.shrink_perturb import SwitchRemedies
from continual.training.extensions import Extension, Extensions


@dataclasses.dataclass(frozen=True)
class EWCForm:
    """EWC on an agent: the policy's head (the true Fisher), its summed pg + value loss for `--ewc_fisher cora`
    (`batch_loss(args)`) and the agent steps per row of the batches it observes (`row_steps(args)`)."""

    policy_head: PolicyHead
    batch_loss: Callable[[Any], BatchLoss]
    row_steps: Callable[[Any], int] = lambda args: 1


@dataclasses.dataclass(frozen=True)
class AgentForm:
    """How an agent meets the continual methods (declared once in its file, `CONTINUAL = AgentForm(...)`)."""

    ewc: Optional[EWCForm] = None
    """EWC's form; None: the agent has no EWC (its checkpoints no "ewc")"""
    plasticity: bool = False
    """it runs the plasticity methods (its checkpoints hold "plasticity_methods")"""
    c_chain: Optional[ChurnForm] = None
    """C-CHAIN's form; None: the agent has no C-CHAIN"""
    her: bool = False
    """it runs HER (its policy takes a `goal` input; `spaces[0]` is the envs' Dict observation space)"""


def add_continual(session, agent: nn.Module, optimizer: torch.optim.Optimizer, form: AgentForm,
                  make_agent: Callable[..., nn.Module], spaces: tuple, *, device: torch.device,
                  continuous: bool = False, followers: Optional[dict[str, nn.Module]] = None,
                  first: Sequence[Extension] = (), last: Sequence[Extension] = ()) -> Extensions:
    """Register the model, its `followers` and the optimizer with `session` (what every checkpoint holds; a resumed
    run loads each now), describe the policy, then add the run's continual extensions (module docstring); returns
    the session's `Extensions`, what the agent's loop calls. Each extension's state is loaded as it is added.
    `make_agent(*spaces, args)`: the agent file's builder, for newly initialised networks (ReDo, resets, shrink &
    perturb's fresh_init) and the background evaluation; `followers`: checkpoint name -> a network injected with the
    agent (DQN's target)."""
    args = session.args
    followers = followers or {}
    # --plasticity_injection: a checkpoint's injected heads (its followers' too) are rebuilt before its weights load
    load = (lambda state: load_injected(agent, state, optimizer, tuple(followers.values()))) if form.plasticity \
        else agent.load_state_dict
    session.register("model", agent.state_dict, load)
    for name, net in followers.items():
        session.register(name, net.state_dict, net.load_state_dict)
    session.register("optimizer", optimizer.state_dict, optimizer.load_state_dict)
    session.describe_policy(agent)

    def make_fresh() -> nn.Module:
        return make_agent(*spaces, args).to(device)

    if args.her and form.her:
        session.add_extension(HerExtension(args, spaces[0], device, session.np_rng))
    for e in first:
        session.add_extension(e)
    session.add_extension(PlasticityMonitor(session, agent))  # logs before every switch too
    if args.shrink_and_perturb or args.reset_optimizer_on_switch:
        session.add_extension(SwitchRemedies(agent, optimizer, make_fresh))
    if form.ewc is not None:
        if args.ewc == "none":
            session.register("ewc", lambda: None)
        else:
            session.add_extension(EWC(
                agent, form.ewc.policy_head, continuous, args.ewc, args.ewc_lambda, args.ewc_gamma,
                args.ewc_samples, args.seed, args.ewc_normalize, args.ewc_scale_by_tasks, args.ewc_omit_current,
                args.ewc_fisher, form.ewc.batch_loss(args), form.ewc.row_steps(args), args.ewc_fisher_batch,
                args.ewc_fisher_batches))
    if form.plasticity:
        session.add_extension(PlasticityMethods(session, agent, optimizer, make_fresh, tuple(followers.values())))
    if args.c_chain and form.c_chain is not None:
        if continuous and form.c_chain.refuse_box_actions:
            raise UserError(f"c_chain: {args.architecture}'s C-CHAIN is the paper's form for discrete actions (a "
                            f"cross-entropy between policies); its form for Box actions is not ported")
        session.add_extension(CChain(agent, schedule_for(form.c_chain.schedule, args.c_chain_target_rel_loss_scale,
                                                         args.c_chain_coef), form.c_chain))
    for e in last:
        session.add_extension(e)
    attach_evaluator(session, agent, device, make_agent)  # continual evaluation: step 0 now
    session.extensions.device = device
    return session.extensions
