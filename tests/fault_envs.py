"""Environments that misbehave on purpose, for fault-injection tests (`--env_id fault_envs:NanReward-v0` with tests/ on PYTHONPATH)."""

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class NanRewardCartPole(CartPoleEnv):
    """CartPole whose reward becomes NaN after `after` steps in total."""

    def __init__(self, after: int = 300, **kwargs):
        super().__init__(**kwargs)
        self.after, self.count = after, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.count += 1
        return obs, float("nan") if self.count > self.after else reward, terminated, truncated, info


if "NanReward-v0" not in gym.registry:
    gym.register("NanReward-v0", entry_point=NanRewardCartPole, max_episode_steps=500)
