"""Hindsight experience replay (HER) for continual PPO (`--her`): goal spaces, the goal env wrapper, relabelling
with importance weights, and HER evaluation.

Goals
-----
A goal is a vector in [0, 1]^d. Each env worker wraps its env in `GoalEnvWrapper`, whose observations are
`{"obs": <the env's observation>, "goal": desired goal, "achieved": achieved goal}`; the achieved goal is read after
every step (and at reset). Desired goals are drawn once per episode (episodes are the training episodes: with
episodic life, one life) from the goal space's distribution; a goal already achieved at the start is drawn again (up
to 10 times). Success: the goal space's test with tolerance `--her_tolerance` (normalised units); distance: the
largest coordinate difference |achieved - desired|_inf.

Goal spaces (`make_goal_space`); RAM addresses verified in ALE (the pixel positions are OCAtari's RAM decoders'):
- generic (default): the player's pixel position (x / 160, y / 210). Freeway (44, 193 - RAM[14]); Kangaroo
  (RAM[17] + 15, RAM[16] * 8 + 4); Frostbite (RAM[102], RAM[100] + 29); other games: the first OCAtari object of
  category "Player" (else the first object; HackAtari then runs object detection every step). Desired goals: an
  achieved goal drawn uniformly from a reservoir (size 1000, reservoir sampling) of every achieved goal this env has
  seen; uniform on [0, 1]^2 before any. Success: |a - g|_inf <= tol.
- Freeway (`--game_specific_goals`): the player chicken's height (RAM[14] - 6) / 171. RAM[14] is 6 at the bottom,
  +4 per UP step (1 per frame), about 176 at the top. A step that scores (RAM[103], the player's score, changes)
  counts as height 1: the game puts the chicken back at the bottom in that same step, so "at the top" is a success
  for goals near 1. (RAM[15], used by the reference implementation, is the idle second chicken.) Desired goals:
  U[0.1, 1]. Success: |a - g| <= tol.
- Kangaroo: (x, height) = ((RAM[17] - 1) / 120, (18 - RAM[16]) / 18). RAM[17] runs 1..121 from left to right;
  RAM[16] = 18, 12, 6, 0 standing on floors 0-3 (platforms at y = 172, 124, 76, 28). Desired goals: x ~ U[0, 1],
  floor ~ U{0, 1, 2, 3} (height floor / 3). Success: same floor (round(3 h)) and |dx| <= tol.
- Frostbite: (x, row) = ((RAM[102] - 16) / 134, (RAM[100] - 27) / 104). RAM[102] runs 16..150; RAM[100] = 27 on
  the shore and 53, 79, 105, 131 on the four ice-floe rows. Desired goals: x ~ U[0, 1], row ~ U{0..4} (row / 4).
  Success: same row (round(4 r)) and |dx| <= tol.
- our own goal envs (`continual.goal_envs`): `env.achieved_goal()` and `env.sample_goal(rng)` (GoalGrid: the
  position / (n - 1), a uniform cell). Success: |a - g|_inf <= tol.
All coordinates are clipped to [0, 1].

Rewards (per step t, from that step's own data; `a_{t+1}` = achieved goal after the step)
    r_t = her_env_reward_weight * r_env_t + her_goal_reward * 1[success(a_{t+1}, g)]
r_env_t is the env reward after the learner's `--reward_scaling` (the goal term is not clipped or normalised).

Network conditioning (`agents/ppo.py`): vector/object observations: the goal is concatenated to the (scaled,
flattened) observation at the MLP's input; pixels: the goal joins the 512 CNN features through one fused layer before
the heads, h' = ReLU(W_h h + W_g g + b) (a linear layer on [h, g], kept as two modules so that CBP sees the torso's
outgoing weights alone).

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
import math
from typing import Any, Callable, Optional

import gymnasium as gym
import numpy as np
import torch

from continual.backends import game_name, is_atari

SCREEN_W, SCREEN_H = 160.0, 210.0
RESERVOIR_SIZE = 1000
RESAMPLE_TRIES = 10


# --------------------------------------------------------------------------------------------------------------------
# goal spaces
# --------------------------------------------------------------------------------------------------------------------


def _ram(env: gym.Env) -> np.ndarray:
    return env.unwrapped.ale.getRAM()


def _clip01(v) -> np.ndarray:
    return np.clip(np.asarray(v, dtype=np.float32), 0.0, 1.0)


class GoalSpace:
    """`dim` normalised coordinates; `achieved(env)` reads them from a live env, `sample(rng, env)` draws a desired
    goal, `success`/`distance` work on batches (..., dim) and need no env (the learner relabels with them)."""

    name = "goal"
    dim = 2

    def reset(self, env: gym.Env) -> None:
        """Start of an episode (extractor state such as a score to watch)."""

    def achieved(self, env: gym.Env) -> np.ndarray:
        raise NotImplementedError

    def observe(self, achieved: np.ndarray, rng: np.random.Generator) -> None:
        """Every achieved goal seen during training (for distributions that follow them)."""

    def sample(self, rng: np.random.Generator, env: gym.Env) -> np.ndarray:
        raise NotImplementedError

    def distance(self, achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        return np.abs(np.asarray(achieved, np.float32) - np.asarray(desired, np.float32)).max(-1)

    def success(self, achieved: np.ndarray, desired: np.ndarray, tol: float) -> np.ndarray:
        return self.distance(achieved, desired) <= tol


# pixel (x, y) of the player from RAM, as OCAtari's RAM decoders compute them
RAM_PLAYER_XY: dict[str, Callable[[np.ndarray], tuple[float, float]]] = {
    "Freeway": lambda ram: (44.0, 193.0 - float(ram[14])),
    "Kangaroo": lambda ram: (float(ram[17]) + 15.0, float(ram[16]) * 8.0 + 4.0),
    "Frostbite": lambda ram: (float(ram[102]), float(ram[100]) + 29.0),
}


class PlayerPosition(GoalSpace):
    """Generic: the player's pixel position / (160, 210); desired goals drawn from the achieved goals seen so far."""

    name = "player_position"
    dim = 2

    def __init__(self, game: str):
        self.game = game
        self.reservoir: list[np.ndarray] = []
        self.seen = 0
        self._last = np.zeros(2, np.float32)

    @property
    def needs_objects(self) -> bool:
        return self.game not in RAM_PLAYER_XY

    def achieved(self, env: gym.Env) -> np.ndarray:
        if self.game in RAM_PLAYER_XY:
            x, y = RAM_PLAYER_XY[self.game](_ram(env))
        else:
            objects = [o for o in getattr(env.unwrapped, "objects", [])
                       if getattr(o, "category", "NoObject") != "NoObject"]
            players = [o for o in objects if o.category == "Player"] or objects[:1]
            if not players:  # no player on screen (e.g. dying): keep the last position
                return self._last.copy()
            x, y = players[0].xy
        self._last = _clip01([x / SCREEN_W, y / SCREEN_H])
        return self._last.copy()

    def observe(self, achieved: np.ndarray, rng: np.random.Generator) -> None:
        # reservoir sampling: a uniform sample of every achieved goal seen by this env
        self.seen += 1
        if len(self.reservoir) < RESERVOIR_SIZE:
            self.reservoir.append(np.array(achieved, np.float32))
        else:
            k = int(rng.integers(self.seen))
            if k < RESERVOIR_SIZE:
                self.reservoir[k] = np.array(achieved, np.float32)

    def sample(self, rng: np.random.Generator, env: gym.Env) -> np.ndarray:
        if not self.reservoir:
            return rng.random(2).astype(np.float32)
        return self.reservoir[int(rng.integers(len(self.reservoir)))].copy()


class FreewayHeight(GoalSpace):
    """Freeway: the player chicken's height; a scoring step is height 1 (the chicken is back at the bottom then)."""

    name = "freeway_height"
    dim = 1
    Y_ADDR, SCORE_ADDR, Y_BOTTOM, Y_RANGE = 14, 103, 6.0, 171.0

    def __init__(self):
        self._score: Optional[int] = None

    def reset(self, env: gym.Env) -> None:
        self._score = int(_ram(env)[self.SCORE_ADDR])

    def achieved(self, env: gym.Env) -> np.ndarray:
        ram = _ram(env)
        score = int(ram[self.SCORE_ADDR])
        scored = self._score is not None and score != self._score
        self._score = score
        if scored:
            return np.ones(1, np.float32)
        return _clip01([(float(ram[self.Y_ADDR]) - self.Y_BOTTOM) / self.Y_RANGE])

    def sample(self, rng: np.random.Generator, env: gym.Env) -> np.ndarray:
        return np.array([rng.uniform(0.1, 1.0)], np.float32)


class BandedXGoals(GoalSpace):
    """(x, level) goals: success needs the same level band (round(level * levels)) and |dx| <= tol."""

    dim = 2
    levels = 1

    def sample(self, rng: np.random.Generator, env: gym.Env) -> np.ndarray:
        return np.array([rng.random(), rng.integers(self.levels + 1) / self.levels], np.float32)

    def success(self, achieved: np.ndarray, desired: np.ndarray, tol: float) -> np.ndarray:
        a, g = np.asarray(achieved, np.float32), np.asarray(desired, np.float32)
        same_level = np.round(a[..., 1] * self.levels) == np.round(g[..., 1] * self.levels)
        return same_level & (np.abs(a[..., 0] - g[..., 0]) <= tol)


class KangarooGoals(BandedXGoals):
    """Kangaroo: (x, height); floors 0-3 at heights 0, 1/3, 2/3, 1."""

    name = "kangaroo_x_floor"
    levels = 3

    def achieved(self, env: gym.Env) -> np.ndarray:
        ram = _ram(env)
        return _clip01([(float(ram[17]) - 1.0) / 120.0, (18.0 - float(ram[16])) / 18.0])


class FrostbiteGoals(BandedXGoals):
    """Frostbite: (x, row); the shore is row 0, the ice-floe rows 1-4 (row / 4)."""

    name = "frostbite_x_row"
    levels = 4

    def achieved(self, env: gym.Env) -> np.ndarray:
        ram = _ram(env)
        return _clip01([(float(ram[102]) - 16.0) / 134.0, (float(ram[100]) - 27.0) / 104.0])


class EnvProvidedGoals(GoalSpace):
    """Our own goal envs (`continual.goal_envs`): the env extracts and samples its goals."""

    name = "env_goals"

    def __init__(self, dim: int):
        self.dim = dim

    def achieved(self, env: gym.Env) -> np.ndarray:
        return _clip01(env.unwrapped.achieved_goal())

    def sample(self, rng: np.random.Generator, env: gym.Env) -> np.ndarray:
        return _clip01(env.unwrapped.sample_goal(rng))


GAME_GOALS: dict[str, Callable[[], GoalSpace]] = {
    "Freeway": FreewayHeight, "Kangaroo": KangarooGoals, "Frostbite": FrostbiteGoals,
}


def make_goal_space(env_id: str, backend: str, game_specific: bool = False) -> GoalSpace:
    """The goal space of a run (`ValueError` when there is none: checked earlier by `validate_args`)."""
    from continual.goal_envs import GOAL_ENV_IDS

    if env_id in GOAL_ENV_IDS:
        return EnvProvidedGoals(GOAL_ENV_IDS[env_id])
    if backend == "Gymnasium" or not is_atari(env_id):
        raise ValueError(f"--her needs an Atari game (HackAtari/OCAtari) or a goal env ({', '.join(GOAL_ENV_IDS)}); "
                         f"got {env_id!r} on {backend}")
    game = game_name(env_id)
    if game_specific:
        if game not in GAME_GOALS:
            raise ValueError(f"--game_specific_goals: no goal space for {game}; games: {', '.join(GAME_GOALS)}")
        return GAME_GOALS[game]()
    return PlayerPosition(game)


def needs_objects(env_id: str, backend: str, game_specific: bool) -> bool:
    """Whether the goal extractor reads OCAtari objects (HackAtari then runs object detection every step)."""
    space = make_goal_space(env_id, backend, game_specific)
    return bool(getattr(space, "needs_objects", False))


# --------------------------------------------------------------------------------------------------------------------
# env wrapper
# --------------------------------------------------------------------------------------------------------------------


class GoalEnvWrapper(gym.Wrapper):
    """Dict observations {"obs", "goal", "achieved"}; one desired goal per episode; success statistics in `info`.

    info per step: `her_success` (this step reached the goal), `her_distance`; at episode ends also
    `her_episode_success` (1.0 if any step of the episode succeeded) and `her_episode_distance` (closest approach).
    The env reward is passed on unchanged: the learner adds the goal reward (it needs both apart to relabel).
    """

    def __init__(self, env: gym.Env, space: GoalSpace, tolerance: float):
        super().__init__(env)
        self.space, self.tolerance = space, float(tolerance)
        box = gym.spaces.Box(0.0, 1.0, (space.dim,), np.float32)
        self.observation_space = gym.spaces.Dict({"obs": env.observation_space, "goal": box, "achieved": box})
        self.rng = np.random.default_rng()
        self.desired = np.zeros(space.dim, np.float32)
        self._ep_success, self._ep_distance = False, math.inf

    def _dict(self, obs: Any, achieved: np.ndarray) -> dict:
        return {"obs": obs, "goal": self.desired.copy(), "achieved": np.asarray(achieved, np.float32)}

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None:
            self.rng = np.random.default_rng([seed, 0x4E52])
        self.space.reset(self)
        achieved = self.space.achieved(self)
        for _ in range(RESAMPLE_TRIES):
            self.desired = np.asarray(self.space.sample(self.rng, self), np.float32)
            if not self.space.success(achieved, self.desired, self.tolerance):
                break
        self._ep_success = False
        self._ep_distance = float(self.space.distance(achieved, self.desired))
        return self._dict(obs, achieved), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        achieved = self.space.achieved(self)
        self.space.observe(achieved, self.rng)
        distance = float(self.space.distance(achieved, self.desired))
        success = bool(self.space.success(achieved, self.desired, self.tolerance))
        self._ep_success |= success
        self._ep_distance = min(self._ep_distance, distance)
        info = {**info, "her_success": success, "her_distance": distance}
        if terminated or truncated:
            info["her_episode_success"] = float(self._ep_success)
            info["her_episode_distance"] = float(self._ep_distance)
        return self._dict(obs, achieved), reward, terminated, truncated, info


def wrap_env(env: gym.Env, env_id: str, backend: str, game_specific: bool, tolerance: float) -> GoalEnvWrapper:
    return GoalEnvWrapper(env, make_goal_space(env_id, backend, game_specific), tolerance)


def split_goal_space(obs_space: gym.Space) -> tuple[gym.Space, int]:
    """(observation space of the network's input, goal dimension); goal dimension 0 without HER."""
    if isinstance(obs_space, gym.spaces.Dict) and "goal" in obs_space.spaces:
        return obs_space["obs"], int(obs_space["goal"].shape[0])
    return obs_space, 0


def episode_outcomes(infos: dict) -> list[tuple[int, float, float]]:
    """(env index, success 0/1, closest distance) of the goal episodes that ended in this vector step."""
    final = infos.get("final_info")
    if not final or "her_episode_success" not in final:
        return []
    mask = final["_her_episode_success"]
    return [(int(i), float(final["her_episode_success"][i]), float(final["her_episode_distance"][i]))
            for i in np.flatnonzero(mask)]


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


def weighted_mean(x: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
    return x.mean() if weights is None else (x * weights).mean()


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
    def scalars(self, regime: str) -> dict[str, float]:
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


# --------------------------------------------------------------------------------------------------------------------
# evaluation (eval.py)
# --------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(agent: torch.nn.Module, envs, episodes: int, device: torch.device, seed: int, greedy: bool = False,
             max_steps: int = 10_000_000) -> dict:
    """Whole games of a goal-conditioned agent (each env plays its quota, ceil(episodes / num_envs)); a row with the
    return statistics plus the success rate and mean closest goal distance of the same episodes."""
    from continual.envs import episode_stats

    n = envs.num_envs
    quota = [math.ceil(episodes / n) - (1 if i >= episodes % n and episodes % n else 0) for i in range(n)]
    done_eps: list[list[tuple[float, int, float, float]]] = [[] for _ in range(n)]
    outcome: dict[int, tuple[float, float]] = {}
    obs, _ = envs.reset(seed=seed)
    steps = 0
    while any(len(d) < q for d, q in zip(done_eps, quota)):
        x = torch.as_tensor(obs["obs"], device=device)
        g = torch.as_tensor(np.asarray(obs["goal"], np.float32), device=device)
        actions = agent.get_action_and_value(x, goal=g, greedy=greedy)[0].cpu().numpy()
        obs, _, _, _, infos = envs.step(actions)
        for i, ok, dist in episode_outcomes(infos):
            outcome[i] = (ok, dist)
        for i, ret, length in episode_stats(infos):
            if len(done_eps[i]) < quota[i]:
                ok, dist = outcome.pop(i, (math.nan, math.nan))
                done_eps[i].append((ret, length, ok, dist))
        steps += n
        if steps > max_steps:
            raise RuntimeError(f"evaluation did not finish {episodes} episodes within {max_steps} steps")
    flat = [e for d in done_eps for e in d]
    r = np.array([e[0] for e in flat], np.float64)
    return {"modification": envs.modification, "episodes": len(r), "mean": float(r.mean()), "std": float(r.std()),
            "min": float(r.min()), "max": float(r.max()), "mean_length": float(np.mean([e[1] for e in flat])),
            "success_rate": float(np.nanmean([e[2] for e in flat])),
            "goal_distance": float(np.nanmean([e[3] for e in flat]))}
