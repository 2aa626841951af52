"""Continual evaluation during training: it never changes training, writes the evaluation table, TensorBoard tags,
metrics.json and plots; background evaluation matches foreground evaluation and leaves no process behind;
eval.py matrix mode."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import continual_training_example
from conftest import ROOT, exit_2, run_main, write_config
from continual.evaluation.continual import parse_eval_modifs
from continual.testing.processes import alive
from continual.training.tracking import read_metrics

TOTAL = 2304  # 18 iterations of 2 envs x 64 steps
CURRICULUM = {
    "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64, "update_epochs": 2,
    "reward_scaling": "none", "seed": 3,
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": TOTAL, "modifications": ["gravity=9.8", "gravity=15", "gravity=5"],
                                    "switching_thresholds": [768, 1536]},
}
EVAL_FLAGS = ["--eval_every", "512", "--eval_at_switches", "--eval_episodes", "2", "--eval_modifs", "length=0.8"]
REGIMES = {"gravity=9.8", "gravity=15", "gravity=5", "length=0.8"}
EVAL_STEPS = {0, 512, 768, 1024, 1536, 2048, 2304}  # step 0, every 512, before both switches, the end
FINAL_FLAGS = ["--eval_final_only", "--eval_episodes", "2", "--eval_modifs", "length=0.8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same seeded run four times, one after the other in this process (on one torch thread, as every test
    process runs): without evaluation, with it, with it in the background, with one evaluation at the end only."""
    tmp = tmp_path_factory.mktemp("ce")
    cfg = write_config(tmp, CURRICULUM, "cfg.json")
    runs_dir = str(tmp / "runs")
    common = ["--config", str(cfg), "--runs_dir", runs_dir, "--no-progress-bar", "--save_agent_with_switch", "--plots"]
    variants = {"plain": [], "fg": EVAL_FLAGS, "bg": EVAL_FLAGS + ["--eval_background"], "final": FINAL_FLAGS}
    out = {}
    for name, extra in variants.items():
        proc = run_main("continual_training_example.py", *common, "--run_name", name, *extra)
        out[name] = (os.path.join(runs_dir, name), proc.stdout)
    return out


def training_records(run_dir: str) -> list[dict]:
    """Episodes, iterations (losses) and switches, without timing fields."""
    keep = []
    for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")):
        if r["kind"] in ("episode", "iteration", "switch"):
            keep.append({k: v for k, v in r.items() if k not in ("time", "charts/SPS") and not k.startswith("time/")})
    return keep


def eval_table(run_dir: str) -> dict[tuple[int, str], dict]:
    with open(os.path.join(run_dir, "eval_table.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    table = {(int(r["step"]), r["modification"]): r for r in rows}
    assert len(table) == len(rows), "duplicated (step, regime) rows"
    return table


def test_evaluation_does_not_change_training(runs):
    plain = training_records(runs["plain"][0])
    assert sum(r["kind"] == "episode" for r in plain) > 20 and sum(r["kind"] == "switch" for r in plain) == 2
    assert any("losses/value_loss" in r for r in plain)
    for name in ("fg", "bg", "final"):
        assert training_records(runs[name][0]) == plain, name
    # and the final weights are the same tensors
    import torch

    finals = [torch.load(os.path.join(runs[n][0], "checkpoints", f"final__step{TOTAL}.cleanrl_model"),
                         weights_only=True)["model"] for n in ("plain", "fg", "bg")]
    for other in finals[1:]:
        assert all(torch.equal(finals[0][k], other[k]) for k in finals[0])


def test_evaluation_table_tags_metrics_and_plots(runs):
    run_dir, stdout = runs["fg"]
    table = eval_table(run_dir)
    assert {s for s, _ in table} == EVAL_STEPS
    assert {m for _, m in table} == REGIMES
    assert all(int(r["episodes"]) == 2 and float(r["seconds"]) >= 0 for r in table.values())
    assert {r["split"] for (_, m), r in table.items() if m == "length=0.8"} == {"heldout"}
    assert {r["split"] for (_, m), r in table.items() if m != "length=0.8"} == {"curriculum"}

    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert sum(r["kind"] == "eval" for r in records) == len(table)
    summary = [r for r in records if r["kind"] == "eval_summary"]
    assert len(summary) == 1 and 0 < summary[0]["time_share"] < 1
    assert "continual evaluation:" in stdout

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("eval/gravity=9.8", "eval/gravity=15", "eval/gravity=5", "eval/length=0.8", "eval/average",
                "eval/heldout_average", "eval/time_share"):
        assert tag in tags, tag
    assert [e.step for e in acc.Scalars("eval/gravity=15")] == sorted(EVAL_STEPS)

    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert [(v["regime"], v["start"], v["end"]) for v in metrics["visits"]] == [
        ("gravity=9.8", 0, 768), ("gravity=15", 768, 1536), ("gravity=5", 1536, TOTAL)]
    assert set(metrics["regimes"]) == REGIMES and metrics["regimes"]["length=0.8"]["heldout"]
    final = {m: float(table[(TOTAL, m)]["mean"]) for m in REGIMES}
    assert metrics["regimes"]["gravity=15"]["final"] == pytest.approx(final["gravity=15"])
    # isolated forgetting of the first regime during the second visit, from the table
    iso = float(table[(768, "gravity=9.8")]["mean"]) - float(table[(1536, "gravity=9.8")]["mean"])
    cell = [e for e in metrics["forgetting_matrix"] if e["regime"] == "gravity=9.8" and e["visit"] == 2]
    assert cell and cell[0]["value"] == pytest.approx(iso)

    pngs = sorted(os.listdir(os.path.join(run_dir, "plots")))
    assert pngs == ["eval_curves.png", "eval_heatmap.png", "plasticity.png", "training_returns.png"]
    assert sorted(os.listdir(os.path.join(runs["plain"][0], "plots"))) == ["plasticity.png", "training_returns.png"]
    assert not os.path.exists(os.path.join(runs["plain"][0], "eval_table.csv"))
    assert not os.path.exists(os.path.join(runs["plain"][0], "metrics.json"))


def test_eval_final_only_evaluates_every_regime_once_at_the_end(runs):
    run_dir, stdout = runs["final"]
    table = eval_table(run_dir)
    assert set(table) == {(TOTAL, m) for m in REGIMES}  # no step 0, no schedule, no switches
    assert all(int(r["episodes"]) == 2 and r["greedy"] == "False" for r in table.values())
    assert {r["split"] for (_, m), r in table.items()} == {"curriculum", "heldout"}
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert sorted(r["modification"] for r in records if r["kind"] == "eval") == sorted(REGIMES)
    assert "evaluation: at the end only, 2 games per regime" in stdout
    # the robustness report reads it as a finished run, one score per regime
    from continual.report.robustness import run_scores

    scores = run_scores(run_dir)
    assert scores["step"] == TOTAL and set(scores["scores"]) == REGIMES
    assert scores["scores"]["length=0.8"] == pytest.approx(float(table[(TOTAL, "length=0.8")]["mean"]))


def test_background_evaluation_matches_and_stops(runs):
    fg, bg = eval_table(runs["fg"][0]), eval_table(runs["bg"][0])
    assert set(fg) == set(bg)
    for key in fg:  # same weights, same seeds: the same games
        assert (fg[key]["mean"], fg[key]["episodes"]) == (bg[key]["mean"], bg[key]["episodes"]), key
    summary = [r for r in read_metrics(os.path.join(runs["bg"][0], "metrics.jsonl")) if r["kind"] == "eval_summary"]
    assert summary[0]["background"] and summary[0]["background_seconds"] > 0
    assert not alive(summary[0]["background_pid"])


def test_background_worker_exits_when_the_trainer_dies(tmp_path):
    """The trainer is killed without any cleanup (os._exit): its evaluation process notices and exits."""
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {ROOT!r})
        from continual.config.args import Args
        from continual.evaluation.continual import BackgroundEvaluation
        from continual.envs.vector import EnvSettings
        from agents.ppo import make_agent

        if __name__ == "__main__":
            args = Args(env_id="CartPole-v1", backend="Gymnasium")
            bg = BackgroundEvaluation(make_agent, args, EnvSettings.from_args(args, episodic_life=False), ["", "gravity=15"], 1,
                                      1, 0, False)
            assert bg.results.get(timeout=60)[0] == "ready"
            print(bg.pid, flush=True)
            os._exit(0)
    """)
    path = tmp_path / "die.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.split()[0])
    deadline = time.time() + 20
    while alive(pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not alive(pid)


def test_interrupted_background_run_stops_its_worker_and_resumes_the_table(tmp_path):
    cfg = write_config(tmp_path, {**CURRICULUM, "modification_factory_kwargs": {
        **CURRICULUM["modification_factory_kwargs"], "num_total_steps": 4608, "switching_thresholds": [1536, 3072]}},
        "cfg.json")
    runs_dir = str(tmp_path / "runs")
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "continual_training_example.py", "--config", str(cfg), "--runs_dir", runs_dir,
            "--run_name", "cut", "--no-progress-bar", "--eval_every", "256", "--eval_episodes", "1",
            "--eval_background"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(runs_dir, "cut", "metrics.jsonl")
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(metrics) and sum('"iteration"' in ln for ln in open(metrics)) >= 8:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, err
    summary = [r for r in read_metrics(metrics) if r["kind"] == "eval_summary"]
    assert summary and not alive(summary[-1]["background_pid"])
    cut = max(eval_table(os.path.join(runs_dir, "cut")))[0]
    assert 0 < cut < 4608

    run_main("continual_training_example.py", "--resume", os.path.join(runs_dir, "cut"), "--no-progress-bar")
    table = eval_table(os.path.join(runs_dir, "cut"))  # asserts no duplicated (step, regime) rows
    steps = sorted({s for s, _ in table})
    assert steps[0] == 0 and steps[-1] == 4608 and set(range(0, 4609, 256)) <= set(steps)
    assert all(len({m for s2, m in table if s2 == s}) == 3 for s in steps)


def test_eval_flags_are_checked_before_any_env(tmp_path, capsys):
    base = ["continual_training_example.py", "--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2",
            "--num_steps", "64", "--total_timesteps", "256", "--runs_dir", str(tmp_path / "runs")]
    _, err = exit_2(continual_training_example.main, [*base[1:], "--eval_every", "128", "--eval_modifs",
                    "gravity=15;wings=3"], capsys)
    assert err.startswith("error:") and "wings" in err
    assert not os.path.exists(tmp_path / "runs")  # nothing was created

    from continual.config.loading import parse_args
    from continual.errors import UserError

    for flag, value in (("--eval_episodes", "0"), ("--eval_every", "-1"), ("--eval_num_envs", "0"),
                        ("--eval_max_episode_steps", "0")):
        with pytest.raises(UserError, match=flag.lstrip("-")):
            parse_args([*base[1:], flag, value])
    for other in (["--eval_every", "128"], ["--eval_at_switches"]):
        with pytest.raises(UserError, match="eval_final_only"):
            parse_args([*base[1:], "--eval_final_only", *other])


def test_parse_eval_modifs():
    assert parse_eval_modifs("") == [] and parse_eval_modifs("  ") == []
    assert parse_eval_modifs("b a;c") == ["a b", "c"]
    assert parse_eval_modifs("disable_cars;") == ["disable_cars", ""]
    assert parse_eval_modifs("x;x ; x") == ["x"]


def test_eval_matrix_mode(runs, tmp_path):
    run_dir = runs["fg"][0]
    ckpts = [os.path.join(run_dir, "checkpoints", n) for n in
             ("switch__gravity=9.8__step768.cleanrl_model", f"final__step{TOTAL}.cleanrl_model")]
    out = str(tmp_path / "m")
    proc = run_main("eval.py", "--agent_path", *ckpts, "--modifs", "gravity=9.8", "gravity=5",
                    "--eval_episodes", "2", "--greedy", "--output", out)
    assert "evaluation matrix" in proc.stdout
    with open(out + "_matrix.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["checkpoint", "global_step", "gravity=9.8", "gravity=5"]
    assert [r[:2] for r in rows[1:]] == [["fg/switch__gravity=9.8__step768", "768"],
                                         [f"fg/final__step{TOTAL}", str(TOTAL)]]
    data = json.load(open(out + ".json"))
    assert len(data["results"]) == 4 and all(r["episodes"] == 2 for r in data["results"])
    with open(out + "_matrix.png", "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_evaluate_regimes_seeding_and_private_sampling():
    """--eval_reseed replays the same games; sampling never touches the global RNG states."""
    import random

    import numpy as np
    import torch

    from agents.ppo import Agent
    from continual.config.args import Args
    from continual.envs.vector import EnvSettings, make_vector_env
    from continual.evaluation import continual as ce

    args = Args(env_id="CartPole-v1", backend="Gymnasium")
    envs = make_vector_env(EnvSettings.from_args(args, episodic_life=False), 2, "", "sync")
    try:
        torch.manual_seed(0)
        actor = ce.PolicyActor(Agent((4,), 2), greedy=False)
        before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        cpu = torch.device("cpu")
        first = [r for r, _ in ce.evaluate_regimes(actor, envs, ["", "gravity=15"], 4, cpu, seed=7, reseed=True)]
        again = [r for r, _ in ce.evaluate_regimes(actor, envs, ["", "gravity=15"], 4, cpu, seed=7, reseed=True)]
        assert first == again and [r["modification"] for r in first] == ["", "gravity=15"]
        ce.evaluate_regimes(actor, envs, ["gravity=15"], 4, cpu, seed=7)  # seeded once already: streams go on
        after = (random.getstate(), np.random.get_state()[1], torch.get_rng_state())
        assert before[0] == after[0] and np.array_equal(before[1], after[1]) and torch.equal(before[2], after[2])
    finally:
        envs.close()


def test_the_end_of_run_plasticity_hint_names_flags_the_training_scripts_take(monkeypatch, capsys):
    """No visit measured plasticity: the line names --max_episode_steps (a training flag) and --plasticity_window only
    with the metrics command that takes it (the training scripts reject it)."""
    from continual.evaluation import continual as ceval

    shown = []
    monkeypatch.setattr(ceval.metrics, "print_run_table", lambda result: shown.append(result))
    result = {"regimes": {}, "summary": {"plasticity_by_visit": {1: None, 2: None}, "plasticity": None}}
    ceval.print_run_metrics(result, "runs/x")
    out = capsys.readouterr().out
    assert shown[0]["summary"]["plasticity_by_visit"] == {}  # the table prints no plasticity line of its own
    assert "--max_episode_steps" in out and "python -m continual.evaluation.metrics runs/x --plasticity_window K" in out
    assert "or set --plasticity_window" not in out
    measured = {"regimes": {}, "summary": {"plasticity_by_visit": {1: 0.5}, "plasticity": 0.5}}
    ceval.print_run_metrics(measured, "runs/x")
    assert shown[1] is measured and capsys.readouterr().out == ""
