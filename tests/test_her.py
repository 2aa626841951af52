"""HER: goal extraction on real games, goal wrapper, hand-computed relabelling, importance weights, relabelled samples
in the update, checkpoint round trip, eval.py, config checks."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions.categorical import Categorical

from conftest import run_main
from continual import her
from continual.config.args import Args
from continual.config.loading import parse_args
from continual.envs import goals
from continual.envs.vector import EnvSettings, make_env
from continual.errors import UserError
from continual.training.tracking import read_metrics

torch.set_num_threads(1)  # in-process training: tiny networks, a loaded 2-core machine
THREADS = {"OMP_NUM_THREADS": "1"}
GRID = ["--env_id", "continual/GoalGrid-v0", "--backend", "Gymnasium", "--reward_scaling", "none"]


def goal_env(game: str, backend: str = "HackAtari", **kw) -> gym.Env:
    settings = EnvSettings(env_id=f"ALE/{game}-v5", backend=backend, repeat_action_probability=0.0, noop_max=0,
                           episodic_life=False, her=True, **kw)
    return make_env(settings, 0, "")()


def goal_wrapper(env: gym.Env) -> goals.GoalEnvWrapper:
    while not isinstance(env, goals.GoalEnvWrapper):
        env = env.env
    return env


# --------------------------------------------------------------------------------------------------------------------
# goal extraction on real games
# --------------------------------------------------------------------------------------------------------------------


def test_freeway_height_follows_the_player_chicken_and_the_top_is_a_success():
    env = goal_env("Freeway", game_specific_goals=True)
    try:
        obs, _ = env.reset(seed=0)
        wrapper = goal_wrapper(env)
        assert set(obs) == {"obs", "goal", "achieved"} and obs["obs"].shape == (4, 84, 84)
        assert obs["achieved"].shape == (1,) and obs["achieved"][0] == 0.0  # at the bottom
        wrapper.desired = np.array([1.0], np.float32)  # the top of the road
        generic = goals.PlayerPosition("Freeway")
        ram = env.unwrapped.ale.getRAM()
        y14, y15 = int(ram[14]), int(ram[15])
        heights, pixel_y, scored_at = [float(obs["achieved"][0])], [float(generic.achieved(env)[1])], None
        for t in range(400):
            obs, reward, term, trunc, info = env.step(1)  # UP
            heights.append(float(obs["achieved"][0]))
            pixel_y.append(float(generic.achieved(env)[1]))
            if t == 19:
                ram = env.unwrapped.ale.getRAM()
                assert int(ram[14]) > y14 + 40, "RAM[14] moves with the player chicken"
                assert int(ram[15]) == y15, "RAM[15] is the idle second chicken"
                assert heights[-1] > heights[0] + 0.2 and pixel_y[-1] < pixel_y[0] - 0.15
            if reward > 0:
                scored_at = t
                break
            assert info["her_success"] == (heights[-1] >= 0.95)  # within the tolerance of the top
        assert scored_at is not None, "UP for 400 steps never crossed the road"
        assert heights[-1] == 1.0 and info["her_success"], "the scoring step counts as reaching the top"
        assert float(env.unwrapped.ale.getRAM()[14]) < 20  # the game put the chicken back at the bottom
        assert max(np.diff(heights[:-1])) <= 4 / 171 + 1e-6  # no step can jump over a tolerance window
    finally:
        env.close()


@pytest.mark.parametrize("game", ["Kangaroo", "Frostbite"])
def test_kangaroo_and_frostbite_goals_move_right_with_the_player(game):
    env = goal_env(game, game_specific_goals=True)
    try:
        obs, _ = env.reset(seed=0)
        start = obs["achieved"].copy()
        assert obs["achieved"].shape == (2,) and np.all((0 <= start) & (start <= 1))
        assert round(float(start[1]) * {"Kangaroo": 3, "Frostbite": 4}[game]) == 0  # bottom floor / the shore
        for _ in range(100):
            obs, *_ = env.step(3)  # RIGHT
        assert obs["achieved"][0] > start[0] + 0.1
        space = goal_wrapper(env).space
        same = space.success(obs["achieved"], obs["achieved"], 0.05)
        other_level = space.success(obs["achieved"], obs["achieved"] + np.array([0.0, 0.5], np.float32), 0.05)
        assert same and not other_level
    finally:
        env.close()


def test_generic_goal_from_ocatari_objects():
    env = goal_env("Pong", backend="OCAtari", obs_mode="obj")
    try:
        obs, _ = env.reset(seed=0)
        assert obs["achieved"].shape == (2,) and obs["goal"].shape == (2,)
        for _ in range(5):
            obs, *_ = env.step(0)
        player = next(o for o in env.unwrapped.objects if o.category == "Player")
        np.testing.assert_allclose(obs["achieved"], [player.x / 160, player.y / 210], atol=1e-6)
    finally:
        env.close()


# --------------------------------------------------------------------------------------------------------------------
# goal wrapper on our goal env
# --------------------------------------------------------------------------------------------------------------------


def test_goal_grid_goals_are_sampled_per_episode_and_success_is_exact_reach():
    settings = EnvSettings(env_id="continual/GoalGrid-v0", backend="Gymnasium", her=True, her_tolerance=0.05)
    env = make_env(settings, 0, "")()
    goals = set()
    obs, _ = env.reset(seed=3)
    for _ in range(30):
        goals.add(tuple(obs["goal"]))
        assert not np.array_equal(obs["goal"], obs["achieved"])  # never achieved at the start
        obs, *_ = env.reset()
    assert len(goals) > 20  # a distribution, not a constant
    wrapper = goal_wrapper(env)
    obs, _ = env.reset(seed=4)
    pos = np.round(obs["achieved"] * 14).astype(int)
    target = np.clip(pos + [1, 0], 0, 14)
    if target[0] == pos[0]:
        target = pos - [1, 0]
    wrapper.desired = (target / 14).astype(np.float32)
    action = 4 if target[0] > pos[0] else 3
    obs, reward, term, trunc, info = env.step(0)  # stay: not there
    assert not info["her_success"] and reward == 0.0
    obs, reward, term, trunc, info = env.step(action)
    assert info["her_success"] and reward == 0.0  # the env reward is withheld: the learner adds the goal reward
    for _ in range(48):
        obs, reward, term, trunc, info = env.step(0)
    assert trunc and info["her_episode_success"] == 1.0 and info["her_episode_distance"] == 0.0


# --------------------------------------------------------------------------------------------------------------------
# relabelling by hand
# --------------------------------------------------------------------------------------------------------------------


class FakeAgent(torch.nn.Module):
    """V(x, g) = x + g_x; a uniform policy over two actions unless `goal_logit` makes it depend on the goal."""

    def __init__(self, goal_logit: float = 0.0):
        super().__init__()
        self.goal_logit = goal_logit

    def get_value(self, x, goal=None):
        return (x[:, 0] + goal[:, 0]).unsqueeze(1)

    def get_action_and_value(self, x, action=None, greedy=False, goal=None):
        logits = torch.stack([torch.zeros(len(x)), self.goal_logit * goal[:, 0]], dim=1)
        dist = Categorical(logits=logits)
        action = dist.sample() if action is None else action
        return action, dist.log_prob(action), dist.entropy(), self.get_value(x, goal)


def her_args(**kw) -> Args:
    base = dict(env_id="continual/GoalGrid-v0", backend="Gymnasium", her=True, num_steps=5, num_envs=2,
                her_strategy="final", her_ratio=1.0, her_tolerance=0.05, her_env_reward_weight=0.5,
                her_goal_reward=1.0, her_is_clip=2.0, gamma=0.9, gae_lambda=0.5)
    return dataclasses.replace(Args(), **{**base, **kw})


def goal_space_dict() -> gym.spaces.Dict:
    box = gym.spaces.Box(0, 1, (2,), np.float32)
    return gym.spaces.Dict({"obs": gym.spaces.Box(0, 1, (1,), np.float32), "goal": box, "achieved": box})


def fill_rollout(h: her.HerRollout, agent: FakeAgent):
    """Two envs, 5 steps, 1-D observations obs_t = t / 10. Both: an episode over steps 0-2 with goal (0.9, 0), which
    env 0 ends by a termination and env 1 by a time limit (final observation 0.25), then an episode over steps 3-4
    with goal (0.8, 0) cut by the rollout (next observation 0.5). Achieved after the steps: 0.1, 0.2, 0.3, 0.5, 0.6;
    env rewards 1, 0, 0, 0, 2."""
    T, N = 5, 2
    obs = torch.tensor([[t / 10] for t in range(T)]).repeat(1, N).reshape(T, N, 1)
    dones = torch.zeros(T, N)
    dones[3] = 1.0
    achieved = [0.1, 0.2, 0.3, 0.5, 0.6]
    env_r = [1.0, 0.0, 0.0, 0.0, 2.0]
    actions = torch.zeros(T, N, dtype=torch.long)
    logprobs = torch.zeros(T, N)
    rewards = []
    for t in range(T):
        g = 0.9 if t < 3 else 0.8
        h.goals[t] = torch.tensor([[g, 0.0]] * N)
        _, logprobs[t], _, _ = agent.get_action_and_value(obs[t], actions[t], goal=h.goals[t])
        done = t == 2
        nxt = {"obs": np.zeros((N, 1), np.float32), "goal": np.zeros((N, 2), np.float32),
               "achieved": np.array([[achieved[t], 0.0]] * N, np.float32)}
        infos = {}
        if done:
            nxt["achieved"][:] = 0.0  # the next episode's first observation
            final = {"obs": np.array([0.25], np.float32), "goal": np.array([g, 0], np.float32),
                     "achieved": np.array([achieved[t], 0.0], np.float32)}
            infos = {"final_obs": np.array([final, final], dtype=object)}
        term, trunc = np.array([done, False]), np.array([False, done])
        rewards.append(h.step_rewards(t, np.full(N, env_r[t]), nxt, term, trunc, infos))
        if done:
            h.final_observations(t, np.array([1]), infos)
    return obs, actions, logprobs, dones, torch.tensor([[0.5], [0.5]]), np.array(rewards)


def test_goal_rewards_and_relabelled_targets_match_a_hand_computation():
    agent = FakeAgent()
    h = her.HerRollout(her_args(), goal_space_dict(), torch.device("cpu"), np.random.default_rng(0))
    obs, actions, logprobs, dones, next_obs, rewards = fill_rollout(h, agent)
    # original goals are never reached: r = 0.5 * r_env
    np.testing.assert_allclose(rewards[:, 0], [0.5, 0, 0, 0, 1.0])

    rl = h.relabel(agent, obs, actions, logprobs, dones, next_obs)
    # final strategy: copies (env 0, steps 0-2, g' = 0.3), (env 0, steps 3-4, g' = 0.6), then the same for env 1
    assert rl.src.tolist() == [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]  # t * num_envs + env
    order = {int(s): k for k, s in enumerate(rl.src)}
    np.testing.assert_allclose(rl.goals[[order[t * 2] for t in range(5)], 0], [0.3, 0.3, 0.3, 0.6, 0.6])
    g, lam = 0.9, 0.5
    # env 0, copy 1: r' = [0.5, 0, 0 + 1], V' = obs + g' = [0.3, 0.4, 0.5], terminated -> bootstrap 0
    d2, d1, d0 = 1 - 0.5, 0 + g * 0.5 - 0.4, 0.5 + g * 0.4 - 0.3
    a2 = d2
    a1 = d1 + g * lam * a2
    a0 = d0 + g * lam * a1
    # copy 2: r' = [0, 0.5 * 2 + 1], V' = [0.3 + 0.6, 0.4 + 0.6], rollout cut -> bootstrap V(0.5, 0.6) = 1.1
    d4, d3 = 2 + g * 1.1 - 1.0, 0 + g * 1.0 - 0.9
    a4 = d4
    a3 = d3 + g * lam * a4
    expected_env0 = [a0, a1, a2, a3, a4]
    values0 = [0.3, 0.4, 0.5, 0.9, 1.0]
    got = [float(rl.advantages[order[t * 2]]) for t in range(5)]
    np.testing.assert_allclose(got, expected_env0, rtol=1e-6)
    np.testing.assert_allclose([float(rl.returns[order[t * 2]]) for t in range(5)],
                               np.add(expected_env0, values0), rtol=1e-6)
    # env 1 differs only at step 2: a time limit, bootstrapped from V(final obs 0.25, g' = 0.3) = 0.55
    d2b = 1 + g * 0.55 - 0.5
    a1b = d1 + g * lam * d2b
    a0b = d0 + g * lam * a1b
    got1 = [float(rl.advantages[order[t * 2 + 1]]) for t in range(3)]
    np.testing.assert_allclose(got1, [a0b, a1b, d2b], rtol=1e-6)
    # uniform policy: pi_old(a|s,g') = mu(a|s,g) -> weight 1
    np.testing.assert_allclose(rl.weights.numpy(), 1.0)
    assert rl.goal_rewards == pytest.approx(4 / 10)  # steps 2 and 4 of both envs reach their relabelled goal


def test_future_strategy_copies_end_at_their_goal_and_respect_the_ratio():
    agent = FakeAgent()
    h = her.HerRollout(her_args(her_strategy="future", her_k=3, her_ratio=10.0), goal_space_dict(),
                       torch.device("cpu"), np.random.default_rng(1))
    obs, actions, logprobs, dones, next_obs, _ = fill_rollout(h, agent)
    copies = her.plan_copies(dones.numpy() > 0.5, "future", 3, np.random.default_rng(1))
    assert len(copies) == 3 * 4 and all(s <= j for _, s, j in copies)
    rl = h.relabel(agent, obs, actions, logprobs, dones, next_obs)
    assert len(rl.src) == rl.candidates == sum(j - s + 1 for _, s, j in copies)
    h2 = her.HerRollout(her_args(her_strategy="future", her_k=3, her_ratio=0.5), goal_space_dict(),
                        torch.device("cpu"), np.random.default_rng(1))
    fill = fill_rollout(h2, agent)
    assert len(h2.relabel(agent, *fill[:5]).src) == 5  # round(0.5 * 10)


def test_importance_weights_follow_the_policy_ratio_and_are_clipped():
    w, c = her.importance_weights(np.log([0.8, 0.2, 0.5]), np.log([0.2, 0.8, 0.5]), clip=2.0)
    np.testing.assert_allclose(w, [2.0, 0.25, 1.0])
    np.testing.assert_allclose(c, [1.0, 0.25, 1.0])
    # a goal-dependent policy: relabelling towards a goal the policy prefers less gives weights < 1
    agent = FakeAgent(goal_logit=3.0)
    h = her.HerRollout(her_args(), goal_space_dict(), torch.device("cpu"), np.random.default_rng(0))
    obs, actions, logprobs, dones, next_obs, _ = fill_rollout(h, agent)
    rl = h.relabel(agent, obs, actions, logprobs, dones, next_obs)
    # action 0 with logits [0, 3 g]: pi(0|g) = 1 / (1 + e^{3g}); rho = pi(0|g') / pi(0|g) > 1 as g' < g
    t0 = int((rl.src == 0).nonzero())
    rho = (1 + math.exp(2.7)) / (1 + math.exp(0.9))
    assert float(rl.weights[t0]) == pytest.approx(min(rho, 2.0), rel=1e-5)


def test_importance_weights_are_one_when_the_relabelled_goal_is_the_original():
    from agents.ppo import Agent

    torch.manual_seed(0)
    agent = Agent((1,), 5, goal_dim=2)
    h = her.HerRollout(her_args(her_strategy="future", her_k=2), goal_space_dict(), torch.device("cpu"),
                       np.random.default_rng(0))
    T, N = 5, 2
    obs = torch.rand(T, N, 1)
    goal = torch.tensor([0.4, 0.7])
    actions, logprobs = torch.zeros(T, N, dtype=torch.long), torch.zeros(T, N)
    for t in range(T):
        h.goals[t] = goal.repeat(N, 1)
        with torch.no_grad():
            actions[t], logprobs[t], _, _ = agent.get_action_and_value(obs[t], goal=h.goals[t])
        achieved = np.tile(goal.numpy(), (N, 1))  # every step achieves the desired goal: g' = g
        h.step_rewards(t, np.zeros(N), {"achieved": achieved}, np.zeros(N, bool), np.zeros(N, bool), {})
    rl = h.relabel(agent, obs, actions, logprobs, torch.zeros(T, N), torch.rand(N, 1))
    assert len(rl.weights) > 0
    np.testing.assert_allclose(rl.weights.numpy(), 1.0, atol=1e-5)
    np.testing.assert_allclose(rl.goals.numpy(), np.tile(goal.numpy(), (len(rl.goals), 1)))


# --------------------------------------------------------------------------------------------------------------------
# training, checkpoints, eval.py
# --------------------------------------------------------------------------------------------------------------------


def train_grid(tmp_path, name: str, *extra: str, architecture: str = "PPO") -> str:
    import importlib

    module = importlib.import_module({"PPO": "agents.ppo", "PPO_CBP": "agents.ppo_cbp"}[architecture])
    argv = [*GRID, "--her", "--num_envs", "2", "--num_steps", "32", "--num_minibatches", "2", "--update_epochs", "2",
            "--total_timesteps", "128", "--runs_dir", str(tmp_path), "--run_name", name, "--no-progress-bar", *extra]
    return module.main(argv)


def iterations(run_dir: str) -> list[dict]:
    return [r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "iteration"]


def test_relabelled_samples_enter_every_epoch_of_the_update(tmp_path):
    run_dir = train_grid(tmp_path, "final", "--her_strategy", "final", "--her_ratio", "1")
    its = iterations(run_dir)
    assert len(its) == 2
    for r in its:
        # final strategy, ratio 1: one relabelled sample per original (64), each drawn once per epoch (2 epochs)
        assert r["her/relabelled_fraction"] == 0.5
        assert r["her/relabelled_trained"] == 2 * 64
        assert 0 < r["her/is_weight_mean"] <= 1.0
        assert r["her/relabelled_reward_rate"] > 0  # every copy reaches its own goal at its end
    tags = set().union(*its)
    for tag in ("her/step_success", "her/relabelled_fraction"):
        assert tag in tags
    no_her = iterations(train_grid(tmp_path, "ratio0", "--her_ratio", "0"))
    assert all(r["her/relabelled_trained"] == 0 and "her/relabelled_fraction" not in r for r in no_her)


def test_episode_success_is_logged_per_regime(tmp_path):
    run_dir = train_grid(tmp_path, "regimes", "--num_steps", "64", "--total_timesteps", "256")
    its = iterations(run_dir)
    assert any("her/success_rate" in r for r in its)
    r = next(r for r in its if "her/success_rate" in r)
    assert r["her/success_rate_by_modif/no_modif"] == r["her/success_rate"]
    assert 0 <= r["her/goal_distance"] <= 1


def test_her_with_ppo_cbp_trains_and_checkpoints_round_trip(tmp_path):
    import eval as eval_script
    from continual.config.loading import args_from_dict
    from continual.training.checkpoint import load_checkpoint

    run_dir = train_grid(tmp_path, "cbp", architecture="PPO_CBP")
    state = load_checkpoint(run_dir)
    assert state["architecture"] == "PPO_CBP" and state["goal_dim"] == 2 and state["args"]["her"]
    settings = EnvSettings.from_args(args_from_dict(state["args"]))
    env = make_env(settings, 0, "")()
    agent = eval_script.load_policy(state, env.observation_space, 5, torch.device("cpu"))
    for k, v in state["model"].items():
        assert torch.equal(agent.state_dict()[k], v), k
    assert agent.goal_dim == 2
    x, g = torch.rand(3, 2), torch.rand(3, 2)
    a1 = agent.get_action_and_value(x, goal=g, greedy=True)
    a2 = agent.get_action_and_value(x, goal=g, greedy=True)
    assert torch.equal(a1[0], a2[0]) and torch.allclose(a1[3], a2[3])


def test_eval_reports_success_rate_and_return_for_her_agents(tmp_path):
    run_dir = train_grid(tmp_path, "evalme")
    out = str(tmp_path / "ev")
    proc = run_main("eval.py", "--agent_path", run_dir, "--eval_episodes", "4", "--modifs", "", "slip=0.3",
                    "--output", out)
    assert "success_rate" in proc.stdout
    result = json.load(open(out + ".json"))
    assert result["her"] == {"game_specific_goals": False, "tolerance": 0.05}
    rows = {r["modification"]: r for r in result["results"]}
    assert set(rows) == {"", "slip=0.3"}
    for r in rows.values():
        assert r["episodes"] == 4 and 0.0 <= r["success_rate"] <= 1.0 and 0.0 <= r["goal_distance"] <= 1.0
        assert r["mean"] == 0.0 and r["mean_length"] == 50  # the env reward is withheld; 50-step episodes


def test_agents_without_her_are_unchanged():
    from agents.ppo import Agent

    agent = Agent((4,), 2)
    assert agent.goal_dim == 0
    x = torch.rand(3, 4)
    action, logp, ent, value = agent.get_action_and_value(x)
    assert action.shape == (3,) and value.shape == (3, 1)
    with pytest.raises(ValueError, match="not goal-conditioned"):
        agent.get_action_and_value(x, goal=torch.zeros(3, 2))
    pixel = Agent((4, 84, 84), 3, obs_scale=1 / 255, goal_dim=1)
    out = pixel.get_action_and_value(torch.zeros(2, 4, 84, 84, dtype=torch.uint8), goal=torch.ones(2, 1))
    assert out[3].shape == (2, 1)


@pytest.mark.parametrize("argv, message", [
    (["--env_id", "CartPole-v1", "--backend", "Gymnasium", "--her"], "her needs an Atari game"),
    (["--env_id", "ALE/Pong-v5", "--her", "--game_specific_goals"], "no goal space for Pong"),
    (["--her", "--architecture", "IMPALA", "--num_envs", "2"], "supported by PPO and PPO_CBP"),
    (["--game_specific_goals"], "only used with --her"),
    (["--her", "--her_is_clip", "0"], "her_is_clip"),
    (["--her", "--her_ratio", "-1"], "her_ratio"),
])
def test_bad_her_flags_are_one_line_errors(argv, message):
    with pytest.raises(UserError, match=message):
        parse_args(argv)


def test_continual_evaluation_of_her_agents_reports_success_rate(tmp_path):
    from continual.evaluation.continual import read_eval_table

    run_dir = train_grid(tmp_path, "ceval", "--eval_every", "64", "--eval_episodes", "2", "--no-metrics")
    rows = read_eval_table(os.path.join(run_dir, "eval_table.csv"))
    assert sorted({r["step"] for r in rows}) == [0, 64, 128]
    for r in rows:
        assert r["episodes"] == 2 and 0.0 <= r["success_rate"] <= 1.0 and r["success_rate"] in (0.0, 0.5, 1.0)
    evals = [r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "eval"]
    assert len(evals) == len(rows) and all("success_rate" in r for r in evals)
