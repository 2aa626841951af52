"""The one episode loop (continual/evaluation/episodes.py): every env plays its quota of whole episodes, the returns
are those a plain gymnasium loop over the same seeds gets, and goal envs add success and closest distance."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from continual.config.args import Args
from continual.envs.vector import EnvSettings, make_vector_env
from continual.evaluation.episodes import evaluate

CPU = torch.device("cpu")


def left(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(len(x), dtype=torch.int64)


def reference_returns(seed: int, num_envs: int, episodes: int) -> list[float]:
    """Plain gymnasium: env i reset with seed + i once, then played until its quota is done."""
    out = []
    for i in range(num_envs):
        quota = -(-episodes // num_envs) - (1 if i >= episodes % num_envs and episodes % num_envs else 0)
        env = gym.make("CartPole-v1")
        env.reset(seed=seed + i)
        ret = 0.0
        while quota:
            _, r, term, trunc, _ = env.step(0)
            ret += r
            if term or trunc:
                out.append(ret)
                ret, quota = 0.0, quota - 1
                env.reset()
        env.close()
    return out


def test_quotas_and_returns_match_a_plain_gymnasium_loop():
    args = Args(env_id="CartPole-v1", backend="Gymnasium")
    envs = make_vector_env(EnvSettings.from_args(args, episodic_life=False), 3, "", "sync")
    try:
        counted = []
        result = evaluate(left, envs, 7, CPU, seed=11, on_episode=lambda: counted.append(1))
    finally:
        envs.close()
    assert len(result.returns) == 7 == len(counted)  # quotas 3, 2, 2
    assert sorted(result.returns) == sorted(reference_returns(11, 3, 7))
    assert result.lengths == [int(r) for r in result.returns]
    row = result.row()
    assert row["episodes"] == 7 and "success_rate" not in row and "action_share" not in row
    assert row["mean"] == np.mean(result.returns)


def test_action_shares_are_a_plain_loops_tally_over_the_counted_games():
    # count_actions (eval.py --action_shares): each action's share of the steps of the games the result counts, as a
    # plain gymnasium loop over the same seeds tallies them (env 0 plays one game more than the others)
    def lean(x: torch.Tensor) -> torch.Tensor:  # push towards the pole's lean
        return (x[:, 2] > 0).long()
    args = Args(env_id="CartPole-v1", backend="Gymnasium")
    envs = make_vector_env(EnvSettings.from_args(args, episodic_life=False), 3, "", "sync")
    try:
        result = evaluate(lean, envs, 7, CPU, seed=5, count_actions=True)
    finally:
        envs.close()
    tally = np.zeros(2, dtype=np.int64)
    for i in range(3):
        quota = -(-7 // 3) - (1 if i >= 7 % 3 else 0)
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=5 + i)
        while quota:
            a = int(obs[2] > 0)
            tally[a] += 1
            obs, _, term, trunc, _ = env.step(a)
            if term or trunc:
                quota -= 1
                obs, _ = env.reset()
        env.close()
    assert result.action_counts == tally.tolist() and sum(tally) == sum(result.lengths)
    assert result.row()["action_share"] == [c / tally.sum() for c in tally]


def goal_envs(num_envs: int = 2):
    args = Args(env_id="continual/GoalGrid-v0", backend="Gymnasium", her=True, her_tolerance=0.01)
    return make_vector_env(EnvSettings.from_args(args, episodic_life=False), num_envs, "", "sync")


def oracle(x: torch.Tensor, goals: torch.Tensor) -> torch.Tensor:
    """Walks straight to the goal on the 15 x 15 grid (x first, then y); reaches any goal within 28 of 50 steps."""
    d = goals - x
    eps = 0.5 / 14
    a = torch.zeros(len(x), dtype=torch.int64)
    a = torch.where(d[:, 1] > eps, 1, torch.where(d[:, 1] < -eps, 2, a))
    return torch.where(d[:, 0] > eps, 4, torch.where(d[:, 0] < -eps, 3, a))


def test_goal_env_rows_have_success_and_distance():
    envs = goal_envs()
    try:
        reached = evaluate(oracle, envs, 6, CPU, seed=3).row()
        idle = evaluate(lambda x, g: torch.zeros(len(x), dtype=torch.int64), envs, 6, CPU, seed=3).row()
    finally:
        envs.close()
    assert reached["episodes"] == 6 and reached["success_rate"] == 1.0 and reached["goal_distance"] == 0.0
    # standing still never reaches a goal (a goal achieved at the start is drawn again)
    assert idle["success_rate"] == 0.0 and idle["goal_distance"] > 0.0


def test_rows_say_whether_games_were_capped():
    """A row names the envs' step cap (None: whole games) and how many games it cut short; a game the env itself
    ends (CartPole's pole falling) is not counted."""
    args = Args(env_id="CartPole-v1", backend="Gymnasium")
    capped = make_vector_env(EnvSettings.from_args(args, episodic_life=False, max_episode_steps=5), 2, "", "sync")
    whole = make_vector_env(EnvSettings.from_args(args, episodic_life=False), 2, "", "sync")
    try:
        cut = evaluate(left, capped, 4, CPU, seed=11).row()  # pushing left, the pole falls after 8-10 steps
        full = evaluate(left, whole, 4, CPU, seed=11).row()
    finally:
        capped.close()
        whole.close()
    assert (cut["max_episode_steps"], cut["capped"], cut["mean_length"]) == (5, 4, 5.0)
    assert full["max_episode_steps"] is None and full["capped"] == 0 and full["mean_length"] > 5
