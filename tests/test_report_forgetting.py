"""continual.report.forgetting on hand-made experiment folders: the declared primary metric (CORA's isolated
forgetting, smoothed and scaled per method) against a pandas computation from CORA's definition, the reference
normalisation, the exact pair tests, the protocol read from the runs, post-hoc marks, and the refusals."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from continual.report import forgetting as F
from continual.report.__main__ import main as report_main
from helpers.experiment_folders import write_run as helper_write_run

SI, BR = "env=MinAtar/SpaceInvaders", "env=MinAtar/Breakout"
STEPS = list(range(0, 401, 10))  # SI (0,100], BR (100,200], SI (200,300], BR (300,400]
SWITCHES = ((100, SI, BR), (200, BR, SI), (300, SI, BR))
WINDOW = 2


def write_run(folder, name, label, arch, seed, curves, steps=STEPS, switches=SWITCHES, greedy=True):
    config = {"exp_name": label, "seed": seed, "architecture": arch, "eval_greedy": greedy, "eval_episodes": 10,
              "eval_every": 10, "eval_at_switches": True}
    helper_write_run(folder, name, config, curves, steps, switches, greedy=greedy)


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


def test_learned_check_gives_game_scores_before_any_reference_run(folder, tmp_path):
    path, runs = folder
    for name in os.listdir(os.path.join(path, "runs")):
        if name.endswith("_reference"):
            os.rename(os.path.join(path, "runs", name), os.path.join(str(tmp_path), name))  # no reference finished
    res = F.report(path, str(tmp_path / "out"))
    # the end of SI's first visit (0, 100]: the last 5 evaluations (steps 60..100), in game score, per CLEAR run
    expected = [float(np.mean(c[SI][6:11])) for (lab, _), c in sorted(runs.items()) if lab == "CLEAR"]
    assert res["per_method"]["CLEAR"]["first_visit_end_raw"][SI] == pytest.approx(expected, rel=1e-12)
    br = [float(np.mean(c[BR][16:21])) for (lab, _), c in sorted(runs.items()) if lab == "CLEAR"]  # (100, 200]
    md = open(tmp_path / "out" / "report.md").read()
    assert (f"| CLEAR | no reference run yet ({np.mean(br):.1f}) | no reference run yet ({np.mean(expected):.1f}) |"
            in md)
    assert not re.search(r"\bnan\b", md.split("Learned check")[1], re.I)


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


FREEWAY_EXPERIMENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                  "experiments", "hackatari_freeway_continual.json")
U, W, V = "", "all_white_cars", "vary_car_speeds"
FW_STEPS = list(range(0, 401, 5))  # V/20 = 5 with visits of 100: U (0,100], W (100,200], V (200,300], U (300,400]
FW_SWITCHES = ((100, U, W), (200, W, V), (300, V, U))


def freeway_curves(rng, drop):
    """U rises to ~30 in its first visit, falls by `drop` a step while W and V train, and comes back in its second
    visit; W and V start low and rise during their own visits."""
    u, w, v, a, b, c = [], [], [], 0.0, 10.0, 10.0
    for s in FW_STEPS:
        if s > 0:
            k = (s - 1) // 100
            a = min(30.0, a + 1.5) if k in (0, 3) else max(0.0, a - drop)
            b, c = b + (0.2 if k == 1 else 0.0), c + (0.1 if k == 2 else 0.0)
        u.append(a + rng.normal(0, 0.3))
        w.append(b + rng.normal(0, 0.3))
        v.append(c + rng.normal(0, 0.3))
    return {U: u, W: w, V: v}


def test_the_freeway_continual_experiment_is_read_with_its_declarations(tmp_path):
    """A folder of hackatari_freeway_continual.json (its copy, its labels and seeds): the declared primary, CORA's
    isolated forgetting of unmodified Freeway ("" as a task), against pandas; CW per regime and P(T) in the declared
    fixed range; drop and recovery at each switch by hand."""
    folder = str(tmp_path / "exp")
    os.makedirs(folder)
    with open(FREEWAY_EXPERIMENT) as f, open(os.path.join(folder, "experiment.json"), "w") as g:
        decl = json.load(f)["declared"]
        f.seek(0)
        g.write(f.read())
    rng = np.random.default_rng(5)
    runs = {}
    for i, (label, arch, drop) in enumerate([(lab, arch, d) for lab, arch, d in
                                             (("PPO", "PPO", 0.3), ("PPO_CBP", "PPO_CBP", 0.1),
                                              ("PPO+S&P", "PPO", 0.2)) for _ in range(5)]):
        c = freeway_curves(rng, drop + 0.01 * i)
        runs[(label, i)] = c
        write_run(folder, f"{i:03d}_{label}", label, arch, 3 + i % 5, c, steps=FW_STEPS, switches=FW_SWITCHES)
    res = F.report(folder, str(tmp_path / "out"))
    window = decl["primary_metric"]["rolling_mean_count"]
    low, high = decl["normalisation"]["ranges"][U]
    for label in ("PPO", "PPO_CBP"):
        curves = [c for (lab, _), c in sorted(runs.items()) if lab == label]
        sm = [pd.Series(c[U], index=FW_STEPS).rolling(window, min_periods=1).mean() for c in curves]
        scale = max(float(s.abs().max()) for s in sm)
        # isolated forgetting of U by each later task of the first cycle (W: (100, 200), V: (200, 300)), run mean
        expected = [np.mean([(s[s.index < a].iloc[-1] - s[(s.index > a) & (s.index < b)].iloc[-1]) / scale
                             for a, b in ((100, 200), (200, 300))]) for s in sm]
        assert res["per_method"][label]["primary_task"] == U
        assert np.allclose(res["per_method"][label]["primary"], expected, rtol=1e-12)
        # CW per regime: final performance = the last 5 evaluations, in the declared range
        final = [np.mean([(y - low) / (high - low) for y in c[W][-5:]]) for c in curves]
        assert np.allclose(res["per_method"][label]["cw_per_regime"][W]["final_performance"], final, rtol=1e-12)
        # the switches: drop at 100 (U -> W), recovery over W's visit, from the evaluations at 100 and 200
        sw = res["per_method"][label]["switches"]
        assert [(w["from"], w["into"], w["step"]) for w in sw] == list(FW_SWITCHES[i][1:] + (FW_SWITCHES[i][0],)
                                                                      for i in range(3))
        at = {s: k for k, s in enumerate(FW_STEPS)}
        assert np.allclose(sw[0]["drop"], [(c[U][at[100]] - c[W][at[100]]) / (high - low) for c in curves])
        assert np.allclose(sw[0]["recovery"], [(c[W][at[200]] - c[W][at[100]]) / (high - low) for c in curves])
        assert np.allclose(sw[2]["recovery"], [(c[U][at[400]] - c[U][at[300]]) / (high - low) for c in curves])
    c = res["comparisons"]["PPO_CBP vs PPO"]["primary"]
    assert c["probability_of_improvement"]["estimate"] == 1.0  # CBP's runs drop less, every pair
    assert res["normalisation"] == {"kind": "fixed", "ranges": decl["normalisation"]["ranges"]}
    md = open(tmp_path / "out" / "report.md").read()
    assert "| PPO_CBP | 1: unmodified -> all_white_cars | 100 |" in md and "| PPO | unmodified |" in md


def _contains(new, old) -> bool:
    """`new` holds everything `old` does, unchanged (dicts may have more keys)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and _contains(new[k], v) for k, v in old.items())
    return new == old


@pytest.mark.long  # ~17 CPU-seconds: handed out first (tests/conftest.py)
def test_committed_v2_report_is_reproduced_byte_for_byte(tmp_path, monkeypatch):
    """Forgetting v2's committed report (bench/results/forgetting_minatar_v2, its command on
    docs/results/forgetting.md) comes out of the runs it names byte for byte: report.md, report.json, curves.png
    (~17 CPU-seconds). Runs archived after it (the EWC arms, as they land) are left out by building the folder from
    the report's own list: its experiment.json and those runs, linked under the same relative path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    committed = os.path.join(root, "bench", "results", "forgetting_minatar_v2")
    folder = os.path.join("bench", "experiments", "forgetting_minatar_v2")
    with open(os.path.join(committed, "report.json"), encoding="utf-8") as f:
        stored = json.load(f)
    named = stored["runs"]
    assert len(named) == 130 and len(set(named)) == 130  # every entry of the file: 110, then the 20 EWC runs
    (tmp_path / folder / "runs").mkdir(parents=True)
    shutil.copy(os.path.join(root, folder, "experiment.json"), tmp_path / folder)
    for run in named:
        os.symlink(os.path.join(root, folder, "runs", run), tmp_path / folder / "runs" / run)
    argv = ["forgetting", folder, "--out", "out"]
    tuning = stored.get("tuning_check", {}).get("tuning_folder")
    if tuning:  # the page's command checks the chosen arms against the tuning report
        os.makedirs(tmp_path / os.path.dirname(tuning), exist_ok=True)
        os.symlink(os.path.join(root, tuning), tmp_path / tuning)
        argv += ["--tuning", tuning]
        assert stored["tuning_check"]["failed"] == [] and len(stored["tuning_check"]["passed"]) == 2
    monkeypatch.chdir(tmp_path)  # the report keeps the folder as given, here as its page gives it
    report_main(argv)
    for name in ("report.md", "report.json", "curves.png"):
        with open(os.path.join(committed, name), "rb") as f:
            assert (tmp_path / "out" / name).read_bytes() == f.read(), name


def test_committed_v1_reanalysis_is_reproduced_with_its_stated_diff(tmp_path, monkeypatch):
    """The committed re-analysis of forgetting v1 (bench/results/forgetting_minatar_v1_reanalysis, its command on
    docs/results/forgetting.md) comes out of the archived runs as committed (~20 s on a loaded 2-core CPU):
    curves.png byte for byte; report.md line for line, with the two tables the report has gained since (Continual
    World's forgetting per regime, drop and recovery at each switch) inserted and the learned check's game scores
    added; report.json with every committed value
    unchanged and only new keys added. v1's own report (bench/results/forgetting_minatar) came from the retired
    bench/forgetting_report.py and its non-CORA metric; it is kept as written and not reproduced."""
    import difflib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    committed = os.path.join(root, "bench", "results", "forgetting_minatar_v1_reanalysis")
    monkeypatch.chdir(root)  # the report keeps the folder as given, here as its page gives it
    report_main(["forgetting", "bench/experiments/forgetting_minatar", "--experiment",
                 "configs/experiments/forgetting_minatar.json", "--out", str(tmp_path)])
    with open(os.path.join(committed, "curves.png"), "rb") as f:
        assert (tmp_path / "curves.png").read_bytes() == f.read()
    with open(os.path.join(committed, "report.md"), encoding="utf-8") as f:
        old = f.read().splitlines()
    new = (tmp_path / "report.md").read_text().splitlines()
    # the provenance the report has gained since (v1's 85 runs at one commit, 6 of them resumed): cut, as committed
    cut = new.index("Provenance (references included):")
    assert new[cut + 2] == "- Code: d28738a (85 runs)"
    assert new[cut + 3].startswith("- Resumed from a checkpoint (6 runs")
    new = new[:cut - 1] + new[cut + 4:]
    learned = new.index(next(line for line in new if line.startswith("Learned check: ")))
    assert all(re.search(r"\(-?\d+\.\d\) \|$", line) for line in new[learned + 4:] if line.startswith("| "))
    # the learned check has gained each cell's game score, in brackets: without them it reads as committed
    new = new[:learned] + [re.sub(r" \(-?\d+\.\d\)", "", line.replace(" In brackets: the same in game score.", ""))
                           for line in new[learned:]]
    ops = [op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if op[0] != "equal"]
    assert [op[0] for op in ops] == ["insert"], ops
    added = new[ops[0][3]:ops[0][4]]
    assert added[0].startswith("Per regime (Continual World's forgetting") and any(
        line.startswith("Switches: drop = ") for line in added)
    with open(os.path.join(committed, "report.json"), encoding="utf-8") as f:
        assert _contains(json.loads((tmp_path / "report.json").read_text()), json.load(f))
