"""Training-reward scaling done in the learner, so env statistics stay raw and the state survives switches and
checkpoints (the reference restarted its normaliser at every switch).

- clip: sign(r), CleanRL's Atari choice;
- normalize: r / sqrt(var(discounted return) + eps), running statistics over all envs (as gymnasium NormalizeReward);
- none: unchanged;
- zero: every reward 0, a control (the learner's view of a game it never scores in; episode statistics stay raw).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


class RewardScaler:
    def __init__(self, mode: str, num_envs: int, gamma: float, epsilon: float = 1e-8):
        # None: --reward_scaling left to its default before startup resolved it (Args built by hand): clip
        self.mode, self.gamma, self.epsilon = mode or "clip", gamma, epsilon
        self.returns = np.zeros(num_envs)
        self.count, self.mean, self.var = 1e-4, 0.0, 1.0

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        reward = np.asarray(reward, dtype=np.float64)
        if self.mode == "clip":
            return np.sign(reward).astype(np.float32)
        if self.mode == "none":
            return reward.astype(np.float32)
        if self.mode == "zero":
            return np.zeros(reward.shape, dtype=np.float32)
        self.returns = self.returns * self.gamma + reward
        self._update(self.returns)
        self.returns[np.asarray(done, dtype=bool)] = 0.0
        return (reward / np.sqrt(self.var + self.epsilon)).astype(np.float32)

    def _update(self, x: np.ndarray) -> None:
        # parallel (Chan et al.) update of mean/variance with a batch
        b_mean, b_var, b_count = float(x.mean()), float(x.var()), x.size
        delta, total = b_mean - self.mean, self.count + b_count
        self.mean += delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var, self.count = m2 / total, total

    def episodes_cut(self) -> None:
        """A switch resets every env: the discounted returns start again."""
        self.returns[:] = 0.0

    def state_dict(self) -> dict:
        return {"mode": self.mode, "returns": self.returns.tolist(), "count": self.count, "mean": self.mean,
                "var": self.var}

    def load_state_dict(self, state: dict) -> None:
        self.returns = np.asarray(state["returns"], dtype=np.float64)
        self.count, self.mean, self.var = state["count"], state["mean"], state["var"]


# An IMPALA actor's scaler travels to the learner (and back from a checkpoint) as one float64 row of shared memory.
def state_to_row(state: dict) -> list[float]:
    """[count, mean, var, *returns] of a `RewardScaler.state_dict()`."""
    return [state["count"], state["mean"], state["var"], *state["returns"]]


def state_from_row(row: Sequence[float], mode: str) -> Optional[dict]:
    """The state dict of a row written by `state_to_row`; None for a row never written (count 0)."""
    row = [float(x) for x in row]
    if row[0] <= 0:
        return None
    return {"mode": mode, "count": row[0], "mean": row[1], "var": row[2], "returns": row[3:]}
