"""RewardScaler (continual/training/rewards.py) against Stable-Baselines3's VecNormalize, the reference for reward
normalisation by the running std of the discounted return, on the same reward and episode-end stream."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from continual.training.rewards import RewardScaler, state_from_row, state_to_row

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


@pytest.mark.parametrize("mode, expected", [("clip", [-1.0, 0.0, 1.0, 1.0]), ("none", [-2.5, 0.0, 0.25, 7.0]),
                                            ("zero", [0.0, 0.0, 0.0, 0.0])])
def test_clip_none_and_zero(mode, expected):
    scaler = RewardScaler(mode, 4, 0.99)
    out = scaler(np.array([-2.5, 0.0, 0.25, 7.0]), np.zeros(4, bool))
    assert out.dtype == np.float32 and out.tolist() == expected


# --- the shared-memory row of IMPALA's actors (state_to_row / state_from_row), against a float64 re-implementation ---
def _reference(rewards: np.ndarray, dones: np.ndarray, gamma: float, eps: float = 1e-8) -> np.ndarray:
    """r / sqrt(var(all discounted returns so far) + eps), the statistics over every env and step (count prior 1e-4,
    mean 0, var 1, as gymnasium's RunningMeanStd), computed from scratch at each step."""
    ret = np.zeros(rewards.shape[1])
    seen: list[np.ndarray] = []
    out = []
    for r, d in zip(rewards, dones):
        ret = ret * gamma + r
        seen.append(ret.copy())
        x = np.concatenate(seen)
        prior = 1e-4
        # pooled variance of the prior (mean 0, var 1, weight 1e-4) and the data
        m2 = prior * 1.0 + ((x - x.mean()) ** 2).sum() + x.mean() ** 2 * prior * x.size / (prior + x.size)
        var = m2 / (prior + x.size)
        out.append(r / np.sqrt(var + eps))
        ret[d] = 0.0
    return np.array(out)


def test_a_scaler_survives_the_row_and_continues_as_the_reference():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(40, 3))
    dones = rng.random((40, 3)) < 0.1
    ref = _reference(rewards, dones, 0.9)
    scaler = RewardScaler("normalize", 3, 0.9)
    out = [scaler(rewards[t], dones[t]) for t in range(20)]
    row = state_to_row(scaler.state_dict())
    assert len(row) == 3 + 3
    resumed = RewardScaler("normalize", 3, 0.9)
    state = state_from_row(np.asarray(row, dtype=np.float64), "normalize")
    assert state == scaler.state_dict()
    resumed.load_state_dict(state)
    out += [resumed(rewards[t], dones[t]) for t in range(20, 40)]
    np.testing.assert_allclose(np.array(out), ref, rtol=1e-5)


def test_a_row_never_written_is_none():
    assert state_from_row([0.0] * 5, "normalize") is None


@pytest.mark.parametrize("mode", ["clip", "none", "normalize", "zero"])
def test_the_row_keeps_the_mode_given(mode):
    scaler = RewardScaler(mode, 2, 0.99)
    assert state_from_row(state_to_row(scaler.state_dict()), mode)["mode"] == mode


def test_a_run_with_zero_rewards_learns_from_none_and_logs_the_games_scores(tmp_path):
    """--reward_scaling zero: PPO on MinAtar Breakout, where a random policy breaks bricks. The learner's rewards are
    0, so its value loss falls towards 0 (1e-4 after 8 updates; with clipped rewards ~0.1), while the episode
    statistics keep the game's scores."""
    from continual.training.tracking import read_metrics
    from continual_training_example import main

    losses = {}
    for mode in ("zero", "clip"):
        main(["--architecture", "PPO", "--env_id", "MinAtar/Breakout-v1", "--backend", "MinAtar", "--num_envs", "8",
              "--num_steps", "128", "--total_timesteps", "8192", "--seed", "1", "--reward_scaling", mode,
              "--runs_dir", str(tmp_path), "--run_name", mode, "--no-progress-bar"])
        records = read_metrics(os.path.join(tmp_path, mode, "metrics.jsonl"))
        assert any(r["return"] > 0 for r in records if r["kind"] == "episode")
        losses[mode] = [r["losses/value_loss"] for r in records if r["kind"] == "iteration"][-1]
    assert losses["zero"] < 1e-3 and losses["clip"] > 1e-2, losses
