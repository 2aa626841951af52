"""continual.launch.declarations: what an experiment file declares before any run (primary metric, pairs,
normalisation, evaluation, tuning and reporting seeds, a sweep's chosen value, post-hoc arms), the rules the launcher
enforces on it (one line, exit 2, nothing created), and the record in the experiment folder that refuses a changed
file on resume."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from continual.errors import UserError, exit_on_user_error
from continual.launch import declarations as D
from continual.launch import launcher as L
from continual.launch.experiment import load_experiment
from continual.launch.queue import Queue
from helpers.launch_runs import CARTPOLE, write

pytestmark = pytest.mark.xdist_group("ray")

ARMS = [{"name": "PPO", "exp_name": "PPO"},
        {"name": "CBP", "exp_name": "PPO_CBP", "architecture": "PPO_CBP"},
        {"name": "lr1", "exp_name": "PPO lr=0.001", "learning_rate": 0.001},
        {"name": "lr2", "exp_name": "PPO lr=0.01", "learning_rate": 0.01}]
DECLARED = {"primary_metric": "cora_forgetting", "pairs": [["PPO_CBP", "PPO"], ["PPO lr=", "PPO"]],
            "normalisation": {"kind": "fixed", "ranges": {"CartPole-v1": [0, 500]}},
            "evaluation": {"greedy": False, "episodes": 8}}
TUNING = {"seeds": [101, 102], "criterion": "highest mean return", "sweeps": {"PPO lr=": "learning_rate"}}
RULE = {"metric": "cw_average_performance", "normalise": "references", "aggregate": "mean", "ties": "larger"}


def tuning_file(tmp_path) -> dict:
    """The sweep on the tuning seeds (with the baselines), reporting seeds declared: no sweep arm runs on them."""
    return {"flags": CARTPOLE, "grid": {"seed": [101, 102], "flags": ARMS}, "declared": DECLARED, "tuning": TUNING,
            "reporting_seeds": [1, 2, 3]}


def reporting_file() -> dict:
    """The reporting seeds: the baselines and the sweep's chosen value, marked with the file that tuned it."""
    chosen = {**ARMS[3], "chosen_from_tuning": "tune.json"}
    return {"flags": CARTPOLE, "grid": {"flags": [*ARMS[:2], chosen], "seed": [1, 2, 3]}, "declared": DECLARED,
            "tuning": TUNING, "reporting_seeds": [1, 2, 3],
            "post_hoc": [{"label": "PPO_CBP", "reason": "added after PPO forgot", "added": "2026-12-01"}]}


def test_declarations_are_accepted_and_kept_verbatim(tmp_path):
    write(tmp_path / "tune.json", tuning_file(tmp_path))
    t = load_experiment(str(tmp_path / "tune.json"))
    assert len(t.entries) == 8 and t.declarations.declared == DECLARED and t.declarations.tuning == TUNING
    assert t.declarations.chosen == {}
    e = load_experiment(write(tmp_path / "report.json", reporting_file()))
    d = e.declarations
    assert d.declared == DECLARED and d.tuning_seeds == [101, 102] and d.reporting_seeds == [1, 2, 3]
    assert d.chosen == {"PPO lr=0.01": "tune.json"} and d.sweep_of("PPO lr=0.01") == "PPO lr=" and \
        d.sweep_of("PPO") is None
    assert d.post_hoc == {"PPO_CBP": {"label": "PPO_CBP", "reason": "added after PPO forgot", "added": "2026-12-01"}}
    # the marker is no flag of the run: not in its config, not in its name
    chosen = [x for x in e.entries if x.chosen_from_tuning]
    assert [x.name for x in chosen] == ["006_lr2_seed=1", "007_lr2_seed=2", "008_lr2_seed=3"]
    assert all("chosen_from_tuning" not in x.config for x in e.entries)
    # one file with both (runs, no grid): the sweep on the tuning seeds, its chosen value on the reporting seeds
    runs = [{**arm, "name": f"{arm['name']}_s{seed}", "seed": seed} for arm in ARMS for seed in (101, 102)]
    runs.append({**ARMS[2], "name": "lr1_s1", "seed": 1, "chosen_from_tuning": "both.json"})
    both = load_experiment(write(tmp_path / "both.json", {"flags": CARTPOLE, "runs": runs, "tuning": TUNING,
                                                          "reporting_seeds": [1]}))
    assert both.declarations.chosen == {"PPO lr=0.001": "both.json"} and len(both.entries) == 9
    # the rule in the tuning file (the reporting file need not repeat it: seeds and sweeps must agree)
    write(tmp_path / "tune.json", {**tuning_file(tmp_path), "tuning": {**TUNING, "rule": RULE}})
    assert load_experiment(str(tmp_path / "tune.json")).declarations.tuning["rule"] == RULE
    assert load_experiment(str(tmp_path / "report.json")).declarations.chosen == {"PPO lr=0.01": "tune.json"}
    # files without declarations are as before
    assert load_experiment(write(tmp_path / "plain.json", {"flags": CARTPOLE, "grid": {"seed": [1]}})).declarations \
        == D.Declarations()


def _bad(tmp_path, **changes):
    data = reporting_file()
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def _arms_with(*extra):
    return [*ARMS[:2], *extra]


BAD = [
    # the seed split
    (dict(tuning={**TUNING, "seeds": [3, 101]}), "seeds [3] are both tuning and reporting seeds"),
    (dict(grid={"flags": ARMS, "seed": [1]}), "entry 2 (lr1, seed=1): 'PPO lr=0.001' is an arm of the sweep 'PPO lr=' "
                                              "on reporting seed 1"),
    (dict(grid={"flags": reporting_file()["grid"]["flags"], "seed": [1, 7]}),
     "entry 1 (PPO, seed=7): 'PPO' runs on seed 7, neither a reporting seed [1, 2, 3] nor a tuning seed [101, 102]"),
    (dict(grid={"flags": [*reporting_file()["grid"]["flags"], {"name": "PPO2", "exp_name": "PPO"}], "seed": [1]}),
     "entries 0 (PPO, seed=1) and 3 (PPO2, seed=1) both run 'PPO' on seed 1"),
    (dict(grid={"flags": _arms_with({**ARMS[2], "chosen_from_tuning": "tune.json"},
                                    {**ARMS[3], "chosen_from_tuning": "tune.json"}), "seed": [1]}),
     "the sweep 'PPO lr=' has 2 chosen values"),
    (dict(grid={"flags": [{**ARMS[0], "chosen_from_tuning": "tune.json"}, ARMS[1]], "seed": [1]}),
     "entry 0 (PPO, seed=1): chosen_from_tuning on 'PPO', which is no arm of a sweep in tuning.sweeps ('PPO lr=')"),
    (dict(tuning=None, grid={"flags": _arms_with({**ARMS[3], "chosen_from_tuning": "tune.json"}), "seed": [1]},
          declared={}),
     "chosen_from_tuning needs a tuning block"),
    (dict(grid={"flags": _arms_with({**ARMS[3], "chosen_from_tuning": "missing.json"}), "seed": [1]}),
     "'PPO lr=0.01' is chosen from 'missing.json', which does not exist"),
    (dict(grid={"flags": _arms_with({**ARMS[3], "exp_name": "PPO lr=0.1", "learning_rate": 0.1,
                                     "chosen_from_tuning": "tune.json"}), "seed": [1]},
          declared={}), "'PPO lr=0.1' is chosen from 'tune.json', which does not run it on its tuning seeds"),
    (dict(grid={"flags": _arms_with({"name": "lr3", "exp_name": "PPO lr=default", "chosen_from_tuning": "tune.json"}),
                "seed": [1]}, declared={}), "is an arm of the sweep 'PPO lr=' but does not set 'learning_rate'"),
    (dict(tuning={**TUNING, "sweeps": {"PPO lr=": "learning_rat"}}), "'learning_rat' is no flag; did you mean "
                                                                      "'learning_rate'"),
    (dict(tuning={**TUNING, "sweeps": {**TUNING["sweeps"], "SAC tau=": "tau"}}),
     "tuning.sweeps['SAC tau=']: no entry's label starts with it"),
    (dict(tuning={"sweeps": TUNING["sweeps"]}), "tuning needs seeds"),
    # the criterion, machine-readable (what python -m continual.report tuning computes)
    (dict(tuning={**TUNING, "rule": "highest mean P(T)"}), "tuning.rule must be an object (metric: "
                                                           "'cw_average_performance'"),
    (dict(tuning={**TUNING, "rule": {**RULE, "metric": "cw_average_performanc"}}),
     "tuning.rule.metric: unknown value 'cw_average_performanc'; did you mean 'cw_average_performance'"),
    (dict(tuning={**TUNING, "rule": {k: v for k, v in RULE.items() if k != "ties"}}),
     "tuning.rule needs ties (one of larger, smaller)"),
    (dict(tuning={**TUNING, "rule": {**RULE, "tie": "larger"}}), "tuning.rule: unknown key 'tie'; did you mean 'ties'"),
    (dict(tuning={**TUNING, "rule": {**RULE, "aggregate": 1}}), "tuning.rule.aggregate: unknown value 1 (one of mean, "
                                                                 "median)"),
    (dict(reporting_seeds=[1, 1]), "reporting_seeds lists a seed twice"),
    (dict(reporting_seeds=["1"]), "reporting_seeds must be a non-empty list of integer seeds"),
    # unknown keys, with did-you-mean
    (dict(declard={}), "unknown key 'declard'; did you mean 'declared'"),
    (dict(declared={**DECLARED, "primary_metrc": "x"}), "declared: unknown key 'primary_metrc'; did you mean "
                                                        "'primary_metric'"),
    (dict(tuning={**TUNING, "criterium": "x"}), "tuning: unknown key 'criterium'; did you mean 'criterion'"),
    (dict(post_hoc=[{"label": "PPO_CBP", "reasn": "x"}]), "post_hoc[0]: unknown key 'reasn'; did you mean 'reason'"),
    # labels, normalisation
    (dict(declared={"pairs": [["PPO_CPB", "PPO"]]}), "declared.pairs[0]: 'PPO_CPB' is no method label of the file "
                                                     "(an entry's exp_name) or sweep prefix; did you mean 'PPO_CBP'"),
    (dict(declared={"pairs": [["PPO", "PPO"]]}), "declared.pairs[0] compares 'PPO' with itself"),
    (dict(declared={"pairs": [["PPO"]]}), "declared.pairs must be a list of [A, B] method label pairs"),
    (dict(post_hoc=["PPO_CBB"]), "post_hoc: 'PPO_CBB' is no method label of the file (an entry's exp_name); did you "
                                 "mean 'PPO_CBP'"),
    (dict(post_hoc=["PPO", "PPO"]), "post_hoc lists 'PPO' twice"),
    (dict(declared={"normalisation": {"kind": "max_abs"}}), "unknown kind 'max_abs'"),
    (dict(declared={"normalisation": {"kind": "fixd", "ranges": {}}}), "unknown kind 'fixd'; did you mean 'fixed'"),
    (dict(declared={"normalisation": {"kind": "fixed", "ranges": {"CartPole-v1": [500, 0]}}}),
     "ranges['CartPole-v1'] must be [low, high] with low < high"),
    (dict(declared={"normalisation": {"kind": "reference_runs"}}), "'reference_runs' needs references"),
    (dict(declared={"primary_metric": ""}), "declared.primary_metric: a metric is a name or an object with a name"),
    (dict(declared={"secondary_metrics": [{"reading": "last"}]}), "declared.secondary_metrics: a metric is a name"),
    (dict(declared={"primary_pair": ["PPO", "CLEAR"]}), "declared.primary_pair: 'CLEAR' is no method label"),
    (dict(declared={"evaluation": "greedy"}), "declared.evaluation must be an object"),
    # published numbers: an object, its source, numbers per method label of the file
    (dict(declared={"published": [22.0, 0.7]}), "declared.published must be an object (source, budget, seeds"),
    (dict(declared={"published": {"results": {"PPO": {"mean": 1.0}}}}), "declared.published needs source"),
    (dict(declared={"published": {"source": "Table 4"}}), "declared.published needs results"),
    (dict(declared={"published": {"source": "Table 4", "result": {}}}), "declared.published: unknown key 'result'; "
                                                                        "did you mean 'results'"),
    (dict(declared={"published": {"source": "Table 4", "results": {"PPO": {"mean": "22.0"}}}}),
     "declared.published.results['PPO'] must be a non-empty object of name -> finite number"),
    (dict(declared={"published": {"source": "Table 4", "results": {"PPO": [22.0, 0.7, 12]}}}),
     "declared.published.results['PPO'] must be a non-empty object of name -> finite number"),
    (dict(declared={"published": {"source": "Table 4", "results": {"PPO_CPB": {"mean": 1.0}}}}),
     "declared.published.results: 'PPO_CPB' is no method label of the file (an entry's exp_name); did you mean "
     "'PPO_CBP'"),
]


@pytest.mark.parametrize("changes,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_declaration_that_breaks_a_rule_is_one_line_and_exit_2_before_anything(tmp_path, capsys, changes, message):
    write(tmp_path / "tune.json", tuning_file(tmp_path))
    exp = write(tmp_path / "bad.json", _bad(tmp_path, **changes))
    folder = tmp_path / "folder"
    with pytest.raises(SystemExit) as e:  # --dry_run: a file wrongly accepted lists its entries, runs nothing
        exit_on_user_error(L.main)([exp, "--folder", str(folder), "--dry_run"])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not folder.exists() and sorted(os.listdir(tmp_path)) == ["bad.json", "tune.json"]


V2_DECLARED = {  # the shape of configs/experiments/forgetting_minatar_v2.json's declarations
    "primary_metric": {"name": "cora_forgetting", "task": "CartPole-v1", "num_cycles_for_forgetting": 1},
    "secondary_metrics": [{"name": "cora_forgetting", "num_cycles_for_forgetting": 2}, "cw_forgetting"],
    "pairs": [["PPO_CBP", "PPO"], ["PPO lr=", "PPO"]], "primary_pair": ["PPO_CBP", "PPO"],
    "primary_claim": "PPO_CBP forgets less than PPO", "statistics": "run-level resampling",
    "normalisation": {"kind": "reference_runs", "rule": "by the single-task reference runs"},
    "evaluation": {"policy": "greedy", "episodes_per_point": 10}}


def test_a_reporting_file_names_its_tuning_experiment_and_appends_the_chosen_value_later(tmp_path, capsys):
    """The sweeps run in a tuning file; the reporting file names it (tuning.experiment), starts without the sweep's
    arms and appends the chosen value once tuning is done: no post-hoc mark needed, the plan was declared."""
    write(tmp_path / "tune.json", tuning_file(tmp_path))
    data = {"flags": CARTPOLE, "grid": {"flags": ARMS[:2], "seed": [1, 2, 3]}, "declared": V2_DECLARED,
            "tuning": {**TUNING, "experiment": "tune.json"}, "reporting_seeds": [1, 2, 3]}
    exp = write(tmp_path / "report.json", data)
    e = load_experiment(exp)  # the prefix 'PPO lr=' has its arms in tune.json
    assert e.declarations.declared == V2_DECLARED and e.declarations.chosen == {}
    for tuning, message in (({**TUNING, "seeds": [101], "experiment": "tune.json"}, "must be those of tuning.experiment"),
                            ({**TUNING, "sweeps": {"PPO lr=": "gamma"}, "experiment": "tune.json"},
                             "must be those of tuning.experiment"),
                            ({**TUNING, "experiment": "tuning.json"}, "tuning.experiment is 'tuning.json', which does "
                                                                      "not exist")):
        with pytest.raises(UserError, match=re.escape(message)):
            load_experiment(write(tmp_path / "bad.json", {**data, "tuning": tuning}))
    folder = tmp_path / "f"
    first_start(exp, folder)
    chosen = {**ARMS[3], "chosen_from_tuning": "tune.json"}
    write(tmp_path / "other.json", tuning_file(tmp_path))
    write(exp, {**data, "grid": {"flags": [*ARMS[:2], {**chosen, "chosen_from_tuning": "other.json"}],
                                 "seed": [1, 2, 3]}})
    assert "is chosen from 'other.json', not from tuning.experiment 'tune.json'" in refused(capsys, exp, folder,
                                                                                             through_main=True)
    write(exp, {**data, "grid": {"flags": [*ARMS[:2], chosen], "seed": [1, 2, 3]}})
    first_start(exp, folder)  # accepted: the declared sweep's chosen value
    record = json.load(open(folder / "declarations.json"))
    assert record["chosen"] == {"PPO lr=0.01": "tune.json"} and record["post_hoc"] == {}
    assert record["chosen_sha256"] == {"PPO lr=0.01": D.sha256_file(str(tmp_path / "tune.json"))}
    assert len(record["revisions"]) == 2
    write(exp, {**data, "grid": {"flags": [*ARMS[:2], chosen, {"name": "SnP", "exp_name": "PPO+S&P"}],
                                 "seed": [1, 2, 3]}})
    assert "adds the method 'PPO+S&P'" in refused(capsys, exp, folder)


def test_a_tuning_file_whose_seeds_are_reporting_seeds_here_is_refused(tmp_path):
    write(tmp_path / "tune.json", {**tuning_file(tmp_path), "grid": {"seed": [3, 101], "flags": ARMS},
                                   "tuning": {**TUNING, "seeds": [3, 101]}, "reporting_seeds": [1]})
    with pytest.raises(UserError, match=r"chosen from 'tune.json', whose tuning seeds \[3\] are reporting seeds here"):
        load_experiment(write(tmp_path / "report.json", reporting_file()))


def test_the_split_a_report_checks_on_its_runs(tmp_path):
    write(tmp_path / "tune.json", tuning_file(tmp_path))
    d = load_experiment(write(tmp_path / "report.json", reporting_file())).declarations
    assert D.split_problems(d, [("PPO", 1), ("PPO lr=0.01", 2), ("PPO lr=0.001", 101)]) == []
    problems = D.split_problems(d, [("PPO lr=0.001", 3), ("PPO", 9)])
    assert len(problems) == 2 and "arm of the sweep 'PPO lr=' on reporting seed 3" in problems[0] and \
        "seed 9, neither" in problems[1]


# --- the record ------------------------------------------------------------------------------------------------------


def first_start(exp_path, folder) -> Queue:
    """What a launch does before Ray starts: the checks, then the folder with its record."""
    exp = load_experiment(exp_path)
    q = Queue(str(folder))
    L.check_configs(q, exp, exp.entries)
    L.start(q, exp, L.check_declarations(q, exp))
    return q


def refused(capsys, exp, folder, through_main: bool = False) -> str:
    """The launcher's one-line refusal (exit 2) of `exp` on the started `folder`: through a dry run of L.main, or
    through the checks L.main runs after validating every entry with the training CLI (~0.3 s of CPU an entry):
    the experiment loaded as a dry run loads it, check_configs, check_declarations."""

    def checks():
        experiment = load_experiment(exp, stand_ins=True)
        q = Queue(str(folder))
        L.check_configs(q, experiment, experiment.entries)
        L.check_declarations(q, experiment)

    with pytest.raises(SystemExit) as e:
        if through_main:
            exit_on_user_error(L.main)([exp, "--folder", str(folder), "--dry_run"])
        else:
            exit_on_user_error(checks)()
    out, err = capsys.readouterr()
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_the_record_refuses_changed_declarations_on_resume_and_keeps_every_revision(tmp_path, capsys):
    write(tmp_path / "tune.json", tuning_file(tmp_path))
    data = reporting_file()
    exp = write(tmp_path / "report.json", data)
    folder = tmp_path / "f"
    q = first_start(exp, folder)
    record = json.load(open(folder / "declarations.json"))
    assert record["declarations"] == {"declared": DECLARED, "tuning": TUNING, "reporting_seeds": [1, 2, 3]}
    assert record["chosen"] == {"PPO lr=0.01": "tune.json"}
    assert record["chosen_sha256"] == {"PPO lr=0.01": D.sha256_file(str(tmp_path / "tune.json"))}
    assert record["methods"] == ["PPO", "PPO lr=0.01", "PPO_CBP"] and list(record["post_hoc"]) == ["PPO_CBP"]
    assert record["entries_before_record"] == 0
    (rev,) = record["revisions"]
    assert rev["sha256"] == D.sha256_file(exp) and rev["entries"] == 9 and rev["file"] == "report.json"
    assert rev["git_revision"] is None and rev["committed"] is None  # tmp_path is in no git repository
    assert L.main([exp, "--folder", str(folder), "--dry_run"]) == 0  # the same file goes on
    capsys.readouterr()

    # each declaration is fixed once the folder has started
    for key, value in (("declared", {**DECLARED, "primary_metric": "cw_forgetting"}),
                       ("declared", {**DECLARED, "pairs": [["PPO", "PPO_CBP"]]}),
                       ("tuning", {**TUNING, "criterion": "highest final return"}),
                       ("reporting_seeds", [1, 2, 3, 4])):
        write(exp, {**data, key: value})
        err = refused(capsys, exp, folder, through_main=key == "reporting_seeds")
        assert f"was started with other declarations (declarations.json: sha256 {rev['sha256'][:12]}" in err
        assert f"{key} changed; declarations may not change once an experiment has started" in err
    for key in ("declared", "reporting_seeds"):  # dropped (or, on a folder started without, added): changed too
        write(exp, {k: v for k, v in data.items() if k != key})
        assert f"{key} changed" in refused(capsys, exp, folder)
    write(exp, {**data, "post_hoc": []})
    assert "post_hoc no longer lists 'PPO_CBP'" in refused(capsys, exp, folder)

    # an arm inserted before others renames their entries: refused; appended (entries last): a new method, refused
    # unless marked post hoc
    snp = {"name": "SnP", "exp_name": "PPO+S&P", "shrink_and_perturb": True}
    flags = data["grid"]["flags"]
    write(exp, {**data, "grid": {"flags": [flags[0], snp, *flags[1:]], "seed": [1, 2, 3]}})
    assert "the entry '003_CBP_seed=1' started in" in refused(capsys, exp, folder)
    appended = {**data, "grid": {"flags": [*flags, snp], "seed": [1, 2, 3]}}
    write(exp, appended)
    assert [x.name for x in load_experiment(exp).entries[9:]] == ["009_SnP_seed=1", "010_SnP_seed=2", "011_SnP_seed=3"]
    err = refused(capsys, exp, folder)
    assert "entry 9 (SnP, seed=1) adds the method 'PPO+S&P' after" in err and "list it in post_hoc" in err
    write(exp, {**appended, "post_hoc": [*data["post_hoc"], "PPO+S&P"]})
    q = first_start(exp, folder)
    record = json.load(open(folder / "declarations.json"))
    assert [r["sha256"] for r in record["revisions"]] == [rev["sha256"], D.sha256_file(exp)]
    assert record["revisions"][1]["entries"] == 12 and list(record["post_hoc"]) == ["PPO_CBP", "PPO+S&P"]
    assert record["methods"] == ["PPO", "PPO lr=0.01", "PPO_CBP"]  # the methods of the first start stay
    first_start(exp, folder)  # the same file again: no new revision
    assert len(json.load(open(folder / "declarations.json"))["revisions"]) == 2
    assert q.folder == str(folder)


def test_the_record_names_the_files_git_revision_and_whether_it_was_committed(tmp_path):
    repo = tmp_path / "repo"
    os.makedirs(repo / "configs")
    exp = write(repo / "configs" / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1]}})
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "configs/e.json"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "e"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    rev = D.revision(exp, 1)
    assert (rev["file"], rev["git_revision"], rev["committed"]) == ("configs/e.json", head, True)
    write(exp, {"flags": CARTPOLE, "grid": {"seed": [1, 2]}})  # edited, not committed
    assert D.revision(exp, 2)["committed"] is False
    untracked = write(repo / "configs" / "new.json", {"flags": CARTPOLE, "grid": {"seed": [1]}})
    assert D.revision(untracked, 1)["committed"] is False


def test_a_folder_started_before_records_gets_one_and_counts_its_runs(tmp_path):
    exp = write(tmp_path / "e.json", {"flags": CARTPOLE, "grid": {"seed": [1, 2]}})
    q = Queue(str(tmp_path / "f"))
    q.create()
    q.set_status("000_seed=1", state="done")
    first_start(exp, q.folder)
    assert json.load(open(os.path.join(q.folder, "declarations.json")))["entries_before_record"] == 1


# --- post-hoc labels for the reports ---------------------------------------------------------------------------------


def test_post_hoc_labels_from_the_file_the_folder_and_the_marks_in_a_table(tmp_path):
    write(tmp_path / "tune.json", tuning_file(tmp_path))
    exp = write(tmp_path / "report.json", reporting_file())
    assert D.is_post_hoc(exp, "PPO_CBP") and not D.is_post_hoc(exp, "PPO")
    folder = first_start(exp, tmp_path / "f").folder
    post_hoc = D.post_hoc_labels(folder)  # the record
    assert list(post_hoc) == ["PPO_CBP"] and post_hoc["PPO_CBP"]["reason"] == "added after PPO forgot"
    os.unlink(os.path.join(folder, "declarations.json"))
    assert list(D.post_hoc_labels(folder)) == ["PPO_CBP"]  # a folder without a record: its experiment.json
    d = D.read_declarations(folder)
    assert d.declared["primary_metric"] == "cora_forgetting" and d.tuning_seeds == [101, 102]
    assert [D.mark(x, post_hoc) for x in ("PPO", "PPO_CBP")] == ["PPO", "PPO_CBP\u2020"]
    assert D.footnote(post_hoc) == ("\u2020 added after the first results (post hoc): PPO_CBP (added after PPO "
                                    "forgot; added 2026-12-01).")
    assert D.footnote({}) == ""


def test_published_numbers_are_kept_and_c_chains_table_4_is_declared():
    """declared.published is recorded like the rest; C-CHAIN's experiment declares the paper's Table 4 and its 12
    reporting seeds (the launcher enforces them: every entry runs on one)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "experiments",
                        "c_chain_minatar.json")
    e = load_experiment(path)
    d = e.declarations
    assert d.reporting_seeds == list(range(1, 13)) and d.tuning is None
    pub = d.declared["published"]
    assert pub["results"] == {"Double DQN": {"mean": 22.044, "se": 0.733, "n": 12},
                              "Double DQN + C-CHAIN": {"mean": 29.513, "se": 0.682, "n": 12}}
    assert pub["seeds"] == 12 and "Table 4" in pub["source"]
    assert d.declared["primary_pair"] == ["Double DQN + C-CHAIN", "Double DQN"]
    assert "_declared" not in json.load(open(path))
