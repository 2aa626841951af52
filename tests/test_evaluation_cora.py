"""CORA's forgetting and zero-shot transfer (continual/evaluation/cora.py) against two oracles: CORA's own code
(tests/helpers/cora_reference.py, copied from AGI-Labs/continual_rl f2754bb) and an independent re-implementation written
below from CORA's definition (pandas rolling means, plain loops over the visits, scipy's SEM); by hand on small
curves; and against the library's own variant, which it is not."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from continual.evaluation import cora
from continual.evaluation import metrics as M
from helpers.cora_reference import run_cora

# CORA's code takes the SEM of one run (scipy: NaN and a warning); the module gives None
pytestmark = pytest.mark.filterwarnings("ignore:One or more sample arguments is too small")

T = 100  # steps per visit
STEPS = list(range(0, 401, 25))  # an evaluation every 25 steps, at every switch too
# two tasks, two cycles: A (0,100], B (100,200], A (200,300], B (300,400]
AB2 = [("A", 0, 100), ("B", 100, 200), ("A", 200, 300), ("B", 300, 400)]
CURVES = {  # one value per step of STEPS
    "A": [0, 4, 6, 8, 10, 7, 5, 3, 2, 6, 8, 9, 9, 6, 4, 3, 2],
    "B": [1, 1, 2, 3, 1, 3, 5, 7, 9, 6, 5, 4, 4, 7, 8, 9, 10],
}


def make_run(curves, steps=STEPS, visits=AB2, name="run", config=None) -> M.RunData:
    """A run whose curves give one value per step (None = no evaluation there)."""
    evals = {t: [(s, float(y)) for s, y in zip(steps, ys) if y is not None] for t, ys in curves.items()}
    return M.RunData(run_dir=name, config=config or {"architecture": "PPO"}, evals=evals,
                     visits=M.number_visits([M.Visit(*v) for v in visits]), end_step=visits[-1][2])


def oracle_input(runs: list[M.RunData]) -> dict:
    return {r.run_dir: {t: list(c) for t, c in r.evals.items()} for r in runs}


# ---------------------------------------------------------------------------------------------------------------------
# the independent re-implementation (from CORA's definition, not its code)
# ---------------------------------------------------------------------------------------------------------------------


def independent(runs: list[M.RunData], window: int, cycles: int = 1, isolated: bool = True) -> dict:
    """{"forgetting"/"transfer": {"entries": {(run, task, impactor, cycle): value}, "per_run": [...], "mean", "sem"}}
    on scaled values (metric_scale 1)."""
    visits = [(v.regime, v.start, v.end) for v in runs[0].visits]
    tasks = list(dict.fromkeys(t for t, _, _ in visits))
    n = len(tasks)
    smooth = [{t: (np.array([s for s, _ in r.evals[t]], dtype=np.float64),
                   pd.Series([y for _, y in r.evals[t]], dtype="float64").rolling(window, min_periods=1).mean()
                   .to_numpy()) for t in tasks if r.evals.get(t)} for r in runs]
    scale = {t: max(float(np.max(np.abs(d[t][1]))) for d in smooth if t in d) for t in tasks}

    def last(xs, ys, lo, hi):
        val = None
        for x, y in zip(xs, ys):
            if (lo is None or x > lo) and x < hi:
                val = y
        return val

    out = {"forgetting": {}, "transfer": {}}
    for r, (run, d) in enumerate(zip(runs, smooth)):
        for i, t in enumerate(tasks):
            if t not in d:
                continue
            xs, ys = d[t][0], d[t][1] / scale[t]
            first_end = run.visits[i].end
            for k, v in enumerate(run.visits):
                c, j = divmod(k, n)
                if c >= cycles or (c == 0 and j <= i):
                    continue
                if isolated:
                    before = last(xs, ys, None, v.start)
                else:
                    prior = [y for x, y in zip(xs, ys) if x < first_end]
                    before = max(prior) if prior else None
                after = last(xs, ys, v.start, v.end)
                if before is not None and after is not None:
                    out["forgetting"][(r, t, tasks[j], c)] = before - after
            for p in range(i):
                v = run.visits[p]
                after = last(xs, ys, v.start, v.end)
                base = ys[0] if (p == 0 or not isolated) else last(xs, ys, 0, v.start)
                if after is not None and base is not None:
                    out["transfer"][(r, t, tasks[p], 0)] = after - base
    for kind, entries in out.items():
        per_run = []
        for r in range(len(runs)):
            vals = [v for key, v in entries.items() if key[0] == r]
            per_run.append(sum(vals) / len(vals) if vals else None)
        have = [x for x in per_run if x is not None]
        out[kind] = {"entries": entries, "per_run": per_run, "mean": sum(have) / len(have) if have else None,
                     "sem": float(stats.sem(have)) if len(have) > 1 else None, "scale": scale}
    return out


def entries_of(result: dict) -> dict:
    return {(e["run"], e["task"], e["impactor"], e.get("cycle", 0)): e["value"] for e in result["entries"]}


def assert_matches_independent(runs, window, cycles=1, isolated=True):
    ind = independent(runs, window, cycles, isolated)
    f = cora.cora_forgetting(runs, window, cycles, isolated=isolated)
    t = cora.cora_transfer(runs, window, isolated=isolated)
    for ours, theirs in ((f, ind["forgetting"]), (t, ind["transfer"])):
        mine = entries_of(ours)
        assert mine.keys() == theirs["entries"].keys()
        for k in mine:
            assert mine[k] == pytest.approx(theirs["entries"][k], rel=1e-12, abs=1e-12)
        assert ours["overall"]["per_run"] == pytest.approx(theirs["per_run"], rel=1e-12, abs=1e-12)
        assert ours["overall"]["mean"] == pytest.approx(theirs["mean"], rel=1e-12, abs=1e-12)
        if theirs["sem"] is None:
            assert ours["overall"]["sem"] is None
        else:
            assert ours["overall"]["sem"] == pytest.approx(theirs["sem"], rel=1e-10, abs=1e-12)
        assert ours["scales"] == pytest.approx(theirs["scale"], rel=1e-12)
    return f, t


def assert_matches_cora_code(runs, window, cycles=1, isolated=True, metric_scale=10.0, clip=None):
    """Entry by entry and every statistic of CORA's tables (cells, rows, columns, corner, SEMs)."""
    raw, tables = run_cora({"m": oracle_input(runs)}, T, window, cycles, metric_scale, clip, isolated, isolated)
    f = cora.cora_forgetting(runs, window, cycles, metric_scale, clip, isolated=isolated)
    t = cora.cora_transfer(runs, window, metric_scale, clip, isolated=isolated)
    tasks = f["tasks"]
    n = len(tasks)
    mine_f, mine_t = entries_of(f), entries_of(t)
    for i, task in enumerate(tasks):
        per = raw["m"][f"eval_reward/{task}"]
        for j, by_cycle in per["forgetting"].items():
            for c, values in by_cycle.items():
                for r, v in enumerate(values):
                    assert mine_f[(r, task, tasks[j], c)] == pytest.approx(v * metric_scale, rel=1e-12, abs=1e-12)
        for p, values in per["transfer"].items():
            for r, v in enumerate(values):
                assert mine_t[(r, task, tasks[p], 0)] == pytest.approx(v * metric_scale, rel=1e-12, abs=1e-12)
    n_f = sum(len(v) for per in raw["m"].values() for by_c in per["forgetting"].values() for v in by_c.values())
    n_t = sum(len(v) for per in raw["m"].values() for v in per["transfer"].values())
    assert (len(mine_f), len(mine_t)) == (n_f, n_t)
    tab = tables["m"]

    def same(x, table_value):
        if np.isnan(table_value):
            assert x is None
        else:
            assert x == pytest.approx(table_value, rel=1e-10, abs=1e-12)

    for kind, res, cols in (("forgetting", f, n * cycles), ("transfer", t, n)):
        table, err = tab[kind], tab[f"{kind}_error"]
        for cell in res["cells"]:
            col = cell["cycle"] * n + tasks.index(cell["impactor"])
            same(cell["mean"], table[tasks.index(cell["task"])][col])
            same(cell["sem"], err[tasks.index(cell["task"])][col])
        assert np.isnan(np.array(table[:n, :cols], dtype=float)).sum() == n * cols - len(res["cells"])
        for i, task in enumerate(tasks):
            row = res["by_task"].get(task, {"mean": None, "sem": None})
            same(row["mean"], table[i][-1])
            same(row["sem"], err[i][-1])
            col = res["by_impactor"].get(task, {"mean": None, "sem": None})
            same(col["mean"], table[-1][i])  # CORA: impactor j (every cycle pooled) in column j
            same(col["sem"], err[-1][i])
        same(res["overall"]["mean"], table[-1][-1])
        same(res["overall"]["sem"], err[-1][-1])
    return f, t


# ---------------------------------------------------------------------------------------------------------------------
# by hand
# ---------------------------------------------------------------------------------------------------------------------


def test_smoothing_is_a_trailing_mean_over_the_points_available():
    ys = [3.0, 1.0, 2.0, 8.0, 4.0]
    assert cora.cora_smooth(ys, 1).tolist() == ys
    assert cora.cora_smooth(ys, 2) == pytest.approx([3, 2, 1.5, 5, 6])
    assert cora.cora_smooth(ys, 3) == pytest.approx([3, 2, 2, 11 / 3, 14 / 3])
    # a window longer than the curve: the running mean of everything so far
    assert cora.cora_smooth(ys, 50) == pytest.approx(np.cumsum(ys) / np.arange(1, 6))
    assert cora.cora_smooth(ys, 50) == pytest.approx(pd.Series(ys).rolling(50, min_periods=1).mean().to_numpy())
    assert cora.cora_smooth([-20, 5, 30], 1, clip_y_range=(-10, None)).tolist() == [-10, 5, 30]
    with pytest.raises(ValueError):
        cora.cora_smooth(ys, 0)


def test_regions_are_strict_on_both_sides():
    xs = np.array([0, 100, 150, 200, 250])
    ys = np.arange(5.0)
    assert cora.cora_region(xs, ys, 100, 200).tolist() == [2.0]  # neither 100 nor 200
    assert cora.cora_region(xs, ys, None, 100).tolist() == [0.0]
    assert cora.cora_region(xs, ys, 0, None).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_two_tasks_two_cycles_by_hand_and_not_the_librarys_variant():
    """The headline case of the audit: SpaceInvaders -> Breakout -> SpaceInvaders -> Breakout as A B A B."""
    run = make_run(CURVES)
    f = cora.cora_forgetting([run], rolling_mean_count=1)
    # scale 10 for both; A before B's region: last point < 100 is step 75 (8), not the switch point 100 (10);
    # inside (100, 200): the last is step 175 (3), not 200 (2). B never has a first-cycle impactor after it.
    assert f["scales"] == {"A": 10.0, "B": 10.0}
    assert entries_of(f) == {(0, "A", "B", 0): pytest.approx(0.8 - 0.3)}
    assert f["by_task"]["A"]["mean"] == pytest.approx(0.5) and "B" not in f["by_task"]
    assert f["overall"]["mean"] == pytest.approx(0.5) and f["overall"]["sem"] is None  # one run
    # the window of 2: A smoothed = [0, 2, 5, 7, 9, 8.5, 6, 4, 2.5, 4, 7, 8.5, 9, 7.5, 5, 3.5, 2.5], scale 9
    f2 = cora.cora_forgetting([run], rolling_mean_count=2)
    assert f2["scales"]["A"] == 9.0
    assert f2["overall"]["mean"] == pytest.approx((7 - 4) / 9)
    # two cycles: A over A's own revisit (relearning, negative) and over B's second visit; B over both
    f_2c = cora.cora_forgetting([run], rolling_mean_count=1, num_cycles_for_forgetting=2)
    assert entries_of(f_2c) == pytest.approx({
        (0, "A", "B", 0): 0.8 - 0.3, (0, "A", "A", 1): 0.3 - 0.9, (0, "A", "B", 1): 0.9 - 0.3,
        (0, "B", "A", 1): 0.7 - 0.4, (0, "B", "B", 1): 0.4 - 0.9})
    assert f_2c["overall"]["mean"] == pytest.approx((0.5 - 0.6 + 0.6 + 0.3 - 0.5) / 5)
    # zero-shot transfer to B over A's first visit: last point in (0, 100) (step 75: 3) - the first point (1)
    t = cora.cora_transfer([run], rolling_mean_count=1)
    assert entries_of(t) == {(0, "B", "A", 0): pytest.approx(0.3 - 0.1)}
    # CORA's table scale
    assert cora.cora_forgetting([run], 1, metric_scale=10)["overall"]["mean"] == pytest.approx(5.0)

    # the library's own variants differ: every later visit of every cycle, points at the switches, no smoothing
    ours = M.run_metrics(run, M.Normalizer("max_abs", runs=[run]))
    assert ours["regimes"]["A"]["forgetting_all_visits"] == pytest.approx(((10 - 2) + (9 - 2)) / 2 / 10)
    assert ours["regimes"]["B"]["forgetting_all_visits"] == pytest.approx((9 - 4) / 10)
    assert ours["summary"]["forgetting_all_visits"] == pytest.approx(0.625)
    assert ours["summary"]["forgetting_all_visits"] != pytest.approx(f["overall"]["mean"])
    assert ours["regimes"]["B"]["transfer_zero_shot"] == pytest.approx((1 - 1) / 10)  # y_B(100) - y_B(0)
    assert ours["regimes"]["B"]["transfer_zero_shot"] != pytest.approx(t["overall"]["mean"])
    assert_matches_cora_code([run], 1)
    assert_matches_cora_code([run], 2, cycles=2)


def test_three_tasks_transfer_baseline_is_the_last_point_before_the_earlier_task():
    steps = list(range(0, 301, 25))
    visits = [("A", 0, 100), ("B", 100, 200), ("C", 200, 300)]
    c = [2, 2, 3, 4, 9, 5, 6, 7, 9, 9, 9, 9, 9]
    run = make_run({"A": [1] * 13, "B": list(range(13)), "C": c}, steps, visits)
    t = cora.cora_transfer([run], rolling_mean_count=1)
    e = entries_of(t)
    # C over A: last in (0, 100) (step 75: 4) - the first point (2); over B: last in (100, 200) (175: 7) - last in
    # (0, 100) (75: 4); the switch points (9) are in no region
    assert e[(0, "C", "A", 0)] == pytest.approx((4 - 2) / 9)
    assert e[(0, "C", "B", 0)] == pytest.approx((7 - 4) / 9)
    assert e[(0, "B", "A", 0)] == pytest.approx((3 - 0) / 12)
    assert t["by_task"]["C"]["mean"] == pytest.approx(((4 - 2) / 9 + (7 - 4) / 9) / 2)
    assert t["by_impactor"]["A"]["mean"] == pytest.approx(((4 - 2) / 9 + 3 / 12) / 2)
    # non-isolated (CORA's flag off): the baseline is always the first point
    assert entries_of(cora.cora_transfer([run], 1, isolated=False))[(0, "C", "B", 0)] == pytest.approx((7 - 2) / 9)
    f = cora.cora_forgetting([run], 1)
    assert set(entries_of(f)) == {(0, "A", "B", 0), (0, "A", "C", 0), (0, "B", "C", 0)}  # upper triangle only
    # non-isolated forgetting: the best point before the end of the task's own first visit
    fn = entries_of(cora.cora_forgetting([run], 1, isolated=False))
    assert fn[(0, "B", "C", 0)] == pytest.approx((7 - 11) / 12)  # max over steps < 200 (7) - last in (200, 300)
    for isolated in (True, False):
        assert_matches_cora_code([run], 1, isolated=isolated)
        assert_matches_independent([run], 1, isolated=isolated)


# ---------------------------------------------------------------------------------------------------------------------
# edge cases
# ---------------------------------------------------------------------------------------------------------------------


def test_points_exactly_at_the_switches_change_nothing_but_the_smoothing_and_scale():
    """With no smoothing, values at the switch steps never enter an entry; the library's variant uses them."""
    at_switch = [s % T == 0 and s > 0 for s in STEPS]
    spiked = {t: [7.5 if sw else y for y, sw in zip(ys, at_switch)] for t, ys in CURVES.items()}
    dropped = {t: [None if sw else y for y, sw in zip(ys, at_switch)] for t, ys in CURVES.items()}
    a, b = make_run(spiked), make_run(dropped)
    for kind in (cora.cora_forgetting, cora.cora_transfer):
        ra, rb = kind([a], 1), kind([b], 1)
        assert ra["scales"] == rb["scales"]  # 7.5 is no maximum
        assert entries_of(ra) == pytest.approx(entries_of(rb))
    assert M.run_metrics(a)["summary"]["forgetting_all_visits"] != M.run_metrics(b)["summary"]["forgetting_all_visits"]
    assert_matches_cora_code([a], 1, cycles=2)
    assert_matches_cora_code([b], 3, cycles=2)


def test_a_region_without_evaluations_leaves_that_entry_out_where_cora_raises():
    sparse = {t: [y if not (100 < s < 200) else None for s, y in zip(STEPS, ys)] for t, ys in CURVES.items()}
    run = make_run(sparse)
    f = cora.cora_forgetting([run], 1, num_cycles_for_forgetting=2)
    assert (0, "A", "B", 0) not in entries_of(f)  # nothing inside B's first region
    assert (0, "A", "B", 1) in entries_of(f)
    with pytest.raises(IndexError):  # CORA: subsequent_task_rewards[-1] of an empty region
        run_cora({"m": oracle_input([run])}, T, 1, 2)
    assert_matches_independent([run], 1, cycles=2)
    # a run that stops in the first cycle: the second cycle's entries are missing, the first's are there
    short = make_run({t: ys[:9] for t, ys in CURVES.items()}, STEPS[:9], AB2[:2])
    assert set(entries_of(cora.cora_forgetting([short], 1, 2))) == {(0, "A", "B", 0)}
    # a run without a task's curve (run 0 has no B): only that task is missing; run 1 (the sparse one) has no entry
    partial = make_run({"A": CURVES["A"]})
    both = cora.cora_forgetting([partial, run], 1)
    assert set(entries_of(both)) == {(0, "A", "B", 0)}
    assert both["overall"]["per_run"] == [pytest.approx(0.5), None] and both["overall"]["n"] == 1


def test_window_longer_than_the_curve():
    run = make_run(CURVES)
    for window in (16, 17, 50):
        assert_matches_independent([run], window, cycles=2)
        assert_matches_cora_code([run], window, cycles=2)
    assert cora.cora_forgetting([run], 50)["scales"]["A"] == pytest.approx(max(
        np.cumsum(CURVES["A"]) / np.arange(1, 18)))


def test_schedule_that_is_not_one_order_repeated_is_refused():
    with pytest.raises(ValueError, match="repeated in one order"):
        cora.cora_forgetting([make_run(CURVES, visits=[("A", 0, 100), ("B", 100, 200), ("B", 200, 250),
                                                        ("A", 250, 400)])])
    with pytest.raises(ValueError, match="same tasks in the same order"):
        cora.cora_forgetting([make_run(CURVES), make_run(CURVES, visits=[("B", 0, 100), ("A", 100, 200),
                                                                          ("B", 200, 300), ("A", 300, 400)])])
    with pytest.raises(ValueError):
        cora.cora_forgetting([])
    with pytest.raises(ValueError):
        cora.cora_forgetting([make_run(CURVES)], num_cycles_for_forgetting=0)


def test_a_task_never_above_zero_keeps_scale_one():
    run = make_run({"A": [0] * 17, "B": CURVES["B"]})
    f = cora.cora_forgetting([run], 1)
    assert f["scales"]["A"] == 0.0 and entries_of(f) == {(0, "A", "B", 0): 0.0}


def test_eval_regimes_measure_a_task_by_another_curve():
    """CORA's eval_i: the metrics of task i read the curve of its evaluation variant."""
    run = make_run({**CURVES, "A-eval": [y * 2 for y in CURVES["A"]]})
    f = cora.cora_forgetting([run], 1, eval_regimes={"A": "A-eval"})
    assert f["scales"]["A"] == 20.0 and f["overall"]["mean"] == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------------------------------
# per-method scale and aggregation
# ---------------------------------------------------------------------------------------------------------------------


def test_adding_a_method_changes_no_other_methods_numbers():
    rng = np.random.default_rng(3)
    x = [make_run({t: rng.uniform(0, 10, 17).tolist() for t in "AB"}, name=f"x{i}", config={"architecture": "X"})
         for i in range(3)]
    y = [make_run({t: rng.uniform(0, 100, 17).tolist() for t in "AB"}, name=f"y{i}", config={"architecture": "Y"})
         for i in range(3)]
    alone = M.cora_by_method(x, rolling_mean_count=4)["X"]
    both = M.cora_by_method(x + y, rolling_mean_count=4)
    assert both["X"] == alone
    assert alone["forgetting"]["scales"]["A"] == pytest.approx(
        max(np.abs(cora.cora_smooth([v for _, v in r.evals["A"]], 4)).max() for r in x))
    # CORA's code on both models at once gives each its own numbers
    _, tables = run_cora({"X": oracle_input(x), "Y": oracle_input(y)}, T, 4, 1, metric_scale=1.0)
    assert tables["X"]["forgetting"][-1][-1] == pytest.approx(alone["forgetting"]["overall"]["mean"], rel=1e-12)
    assert tables["Y"]["forgetting"][-1][-1] == pytest.approx(both["Y"]["forgetting"]["overall"]["mean"], rel=1e-12)
    # while a scale over every run given (the library's max_abs) moves X's numbers when Y is added
    ours_alone = M.run_metrics(x[0], M.Normalizer("max_abs", runs=x))["summary"]["forgetting_all_visits"]
    ours_both = M.run_metrics(x[0], M.Normalizer("max_abs", runs=x + y))["summary"]["forgetting_all_visits"]
    assert ours_alone != pytest.approx(ours_both)


def test_aggregation_averages_each_run_first_then_mean_and_sem_over_runs():
    rng = np.random.default_rng(5)
    visits = [("A", 0, 100), ("B", 100, 200), ("C", 200, 300)]
    steps = list(range(0, 301, 20))
    runs = [make_run({t: rng.normal(5, 2, len(steps)).tolist() for t in "ABC"}, steps, visits, f"r{i}")
            for i in range(4)]
    f = cora.cora_forgetting(runs, 2)
    e = entries_of(f)
    per_run = [np.mean([e[(r, "A", "B", 0)], e[(r, "A", "C", 0)], e[(r, "B", "C", 0)]]) for r in range(4)]
    assert f["overall"]["per_run"] == pytest.approx(per_run)  # A's two entries and B's one weigh alike
    assert f["overall"]["mean"] == pytest.approx(np.mean(per_run))
    assert f["overall"]["sem"] == pytest.approx(stats.sem(per_run))
    a_rows = [np.mean([e[(r, "A", "B", 0)], e[(r, "A", "C", 0)]]) for r in range(4)]
    assert f["by_task"]["A"]["per_run"] == pytest.approx(a_rows)
    assert f["by_task"]["A"]["sem"] == pytest.approx(stats.sem(a_rows))
    cell = next(c for c in f["cells"] if (c["task"], c["impactor"]) == ("A", "C"))
    assert cell["mean"] == pytest.approx(np.mean([e[(r, "A", "C", 0)] for r in range(4)]))
    assert cell["n"] == 4
    assert_matches_cora_code(runs, 2)
    assert_matches_independent(runs, 2)


@pytest.mark.parametrize("window,cycles,isolated", list(itertools.product((1, 3, 20), (1, 2), (True, False))))
def test_random_curves_against_coras_code_and_the_independent_one(window, cycles, isolated):
    """Three tasks, two cycles, 5 runs; evaluations on a random subset of a 10-step grid (switch steps included
    at random), every region keeping at least one point (CORA raises otherwise)."""
    rng = np.random.default_rng(window * 10 + cycles + 100 * isolated)
    visits = [(t, k * T, (k + 1) * T) for k, t in enumerate("ABCABC")]
    runs = []
    for r in range(5):
        keep = [s for s in range(0, 601, 10) if s % T == 50 or s == 0 or rng.random() < 0.5]
        runs.append(make_run({t: rng.normal(3, 4, len(keep)).tolist() for t in "ABC"}, keep, visits, f"r{r}"))
    assert_matches_cora_code(runs, window, cycles, isolated)
    assert_matches_independent(runs, window, cycles, isolated)


def test_clip_as_coras_chores_settings():
    rng = np.random.default_rng(9)
    runs = [make_run({t: rng.normal(0, 15, 17).tolist() for t in "AB"}, name=f"r{i}") for i in range(3)]
    assert_matches_cora_code(runs, 5, 2, clip=(-10, 12))
    assert cora.CORA_SETTINGS["chore_vary_env"]["clip_y_range"] == (-10, 12)


def test_metrics_cli_reports_cora_per_method(tmp_path, capsys):
    run = make_run(CURVES)
    res = M.cora_by_method([run], rolling_mean_count=1, metric_scale=10)
    M.print_cora_table(res)
    printed = capsys.readouterr().out
    assert "CORA's metrics, PPO" in printed and "5 (1)" in printed  # 10 x 0.5, one run
