"""bench/plasticity_report.py: per-regime returns, the early-vs-late drop and its bootstrap CIs on hand-made run
directories; the whole report on a tiny real experiment folder (MinAtar with permuted channels and actions, two
methods x two seeds, trained here); the shipped experiment file (every entry validates, seeds fixed, one budget);
bad input (one line, exit 2, nothing created)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest

from conftest import load_bench, write_config
from continual.evaluation.metrics import bootstrap_mean
from continual.modstrings import normalize_modification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

R = load_bench("plasticity_report")

EXPERIMENT = os.path.join(ROOT, "configs", "experiments", "plasticity_minatar.json")
REGIMES = ["permute_obs=1", "permute_obs=2", "permute_obs=3", "permute_obs=4"]  # visits (0,10], (10,20], ...


def write_run(runs_dir: str, name: str, episodes: list[list[float]], total: int = 40, dormant=(0.1, 0.3),
              entropy: Optional[list[float]] = None, trac: Optional[list[float]] = None) -> str:
    """A run directory whose regime k (steps (10k, 10k+10]) has training episodes with `episodes[k]`'s returns, ending
    at steps 10k+1, 10k+2, ..., one iteration record at its end (policy entropy `entropy[k]` if given), and
    plasticity records at the first switch and the end."""
    d = os.path.join(runs_dir, name)
    os.makedirs(d)
    write_config(d, {"architecture": "PPO", "seed": 1, "resolved_total_timesteps": total, "modification_factory_kwargs": {
        "modifications": REGIMES, "switching_thresholds": [10, 20, 30]}}, "config.json")
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for k, rets in enumerate(episodes):
            if k:
                f.write(json.dumps({"kind": "switch", "global_step": 10 * k, "previous": REGIMES[k - 1],
                                    "modification": REGIMES[k]}) + "\n")
            for j, r in enumerate(rets):
                f.write(json.dumps({"kind": "episode", "global_step": 10 * k + 1 + j, "modification": REGIMES[k],
                                    "return": r}) + "\n")
            it = {"kind": "iteration", "global_step": 10 * k + 10, "modification": REGIMES[k]}
            if entropy is not None:
                it["losses/entropy"] = entropy[k]
            if trac is not None:
                it["plasticity/trac_scale"] = trac[k]
            f.write(json.dumps(it) + "\n")
        for step, dm in zip((10, 40), dormant):
            f.write(json.dumps({"kind": "plasticity", "global_step": step, "plasticity/dormant_fraction/all": dm,
                                "plasticity/effective_rank": 20.0 - 10 * dm, "plasticity/weight_norm/a": 3.0,
                                "plasticity/weight_norm/b": 4.0}) + "\n")
    return d


def tables(lines: list[str]) -> list[list[str]]:
    """The markdown tables among report lines (runs of lines starting with '|')."""
    out: list[list[str]] = []
    for i, line in enumerate(lines):
        if line.startswith("|"):
            if i == 0 or not lines[i - 1].startswith("|"):
                out.append([])
            out[-1].append(line)
    return out


def test_run_summary_by_hand(tmp_path):
    # regime returns: mean of the episodes ending in each visit; steps 8-10 of (0, 10] are its last quarter (> 7.5)
    eps = [[1, 3, 5, 5, 5, 5, 5, 5, 7, 9], [2, 4], [1, 1, 1], [0, 2]]
    d = write_run(str(tmp_path), "003_PPO_seed=2", eps)
    s = R.run_summary(d, early=2, late=2)
    assert s["method"] == "PPO" and s["seed"] == 2 and s["done"]
    assert s["regimes"] == [5.0, 3.0, 1.0, 1.0]
    assert s["final_quarter"][0] == 7.0  # the episodes ending at steps 8, 9 and 10: (5 + 7 + 9) / 3
    assert s["early"] == 4.0 and s["late"] == 1.0 and s["drop"] == 3.0 and s["relative_drop"] == 0.75
    assert s["diagnostics"][0] == {"step": 10, "dormant": 0.1, "effective_rank": 19.0, "weight_norm": 5.0}
    assert s["diagnostics"][-1]["dormant"] == 0.3
    assert s["collapsed"] is None  # no entropy logged


def test_time_average_weights_the_parts_of_a_visit_equally(tmp_path):
    # regime 1: four failing episodes end at step 1 (return 0), one good one at step 2 (return 10)
    d = write_run(str(tmp_path), "001_PPO_seed=1", [[0, 10], [4], [4], [4]])
    with open(os.path.join(d, "metrics.jsonl"), "a") as f:
        for _ in range(3):
            f.write(json.dumps({"kind": "episode", "global_step": 1, "modification": REGIMES[0], "return": 0}) + "\n")
    s = R.run_summary(d, early=1, late=1)
    assert s["regimes"][0] == 2.0  # (0 + 0 + 0 + 0 + 10) / 5
    assert s["time_average"] == [5.0, 4.0, 4.0, 4.0]  # parts (0, 1] and (1, 2]: 0 and 10; empty parts do not count
    assert s["drop"] == -2.0 and s["drop_time_average"] == 1.0 and s["late_time_average"] == 4.0


def test_collapsed_share_of_updates(tmp_path):
    # 2 of 4 updates below 0.01 nats; exactly 0.01 is not collapsed
    d = write_run(str(tmp_path), "003_PPO_seed=2", [[1], [1], [1], [1]], entropy=[1.05, 0.0, 0.009, 0.01])
    assert R.run_summary(d, early=1, late=1)["collapsed"] == 0.5


def test_trac_scale_per_regime_and_at_zero(tmp_path):
    runs_dir = str(tmp_path / "runs")
    scales = {1: [0.5, 0.0, 0.2, 0.0], 2: [0.7, 0.1, 0.0, 0.3]}
    for seed, s in scales.items():
        write_run(runs_dir, f"00{seed}_PPO_TRAC_seed={seed}", [[1], [1], [1], [1]], trac=s)
    write_run(runs_dir, "003_PPO_seed=1", [[1], [1], [1], [1]])
    runs = [R.run_summary(os.path.join(runs_dir, d), 1, 1) for d in sorted(os.listdir(runs_dir))]
    assert runs[0]["trac_scale_end"] == scales[1] and runs[0]["trac_scale_zero"] == 0.5
    assert "trac_scale_end" not in runs[2]
    table = R.summarize(runs)
    assert table["PPO_TRAC"]["trac_scale_end_median"] == pytest.approx([0.6, 0.05, 0.1, 0.15])
    assert table["PPO_TRAC"]["trac_scale_zero"] == [0.5, 0.25] and "trac_scale_zero" not in table["PPO"]
    lines = R.markdown(table, runs, type("A", (), {"early": 1, "late": 1})())
    assert "| PPO_TRAC | 0.6 | 0.05 | 0.1 | 0.15 | 0.50, 0.25 |" in lines
    assert all(len({row.count("|") for row in t}) == 1 for t in tables(lines))


def test_run_names_in_either_grid_order():
    assert R.parse_run_name("003_seed=2_PPO_ReDo") == ("PPO_ReDo", 2)
    assert R.parse_run_name("013_PPO_CBP_scaled_seed=12") == ("PPO_CBP_scaled", 12)
    assert R.parse_run_name("pilot_Breakout") is None


def test_unfinished_runs_and_unnamed_runs(tmp_path):
    d = write_run(str(tmp_path), "some_run", [[1], [2], [3], [4]], total=80)
    s = R.run_summary(d, early=1, late=1)
    assert not s["done"] and s["method"] == "PPO"  # the config's architecture when the name is not the launcher's
    assert R.run_summary(str(tmp_path / "missing"), 1, 1) is None


def test_summarize_drops_cis_and_differences_to_ppo(tmp_path):
    runs_dir = str(tmp_path / "runs")
    drops = {"PPO": [6, 5, 7], "PPO+S&P": [1, 0, 2]}
    for m, ds in drops.items():
        for seed, drop in enumerate(ds, 1):
            write_run(runs_dir, f"00{seed}_{m}_seed={seed}", [[10], [10], [10 - drop], [10 - drop]])
    write_run(runs_dir, "009_PPO_seed=9", [[1], [1]], total=40)  # unfinished: left out
    runs = [R.run_summary(os.path.join(runs_dir, d), 2, 2) for d in sorted(os.listdir(runs_dir))]
    table = R.summarize(runs)
    assert table["PPO"]["n"] == 3 and table["PPO"]["seeds"] == [1, 2, 3]
    expected = bootstrap_mean([6.0, 5.0, 7.0])
    assert table["PPO"]["drop"]["mean"] == 6.0 and table["PPO"]["drop"]["ci95"] == expected["ci95"]
    assert 5.0 <= expected["ci95"][0] < 6.0 < expected["ci95"][1] <= 7.0  # inside the seeds' range, excludes 0
    sp = table["PPO+S&P"]
    assert sp["late_minus_PPO"]["mean"] == pytest.approx(5.0) and sp["drop_minus_PPO"]["mean"] == pytest.approx(-5.0)
    lo, hi = sp["drop_minus_PPO"]["ci95"]
    assert -7.0 <= lo <= hi <= -3.0
    assert sp["p_late_above_PPO"]["mean"] == 1.0  # every S&P late return is above every PPO one
    lines = R.markdown(table, runs, type("A", (), {"early": 2, "late": 2})())
    assert any(line.startswith("| PPO | 3 | 10.0") for line in lines)
    header = next(line for line in lines if line.startswith("| method"))
    assert "late - PPO |" in header and "PPO_fresh" not in header  # a baseline without runs gets no columns
    assert all(len({row.count("|") for row in t}) == 1 for t in tables(lines))  # every row as wide as its header
    assert any("009_PPO_seed=9" in line for line in lines)


def test_differences_to_a_fresh_network(tmp_path):
    # late returns: PPO 4, PPO_fresh 6, a remedy 7 and 5 over its two seeds
    runs_dir = str(tmp_path / "runs")
    lates = {"PPO": [4, 4], "PPO_fresh": [6, 6], "PPO_ReDo": [7, 5]}
    for i, (m, ls) in enumerate(lates.items()):
        for seed, late in enumerate(ls, 1):
            write_run(runs_dir, f"{i}{seed}_{m}_seed={seed}", [[10], [10], [late], [late]])
    runs = [R.run_summary(os.path.join(runs_dir, d), 2, 2) for d in sorted(os.listdir(runs_dir))]
    table = R.summarize(runs)
    redo = table["PPO_ReDo"]
    assert redo["late_minus_PPO_fresh"]["mean"] == pytest.approx(0.0)
    assert redo["p_late_above_PPO_fresh"]["mean"] == 0.5  # one seed above, one below every fresh seed
    assert redo["late_minus_PPO"]["mean"] == pytest.approx(2.0)
    assert redo["late_time_average_minus_PPO_fresh"]["mean"] == pytest.approx(0.0)  # one episode per part here
    assert table["PPO_fresh"]["late_minus_PPO"]["mean"] == pytest.approx(2.0)
    assert "late_minus_PPO_fresh" not in table["PPO_fresh"] and "late_minus_PPO" not in table["PPO"]
    lines = R.markdown(table, runs, type("A", (), {"early": 2, "late": 2})())
    header = next(line for line in lines if line.startswith("| method"))
    assert "late - PPO_fresh | P(late > PPO_fresh) |" in header
    assert "| PPO_ReDo | 4.0 [3.0, 5.0] | 4.0 [3.0, 5.0] | 6.0 [5.0, 7.0] | 0.0 [-1.0, 1.0] |" in lines  # sensitivity
    rows = [line for line in tables(lines)[0] if line.startswith("| PPO")]
    assert [r.split(" | ")[0] for r in rows] == ["| PPO", "| PPO_fresh", "| PPO_ReDo"]  # baselines first
    assert all(len({row.count("|") for row in t}) == 1 for t in tables(lines))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A real experiment folder: PPO and PPO + S&P, seeds 1 and 2, 4 permuted Breakout regimes of 2,048 steps,
    trained by the training script under the launcher's run names."""
    folder = tmp_path_factory.mktemp("plasticity_experiment")
    cfg = {"env_id": "MinAtar/Breakout-v1", "backend": "MinAtar", "num_envs": 8, "num_steps": 32,
           "num_minibatches": 2, "update_epochs": 1, "learning_rate": 5e-3, "anneal_lr": False,
           "total_timesteps": 8192, "max_episode_steps": 200, "torch_threads": 1, "progress_bar": False,
           "modification_factory": "SequentialModificationFactory",
           "modification_factory_kwargs": {"num_total_steps": 8192, "modifications": [
               f"permute_obs={k} permute_actions={k} sticky_action_prob=0" for k in (1, 2, 3, 4)],
               "switching_thresholds": [2048, 4096, 6144]}}
    path = write_config(folder, cfg, "cfg.json")
    procs = []
    for i, (method, flags) in enumerate([("PPO", []), ("PPO_SP", ["--shrink_and_perturb"])] * 2):
        seed = 1 + i // 2
        procs.append(subprocess.Popen(
            [sys.executable, "continual_training_example.py", "--config", str(path), "--seed", str(seed),
             "--runs_dir", str(folder / "runs"), "--run_name", f"{i:03d}_{method}_seed={seed}", *flags],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "WANDB_MODE": "disabled"}))
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
    return folder


def test_report_on_a_tiny_real_experiment(tiny_folder, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "bench/plasticity_report.py", str(tiny_folder), "--out", str(out),
                           "--early", "1", "--late", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert set(report["table"]) == {"PPO", "PPO_SP"}
    for row in report["table"].values():
        assert row["n"] == 2 and row["seeds"] == [1, 2]
    for run in report["runs"]:
        assert run["done"] and len(run["regimes"]) == 4 and len(run["diagnostics"]) >= 3  # one per switch at least
        assert [v[0] for v in run["visits"]] == [normalize_modification(f"permute_obs={k} permute_actions={k} "
                                                                        "sticky_action_prob=0") for k in (1, 2, 3, 4)]
        assert run["drop"] == pytest.approx(run["regimes"][0] - run["regimes"][-1])
    for name in ("report.md", "regimes.png", "drop.png", "diagnostics.png"):
        assert (out / name).stat().st_size > 0
    assert "| PPO | 2 |" in (out / "report.md").read_text()


def test_shipped_experiment_every_entry_validates_with_one_budget(tmp_path):
    from continual.envs.backends import minatar_permutation
    from continual.launch.experiment import load_experiment, validate

    experiment = load_experiment(EXPERIMENT)
    seeds = sorted({e.config["seed"] for e in experiment.entries})
    methods = {R.parse_run_name(e.name)[0] for e in experiment.entries}
    # method by method, seeds varying fastest; plain PPO and the fresh-network reference first
    assert [R.parse_run_name(e.name) for e in experiment.entries[:6]] == [("PPO", s) for s in range(1, 6)] + [
        ("PPO_fresh", 1)]
    assert seeds == [1, 2, 3, 4, 5] and len(experiment.entries) == 5 * len(methods)
    assert {"PPO", "PPO_NSAdam", "PPO_CBP", "PPO_SP", "PPO_ReDo", "PPO_L2Init", "PPO_LN", "PPO_CReLU", "PPO_reset",
            "PPO_Parseval", "PPO_NaP", "PPO_TRAC"} <= methods
    budgets = {(e.config["total_timesteps"], json.dumps(e.config["modification_factory_kwargs"], sort_keys=True))
               for e in experiment.entries}
    assert len(budgets) == 1  # the same sequence and budget for every method
    kwargs = experiment.entries[0].config["modification_factory_kwargs"]
    regimes = kwargs["modifications"]
    assert len(regimes) >= 10 and len(kwargs["switching_thresholds"]) == len(regimes) - 1
    # every regime a different (channel, action) permutation pair of Breakout (4 channels, 3 actions)
    pairs = set()
    for m in regimes:
        tokens = dict(t.split("=") for t in m.split())
        pairs.add((tuple(minatar_permutation(int(tokens["permute_obs"]), 4)),
                   tuple(minatar_permutation(int(tokens["permute_actions"]), 3))))
    assert len(pairs) == len(regimes)
    one_per_method = [e for e in experiment.entries if e.config["seed"] == 1]
    assert len(one_per_method) == len(methods)
    validate(type(experiment)(**{**experiment.__dict__, "entries": one_per_method}), str(tmp_path / "runs"))


@pytest.mark.parametrize("argv,message", [(["{missing}"], "no runs/"), (["{empty}"], "no run with"),
                                          (["{empty}", "--late", "0"], "--late")])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, argv, message):
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    argv = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in argv]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "bench/plasticity_report.py", *argv, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not out.exists()


def test_weight_norm_is_the_root_sum_of_layer_norms():
    assert R.weight_norm({"plasticity/weight_norm/x": 1.0, "plasticity/weight_norm/y": 2.0, "other": 9.0}) == \
        pytest.approx(np.sqrt(5.0))
