"""Task sequences across games (issue 14): the TaskSequence schedule against a hand-written reference, its state
and bad configs; a two-game ALE sequence switching in place; a MinAtar sequence trained, resumed mid-way and
evaluated on each task; incompatible sequences refused with one line and exit code 2 before anything is built."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import continual_training_example
from conftest import exit_2, run_main, write_config
from continual.config.args import Args
from continual.curricula import FactoryConfigError, make_factory, make_run_factory
from continual.envs.backends import make_backend_env, task_compat
from continual.envs.vector import EnvSettings, make_vector_env
from continual.errors import UserError
from continual.evaluation import plots
from continual.training.startup import check_modifications

TASKS = [{"env_id": "MinAtar/Breakout", "steps": 3},
         {"env_id": "MinAtar/Freeway", "modifications": "sticky_action_prob=0", "steps": 5},
         {"modifications": ["difficulty_ramping=0"], "steps": 2}]
STRINGS = ["env=MinAtar/Breakout", "env=MinAtar/Freeway sticky_action_prob=0", "difficulty_ramping=0"]


def reference_schedule(lengths: list[int], cycles: int) -> list[int]:
    """Task index of every step, by walking the cycles by hand."""
    out = []
    for _ in range(cycles):
        for i, n in enumerate(lengths):
            out += [i] * n
    return out


@pytest.mark.parametrize("granularity", [1, 2, 4])
def test_schedule_is_the_tasks_in_order_for_each_cycle(granularity):
    f = make_factory("TaskSequence", {"tasks": TASKS, "cycles": 3}, granularity=granularity)
    ref = reference_schedule([3, 5, 2], 3)
    assert f.total_timesteps == 30 == len(ref)
    for step in range(30):
        start = step - step % granularity  # the quantisation rule: the decision start's task
        assert f.get_modification(step) == STRINGS[ref[start]], step
        if granularity == 1:
            assert f.task_at(step) == (step // 10, ref[step])
    assert f.possible_modifications() == sorted(STRINGS)
    with pytest.raises(ValueError):
        f.get_modification(30)


def test_run_factory_is_per_step_and_state_round_trips():
    f = make_run_factory("TaskSequence", {"tasks": TASKS, "cycles": 2}, seed=3, rollout_size=128)
    assert f.granularity == 1  # a built-in: switches counted in agent steps under every agent
    assert [s for s, _, _ in f.schedule()] == [0, 3, 8, 10, 13, 18]
    state = json.loads(json.dumps(f.state_dict()))
    same = make_factory("TaskSequence", {"tasks": TASKS, "cycles": 2}, seed=3)
    same.load_state_dict(state)
    other = make_factory("TaskSequence", {"tasks": TASKS, "cycles": 3}, seed=3)
    with pytest.raises(FactoryConfigError, match="cycles"):
        other.load_state_dict(state)


@pytest.mark.parametrize("kwargs, path", [
    ({"tasks": [], "cycles": 1}, "tasks"),
    ({"tasks": [{"env_id": "MinAtar/Breakout"}]}, "tasks[0].steps"),
    ({"tasks": [{"env_id": "MinAtar/Breakout", "steps": 0}]}, "tasks[0].steps"),
    ({"tasks": [{"env_id": "MinAtar/Breakout", "steps": 5, "game": "x"}]}, "tasks[0].game"),
    ({"tasks": [{"modifications": "env=MinAtar/Breakout", "steps": 5}]}, "tasks[0].modifications"),
    ({"tasks": [{"env_id": 3, "steps": 5}]}, "tasks[0].env_id"),
    ({"tasks": [{"env_id": "MinAtar/Breakout", "steps": 5}], "cycles": 0}, "cycles"),
    ({"tasks": "MinAtar/Breakout"}, "tasks"),
])
def test_bad_task_configs_name_the_field(kwargs, path):
    with pytest.raises(FactoryConfigError) as e:
        make_factory("TaskSequence", kwargs)
    assert f"modification_factory_kwargs.{path}:" in str(e.value) and "\n" not in str(e.value)


def test_two_game_ale_sequence_switches_in_the_same_workers():
    """HackAtari Pong -> Breakout -> Pong: same pids, 18 actions, and after the switch the workers' RAM is
    Breakout's (its brick rows, as a Breakout env built on its own has them)."""
    games = ("ALE/Breakout-v5", "ALE/Pong-v5")
    compat = task_compat("HackAtari", games)
    assert compat.full_action_space
    settings = EnvSettings(env_id="ALE/Pong-v5", backend="HackAtari", compat=compat)
    ref = {}
    for g in games:
        env = make_backend_env("HackAtari", g, "", full_action_space=True)
        env.reset(seed=0)
        ref[g] = env.unwrapped.ale.getRAM()[:8].copy()  # bytes no step before a point changes: Breakout bricks, Pong constants
        assert env.action_space.n == 18
        env.close()
    assert not np.array_equal(ref[games[0]], ref[games[1]])
    envs = make_vector_env(settings, 2, "env=ALE/Pong-v5", "async")
    try:
        envs.reset(seed=0)
        pids = envs.worker_pids()
        assert envs.single_action_space.n == 18 and len(pids) == 2
        assert all(np.array_equal(r[:8], ref["ALE/Pong-v5"]) for r in envs.get_ram())
        envs.switch("env=ALE/Breakout-v5", step=512)
        assert envs.worker_pids() == pids and envs.env.call("game") == ("ALE/Breakout-v5",) * 2
        assert all(np.array_equal(r[:8], ref["ALE/Breakout-v5"]) for r in envs.get_ram())
        obs, *_ = envs.step(np.array([17, 4]))  # an action Breakout's minimal set lacks is legal
        assert obs.shape == (2, 4, 84, 84)
        envs.switch("env=ALE/Pong-v5 lazy_enemy", step=1024)  # back, with a modification: a cycle
        assert envs.worker_pids() == pids and envs.env.call("game") == ("ALE/Pong-v5",) * 2
        assert all(np.array_equal(r[:8], ref["ALE/Pong-v5"]) for r in envs.get_ram())
    finally:
        envs.close()


def sequence_config(cycles: int = 2) -> dict:
    return {
        "env_id": "MinAtar/Breakout", "backend": "MinAtar", "num_envs": 4, "num_steps": 32, "num_minibatches": 1,
        "update_epochs": 1, "eval_every": 0, "metrics": False, "progress_bar": False, "task_id_input": True,
        "modification_factory": "TaskSequence",
        "modification_factory_kwargs": {"cycles": cycles, "tasks": [
            {"env_id": "MinAtar/Breakout", "steps": 512},
            {"env_id": "MinAtar/SpaceInvaders", "modifications": "sticky_action_prob=0", "steps": 512}]},
    }


def records(run_dir: str, kind: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("kind") == kind]


def test_minatar_sequence_trains_resumes_and_evaluates_each_task(tmp_path):
    """Two games x 2 cycles (2048 steps), with --task_id_input: stopped at 1024 (the end of cycle 1) and resumed,
    the switches land exactly on the schedule; the episodes of each task are that game's; the agent sees 6 grid
    channels + 2 task channels; eval.py evaluates the checkpoint on either task and on a game that fits."""
    config = write_config(tmp_path, sequence_config(), "seq.json")
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--config", config, "--runs_dir", runs, "--run_name", "seq",
             "--total_timesteps", "1024")
    run_dir = os.path.join(runs, "seq")
    run_main("continual_training_example.py", "--resume", run_dir, "--total_timesteps", "2048")
    b, s = "env=MinAtar/Breakout", "env=MinAtar/SpaceInvaders sticky_action_prob=0"
    switches = [(r["global_step"], r["modification"]) for r in records(run_dir, "switch")]
    assert switches == [(512, s), (1024, b), (1536, s)]
    bounds = [(0, 512, b), (512, 1024, s), (1024, 1536, b), (1536, 2048, s)]
    episodes = records(run_dir, "episode")
    assert episodes and {r["modification"] for r in episodes} == {b, s}
    for r in episodes:  # an episode ending at step t (an iteration's step count) ran in the task of t
        owner = [m for lo, hi, m in bounds if lo < r["global_step"] <= hi]
        assert r["modification"] == owner[0], r
    with open(os.path.join(run_dir, "config.json")) as f:
        assert sorted(json.load(f)["possible_modifications"]) == sorted([b, s])
    weights = torch.load(os.path.join(run_dir, "ppo.cleanrl_model"), weights_only=True)
    assert weights["network.0.weight"].shape[1] == 8  # input channels: SpaceInvaders' 6 (the most) + one per task
    out = str(tmp_path / "eval_out")
    agent = os.path.join(run_dir, "ppo.cleanrl_model")
    run_main("eval.py", "--agent_path", agent, "--modifs", s, "env=MinAtar/Asterix", "--eval_episodes", "2",
             "--output", out, "--no-progress_bar")  # Asterix: a game outside the sequence that fits
    with open(out + ".json") as f:
        rows = json.load(f)["results"]
    assert [r["modification"] for r in rows] == [s, "env=MinAtar/Asterix"]
    # Seaquest's 10 channels do not fit an agent trained on 6: one line, exit 2, nothing written
    proc = run_main("eval.py", "--agent_path", agent, "--modifs", "env=MinAtar/Seaquest", "--output",
                    out + "2", check=False)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "MinAtar/Seaquest does not fit" in proc.stderr and not os.path.exists(out + "2.json")


INCOMPATIBLE = {
    "discrete_and_box": ("Gymnasium", "CartPole-v1", "Pendulum-v1", []),
    "ale_and_classic": ("Gymnasium", "ALE/Pong-v5", "CartPole-v1", []),
    "obj_frames_across_games": ("HackAtari", "ALE/Pong-v5", "ALE/Breakout-v5", ["--obs_mode", "obj"]),
    "unknown_minatar_game": ("MinAtar", "MinAtar/Breakout", "MinAtar/Pong", []),
    "minatar_bad_token": ("MinAtar", "MinAtar/Breakout", "MinAtar/Freeway gravity=3", []),
}


@pytest.mark.parametrize("case", sorted(INCOMPATIBLE))
def test_incompatible_sequences_exit_2_with_one_line(tmp_path, capsys, case):
    backend, first, second, extra = INCOMPATIBLE[case]
    env2, _, mods = second.partition(" ")
    config = {"env_id": first, "backend": backend, "modification_factory": "TaskSequence",
              "modification_factory_kwargs": {"cycles": 2, "tasks": [
                  {"env_id": first, "steps": 1000}, {"env_id": env2, "modifications": mods, "steps": 1000}]}}
    path = write_config(tmp_path, config, "bad.json")
    runs = tmp_path / "runs"
    out, err = exit_2(continual_training_example.main, ["--config", str(path), "--runs_dir", str(runs), *extra],
                      capsys)
    lines = (out + err).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), (out, err)
    assert not runs.exists()


def test_plot_titles_name_the_games_of_a_sequence():
    config = {"architecture": "PPO", "env_id": "MinAtar/Breakout",
              "possible_modifications": ["env=MinAtar/Freeway sticky_action_prob=0", "env=MinAtar/Breakout"]}
    assert "2 games: MinAtar/Breakout, MinAtar/Freeway" in plots._title(SimpleNamespace(name="r", config=config))
    one = {**config, "possible_modifications": ["", "sticky_action_prob=0"]}
    assert plots._title(SimpleNamespace(name="r", config=one)).endswith(", MinAtar/Breakout)")


def test_any_factory_may_name_games_and_preflight_checks_each():
    """env= tokens in a Sequential curriculum: every regime is checked against its own game before any env exists."""
    args = Args(env_id="MinAtar/Breakout", backend="MinAtar")
    good = make_factory("Sequential", {"num_total_steps": 100, "switching_thresholds": [50],
                                       "modifications": ["sticky_action_prob=0", "env=MinAtar/Freeway difficulty_ramping=0"]})
    assert check_modifications(args, good) == ["difficulty_ramping=0 env=MinAtar/Freeway", "sticky_action_prob=0"]
    for bad, match in [("env=MinAtar/Freeway gravity=3", "gravity=3"), ("env=MinAtar/Pong", "MinAtar/Pong"),
                       ("env=CartPole-v1", "CartPole-v1")]:
        f = make_factory("Sequential", {"num_total_steps": 100, "switching_thresholds": [50],
                                        "modifications": ["", bad]})
        with pytest.raises(UserError, match=match):
            check_modifications(args, f)
