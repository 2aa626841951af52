"""Goals for hindsight experience replay (`--her`), the env side: goal spaces and the goal env wrapper that every
env worker applies (no torch here; the learner's relabelling is `continual.her`).

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
- our own goal envs (`continual.envs.goal_grid`): `env.achieved_goal()` and `env.sample_goal(rng)` (GoalGrid: the
  position / (n - 1), a uniform cell). Success: |a - g|_inf <= tol.
All coordinates are clipped to [0, 1].

Rewards (per step t, from that step's own data; `a_{t+1}` = achieved goal after the step)
    r_t = her_env_reward_weight * r_env_t + her_goal_reward * 1[success(a_{t+1}, g)]
r_env_t is the env reward after the learner's `--reward_scaling` (the goal term is not clipped or normalised).

Network conditioning (`agents/ppo.py`): vector/object observations: the goal is concatenated to the (scaled,
flattened) observation at the MLP's input; pixels: the goal joins the 512 CNN features through one fused layer before
the heads, h' = ReLU(W_h h + W_g g + b) (a linear layer on [h, g], kept as two modules so that CBP sees the torso's
outgoing weights alone).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import gymnasium as gym
import numpy as np

from continual.envs.backends import game_name, is_atari
from continual.envs.goal_grid import GOAL_ENV_IDS

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
    """Our own goal envs (`continual.envs.goal_grid`): the env extracts and samples its goals."""

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
