"""Environments that misbehave on purpose, for fault-injection tests (`--env_id helpers.fault_envs:NanReward-v0` with tests/ on
PYTHONPATH), and a slow one."""

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


class SlowCartPole(CartPoleEnv):
    """CartPole whose steps take `delay` seconds more (sleeping: a slow env that leaves the CPU to others)."""

    def __init__(self, delay: float = 0.005, **kwargs):
        super().__init__(**kwargs)
        self.delay = delay

    def step(self, action):
        import time

        time.sleep(self.delay)
        return super().step(action)


if "SlowCartPole-v0" not in gym.registry:
    gym.register("SlowCartPole-v0", entry_point=SlowCartPole, max_episode_steps=500)
