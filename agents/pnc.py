"""Progress & Compress (P&C, Schwarz et al. 2018) on our IMPALA: a knowledge base (KB) column, an active column with
lateral adaptors from the KB, and per task a progress phase then a compress phase.

    python continual_training_example.py --config configs/minatar_3games_2cycles.json --architecture PNC \
        --num_actors 2 --batch_size 4 --unroll_length 20

Built as CORA builds it (research notes §2.4) on the learner, actors and checkpoints of `agents/impala.py`, which this
file plugs into through `impala.train(..., make_agent_fn=make_agent, make_extension=PNC)`:

- network (`PNCAgent`): two columns of the IMPALA/PPO network (`agents.networks.Agent`). Every Conv2d/Linear of the active
  column except its first layer (so both heads too) gets an adaptor fed by the KB's input to the same layer, added
  to the active layer's output (before its activation): conv -> `Conv2d` like the layer, ReLU, 1x1 conv; linear ->
  `Linear(in, out)`, ReLU, `Linear(out, out)` (CORA's adaptors; the paper's learned scalar gate is left out, as in
  CORA);
- a task is a regime visit of the curriculum (switch to switch). Its first `--pnc_progress_fraction` of updates is
  the progress phase: IMPALA's loss (V-trace policy gradient, value, entropy) on the active column; the KB runs
  under no_grad, so only the active column and its adaptors learn. The rest is the compress phase: the loss is
  `--pnc_kl_scale` x KL(pi_active || pi_KB) summed over the T x B observations of the batch (the active logits
  detached) plus the online-EWC penalty on the KB (`continual.plasticity.ewc.EWC` on the KB column, weight
  `--pnc_ewc_lambda`, Fisher decay `--ewc_gamma`, `--pnc_ewc_normalize`); the active column gets no gradient. The
  actors act with the active column in both phases (as CORA), so the compress phase distils on fresh on-policy
  observations of the current task instead of CORA's replay buffer;
- the phase split: CORA counts `num_train_steps_of_progress` learner steps from each task start (default 1000) and
  its shipped configs set it to half a task. Here the split is that share of each visit's length, read from the
  curriculum's schedule (`factory.schedule`), so the phase of an update is a pure function of the step: it needs no
  state to resume, and a short task still gets both phases (a fixed 1000 updates would leave short tasks without
  a compress phase, and their KB without the task);
- at every switch the KB's online Fisher is consolidated (EWC's `on_switch_start`, the per-sample true Fisher of
  the KB's policy; CORA's P&C takes the squared batch gradient, but with `full` normalisation, its default and
  ours, only the shape within each tensor differs) on the last `--ewc_samples` observations of the ending task (its compress phase, at the KB weights after compress; CORA estimates it on the
  new task's progress data by mistake, notes §7.3); then (`on_switch_end`) the active column and its adaptors are
  re-initialised (CORA: Conv/Linear reset at every task boundary, the KB untouched), from a generator seeded by
  (seed, switch count), and their RMSprop state is dropped (a fresh column starts with fresh statistics; CORA keeps
  the optimizer state);
- evaluation (continual evaluation, eval.py) plays the KB column (CORA's eval_on_kb default): it is the model P&C
  keeps across tasks; the active column is reset at every switch and only its current task's expert.

Checkpoints hold both columns and the adaptors (`model`), one RMSprop state, and the KB's EWC state (anchor, running
Fisher, observation buffer, the last consolidated switch) under `pnc`; the phase follows from the step.

Spec (continual/specs.py):
- its own defaults: --learning_rate 0.0006 --max_grad_norm 40.0
- supports: actors, needs_switches
(generated: python -m continual.specs --update-docs)
"""

from __future__ import annotations

import math
import os
import sys
from typing import Optional, Sequence

if __package__ in (None, ""):  # `python agents/pnc.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn as nn
import torch.nn.functional as F

from agents import impala, networks
from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.plasticity.ewc import EWC
from continual.training.extensions import Extension, SwitchEvent
from continual.training.startup import agent_main, granularity_of

# --------------------------------------------------------------------------------------------------------------------
# network: a knowledge-base column and an active column with lateral adaptors from it
# --------------------------------------------------------------------------------------------------------------------


def adaptor(layer: nn.Module) -> nn.Module:
    """CORA's lateral adaptor for `layer`, fed with the KB's input to the same layer, output shaped as `layer`'s."""
    if isinstance(layer, nn.Conv2d):
        return nn.Sequential(nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
                                       layer.padding), nn.ReLU(), nn.Conv2d(layer.out_channels, layer.out_channels, 1))
    return nn.Sequential(nn.Linear(layer.in_features, layer.out_features), nn.ReLU(),
                         nn.Linear(layer.out_features, layer.out_features))


class PNCAgent(nn.Module):
    """`kb` and `active` are two `agents.networks.Agent` columns; `adaptors[name]` feeds the KB's input of layer `name`
    (`network_<i>`, `actor`, `critic`) into the active layer of that name.

    `logits_and_values(x)` is the active column (what IMPALA's actors act with and its learner trains); `features`,
    `actor`, `critic`, `network`, `get_value` and `get_action_and_value` are the KB's (what evaluation plays)."""

    continuous, goal_dim, norm_obs = False, 0, False

    def __init__(self, obs_shape: Sequence[int], n_actions: int, obs_scale: float = 1.0):
        super().__init__()
        self.obs_shape, self.n_actions, self.obs_scale = tuple(obs_shape), n_actions, obs_scale
        self.kb = networks.Agent(obs_shape, n_actions, obs_scale=obs_scale)
        self.active = networks.Agent(obs_shape, n_actions, obs_scale=obs_scale)
        layers = [(f"network_{i}", m) for i, m in enumerate(self.active.network) if isinstance(m, (nn.Linear, nn.Conv2d))]
        layers += [("actor", self.active.actor), ("critic", self.active.critic)]
        self.adaptors = nn.ModuleDict({name: adaptor(m) for name, m in layers[1:]})  # not the first layer
        if networks.channels_last(self.obs_shape):
            self.adaptors.to(memory_format=torch.channels_last)  # as networks.Agent's convolutions

    # --- the KB column: evaluation's policy ------------------------------------------------------------------------
    @property
    def network(self) -> nn.Module:
        return self.kb.network

    @property
    def actor(self) -> nn.Module:
        return self.kb.actor

    @property
    def critic(self) -> nn.Module:
        return self.kb.critic

    def features(self, x: torch.Tensor, goal: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.kb.features(x, goal)

    def get_value(self, x: torch.Tensor, goal: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.kb.get_value(x, goal)

    def get_action_and_value(self, x: torch.Tensor, action: Optional[torch.Tensor] = None, greedy: bool = False,
                             goal: Optional[torch.Tensor] = None):
        return self.kb.get_action_and_value(x, action, greedy, goal)

    def kb_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.kb.actor(self.kb.features(x))

    # --- the active column: acting and the progress phase -----------------------------------------------------------
    def logits_and_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The active column's logits and values; the KB runs without gradient (frozen in the progress phase)."""
        x = self.kb.scaled_input(x)
        lateral = {}
        with torch.no_grad():
            h = x
            for i, m in enumerate(self.kb.network):
                lateral[f"network_{i}"] = h  # the KB's input to its layer i
                h = m(h)
            lateral["actor"] = lateral["critic"] = h
        h = x
        for i, m in enumerate(self.active.network):
            out = m(h)
            name = f"network_{i}"
            h = out + self.adaptors[name](lateral[name]) if name in self.adaptors else out
        logits = self.active.actor(h) + self.adaptors["actor"](lateral["actor"])
        value = self.active.critic(h) + self.adaptors["critic"](lateral["critic"])
        return logits, value.squeeze(-1)

    def active_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The active column and its adaptors (everything but the KB)."""
        return [(n, p) for n, p in self.named_parameters() if not n.startswith("kb.")]


def make_agent(obs_space, action_space, args: Args) -> PNCAgent:
    """`action_space`: the env's single action space or its number of actions (agents/networks.py's contract)."""
    n_actions, _ = networks.action_dims(action_space)  # Box actions are refused before (validate_action_space)
    return PNCAgent(obs_space.shape, n_actions, obs_scale=networks.obs_scale(obs_space, args))


def kl_active_kb(active_logits: torch.Tensor, kb_logits: torch.Tensor) -> torch.Tensor:
    """KL(pi_active || pi_KB) = sum_a p_active (log p_active - log p_KB), summed over the samples (leading dims)."""
    logp_active = F.log_softmax(active_logits, -1)
    return (logp_active.exp() * (logp_active - F.log_softmax(kb_logits, -1))).sum()


# --------------------------------------------------------------------------------------------------------------------
# phases, resets and the compress loss: the extension impala.train calls
# --------------------------------------------------------------------------------------------------------------------


class PNC(Extension):
    """`impala.train(..., make_extension=PNC)` builds it after the model and optimizer: the KB's online EWC is its
    own (consolidated at switches, checkpointed as "pnc"); `loss` replaces IMPALA's loss in the compress phase;
    `on_switch_end` resets the active column."""

    state_key, state_optional = "pnc", False

    def __init__(self, args: Args, session, agent: PNCAgent, optimizer: torch.optim.Optimizer, obs_space,
                 n_actions: int, device: torch.device):
        self.agent, self.optimizer, self.args = agent, optimizer, args
        self.steps_per_update = granularity_of(args)  # agent steps per learner update
        # (start, end) of every regime visit of the curriculum, at the learner's update grid
        self.visits = [(a, b) for a, b, _ in session.factory.iter_schedule(self.steps_per_update)]
        self.ewc = EWC(agent.kb, networks.policy_head, False, "online", args.pnc_ewc_lambda, args.ewc_gamma,
                       args.ewc_samples, args.seed, args.pnc_ewc_normalize)
        self.ewc.attach(session)
        self.log: dict[str, float] = {}

    def state_dict(self) -> dict:
        return {"ewc": self.ewc.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ewc.load_state_dict(state["ewc"])

    def on_switch_start(self, event: SwitchEvent) -> None:
        self.ewc.on_switch_start(event)  # the KB consolidated on the ending task

    def phase(self, step: int) -> str:
        """The phase ("progress" or "compress") of the update that starts at agent step `step` (a multiple of the update)."""
        start, end = next((a, b) for a, b in self.visits if a <= step < b)
        updates = -(-(end - start) // self.steps_per_update)
        progress = math.ceil(self.args.pnc_progress_fraction * updates)
        return "progress" if (step - start) // self.steps_per_update < progress else "compress"

    def loss(self, impala_loss: torch.Tensor, agent, batch: dict) -> torch.Tensor:
        """batch["obs"] [T, B, ...] and the active column's batch["logits"] [T, B, n] of this update; IMPALA's loss in
        the progress phase, kl_scale * KL(active || KB) + the KB's online-EWC penalty in the compress phase."""
        obs, logits = batch["obs"], batch["logits"]
        self.ewc.observe({"obs": obs, "obs_shape": self.agent.obs_shape})
        compress = self.phase(self.session.global_step) == "compress"
        flat = obs.reshape(-1, *obs.shape[2:])
        with torch.set_grad_enabled(compress):
            kl = kl_active_kb(logits.detach().reshape(-1, logits.shape[-1]), self.agent.kb_logits(flat))
            penalty = self.ewc.penalty()
        self.log = {"pnc/compress": float(compress), "losses/pnc_kl": kl.item() / len(flat),
                    "losses/pnc_ewc_penalty": penalty.item()}
        return self.args.pnc_kl_scale * kl + penalty if compress else impala_loss

    def scalars(self) -> dict[str, float]:
        return self.log

    @torch.no_grad()
    def on_switch_end(self, event: SwitchEvent) -> None:
        """A new task: a fresh active column (and adaptors) with no optimizer state; the KB is kept."""
        self.ewc.on_switch_end(event)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.args.seed * 1_000_003 + event.count)
            fresh = PNCAgent(self.agent.obs_shape, self.agent.n_actions, self.agent.obs_scale)
        fresh_params = dict(fresh.named_parameters())
        for name, p in self.agent.active_parameters():
            p.copy_(fresh_params[name])
            self.optimizer.state.pop(p, None)


def train(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None) -> str:
    return impala.train(args, curriculum, resume_state, make_agent_fn=make_agent, make_extension=PNC)


def main(argv: Optional[Sequence[str]] = None) -> str:
    return agent_main(train, "PNC", __doc__, argv)


if __name__ == "__main__":
    import modification_factories  # noqa: F401  (registers your factories, as continual_training_example.py does)

    main()
