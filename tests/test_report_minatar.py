"""continual/report/minatar.py (`python -m continual.report minatar`) on hand-made run directories: the final return (mean of the training episodes in the last
10% of the steps) and its t-interval against an independent float64 computation with scipy, runs still going kept
out of the means, the protocol read from the env id and step cap (a gymnax run with another cap is its own row,
without gymnax's reference), and the files it writes; rebuilt from the committed reports' per-run records, it
reproduces them (the stated differences: the heading names the report.json, and minatar_ppo_1m's reference label was
reworded after that report was written)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from conftest import write_config
from continual.report.__main__ import main as report_main
from continual.report.minatar import PAPER, report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def run_report(folder, out, process: bool = True):
    """`python -m continual.report minatar FOLDER --out OUT` as a process, or its main in this process: (the table
    by (protocol, game), what it printed)."""
    if process:
        proc = subprocess.run([sys.executable, "-m", "continual.report", "minatar", folder, "--out", out],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 0, proc.stderr
        stdout = proc.stdout
    else:
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            report_main(["minatar", folder, "--out", out])
        stdout = printed.getvalue()
    with open(os.path.join(out, "report.json")) as f:
        return {(row["protocol"], row["game"]): row for row in json.load(f)["table"]}, stdout


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
    table, _ = run_report(folder, str(tmp_path / "out"), process=False)
    assert set(table) == {("gymnax, 1000-step cap", "Freeway"), ("gymnax", "Freeway"), ("minatar", "Freeway")}
    assert table[("gymnax", "Freeway")]["mean"] == 50.0
    assert table[("gymnax, 1000-step cap", "Freeway")]["reference"][1] == "not measured"
    assert "gymnax-blines" in table[("gymnax", "Freeway")]["reference"][0]
    assert "MinAtar paper" in table[("minatar", "Freeway")]["reference"][0]


@pytest.mark.parametrize("name", ["minatar_reference", "minatar_ppo_1m"])
def test_rebuilt_from_the_committed_report_json_reproduces_it(name, tmp_path):
    committed = os.path.join(ROOT, "bench", "results", name)
    out = tmp_path / "out"
    report(None, str(out), from_report=os.path.join(committed, "report.json"))
    with open(os.path.join(committed, "curves.png"), "rb") as f:
        assert (out / "curves.png").read_bytes() == f.read()
    with open(os.path.join(committed, "report.md"), encoding="utf-8") as f:
        old = f.read().splitlines()
    new = (out / "report.md").read_text().splitlines()
    assert new[0] == f"# MinAtar single-task reference ({os.path.join(committed, 'report.json')})"
    assert old[0] == f"# MinAtar single-task reference (/work/experiments/{name})"
    if name == "minatar_reference":
        assert new[1:] == old[1:]
        with open(os.path.join(committed, "report.json"), "rb") as f:
            assert (out / "report.json").read_bytes() == f.read()
    else:  # only the reference label differs: "AC(lambda), 5M frames" became "AC(0.8), 5M frames, read from ..."
        label = "MinAtar paper DQN / AC(lambda), 5M frames"
        assert [line.replace(PAPER, label) for line in new[1:]] == old[1:] and any(label in line for line in old)


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    for argv, message in ((["minatar", str(tmp_path)], "no runs/ folder"),
                          (["minatar", "--from-report", str(tmp_path / "none.json")], "not a readable report.json"),
                          (["minatar"], "give the experiment FOLDER"),
                          (["minatar", str(tmp_path), "--early", "2"], "--early is for the plasticity report")):
        with pytest.raises(SystemExit) as e:
            report_main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and message in err and len(err.splitlines()) == 1, (argv, err)
    assert os.listdir(tmp_path) == []
