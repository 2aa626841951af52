"""Elastic weight consolidation at regime switches: EWC (Kirkpatrick et al. 2017) and online EWC (Schwarz et al. 2018,
the consolidation phase of Progress & Compress), for every architecture (`--ewc {none,ewc,online}`).

Home: plasticity/ holds the switch-time callbacks that change what the learner optimises (shrink & perturb, CBP);
EWC is one more such callback, so it lives next to them rather than in a one-module package.

At every switch (`on_switch_start`, the envs still run the ending regime) the diagonal Fisher is estimated at the
current parameters theta* from the last `--ewc_samples` agent steps the learner trained on in that regime (a ring
buffer), in one of two forms (`--ewc_fisher`):

  cora (default): CORA's estimator (continual_rl, policies/ewc/ewc_monobeast.py, `checkpoint_task`):
      F_i = 1/M sum_m (d/dtheta_i L_m)^2,   L_m = the agent's policy-gradient + value loss (no entropy) summed over
      a batch of `--ewc_fisher_batch` stored samples (drawn with replacement), M = `--ewc_fisher_batches`
  i.e. the squared gradient of a batch loss, value head included. The agent supplies L (`batch_loss`) and what it
  needs (`observe(..., batch=...)`): IMPALA its V-trace losses on stored unrolls (behaviour logits, rewards, dones;
  the batch is whole unrolls, `--ewc_fisher_batch` / T of them), PPO -sum A log pi(a|s) + vf_coef/2 sum (R - V)^2
  with the rollout's GAE advantages and returns (the gradient of its clipped surrogate at ratio 1, summed, not
  averaged). With CORA's counts (400 samples, 100 batches) `--ewc_lambda` means what it means in CORA's configs
  (for IMPALA, whose losses are sums as CORA's).
  true: the Monte-Carlo true Fisher of the policy alone,
      F_i = 1/N sum_n (d/dtheta_i log pi(a_n | s_n))^2,    a_n ~ pi(. | s_n) drawn afresh at theta*
  (one action per stored observation, one backward pass each; the value head gets F = 0). Its
  scale is per sample: on six trained MinAtar IMPALA networks CORA's Fisher is 400-1,100 times the true one on the
  policy head and 5,000-24,000 times on the shared torso (ratios of per-tensor means; docs/results/forgetting.md, "EWC's two
  Fisher scales"), so a lambda for `true` must be that much larger than CORA's for the same strength.

Random draws (actions for `true`, batch indices for `cora`) come from a generator seeded by (seed, switch count): the
global RNG is untouched and a resumed run draws the same.

Penalties (added to the loss of every update; lambda = `--ewc_lambda`):
  ewc:     one anchor (theta*_k, F_k) per regime k that has ended (a regime that ends again replaces its own anchor,
           as CORA keys anchors by task id), penalty  lambda/2 * (1/K) * sum_k sum_i F_k,i (theta_i - theta*_k,i)^2
           (1/K, K = anchors in force: `--ewc_scale_by_tasks`, on by default as CORA's scale_ewc_by_num_tasks)
  online:  one running Fisher F <- gamma * F + F_new (gamma = `--ewc_gamma`) and one anchor, the latest theta*,
           penalty  lambda/2 * sum_i F_i (theta_i - theta*_i)^2
`--ewc_normalize full` divides each Fisher tensor by its L2 norm after the online sum, as CORA (so every tensor of the
running Fisher has norm 1 and its scale no longer depends on the estimator; CORA's "row" option has a bug, research
notes §7.4, and is not offered); `--ewc_omit_current` leaves out the current regime's own anchor (from an earlier
visit).

Scale: IMPALA's losses are sums over the T x B batch (as CORA's); PPO's are minibatch means, so the same lambda weighs
the penalty about minibatch-size times more against PPO's task loss.

Cost: the penalty is a few elementwise ops over the parameters per update. `cora`: M backward passes of a batch loss
once per switch (100 x 400 samples). `true`: one backward pass per stored observation once per switch (one CPU
thread: 23 ms per observation for the Nature CNN, ~24 s at N = 1024; 0.6 ms for MinAtar's CNN; far less on a GPU).

Differences from CORA (research notes §2.3): no `ewc_per_task_min_frames` gating (the penalty applies from the first
switch on); anchors keyed by the regime's modification string; the Fisher's batches are drawn from the last
`--ewc_samples` steps of the regime, not a 1e6-frame per-task replay buffer; the buffer is cleared at every switch, so
with IMPALA the unrolls of the old regime still queued after a switch (at most `num_buffers`) count towards the next
regime's Fisher.

Checkpoints (`state_dict`) hold the anchors, the Fisher(s), the observation buffer and the last consolidated switch,
so resuming a switch checkpoint does not consolidate twice. Size: ewc adds 2 x the parameters per distinct ended regime
(theta* and F), online 2 x the parameters once; the buffer adds `--ewc_samples` steps (Atari 4x84x84 uint8: 28 KB
each, 29 MB at the default 1024; IMPALA's unrolls also hold their bootstrap observation, T+1 per T steps).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn as nn

from continual.training.extensions import Extension, SwitchEvent

# policy_head(model, obs) -> logits [B, n] (discrete) or (mean [B, d], log_std [B, d]) (continuous)
PolicyHead = Callable[[nn.Module, torch.Tensor], object]
# batch_loss(model, batch) -> the agent's policy-gradient + value loss summed over the batch (rows of `observe`'s batch)
BatchLoss = Callable[[nn.Module, dict], torch.Tensor]

CHUNK = 256  # observations whose actions are drawn in one call


def log_likelihood(head, action: torch.Tensor, continuous: bool) -> torch.Tensor:
    """log pi(a|s) per sample from the policy head's output."""
    if continuous:
        mean, log_std = head
        z = (action - mean) / log_std.exp()
        return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    return torch.log_softmax(head, -1).gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def sample_actions(head, continuous: bool, generator: torch.Generator) -> torch.Tensor:
    if continuous:
        mean, log_std = head
        eps = torch.randn(mean.shape, generator=generator, dtype=mean.dtype).to(mean.device)
        return mean + log_std.exp() * eps
    probs = torch.softmax(head.double(), -1).cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(head.device)


def diagonal_fisher(model: nn.Module, policy_head: PolicyHead, obs: torch.Tensor, continuous: bool,
                    generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The mean over `obs` of the squared per-sample gradients of log pi(a|s), a ~ pi(.|s) (see the module doc).
    One backward pass per observation (torch.func.vmap cannot run the agents' channels-last pixel input)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    sums = {n: torch.zeros(p.shape, dtype=torch.float64, device=p.device) for n, p in params.items()}
    device = next(iter(params.values())).device
    for start in range(0, len(obs), CHUNK):
        x = obs[start:start + CHUNK].to(device)
        with torch.no_grad():
            actions = sample_actions(policy_head(model, x), continuous, generator)
        for i in range(len(x)):
            logp = log_likelihood(policy_head(model, x[i:i + 1]), actions[i:i + 1], continuous).sum()
            for n, g in zip(params, torch.autograd.grad(logp, list(params.values()), allow_unused=True)):
                if g is not None:
                    sums[n] += g.double().pow(2)
    return {n: (s / len(obs)).to(params[n].dtype) for n, s in sums.items()}


def batch_fisher(model: nn.Module, batch_loss: BatchLoss, rows: dict[str, torch.Tensor], per_batch: int,
                 batches: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """CORA's Fisher: the mean over `batches` batches of the squared gradient of `batch_loss` on `per_batch` rows
    drawn uniformly with replacement from `rows` (a dict of tensors with one leading row dimension)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    n_rows = len(next(iter(rows.values())))
    sums = {n: torch.zeros(p.shape, dtype=torch.float64, device=p.device) for n, p in params.items()}
    for _ in range(batches):
        idx = torch.randint(n_rows, (per_batch,), generator=generator)
        batch = {k: v[idx.to(v.device)] for k, v in rows.items()}
        grads = torch.autograd.grad(batch_loss(model, batch), list(params.values()), allow_unused=True)
        for n, g in zip(params, grads):
            if g is not None:
                sums[n] += g.double().pow(2)
    return {n: (s / batches).to(params[n].dtype) for n, s in sums.items()}


def ewc_penalty(model: nn.Module, anchors: list[tuple[dict, dict]], lam: float, scale_by_count: bool = False
                ) -> torch.Tensor:
    """lambda/2 * sum_k sum_i F_k,i (theta_i - theta*_k,i)^2 over `anchors` [(theta*_k, F_k)], divided by K with
    `scale_by_count`; differentiable in the model's parameters; a zero tensor without anchors."""
    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    total = torch.zeros((), device=device)
    for theta_star, fisher in anchors:
        for n, f in fisher.items():
            total = total + (f * (params[n] - theta_star[n]) ** 2).sum()
    if scale_by_count and anchors:
        total = total / len(anchors)
    return 0.5 * lam * total


class EWC(Extension):
    """`--ewc ewc|online`: consolidates at every switch; `penalty()` is the term it adds to the loss (`loss_terms`),
    and `observe({"obs", "obs_shape", "rows"})` feeds the buffer of recent training data (every batch the learner
    trains on; "rows": what the agent's batch_loss takes, for fisher="cora"). fisher="cora" needs the agent's `batch_loss` and `row_steps` (agent steps per row of its batch: 1 for
    per-step rows, T for unrolls); fisher="true" needs only the observations."""

    def __init__(self, model: nn.Module, policy_head: PolicyHead, continuous: bool, mode: str, lam: float,
                 gamma: float, samples: int, seed: int, normalize: str = "none", scale_by_tasks: bool = False,
                 omit_current: bool = False, fisher: str = "true", batch_loss: Optional[BatchLoss] = None,
                 row_steps: int = 1, fisher_batch: int = 400, fisher_batches: int = 100):
        if mode not in ("ewc", "online"):
            raise ValueError(f"ewc mode must be 'ewc' or 'online', got {mode!r}")
        if fisher not in ("cora", "true") or (fisher == "cora" and batch_loss is None):
            raise ValueError(f"ewc fisher must be 'true', or 'cora' with a batch_loss; got {fisher!r}")
        self.model, self.policy_head, self.continuous = model, policy_head, continuous
        self.mode, self.lam, self.gamma, self.samples, self.seed = mode, lam, gamma, samples, seed
        self.normalize, self.scale_by_tasks, self.omit_current = normalize, scale_by_tasks, omit_current
        self.fisher, self.batch_loss = fisher, batch_loss
        # cora: rows of `row_steps` agent steps; a Fisher batch is the whole rows nearest `fisher_batch` steps
        self.rows_per_batch = max(1, round(fisher_batch / row_steps))
        self.fisher_batches = fisher_batches
        self.capacity = max(1, samples // row_steps) if fisher == "cora" else samples
        # regime (or "online") -> (theta*, F), on the model's device
        self.anchors: dict[str, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}
        self.buffer: Optional[dict[str, torch.Tensor]] = None  # key -> [capacity, ...], a ring
        self.filled = self.pos = 0
        self.consolidated = 0  # switch count of the last consolidation (a resumed switch is not consolidated twice)
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._merged: tuple = (None, None)  # (which anchors, their merged quadratic), see `penalty`
        self.last_penalty: Optional[torch.Tensor] = None  # the last minibatch's, logged with the iteration

    # --- what the agent calls ------------------------------------------------------------------------------------
    state_key = "ewc"

    @torch.no_grad()
    def observe(self, data: dict) -> None:
        """true: keeps the observations; cora: keeps the rows of `batch` (what the agent's batch_loss takes)."""
        obs, obs_shape, batch = data["obs"], data["obs_shape"], data.get("rows")
        if self.fisher == "cora":
            if batch is None:
                raise ValueError("ewc fisher 'cora' needs the agent's batch in observe()")
            rows = {k: v[-self.capacity:] for k, v in batch.items()}
        else:
            rows = {"obs": obs.reshape((-1,) + tuple(obs_shape))[-self.capacity:]}
        n = len(next(iter(rows.values())))
        if self.buffer is None:  # on the data's device: no host copy per iteration
            self.buffer = {k: torch.zeros((self.capacity,) + v.shape[1:], dtype=v.dtype, device=v.device)
                           for k, v in rows.items()}
        for k, v in rows.items():
            self.buffer[k][(self.pos + torch.arange(n, device=v.device)) % self.capacity] = v
        self.pos = (self.pos + n) % self.capacity
        self.filled = min(self.capacity, self.filled + n)

    def loss_terms(self, agent, batch: dict) -> dict:
        self.last_penalty = self.penalty()  # EWC: lambda/2 * sum F (theta - theta*)^2
        return {"ewc": self.last_penalty}

    def scalars(self) -> dict[str, float]:
        return {"losses/ewc_penalty": self.last_penalty.item()} if self.last_penalty is not None else {}

    def penalty(self) -> torch.Tensor:
        """`ewc_penalty` over the anchors in force, computed as one quadratic on the flattened parameters:
        sum_k F_k (theta - theta*_k)^2 = A (theta - m)^2 + c with A = sum_k F_k, m = sum_k F_k theta*_k / A and
        c = sum_k F_k (theta*_k - m)^2 (the same value and gradient; a few ops per update whatever the number of
        anchors, instead of several per parameter tensor and anchor)."""
        current = self.session.modification if self.omit_current and self.mode == "ewc" else None
        keys = tuple(k for k in self.anchors if k != current)
        if self._merged[0] != keys:  # reset to None whenever the anchors change
            self._merged = (keys, self._merge([self.anchors[k] for k in keys]))
        merged = self._merged[1]
        if merged is None:
            return torch.zeros((), device=self._params[0].device)
        a, m, c, k = merged
        d = torch.cat([p.reshape(-1) for p in self._params]) - m
        scale = 1.0 / k if self.scale_by_tasks and self.mode == "ewc" else 1.0
        return (0.5 * self.lam * scale) * (torch.dot(a * d, d) + c)

    def _merge(self, anchors: list) -> Optional[tuple[torch.Tensor, torch.Tensor, float, int]]:
        if not anchors:
            return None
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]

        def flat(d: dict) -> torch.Tensor:
            return torch.cat([d[n].reshape(-1) for n in names]).double()

        fishers, thetas = [flat(f) for _, f in anchors], [flat(t) for t, _ in anchors]
        a = sum(fishers)
        m = thetas[0] if len(anchors) == 1 else torch.where(
            a > 0, sum(f * t for f, t in zip(fishers, thetas)) / a.clamp_min(1e-300), 0.0)
        c = float(sum((f * (t - m) ** 2).sum() for f, t in zip(fishers, thetas)))
        dtype = self._params[0].dtype
        return a.to(dtype), m.to(dtype), c, len(anchors)

    # --- switch ----------------------------------------------------------------------------------------------------
    def on_switch_start(self, event: SwitchEvent) -> None:
        if event.count <= self.consolidated or not self.filled:
            return
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + event.count)
        data = {k: v[:self.filled] for k, v in self.buffer.items()}
        if self.fisher == "cora":
            fisher = batch_fisher(self.model, self.batch_loss, data, self.rows_per_batch, self.fisher_batches, gen)
        else:
            fisher = diagonal_fisher(self.model, self.policy_head, data["obs"], self.continuous, gen)
        theta = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        if self.mode == "online":
            old = self.anchors.get("online")
            if old is not None:  # P&C eq. 9, before the normalisation (as CORA)
                fisher = {n: self.gamma * old[1][n] + f for n, f in fisher.items()}
        if self.normalize == "full":  # CORA's "full": each tensor (of the running sum, online) divided by its L2 norm
            fisher = {n: f / f.norm().clamp_min(1e-30) for n, f in fisher.items()}
        if self.mode == "online":
            self.anchors["online"] = (theta, fisher)
        else:
            self.anchors.pop(event.old, None)  # re-insert: the dict keeps the order regimes ended in
            self.anchors[event.old] = (theta, fisher)
        self.consolidated = event.count
        self._merged = (None, None)

    def on_switch_end(self, event: SwitchEvent) -> None:
        self.filled = self.pos = 0  # the next Fisher sees only the next regime's observations

    # --- checkpoints -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"mode": self.mode, "fisher": self.fisher, "consolidated": self.consolidated, "filled": self.filled,
                "pos": self.pos, "buffer": None if self.buffer is None else {k: v.cpu() for k, v in self.buffer.items()},
                "anchors": [[k, {n: t.cpu() for n, t in th.items()}, {n: t.cpu() for n, t in f.items()}]
                            for k, (th, f) in self.anchors.items()]}

    def load_state_dict(self, state: dict) -> None:
        if state["mode"] != self.mode:
            raise ValueError(f"the checkpoint's EWC mode is {state['mode']!r}, not {self.mode!r}")
        fisher = state.get("fisher", "true")  # checkpoints from before --ewc_fisher hold a true-Fisher buffer
        if fisher != self.fisher:
            raise ValueError(f"the checkpoint's EWC Fisher is {fisher!r}, not {self.fisher!r} (--ewc_fisher)")
        device = next(self.model.parameters()).device
        self.consolidated, self.filled, self.pos = state["consolidated"], state["filled"], state["pos"]
        buffer = state["buffer"]
        if isinstance(buffer, torch.Tensor):
            buffer = {"obs": buffer}
        self.buffer = None if buffer is None else {k: v.to(device) for k, v in buffer.items()}
        self.anchors = {k: ({n: t.to(device) for n, t in th.items()}, {n: t.to(device) for n, t in f.items()})
                        for k, th, f in state["anchors"]}
        self._merged = (None, None)

