"""continual.report.robustness on hand-made experiment folders: its cells, differences and paired drops against
independent float64 computations, the seed's table as extracted, and its refusals."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from continual.report import robustness
from continual.report.__main__ import main as report_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ["step", "modification", "slug", "split", "episodes", "mean", "std", "min", "max", "mean_length",
           "seconds", "greedy", "success_rate"]
MODS = ["", "all_white_cars", "stop_all_cars", "vary_car_speeds"]


def _run(folder, name, label, seed, scores, total=1000, last=1000, greedy=False, training=("",)):
    d = os.path.join(folder, "runs", name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"exp_name": label, "seed": seed, "total_timesteps": total, "eval_greedy": greedy}, f)
    with open(os.path.join(d, "eval_table.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for step in (0, last):
            for m, v in scores.items():
                w.writerow({"step": step, "modification": m, "slug": m or "no_modif",
                            "split": "curriculum" if m in training else "heldout",
                            "episodes": 21, "mean": v if step == last else 0.0, "std": 1.0, "min": 0, "max": 40,
                            "mean_length": 2050.0, "seconds": 1.0, "greedy": greedy, "success_rate": ""})


def _t(values):
    x = np.asarray(values, dtype=np.float64)
    h = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - h, x.mean() + h


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(0)
    data = {}
    for label, base in (("unmodified", 30.0), ("colours", 31.0)):
        for seed in range(1, 5):
            scores = {m: float(base - 10 * i + rng.normal()) for i, m in enumerate(MODS)}
            data[(label, seed)] = scores
            _run(str(tmp_path), f"{len(data):03d}_{label}_seed={seed}", label, seed, scores)
    _run(str(tmp_path), "999_unfinished", "unmodified", 9, {m: 99.0 for m in MODS}, last=500)  # not counted
    return str(tmp_path), data


def test_cells_differences_and_drops_match_independent_computations(folder, tmp_path):
    path, data = folder
    out = str(tmp_path / "out")
    res = robustness.report(path, out, seed_table=None)
    for label in ("unmodified", "colours"):
        for m in MODS:
            vals = [data[(label, s)][m] for s in range(1, 5)]
            mean, lo, hi = _t(vals)
            cell = res["table"][label][m]
            assert cell["n"] == 4 and cell["method"] == "t"
            assert np.allclose([cell["estimate"], *cell["ci"]], [mean, lo, hi], rtol=1e-12)
            a, b = np.array(vals), np.array([data[("unmodified", s)][m] for s in range(1, 5)])
            if label == "colours":
                va, vb = a.var(ddof=1) / 4, b.var(ddof=1) / 4
                df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 3)
                h = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
                diff = res["pairs"]["colours - unmodified"][m]
                assert np.allclose([diff["estimate"], *diff["ci"]], [a.mean() - b.mean(), a.mean() - b.mean() - h,
                                                                       a.mean() - b.mean() + h], rtol=1e-10)
            if m:
                drop = res["paired_drop"][label][m]
                d = [data[(label, s)][""] - data[(label, s)][m] for s in range(1, 5)]
                assert np.allclose([drop["estimate"], *drop["ci"]], list(_t(d)), rtol=1e-12)
    assert all(r["run"] != "999_unfinished" for r in res["runs"])
    md = open(os.path.join(out, "report.md")).read()
    assert "sampled actions, 21 whole games" in md and os.path.getsize(os.path.join(out, "heatmap.png")) > 1000


EXPERIMENT = os.path.join(ROOT, "configs", "experiments", "hackatari_freeway_robustness.json")


def _final_only_run(folder, name, label, seed, scores, total):
    """A run as --eval_final_only writes it: one evaluation step, the end of training."""
    d = os.path.join(folder, "runs", name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"exp_name": label, "seed": seed, "total_timesteps": total, "eval_greedy": False,
                   "eval_final_only": True}, f)
    with open(os.path.join(d, "eval_table.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for m, v in scores.items():
            w.writerow({"step": total, "modification": m, "slug": m or "no_modif", "split": "heldout",
                        "episodes": 21, "mean": v, "std": 1.0, "min": 0, "max": 40, "mean_length": 2050.0,
                        "seconds": 1.0, "greedy": False, "success_rate": ""})


def test_the_freeway_robustness_experiment_is_read_with_its_declared_pairs(tmp_path):
    """A folder of hackatari_freeway_robustness.json (its copy, as the launcher keeps it; its arms, reporting seeds and
    end-only sampled evaluation): the report takes the declared pairs, primary first, and the primary difference is
    scipy's Welch interval; the declared published numbers are the seed's export."""
    from continual.launch.experiment import load_experiment

    exp = load_experiment(EXPERIMENT, stand_ins=True)
    folder = str(tmp_path / "exp")
    os.makedirs(folder)
    with open(EXPERIMENT) as f, open(os.path.join(folder, "experiment.json"), "w") as g:
        g.write(f.read())
    total = exp.entries[0].config["total_timesteps"]
    mods = [m.strip() for m in exp.entries[0].config["eval_modifs"].split(";")]
    assert mods == robustness.FREEWAY_COLUMNS and {e.config["seed"] for e in exp.entries} == {3, 4, 5, 6, 7}
    rng = np.random.default_rng(1)
    white = {}
    for e in exp.entries:
        label = e.config["exp_name"]
        scores = {m: float(rng.normal(30 if "colours" in label or m != "all_white_cars" else 15, 1.5)) for m in mods}
        white.setdefault(label, []).append(scores["all_white_cars"])
        _final_only_run(folder, e.name, label, e.config["seed"], scores, total)
    res = robustness.report(folder)
    decl = exp.declarations.declared
    assert list(res["pairs"]) == [f"{x} - {y}" for x, y in [decl["primary_pair"], *decl["pairs"][1:]]]
    x, y = decl["primary_pair"]
    cell = res["pairs"][f"{x} - {y}"]["all_white_cars"]
    ref = stats.ttest_ind(white[x], white[y], equal_var=False).confidence_interval(0.95)
    assert np.allclose([cell["estimate"], *cell["ci"]], [np.mean(white[x]) - np.mean(white[y]), ref.low, ref.high],
                       rtol=1e-10)
    assert all(res["table"][label]["all_white_cars"]["n"] == 5 for label in white)
    seed = robustness.load_seed_table("freeway")
    published = decl["published"]["results"]
    for ours, theirs in ((x, "colours"), (y, "baseline")):
        for m in robustness.FREEWAY_COLUMNS:
            assert published[ours][m or "unmodified"] == pytest.approx(np.mean(seed[theirs][m]), abs=0.005)


def test_seed_table_is_the_seeds_export():
    seed = robustness.load_seed_table("freeway")
    # the table: means over the seed's 5 runs
    assert round(np.mean(seed["baseline"]["all_white_cars"]), 1) == 15.8
    assert round(np.mean(seed["baseline"]["stop_all_cars"]), 1) == 6.8
    assert round(np.mean(seed["colours"]["all_white_cars"]), 1) == 31.4
    assert round(np.mean(seed["colours"]["vary_car_speeds"]), 1) == 20.7
    assert round(np.mean(seed["baseline"][""]), 1) == 32.7 and len(seed["baseline"][""]) == 5


def test_the_seeds_runs_are_printed_one_by_one(folder):
    """Beside its means, each of the seed's runs (its W&B name, group, every column): the values the means are over,
    and the bimodal columns they hide (stop_all_cars, trained on colours: 0.0 in one run, 40.0 in another)."""
    path, _ = folder
    runs = robustness.load_seed_runs("freeway")
    table = robustness.load_seed_table("freeway")
    assert len(runs) == sum(len(v[""]) for v in table.values()) == 20
    for label, cells in table.items():
        for m, values in cells.items():
            assert sorted(r["scores"][m] for r in runs if r["label"] == label and m in r["scores"]) == sorted(values)
    md = robustness.report(path)["markdown"]
    rows = [x for x in md if x.startswith("| Freeway-v5_")]
    assert len(rows) == 20
    stopped = sorted(r["scores"]["stop_all_cars"] for r in runs if r["label"] == "colours")
    assert stopped[0] == 0.0 and stopped[-1] > 39.0


def test_the_seeds_differences_and_costs_are_printed_under_ours_from_its_raw_export(tmp_path):
    """Under our declared pairs and within-run costs, the seed's counterparts (SEED_COUNTERPARTS: the groups of the
    issue's table) over its runs, against a float64 Welch and paired t computed here from the extracted export."""
    with open(os.path.join(ROOT, "continual", "report", "data", "continual_hackatari_freeway.json")) as f:
        groups = json.load(f)["groups"]

    def column(group, m):  # the seed's per-run values, "" its post-training evaluation
        return np.array([r["training_final_reward"] if m == "" else r["eval"][m] for r in groups[group]["runs"]],
                        dtype=np.float64)

    def welch(a, b):
        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        h = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
        return a.mean() - b.mean(), a.mean() - b.mean() - h, a.mean() - b.mean() + h

    arms = {"PPO unmodified": "Freeway-v5 baseline", "PPO colours": "Freeway-v5 Colors",
            "PPO colours + vary_car_speeds": "Freeway-v5 Colors and vary_car_speeds"}
    folder = str(tmp_path)
    for i, label in enumerate(arms):
        for seed in (3, 4):
            _run(folder, f"{i}{seed}_{seed}", label, seed, {m: 20.0 + seed + i for m in robustness.FREEWAY_COLUMNS})
    pairs = [("PPO colours", "PPO unmodified"), ("PPO colours + vary_car_speeds", "PPO colours")]
    res = robustness.report(folder, pairs=pairs)
    for x, y in pairs:
        for m in robustness.FREEWAY_COLUMNS:
            cell = res["seed_pairs"][f"{x} - {y}"][m]
            assert np.allclose([cell["estimate"], *cell["ci"]], welch(column(arms[x], m), column(arms[y], m)),
                               rtol=1e-10), (x, y, m)
    for label, group in arms.items():
        for m in robustness.FREEWAY_COLUMNS[1:]:
            cell = res["seed_paired_drop"][label][m]
            assert np.allclose([cell["estimate"], *cell["ci"]], _t(column(group, "") - column(group, m)), rtol=1e-10)
    md = res["markdown"]
    # the primary cell as printed: the seed's colours - baseline under all_white_cars, 15.6 (31.4 - 15.8)
    row = next(x for x in md if x.startswith("| colours (seed) | baseline (seed) |"))
    assert row.count("|") == len(robustness.FREEWAY_COLUMNS) + 3 and row.split(" | ")[3].startswith("15.6 [")
    assert any(x.startswith("| colours + vary_cars_speeds (typo: colours) (seed) | ") for x in md)


def test_the_heatmap_shows_ours_the_no_agent_row_and_the_seeds_groups_on_one_scale(folder, tmp_path):
    """The heatmap's rows: our arms' means, then the no-agent policy's scores, then the seed's groups' means over its
    runs (from its raw export), in that order."""
    path, data = folder
    reflex = {"action": 1, "episodes": [21], "path": "x.json", "scores": {"": 21.8, "all_white_cars": 21.8}}
    cells = robustness.summarize(robustness.load_runs(path), MODS)
    with open(os.path.join(ROOT, "continual", "report", "data", "continual_hackatari_freeway.json")) as f:
        groups = json.load(f)["groups"]
    seed = robustness.load_seed_table("freeway")
    labels, values = robustness.heatmap_rows(cells, MODS, seed, reflex)
    assert labels[:3] == ["unmodified (ours)", "colours (ours)", "no agent: action 1 every step"]
    for i, label in enumerate(("unmodified", "colours")):
        ours = [np.mean([data[(label, s)][m] for s in range(1, 5)]) for m in MODS]
        assert np.allclose(values[i], ours, rtol=1e-12)
    assert values[2][:2].tolist() == [21.8, 21.8] and np.isnan(values[2][2:]).all()
    baseline = groups["Freeway-v5 baseline"]["runs"]
    row = labels.index("baseline (seed, 10M steps)")
    assert np.allclose(values[row], [np.mean([r["training_final_reward"] if m == "" else r["eval"][m] for r in baseline])
                                     for m in MODS], rtol=1e-12)
    assert len(labels) == 3 + len(seed)
    robustness.heatmap(cells, MODS, str(tmp_path / "h.png"), seed, reflex)
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refusals_are_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        report_main(["robustness", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no runs/ folder" in err[0]
    os.makedirs(tmp_path / "runs")
    p = subprocess.run([sys.executable, "-m", "continual.report", "robustness", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1


def test_a_constant_action_baseline_is_a_row_of_its_own(folder, tmp_path, capsys):
    """--baseline: eval.py's JSON of a --constant_action evaluation (its own rows, as eval.py writes them) becomes a
    row beside the curricula, in the report's column order; it does not enter the table, the pairs or the drops.
    A JSON of an agent's evaluation (no constant_action) is refused in one line."""
    path, _ = folder
    rows = [{"modification": m, "episodes": 21, "mean": 21.0 + i, "std": 0.0, "min": 21.0, "max": 21.0 + i,
             "mean_length": 2048.0, "max_episode_steps": None, "capped": 0} for i, m in enumerate(reversed(MODS))]
    reflex = tmp_path / "always_up.json"
    reflex.write_text(json.dumps({"checkpoint": "x", "architecture": "PPO", "env_id": "ALE/Freeway-v5",
                                  "greedy": False, "seed": 1, "constant_action": 1, "results": rows}))
    plain = robustness.report(path, seed_table=None)
    got = robustness.report(path, out=str(tmp_path / "out"), seed_table=None, baseline=str(reflex))
    assert got["table"] == plain["table"] and got["pairs"] == plain["pairs"]
    assert got["baseline"]["scores"] == {m: 21.0 + i for i, m in enumerate(reversed(MODS))}
    row = [line for line in got["markdown"] if line.startswith("| *no agent: action 1 every step* (21 games)")]
    # columns in the report's order: unmodified, all_white_cars, stop_all_cars, vary_car_speeds
    assert row == ["| *no agent: action 1 every step* (21 games) | 24.0 | 23.0 | 22.0 | 21.0 |"], got["markdown"]
    assert json.load(open(tmp_path / "out" / "report.json"))["baseline"]["action"] == 1
    agent = tmp_path / "agent.json"
    agent.write_text(json.dumps({"checkpoint": "x", "greedy": False, "results": rows}))
    for bad, words in ((agent, "not an evaluation with --constant_action"), (tmp_path / "none.json", "cannot read")):
        with pytest.raises(SystemExit) as e:
            report_main(["robustness", path, "--baseline", str(bad), "--seed-table", "none"])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and words in err[0], err


def test_the_learned_check_reads_each_runs_last_training_window(tmp_path):
    """Per curriculum, the mean over runs of each run's training return in its last 20,480 steps (episodes at
    steps in (end - 20,480, end]; one just outside is left out), its t interval and its lowest run; with a
    baseline, how many runs' unmodified evaluation beats the no-agent score, and how many runs' training return
    beats the no-agent score under their own training strings (two JSONs, their modifications together)."""
    folder = str(tmp_path / "exp")
    rng = np.random.default_rng(3)
    ends = {}
    for seed in range(1, 5):
        name = f"{seed:03d}_seed={seed}"
        _run(folder, name, "unmodified", seed, {"": 20.0 + 2 * seed, "stop_all_cars": 5.0}, total=40960, last=40960)
        inside = [(40960 - 20480 + 1 + int(k), float(rng.integers(15, 35))) for k in sorted(rng.integers(0, 20480, 6))]
        episodes = [(20480, 99.0)] + inside  # at exactly end - window: outside the window
        with open(os.path.join(folder, "runs", name, "metrics.jsonl"), "w") as f:
            for step, ret in episodes:
                f.write(json.dumps({"kind": "episode", "global_step": step, "modification": "", "return": ret,
                                    "length": 2048}) + "\n")
        ends[seed] = sum(r for _, r in inside) / len(inside)
    # a curriculum trained on two strings: its bar is the no-agent mean over them, (25 + 30) / 2 = 27.5
    for seed, ret in ((5, 27.0), (6, 28.0)):
        name = f"{seed:03d}_seed={seed}"
        _run(folder, name, "speeds", seed, {"": 24.0, "stop_all_cars": 5.0, "vary_car_speeds": 26.0}, total=40960,
             last=40960, training=("", "vary_car_speeds"))
        with open(os.path.join(folder, "runs", name, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"kind": "episode", "global_step": 40000, "modification": "", "return": ret,
                                "length": 2048}) + "\n")
    reflex, training = tmp_path / "reflex.json", tmp_path / "training.json"
    reflex.write_text(json.dumps({"constant_action": 1, "results": [
        {"modification": m, "episodes": 21, "mean": v} for m, v in (("", 25.0), ("stop_all_cars", 41.0))]}))
    got = robustness.report(folder, seed_table=None, baseline=str(reflex))
    assert [r["training_return"] for r in got["runs"]] == pytest.approx([ends[s] for s in range(1, 5)] + [27.0, 28.0])
    mean, lo, hi = _t([ends[s] for s in range(1, 5)])
    line = [x for x in got["markdown"] if x.startswith("- unmodified: ")]
    beat = sum(v > 25.0 for v in ends.values())
    assert line == [f"- unmodified: {mean:.1f} [{lo:.1f}, {hi:.1f}] (t, n=4), lowest {min(ends.values()):.1f}; "
                    f"2 of 4 runs beat it; the no-agent score under its training strings 25.0, beaten by the "
                    f"training return of {beat} of 4 runs"], line  # unmodified 22, 24, 26, 28 against 25
    # vary_car_speeds not measured: the unmodified score stands in, and the line says so
    assert [x for x in got["markdown"] if x.startswith("- speeds: ")][0].endswith(
        "the no-agent score under its training strings 25.0 (unmodified: not all its strings measured), beaten by "
        "the training return of 2 of 2 runs")
    training.write_text(json.dumps({"constant_action": 1, "results": [
        {"modification": "vary_car_speeds", "episodes": 21, "mean": 30.0}]}))
    got = robustness.report(folder, seed_table=None, baseline=[str(reflex), str(training)])
    assert got["baseline"]["scores"] == {"": 25.0, "stop_all_cars": 41.0, "vary_car_speeds": 30.0}
    assert [x for x in got["markdown"] if x.startswith("- speeds: ")][0].endswith(
        "the no-agent score under its training strings 27.5, beaten by the training return of 1 of 2 runs")
    assert "006_seed=6" not in got["learned"]["left_out"] and "005_seed=5" in got["learned"]["left_out"]
    assert any("beats the no-agent row's 25.0" in x for x in got["markdown"])
    # the per-run table: each run's training return, its first scoring game and its scores, in the report's order
    assert got["columns"] == ["", "stop_all_cars", "vary_car_speeds"]
    firsts = {"005_seed=5": "40,000", "006_seed=6": "40,000"} | {f"{s:03d}_seed={s}": "20,480" for s in range(1, 5)}
    for r in got["runs"]:
        row = [x for x in got["markdown"] if x.startswith(f"| {r['run']} | {r['label']} | ")]
        cells = " | ".join(f"{r['scores'][m]:.1f}" if m in r["scores"] else "" for m in got["columns"])
        assert row == [f"| {r['run']} | {r['label']} | {r['training_return']:.1f} | {firsts[r['run']]} |  | {cells} |"], row


@pytest.mark.parametrize("episodes, expected", [
    ([], None), ([(100, 0.0), (200, 0.0)], None), ([(100, 0.0), (200, 1.0), (300, 5.0)], 200),
    ([(300, 2.0), (100, 0.0), (200, 0.0)], 300),  # read in step order, whatever the file's
    ([(100, -1.0), (150, 0.5)], 150),  # a negative return is not a score
])
def test_first_score_is_the_end_of_the_first_game_with_a_positive_return(episodes, expected):
    assert robustness.first_score(episodes) == expected


def test_the_per_run_table_says_never_for_a_run_that_never_scored_and_nothing_without_games(tmp_path):
    folder = str(tmp_path / "exp")
    for seed, rets in ((1, [0.0, 0.0, 0.0]), (2, [0.0, 3.0, 7.0]), (3, None)):
        name = f"{seed:03d}_seed={seed}"
        _run(folder, name, "unmodified", seed, {"": 10.0 * seed}, total=40960, last=40960)
        if rets is not None:
            with open(os.path.join(folder, "runs", name, "metrics.jsonl"), "w") as f:
                for k, ret in enumerate(rets):
                    f.write(json.dumps({"kind": "episode", "global_step": 16384 * (k + 1), "modification": "",
                                        "return": ret, "length": 2048}) + "\n")
    rows = {x.split(" | ")[0][2:]: x.split(" | ")[3] for x in robustness.report(folder, seed_table=None)["markdown"]
            if x.startswith("| 00")}
    assert rows == {"001_seed=1": "never", "002_seed=2": "32,768", "003_seed=3": ""}, rows


def test_a_declared_variant_is_a_second_table_from_each_runs_eval_json(folder, tmp_path, capsys):
    """--variant FOLDER: eval.py's JSON per run (FOLDER/<run>.json, greedy games) gives a second table of cells,
    computed as the first (t intervals over runs, by label), without touching the declared table; a run without its
    JSON is named, and a constant-action JSON is refused in one line."""
    path, data = folder
    variant = tmp_path / "greedy"
    variant.mkdir()
    runs = robustness.load_runs(path)
    shifted = {}
    for r in runs[:-1]:  # the last run has no JSON yet
        scores = {m: v + 1.5 for m, v in r["scores"].items()}
        shifted[r["run"]] = (r["label"], scores)
        (variant / f"{r['run']}.json").write_text(json.dumps({"checkpoint": r["run"], "greedy": True, "results": [
            {"modification": m, "episodes": 21, "mean": v} for m, v in scores.items()]}))
    plain = robustness.report(path, seed_table=None)
    got = robustness.report(path, seed_table=None, variant=str(variant))
    assert got["table"] == plain["table"] and got["variant"]["missing"] == [runs[-1]["run"]]
    assert got["variant"]["greedy"] == [True] and got["variant"]["episodes"] == [21]
    for label in ("unmodified", "colours"):
        for m in MODS:
            vals = [s[m] for lab, s in shifted.values() if lab == label]
            mean, lo, hi = _t(vals)
            cell = got["variant"]["table"][label][m]
            assert cell["n"] == len(vals) and np.allclose([cell["estimate"], *cell["ci"]], [mean, lo, hi])
    assert any(x.startswith("Declared variant, no claim: greedy (argmax) actions, 21 whole games") and
               f"no JSON yet for {runs[-1]['run']}" in x for x in got["markdown"])
    (variant / f"{runs[-1]['run']}.json").write_text(json.dumps({"greedy": False, "constant_action": 1,
                                                                 "results": []}))
    with pytest.raises(SystemExit) as e:
        report_main(["robustness", path, "--variant", str(variant), "--seed-table", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "a --constant_action evaluation" in err[0], err


def test_a_post_hoc_evaluation_is_labelled_with_its_reason_and_shows_only_its_columns(folder, tmp_path, capsys):
    """--post-hoc FOLDER: eval.py's JSON per run under a modification the experiment did not declare, a table of its
    own columns headed as added after the start, with the first line of FOLDER/README.md as the reason (required)."""
    path, _ = folder
    added = tmp_path / "tunnel"
    added.mkdir()
    runs = robustness.load_runs(path)
    values = {}
    for k, r in enumerate(runs):
        values[r["run"]] = (r["label"], 10.0 + k)
        (added / f"{r['run']}.json").write_text(json.dumps({"greedy": False, "results": [
            {"modification": "stop_all_cars_tunnel", "episodes": 21, "mean": 10.0 + k}]}))
    with pytest.raises(SystemExit) as e:
        report_main(["robustness", path, "--post-hoc", str(added), "--seed-table", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "no README.md" in err[0], err
    (added / "README.md").write_text("# the seed's stop_all_cars is HackAtari's tunnel variant\n\nmore\n")
    got = robustness.report(path, seed_table=None, post_hoc=str(added))
    head = [x for x in got["markdown"] if x.startswith("Post-hoc evaluation, added after the experiment started")]
    assert len(head) == 1 and "why: the seed's stop_all_cars is HackAtari's tunnel variant" in head[0], head
    i = got["markdown"].index(head[0])
    assert got["markdown"][i + 2] == "| trained on | stop_all_cars_tunnel |"
    for label in ("unmodified", "colours"):
        mean, lo, hi = _t([v for lab, v in values.values() if lab == label])
        cell = got["post_hoc"]["table"][label]["stop_all_cars_tunnel"]
        assert np.allclose([cell["estimate"], *cell["ci"]], [mean, lo, hi])
    assert got["post_hoc"]["why"] == "the seed's stop_all_cars is HackAtari's tunnel variant"
    reflex = tmp_path / "reflex.json"  # the no-agent row follows each table, in that table's columns
    reflex.write_text(json.dumps({"constant_action": 1, "results": [
        {"modification": m, "episodes": 21, "mean": v} for m, v in (("", 21.8), ("stop_all_cars_tunnel", 40.5))]}))
    got = robustness.report(path, seed_table=None, post_hoc=str(added), baseline=str(reflex))
    i = got["markdown"].index([x for x in got["markdown"] if x.startswith("Post-hoc evaluation")][0])
    assert got["markdown"][i + 6] == "| *no agent: action 1 every step* (21 games) | 40.5 |", got["markdown"][i:i + 7]


def test_runs_that_did_not_learn_are_named_and_the_differences_given_again_without_them(folder, tmp_path):
    """With a baseline, a run whose training return at the end does not beat the no-agent unmodified score has not
    learned; the declared differences stay over every run, and a post-hoc table gives them over the others (Welch
    intervals computed directly), naming the runs left out."""
    path, data = folder
    runs = robustness.load_runs(path)
    failed = runs[-1]["run"]  # a colours run that never scored
    for r in runs:
        ret = 0.0 if r["run"] == failed else 25.0
        with open(os.path.join(path, "runs", r["run"], "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"kind": "episode", "global_step": 1000, "modification": "", "return": ret,
                                "length": 2048}) + "\n")
    reflex = tmp_path / "reflex.json"
    reflex.write_text(json.dumps({"constant_action": 1, "results": [{"modification": "", "episodes": 21,
                                                                     "mean": 21.8}]}))
    plain = robustness.report(path, seed_table=None)
    got = robustness.report(path, seed_table=None, baseline=str(reflex))
    assert got["pairs"] == plain["pairs"] and got["learned"]["left_out"] == [failed]
    head = [x for x in got["markdown"] if x.startswith("Post hoc, not declared: the differences between curricula")]
    assert len(head) == 1 and head[0].endswith(f"left out: {failed}:")
    kept = [r for r in runs if r["run"] != failed]
    for m in MODS:
        a = np.array([r["scores"][m] for r in kept if r["label"] == "colours"])
        b = np.array([r["scores"][m] for r in kept if r["label"] == "unmodified"])
        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        h = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
        cell = got["learned"]["pairs"]["colours - unmodified"][m]
        assert np.allclose([cell["estimate"], *cell["ci"]], [a.mean() - b.mean(), a.mean() - b.mean() - h,
                                                              a.mean() - b.mean() + h], rtol=1e-10)
    # every run learned: no post-hoc table
    with open(os.path.join(path, "runs", failed, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"kind": "episode", "global_step": 1000, "modification": "", "return": 30.0,
                            "length": 2048}) + "\n")
    again = robustness.report(path, seed_table=None, baseline=str(reflex))
    assert again["learned"]["left_out"] == [] and not any(x.startswith("Post hoc, not declared") for x in
                                                          again["markdown"])


def test_the_arms_own_training_strings_are_a_table_of_their_own_not_columns(folder, tmp_path):
    """A run evaluated also under its own training strings (the evaluator adds them): those strings leave the table,
    the differences and the costs, and get their own table, each cell the t interval over that arm's runs."""
    path, data = folder
    blue = [20.0, 22.0, 27.0]
    for i, v in enumerate(blue):
        _run(path, f"5{i:02d}_mixture", "mixture", 20 + i, {**{m: 25.0 + i for m in MODS}, "all_blue_cars": v},
             training=("", "all_blue_cars"))
    res = robustness.report(path, str(tmp_path / "out"), seed_table=None)
    assert res["columns"] == MODS and res["own_columns"] == ["all_blue_cars"]
    assert all("all_blue_cars" not in cells for cells in res["table"].values())
    assert all("all_blue_cars" not in cells for cells in res["pairs"].values())
    assert list(res["own_table"]["mixture"]) == ["all_blue_cars"] and res["own_table"]["unmodified"] == {}
    cell = res["own_table"]["mixture"]["all_blue_cars"]
    assert np.allclose([cell["estimate"], *cell["ci"]], list(_t(blue)), rtol=1e-12)
    md = res["markdown"]
    head = next(i for i, line in enumerate(md) if line.startswith("| trained on | unmodified"))
    assert "all_blue_cars" not in md[head]
    own = next(i for i, line in enumerate(md) if line.startswith("Under the arms' own training strings"))
    assert md[own + 2] == "| trained on | all_blue_cars |" and md[own + 4].startswith("| mixture | 23.0 [")
    assert not md[own + 5].startswith("| unmodified")  # an arm without other strings has no row


def test_wall_seconds_sums_each_process_from_its_start_to_its_last_record():
    """A run killed and resumed hours later: only the two processes' running times count; records before any start
    (none in a real run) are ignored, and a run without a start record has no wall time."""
    records = [{"kind": "start", "time": 100.0}, {"kind": "iteration", "time": 160.0},
               {"kind": "episode", "time": 170.5},                        # killed here
               {"kind": "start", "time": 10_000.0, "resumed": True}, {"kind": "iteration", "time": 10_030.0},
               {"kind": "eval_summary", "time": 10_090.25}]
    assert robustness.wall_seconds(records) == pytest.approx(70.5 + 90.25, abs=1e-9)
    assert robustness.wall_seconds(records[:1]) == 0.0
    assert robustness.wall_seconds([{"kind": "iteration", "time": 5.0}]) is None


def test_the_report_states_each_runs_wall_time_and_the_total(tmp_path):
    folder = str(tmp_path)
    for i, (t0, t1) in enumerate(((0.0, 3600.0), (50.0, 50.0 + 5400.0))):
        _run(folder, f"00{i}_unmodified", "unmodified", i, {m: 20.0 + i for m in MODS})
        with open(os.path.join(folder, "runs", f"00{i}_unmodified", "metrics.jsonl"), "w") as f:
            for r in ({"kind": "start", "time": t0, "global_step": 0},
                      {"kind": "episode", "time": t1, "global_step": 1000, "return": 5.0}):
                f.write(json.dumps(r) + "\n")
    res = robustness.report(folder, seed_table=None)
    assert [r["wall_seconds"] for r in res["runs"]] == [3600.0, 5400.0]
    assert any(line.startswith("Cost: 2 runs, 1.00-1.50 h of wall time each (median 1.25), 2.5 h in all")
               for line in res["markdown"])
    assert any(line.startswith("| 001_unmodified | unmodified | 5.0 | 1,000 | 1.50 | 21.0") for line in res["markdown"])


def test_a_mixtures_training_return_per_string_over_the_last_third_and_the_strings_of_the_learned_window(tmp_path):
    """Post hoc: a curriculum of several strings draws them in blocks, so the learned check's window may hold one of
    them. The report names the strings of each mixed run's window, and per arm and string the mean over runs of each
    run's mean training return over the games ending in the last third of training (step > last - last // 3),
    against the no-agent score under that string; an experiment of one string per run prints neither."""
    folder, total = str(tmp_path / "exp"), 90000
    rng = np.random.default_rng(5)
    # 10,000 steps each: the last third (60,000, 90,000] holds blue and white, the window (69,520, 90,000] white only
    blocks = ["", "all_white_cars", "", "all_white_cars", "all_blue_cars", "all_white_cars", "all_blue_cars",
              "all_white_cars", "all_white_cars"]
    late: dict[str, list[float]] = {}
    for seed in (1, 2, 3):
        name = f"{seed:03d}_seed={seed}"
        _run(folder, name, "colours", seed, {"": 25.0, "all_white_cars": 21.0}, total=total, last=total,
             training=("", "all_white_cars", "all_blue_cars"))
        games, own = [], {}
        for step in range(500, total, 1000):
            m = blocks[step // 10000]
            ret = float(rng.integers(10, 35))
            games.append({"kind": "episode", "global_step": step, "modification": m, "return": ret, "length": 2048})
            if step > total - total // 3:
                own.setdefault(m, []).append(ret)
        with open(os.path.join(folder, "runs", name, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(g) + "\n" for g in games)
        for m, v in own.items():
            late.setdefault(m, []).append(float(np.mean(np.asarray(v, dtype=np.float64))))
    reflex = tmp_path / "reflex.json"
    reflex.write_text(json.dumps({"constant_action": 1, "results": [
        {"modification": m, "episodes": 21, "mean": 21.8} for m in ("", "all_white_cars", "all_blue_cars")]}))
    got = robustness.report(folder, seed_table=None, baseline=str(reflex))
    assert [r["window_strings"] for r in got["runs"]] == [["all_white_cars"]] * 3  # the last 20,480 steps: one block
    assert set(late) == {"all_blue_cars", "all_white_cars"}
    for m, means in late.items():
        assert [r["late"][m]["mean"] for r in got["runs"]] == pytest.approx(means, rel=1e-12)
        assert [r["late"][m]["games"] for r in got["runs"]] == [{"all_blue_cars": 10, "all_white_cars": 20}[m]] * 3
        mean, lo, hi = _t(means)
        row = [x for x in got["markdown"] if x.startswith(f"| colours | {m} | ")]
        assert row == [f"| colours | {m} | {mean:.1f} [{lo:.1f}, {hi:.1f}] (t, n=3) | 21.8 | "
                       f"{sum(v > 21.8 for v in means)} of 3 |"], row
    assert any("001_seed=1: all_white_cars; 002_seed=2: all_white_cars" in x for x in got["markdown"])
    assert any("games ending after 60,000 agent steps" in x for x in got["markdown"])
    # a run trained on several strings is named even when its last third holds one of them
    one = str(tmp_path / "one")
    _run(one, "001_seed=1", "colours", 1, {"": 25.0, "all_white_cars": 21.0}, total=total, last=total,
         training=("", "all_white_cars"))
    with open(os.path.join(one, "runs", "001_seed=1", "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"kind": "episode", "global_step": 80000, "modification": "all_white_cars",
                            "return": 3.0}) + "\n")
    assert any("001_seed=1: all_white_cars." in x for x in robustness.report(one, seed_table=None)["markdown"])
    # one string per run: no such section
    single = str(tmp_path / "single")
    _run(single, "001_seed=1", "unmodified", 1, {"": 25.0}, total=total, last=total)
    with open(os.path.join(single, "runs", "001_seed=1", "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"kind": "episode", "global_step": 50000, "modification": "", "return": 3.0}) + "\n")
    assert not any("last third" in x for x in robustness.report(single, seed_table=None)["markdown"])


def test_committed_freeway_robustness_report_is_reproduced_byte_for_byte(tmp_path, monkeypatch):
    """bench/results/hackatari_freeway_robustness (issue 46's table; its command on docs/results/hackatari-freeway.md
    and docs/experiments.md) comes out of the archived runs, the always-UP baselines, the greedy variant's and the
    post-hoc evaluation's JSONs byte for byte: report.md, report.json, heatmap.png; all 15 declared runs are in it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    committed = os.path.join(root, "bench", "results", "hackatari_freeway_robustness")
    with open(os.path.join(committed, "report.json"), encoding="utf-8") as f:
        stored = json.load(f)
    assert stored["folder"] == "bench/experiments/hackatari_freeway_robustness"
    assert len(stored["runs"]) == 15 and len({r["run"] for r in stored["runs"]}) == 15
    monkeypatch.chdir(root)  # the report keeps the folder as given, as the page gives it
    report_main(["robustness", stored["folder"], "--baseline", "bench/results/freeway_always_up.json",
                 "bench/results/freeway_always_up_training.json", "--variant",
                 "bench/experiments/hackatari_freeway_robustness_greedy", "--post-hoc",
                 "bench/experiments/hackatari_freeway_robustness_posthoc", "--out", str(tmp_path)])
    for name in ("report.md", "report.json", "heatmap.png"):
        with open(os.path.join(committed, name), "rb") as f:
            assert (tmp_path / name).read_bytes() == f.read(), name
