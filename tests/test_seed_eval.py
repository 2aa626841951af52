"""What a user of the seed project (continual_hackatari) and of CleanRL expects from a finished run and eval.py:
the final policy at runs/<run_name>/<exp_name>.cleanrl_model loads with `Agent(...).load_state_dict(torch.load(path))`,
eval.py takes it, checks --her / --game_specific_goals against the run, evaluates the unmodified game by default (the
curriculum's regimes with --all_regimes) and shows progress."""

from __future__ import annotations

import json
import os
import shutil

import gymnasium as gym
import pytest
import torch

from conftest import run_main, write_config

CURRICULUM = {
    "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64, "update_epochs": 1,
    "reward_scaling": "none",
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": 512, "modifications": ["", "gravity=15", "length=0.8"],
                                    "switching_thresholds": [128, 256]},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seed_eval")
    cfg = write_config(tmp, CURRICULUM, "cfg.json")
    runs = str(tmp / "runs")
    proc = run_main("continual_training_example.py", "--config", str(cfg), "--runs_dir", runs, "--run_name", "cp",
                    "--exp_name", "ppo_cartpole", "--no-progress-bar")
    return os.path.join(runs, "cp"), proc


def test_final_policy_is_a_cleanrl_state_dict(run):
    """CleanRL's evals: `agent = Agent(envs); agent.load_state_dict(torch.load(model_path))`; the weights are those of
    the final checkpoint."""
    run_dir, proc = run
    path = os.path.join(run_dir, "ppo_cartpole.cleanrl_model")
    assert os.path.exists(path) and f"model saved to {path}" in proc.stdout
    from agents.ppo import Agent

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    agent = Agent(envs.single_observation_space.shape, int(envs.single_action_space.n))
    agent.load_state_dict(torch.load(path))  # torch's default weights_only=True: a plain state_dict of tensors
    final = torch.load(os.path.join(run_dir, "checkpoints", "final__step512.cleanrl_model"), weights_only=True)
    for k, v in agent.state_dict().items():
        assert torch.equal(v, final["model"][k]), k
    obs, _ = envs.reset(seed=0)
    action = agent.get_action_and_value(torch.as_tensor(obs), greedy=True)[0]
    assert action.shape == (1,)
    envs.close()


def test_eval_takes_the_final_policy_file_and_defaults_to_the_unmodified_game(run, tmp_path):
    run_dir, _ = run
    out = str(tmp_path / "plain")
    proc = run_main("eval.py", "--agent_path", os.path.join(run_dir, "ppo_cartpole.cleanrl_model"),
                    "--eval_episodes", "3", "--output", out)
    result = json.load(open(out + ".json"))
    assert [r["modification"] for r in result["results"]] == [""]  # the seed's default: no modification
    assert result["results"][0]["episodes"] == 3 and result["global_step"] == 512
    assert result["architecture"] == "PPO"
    assert "evaluating 1 modification x 3 games" in proc.stdout
    assert "3/3" in proc.stderr and "game" in proc.stderr  # tqdm: games done / total, with its time estimate


def test_eval_all_regimes_is_explicit(run, tmp_path):
    run_dir, _ = run
    out = str(tmp_path / "all")
    proc = run_main("eval.py", "--agent_path", run_dir, "--all_regimes", "--eval_episodes", "1", "--output", out)
    assert [r["modification"] for r in json.load(open(out + ".json"))["results"]] == ["", "gravity=15", "length=0.8"]
    assert "3/3" in proc.stderr
    out = str(tmp_path / "mod")
    run_main("eval.py", "--agent_path", run_dir, "--modifs", "gravity=15", "--eval_episodes", "1", "--output", out,
             "--no-progress-bar")
    assert [r["modification"] for r in json.load(open(out + ".json"))["results"]] == ["gravity=15"]


@pytest.mark.parametrize("flags, message", [
    (["--her"], "error: her: --her True does not match the agent, trained with her=False"),
    (["--game_specific_goals"], "error: game_specific_goals: --game_specific_goals True does not match the agent, "
                                "trained with game_specific_goals=False"),
    (["--no-her", "--game-specific-goals"], "error: game_specific_goals: --game_specific_goals True does not"),
])
def test_eval_training_flag_mismatch_is_one_line(run, tmp_path, flags, message):
    run_dir, _ = run
    out = tmp_path / "never"
    proc = run_main("eval.py", "--agent_path", run_dir, *flags, "--output", str(out), check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(message) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == "" and not os.path.exists(str(out) + ".json")


def test_eval_matching_training_flags_are_accepted(run, tmp_path):
    run_dir, _ = run
    out = str(tmp_path / "ok")
    run_main("eval.py", "--agent_path", run_dir, "--no-her", "--no-game-specific-goals", "--eval_episodes", "1",
             "--output", out, "--no-progress-bar")
    assert json.load(open(out + ".json"))["results"][0]["episodes"] == 1


def test_final_policy_without_its_config_is_a_clear_error(run, tmp_path):
    run_dir, _ = run
    lone = tmp_path / "elsewhere" / "ppo_cartpole.cleanrl_model"
    lone.parent.mkdir()
    shutil.copy(os.path.join(run_dir, "ppo_cartpole.cleanrl_model"), lone)
    proc = run_main("eval.py", "--agent_path", str(lone), check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "plain state_dict" in proc.stderr and "config.json" in proc.stderr


def test_eval_plays_whole_games_whatever_the_training_cap(tmp_path):
    """The seed's eval.py plays whole games: a Freeway run trained with games capped at 512 steps is evaluated on
    whole games (~2,050 agent steps) unless --eval_max_episode_steps asks for a cap; every row says which."""
    pytest.importorskip("hackatari")
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--env_id", "ALE/Freeway-v5", "--backend", "HackAtari",
             "--num_envs", "1", "--num_steps", "32", "--num_minibatches", "1", "--update_epochs", "1",
             "--total_timesteps", "32", "--max_episode_steps", "512", "--runs_dir", runs, "--run_name", "fw",
             "--no-progress-bar")
    agent = os.path.join(runs, "fw", "ppo.cleanrl_model")
    whole = str(tmp_path / "whole")
    proc = run_main("eval.py", "--agent_path", agent, "--eval_episodes", "1", "--output", whole, "--no-progress-bar")
    row = json.load(open(whole + ".json"))["results"][0]
    assert row["mean_length"] > 2000 and row["max_episode_steps"] is None and row["capped"] == 0, row
    assert "games: whole games" in proc.stdout
    capped = str(tmp_path / "capped")
    proc = run_main("eval.py", "--agent_path", agent, "--eval_episodes", "1", "--eval_max_episode_steps", "100",
                    "--output", capped, "--no-progress-bar")
    result = json.load(open(capped + ".json"))
    assert result["max_episode_steps"] == 100
    assert {k: result["results"][0][k] for k in ("mean_length", "max_episode_steps", "capped")} == \
        {"mean_length": 100, "max_episode_steps": 100, "capped": 1}
    assert "games: capped at 100 agent steps" in proc.stdout and "1 of 1 games cut short" in proc.stdout
    assert open(capped + ".csv").readline().strip().endswith("mean_length,max_episode_steps,capped")


def test_eval_constant_action_is_a_reflex_baseline_under_the_runs_env(run, tmp_path, capsys):
    """--constant_action A plays A every step instead of the agent: each game's return is that of a plain gymnasium
    loop pushing A from the same seed (env i of the evaluation starts from seed + i), and the JSON says the agent
    did not act. An action the game lacks is one line and exit 2, before anything is written."""
    run_dir, _ = run
    out = str(tmp_path / "always_right")
    proc = run_main("eval.py", "--agent_path", run_dir, "--constant_action", "1", "--eval_episodes", "3",
                    "--num_envs", "3", "--seed", "7", "--modifs", "", "gravity=15", "--output", out,
                    "--no-progress-bar", "--action_shares")
    assert "with the constant action 1, not the agent's" in proc.stdout
    result = json.load(open(out + ".json"))
    assert result["constant_action"] == 1
    assert [row["action_share"] for row in result["results"]] == [[0.0, 1.0]] * 2  # --action_shares
    for row, gravity in zip(result["results"], (9.8, 15.0)):
        expected = []
        for i in range(3):
            env = gym.make("CartPole-v1")
            env.unwrapped.gravity = gravity
            env.reset(seed=7 + i)
            ret, done = 0.0, False
            while not done:
                _, r, term, trunc, _ = env.step(1)
                ret, done = ret + r, term or trunc
            expected.append(ret)
        assert row["mean"] == pytest.approx(sum(expected) / 3) and row["min"] == min(expected), (row, expected)
    import eval as eval_script

    with pytest.raises(SystemExit) as e:
        eval_script.main(["--agent_path", run_dir, "--constant_action", "2", "--output", str(tmp_path / "bad"),
                          "--no-progress-bar"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "constant_action: 2 is no action of CartPole-v1" in err and len(err.splitlines()) == 1
    assert not os.path.exists(str(tmp_path / "bad") + ".json")


def test_eval_random_actions_is_the_no_agent_baseline_under_the_runs_env(run, tmp_path, capsys):
    """--random_actions draws every env's action uniformly from a generator seeded with --seed: each game's return is
    that of plain gymnasium envs stepped in lockstep with the same draws (env i from seed + i, reset as soon as a game
    ends; a game past an env's quota is played but not counted), the same for the same seed, and the JSON says the
    agent did not act. With --constant_action or --greedy: one line and exit 2, before anything is written."""
    run_dir, _ = run
    out = str(tmp_path / "random")
    argv = ["--agent_path", run_dir, "--random_actions", "--eval_episodes", "5", "--num_envs", "2", "--seed", "7",
            "--modifs", "", "gravity=15", "--no-progress-bar", "--action_shares"]
    proc = run_main("eval.py", *argv, "--output", out)
    assert "with uniformly random actions, not the agent's" in proc.stdout
    result = json.load(open(out + ".json"))
    assert result["random_actions"] is True and "constant_action" not in result
    gen = torch.Generator().manual_seed(7)  # one generator for the whole evaluation: gravity=15 continues its draws
    for row, gravity in zip(result["results"], (9.8, 15.0)):
        envs = [gym.make("CartPole-v1") for _ in range(2)]
        for i, env in enumerate(envs):
            env.unwrapped.gravity = gravity
            env.reset(seed=7 + i)
        quota, games, ret, taken = [3, 2], [[], []], [0.0, 0.0], [0, 0]
        while any(len(g) < q for g, q in zip(games, quota)):
            actions = torch.randint(2, (2,), generator=gen).tolist()
            for i, env in enumerate(envs):
                if len(games[i]) < quota[i]:
                    taken[actions[i]] += 1
                _, r, term, trunc, _ = env.step(actions[i])
                ret[i] += r
                if term or trunc:
                    if len(games[i]) < quota[i]:
                        games[i].append(ret[i])
                    ret[i] = 0.0
                    env.reset()
        expected = games[0] + games[1]
        assert row["mean"] == pytest.approx(sum(expected) / 5) and row["min"] == min(expected), (row, expected)
        assert row["action_share"] == [t / sum(taken) for t in taken]
    again = str(tmp_path / "again")
    run_main("eval.py", *argv, "--output", again)
    assert [r["mean"] for r in json.load(open(again + ".json"))["results"]] == [r["mean"] for r in result["results"]]
    import eval as eval_script

    for flags, words in ((["--constant_action", "1"], "random_actions: not with --constant_action"),
                         (["--greedy"], "random_actions: not with --greedy")):
        with pytest.raises(SystemExit) as e:
            eval_script.main(["--agent_path", run_dir, "--random_actions", *flags, "--output", str(tmp_path / "bad"),
                              "--no-progress-bar"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and len(err.splitlines()) == 1, err
        assert not os.path.exists(str(tmp_path / "bad") + ".json")
