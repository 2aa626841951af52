"""Box-action test envs (`--env_id helpers.box_envs:Target2x2-v0` with tests/ on PYTHONPATH).

Target2x2: the observation is a target t in [-1, 1]^4, the action a 2x2 matrix in an unbounded Box (or a bounded one,
Target2x2Bounded: [-0.5, 0.5]); the reward is -|a.flatten() - t|^2, episodes last 8 steps. `last_action` keeps what
the env received, for the wrapper tests.
"""

import gymnasium as gym
import numpy as np


class Target2x2(gym.Env):
    def __init__(self, bound: float = np.inf, render_mode=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Box(-bound, bound, (2, 2), np.float32)
        self.last_action = None
        self.t = 0

    def _target(self):
        self.target = self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32)
        return self.target

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._target(), {}

    def step(self, action):
        self.last_action = np.array(action)
        assert self.last_action.shape == (2, 2), self.last_action.shape
        reward = -float(np.sum((self.last_action.reshape(-1) - self.target) ** 2))
        self.t += 1
        return self._target(), reward, False, self.t >= 8, {}


for _name, _bound in (("Target2x2-v0", np.inf), ("Target2x2Bounded-v0", 0.5)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=Target2x2, kwargs={"bound": _bound})
