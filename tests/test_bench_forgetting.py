"""bench/forgetting.py's aggregation on hand-made run directories (no training): the per-method table (means over
runs x tasks and their stratified-bootstrap CIs), the per-task curves with their t bands, the resumable run loop
(finished runs skipped, a failed run trained again) and bad input (one line, exit 2, nothing created)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import load_bench, write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

F = load_bench("forgetting")

A, B = "env=MinAtar/Breakout", "env=MinAtar/SpaceInvaders"
# schedule A (0,10], B (10,20], A (20,30], B (30,40]; evaluations at 0 and at every switch and the end
STEPS = [0, 10, 20, 30, 40]
RUNS = {  # (method, seed) -> task -> evaluation returns at STEPS
    ("PPO", 1): {A: [0, 4, 2, 6, 3], B: [1, 1, 5, 2, 7]},
    ("PPO", 2): {A: [0, 2, 2, 4, 4], B: [0, 3, 5, 5, 5]},
    ("IMPALA", 1): {A: [1, 1, 1, 1, 1], B: [2, 2, 8, 2, 2]},
}


def write_run(runs_dir: str, method: str, seed: int, curves: dict, done: bool = True) -> str:
    d = os.path.join(runs_dir, F.run_slug(method, seed))
    os.makedirs(d)
    write_config(d, {"architecture": method.split("+")[0], "possible_modifications": [A, B]}, "config.json")
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step, prev, new in ((10, A, B), (20, B, A), (30, A, B)):
            f.write(json.dumps({"kind": "switch", "global_step": step, "previous": prev, "modification": new}) + "\n")
        f.write(json.dumps({"kind": "iteration", "global_step": 40, "modification": B}) + "\n")
    with open(os.path.join(d, "eval_table.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "modification", "slug", "split", "episodes", "mean"])
        for task, ys in curves.items():
            for s, y in zip(STEPS, ys):
                w.writerow([s, task, "x", "curriculum", 8, y])
    if done:
        json.dump({"method": method, "seed": seed, "wall_s": 1.0}, open(os.path.join(d, F.DONE), "w"))
    return d


@pytest.fixture
def runs_dir(tmp_path):
    d = str(tmp_path / "runs")
    for (method, seed), curves in RUNS.items():
        write_run(d, method, seed, curves)
    write_run(d, "PPO", 3, RUNS[("PPO", 1)], done=False)  # unfinished: left out
    return d


def test_load_done_keeps_finished_runs_in_seed_order(runs_dir):
    done = F.load_done(runs_dir, ["PPO", "IMPALA", "PPO_CBP"])
    assert list(done) == ["PPO", "IMPALA"]
    assert [os.path.basename(r.run_dir) for r in done["PPO"]] == ["PPO__s1", "PPO__s2"]
    assert F.load_done(runs_dir, ["IMPALA"]).keys() == {"IMPALA"}


def test_method_table_by_hand(runs_dir):
    agg = F.aggregate(F.load_done(runs_dir, ["PPO", "IMPALA"]), normalize="raw", reps=2000)
    ppo, imp = agg["table"]["PPO"], agg["table"]["IMPALA"]
    # final: A 3, B 7 (seed 1); A 4, B 5 (seed 2)
    assert ppo["final"]["matrix"] == [[3, 7], [4, 5]] and ppo["final"]["mean"] == pytest.approx(4.75)
    # Continual World forgetting, over all tasks: A's last visit ends at 30: seed 1 6 - 3, seed 2 4 - 4; B is
    # trained to the end: 0
    assert ppo["forgetting_last_visit"]["tasks"] == [A, B] and ppo["forgetting_last_visit"]["matrix"] == [[3, 0], [0, 0]]
    assert ppo["forgetting_last_visit"]["mean"] == pytest.approx(0.75)
    # resampling 2 runs per task: the mean is 0, 0.75 or 1.5 with probabilities 1/4, 1/2, 1/4 -> 95% [0, 1.5]
    assert ppo["forgetting_last_visit"]["ci95"] == [0.0, 1.5]
    # all later visits: seed 1 A: (4 - 2, 6 - 3) -> 2.5, B: 5 - 2 = 3; seed 2 A: (2 - 2, 4 - 4) -> 0, B: 5 - 5 = 0
    assert ppo["forgetting_all_visits"]["matrix"] == [[2.5, 3], [0, 0]]
    assert ppo["forgetting_all_visits"]["mean"] == pytest.approx(1.375)
    # zero-shot transfer to B while A is first trained: seed 1 1 - 1, seed 2 3 - 0
    assert ppo["transfer_zero_shot"]["tasks"] == [B] and ppo["transfer_zero_shot"]["matrix"] == [[0], [3]]
    assert ppo["transfer_zero_shot"]["mean"] == pytest.approx(1.5)
    # IMPALA, one run: A flat; B reaches 8 by the end of its first visit and is back at 2 after A's second visit
    assert imp["final"]["mean"] == pytest.approx(1.5) and imp["final"]["ci95"] == [1.5, 1.5]
    assert imp["forgetting_all_visits"]["matrix"] == [[0, 6]]
    assert imp["forgetting_last_visit"]["mean"] == 0
    # the printed row
    row = F.table_rows(agg["table"])[0]
    assert row[:2] == ["PPO", "2"] and row[4] == "+0.750 [+0.000, +1.500]"


def test_scale_from_another_benchmark_divides_by_its_max_abs(runs_dir):
    """--scale_from: returns divided by a stored benchmark's per-task max|R|, not these runs' own (A 6, B 7 here)."""
    done = F.load_done(runs_dir, ["PPO"])
    own, stored = F.aggregate(done, "max_abs", reps=10), F.aggregate(done, "max_abs", reps=10, scale={A: 3.0, B: 2.0})
    assert own["scale"] == {A: 6.0, B: 7.0} and stored["scale"] == {A: 3.0, B: 2.0}
    # final A 3, B 7 (seed 1); A 4, B 5 (seed 2)
    assert stored["table"]["PPO"]["final"]["matrix"] == [[1.0, 3.5], [4 / 3, 2.5]]
    assert own["table"]["PPO"]["final"]["matrix"] == [[0.5, 1.0], [4 / 6, 5 / 7]]


def test_curves_mean_and_t_band(runs_dir):
    agg = F.aggregate(F.load_done(runs_dir, ["PPO", "IMPALA"]), normalize="raw", reps=10)
    c = agg["curves"]["PPO"][A]
    assert c["steps"] == STEPS and c["n"] == 2
    assert c["mean"] == pytest.approx([0, 3, 2, 5, 3.5])
    # two values differing by d: sd = d / sqrt 2, half-width t_{0.975,1} sd / sqrt 2 = 12.706 d / 2
    assert c["ci95"] == pytest.approx([0, 12.7062 * 2 / 2, 0, 12.7062 * 2 / 2, 12.7062 * 1 / 2], rel=1e-4)
    assert agg["curves"]["IMPALA"][B]["ci95"] == [0.0] * 5  # one run: no band
    assert agg["visits"] == [[A, 0, 10], [B, 10, 20], [A, 20, 30], [B, 30, 40]]


def test_max_abs_normalisation_scales_by_the_largest_return_of_all_runs(runs_dir):
    agg = F.aggregate(F.load_done(runs_dir, ["PPO", "IMPALA"]), normalize="max_abs", reps=10)
    assert agg["scale"] == {A: 6.0, B: 8.0}
    assert np.allclose(agg["table"]["PPO"]["final"]["matrix"], [[3 / 6, 7 / 8], [4 / 6, 5 / 8]])
    assert agg["curves"]["PPO"][B]["mean"] == pytest.approx([0.5 / 8, 2 / 8, 5 / 8, 3.5 / 8, 6 / 8])


def test_main_resumes_and_retrains_a_failed_run(tmp_path, monkeypatch):
    runs, out = str(tmp_path / "runs"), str(tmp_path / "out")
    calls, failures = [], []

    def fake_train(method, seed, cfg_path, runs_dir, extra, log):
        calls.append((method, seed))
        if (method, seed) == ("IMPALA", 1) and not failures:
            failures.append(1)
            write_run(runs_dir, method, seed, RUNS[("IMPALA", 1)], done=False)  # crashed half-way
            raise subprocess.CalledProcessError(1, "train")
        curves = RUNS.get((method, seed), RUNS[("PPO", 1)])
        write_run(runs_dir, method, seed, curves, done=True)
        return 1.0

    monkeypatch.setattr(F, "train", fake_train)
    argv = ["--methods", "PPO", "IMPALA", "--seeds", "2", "--runs_dir", runs, "--out", out, "--bootstrap_reps", "10"]
    agg = F.main(argv)
    assert calls == [("PPO", 1), ("IMPALA", 1), ("PPO", 2), ("IMPALA", 2)]
    assert len(agg["runs"]["IMPALA"]) == 1  # seed 1 failed
    assert not os.path.exists(os.path.join(runs, F.run_slug("IMPALA", 1), F.DONE))
    calls.clear()
    agg = F.main(argv)
    assert calls == [("IMPALA", 1)]  # only the failed run
    assert len(agg["runs"]["IMPALA"]) == 2 and len(agg["runs"]["PPO"]) == 2
    for name in ("forgetting.json", "forgetting_curves.png", "forgetting_comparison.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    data = json.load(open(os.path.join(out, "forgetting.json")))
    assert set(data["table"]) == {"PPO", "IMPALA"}


def test_every_method_is_one_line_and_clear_pnc_are_listed():
    assert {"PPO", "PPO_CBP", "PPO+S&P", "IMPALA", "IMPALA+EWC", "IMPALA+online EWC", "CLEAR", "PNC"} <= set(F.METHODS)
    assert set(F.DEFAULT_METHODS) <= set(F.METHODS)


@pytest.mark.parametrize("argv, message", [
    (["--methods", "PPO", "Nope"], "error: --methods: unknown Nope"),
    (["--games", "Pong"], "error: --games: unknown Pong"),
    (["--seeds", "0"], "error: --seeds: must be positive"),
    (["--methods", "PPO", "PPO"], "error: --methods: a method is named twice"),
    (["--scale_from", "/nonexistent/forgetting.json"], "error: --scale_from: /nonexistent/forgetting.json is not"),
])
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, argv, message):
    runs, out = tmp_path / "runs", tmp_path / "out"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "forgetting.py"), *argv, "--runs_dir", str(runs),
                        "--out", str(out)], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stdout == "" and p.stderr.startswith(message) and p.stderr.count("\n") == 1
    assert not runs.exists() and not out.exists()
