"""Continual metrics on crafted evaluation tables, every value computed by hand below; loaders, CLI and plots on a
crafted run directory."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os

import numpy as np
import pytest
from rliable import metrics as rl

from conftest import write_config
from continual.evaluation import cw as cw_module
from continual.evaluation import metrics as M
from continual.evaluation import plots

# Schedule: A (0,100], B (100,200], A again (200,300], C (300,400]; H is held-out (never trained).
VISITS = [("A", 0, 100), ("B", 100, 200), ("A", 200, 300), ("C", 300, 400)]
STEPS = [0, 50, 100, 150, 200, 250, 300, 350, 400]
CURVES = {
    "A": [0, 5, 10, 6, 4, 8, 12, 9, 7],
    "B": [1, 2, 3, 8, 10, 7, 6, 5, 5],
    "C": [2, 2, 4, 4, 5, 5, 3, 9, 11],
    "H": [1, 1, 2, 2, 3, 3, 4, 4, 6],
}
# training episodes (step, regime, return)
EPISODES = [(10, "A", 1.0), (40, "A", 3.0), (60, "A", 5.0), (90, "A", 7.0),
            (120, "B", 2.0), (180, "B", 4.0),
            (220, "A", 6.0), (260, "A", 6.0), (290, "A", 9.0),
            (330, "C", 3.0)]


def make_run(curves=CURVES, steps=STEPS, visits=VISITS, episodes=EPISODES, heldout=("H",), end=400, config=None):
    return M.RunData(
        run_dir="crafted", config=config or {"architecture": "PPO", "possible_modifications": ["A", "B", "C"]},
        evals={m: list(zip(steps, map(float, ys))) for m, ys in curves.items()},
        visits=M.number_visits([M.Visit(*v) for v in visits]), end_step=end, episodes=list(episodes),
        heldout=list(heldout))


@pytest.fixture
def result():
    return M.run_metrics(make_run())


def test_visits_are_numbered_per_regime():
    run = make_run()
    assert [(v.regime, v.number) for v in run.visits] == [("A", 1), ("B", 1), ("A", 2), ("C", 1)]
    assert run.trained == ["A", "B", "C"]
    assert run.regimes == ["A", "B", "C", "H"]


def test_final_and_average_performance(result):
    r = result["regimes"]
    assert (r["A"]["final"], r["B"]["final"], r["C"]["final"], r["H"]["final"]) == (7, 5, 11, 6)
    # trapezoid over 50-step spacing on [0, 400]
    a = 50 * ((0 + 5) + (5 + 10) + (10 + 6) + (6 + 4) + (4 + 8) + (8 + 12) + (12 + 9) + (9 + 7)) / 2 / 400
    assert r["A"]["average"] == pytest.approx(a) == pytest.approx(7.1875)
    s = result["summary"]
    assert s["final"] == pytest.approx((7 + 5 + 11) / 3)   # trained regimes only (Continual World's P(T))
    assert s["final_unseen"] == pytest.approx(6)            # the held-out regime


def test_forgetting_over_all_later_visits(result):
    r = result["regimes"]
    # A: during B (100,200]: y_A(100) - y_A(200) = 10 - 4; during C (300,400]: y_A(300) - y_A(400) = 12 - 7.
    # The revisit of A itself is not forgetting.
    assert r["A"]["forgetting_all_visits"] == pytest.approx(((10 - 4) + (12 - 7)) / 2)
    # B: during A's revisit: y_B(200) - y_B(300) = 10 - 6; during C: y_B(300) - y_B(400) = 6 - 5
    assert r["B"]["forgetting_all_visits"] == pytest.approx(((10 - 6) + (6 - 5)) / 2)
    # C is trained last (nothing after it) and H never: no forgetting
    assert r["C"]["forgetting_all_visits"] is None and r["H"]["forgetting_all_visits"] is None
    assert result["summary"]["forgetting_all_visits"] == pytest.approx((5.5 + 2.5) / 2)
    cells = {(e["regime"], e["visit"]): e["value"] for e in result["forgetting_matrix"]}
    assert cells == {("A", 2): 6, ("A", 4): 5, ("B", 3): 4, ("B", 4): 1}


def test_forgetting_continual_world_and_from_best(result):
    r = result["regimes"]
    # Continual World: score when training on the regime ended (end of its last visit) minus the final score
    assert r["A"]["forgetting_last_visit"] == pytest.approx(12 - 7)  # y_A(300) - y_A(400)
    assert r["B"]["forgetting_last_visit"] == pytest.approx(10 - 5)  # y_B(200) (B never revisited) - y_B(400)
    assert r["C"]["forgetting_last_visit"] == 0                      # its last visit ends the run: y_C(400) - y_C(400)
    assert r["H"]["forgetting_last_visit"] is None                   # never trained
    assert result["summary"]["forgetting_last_visit"] == pytest.approx((5 + 5 + 0) / 3)  # all trained regimes, as CW
    assert r["A"]["forgetting_from_best"] == pytest.approx(12 - 7)  # max up to the end of A's last visit (300)
    assert r["B"]["forgetting_from_best"] == pytest.approx(10 - 5)
    assert r["C"]["forgetting_from_best"] is None and r["H"]["forgetting_from_best"] is None


def test_continual_world_forgetting_is_not_the_best_score_minus_final():
    """Wolczyk et al. 2021: F_i = p_i(end of training on i) - p_i(T), p the normalised score (success rate there;
    max_abs here). A peaks mid-visit: its best score is not its score when training on it ended."""
    steps = [0, 50, 100, 150, 200, 250, 300]
    visits = [("A", 0, 100), ("B", 100, 200), ("C", 200, 300)]
    curves = {"A": [0, 10, 6, 5, 5, 4, 4], "B": [0, 1, 2, 8, 5, 3, 2], "C": [1, 1, 1, 1, 1, 2, 3]}
    run = make_run(curves, steps, visits, episodes=[], heldout=(), end=300)
    raw = M.run_metrics(run)
    assert raw["regimes"]["A"]["forgetting_last_visit"] == pytest.approx(6 - 4)          # y_A(100) - y_A(300)
    assert raw["regimes"]["A"]["forgetting_from_best"] == pytest.approx(10 - 4)  # max y_A up to 100 - y_A(300)
    assert raw["regimes"]["B"]["forgetting_last_visit"] == pytest.approx(5 - 2)          # y_B(200) - y_B(300)
    assert raw["regimes"]["B"]["forgetting_from_best"] == pytest.approx(8 - 2)
    assert raw["regimes"]["C"]["forgetting_last_visit"] == 0
    assert raw["summary"]["forgetting_last_visit"] == pytest.approx((2 + 3 + 0) / 3)
    norm = M.run_metrics(run, M.Normalizer("max_abs", runs=[run]))  # scores in [0, 1], as Continual World's
    assert norm["regimes"]["A"]["forgetting_last_visit"] == pytest.approx(6 / 10 - 4 / 10)
    assert norm["regimes"]["B"]["forgetting_last_visit"] == pytest.approx(5 / 8 - 2 / 8)
    assert norm["summary"]["forgetting_last_visit"] == pytest.approx((0.2 + 0.375 + 0) / 3)
    # an evaluation grid that misses the switch: the last evaluation before it
    late = make_run({m: ys[:2] + ys[3:] for m, ys in curves.items()}, steps[:2] + steps[3:], visits, [], (), 300)
    late = M.run_metrics(late)
    assert late["regimes"]["A"]["forgetting_last_visit"] == pytest.approx(10 - 4)  # y_A(50): no evaluation at 100


def continual_world_forgetting(rows: list[dict], tasks: list[str], tail: int) -> float:
    """Continual World's results_processing/tables.py, re-written on a list of log rows {x, active, <task>: score}:
    calculate_forgetting_individual (per task: the mean of its column over the last `tail` rows logged while it was
    the active env, minus the mean over the last `tail` rows of the run), then compute_mean_and_ci's point value
    (the mean over all task columns)."""
    rows = sorted(rows, key=lambda r: r["x"])
    at_end = {t: np.mean([r[t] for r in rows[-tail:]]) for t in tasks}
    when_trained = {t: np.mean([r[t] for r in rows if r["active"] == t][-tail:]) for t in tasks}
    return float(np.mean([when_trained[t] - at_end[t] for t in tasks]))


def test_continual_world_forgetting_against_continual_worlds_averaging():
    """A hand-made Continual World log (one pass over A, B, C; an evaluation every 25 steps, labelled with the task
    trained up to it): forgetting_last_visit is CW's all-task mean with one evaluation per point (tail 1),
    cw_forgetting CW's with its own tail of 5; the mean over the N-1 tasks left before the end is N/(N-1) times it;
    CW's default tail of 5 smooths (and gives the last task a small non-zero term)."""
    tasks, steps = ["A", "B", "C"], list(range(25, 301, 25))
    visits = [("A", 0, 100), ("B", 100, 200), ("C", 200, 300)]
    curves = {"A": [.1, .3, .6, .9, .8, .7, .6, .5, .5, .4, .4, .3],
              "B": [0, 0, .1, .1, .2, .5, .7, .8, .6, .5, .3, .2],
              "C": [0, 0, 0, 0, .1, .1, .1, .2, .4, .6, .9, .95]}
    rows = [{"x": x, "active": next(m for m, s, e in visits if s < x <= e), **{t: curves[t][i] for t in tasks}}
            for i, x in enumerate(steps)]
    run = make_run(curves, steps, visits, episodes=[], heldout=(), end=300)
    ours = M.run_metrics(run)["summary"]
    cw = continual_world_forgetting(rows, tasks, tail=1)
    # Continual World's own metric (continual.evaluation.cw, one pass: every reading the same) is the tail-5 one
    for reading in cw_module.READINGS:
        assert cw_module.cw_forgetting(run, reading)["value"] == pytest.approx(
            continual_world_forgetting(rows, tasks, tail=5))
    assert ours["cw_forgetting"] == pytest.approx(continual_world_forgetting(rows, tasks, tail=5))
    assert ours["forgetting_last_visit"] == pytest.approx(cw) == pytest.approx(((.9 - .3) + (.8 - .2) + 0) / 3)
    left = continual_world_forgetting(rows, tasks[:2], tail=1)  # the old N-1 figure
    assert left == pytest.approx(cw * 3 / 2)
    # CW's own window (tail 5): A's 4 evaluations during its visit, then the last 5 of the run
    assert continual_world_forgetting(rows, tasks, tail=5) == pytest.approx(np.mean([
        np.mean([.1, .3, .6, .9]) - np.mean([.5, .5, .4, .4, .3]),
        np.mean([.2, .5, .7, .8]) - np.mean([.8, .6, .5, .3, .2]),
        np.mean([.4, .6, .9, .95]) - np.mean([.2, .4, .6, .9, .95])]))  # the last task's is not 0 there


def test_zero_shot_forward_transfer(result):
    r = result["regimes"]
    assert r["A"]["transfer_zero_shot"] is None  # trained from step 0: no visit before it
    # B before its first visit: visit 1 (A), baseline = step-0 evaluation: y_B(100) - y_B(0) = 3 - 1
    assert r["B"]["transfer_zero_shot"] == pytest.approx(2)
    # C: visits 1..3 before its first visit: (4 - 2), (5 - 4), (3 - 5)
    assert r["C"]["transfer_zero_shot"] == pytest.approx((2 + 1 - 2) / 3)
    # H (held-out): every visit: (2-1), (3-2), (4-3), (6-4)
    assert r["H"]["transfer_zero_shot"] == pytest.approx((1 + 1 + 1 + 2) / 4)
    assert result["summary"]["transfer_zero_shot"] == pytest.approx((2 + 1 / 3 + 5 / 4) / 3)


def test_zero_shot_baseline_without_a_step0_evaluation():
    steps = STEPS[1:]
    curves = {m: ys[1:] for m, ys in CURVES.items()}
    res = M.run_metrics(make_run(curves=curves, steps=steps))
    # CORA: the first evaluation point (step 50) is the baseline of visit 1: y_B(100) - y_B(50) = 3 - 2
    assert res["regimes"]["B"]["transfer_zero_shot"] == pytest.approx(1)
    assert res["regimes"]["H"]["transfer_zero_shot"] == pytest.approx((1 + 1 + 1 + 2) / 4)  # y_H(50) = y_H(0)


def test_plasticity_gain_by_visit(result):
    gains = {(g["regime"], g["visit"]): g["gain"] for g in result["plasticity"]}
    # window = the whole visit, halves (s, s+50] and (s+50, s+100]
    assert gains[("A", 1)] == pytest.approx((5 + 7) / 2 - (1 + 3) / 2)
    assert gains[("B", 1)] == pytest.approx(4 - 2)
    assert gains[("A", 2)] == pytest.approx((6 + 9) / 2 - 6)
    assert gains[("C", 1)] is None  # no episode in the second half
    s = result["summary"]
    assert s["plasticity_by_visit"] == {"1": pytest.approx(3.0), "2": pytest.approx(1.5)}
    assert s["plasticity"] == pytest.approx((4 + 2 + 1.5) / 3)


def test_plasticity_window():
    res = M.run_metrics(make_run(), plasticity_window=40)
    gains = {(g["regime"], g["visit"]): g["gain"] for g in res["plasticity"]}
    assert gains[("A", 1)] == pytest.approx(3 - 1)  # (0,20] vs (20,40]
    assert gains[("B", 1)] is None and gains[("A", 2)] is None
    assert res["summary"]["plasticity_by_visit"] == {"1": pytest.approx(2.0), "2": None}


def test_reference_forward_transfer():
    ref = make_run(curves={"B": [0, 4, 8]}, steps=[0, 100, 200], visits=[("B", 0, 200)], episodes=[], heldout=(),
                   end=200)
    run = make_run()
    res = M.run_metrics(run, references=[ref])
    # B's first visit (100,200] (length 100): AUC = mean of the B curve over [100,200] through 3, 8, 10;
    # reference: mean over [0,100] through 0, 4; ceiling for raw returns = max|R_B| over both runs = 10
    auc = ((3 + 8) / 2 * 50 + (8 + 10) / 2 * 50) / 100
    auc_ref = (0 + 4) / 2
    assert res["regimes"]["B"]["reference"]["auc"] == pytest.approx(auc)
    assert res["regimes"]["B"]["transfer_reference"] == pytest.approx((auc - auc_ref) / (10 - auc_ref))
    assert res["regimes"]["A"]["transfer_reference"] is None  # no reference for A
    # scale-free: the same value with max_abs normalisation
    norm = M.Normalizer("max_abs", runs=[run, ref])
    assert M.run_metrics(run, norm, [ref])["regimes"]["B"]["transfer_reference"] == pytest.approx(0.65625)


def test_normalisation_options():
    run = make_run()
    res = M.run_metrics(run, M.Normalizer("max_abs", runs=[run]))
    assert res["regimes"]["A"]["final"] == pytest.approx(7 / 12)
    assert res["regimes"]["A"]["forgetting_all_visits"] == pytest.approx(5.5 / 12)
    scores = {"A": [0, 20], "B": 10, "C": [1, 11], "H": 2}
    res = M.run_metrics(run, M.Normalizer("reference_scores", scores, runs=[run]))
    assert res["regimes"]["A"]["final"] == pytest.approx(7 / 20)
    assert res["regimes"]["C"]["final"] == pytest.approx((11 - 1) / 10)
    assert res["regimes"]["H"]["transfer_zero_shot"] == pytest.approx(5 / 4 / 2)
    with pytest.raises(ValueError, match="'C'"):
        M.Normalizer("reference_scores", {"A": 1, "B": 1, "H": 1}, runs=[run])


def test_single_regime_run():
    res = M.run_metrics(make_run(curves={"A": [0, 4, 6], "H": [1, 2, 3]}, steps=[0, 50, 100], visits=[("A", 0, 100)],
                                 episodes=[(30, "A", 1.0), (80, "A", 2.0)], end=100))
    r, s = res["regimes"], res["summary"]
    assert r["A"]["final"] == 6 and r["A"]["average"] == pytest.approx((2 + 5) / 2)
    assert r["A"]["forgetting_all_visits"] is None and r["A"]["forgetting_last_visit"] == 0  # trained to the end
    assert r["A"]["transfer_zero_shot"] is None
    assert r["H"]["transfer_zero_shot"] == pytest.approx(3 - 1)
    assert s["forgetting_all_visits"] is None and s["transfer_zero_shot"] == pytest.approx(2)
    assert s["plasticity_by_visit"] == {"1": pytest.approx(1.0)}
    assert res["forgetting_matrix"] == []


def test_mean_ci_uses_the_t_distribution():
    from scipy import stats

    d = M.mean_ci([1.0, 2.0, 3.0])
    assert d["mean"] == 2 and d["n"] == 3
    assert d["ci95"] == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)  # the printed table's t_{0.975, 2}
    assert d["ci95"] == pytest.approx(stats.t.ppf(0.975, 2) / math.sqrt(3), rel=1e-12)
    assert M.mean_ci([5.0]) == {"mean": 5.0, "ci95": None, "n": 1}
    assert M.mean_ci([None]) == {"mean": None, "ci95": None, "n": 0}
    for df, table in ((1, 12.706), (2, 4.303), (5, 2.571), (30, 2.042), (120, 1.980)):  # printed t tables
        assert M.t_quantile_975(df) == pytest.approx(table, abs=6e-4)


def test_probability_of_improvement_equals_rliables_mann_whitney():
    # rliable's definition (scipy's Mann-Whitney U per task) is the reference; integer scores make ties common
    rng = np.random.default_rng(0)
    for nx, ny, k in ((1, 1, 1), (2, 3, 1), (5, 5, 2), (3, 7, 4), (10, 4, 3)):
        for _ in range(20):
            x = rng.integers(0, 4, size=(nx, k)).astype(float)
            y = rng.integers(0, 4, size=(ny, k)).astype(float)
            assert M.probability_of_improvement(x, y) == pytest.approx(float(rl.probability_of_improvement(x, y)))
    x = rng.normal(size=(5, 3))
    assert M.probability_of_improvement(x, x) == 0.5
    assert M.probability_of_improvement(x + 100, x) == 1.0 and M.probability_of_improvement(x, x + 100) == 0.0
    with_nan = x.copy()
    with_nan[0, 1] = np.nan
    assert np.isnan(M.probability_of_improvement(with_nan, x))
    # the bootstrap of a report draws the same resamples with either implementation
    assert M.paired_bootstrap(x, x[::-1] * 0.9, M.probability_of_improvement, reps=100) == \
        M.paired_bootstrap(x, x[::-1] * 0.9, rl.probability_of_improvement, reps=100)


def test_robust_statistics_against_hand_computation():
    # IQM: the mean of the middle half of the pooled scores (8 scores: the 2nd..6th quarter-trimmed)
    x = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])
    assert rl.aggregate_iqm(x) == pytest.approx(np.mean([3.0, 4.0, 10.0, 20.0]))
    # probability of improvement, one task: pairs (x_i, y_j) with x_i > y_j (ties 1/2): (3>2, 3>0, 1>0) of 4
    assert rl.probability_of_improvement(np.array([[3.0], [1.0]]), np.array([[2.0], [0.0]])) == pytest.approx(0.75)
    # performance profile: fraction of scores above tau
    assert M.performance_profile(x, np.array([0.0, 3.0, 40.0])).tolist() == [1.0, 5 / 8, 0.0]  # 4, 10, 20, 30, 40 > 3
    # the bootstrap is stratified: each task keeps its own runs, so a matrix whose tasks are constant has one mean
    const = np.array([[0.0, 10.0], [0.0, 10.0], [0.0, 10.0]])
    assert M.stratified_bootstrap(const, np.mean, reps=200) == (5.0, 5.0)
    # one task, runs (0, 1): resampled means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4 -> 95% interval [0, 1]
    assert M.stratified_bootstrap(np.array([[0.0], [1.0]]), np.mean, reps=2000) == (0.0, 1.0)
    lo, hi = M.stratified_bootstrap(np.arange(20.0).reshape(20, 1), np.mean, reps=4000)
    se = np.std(np.arange(20.0)) / math.sqrt(20)  # the bootstrap distribution of a mean: ~normal, sd = sd_pop/sqrt(n)
    assert lo == pytest.approx(9.5 - 1.96 * se, abs=0.35) and hi == pytest.approx(9.5 + 1.96 * se, abs=0.35)


def test_stratified_bootstrap_against_the_exact_bootstrap_distribution():
    """rliable's StratifiedBootstrap (runs resampled with replacement within each task, percentile interval) written
    out exactly: 3 runs x 2 tasks have 27 x 27 equally likely resamples. rliable's own (rliable.library) cannot run
    here (rliable 1.2 pins arch < 8; arch 7.2 does not import with pandas 3; arch 8 rejects its random_state=None)."""
    import itertools

    x = np.array([[0.1, 2.0], [0.7, 2.5], [0.3, 4.0]])
    idx = list(itertools.product(range(3), repeat=3))
    means = np.sort([(x[list(a), 0].sum() + x[list(b), 1].sum()) / 6 for a in idx for b in idx])
    cdf = np.arange(1, len(means) + 1) / len(means)
    exact = (means[np.searchsorted(cdf, 0.025)], means[np.searchsorted(cdf, 0.975)])
    for reps in (2000, 50_000):  # ours by default, rliable's default
        lo, hi = M.stratified_bootstrap(x, rl.aggregate_mean, reps=reps, seed=1)
        tol = 0.06 if reps == 2000 else 0.02
        assert lo == pytest.approx(exact[0], abs=tol) and hi == pytest.approx(exact[1], abs=tol)
    d = M.bootstrap_mean([1.0, None, 3.0, float("nan")], reps=2000)
    assert d["mean"] == 2.0 and d["n"] == 2 and d["ci95"] == [1.0, 3.0]
    assert M.bootstrap_mean([]) == {"mean": None, "ci95": None, "n": 0}


def test_robust_aggregate_groups_methods():
    results, configs = [], []
    for arch, shift in (("PPO", 0), ("PPO", 2), ("PPO", 4), ("PPO_CBP", 10), ("PPO_CBP", 12)):
        curves = {m: [y + shift for y in ys] for m, ys in CURVES.items()}
        cfg = {"architecture": arch}
        results.append(M.run_metrics(make_run(curves=curves, config=cfg)))
        configs.append(cfg)
    rob = M.robust_aggregate(results, configs, reps=300)
    final = rob["keys"]["final"]
    assert final["tasks"] == ["A", "B", "C"]  # the trained regimes (H is held out)
    ppo = np.array([[7 + s, 5 + s, 11 + s] for s in (0, 2, 4)], dtype=float)
    assert final["methods"]["PPO"]["iqm"]["estimate"] == pytest.approx(rl.aggregate_iqm(ppo))
    assert final["methods"]["PPO"]["mean"]["estimate"] == pytest.approx(ppo.mean())
    lo, hi = final["methods"]["PPO"]["mean"]["ci95"]
    assert ppo.min() <= lo <= ppo.mean() <= hi <= ppo.max()
    # every CBP score beats every PPO score on every task
    assert final["probability_of_improvement"]["PPO_CBP > PPO"]["estimate"] == 1.0
    assert final["probability_of_improvement"]["PPO > PPO_CBP"]["ci95"] == [0.0, 0.0]
    assert "optimality_gap" not in final["methods"]["PPO"]  # raw returns: no threshold
    gap = M.robust_aggregate(results, configs, reps=50, gamma=8.0)["keys"]["final"]["methods"]["PPO"]
    assert gap["optimality_gap"]["estimate"] == pytest.approx(8.0 - np.minimum(ppo, 8.0).mean())
    # thresholds from the lowest to the highest score: all but the lowest (5, one PPO score) lie above the first
    assert final["profiles"]["PPO"][0] == pytest.approx(8 / 9) and final["profiles"]["PPO_CBP"][-1] == 0.0


def test_aggregate_groups_runs_by_method():
    results, configs = [], []
    for arch, sp, shift in (("PPO", False, 0), ("PPO", False, 2), ("PPO", True, 1), ("PPO_CBP", False, 0)):
        curves = {m: [y + shift for y in ys] for m, ys in CURVES.items()}
        cfg = {"architecture": arch, "shrink_and_perturb": sp}
        results.append(M.run_metrics(make_run(curves=curves, config=cfg)))
        configs.append(cfg)
    groups = M.aggregate(results, configs)
    assert set(groups) == {"PPO", "PPO+S&P", "PPO_CBP"}
    ppo = groups["PPO"]["summary"]["final"]
    assert ppo["n"] == 2 and ppo["mean"] == pytest.approx(23 / 3 + 1)
    assert ppo["ci95"] == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2), rel=1e-4)  # sd of (x, x + 2) = sqrt(2)
    assert groups["PPO+S&P"]["summary"]["final"]["ci95"] is None
    assert groups["PPO"]["regimes"]["A"]["forgetting_all_visits"]["mean"] == pytest.approx(5.5)  # shifts cancel
    by_exp = M.aggregate(results, [{**c, "exp_name": "x"} for c in configs], group_by=["exp_name"])
    assert list(by_exp) == ["exp_name=x"]
    # launcher runs carry their arm's name: two arms of one architecture stay two groups (a reference run is not
    # averaged into the continual arm), and an unnamed run still falls back to its architecture
    named = [{**c, "exp_name": n} for c, n in zip(configs, ("IMPALA", "reference IMPALA A", "IMPALA", ""))]
    groups = M.aggregate(results, named)
    assert {k: v["summary"]["final"]["n"] for k, v in groups.items()} == {"IMPALA": 2, "reference IMPALA A": 1,
                                                                          "PPO_CBP": 1}


def test_group_runs_keeps_first_seen_order_and_refuses_unpaired_configs():
    configs = [{"architecture": "PPO"}, {"architecture": "IMPALA", "exp_name": "CLEAR"}, {"architecture": "PPO"},
               {"architecture": "PPO", "shrink_and_perturb": True}]
    assert M.group_runs("abcd", configs) == {"PPO": ["a", "c"], "CLEAR": ["b"], "PPO+S&P": ["d"]}
    assert M.group_runs("abcd", configs, ["architecture"]) == {"architecture=PPO": ["a", "c", "d"],
                                                               "architecture=IMPALA": ["b"]}
    with pytest.raises(ValueError):  # a result without its config (or the reverse) is a caller's bug, not a group
        M.group_runs("abc", configs)


# --- run directories -------------------------------------------------------------------------------------------------


def write_run_dir(path, curves=CURVES, steps=STEPS, visits=VISITS, episodes=EPISODES, arch="PPO", plasticity=True):
    os.makedirs(path, exist_ok=True)
    write_config(path, {"architecture": arch, "env_id": "CartPole-v1", "shrink_and_perturb": False,
                        "possible_modifications": ["A", "B", "C"], "resolved_total_timesteps": 400}, "config.json")
    with open(os.path.join(path, M.EVAL_TABLE), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "modification", "slug", "split", "episodes", "mean", "std", "min", "max", "mean_length",
                    "seconds", "greedy"])
        for m, ys in curves.items():
            for s, y in zip(steps, ys):
                w.writerow([s, m, m, "heldout" if m == "H" else "curriculum", 2, y, 0.5, y - 1, y + 1, 10, 0.1,
                            False])
    recs = []
    for s in range(50, 401, 50):
        regime = next(v[0] for v in visits if v[1] < s <= v[2])
        recs.append({"kind": "iteration", "global_step": s, "modification": regime})
    for (old, _, _), (new, start, _) in zip(visits, visits[1:]):
        recs.append({"kind": "switch", "global_step": start, "modification": new, "previous": old})
        if plasticity:
            recs.append({"kind": "plasticity", "global_step": start, "plasticity/dormant_fraction/layer0": 0.1,
                         "plasticity/dormant_fraction/all": 0.1, "plasticity/effective_rank": 30.0 - start / 100})
    for s, m, r in episodes:
        recs.append({"kind": "episode", "global_step": s, "modification": m, "return": r, "length": 5})
    recs.sort(key=lambda r: r["global_step"])
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    return str(path)


def test_cli_on_run_directories(tmp_path, capsys):
    a = write_run_dir(tmp_path / "a")
    loaded = M.load_run(a)
    assert [(v.regime, v.start, v.end) for v in loaded.visits] == VISITS
    assert loaded.heldout == ["H"] and loaded.end_step == 400 and len(loaded.episodes) == len(EPISODES)

    M.main([a])
    out = json.load(open(os.path.join(a, M.METRICS_FILE)))
    assert out["summary"]["forgetting_all_visits"] == pytest.approx(4.0)
    assert out["summary"]["transfer_zero_shot"] == pytest.approx((2 + 1 / 3 + 5 / 4) / 3)
    printed = capsys.readouterr().out
    assert "forget (all visits)" in printed and "CW forget" in printed and "forget (best)" in printed
    assert "CORA's metrics, PPO: not computed" in printed  # A -> B -> A -> C is not one order repeated
    assert "repeated in one order" in out["cora"]["PPO"]["error"]
    assert out["cw"]["reading"] == "per_visit" and out["summary"]["cw_forgetting"] is not None

    b = write_run_dir(tmp_path / "b", curves={m: [y + 2 for y in ys] for m, ys in CURVES.items()})
    c = write_run_dir(tmp_path / "c", arch="PPO_CBP")
    agg_path = str(tmp_path / "agg.json")
    res = M.main([a, b, c, "--normalize", "max_abs", "--out", agg_path, "--plasticity_window", "40"])
    assert set(res["groups"]) == {"PPO", "PPO_CBP"} and len(res["runs"]) == 3
    assert json.load(open(agg_path))["groups"]["PPO"]["summary"]["final"]["n"] == 2
    captured = capsys.readouterr()
    assert "methods: mean ± 95% CI" in captured.out and "warning" not in captured.err  # a and b differ by seed only
    # a PPO run with another learning rate joins group "PPO" by default: a warning names the key
    d = write_run_dir(tmp_path / "d")
    cfg = json.load(open(os.path.join(d, "config.json")))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({**cfg, "learning_rate": 0.01, "seed": 7, "run_name": "d"}, f)
    M.main([a, b, d])
    err = capsys.readouterr().err
    assert err.strip() == ("warning: the group 'PPO' averages runs whose configurations differ in learning_rate; "
                           "--group_by KEY[,KEY] keeps them apart"), err
    M.main([a, b, d, "--group_by", "architecture,learning_rate"])
    assert "warning" not in capsys.readouterr().err


def test_cli_errors(tmp_path, capsys):
    from continual.errors import exit_on_user_error

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as e:
        exit_on_user_error(M.main)([str(empty)])
    assert e.value.code == 2 and "no evaluation table" in capsys.readouterr().err
    a = write_run_dir(tmp_path / "a")
    with pytest.raises(SystemExit):
        exit_on_user_error(M.main)([a, "--normalize", "reference_scores"])  # no --scores
    M.main([a, "--normalize", "reference_scores", "--scores", json.dumps({"A": 12, "B": 10, "C": 11, "H": 6})])
    assert json.load(open(os.path.join(a, M.METRICS_FILE)))["regimes"]["C"]["final"] == pytest.approx(1.0)


def test_plots_are_written(tmp_path):
    a = write_run_dir(tmp_path / "a")
    b = write_run_dir(tmp_path / "b", curves={m: [y + 2 for y in ys] for m, ys in CURVES.items()})
    out = tmp_path / "plots"
    paths = plots.main([a, b, "--out", str(out)])
    names = sorted(os.path.relpath(p, out) for p in paths)
    assert names == sorted(["comparison.png", "robust.png"] + [f"{r}/{n}.png" for r in ("a", "b") for n in
                                                  ("training_returns", "eval_curves", "eval_heatmap", "plasticity")])
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(p) > 10_000
    # a run without evaluation or episodes still gets its training plot
    bare = write_run_dir(tmp_path / "bare", curves={}, episodes=[], plasticity=False)
    os.remove(os.path.join(bare, M.EVAL_TABLE))
    assert [os.path.basename(p) for p in plots.plot_run(bare)] == ["training_returns.png"]


def test_single_regime_run_directory_without_switches(tmp_path):
    d = write_run_dir(tmp_path / "one", curves={"A": CURVES["A"], "H": CURVES["H"]}, visits=[("A", 0, 400)],
                      episodes=[(100, "A", 1.0), (300, "A", 4.0)])
    run = M.load_run(d)
    assert [(v.regime, v.start, v.end, v.number) for v in run.visits] == [("A", 0, 400, 1)]
    res = M.compute_run_metrics(d)
    assert res["summary"]["forgetting_all_visits"] is None and res["summary"]["forgetting_last_visit"] == 0
    assert res["regimes"]["H"]["transfer_zero_shot"] == pytest.approx(6 - 1)  # y_H(400) - y_H(0)
    assert res["summary"]["plasticity"] == pytest.approx(4 - 1)
    assert os.path.exists(os.path.join(d, M.METRICS_FILE))


def test_provenance_names_each_commit_and_every_resume():
    """A report's provenance: the commits runs started or resumed at (a dirty tree marked), and the steps of every
    resume (a periodic checkpoint restarts the episodes in flight: not the bit-exact replay of the seed)."""
    a, b, dirty = {"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": False}, {"commit": "a" * 40, "dirty": True}
    starts = {
        "r1": [{"kind": "start", "global_step": 0, "resumed": False, "code_revision": a}],
        "r2": [{"kind": "start", "global_step": 0, "resumed": False, "code_revision": a},
               {"kind": "start", "global_step": 4096, "resumed": True, "code_revision": b},
               {"kind": "start", "global_step": 8192, "resumed": True, "code_revision": b}],
        "r3": [{"kind": "start", "global_step": 0, "resumed": False, "code_revision": dirty}],
        "r4": [],  # written before start records existed
    }
    prov = M.provenance(starts.items())
    assert prov == {"commits": {"aaaaaaa": ["r1", "r2"], "bbbbbbb": ["r2"], "aaaaaaa-dirty": ["r3"]},
                    "resumed": {"r2": [4096, 8192]}}
    lines = M.provenance_lines(prov)
    assert lines[0] == "- Code: aaaaaaa (2 runs); bbbbbbb (1 run); aaaaaaa-dirty (1 run)"
    assert "r2 at 4096, 8192" in lines[1]
    assert M.provenance_lines(M.provenance([("r1", starts["r1"])]))[1].startswith("- Resumed from a checkpoint: none")


def test_runs_resumed_more_than_three_times_are_summed_up_and_grouped_by_count_and_range():
    """A run spanning many sessions (the C-CHAIN runs resume a few times a session for weeks) is listed by its count
    and range, and seeds resumed as one group share an entry; a run resumed up to 3 times keeps its steps, so the
    committed reports read as they did."""
    group = [{"global_step": 0}] + [{"global_step": s, "resumed": True} for s in (370000, 440000, 1446000, 1015000)]
    starts = {"v1": group, "c1": [{"global_step": 0}, {"global_step": 5, "resumed": True}], "v2": group,
              "c2": [{"global_step": s, "resumed": True} for s in (3, 9, 6, 12)], "c3": group[:4]}
    line = M.provenance_lines(M.provenance(starts.items()))[1]
    assert line == ("- Resumed from a checkpoint (5 runs; episodes in flight restarted): "
                    "2 runs (v1, v2) 4 times from 370,000 to 1,446,000, c1 at 5, 1 run (c2) 4 times from 3 to 12, "
                    "c3 at 370000, 440000, 1446000")


def test_provenance_lists_the_machines_each_run_started_or_resumed_on_once_any_is_recorded():
    """Runs that moved between machines (the C-CHAIN runs: an AVX-512 EPYC, two Intel Xeons, an AVX2 EPYC): each
    machine with its runs and the steps they started at there; starts from before machines were recorded are "not
    recorded"; and a report of runs none of which recorded one is what it was before machines were recorded."""
    a = {"cpu": "AMD EPYC", "isa": ["avx2", "avx512f"], "cores": 2}
    b = {"cpu": "AMD EPYC", "isa": ["avx2"], "cores": 2}
    starts = {
        "r1": [{"global_step": 0, "resumed": False}, {"global_step": 1000, "resumed": True, "machine": a},
               {"global_step": 3000, "resumed": True, "machine": b}],
        "r2": [{"global_step": 0, "resumed": False, "machine": a}, {"global_step": 2000, "resumed": True, "machine": a}],
    }
    prov = M.provenance(starts.items())
    assert prov["machines"] == {"not recorded": {"r1": [0]}, "AMD EPYC (avx2 avx512f; 2 cores)": {"r1": [1000], "r2": [0, 2000]},
                                "AMD EPYC (avx2; 2 cores)": {"r1": [3000]}}
    assert M.provenance_lines(prov)[-1] == (
        "- Machines (CPU, vector ISA; runs, and the steps they started or resumed at there): not recorded: 1 run at 0; "
        "AMD EPYC (avx2 avx512f; 2 cores): 2 runs at 0-2,000; AMD EPYC (avx2; 2 cores): 1 run at 3,000")
    old = {"r1": [{"global_step": 0, "resumed": False}, {"global_step": 5, "resumed": True}]}
    assert "machines" not in M.provenance(old.items())
    assert not any(line.startswith("- Machines") for line in M.provenance_lines(M.provenance(old.items())))


def test_bootstrap_mean_by_hand():
    # two seeds a, b: resampled means are a, (a+b)/2, b with probabilities 1/4, 1/2, 1/4: the 2.5/97.5 percentiles
    # of 2000 draws are a and b
    assert M.bootstrap_mean([2.0, 6.0]) == {"mean": 4.0, "ci95": [2.0, 6.0], "n": 2}
    # 0, 0, 9: P(mean = 0) = (2/3)^3 = 0.30 > 0.025; P(mean = 9) = 1/27 = 0.037 > 0.025
    assert M.bootstrap_mean([0.0, 0.0, 9.0]) == {"mean": 3.0, "ci95": [0.0, 9.0], "n": 3}
    # 0, 0, 0, 8: P(mean = 8) = 1/256 < 0.025, P(mean >= 6) = P(three or four 8s) = 13/256 > 0.025 -> hi = 6
    assert M.bootstrap_mean([0.0, 0.0, 0.0, 8.0])["ci95"] == [0.0, 6.0]
    assert M.bootstrap_mean([5.0, float("nan")]) == {"mean": 5.0, "ci95": [5.0, 5.0], "n": 1}
    assert M.bootstrap_mean([]) == {"mean": None, "ci95": None, "n": 0}


def test_bootstrap_mean_against_the_exact_bootstrap_distribution():
    # three seeds 1, 2, 3: a resample is all 1s with probability 1/27 = 3.7% > 2.5%, all 3s likewise, so the 95%
    # percentile interval of the resampled mean is exactly [1, 3]
    assert M.bootstrap_mean([1.0, 2.0, 3.0]) == {"mean": 2.0, "ci95": [1.0, 3.0], "n": 3}
    # the exact bootstrap distribution of the mean of 4 values (4^4 equally likely resamples), its percentiles
    # (numpy's linear interpolation) vs the Monte Carlo interval with many reps
    xs = [0.0, 1.0, 4.0, 10.0]
    exact = np.array([np.mean(c) for c in itertools.product(xs, repeat=4)])
    lo, hi = np.percentile(exact, [2.5, 97.5])
    d = M.bootstrap_mean(xs, reps=40000, seed=1)
    assert (d["mean"], d["n"]) == (3.75, 4)
    assert abs(d["ci95"][0] - lo) <= 0.25 and abs(d["ci95"][1] - hi) <= 0.25
    assert M.bootstrap_mean([5.0, float("nan"), None]) == {"mean": 5.0, "ci95": [5.0, 5.0], "n": 1}
    assert M.bootstrap_mean([float("nan")]) == {"mean": None, "ci95": None, "n": 0}
