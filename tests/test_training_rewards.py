"""continual.training.rewards: the shared-memory row of a reward scaler (state_to_row / state_from_row), the one
packing IMPALA's actors, learner and checkpoints use, against a float64 re-implementation of the scaler."""

from __future__ import annotations

import numpy as np
import pytest

from continual.training.rewards import RewardScaler, state_from_row, state_to_row


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


@pytest.mark.parametrize("mode", ["clip", "none", "normalize"])
def test_the_row_keeps_the_mode_given(mode):
    scaler = RewardScaler(mode, 2, 0.99)
    assert state_from_row(state_to_row(scaler.state_dict()), mode)["mode"] == mode
