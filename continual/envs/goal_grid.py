"""A small goal-reaching env of our own, for HER tests and the HER benchmark (registered with gymnasium on import).

`continual/GoalGrid-v0`: an n x n grid (n = 15), 50 steps per episode (time-limit truncation, never a termination).
The agent starts on a uniformly drawn cell; actions are 0 stay, 1 up, 2 down, 3 left, 4 right (moves into a wall
leave it in place). Observation: its position (x, y) / (n - 1) in [0, 1]^2. The env reward is always 0: the task is
only defined by a goal, which the HER wrapper (`continual.envs.goals.GoalEnvWrapper`, `--her`) draws per episode uniformly
over the cells and rewards on exact reach (with `--her_tolerance` below 1 / (n - 1)). A uniformly random policy
reaches its goal in about 8% of the episodes, so without hindsight relabelling the goal reward is rarely seen.

Continual modifications (Gymnasium backend, `name=value`): `slip=<p>`, the probability that the chosen action is
replaced by a uniformly random one. The grid size is fixed by the id (`_size`, not a modification).

Goal interface used by `continual.envs.goals.EnvProvidedGoals`: `goal_dim`, `achieved_goal()`, `sample_goal(rng)`.
"""

from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np

MOVES = np.array([[0, 0], [0, 1], [0, -1], [-1, 0], [1, 0]])


class GoalGridEnv(gym.Env):
    """n x n grid; the observation is the agent's normalised position; env reward 0 (goal rewards come from HER)."""

    metadata = {"render_modes": []}
    goal_dim = 2

    def __init__(self, size: int = 15, slip: float = 0.0, render_mode: Optional[str] = None):
        if size < 2:
            raise ValueError("size must be at least 2")
        self._size = int(size)
        self.render_mode = render_mode
        self.slip = float(slip)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(5)
        self._pos = np.zeros(2, dtype=np.int64)

    def _obs(self) -> np.ndarray:
        return (self._pos / (self._size - 1)).astype(np.float32)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self._pos = self.np_random.integers(self._size, size=2)
        return self._obs(), {}

    def step(self, action):
        a = int(action)
        if self.slip > 0 and self.np_random.random() < self.slip:
            a = int(self.np_random.integers(5))
        self._pos = np.clip(self._pos + MOVES[a], 0, self._size - 1)
        return self._obs(), 0.0, False, False, {}

    # --- goal interface (continual.envs.goals) ----------------------------------------------------------------------------
    def achieved_goal(self) -> np.ndarray:
        return self._obs()

    def sample_goal(self, rng: np.random.Generator) -> np.ndarray:
        """A uniformly drawn cell, normalised like the observation."""
        return (rng.integers(self._size, size=2) / (self._size - 1)).astype(np.float32)


GOAL_ENV_IDS = {"continual/GoalGrid-v0": GoalGridEnv.goal_dim}


def register() -> None:
    if "continual/GoalGrid-v0" not in gym.registry:
        gym.register("continual/GoalGrid-v0", entry_point=GoalGridEnv, max_episode_steps=50,
                     kwargs={"size": 15})


register()
