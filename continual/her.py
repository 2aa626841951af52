"""Hindsight experience replay (HER) for continual PPO (`--her`), the learner's side: relabelling with importance
weights. Goal spaces, goal rewards and the env wrapper are `continual.envs.goals`.

Relabelling (after every rollout, before the update; `HerRollout.relabel`)
--------------------------------------------------------------------------
The rollout of each env is cut into *pieces*: maximal runs of steps of one episode (an episode cut by the rollout
boundary, or by a regime switch, which only happens between rollouts, is a piece too). Each piece [s, e) gets
relabelled *copies*: `final`: one copy with goal g' = a_e (the achieved goal after its last step), covering [s, e);
`future`: `--her_k` copies, each with g' = a_{j+1} for a step j drawn uniformly in [s, e), covering [s, j] (so g' is
achieved in the future of every step of the copy). Per copy, with the rollout-time network (it has not been updated
yet, so it is pi_old):
    r'_t   = her_env_reward_weight * r_env_t + her_goal_reward * 1[success(a_{t+1}, g')]   (stored r_env_t)
    V'_t   = V_old(s_t, g')
    rho_t  = pi_old(a_t | s_t, g') / mu(a_t | s_t, g)      mu = the behaviour policy (the stored log-probabilities)
    w_t    = min(rho_t, her_is_clip)        sample weight of the relabelled sample in the policy AND value losses
    c_t    = min(rho_t, 1)                  trace cut (Retrace / V-trace c-bar = 1)
    delta_t = r'_t + gamma * V'_{t+1} - V'_t    (inside the copy)
    delta_j = r'_j + gamma * B - V'_j           (its last step j: B = 0 after a termination, V_old(final obs, g')
                                                 after a time limit, V_old(s_{j+1}, g') when the copy or rollout ends
                                                 inside the episode)
    A'_j = delta_j,  A'_t = delta_t + gamma * lambda * c_{t+1} * A'_{t+1},   return R'_t = A'_t + V'_t
Out of all candidate samples, round(her_ratio * rollout size) are kept (uniformly without replacement; all of them
when there are fewer). They join the batch; minibatches are drawn over originals + relabelled samples (the number
of minibatches stays `--num_minibatches`). For a relabelled sample the clipped surrogate uses
ratio = pi_theta(a | s, g') / pi_old(a | s, g'), the value loss is clipped around V'_t, and both per-sample losses
are multiplied by w_t (originals: w = 1); losses are means over the minibatch. When g' = g, rho = 1 exactly.

Logged per iteration: her/success_rate, her/goal_distance (closest approach |a - g|_inf of the episodes that ended),
her/success_rate_by_modif/<regime>, her/step_success (share of steps with the goal reward), her/relabelled_fraction
(relabelled / all samples of the update), her/relabelled_trained (relabelled samples drawn into minibatches,
over all epochs), her/relabelled_reward_rate, her/is_weight_mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import gymnasium as gym
import numpy as np
import torch

from continual.envs.goals import episode_outcomes, make_goal_space
from continual.envs.vector import regime_slug
from continual.training.extensions import Extension, Reduction

# --------------------------------------------------------------------------------------------------------------------
# relabelling (pure parts, tested by hand computation)
# --------------------------------------------------------------------------------------------------------------------


def episode_pieces(dones: np.ndarray) -> list[tuple[int, int, int]]:
    """(env, start, end) half-open runs of steps of one episode; dones[t, i] = 1 when obs t starts an episode."""
    T, N = dones.shape
    out = []
    for i in range(N):
        starts = [0] + [t for t in range(1, T) if dones[t, i]]
        for s, e in zip(starts, starts[1:] + [T]):
            out.append((i, s, e))
    return out


def plan_copies(dones: np.ndarray, strategy: str, k: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """Relabelled copies (env, start, last): steps start..last (inclusive) get the goal achieved after step `last`."""
    copies = []
    for i, s, e in episode_pieces(dones):
        if strategy == "final":
            copies.append((i, s, e - 1))
        else:
            copies.extend((i, s, int(j)) for j in rng.integers(s, e, size=k))
    return copies


def importance_weights(logp_relabelled: np.ndarray, logp_behaviour: np.ndarray, clip: float
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(w, c): w = min(pi_old(a|s,g') / mu(a|s,g), clip) and the trace cut c = min(ratio, 1)."""
    ratio = np.exp(np.asarray(logp_relabelled, np.float64) - np.asarray(logp_behaviour, np.float64))
    return np.minimum(ratio, clip), np.minimum(ratio, 1.0)


def copy_advantages(rewards: np.ndarray, values: np.ndarray, bootstrap: float, traces: np.ndarray, gamma: float,
                    lam: float) -> np.ndarray:
    """GAE inside one relabelled copy (no episode boundary inside): delta_t = r_t + gamma V_{t+1} - V_t with
    V_{last+1} = bootstrap; A_last = delta_last; A_t = delta_t + gamma lam c_{t+1} A_{t+1}."""
    n = len(rewards)
    adv = np.zeros(n, np.float64)
    last = 0.0
    for t in reversed(range(n)):
        next_value = bootstrap if t == n - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta if t == n - 1 else delta + gamma * lam * traces[t + 1] * last
        adv[t] = last
    return adv


# --------------------------------------------------------------------------------------------------------------------
# the learner's side
# --------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Relabelled:
    """Relabelled samples; `src` indexes the flattened rollout (t * num_envs + env)."""

    src: torch.Tensor
    goals: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor
    candidates: int
    goal_rewards: float


class HerRollout:
    """What PPO keeps for HER during one rollout: goals, achieved goals, weighted env rewards, episode ends and
    time-limit final observations; the goal rewards; relabelling; the HER statistics."""

    def __init__(self, args: Any, obs_space: gym.spaces.Dict, device: torch.device, rng: np.random.Generator):
        self.args, self.device, self.rng = args, device, rng
        self.space = make_goal_space(args.env_id, args.backend, args.game_specific_goals)
        T, N, d = args.num_steps, args.num_envs, int(obs_space["goal"].shape[0])
        self.T, self.N, self.dim = T, N, d
        self.goals = torch.zeros((T, N, d), device=device)  # desired goal the agent saw at step t
        self.achieved = np.zeros((T, N, d), np.float32)  # achieved goal after step t
        self.env_rewards = np.zeros((T, N), np.float32)  # her_env_reward_weight * scaled env reward of step t
        self.terminated = np.zeros((T, N), bool)
        self.truncated = np.zeros((T, N), bool)  # time limit (not a termination)
        self.final_obs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.next_goal: Optional[torch.Tensor] = None
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.successes: list[float] = []
        self.distances: list[float] = []
        self.step_successes = 0
        self.trained = 0
        self.last: Optional[Relabelled] = None

    # --- rollout ---------------------------------------------------------------------------------------------------
    def take_goals(self, obs: dict) -> np.ndarray:
        """Keep the desired goals of a batched Dict observation; return the network's observation part."""
        self.next_goal = torch.as_tensor(np.asarray(obs["goal"], np.float32), device=self.device)
        return obs["obs"]

    def step_rewards(self, step: int, scaled: np.ndarray, next_obs: dict, terminations: np.ndarray,
                     truncations: np.ndarray, infos: dict) -> np.ndarray:
        """r_t = w_env * r_env_t + her_goal_reward * success(a_{t+1}, g_t); the achieved goal after the step comes from
        the final observation where the episode ended (the returned observation is then the next episode's)."""
        done = np.logical_or(terminations, truncations)
        achieved = np.array(next_obs["achieved"], np.float32)
        for i in np.flatnonzero(done):
            achieved[i] = infos["final_obs"][i]["achieved"]
        goals = self.goals[step].cpu().numpy()
        success = self.space.success(achieved, goals, self.args.her_tolerance)
        self.achieved[step] = achieved
        self.env_rewards[step] = self.args.her_env_reward_weight * np.asarray(scaled, np.float32)
        self.terminated[step] = terminations
        self.truncated[step] = np.logical_and(truncations, ~np.asarray(terminations, bool))
        if step == 0:
            self.final_obs.clear()
        self.step_successes += int(success.sum())
        for i, ok, dist in episode_outcomes(infos):
            self.successes.append(ok)
            self.distances.append(dist)
        return self.env_rewards[step] + self.args.her_goal_reward * success.astype(np.float32)

    def final_observations(self, step: int, envs_cut: np.ndarray, infos: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Final observations and goals of the envs whose episode hit the time limit at `step` (kept for
        relabelling)."""
        obs = torch.as_tensor(np.stack([infos["final_obs"][i]["obs"] for i in envs_cut]), device=self.device)
        goals = torch.as_tensor(np.stack([infos["final_obs"][i]["goal"] for i in envs_cut]), dtype=torch.float32,
                                device=self.device)
        for n, i in enumerate(envs_cut):
            self.final_obs[(step, int(i))] = (obs[n], goals[n])
        return obs, goals

    # --- relabelling -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def relabel(self, agent: torch.nn.Module, obs: torch.Tensor, actions: torch.Tensor, logprobs: torch.Tensor,
                dones: torch.Tensor, next_obs: torch.Tensor) -> Relabelled:
        """Relabelled samples for this rollout (see the module docstring for the formulas)."""
        a = self.args
        T, N = self.T, self.N
        starts = dones.cpu().numpy() > 0.5
        copies = plan_copies(starts, a.her_strategy, a.her_k, self.rng)
        # samples of every copy, in order
        t_idx = np.concatenate([np.arange(s, j + 1) for _, s, j in copies])
        i_idx = np.concatenate([np.full(j + 1 - s, i) for i, s, j in copies])
        goal_np = np.concatenate([np.repeat(self.achieved[j, i][None], j + 1 - s, 0) for i, s, j in copies])
        goals = torch.as_tensor(goal_np, device=self.device)
        t_t, i_t = torch.as_tensor(t_idx, device=self.device), torch.as_tensor(i_idx, device=self.device)
        logp_new, values = self._evaluate(agent, obs[t_t, i_t], actions[t_t, i_t], goals)

        # bootstrap state of each copy's last step
        boot = np.zeros(len(copies), np.float64)
        boot_obs, boot_goal, boot_at = [], [], []
        for c, (i, s, j) in enumerate(copies):
            g = torch.as_tensor(self.achieved[j, i], device=self.device)
            if j + 1 < T and not starts[j + 1, i]:
                boot_obs.append(obs[j + 1, i])  # the copy ends inside the episode
            elif self.terminated[j, i]:
                continue
            elif self.truncated[j, i]:
                boot_obs.append(self.final_obs[(j, i)][0])
            else:  # the rollout ends inside the episode
                boot_obs.append(next_obs[i])
            boot_goal.append(g)
            boot_at.append(c)
        if boot_at:
            _, v = self._evaluate(agent, torch.stack(boot_obs), None, torch.stack(boot_goal))
            boot[boot_at] = v.cpu().numpy()

        behaviour = logprobs[t_t, i_t].cpu().numpy()
        w, c = importance_weights(logp_new.cpu().numpy(), behaviour, a.her_is_clip)
        goal_hit = self.space.success(self.achieved[t_idx, i_idx], goal_np, a.her_tolerance).astype(np.float64)
        rewards = self.env_rewards[t_idx, i_idx].astype(np.float64) + a.her_goal_reward * goal_hit
        v_np = values.cpu().numpy().astype(np.float64)
        adv = np.zeros(len(t_idx), np.float64)
        pos = 0
        for n, (i, s, j) in enumerate(copies):
            sl = slice(pos, pos + j + 1 - s)
            adv[sl] = copy_advantages(rewards[sl], v_np[sl], boot[n], c[sl], a.gamma, a.gae_lambda)
            pos = sl.stop

        keep = np.arange(len(t_idx))
        budget = int(round(a.her_ratio * T * N))
        if len(keep) > budget:
            keep = np.sort(self.rng.choice(len(keep), size=budget, replace=False))
        kt = torch.as_tensor(keep, device=self.device)
        f32 = dict(dtype=torch.float32, device=self.device)
        self.last = Relabelled(
            src=(t_t * N + i_t)[kt], goals=goals[kt], logprobs=logp_new[kt],
            advantages=torch.as_tensor(adv[keep], **f32), returns=torch.as_tensor(adv[keep] + v_np[keep], **f32),
            values=values[kt], weights=torch.as_tensor(w[keep], **f32), candidates=len(t_idx),
            goal_rewards=float(goal_hit[keep].mean()) if len(keep) else 0.0)
        return self.last

    def _evaluate(self, agent, obs: torch.Tensor, actions: Optional[torch.Tensor], goals: torch.Tensor,
                  chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
        logps, values = [], []
        for k in range(0, len(obs), chunk):
            sl = slice(k, k + chunk)
            if actions is None:
                values.append(agent.get_value(obs[sl], goal=goals[sl]).flatten())
                continue
            _, logp, _, v = agent.get_action_and_value(obs[sl], actions[sl], goal=goals[sl])
            logps.append(logp)
            values.append(v.flatten())
        return (torch.cat(logps) if logps else torch.zeros(0, device=self.device)), torch.cat(values)

    def count_trained(self, mb_inds: torch.Tensor, batch_size: int) -> None:
        """Count the relabelled samples (indices >= batch_size) drawn into a minibatch."""
        self.trained += int((mb_inds >= batch_size).sum())

    # --- logging ---------------------------------------------------------------------------------------------------
    def her_scalars(self, regime: str) -> dict[str, float]:
        """This iteration's HER statistics (then reset)."""
        out: dict[str, float] = {"her/step_success": self.step_successes / float(self.T * self.N),
                                 "her/relabelled_trained": float(self.trained)}
        if self.successes:
            rate = float(np.mean(self.successes))
            out["her/success_rate"] = rate
            out[f"her/success_rate_by_modif/{regime}"] = rate
            out["her/goal_distance"] = float(np.mean(self.distances))
        if self.last is not None:
            m = len(self.last.src)
            out["her/relabelled_fraction"] = m / float(m + self.T * self.N)
            out["her/relabelled_candidates"] = float(self.last.candidates)
            out["her/relabelled_reward_rate"] = self.last.goal_rewards
            out["her/is_weight_mean"] = float(self.last.weights.mean()) if m else 1.0
        self._reset_stats()
        return out


class HerExtension(HerRollout, Extension):
    """HER as PPO's extension (`continual.training.extensions`): the goal leaves the observation and goes
    to the policy's `goal` input, goal rewards join the step's rewards, and after GAE the relabelled samples join the
    batch. A batch sample k is the rollout sample `src[k]` (its observation and action) with goal `goals[k]` and
    importance weight `weights[k]` (1 for original samples); minibatches are drawn over all of them, still
    `--num_minibatches` per epoch."""

    # --- rollout ---------------------------------------------------------------------------------------------------
    def observations(self, obs: dict) -> np.ndarray:
        return self.take_goals(obs)

    def policy_inputs(self) -> dict:
        return {"goal": self.next_goal}  # the episode's goal

    def rewards(self, step: int, scaled: np.ndarray, next_obs: dict, terminations: np.ndarray,
                truncations: np.ndarray, infos: dict) -> np.ndarray:
        self.goals[step] = self.next_goal  # the goal acted on (`observations` of next_obs has not replaced it yet)
        return self.step_rewards(step, scaled, next_obs, terminations, truncations, infos)

    def final_observations(self, step: int, cut: np.ndarray, infos: dict) -> tuple[torch.Tensor, dict]:
        # Dict final observations, valued for their own goal
        obs, goals = super().final_observations(step, cut, infos)
        return obs, {"goal": goals}

    # --- update ----------------------------------------------------------------------------------------------------
    def extend_batch(self, agent: torch.nn.Module, batch: dict, rollout: dict) -> dict:
        n = batch["size"]
        src = torch.arange(n, device=self.device)
        goals = self.goals.reshape(n, -1)
        weights = torch.ones(n, device=self.device)
        batch = dict(batch)
        if self.args.her_ratio > 0:
            rl = self.relabel(agent, rollout["obs"], rollout["actions"], rollout["logprobs"], rollout["dones"],
                              rollout["next_obs"])
            src, goals = torch.cat([src, rl.src]), torch.cat([goals, rl.goals])
            weights, batch["logprobs"] = torch.cat([weights, rl.weights]), torch.cat([batch["logprobs"], rl.logprobs])
            batch["actions"] = batch["actions"][src]
            batch["advantages"] = torch.cat([batch["advantages"], rl.advantages])
            batch["returns"], batch["values"] = torch.cat([batch["returns"], rl.returns]), torch.cat([batch["values"],
                                                                                                       rl.values])
        self.rollout_size = n
        self.src, self.batch_goals, self.weights = src, goals, weights
        batch["size"] = len(src)
        batch["minibatch_size"] = -(-len(src) // self.args.num_minibatches)
        return batch

    def minibatch(self, batch: dict, mb_inds: torch.Tensor) -> tuple[torch.Tensor, dict, Reduction]:
        """A relabelled sample is its rollout observation with another goal; each sample's policy and value losses
        count by its importance weight (1 for the original samples)."""
        self.count_trained(mb_inds, self.rollout_size)
        weights = self.weights[mb_inds]
        return batch["obs"][self.src[mb_inds]], {"goal": self.batch_goals[mb_inds]}, lambda x: (x * weights).mean()

    def scalars(self) -> dict[str, float]:
        return self.her_scalars(regime_slug(self.session.modification))
