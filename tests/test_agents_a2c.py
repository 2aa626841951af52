"""agents/a2c.py: n-step returns and GAE against hand computation and a float64 reference, the update's loss against
a hand-written A2C loss, exact resume from a switch checkpoint with continual evaluation, flag validation, and (slow)
learning CartPole."""

from __future__ import annotations

import csv
import glob
import json
import os
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch

import eval as eval_script
from agents import a2c
from conftest import ROOT, assert_resume_matches, run_script, write_config
from continual.config.loading import args_from_dict
from continual.training.startup import seed_everything
from continual.training.tracking import read_metrics
from helpers import corridor_envs  # noqa: F401  (registers Corridor-v0)


def test_n_step_returns_by_hand():
    # one env, 3 steps; dones[2] = 1: obs[2] starts a new episode, so the first episode ends after step 1
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.full((3, 1), 0.5)
    dones = torch.tensor([[0.0], [0.0], [1.0]])
    adv, ret = a2c.gae(rewards, values, dones, torch.tensor([10.0]), torch.tensor([0.0]),
                                          gamma=0.9, gae_lambda=1.0)
    assert ret.flatten().tolist() == pytest.approx([1 + 0.9 * 2, 2.0, 3 + 0.9 * 10])
    assert adv.flatten().tolist() == pytest.approx([2.3, 1.5, 11.5])
    # the rollout's last step was terminal: nothing is bootstrapped
    _, ret = a2c.gae(rewards, values, dones, torch.tensor([10.0]), torch.tensor([1.0]), 0.9, 1.0)
    assert ret.flatten().tolist() == pytest.approx([2.8, 2.0, 3.0])


@pytest.mark.parametrize("lam", [1.0, 0.95, 0.0])
def test_gae_matches_a_float64_sum_of_discounted_td_errors(lam):
    g = torch.Generator().manual_seed(1)
    T, N, gamma = 7, 3, 0.97
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.3).float()
    next_value, next_done = torch.randn(N, generator=g), (torch.rand(N, generator=g) < 0.3).float()
    adv, ret = a2c.gae(rewards, values, dones, next_value, next_done, gamma, lam)
    r, v, d = rewards.double().numpy(), values.double().numpy(), dones.double().numpy()
    v_next = np.vstack([v[1:], next_value.double().numpy()[None]])
    d_next = np.vstack([d[1:], next_done.double().numpy()[None]])
    for n in range(N):
        for t in range(T):
            # A_t = sum_l (gamma lam)^l delta_{t+l}, stopping after the step that ends the episode
            total, weight = 0.0, 1.0
            for u in range(t, T):
                delta = r[u, n] + gamma * v_next[u, n] * (1 - d_next[u, n]) - v[u, n]
                total += weight * delta
                if d_next[u, n]:
                    break
                weight *= gamma * lam
            assert float(adv[t, n]) == pytest.approx(total, abs=1e-5)
    assert torch.allclose(ret, adv + values)


# --- runs ---------------------------------------------------------------------------------------------------------
CORRIDOR = {
    "env_id": "helpers.corridor_envs:Corridor-v0", "backend": "Gymnasium", "num_envs": 4, "num_steps": 5,
    "reward_scaling": "none", "learning_rate": 7e-4, "rmsprop_eps": 1e-5, "gae_lambda": 1.0, "norm_adv": False,
    "vf_coef": 0.5,  # the loss below is written with 0.5 (A2C's own default is baselines' 0.25)
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": 1200, "modifications": ["", "goal=3", "goal=6"],
                                    "switching_thresholds": [400, 800]},
}


def _train(tmp_path, *flags: str, name: str = "full") -> str:
    cfg = write_config(tmp_path, CORRIDOR, f"{name}.json")
    runs = str(tmp_path / "runs")
    a2c.main(["--config", str(cfg), "--runs_dir", runs, "--run_name", name, "--no-progress-bar", "--no-cuda",
              "--checkpoint_minutes", "0", "--no-metrics", *flags])
    return os.path.join(runs, name)


def test_one_update_is_the_a2c_loss_step(tmp_path):
    """The first iteration's weights equal one RMSprop step, from the initial weights, on
    pg + vf_coef * mse - ent_coef * entropy computed by hand from the logged rollout (a 1-iteration run)."""
    data = {**CORRIDOR, "modification_factory_kwargs": {**CORRIDOR["modification_factory_kwargs"],
                                                         "num_total_steps": 20, "switching_thresholds": []},
            "modification_factory": "SequentialModificationFactory"}
    data["modification_factory_kwargs"]["modifications"] = [""]
    cfg = write_config(tmp_path, data, "one.json")
    captured = {}
    orig = a2c.gae

    def spy(rewards, values, dones, next_value, next_done, gamma, lam):
        captured.update(rewards=rewards.clone(), dones=dones.clone(), next_done=next_done.clone())
        return orig(rewards, values, dones, next_value, next_done, gamma, lam)

    a2c.gae = spy
    try:
        run = a2c.main(["--config", str(cfg), "--runs_dir", str(tmp_path / "runs"), "--run_name", "one",
                        "--no-progress-bar", "--no-cuda", "--checkpoint_minutes", "0", "--no-metrics",
                        "--no-anneal-lr", "--ent_coef", "0.01"])
    finally:
        a2c.gae = orig
    final = torch.load(glob.glob(os.path.join(run, "checkpoints", "final__*"))[0], weights_only=True)
    assert captured["rewards"].shape == (5, 4)
    # the same initial network and the same actions: rebuild both from the seed
    args = args_from_dict(final["args"])
    seed_everything(args.seed, True)
    agent = a2c.make_agent(gym.spaces.Box(0.0, 1.0, (8,), np.float32), gym.spaces.Discrete(2), args)
    assert not any(torch.equal(p, final["model"][n]) for n, p in agent.named_parameters())
    # replay the rollout: Corridor is deterministic, actions come from the same torch stream
    env = corridor_envs.Corridor()
    obs = np.stack([env.reset()[0] for _ in range(4)])
    cells = np.zeros(4, int)
    obs_l, act_l, rew_l, val_l, done_l = [], [], [], [], []
    done = np.zeros(4)
    for _ in range(5):
        x = torch.as_tensor(obs)
        with torch.no_grad():
            action, _, _, value = agent.get_action_and_value(x)
        obs_l.append(x)
        act_l.append(action)
        val_l.append(value.flatten())
        done_l.append(torch.tensor(done))
        new_obs, rew, done = [], [], np.zeros(4)
        for i in range(4):
            cells[i] = min(max(cells[i] + (1 if int(action[i]) == 1 else -1), 0), 7)
            reached = cells[i] == 5
            rew.append(1.0 if reached else -0.01)
            if reached:
                cells[i], done[i] = 0, 1.0
            o = np.zeros(8, np.float32)
            o[cells[i]] = 1.0
            new_obs.append(o)
        rew_l.append(torch.tensor(rew))
        obs = np.stack(new_obs)
    rewards = torch.stack(rew_l).float()
    assert torch.allclose(rewards, captured["rewards"])
    with torch.no_grad():
        next_value = agent.get_value(torch.as_tensor(obs)).flatten()
    # n-step returns by a plain loop (gamma 0.99), then the A2C loss by hand
    R = next_value.clone() * (1 - torch.tensor(done).float())
    returns = torch.zeros(5, 4)
    dones = torch.stack(done_l).float()
    for t in reversed(range(5)):
        R = rewards[t] + 0.99 * R
        returns[t] = R
        R = R * (1 - dones[t])
    adv = (returns - torch.stack(val_l)).reshape(-1)
    logits = agent.actor(agent.features(torch.cat(obs_l)))
    dist = torch.distributions.Categorical(logits=logits)
    value = agent.critic(agent.features(torch.cat(obs_l))).flatten()
    loss = -(adv * dist.log_prob(torch.cat(act_l))).mean() + 0.5 * ((value - returns.reshape(-1)) ** 2).mean() \
        - 0.01 * dist.entropy().mean()
    opt = torch.optim.RMSprop(agent.parameters(), lr=7e-4, alpha=0.99, eps=1e-5)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
    opt.step()
    for n, p in agent.named_parameters():
        assert torch.allclose(p, final["model"][n], atol=1e-6), n


def test_resume_from_a_switch_checkpoint_equals_the_uninterrupted_run(tmp_path):
    full = _train(tmp_path, "--save_agent_with_switch", "--shrink_and_perturb", "--eval_every", "600",
                  "--eval_episodes", "2")
    switch = glob.glob(os.path.join(full, "checkpoints", "switch__*step800.cleanrl_model"))
    assert len(switch) == 1, os.listdir(os.path.join(full, "checkpoints"))
    cut = str(tmp_path / "runs" / "cut")
    shutil.copytree(full, cut)
    for f in glob.glob(os.path.join(cut, "checkpoints", "*")):
        if "step800" not in f:
            os.unlink(f)
    a2c.main(["--resume", switch[0].replace(full, cut), "--no-progress-bar"])
    assert_resume_matches(full, cut, "final__step1200.cleanrl_model", 800)
    rows = list(csv.DictReader(open(os.path.join(full, "eval_table.csv"))))
    assert {int(r["step"]) for r in rows} == {0, 600, 1200} and len(rows) == 9
    out = str(tmp_path / "ev")  # eval.py rebuilds the A2C agent from the checkpoint
    assert [r["episodes"] for r in eval_script.main(["--agent_path", cut, "--modifs", "goal=6", "--eval_episodes", "2",
                                                     "--output", out, "--no-progress-bar"])] == [2]
    assert json.load(open(out + ".json"))["architecture"] == "A2C"
    final_rows = [(r["modification"], r["mean"]) for r in rows if r["step"] == "1200"]
    assert final_rows == [(r["modification"], r["mean"]) for r in csv.DictReader(open(os.path.join(cut, "eval_table.csv")))
                          if r["step"] == "1200"]


def test_dqn_only_flags_are_refused_for_a2c(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        a2c.main(["--backend", "Gymnasium", "--env_id", "CartPole-v1", "--runs_dir", str(tmp_path / "runs"),
                  "--reset_replay_on_switch"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: reset_replay_on_switch: only used with --architecture DQN, not A2C\n"


@pytest.mark.slow
def test_a2c_learns_cartpole(tmp_path):
    """Learning check: A2C (configs/a2c_cartpole.json's values) reaches a mean return >= 195 over its last 20 games
    within 300k steps on CartPole (fixed seed; A2C is much slower than PPO here)."""
    cfg = json.load(open(os.path.join(ROOT, "configs", "a2c_cartpole.json")))
    for k in ("modification_factory", "modification_factory_kwargs"):
        cfg.pop(k, None)
    path = write_config(tmp_path, cfg, "cfg.json")
    runs = str(tmp_path / "runs")
    run_script("agents/a2c.py", "--config", str(path), "--total_timesteps", "300000", "--seed", "1",
               "--runs_dir", runs, "--no-progress-bar")
    run = glob.glob(os.path.join(runs, "*"))[0]
    returns = [r["return"] for r in read_metrics(os.path.join(run, "metrics.jsonl")) if r["kind"] == "episode"]
    assert np.mean(returns[-20:]) >= 195, returns[-20:]
