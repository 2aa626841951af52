"""configs/continual_minatar.json (C-CHAIN's Continual MinAtar) for every agent, shortened: the three games in order
with their observations padded to 10 channels, Seaquest's no-reward cutoff in its regime string, greedy evaluation of
every game; and configs/experiments/c_chain_minatar.json expands and validates (12 seeds, seeds 1-5 of both arms
first) with the paper code's settings."""

from __future__ import annotations

import copy
import csv
import json
import os

import numpy as np
import pytest

from conftest import ROOT, run_main, write_config
from continual.training.tracking import read_metrics

SEQUENCE = os.path.join(ROOT, "configs", "continual_minatar.json")
EXPERIMENT = os.path.join(ROOT, "configs", "experiments", "c_chain_minatar.json")
SEAQUEST = "env=MinAtar/Seaquest no_reward_cutoff=1000"


def shortened(steps: int) -> dict:
    with open(SEQUENCE, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg = copy.deepcopy(cfg)
    for t in cfg["modification_factory_kwargs"]["tasks"]:
        t["steps"] = steps
    cfg.update({"eval_every": 2 * steps, "eval_episodes": 2, "eval_num_envs": 2, "checkpoint_minutes": 0})
    return cfg


AGENTS = {
    "PPO": ["--num_envs", "4", "--num_steps", "16", "--num_minibatches", "2", "--update_epochs", "1"],
    "DQN": ["--num_steps", "64", "--learning_starts", "64", "--learning_starts_each_regime", "--double_dqn",
            "--train_frequency", "1", "--buffer_size", "2000", "--c_chain"],
    "A2C": ["--num_envs", "4", "--num_steps", "8"],
    "IMPALA": ["--num_envs", "2", "--num_actors", "1", "--unroll_length", "8", "--batch_size", "2"],
}


@pytest.mark.parametrize("architecture", list(AGENTS))
def test_every_agent_runs_continual_minatar(tmp_path, architecture):
    cfg = write_config(tmp_path, shortened(128))
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--config", cfg, "--architecture", architecture, "--runs_dir", runs,
             "--run_name", "r", "--no-progress-bar", "--no-metrics", *AGENTS[architecture])
    run = os.path.join(runs, "r")
    recs = read_metrics(os.path.join(run, "metrics.jsonl"))
    switches = [r for r in recs if r["kind"] == "switch"]
    assert [s["modification"] for s in switches] == ["env=MinAtar/Asterix", SEAQUEST]
    rows = list(csv.DictReader(open(os.path.join(run, "eval_table.csv"))))
    assert {r["modification"] for r in rows} == {"env=MinAtar/SpaceInvaders", "env=MinAtar/Asterix", SEAQUEST}
    assert {r["greedy"] for r in rows} == {"True"} and {r["episodes"] for r in rows} == {"2"}
    ckpt = [f for f in os.listdir(os.path.join(run, "checkpoints")) if f.startswith("final")]
    import torch

    assert torch.load(os.path.join(run, "checkpoints", ckpt[0]), weights_only=False)["obs_shape"] == [10, 10, 10]


def test_the_experiment_file_expands_in_the_declared_order_with_the_paper_codes_settings(tmp_path):
    from continual.launch.experiment import load_experiment, validate

    exp = load_experiment(EXPERIMENT)
    assert len(exp.entries) == 24
    seeds = [e.config["seed"] for e in exp.entries]
    arms = [bool(e.config.get("c_chain")) for e in exp.entries]
    # seeds 1-5 of both arms are entries 0-9, then 6-10, then 11-12
    assert seeds == [s for s in range(1, 13) for _ in range(2)] and arms == [False, True] * 12
    assert exp.seeds_per_process == 5  # how they run (seeds 1-5, 6-10, 11-12 of an arm a process), not what they learn
    for e in exp.entries:
        c = e.config
        assert (c["architecture"], c["double_dqn"], c["learning_rate"], c["replay_batch_size"], c["buffer_size"],
                c["learning_starts"], c["learning_starts_each_regime"], c["train_frequency"],
                c["target_network_frequency"], c["tau"], c["start_e"], c["end_e"], c["num_envs"]) == \
            ("DQN", True, 3e-4, 32, 100_000, 10_000, True, 1, 1000, 1.0, 1.0, 0.1, 1)
        assert c["exploration_fraction"] * 6_000_000 == 100_000  # epsilon 1 -> 0.1 over 100k steps
        assert (c["eval_every"], c["eval_episodes"], c["eval_greedy"]) == (50_000, 10, True)
    validate(exp, str(tmp_path / "folder"))


def test_the_c_chain_report_reads_a_real_run_at_the_papers_evaluation_points(tmp_path):
    """A real Double DQN + C-CHAIN run of the shortened sequence, evaluated as the experiment evaluates (at each task's
    step 0 and every `eval_every`, every game), read by `python -m continual.report c_chain`: the logged curve has a
    value at every evaluation point, 0 to the end, and none missing, each from the game the paper's code evaluates
    there; the run counts as finished; the score is the mean of those values as the table gives them."""
    from continual.report import c_chain

    steps, every = 128, 64
    cfg = shortened(steps)
    cfg["eval_every"] = every
    runs = tmp_path / "folder" / "runs"
    run_main("continual_training_example.py", "--config", write_config(tmp_path, cfg), "--architecture", "DQN",
             "--runs_dir", str(runs), "--run_name", "000_seed=1_c_chain", "--no-progress-bar", "--no-metrics",
             *AGENTS["DQN"])
    rows = list(csv.DictReader(open(runs / "000_seed=1_c_chain" / "eval_table.csv")))
    table = {(int(r["step"]), r["modification"]): float(r["mean"]) for r in rows}
    games = ["env=MinAtar/SpaceInvaders", "env=MinAtar/Asterix", SEAQUEST]
    points = list(range(0, 3 * steps + 1, every))
    assert {s for s, _ in table} == set(points)  # the boundaries (128, 256) and the end (384) included
    result = c_chain.report(str(tmp_path / "folder"))
    (rec,) = result["runs"]
    assert rec["finished"] and rec["missing"] == [] and rec["arm"] == "C-CHAIN"
    logged = [(s, min(s // steps, 2)) for s in points]  # at a boundary, the next game's step-0 evaluation
    assert [(s, k) for s, k, _ in rec["curve"]] == logged
    assert [v for _, _, v in rec["curve"]] == [table[(s, games[k])] for s, k in logged]
    assert rec["scores"]["score"] == pytest.approx(np.mean([table[(s, games[k])] for s, k in logged]), abs=1e-12)
    assert rec["final"] == {k: table[((k + 1) * steps, games[k])] for k in range(3)}
