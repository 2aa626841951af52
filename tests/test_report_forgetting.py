"""continual.report.forgetting on hand-made experiment folders: the declared primary metric (CORA's isolated
forgetting, smoothed and scaled per method) against a pandas computation from CORA's definition, the reference
normalisation, the exact pair tests, the protocol read from the runs, post-hoc marks, and the refusals."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pandas as pd
import pytest

from continual.report import forgetting as F
from continual.report.__main__ import main as report_main

SI, BR = "env=MinAtar/SpaceInvaders", "env=MinAtar/Breakout"
STEPS = list(range(0, 401, 10))  # SI (0,100], BR (100,200], SI (200,300], BR (300,400]
SWITCHES = ((100, SI, BR), (200, BR, SI), (300, SI, BR))
WINDOW = 2


def write_run(folder, name, label, arch, seed, curves, steps=STEPS, switches=SWITCHES, greedy=True):
    d = os.path.join(folder, "runs", name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"exp_name": label, "seed": seed, "architecture": arch, "eval_greedy": greedy, "eval_episodes": 10,
                   "eval_every": 10, "eval_at_switches": True}, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step, prev, new in switches:
            f.write(json.dumps({"kind": "switch", "global_step": step, "previous": prev, "modification": new}) + "\n")
        f.write(json.dumps({"kind": "iteration", "global_step": steps[-1], "modification": next(iter(curves))}) + "\n")
    with open(os.path.join(d, "eval_table.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "modification", "slug", "split", "episodes", "mean", "greedy"])
        for task, ys in curves.items():
            for s, y in zip(steps, ys):
                w.writerow([s, task, "x", "curriculum", 10, y, greedy])
    os.makedirs(os.path.join(folder, "queue"), exist_ok=True)
    with open(os.path.join(folder, "queue", f"{name}.status.json"), "w") as f:
        json.dump({"state": "done"}, f)


def curve(rng, learn_si, drop):
    """SI rises during its visits and falls by `drop` per step of a BR visit; BR rises during its own."""
    si, br, a, b = [], [], 0.0, 0.0
    for s in STEPS:
        phase = min(s // 100, 3) if s < 400 else 3
        if s > 0:
            on_si = (s - 1) // 100 in (0, 2)
            a = a + learn_si if on_si else max(0.0, a - drop)
            b = b + (0.0 if on_si else 1.0)
        si.append(a + rng.normal(0, 0.3))
        br.append(b + rng.normal(0, 0.3))
        del phase
    return {SI: si, BR: br}


@pytest.fixture
def folder(tmp_path):
    f = str(tmp_path / "exp")
    rng = np.random.default_rng(3)
    runs = {}
    for i, (label, arch, drop) in enumerate([("IMPALA", "IMPALA", 3.0)] * 3 + [("CLEAR", "CLEAR", 0.5)] * 3 +
                                            [("PPO", "PPO", 2.0)] * 2):
        c = curve(rng, 5.0, drop + 0.1 * i)
        runs[(label, i)] = c
        write_run(f, f"{i:03d}_{label}_seed={i}", label, arch, 1000 + i, c)
    for j, (fam, task, final) in enumerate([("IMPALA", SI, 40.0), ("IMPALA", BR, 10.0), ("PPO", SI, 60.0),
                                            ("PPO", BR, 30.0)]):
        ys = list(np.linspace(0, final, 11))
        write_run(f, f"1{j:02d}_reference", f"reference {fam} {task[11:]}", fam, 1000, {task: ys},
                  steps=list(range(0, 101, 10)), switches=())
    with open(os.path.join(f, "experiment.json"), "w") as fh:
        json.dump({"_declared": {"primary_metric": {"name": "cora_forgetting", "task": "MinAtar/SpaceInvaders",
                                                    "num_cycles_for_forgetting": 1, "rolling_mean_count": WINDOW},
                                 "pairs": [["CLEAR", "IMPALA"], ["IMPALA+EWC", "IMPALA"]],
                                 "primary_pair": ["CLEAR", "IMPALA"]},
                   "post_hoc": [{"label": "PPO", "reason": "test"}]}, fh)
    return f, runs


def cora_primary_by_hand(curves: list[dict]) -> list[float]:
    """CORA's definition, written with pandas: trailing mean over WINDOW points (min_periods 1), scale = the largest
    |smoothed| SI value over the method's runs, before = last smoothed point with step < 100 (BR's visit starts),
    after = last smoothed point with 100 < step < 200."""
    sm = [pd.Series(c[SI], index=STEPS).rolling(WINDOW, min_periods=1).mean() for c in curves]
    scale = max(float(s.abs().max()) for s in sm)
    out = []
    for s in sm:
        before = s[s.index < 100].iloc[-1]
        after = s[(s.index > 100) & (s.index < 200)].iloc[-1]
        out.append(float((before - after) / scale))
    return out


def test_primary_metric_pairs_and_normalisation(folder, tmp_path):
    path, runs = folder
    res = F.report(path, str(tmp_path / "out"))
    for label in ("IMPALA", "CLEAR"):
        expected = cora_primary_by_hand([c for (lab, _), c in sorted(runs.items()) if lab == label])
        assert np.allclose(res["per_method"][label]["primary"], expected, rtol=1e-12)
        assert res["table"][label]["primary"]["n"] == 3 and res["table"][label]["primary"]["method"] == "t"
    # CLEAR forgets less than IMPALA in all 9 pairs of runs: exact one-sided Mann-Whitney p = 1 / C(6, 3)
    c = res["comparisons"]["CLEAR vs IMPALA"]["primary"]
    assert c["probability_of_improvement"]["estimate"] == 1.0
    assert c["mann_whitney"]["p"] == pytest.approx(1 / 20) and c["permutation"]["p"] == pytest.approx(1 / 20)
    assert res["comparisons"]["IMPALA+EWC vs IMPALA"] == {"missing": ["IMPALA+EWC"]}
    # P(T) in reference units: both families' references, mean final (last 5 evaluations) per task
    ref = res["normalisation"]["reference_final_return"]
    assert ref[SI] == pytest.approx(np.mean([np.linspace(0, 40, 11)[-5:].mean(), np.linspace(0, 60, 11)[-5:].mean()]))
    run = runs[("CLEAR", 3)]
    pt = np.mean([np.mean(run[SI][-5:]) / ref[SI], np.mean(run[BR][-5:]) / ref[BR]])
    assert res["per_method"]["CLEAR"]["average_performance"][0] == pytest.approx(pt)
    md = open(tmp_path / "out" / "report.md").read()
    assert "greedy (argmax) actions, 10 whole games" in md and "| PPO † |" in md and "post hoc" in md
    assert os.path.getsize(tmp_path / "out" / "curves.png") > 1000


def test_mixed_protocol_is_printed_as_mixed(folder, tmp_path):
    path, runs = folder
    write_run(path, "050_PPO_sampled", "PPO", "PPO", 1099, runs[("PPO", 6)], greedy=False)
    res = F.report(path)
    assert "MIXED greedy" in res["markdown"][0]


def test_refusals_are_one_line_exit_2(tmp_path, capsys):
    for argv in (["forgetting", str(tmp_path / "nope")], ["forgetting", str(tmp_path)]):
        os.makedirs(tmp_path / "runs", exist_ok=argv[1] == str(tmp_path))
        with pytest.raises(SystemExit) as e:
            report_main(argv)
        assert e.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
