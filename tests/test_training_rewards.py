"""RewardScaler (continual/training/rewards.py) against Stable-Baselines3's VecNormalize, the reference for reward
normalisation by the running std of the discounted return, on the same reward and episode-end stream."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from continual.training.rewards import RewardScaler

NUM_ENVS, STEPS, GAMMA = 4, 600, 0.97


class ScriptedRewards(gym.Env):
    """Rewards and episode ends drawn from a seeded stream (heavy-tailed rewards, episodes of random length)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        reward = float(self.rng.standard_t(3) * 5 + 1)
        return np.zeros(1, np.float32), reward, bool(self.rng.random() < 0.03), False, {}


def stream(seed: int = 0):
    """(raw rewards, dones, SB3-normalised rewards) per step, from VecNormalize on the scripted envs."""
    venv = DummyVecEnv([lambda i=i: ScriptedRewards(seed * 100 + i) for i in range(NUM_ENVS)])
    norm = VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=GAMMA, epsilon=1e-8, clip_reward=np.inf)
    norm.reset()
    out = []
    for _ in range(STEPS):
        _, scaled, dones, _ = norm.step(np.zeros(NUM_ENVS, dtype=np.int64))
        out.append((norm.get_original_reward().copy(), dones.copy(), scaled.copy()))
    return out


def test_normalize_matches_sb3_vecnormalize():
    scaler = RewardScaler("normalize", NUM_ENVS, GAMMA)
    data = stream()
    assert sum(d.sum() for _, d, _ in data) > 20  # many episode ends inside the stream
    for raw, dones, reference in data:
        np.testing.assert_allclose(scaler(raw, dones), reference, rtol=2e-6, atol=1e-6)


def test_state_dict_resumes_the_same_stream():
    data = stream(seed=1)
    whole = RewardScaler("normalize", NUM_ENVS, GAMMA)
    first = RewardScaler("normalize", NUM_ENVS, GAMMA)
    for raw, dones, _ in data[:250]:
        whole(raw, dones)
        first(raw, dones)
    resumed = RewardScaler("normalize", NUM_ENVS, GAMMA)
    resumed.load_state_dict(first.state_dict())
    for raw, dones, _ in data[250:]:
        np.testing.assert_array_equal(resumed(raw, dones), whole(raw, dones))


def test_episodes_cut_restarts_the_discounted_returns():
    scaler = RewardScaler("normalize", 2, 0.5)
    scaler(np.array([4.0, 4.0]), np.array([False, False]))
    scaler.episodes_cut()
    np.testing.assert_array_equal(scaler.returns, [0.0, 0.0])
    scaler(np.array([2.0, 0.0]), np.array([False, False]))
    np.testing.assert_array_equal(scaler.returns, [2.0, 0.0])  # not 0.5 * 4 + 2


@pytest.mark.parametrize("mode, expected", [("clip", [-1.0, 0.0, 1.0, 1.0]), ("none", [-2.5, 0.0, 0.25, 7.0])])
def test_clip_and_none(mode, expected):
    scaler = RewardScaler(mode, 4, 0.99)
    out = scaler(np.array([-2.5, 0.0, 0.25, 7.0]), np.zeros(4, bool))
    assert out.dtype == np.float32 and out.tolist() == expected
