"""continual.report.tuning on hand-made tuning folders: each sweep's per-seed P(T) in reference units and the chosen
value against a computation written here from the declared rule's words, a tie resolved to the larger value, a
missing seed that withholds the choice, the refusals (a run on a reporting seed, no rule, a changed archive), and the
forgetting report's check of its chosen arms (--tuning)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from continual.launch.archive import write_first_manifest
from continual.launch.experiment import load_experiment
from continual.report import forgetting as F
from continual.report import tuning as T
from continual.report.__main__ import main as report_main
from helpers.experiment_folders import write_experiment, write_run

V2_TUNING = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "experiments",
                         "forgetting_minatar_v2_tuning.json")
SI, BR = "env=MinAtar/SpaceInvaders", "env=MinAtar/Breakout"
STEPS = list(range(0, 201, 10))  # SI (0, 100], BR (100, 200]
SWITCHES = ((100, SI, BR),)
SEEDS = [2001, 2002, 2003]
REF_FINAL = {SI: [40.0, 50.0, 60.0], BR: [8.0, 10.0, 12.0]}  # per tuning seed: the last 5 evaluations' value
FLAGS = {"env_id": "MinAtar/SpaceInvaders", "eval_greedy": True, "eval_episodes": 10, "eval_every": 10,
         "eval_at_switches": True}
RULE = {"metric": "cw_average_performance", "normalise": "references", "aggregate": "mean", "ties": "larger"}
TUNING = {"seeds": SEEDS, "criterion": "the highest mean P(T) in reference units; ties -> the larger lambda",
          "rule": RULE, "sweeps": {"IMPALA+EWC": "ewc_lambda", "IMPALA+online EWC": "ewc_lambda"},
          "experiment": "tune.json"}
# P(T) of each arm per tuning seed, in reference units (1.0 = the references' mean final return on both tasks)
ARMS = {("IMPALA+EWC", 0.5): [0.50, 0.60, 0.70], ("IMPALA+EWC", 5): [0.90, 0.80, 0.85],
        ("IMPALA+EWC", 50): [0.70, 0.75, 0.95],
        ("IMPALA+online EWC", 0.25): [0.60, 0.80, 1.00], ("IMPALA+online EWC", 2.5): [1.00, 0.60, 0.80],
        ("IMPALA+online EWC", 0.025): [0.40, 0.50, 0.55]}


def arm_curves(rng, p_si, p_br):
    """Noisy curves whose last 5 evaluations (steps 160-200) are constant: SI's mean there is p_si x the references'
    mean final SI return, BR's p_br x theirs."""
    ref = {t: float(np.mean(v)) for t, v in REF_FINAL.items()}
    return {SI: list(rng.uniform(0, 80, len(STEPS) - 5)) + [p_si * ref[SI]] * 5,
            BR: list(rng.uniform(0, 20, len(STEPS) - 5)) + [p_br * ref[BR]] * 5}


def config(label, seed, **flags):
    return {**FLAGS, "exp_name": label, "seed": seed, "architecture": "IMPALA", **flags}


def tuning_folder(path, skip=(), extra=(), experiment=None):
    """The folder of a tuning file: the arms of ARMS and IMPALA on the tuning seeds, the two single-task references
    (the last 5 evaluations at REF_FINAL). `skip`: (label, seed) planned but not run; `extra`: (label, seed) run too;
    `experiment`: its experiment.json (default: FLAGS and TUNING)."""
    folder = str(path)
    write_experiment(folder, experiment or {"flags": FLAGS, "tuning": TUNING})
    rng = np.random.default_rng(0)
    k = 0
    for i, seed in enumerate(SEEDS):
        for (prefix, lam), ps in ARMS.items():
            label = f"{prefix} lambda={lam}"
            # P(T) = mean(p_si, p_br): split the seed's value unevenly between the tasks
            c = arm_curves(rng, ps[i] + 0.1, ps[i] - 0.1) if (label, seed) not in skip else None
            write_run(folder, f"{k:03d}_{label}_seed={seed}", config(label, seed, ewc="ewc", ewc_lambda=lam), c,
                      STEPS, SWITCHES)
            k += 1
        write_run(folder, f"{k:03d}_IMPALA_seed={seed}", config("IMPALA", seed), arm_curves(rng, 0.3, 0.3), STEPS,
                  SWITCHES)
        k += 1
        for task, game in ((SI, "SpaceInvaders"), (BR, "Breakout")):
            ys = list(rng.uniform(0, 30, 6)) + [REF_FINAL[task][i]] * 5
            label = f"reference IMPALA {game}"
            write_run(folder, f"{k:03d}_reference_{game}_seed={seed}", config(label, seed),
                      {task: ys} if (label, seed) not in skip else None, list(range(0, 101, 10)))
            k += 1
    for label, seed in extra:
        write_run(folder, f"{k:03d}_{label}_seed={seed}", config(label, seed, ewc_lambda=5),
                  arm_curves(rng, 0.5, 0.5), STEPS, SWITCHES)
        k += 1
    return folder


def expected_p(folder, label):
    """P(T) per seed from the files, by the rule's words: per task, the mean of the run's last 5 evaluations divided
    by the mean over the reference runs of their last 5; averaged over the two tasks."""
    rows = {}
    for name in sorted(os.listdir(os.path.join(folder, "runs"))):
        cfg = json.load(open(os.path.join(folder, "runs", name, "config.json")))
        table = np.genfromtxt(os.path.join(folder, "runs", name, "eval_table.csv"), delimiter=",", names=True,
                              dtype=None, encoding=None)
        rows[(cfg["exp_name"], cfg["seed"])] = {t: [float(r["mean"]) for r in table if r["modification"] == t]
                                                for t in (SI, BR)}
    ref = {t: np.mean([np.mean(v[t][-5:]) for (lab, _), v in rows.items() if lab.startswith("reference") and v[t]])
           for t in (SI, BR)}
    return {s: np.mean([np.mean(rows[label, s][t][-5:]) / ref[t] for t in (SI, BR)]) for s in SEEDS
            if (label, s) in rows}


def test_the_v2_tuning_file_declares_this_rule():
    tuning = load_experiment(V2_TUNING).declarations.tuning
    assert tuning["rule"] == RULE and tuning["seeds"] == SEEDS and tuning["sweeps"] == TUNING["sweeps"]
    assert "ties -> the larger lambda" in tuning["criterion"]


def test_the_choice_by_the_declared_rule_with_a_tie(tmp_path, capsys):
    """Under the committed v2 tuning file's declaration (the folder's copy of it)."""
    folder = tuning_folder(tmp_path / "tune", experiment=json.load(open(V2_TUNING)))
    res = T.report(folder, str(tmp_path / "out"))
    for (prefix, lam), ps in ARMS.items():
        arm = next(a for a in res["sweeps"][prefix]["arms"] if a["value"] == lam)
        by_hand = expected_p(folder, arm["label"])
        assert [arm["per_seed"][s] for s in SEEDS] == pytest.approx([by_hand[s] for s in SEEDS], rel=1e-12)
        assert [by_hand[s] for s in SEEDS] == pytest.approx(ps, rel=1e-12)  # the hand-chosen values
        assert arm["aggregate"] == pytest.approx(np.mean(ps), rel=1e-12) and arm["interval"]["n"] == 3
    # EWC: 5 has the highest mean (0.85 against 0.60 and 0.80)
    assert res["sweeps"]["IMPALA+EWC"]["chosen"]["value"] == 5
    # online EWC: 0.25 and 2.5 tie at 0.80 (the same values on other seeds): the larger lambda
    online = res["sweeps"]["IMPALA+online EWC"]
    assert online["chosen"]["value"] == 2.5 and "tie between" in online["why"]
    assert "-> the larger value" in online["why"]
    # ties -> the smaller value under the other rule
    decl = json.load(open(os.path.join(folder, "experiment.json")))
    decl["tuning"]["rule"] = {**RULE, "ties": "smaller"}
    write_experiment(folder, decl)
    assert T.choose(folder)["sweeps"]["IMPALA+online EWC"]["chosen"]["value"] == 0.25
    md = open(tmp_path / "out" / "report.md").read()
    assert "| IMPALA+EWC | IMPALA+EWC lambda=5 | ewc_lambda=5 | 0.900 | 0.800 | 0.850 | 0.850 [" in md
    assert "**chosen**" in md and "greedy (argmax) actions" in md
    assert json.load(open(tmp_path / "out" / "report.json"))["sweeps"]["IMPALA+EWC"]["chosen"]["value"] == 5
    report_main(["tuning", folder])
    assert "- IMPALA+EWC: chosen ewc_lambda=5" in capsys.readouterr().out


def test_a_missing_seed_withholds_the_choice_until_it_has_run(tmp_path):
    folder = tuning_folder(tmp_path / "tune", skip={("IMPALA+EWC lambda=50", 2003)})
    res = T.choose(folder)
    ewc = res["sweeps"]["IMPALA+EWC"]
    arm = next(a for a in ewc["arms"] if a["value"] == 50)
    assert ewc["chosen"] is None and ewc["why"] == "incomplete: 'IMPALA+EWC lambda=50' lacks seed 2003"
    assert arm["missing"] == [2003] and arm["aggregate"] == pytest.approx(np.mean([0.70, 0.75]))
    assert res["sweeps"]["IMPALA+online EWC"]["chosen"]["value"] == 2.5  # the other sweep is complete
    # nothing finished yet: every arm missing, no choice, no error
    res = T.choose(tuning_folder(tmp_path / "tune0", skip={(f"{p} lambda={lam}", s) for p, lam in ARMS for s in SEEDS}
                                 | {(f"reference IMPALA {g}", s) for g in ("SpaceInvaders", "Breakout") for s in SEEDS}))
    assert all(sw["chosen"] is None and sw["why"].startswith("incomplete:") for sw in res["sweeps"].values())
    # a missing reference withholds every choice: the normalisation is not the declared one yet
    res = T.choose(tuning_folder(tmp_path / "tune2", skip={("reference IMPALA Breakout", 2001)}))
    assert all(sw["chosen"] is None and "'reference IMPALA Breakout' lacks seed 2001" in sw["why"]
               for sw in res["sweeps"].values())
    # the arms finished, the references neither run nor planned (an archive copies a run's config when it finishes):
    # the arms have run, they are not missing; they have no score until a reference of each task has finished
    folder = tuning_folder(tmp_path / "tune3")
    for sub in ("configs", "runs"):
        for name in os.listdir(os.path.join(folder, sub)):
            if "reference" in name:
                path = os.path.join(folder, sub, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    res = T.choose(folder)
    for sw in res["sweeps"].values():
        assert sw["chosen"] is None and sw["why"] == ("incomplete: no finished reference run of "
                                                      f"{BR}, {SI} to divide by")
        assert all(a["missing"] == [] and a["unscored"] == SEEDS for a in sw["arms"])
    rows = [ln for ln in T.markdown(res) if ln.startswith("| IMPALA+EWC | IMPALA+EWC lambda=5 |")]
    assert rows == ["| IMPALA+EWC | IMPALA+EWC lambda=5 | ewc_lambda=5 | no score | no score | no score |  |  |"]


def refused(capsys, argv):
    with pytest.raises(SystemExit) as e:
        report_main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and err.count("\n") == 1, err
    return err


def test_refusals_are_one_line_exit_2(tmp_path, capsys):
    folder = tuning_folder(tmp_path / "wrong", extra=[("IMPALA+EWC lambda=5", 1001)])
    assert "'IMPALA+EWC lambda=5' runs on seed 1001, not a declared tuning seed [2001, 2002, 2003]" in \
        refused(capsys, ["tuning", folder, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    folder = tuning_folder(tmp_path / "norule")
    write_experiment(folder, {"flags": FLAGS, "tuning": {k: v for k, v in TUNING.items() if k != "rule"}})
    assert "tuning declares no rule" in refused(capsys, ["tuning", folder])
    write_experiment(folder, {"flags": FLAGS})
    assert "declares no tuning block" in refused(capsys, ["tuning", folder])
    # an arm whose planned config and run disagree on the swept value
    folder = tuning_folder(tmp_path / "twovalues")
    path = os.path.join(folder, "configs", "000_IMPALA+EWC lambda=0.5_seed=2001.json")
    changed = {**json.load(open(path)), "ewc_lambda": 0.7}
    with open(path, "w") as f:
        json.dump(changed, f)
    assert "the arm 'IMPALA+EWC lambda=0.5' of the sweep 'IMPALA+EWC' sets ewc_lambda to 0.5 and 0.7" in \
        refused(capsys, ["tuning", folder])
    # an archive whose files changed after archiving (the manifest check every report makes)
    folder = tuning_folder(tmp_path / "archived")
    write_first_manifest(folder)
    with open(os.path.join(folder, "runs", "000_IMPALA+EWC lambda=0.5_seed=2001", "eval_table.csv"), "a") as f:
        f.write("210,env=MinAtar/SpaceInvaders,x,curriculum,10,99.0,True\n")
    assert "does not match its manifest.json" in refused(capsys, ["tuning", folder])
    assert "does not match its manifest.json" in refused(capsys, ["forgetting", str(tmp_path / "wrong"),
                                                                  "--tuning", folder])
    assert "--tuning is for the forgetting report" in refused(capsys, ["tuning", str(tmp_path / "wrong"),
                                                                       "--tuning", folder])


def reporting_folder(path, chosen_lambda, rng=None):
    """A reporting folder: IMPALA and the EWC arm marked chosen_from_tuning on reporting seeds 1001-1002."""
    folder = str(path)
    arm = {"name": f"EWC_{chosen_lambda}", "exp_name": f"IMPALA+EWC lambda={chosen_lambda}", "ewc": "ewc",
           "ewc_lambda": chosen_lambda, "chosen_from_tuning": "tune.json"}
    write_experiment(folder, {"flags": {k: v for k, v in FLAGS.items()},
                              "grid": {"flags": [{"name": "IMPALA", "exp_name": "IMPALA"}, arm], "seed": [1001, 1002]},
                              "tuning": {k: v for k, v in TUNING.items() if k != "rule"},
                              "reporting_seeds": [1001, 1002]})
    rng = np.random.default_rng(1)
    for k, (label, lam) in enumerate([("IMPALA", None), (arm["exp_name"], chosen_lambda)] * 2):
        seed = 1001 + k // 2
        flags = {} if lam is None else {"ewc": "ewc", "ewc_lambda": lam}
        write_run(folder, f"{k:03d}_{label}_seed={seed}", config(label, seed, **flags), arm_curves(rng, 0.5, 0.6),
                  STEPS, SWITCHES)
    return folder


def test_the_forgetting_report_checks_its_chosen_arms_against_the_tuning_report(tmp_path, capsys):
    tune = tuning_folder(tmp_path / "tune")
    good = reporting_folder(tmp_path / "good", 5)
    rng = np.random.default_rng(2)
    check = T.check(good, tune)
    assert check["failed"] == [] and len(check["passed"]) == 1 and "'IMPALA+EWC lambda=5' runs ewc_lambda=5" in \
        check["passed"][0]
    md = F.report(good, tuning_check=check)["markdown"]
    assert md[0].startswith(f"Tuning ({tune}, rule ") and "IMPALA+EWC chose 'IMPALA+EWC lambda=5'" in md[0]
    assert md[1].startswith("Tuning check passed: 'IMPALA+EWC lambda=5' runs ewc_lambda=5")
    # an arm that runs another value than the tuning report chose: a failed check, first and loud, also on stderr
    bad = reporting_folder(tmp_path / "bad", 50)
    report_main(["forgetting", bad, "--tuning", tune])
    out, err = capsys.readouterr()
    first = out.splitlines()[0]
    assert first.startswith("**FAILED CHECK (tuning, ") and "'IMPALA+EWC lambda=50' runs ewc_lambda=50, but the " \
        "tuning report chose ewc_lambda=5 ('IMPALA+EWC lambda=5')" in first
    assert err.startswith("FAILED CHECK (tuning): 'IMPALA+EWC lambda=50' runs ewc_lambda=50")
    # a reporting folder without a chosen arm yet: nothing to check, and the heading says so
    plain = reporting_folder(tmp_path / "plain", 5)
    data = json.load(open(os.path.join(plain, "experiment.json")))
    data["grid"]["flags"] = data["grid"]["flags"][:1]
    write_experiment(plain, data)
    for name in os.listdir(os.path.join(plain, "configs")):
        if "EWC" in name:
            os.remove(os.path.join(plain, "configs", name))
            shutil.rmtree(os.path.join(plain, "runs", name[:-len(".json")]))
    md = F.report(plain, tuning_check=T.check(plain, tune))["markdown"]
    assert md[1].startswith("Tuning check: no arm here is marked chosen_from_tuning")
    # a tuning folder that has not chosen yet fails the check too
    incomplete = tuning_folder(tmp_path / "tune_incomplete", skip={("IMPALA+EWC lambda=0.5", 2002)})
    assert "the tuning report has chosen no value (incomplete: 'IMPALA+EWC lambda=0.5' lacks seed 2002)" in \
        T.check(good, incomplete)["failed"][0]
    # a sweep's other arm run on a reporting seed, unmarked: the seed split and the value both fail
    write_run(good, "900_IMPALA+EWC lambda=50_seed=1001", config("IMPALA+EWC lambda=50", 1001, ewc="ewc",
                                                                   ewc_lambda=50), arm_curves(rng, 0.5, 0.5), STEPS,
              SWITCHES)
    failed = T.check(good, tune)["failed"]
    assert len(failed) == 2 and failed[0].startswith("seed split: 'IMPALA+EWC lambda=50' is an arm of the sweep "
                                                     "'IMPALA+EWC' on reporting seed 1001")
    assert "'IMPALA+EWC lambda=50' runs ewc_lambda=50, but the tuning report chose ewc_lambda=5" in failed[1]
    # and one whose seeds differ from those declared here
    data = json.load(open(os.path.join(good, "experiment.json")))
    data["tuning"]["seeds"] = [2001, 2002, 2004]
    write_experiment(good, data)
    assert "the tuning folder declares seeds [2001, 2002, 2003]" in T.check(good, tune)["failed"][0]


def test_a_value_written_as_5_and_as_5_0_is_one_value(tmp_path):
    """The experiment file's planned configs say ewc_lambda 5, a finished run's config.json says 5.0 (tyro writes a
    float flag as a float): one arm, one value, in the choice and in the forgetting report's check."""
    def as_floats(folder):
        for name in os.listdir(os.path.join(folder, "runs")):
            path = os.path.join(folder, "runs", name, "config.json")
            cfg = json.load(open(path))
            if "ewc_lambda" in cfg:
                with open(path, "w") as f:
                    json.dump({**cfg, "ewc_lambda": float(cfg["ewc_lambda"])}, f)
    tune = tuning_folder(tmp_path / "tune")
    expected = T.choose(tune)["sweeps"]
    as_floats(tune)
    got = T.choose(tune)["sweeps"]
    assert got == expected and got["IMPALA+EWC"]["chosen"]["value"] == 5
    good = reporting_folder(tmp_path / "good", 5)
    as_floats(good)
    check = T.check(good, tune)
    assert check["failed"] == [] and "'IMPALA+EWC lambda=5' runs ewc_lambda=5," in check["passed"][0]
    # 5.5 is still not 5
    assert T.value_text(5.0) == T.value_text(5) != T.value_text(5.5)


def test_committed_v2_tuning_report_is_reproduced_and_its_choice_is_what_v2_runs(tmp_path, monkeypatch):
    """Forgetting v2's committed tuning report (bench/results/forgetting_minatar_v2_tuning, its command on
    docs/results/forgetting.md) comes out of the archived tuning folder byte for byte (report.md, report.json), has
    chosen a value for every sweep, and the arms configs/experiments/forgetting_minatar_v2.json marks
    chosen_from_tuning are exactly the chosen ones, copied whole from the tuning file."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    committed = os.path.join(root, "bench", "results", "forgetting_minatar_v2_tuning")
    monkeypatch.chdir(root)  # the report keeps the folder as given, here as its page gives it
    report_main(["tuning", "bench/experiments/forgetting_minatar_v2_tuning", "--out", str(tmp_path)])
    for name in ("report.md", "report.json"):
        with open(os.path.join(committed, name), "rb") as f:
            assert (tmp_path / name).read_bytes() == f.read(), name
    sweeps = json.loads((tmp_path / "report.json").read_text())["sweeps"]
    chosen = {sw["chosen"]["label"] for sw in sweeps.values()}
    assert len(chosen) == len(sweeps) == 2
    tuning_arms = {f["exp_name"]: f for f in json.load(open(V2_TUNING))["grid"]["flags"]}
    v2 = json.load(open(os.path.join(os.path.dirname(V2_TUNING), "forgetting_minatar_v2.json")))
    marked = [f for f in v2["grid"]["flags"] if "chosen_from_tuning" in f]
    assert {f["exp_name"] for f in marked} == chosen
    for f in marked:
        assert f["chosen_from_tuning"] == "forgetting_minatar_v2_tuning.json"
        assert {k: v for k, v in f.items() if k != "chosen_from_tuning"} == tuning_arms[f["exp_name"]]
