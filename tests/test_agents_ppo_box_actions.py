"""Box action spaces: PPO's Gaussian head (CleanRL ppo_continuous_action) against the Normal density in float64, the
env-side clipping/flattening, a Pendulum curriculum run (switch, checkpoint, resume, continual evaluation, eval.py),
learning checks, and the refusal of Box actions by IMPALA and HER."""

from __future__ import annotations

import json
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

import continual_training_example
from agents import ppo, ppo_cbp
from conftest import ROOT, exit_2, run_main, run_script, write_config
from continual.config.args import Args
from continual.envs.vector import EnvSettings, make_vector_env
from continual.evaluation.continual import PolicyActor
from continual.training.tracking import read_metrics
from helpers import box_envs  # noqa: F401  (registers Target2x2-v0, Target2x2Bounded-v0)

TESTS = os.path.dirname(os.path.abspath(__file__))
BOX_ENV = {"PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}


def normal_reference(actions: np.ndarray, mean: np.ndarray, log_std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log p(a) and entropy of a diagonal Gaussian, written from the density
    p(a) = prod_i exp(-(a_i - mu_i)^2 / (2 s_i^2)) / (s_i sqrt(2 pi)), in float64."""
    a, mu, s = (np.asarray(v, dtype=np.float64) for v in (actions, mean, np.exp(np.asarray(log_std, np.float64))))
    logp = np.sum(-((a - mu) ** 2) / (2 * s**2) - np.log(s) - 0.5 * math.log(2 * math.pi), axis=-1)
    entropy = np.sum(np.broadcast_to(0.5 + 0.5 * math.log(2 * math.pi) + np.log(s), mu.shape), axis=-1)
    return logp, entropy


@pytest.mark.parametrize("n_actions", [1, 3])
def test_gaussian_head_matches_the_normal_density(n_actions):
    torch.manual_seed(0)
    agent = ppo.Agent((5,), n_actions, continuous=True)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.linspace(-1.5, 0.7, n_actions).reshape(1, -1))
        agent.actor.weight.normal_()  # a mean that depends on the observation
    x = torch.randn(64, 5)
    mean = agent.actor(agent.features(x)).detach().numpy()
    log_std = agent.actor_logstd.detach().numpy()

    given = torch.randn(64, n_actions) * 3
    action, logp, entropy, value = agent.get_action_and_value(x, given)
    ref_logp, ref_entropy = normal_reference(given.numpy(), mean, log_std)
    assert action is given and logp.shape == (64,) and entropy.shape == (64,) and value.shape == (64, 1)
    np.testing.assert_allclose(logp.detach().numpy(), ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy.detach().numpy(), ref_entropy, rtol=1e-5, atol=1e-5)

    sampled, logp_s, _, _ = agent.get_action_and_value(x)  # sampled actions: their log-probs are the density's
    np.testing.assert_allclose(logp_s.detach().numpy(), normal_reference(sampled.numpy(), mean, log_std)[0],
                               rtol=1e-5, atol=1e-5)
    greedy, _, _, _ = agent.get_action_and_value(x, greedy=True)
    np.testing.assert_allclose(greedy.detach().numpy(), mean, rtol=0, atol=0)

    # the sample spread is exp(log_std), independent of the state
    xs = x[:1].expand(20000, 5)
    draws = agent.get_action_and_value(xs)[0].detach().numpy()
    np.testing.assert_allclose(draws.std(0), np.exp(log_std[0]), rtol=0.03)
    np.testing.assert_allclose(draws.mean(0), mean[0], atol=0.05 * np.exp(log_std[0]).max())


def test_gaussian_head_gradients_reach_the_log_std():
    agent = ppo.Agent((4,), 2, continuous=True)
    _, logp, entropy, _ = agent.get_action_and_value(torch.randn(8, 4), torch.randn(8, 2))
    (logp.sum() + entropy.sum()).backward()
    assert agent.actor_logstd.grad is not None and agent.actor_logstd.grad.abs().sum() > 0


def test_obs_normalisation_matches_numpy_running_statistics():
    agent = ppo.Agent((3,), 1, continuous=True, norm_obs=True)
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=[5.0, -2.0, 0.0], scale=[3.0, 0.1, 1.0], size=(n, 3)) for n in (7, 64, 129)]
    for b in batches:
        agent.update_obs_stats(torch.as_tensor(b, dtype=torch.float32).reshape(-1, 1, 3))
    everything = np.concatenate(batches).astype(np.float32).astype(np.float64)
    # as gymnasium's RunningMeanStd, the statistics start from a pseudo-sample of weight 1e-4, mean 0 and variance 1:
    # the moments of the whole weighted set, in closed form
    c, n = 1e-4, len(everything)
    mean = everything.sum(0) / (n + c)
    var = (np.sum(everything**2, 0) + c * 1.0) / (n + c) - mean**2
    np.testing.assert_allclose(agent.obs_mean.numpy(), mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(agent.obs_var.numpy(), var, rtol=1e-8)
    assert float(agent.obs_count) == pytest.approx(n + c)
    x = torch.as_tensor(everything[:4], dtype=torch.float32)
    expected = np.clip((everything[:4] - mean) / np.sqrt(var + 1e-8), -10, 10)
    # features() sees the standardised observation: compare through a torso that is the identity
    probe = ppo.Agent((3,), 1, continuous=True, norm_obs=True)
    probe.load_state_dict(agent.state_dict())
    probe.network = torch.nn.Flatten()
    np.testing.assert_allclose(probe.features(x).detach().numpy(), expected, rtol=1e-4, atol=1e-4)
    assert {"obs_mean", "obs_var", "obs_count"} <= set(agent.state_dict())  # saved with the checkpoint


def test_make_agent_reads_the_action_space():
    args = Args(env_id="Pendulum-v1", backend="Gymnasium")
    obs = gym.spaces.Box(-1, 1, (3,), np.float32)
    a = ppo.make_agent(obs, gym.spaces.Box(-2, 2, (1,), np.float32), args)
    assert a.continuous and a.n_actions == 1 and hasattr(a, "actor_logstd")
    d = ppo.make_agent(obs, gym.spaces.Discrete(4), args)
    assert not d.continuous and d.n_actions == 4 and not hasattr(d, "actor_logstd")
    assert ppo.make_agent(obs, 4, args).n_actions == 4  # a bare number of actions still means Discrete
    c = ppo_cbp.make_agent(obs, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), args)
    assert c.continuous and c.n_actions == 4


@pytest.mark.parametrize("env_id,expected", [
    ("helpers.box_envs:Target2x2-v0", [[3.0, -7.0], [0.25, 100.0]]),  # unbounded: unchanged
    ("helpers.box_envs:Target2x2Bounded-v0", [[0.5, -0.5], [0.25, 0.5]]),  # clipped to [-0.5, 0.5]
])
def test_envs_flatten_and_clip_box_actions(env_id, expected):
    envs = make_vector_env(EnvSettings(env_id=env_id, backend="Gymnasium"), 2, "", "sync")
    try:
        assert envs.single_action_space.shape == (4,)  # the policy sees a flat vector
        envs.reset(seed=0)
        flat = np.array([[3.0, -7.0, 0.25, 100.0]] * 2, dtype=np.float32)
        envs.step(flat)
        for env in envs.unwrapped.envs:
            np.testing.assert_array_equal(env.unwrapped.last_action, np.array(expected, dtype=np.float32))
    finally:
        envs.close()


def test_pendulum_clipping_follows_a_max_torque_modification():
    """ClipAction reads the bounds at every step: after `max_torque=3` a torque of 2.5 is no longer cut to 2."""
    def reward_of_torque(modification: str, torque: float) -> float:
        envs = make_vector_env(EnvSettings(env_id="Pendulum-v1", backend="Gymnasium"), 1, modification, "sync")
        try:
            envs.reset(seed=3)
            u = envs.unwrapped.envs[0].unwrapped
            th, thdot = float(u.state[0]), float(u.state[1])
            _, reward, _, _, _ = envs.step(np.array([[torque]], dtype=np.float32))
            norm = ((th + np.pi) % (2 * np.pi)) - np.pi
            return float(reward[0]) - (-(norm**2 + 0.1 * thdot**2))  # the torque term, -0.001 u^2
        finally:
            envs.close()

    np.testing.assert_allclose(reward_of_torque("", 2.5), -0.001 * 2.0**2, rtol=1e-4)
    np.testing.assert_allclose(reward_of_torque("max_torque=3", 2.5), -0.001 * 2.5**2, rtol=1e-4)
    np.testing.assert_allclose(reward_of_torque("max_torque=3", -9.0), -0.001 * 3.0**2, rtol=1e-4)


def test_policy_actor_samples_from_the_gaussian():
    """Continual evaluation's actor: greedy = the mean; sampled = mean + std * noise from its seeded generator."""
    agent = ppo.Agent((3,), 2, continuous=True)
    with torch.no_grad():
        agent.actor_logstd.fill_(-1.0)
    x = torch.randn(5, 3)
    mean = agent.actor(agent.features(x)).detach()
    assert torch.equal(PolicyActor(agent, greedy=True)(x), mean)
    actor = PolicyActor(agent, greedy=False)
    actor.reseed(7)
    a1 = actor(x)
    actor.reseed(7)
    assert torch.equal(a1, actor(x))
    noise = torch.randn(mean.shape, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(a1, mean + math.exp(-1.0) * noise)


PENDULUM = {
    "env_id": "Pendulum-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64, "update_epochs": 2,
    "num_minibatches": 2, "reward_scaling": "normalize", "norm_obs": True, "ent_coef": 0.0,
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": 1280, "modifications": ["", "g=15"],
                                    "switching_thresholds": [512]},
}


@pytest.mark.parametrize("architecture", ["PPO", pytest.param("PPO_CBP", marks=pytest.mark.slow)])
def test_pendulum_curriculum_checkpoint_resume_and_eval(tmp_path, architecture):
    cfg = write_config(tmp_path, PENDULUM, "pendulum.json")
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--config", str(cfg), "--architecture", architecture,
             "--runs_dir", runs, "--run_name", "p", "--total_timesteps", "1024", "--no-progress-bar",
             "--eval_every", "256", "--eval_episodes", "2", "--eval_modifs", "g=5", "--eval_max_episode_steps", "20")
    run_dir = os.path.join(runs, "p")
    first = torch.load(os.path.join(run_dir, "checkpoints", "final__step1024.cleanrl_model"), weights_only=True)
    assert first["continuous"] and first["n_actions"] == 1 and "actor_logstd" in first["model"]
    assert float(first["model"]["obs_count"]) > 0

    # episodes last 200 steps per env: both regimes complete some before step 1024 (a resume restarts them)
    proc = run_main("continual_training_example.py", "--resume", run_dir, "--total_timesteps", "1280",
                    "--no-progress-bar")
    assert "Traceback" not in proc.stderr
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [(r["global_step"], r["modification"]) for r in records if r["kind"] == "switch"] == [(512, "g=15")]
    iterations = [r["global_step"] for r in records if r["kind"] == "iteration"]
    assert iterations == list(range(128, 1281, 128))
    episodes = [r for r in records if r["kind"] == "episode"]
    assert {r["modification"] for r in episodes} == {"", "g=15"} and all(r["length"] == 200 for r in episodes)
    evals = [r for r in records if r["kind"] == "eval"]
    assert {r["modification"] for r in evals} >= {"", "g=15", "g=5"}
    assert all(np.isfinite(r["mean"]) for r in evals)

    final = torch.load(os.path.join(run_dir, "checkpoints", "final__step1280.cleanrl_model"), weights_only=True)
    assert final["modification"] == "g=15"
    assert not torch.equal(final["model"]["actor_logstd"], first["model"]["actor_logstd"])  # it trained on
    out = str(tmp_path / "evalout")
    proc = run_main("eval.py", "--agent_path", run_dir, "--modifs", "", "g=15", "max_torque=1",
                    "--eval_episodes", "2", "--output", out)
    rows = {r["modification"]: r for r in json.load(open(out + ".json"))["results"]}
    assert set(rows) == {"", "g=15", "max_torque=1"}
    assert all(r["episodes"] == 2 and r["mean_length"] == 200 and -3000 < r["mean"] <= 0 for r in rows.values())
    greedy = str(tmp_path / "greedy")
    run_main("eval.py", "--agent_path", run_dir, "--modifs", "g=15", "--eval_episodes", "2", "--greedy",
             "--output", greedy)
    assert json.load(open(greedy + ".json"))["results"][0]["episodes"] == 2


@pytest.mark.parametrize("argv,field", [
    (["--architecture", "IMPALA"], "architecture"),
    (["--her"], "her"),
])
def test_box_actions_refused_by_impala_and_her(tmp_path, capsys, argv, field):
    runs = tmp_path / "runs"
    out, err = exit_2(continual_training_example.main, ["--backend", "Gymnasium", "--env_id", "Pendulum-v1",
                      "--runs_dir", str(runs), *argv], capsys)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert out == "" and not runs.exists()


def test_impala_refusal_names_the_action_space(tmp_path, capsys):
    _, err = exit_2(continual_training_example.main, ["--backend", "Gymnasium", "--env_id", "Pendulum-v1",
                    "--architecture", "IMPALA", "--runs_dir", str(tmp_path / "runs")], capsys)
    assert "Box" in err and "PPO" in err


def test_multidim_unbounded_box_learns(tmp_path):
    """Target2x2 (a 2x2 unbounded action, reward -|a - target|^2): a random policy (std 1 around 0) scores about
    8 * -(4 + 4/3) = -43 per episode; PPO must bring it near 0."""
    runs = str(tmp_path / "runs")
    run_main("agents/ppo.py", "--env_id", "helpers.box_envs:Target2x2-v0", "--backend", "Gymnasium", "--num_envs", "4",
             "--num_steps", "64", "--num_minibatches", "4", "--update_epochs", "10", "--learning_rate", "3e-3",
             "--ent_coef", "0", "--reward_scaling", "none", "--clip_coef", "0.2", "--total_timesteps", "12288",
             "--runs_dir", runs, "--run_name", "t", "--no-progress-bar")
    episodes = [r["return"] for r in read_metrics(os.path.join(runs, "t", "metrics.jsonl")) if r["kind"] == "episode"]
    assert np.mean(episodes[:20]) < -25, episodes[:20]
    assert np.mean(episodes[-20:]) > -8, episodes[-20:]


def test_shipped_pendulum_config_parses():
    from continual.config.loading import parse_args

    args, curriculum = parse_args(["--config", os.path.join(ROOT, "configs", "pendulum_gravity.json")])
    assert args.env_id == "Pendulum-v1" and args.norm_obs and args.reward_scaling == "normalize"
    assert curriculum.kwargs["modifications"] == ["", "g=13", "g=7", ""]


@pytest.mark.slow
def test_pendulum_learns(tmp_path):
    """configs/pendulum_gravity.json, seed 1, its first regime only (49152 steps, about a minute on a quiet machine):
    a random policy scores about -1200 per episode; the last 20 episodes must average above -600."""
    runs = str(tmp_path / "runs")
    run_script("agents/ppo.py", "--config", os.path.join(ROOT, "configs", "pendulum_gravity.json"),
               "--total_timesteps", "49152", "--seed", "1", "--runs_dir", runs, "--run_name", "p", "--no-progress-bar")
    records = read_metrics(os.path.join(runs, "p", "metrics.jsonl"))
    assert not [r for r in records if r["kind"] == "switch"]
    episodes = [r["return"] for r in records if r["kind"] == "episode"]
    assert np.mean(episodes[:20]) < -900, episodes[:20]
    assert np.mean(episodes[-20:]) > -600, episodes[-20:]
