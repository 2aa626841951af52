"""A deterministic test env for exact-resume tests (`--env_id helpers.corridor_envs:Corridor-v0` with tests/ on
PYTHONPATH): every reset starts at cell 0, so a run resumed from a switch checkpoint (where every env resets anyway)
sees the same games as the uninterrupted run.

Corridor: cells 0..7, the observation is the one-hot cell (float32, 8), actions 0 = left, 1 = right; reaching cell
`goal` (a `goal=<n>` modification moves it) gives +1 and terminates, every other step -0.01; 30 steps truncate.
"""

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (8,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.goal = 5
        self.cell = 0

    def _obs(self):
        obs = np.zeros(8, np.float32)
        obs[self.cell] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = 0
        return self._obs(), {}

    def step(self, action):
        self.cell = int(np.clip(self.cell + (1 if int(action) == 1 else -1), 0, 7))
        reached = self.cell == int(self.goal)
        return self._obs(), (1.0 if reached else -0.01), reached, False, {}


if "Corridor-v0" not in gym.registry:
    gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=30)
