"""Continual World's average performance, forgetting and forward transfer (continual/evaluation/cw.py) against an
independent re-implementation of Continual World's results processing written below on pandas log tables (one row
per evaluation step, a test column per position of the sequence and the position being trained, as CW's
progress.tsv), and by hand: the three readings of repeated visits, short visits, missing evaluations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from continual.evaluation import cw
from continual.evaluation import metrics as M

T = 100


def make_run(curves, steps, visits, name="run", config=None) -> M.RunData:
    evals = {t: [(s, float(y)) for s, y in zip(steps, ys) if y is not None] for t, ys in curves.items()}
    return M.RunData(run_dir=name, config=config or {"architecture": "PPO"}, evals=evals,
                     visits=M.number_visits([M.Visit(*v) for v in visits]), end_step=visits[-1][2])


# ---------------------------------------------------------------------------------------------------------------------
# the independent re-implementation: Continual World's tables on a log of rows
# ---------------------------------------------------------------------------------------------------------------------


def log_table(runs: list[M.RunData]) -> pd.DataFrame:
    """CW's progress.tsv of each run, stacked: x (step), experiment_id, active (the position trained up to x; -1 for
    a step-0 row, which CW does not have) and `pos<k>` = the score of position k's task (a regime has one curve here,
    so positions of one regime share it, as CW20's two test envs of one task would in distribution)."""
    rows = []
    for run in runs:
        steps = sorted({s for c in run.evals.values() for s, _ in c})
        for x in steps:
            active = next((k for k, v in enumerate(run.visits) if v.start < x <= v.end), -1)
            row = {"x": x, "experiment_id": run.run_dir, "active": active}
            for k, v in enumerate(run.visits):
                row[f"pos{k}"] = dict(run.evals[v.regime]).get(x, np.nan)
            rows.append(row)
    return pd.DataFrame(rows)


def cw_oracle(runs: list[M.RunData], refs: list[M.RunData], n_last: int = 5) -> dict:
    """Per run and for the method: forgetting and P(T) over the positions, forward transfer per position against
    the mean over reference runs, CW's (mean_runs AUC - mean_refs AUC_b) / (1 - mean_refs AUC_b) averaged over
    positions."""
    data = log_table(runs).sort_values("x")
    positions = [c for c in data.columns if c.startswith("pos")]
    at_the_end = data.groupby("experiment_id").tail(n_last).groupby("experiment_id")[positions].mean()
    when_trained = pd.concat([
        data[data["active"] == k].groupby("experiment_id").tail(n_last).groupby("experiment_id")[[c]].mean()
        for k, c in enumerate(positions)], axis=1)
    forgetting_per_run = (when_trained - at_the_end).mean(axis=1)  # skips NaN, as pandas in CW's code
    auc = pd.concat([data[data["active"] == k].groupby("experiment_id")[c].mean() for k, c in enumerate(positions)],
                    axis=1)
    ft_positions = []
    for k, c in enumerate(positions):
        regime = runs[0].visits[k].regime
        ref_aucs = []
        for ref in refs:
            v = next((w for w in ref.visits if w.regime == regime), None)
            if v is not None:
                ref_aucs.append(np.mean([y for s, y in ref.evals[regime] if v.start < s <= v.end]))
        y = np.mean(ref_aucs)
        ft_positions.append((auc[c].mean() - y) / (1 - y))
    return {"forgetting_per_run": forgetting_per_run.to_dict(), "forgetting": forgetting_per_run.mean(),
            "performance_per_run": at_the_end.mean(axis=1).to_dict(), "ft": float(np.mean(ft_positions)),
            "ft_per_position": ft_positions}


def cw20_like(seed: int, every: int = 10, step0: bool = False, runs: int = 3, refs_per_task: int = 2):
    rng = np.random.default_rng(seed)
    visits = [(t, k * T, (k + 1) * T) for k, t in enumerate("ABAB")]
    steps = list(range(0 if step0 else every, 4 * T + 1, every))
    rs = [make_run({t: rng.uniform(0, 1, len(steps)).tolist() for t in "AB"}, steps, visits, f"r{i}")
          for i in range(runs)]
    ref_steps = list(range(every, T + 1, every))
    refs = [make_run({t: rng.uniform(0, 1, len(ref_steps)).tolist()}, ref_steps, [(t, 0, T)], f"ref{t}{i}")
            for t in "AB" for i in range(refs_per_task)]
    return rs, refs


@pytest.mark.parametrize("every,step0,n_last", [(10, False, 5), (30, False, 5), (10, True, 5), (25, True, 3),
                                                (10, False, 1), (50, True, 5)])
def test_per_visit_reading_is_continual_worlds_on_a_cw20_like_sequence(every, step0, n_last):
    """A B A B as CW20's positions: forgetting, P(T) and forward transfer equal CW's computation, per run and for the
    method; visits of 2-3 evaluations (every 30 or 50 steps) make the final tail reach back into earlier visits."""
    runs, refs = cw20_like(every + step0, every, step0)
    want = cw_oracle(runs, refs, n_last)
    forg = [cw.cw_forgetting(r, "per_visit", n_last)["value"] for r in runs]
    assert forg == pytest.approx([want["forgetting_per_run"][r.run_dir] for r in runs], rel=1e-12, abs=1e-12)
    assert cw.method_mean(forg) == pytest.approx(want["forgetting"], rel=1e-12, abs=1e-12)
    # P(T): CW averages its position columns; positions of one regime are the same curve here, and each regime is
    # visited twice, so the mean over positions is the mean over regimes
    perf = [cw.cw_average_performance(r, n_last)["value"] for r in runs]
    assert perf == pytest.approx([want["performance_per_run"][r.run_dir] for r in runs], rel=1e-12)
    ft = [cw.cw_forward_transfer(r, refs, "per_visit")["value"] for r in runs]
    assert cw.method_mean(ft) == pytest.approx(want["ft"], rel=1e-12, abs=1e-12)


def test_forward_transfer_is_linear_so_per_run_values_average_to_cws():
    runs, refs = cw20_like(7, runs=5, refs_per_task=3)
    want = cw_oracle(runs, refs)
    per_visit = [cw.cw_forward_transfer(r, refs)["entries"] for r in runs]
    for k in range(4):
        assert np.mean([e[k]["value"] for e in per_visit]) == pytest.approx(want["ft_per_position"][k], rel=1e-12)
        assert all(e[k]["references"] == 3 and e[k]["length"] == e[k]["reference_length"] == T for e in per_visit)


# ---------------------------------------------------------------------------------------------------------------------
# readings, by hand
# ---------------------------------------------------------------------------------------------------------------------

# A (0,100], B (100,200], A (200,300], B (300,400]; evaluations every 25 steps and at step 0
STEPS = list(range(0, 401, 25))
AB2 = [("A", 0, 100), ("B", 100, 200), ("A", 200, 300), ("B", 300, 400)]
A = [0.0, .2, .4, .6, .8, .5, .4, .3, .3, .6, .7, .9, 1., .8, .6, .5, .4]
B = [0.0, .1, .1, .1, .1, .3, .5, .6, .7, .5, .4, .3, .3, .6, .7, .8, .8]


def test_the_three_readings_by_hand_and_they_differ():
    run = make_run({"A": A, "B": B}, STEPS, AB2)
    mean = lambda *xs: sum(xs) / len(xs)  # noqa: E731
    final_a, final_b = mean(1., .8, .6, .5, .4), mean(.3, .6, .7, .8, .8)  # the last 5 evaluations of the run
    # each visit owns the evaluations in (start, end]: 4 each, so all 4 are its tail
    end = {1: mean(.2, .4, .6, .8), 2: mean(.3, .5, .6, .7), 3: mean(.6, .7, .9, 1.), 4: mean(.6, .7, .8, .8)}
    f = cw.cw_forgetting(run, "per_visit")
    assert [e["visit"] for e in f["entries"]] == [1, 2, 3, 4]
    assert [e["at_end"] for e in f["entries"]] == pytest.approx([end[1], end[2], end[3], end[4]])
    want_pv = mean(end[1] - final_a, end[2] - final_b, end[3] - final_a, end[4] - final_b)
    assert f["value"] == pytest.approx(want_pv)
    assert f["per_regime"]["A"] == pytest.approx(mean(end[1] - final_a, end[3] - final_a))
    last = cw.cw_forgetting(run, "last")["value"]
    first = cw.cw_forgetting(run, "first")["value"]
    assert last == pytest.approx(mean(end[3] - final_a, end[4] - final_b))
    assert first == pytest.approx(mean(end[1] - final_a, end[2] - final_b))
    assert len({round(x, 9) for x in (f["value"], last, first)}) == 3
    # B's last visit ends the run; with 4 evaluations in it, the final's tail of 5 reaches back to step 300 (in A's
    # visit), so its forgetting is not 0
    assert f["entries"][3]["value"] == pytest.approx(end[4] - final_b) != 0
    # forward transfer, first visits only vs every visit
    ref = [make_run({t: [.5] * 4}, [25, 50, 75, 100], [(t, 0, T)], f"ref{t}") for t in "AB"]
    ft_first = cw.cw_forward_transfer(run, ref, "first")
    assert [e["visit"] for e in ft_first["entries"]] == [1, 2]
    assert ft_first["entries"][0]["auc"] == pytest.approx(mean(.2, .4, .6, .8))  # step 0 is in no visit
    assert ft_first["value"] == pytest.approx(mean((.5 - .5) / .5, (mean(.3, .5, .6, .7) - .5) / .5))
    ft_pv = cw.cw_forward_transfer(run, ref)
    assert ft_pv["value"] == pytest.approx(mean(0, (mean(.3, .5, .6, .7) - .5) / .5, (mean(.6, .7, .9, 1.) - .5) / .5,
                                                (mean(.6, .7, .8, .8) - .5) / .5))


def test_last_reading_with_one_evaluation_is_the_librarys_forgetting_last_visit():
    run = make_run({"A": A, "B": B}, STEPS, AB2)
    ours = M.run_metrics(run)["summary"]["forgetting_last_visit"]
    assert cw.cw_forgetting(run, "last", n_last=1)["value"] == pytest.approx(ours)
    assert cw.cw_forgetting(run, "last", n_last=5)["value"] != pytest.approx(ours)


def test_missing_evaluations_and_short_visits():
    visits = [("A", 0, 100), ("B", 100, 200), ("A", 200, 300)]
    steps = [0, 50, 100, 250, 300]  # B's visit has no evaluation; A's second visit two
    run = make_run({"A": [0, .5, .9, .2, .4], "B": [.1, .1, .2, .3, .3]}, steps, visits)
    f = cw.cw_forgetting(run, "per_visit")
    assert f["entries"][0]["at_end"] == pytest.approx((.5 + .9) / 2)  # fewer than 5: all of them
    assert f["entries"][1]["at_end"] is None and f["entries"][1]["value"] is None
    assert f["entries"][2]["at_end"] == pytest.approx((.2 + .4) / 2)
    final_a = np.mean([0, .5, .9, .2, .4])  # the whole curve, step 0 included: fewer than 5 after it
    assert f["value"] == pytest.approx(np.mean([.7 - final_a, .3 - final_a]))  # B's missing entry left out
    ft = cw.cw_forward_transfer(run, [])
    assert ft["value"] is None and ft["entries"][0]["references"] == 0


def test_ceiling_and_bad_input():
    run = make_run({"A": A, "B": B}, STEPS, AB2)
    ref = [make_run({t: [.5] * 4}, [25, 50, 75, 100], [(t, 0, T)], f"ref{t}") for t in "AB"]
    by_number = cw.cw_forward_transfer(run, ref, "first", ceiling=2.0)
    by_regime = cw.cw_forward_transfer(run, ref, "first", ceiling=lambda regime: 2.0)
    assert by_number["value"] == pytest.approx(by_regime["value"])
    assert by_number["entries"][1]["value"] == pytest.approx((np.mean([.3, .5, .6, .7]) - .5) / 1.5)
    at_ceiling = [make_run({t: [1.0] * 4}, [25, 50, 75, 100], [(t, 0, T)], f"ref{t}") for t in "AB"]
    assert cw.cw_forward_transfer(run, at_ceiling, "first")["value"] is None  # (AUC - 1) / 0
    with pytest.raises(ValueError, match="reading"):
        cw.cw_forgetting(run, "middle")
    with pytest.raises(ValueError, match="n_last"):
        cw.cw_forgetting(run, "last", n_last=0)


def test_run_metrics_carries_continual_worlds_metrics_on_the_normalised_curves():
    runs, refs = cw20_like(11)
    norm = M.Normalizer("max_abs", runs=runs + refs)
    res = M.run_metrics(runs[0], norm, refs, cw_reading="per_visit", cw_last=5)
    s = res["summary"]
    assert s["cw_forgetting"] == pytest.approx(cw.cw_forgetting(runs[0], normalizer=norm)["value"])
    assert s["cw_average_performance"] == pytest.approx(cw.cw_average_performance(runs[0], normalizer=norm)["value"])
    assert s["cw_forward_transfer"] == pytest.approx(
        cw.cw_forward_transfer(runs[0], refs, ceiling=1.0, normalizer=norm)["value"])
    assert res["cw"]["reading"] == "per_visit" and len(res["cw"]["forgetting"]) == 4
    assert res["regimes"]["A"]["cw_forgetting"] == pytest.approx(
        cw.cw_forgetting(runs[0], normalizer=norm)["per_regime"]["A"])
    first = M.run_metrics(runs[0], norm, refs, cw_reading="first")["summary"]["cw_forgetting"]
    assert first == pytest.approx(cw.cw_forgetting(runs[0], "first", normalizer=norm)["value"]) != s["cw_forgetting"]
    # raw returns: the ceiling is the regime's largest |return| (the library's convention for raw scores)
    raw = M.run_metrics(runs[0], None, refs)
    assert raw["cw"]["forward_transfer"][0]["ceiling"] == pytest.approx(
        max(abs(y) for r in runs[:1] + refs for _, y in r.evals.get("A", [])))


def test_cli_reading_and_its_errors(tmp_path, capsys):
    from continual.errors import exit_on_user_error

    with pytest.raises(SystemExit) as e:
        exit_on_user_error(M.main)([str(tmp_path), "--cw_reading", "middle"])
    assert e.value.code == 2 and "cw_reading" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(M.main)([str(tmp_path), "--cw_last", "0"])
    assert e.value.code == 2 and "cw_last" in capsys.readouterr().err
