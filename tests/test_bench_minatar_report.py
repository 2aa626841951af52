"""bench/minatar_report.py on hand-made run directories: the final return (mean of the training episodes in the last
10% of the steps) and its t-interval against an independent float64 computation with scipy, runs still going kept
out of the means, the protocol read from the env id and step cap (a gymnax run with another cap is its own row,
without gymnax's reference), and the files it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from conftest import write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "minatar_report.py")
TOTAL = 1000


def write_run(folder, name, env_id, seed, returns, cap=None, last_step=TOTAL):
    """`returns`: (global_step, return) of the training episodes; iterations every 100 steps up to `last_step`."""
    d = os.path.join(folder, "runs", name)
    os.makedirs(d)
    write_config(d, {"env_id": env_id, "seed": seed, "total_timesteps": TOTAL, "max_episode_steps": cap}, "config.json")
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step, ret in returns:
            f.write(json.dumps({"kind": "episode", "global_step": step, "return": ret}) + "\n")
        for step in range(100, last_step + 1, 100):
            f.write(json.dumps({"kind": "iteration", "global_step": step, "charts/SPS": 1000 + step}) + "\n")


def run_report(folder, out):
    proc = subprocess.run([sys.executable, SCRIPT, folder, "--out", out], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(out, "report.json")) as f:
        return {(row["protocol"], row["game"]): row for row in json.load(f)["table"]}, proc.stdout


def test_final_return_and_interval_match_an_independent_computation(tmp_path):
    rng = np.random.default_rng(0)
    folder, finals = str(tmp_path / "exp"), []
    for seed in (1, 2, 3):
        steps = np.sort(rng.integers(1, TOTAL + 1, size=200))
        rets = rng.normal(10 * seed, 3, size=200)
        write_run(folder, f"b{seed}", "MinAtar/Breakout-v1", seed, list(zip(steps.tolist(), rets.tolist())), cap=1000)
        finals.append(float(np.mean(rets[steps > 0.9 * TOTAL], dtype=np.float64)))
    # a run still going: shown, kept out of the mean
    write_run(folder, "b4", "MinAtar/Breakout-v1", 4, [(50, 99.0), (400, 99.0)], cap=1000, last_step=500)
    table, stdout = run_report(folder, str(tmp_path / "out"))
    row = table[("gymnax", "Breakout")]
    assert row["n_done"] == 3
    assert row["mean"] == pytest.approx(np.mean(finals), rel=1e-12)
    half = stats.t.ppf(0.975, 2) * np.std(finals, ddof=1) / np.sqrt(3)
    assert row["ci95_half_width"] == pytest.approx(half, rel=1e-6)
    assert [s["done"] for s in sorted(row["seeds"], key=lambda s: s["seed"])] == [True, True, True, False]
    assert "- (at 0.00M, running)" in stdout and "PureJaxRL" in stdout
    assert os.path.getsize(tmp_path / "out" / "curves.png") > 0
    assert "| gymnax | Breakout |" in (tmp_path / "out" / "report.md").read_text()


def test_protocol_follows_env_id_and_step_cap(tmp_path):
    folder = str(tmp_path / "exp")
    write_run(folder, "f1000", "MinAtar/Freeway-v1", 1, [(950, 20.0)], cap=1000)
    write_run(folder, "f2500", "MinAtar/Freeway-v1", 1, [(950, 50.0)], cap=2500)
    write_run(folder, "fsticky", "MinAtar/Freeway", 1, [(950, 48.0)])
    table, _ = run_report(folder, str(tmp_path / "out"))
    assert set(table) == {("gymnax, 1000-step cap", "Freeway"), ("gymnax", "Freeway"), ("minatar", "Freeway")}
    assert table[("gymnax", "Freeway")]["mean"] == 50.0
    assert table[("gymnax, 1000-step cap", "Freeway")]["reference"][1] == "not measured"
    assert "gymnax-blines" in table[("gymnax", "Freeway")]["reference"][0]
    assert "MinAtar paper" in table[("minatar", "Freeway")]["reference"][0]
