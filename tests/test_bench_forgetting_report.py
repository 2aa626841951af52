"""bench/forgetting_report.py: the probability of improvement against hand-computed values, the metrics on
hand-made run directories of a launcher folder (grouping by exp_name, unfinished runs left out, the learned check
against single-task references, the EWC lambda choice, P&C's active column from training episodes), bad input
(one line, exit 2, nothing created), and the whole report on a tiny folder of real training runs, equal on its archive (continual.launch.archive)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import load_bench, write_config
from continual.launch import archive
from continual.launch.queue import Queue

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

R = load_bench("forgetting_report")

SI, BR = "env=MinAtar/SpaceInvaders", "env=MinAtar/Breakout"
STEPS = [0, 10, 20, 30, 40]  # SI (0,10], BR (10,20], SI (20,30], BR (30,40]; evaluations at 0, every switch, the end


def write_run(folder, name, label, seed, arch, curves, steps=STEPS, switches=((10, SI, BR), (20, BR, SI), (30, SI, BR)),
              episodes=(), done=True, iterations=()):
    d = os.path.join(folder, "runs", name)
    os.makedirs(d)
    write_config(d, {"exp_name": label, "seed": seed, "architecture": arch, "possible_modifications": list(curves)},
                 "config.json")
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step, prev, new in switches:
            f.write(json.dumps({"kind": "switch", "global_step": step, "previous": prev, "modification": new}) + "\n")
        for step, task, ret in episodes:
            f.write(json.dumps({"kind": "episode", "global_step": step, "modification": task, "return": ret}) + "\n")
        for record in iterations:
            f.write(json.dumps({"kind": "iteration", "modification": next(iter(curves)), **record}) + "\n")
        f.write(json.dumps({"kind": "iteration", "global_step": steps[-1], "modification": next(iter(curves))}) + "\n")
    with open(os.path.join(d, "eval_table.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "modification", "slug", "split", "episodes", "mean"])
        for task, ys in curves.items():
            for s, y in zip(steps, ys):
                w.writerow([s, task, "x", "curriculum", 8, y])
    if done:
        open(os.path.join(d, "metrics.json"), "w").write("{}")
    return d


@pytest.fixture
def folder(tmp_path):
    f = str(tmp_path / "exp")
    # PPO forgets SI during BR's visits (8 -> 4, 9 -> 5); IMPALA less; CLEAR not at all
    write_run(f, "000_seed=1_PPO", "PPO", 1, "PPO", {SI: [0, 8, 4, 9, 5], BR: [0, 0, 6, 3, 6]})
    write_run(f, "001_seed=2_PPO", "PPO", 2, "PPO", {SI: [0, 6, 2, 7, 3], BR: [0, 0, 4, 2, 5]})
    write_run(f, "002_seed=1_IMPALA", "IMPALA", 1, "IMPALA", {SI: [0, 4, 3, 5, 4], BR: [0, 0, 2, 1, 2]})
    write_run(f, "003_seed=2_IMPALA", "IMPALA", 2, "IMPALA", {SI: [0, 4, 2, 4, 2], BR: [0, 0, 2, 2, 2]})
    write_run(f, "004_seed=1_CLEAR", "CLEAR", 1, "CLEAR", {SI: [0, 4, 4, 5, 5], BR: [0, 0, 2, 2, 2]})
    write_run(f, "005_seed=2_CLEAR", "CLEAR", 2, "CLEAR", {SI: [0, 4, 4, 4, 4], BR: [0, 0, 2, 2, 3]})
    write_run(f, "006_seed=1_EWC_l1", "IMPALA+EWC lambda=1", 1, "IMPALA", {SI: [0, 4, 3, 5, 4], BR: [0, 0, 2, 1, 2]})
    write_run(f, "007_seed=1_EWC_l10", "IMPALA+EWC lambda=10", 1, "IMPALA", {SI: [0, 4, 4, 5, 5], BR: [0, 0, 1, 1, 1]})
    write_run(f, "008_seed=1_PNC", "PNC", 1, "PNC", {SI: [0, 2, 2, 3, 3], BR: [0, 0, 1, 1, 1]},
              episodes=[(5, SI, 1.0), (9, SI, 6.0), (10, SI, 8.0), (19, BR, 3.0), (20, BR, 4.0), (30, SI, 10.0), (40, BR, 2.0)],
              # progress then compress in each visit; the third visit's active column ends progress deterministic
              iterations=[{"global_step": s, "pnc/compress": float(s % 10 > 5 or s % 10 == 0), "losses/entropy": e}
                          for s, e in ((3, 1.0), (5, 0.5), (8, 0.4), (10, 0.4), (13, 0.9), (15, 0.7), (18, 0.6),
                                       (23, 0.3), (25, 0.005), (28, 0.005), (30, 0.02), (33, 1.0), (35, 0.8))])
    write_run(f, "009_seed=3_PPO", "PPO", 3, "PPO", {SI: [0, 1, 1, 1, 1], BR: [0, 0, 1, 1, 1]}, done=False)
    write_run(f, "00a_seed=1_CBP", "PPO_CBP", 1, "PPO_CBP", {SI: [0, 8, 6, 9, 7], BR: [0, 0, 6, 3, 6]})
    write_run(f, "00b_seed=1_cnn", "PPO (MinAtar CNN)", 1, "PPO", {SI: [0, 8, 4, 9, 5], BR: [0, 0, 6, 3, 6]})
    # single-task references (one visit of 10 steps, evaluated at 0, 5, 10)
    for i, (fam, task, ys) in enumerate((("PPO", SI, [0, 3, 8]), ("PPO", BR, [0, 2, 4]),
                                         ("IMPALA", SI, [0, 2, 4]), ("IMPALA", BR, [0, 1, 4]))):
        write_run(f, f"01{i}_ref", f"reference {fam} {task[11:]}", 1, fam, {task: ys}, steps=[0, 5, 10], switches=())
    return f


def test_probability_of_improvement_matches_hand_computed_values():
    # one task: pairs (1,2) lose, (1,0) win, (3,2) win, (3,0) win -> 3/4; ties count one half: (1,1) -> 0.5
    assert R.probability_of_improvement(np.array([[1.0], [3.0]]), np.array([[2.0], [0.0]]), reps=10)["estimate"] == 0.75
    x, y = np.array([[1.0, 1.0], [3.0, 2.0]]), np.array([[2.0, 1.0], [0.0, 0.0]])
    # task 2: (1,1) 0.5, (1,0) 1, (2,1) 1, (2,0) 1 -> 3.5/4; mean over tasks (0.75 + 0.875) / 2
    d = R.probability_of_improvement(x, y, reps=200)
    assert d["estimate"] == pytest.approx(0.8125)
    assert 0 <= d["ci95"][0] <= d["estimate"] <= d["ci95"][1] <= 1
    # lower is better: P(X < Y) = 1 - P(X > Y) without ties
    assert R.probability_of_improvement(np.array([[1.0], [3.0]]), np.array([[2.0], [0.0]]),
                                        lower_is_better=True, reps=10)["estimate"] == 0.25
    # identical scores: 0.5 exactly (rliable's rule)
    assert R.probability_of_improvement(x, x, reps=10)["estimate"] == 0.5


def test_report_on_hand_made_folder(folder):
    rep = R.report(folder, normalize="raw", reps=50)
    assert rep["unfinished"] == ["009_seed=3_PPO"]
    t = rep["table"]
    assert t["PPO"]["final"]["runs"] == 2
    # P(T): mean of finals over runs x tasks: (5 + 6 + 3 + 5) / 4
    assert t["PPO"]["final"]["mean"] == pytest.approx(4.75)
    # CW forgetting: SI's last visit ends at 30 (9, 7), final 5, 3 -> 4 each; BR trained last -> 0; mean 2
    assert t["PPO"]["forgetting_last_visit"]["mean"] == pytest.approx(2.0)
    # all later visits, SI: visit 2 (8->4, 6->2) and visit 4 (9->5, 7->3): 4; BR over visit 3: (6->3, 4->2): 3, 2
    assert t["PPO"]["forgetting_all_visits"]["matrix"] == [[4.0, 3.0], [4.0, 2.0]]
    assert t["CLEAR"]["forgetting_last_visit"]["mean"] == pytest.approx(0.0)
    # CLEAR forgets less than IMPALA on SI in every pair of runs (CW, tasks not trained last: SI only)
    clear = rep["improvement"]["CLEAR > IMPALA"]
    assert clear["forgetting_last_visit"]["tasks"] == [SI] and clear["forgetting_last_visit"]["estimate"] == 1.0
    assert "IMPALA+EWC lambda=10 > IMPALA" not in rep["improvement"]  # only the chosen lambda is paired
    assert "CLEAR > PNC" in rep["improvement"] and "CLEAR > IMPALA+EWC lambda=1" in rep["improvement"]
    assert "CLEAR > IMPALA+EWC lambda=10" not in rep["improvement"]
    # PPO_CBP against the family baseline and against its same-network control
    assert {"PPO_CBP > PPO", "PPO_CBP > PPO (MinAtar CNN)", "PPO (MinAtar CNN) > PPO"} <= set(rep["improvement"])
    # lambda sweep: P(T) (4 + 2) / 2 = 3 vs (5 + 1) / 2 = 3 -> tie; max keeps the first seen
    assert rep["lambda_sweeps"]["IMPALA+EWC"]["values"] == {"1": 3.0, "10": 3.0}
    assert rep["lambda_sweeps"]["IMPALA+EWC"]["chosen"] == "IMPALA+EWC lambda=1" and \
        "IMPALA+EWC lambda=1 > IMPALA" in rep["improvement"]
    # learned check: PPO SI at 10 = (8 + 6) / 2 = 7 vs PPO reference at 10 = 8; BR's first visit (10, 20] is 10
    # steps long: (6 + 4) / 2 = 5 vs 4
    assert rep["learned"]["PPO"][SI]["ratio"] == pytest.approx(7 / 8)
    assert rep["learned"]["PPO"][BR]["ratio"] == pytest.approx(5 / 4)
    assert rep["learned"]["IMPALA"][BR]["reference"] == pytest.approx(4.0) and rep["learned"]["PNC"][SI]["learned"]
    # forward transfer against the same-seed reference: PPO seed 1 on BR: curve over (10, 20] vs reference's (0, 10]
    assert rep["runs"]["PPO"][0]["regimes"][BR]["transfer_reference"] is not None
    # P&C: the active column's last 10% of each visit: SI (9, 10] -> 8, BR (19, 20] -> 4 (the
    # episodes at steps 9 and 19 are outside)
    pnc = rep["pnc"]["PNC"][0]
    assert [v["active"] for v in pnc] == [8.0, 4.0, 10.0, 2.0] and [v["kb"] for v in pnc] == [2, 1, 3, 1]
    # entropy at the first compress update (steps 8, 18, 28; none in the last visit) and the compress updates below
    # 0.01 (28 of 28, 30)
    assert [v["entropy_compress_start"] for v in pnc] == [0.4, 0.6, 0.005, None]
    assert [v["compress_collapsed"] for v in pnc] == [0.0, 0.0, 0.5, None]
    assert "| 3 | SpaceInvaders | 30 | 3.000 | 10.000 | 0.005 | 0.50 |" in R.markdown(rep).splitlines()


def test_the_report_on_an_archive_equals_the_report_on_its_folder(folder, tmp_path):
    """continual.launch.archive drops checkpoints and gzips metrics.jsonl: the report reads the archive the same."""
    q, kept = Queue(folder), Queue(str(tmp_path / "kept"))
    open(os.path.join(folder, "experiment.json"), "w").write("{}")
    q.create()
    names = sorted(os.listdir(os.path.join(folder, "runs")))
    for name in names:
        os.makedirs(os.path.join(q.run_dir(name), "checkpoints"))
        open(q.config_path(name), "w").write("{}")
        if os.path.exists(os.path.join(q.run_dir(name), "metrics.json")):  # finished
            q.set_status(name, state="done")
            assert archive.archive_entry(q, kept, name)
    assert not any(os.path.exists(os.path.join(kept.run_dir(n), f)) for n in names for f in ("metrics.jsonl", "checkpoints"))
    text = lambda f: json.dumps(R.report(f, normalize="raw", reps=50), sort_keys=True).replace(f, "F")  # noqa: E731
    a, b = json.loads(text(kept.folder)), json.loads(text(folder))
    assert b["unfinished"] == ["009_seed=3_PPO"] and a["unfinished"] == []  # an unfinished run is not archived
    assert {k: a[k] for k in a if a[k] != b[k]} == {"unfinished": []}  # and the rest is the same


def test_cli_writes_report_and_plots(folder, tmp_path):
    out = str(tmp_path / "out")
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "forgetting_report.py"), folder, "--out", out,
                    "--reps", "20"], check=True, capture_output=True, text=True)
    assert sorted(os.listdir(out)) == ["comparison.png", "curves.png", "improvement.png", "report.json", "report.md"]
    md = open(os.path.join(out, "report.md")).read()
    assert "| CLEAR > IMPALA |" in md and "IMPALA+EWC lambda=1 (chosen lambda)" in md and "knowledge base" in md


@pytest.mark.parametrize("args", [["/nonexistent"], ["FOLDER", "--reps", "0"], ["FOLDER", "--active_tail", "2"]])
def test_bad_input_is_one_line_exit_2_nothing_created(args, folder, tmp_path):
    out = str(tmp_path / "out")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "forgetting_report.py"),
                        *[folder if a == "FOLDER" else a for a in args], "--out", out], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error:") and not os.path.exists(out)


@pytest.mark.slow  # five real training processes in a row (~16 min on a loaded 2-core machine): -m slow
def test_report_on_a_tiny_folder_of_real_runs(tmp_path):
    """Real training runs (MinAtar SpaceInvaders -> Breakout x 2, 256 steps a visit, PPO x 2 seeds, P&C, a single-task
    PPO reference) in a launcher-style folder, then the report: every run is grouped, evaluated and reported."""
    folder = tmp_path / "exp"
    seq = {"cycles": 2, "tasks": [{"env_id": "MinAtar/SpaceInvaders", "steps": 256},
                                  {"env_id": "MinAtar/Breakout", "steps": 256}]}
    base = {"env_id": "MinAtar/SpaceInvaders", "backend": "MinAtar", "total_timesteps": 1024, "num_envs": 4,
            "num_steps": 64, "num_minibatches": 2, "update_epochs": 1, "eval_every": 0, "eval_at_switches": True,
            "eval_episodes": 1, "eval_max_episode_steps": 50, "checkpoint_every": 0, "anneal_lr": False,
            "modification_factory": "TaskSequence", "modification_factory_kwargs": seq}
    runs = {"000_seed=1_PPO": {"exp_name": "PPO", "seed": 1, "network": "mlp"},
            "001_seed=2_PPO": {"exp_name": "PPO", "seed": 2, "network": "mlp"},
            "002_seed=1_PNC": {"exp_name": "PNC", "seed": 1, "architecture": "PNC", "num_actors": 2, "unroll_length": 16,
                               "batch_size": 2},
            "003_seed=1_ref": {"exp_name": "reference PPO SpaceInvaders", "seed": 1, "network": "mlp",
                               "total_timesteps": 256, "modification_factory_kwargs": {"cycles": 1, "tasks": seq["tasks"][:1]}}}
    os.makedirs(folder / "configs")
    for name, kw in runs.items():
        cfg = write_config(folder / "configs", {**base, **kw}, f"{name}.json")
        subprocess.run([sys.executable, "continual_training_example.py", "--config", str(cfg), "--runs_dir",
                        str(folder / "runs"), "--run_name", name, "--torch_threads", "1", "--no-progress-bar"],
                       cwd=ROOT, check=True, capture_output=True, env={**os.environ, "WANDB_MODE": "disabled"})
    out = tmp_path / "out"
    R.main([str(folder), "--out", str(out), "--reps", "20"])
    rep = json.load(open(out / "report.json"))
    assert set(rep["table"]) == {"PPO", "PNC"} and rep["table"]["PPO"]["final"]["runs"] == 2
    assert rep["references"] and rep["unfinished"] == []
    assert [v[0] for v in rep["visits"]] == [SI, BR, SI, BR]
    for key in ("final", "forgetting_last_visit", "forgetting_all_visits", "transfer_zero_shot"):
        assert rep["table"]["PPO"][key]["mean"] is not None
    # the same-seed reference gives PPO seed 1 a Continual World transfer on SI (its first task: same steps)
    assert rep["runs"]["PPO"][0]["regimes"][SI]["transfer_reference"] is not None
    assert rep["learned"]["PPO"][SI]["reference_runs"] == 1
    assert len(rep["pnc"]["PNC"][0]) == 4 and all(v["kb"] is not None for v in rep["pnc"]["PNC"][0])
    assert "PNC > IMPALA" not in rep["improvement"]  # no IMPALA runs: no pair
    # provenance: every run at this checkout's commit, none resumed
    assert list(rep["provenance"]["commits"].values()) == [sorted(runs)] and rep["provenance"]["resumed"] == {}
    # the archive (checkpoints dropped, metrics.jsonl gzipped) gives the same report
    q, kept = Queue(str(folder)), Queue(str(tmp_path / "kept"))
    open(os.path.join(folder, "experiment.json"), "w").write("{}")
    q.create()
    for name in runs:
        q.set_status(name, state="done")
        assert archive.archive_entry(q, kept, name)
    assert not any("metrics.jsonl" == f or f == "checkpoints" for d in runs for f in os.listdir(kept.run_dir(d)))
    text = lambda f: json.dumps(R.report(f, reps=20), sort_keys=True).replace(f, "F")  # noqa: E731
    assert text(kept.folder) == text(str(folder))


def test_heldout_table_by_hand():
    """Held-out tasks (eval_modifs, never trained) get their own cells: the mean over runs x held-out tasks of
    final and time-average scores; trained tasks stay out of it, and a method without held-out tasks is absent."""
    def run(final_a, final_b, avg_a, avg_b):
        return {"regimes": {"train": {"heldout": False, "final": 9.0, "average": 9.0},
                            "A": {"heldout": True, "final": final_a, "average": avg_a},
                            "B": {"heldout": True, "final": final_b, "average": avg_b}}}

    results = {"m": [run(0.2, 0.6, 0.1, 0.3), run(0.4, 1.0, 0.5, 0.7)],
               "no_heldout": [{"regimes": {"train": {"heldout": False, "final": 1.0, "average": 1.0}}}]}
    table = R.heldout_table(results, reps=200)
    assert list(table) == ["m"] and table["m"]["tasks"] == ["A", "B"]
    assert table["m"]["final"]["mean"] == pytest.approx((0.2 + 0.6 + 0.4 + 1.0) / 4)
    assert table["m"]["average"]["mean"] == pytest.approx((0.1 + 0.3 + 0.5 + 0.7) / 4)
    assert table["m"]["final"]["per_task"] == pytest.approx({"A": 0.3, "B": 0.8})
    lo, hi = table["m"]["final"]["ci95"]
    # runs resampled within each task: the extremes are both runs' low values and both runs' high values
    assert (0.2 + 0.6) / 2 - 1e-12 <= lo <= hi <= (0.4 + 1.0) / 2 + 1e-12
