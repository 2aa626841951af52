"""continual/evaluation/statistics.py: the default 95% interval covers the true mean at 5 and 10 runs (simulation),
every number against an independent float64 computation (t and Welch by hand, exact Mann-Whitney and permutation
p-values by enumerating every split, probability of improvement by explicit loops), and resampling keeps a run's
tasks together."""

import itertools
import math

import numpy as np
import pytest

from continual.evaluation import statistics as S

# ---------------------------------------------------------------------------------------------------------------------
# coverage by simulation
# ---------------------------------------------------------------------------------------------------------------------

SAMPLES = 4000  # Monte Carlo standard error of a coverage near 0.95: 0.0034


def _bimodal(p):
    """Runs that learn (N(0.8, 0.1)) with probability p, runs that do not (N(0.1, 0.05)) otherwise."""
    def draw(rng, size):
        learn = rng.random(size) < p
        return np.where(learn, rng.normal(0.8, 0.1, size), rng.normal(0.1, 0.05, size))
    return draw


POPULATIONS = {  # name: (draw(rng, size), true mean)
    "normal": (lambda rng, size: rng.normal(0.0, 1.0, size), 0.0),
    "lognormal sigma=0.25 (skewness 0.78)": (lambda rng, size: rng.lognormal(0.0, 0.25, size), math.exp(0.25 ** 2 / 2)),
    "learn / not learn, 50/50": (_bimodal(0.5), 0.45),
}


def _coverage(intervals, truth):
    return float(np.mean([iv.ok and iv.low <= truth <= iv.high for iv in intervals]))


def _percentile_bootstrap_coverage(xs, truth, reps=1000, seed=0):
    """Percentile bootstrap of the mean of each row of xs (vectorised; what metrics.bootstrap_mean reports)."""
    rng = np.random.default_rng(seed)
    n = xs.shape[1]
    covered = []
    for chunk in np.array_split(xs, max(1, len(xs) // 500)):  # ~40 MB at a time
        means = chunk[:, rng.integers(0, n, size=(reps, n))].mean(axis=-1)
        lo, hi = np.percentile(means, [2.5, 97.5], axis=1)
        covered.append((lo <= truth) & (truth <= hi))
    return float(np.mean(np.concatenate(covered)))


@pytest.mark.parametrize("n", [5, 10])
@pytest.mark.parametrize("population", list(POPULATIONS))
def test_default_interval_of_the_mean_covers_at_5_and_10_runs(population, n):
    """The reported 95% interval (`interval`, default: Student-t on the run scores) covers the true mean in >= 93%
    of 4,000 seeded samples. Measured here, n = 5 / 10: t 0.955 / 0.948 (normal), 0.947 / 0.936 (lognormal 0.25),
    0.931 / 0.941 (50/50 mix: all 5 runs fall in one mode in 6% of samples, and then no interval computed from their
    spread reaches the mean, so ~0.94 is this population's ceiling at n = 5); the percentile bootstrap of the same
    samples (what metrics.bootstrap_mean reports) covers 0.836 / 0.900, 0.834 / 0.887 and 0.910 / 0.915, and fails
    the bar at n = 5. BCa covers no better than the percentile bootstrap at n = 5 (0.83 on normal samples;
    bench/results/statistics_coverage.json)."""
    draw, mu = POPULATIONS[population]
    xs = draw(np.random.default_rng([n, len(population)]), (SAMPLES, n))
    ivs = [S.interval(x) for x in xs]
    assert {iv.method for iv in ivs} == {"t"}
    cov = _coverage(ivs, mu)
    pct = _percentile_bootstrap_coverage(xs, mu)
    assert cov >= 0.93, (population, n, cov, pct)
    assert cov > pct
    if n == 5:
        assert pct < 0.93, (population, pct)  # the bar this test holds the default to is one the old interval fails


@pytest.mark.parametrize("population,n", [("lognormal sigma=1", 5), ("learn / not learn, 80/20", 5)])
def test_t_interval_limits_are_those_documented(population, n):
    """Where the default interval does not reach 93% at 5 runs (docs/evaluation.md): a heavy right tail (lognormal
    sigma = 1, skewness 6.2: t 0.815 here, percentile 0.712; BCa 0.75 in bench/results/statistics_coverage.json)
    and a mix with a rare mode (P(learn) = 0.8: all 5 runs learn in 33% of samples; t 0.775, percentile 0.664). The
    t interval still covers more often than the percentile bootstrap."""
    draw, mu = {"lognormal sigma=1": (lambda rng, size: rng.lognormal(0.0, 1.0, size), math.exp(0.5)),
                "learn / not learn, 80/20": (_bimodal(0.8), 0.8 * 0.8 + 0.2 * 0.1)}[population]
    xs = draw(np.random.default_rng([n, 99]), (SAMPLES, n))
    cov = _coverage([S.interval(x) for x in xs], mu)
    pct = _percentile_bootstrap_coverage(xs, mu)
    assert 0.7 < cov < 0.9 and cov > pct + 0.03, (cov, pct)


# ---------------------------------------------------------------------------------------------------------------------
# reference computations
# ---------------------------------------------------------------------------------------------------------------------

T_975 = {4: 2.7764451051977934, 9: 2.2621571627982053}  # Student-t 0.975 quantiles (tables, 16 digits)


def _mean_sd(xs):
    m = math.fsum(xs) / len(xs)
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


@pytest.mark.parametrize("n", [5, 10])
def test_t_interval_is_the_hand_formula_on_run_means(n):
    rng = np.random.default_rng(n)
    m = rng.normal(0.3, 0.2, size=(n, 3))
    runs = [math.fsum(row) / 3 for row in m.tolist()]
    mean, sd = _mean_sd(runs)
    h = T_975[n - 1] * sd / math.sqrt(n)
    iv = S.t_interval(m)
    assert (iv.method, iv.n, iv.confidence) == ("t", n, 0.95)
    assert iv.estimate == pytest.approx(mean, abs=1e-14)
    assert iv.low == pytest.approx(mean - h, abs=1e-12) and iv.high == pytest.approx(mean + h, abs=1e-12)


def test_welch_interval_is_the_hand_formula():
    from scipy import stats

    x, y = [0.31, 0.12, 0.25, 0.4, 0.22], [0.1, 0.05, 0.2, 0.08, 0.11, 0.02, 0.3]
    (mx, sx), (my, sy) = _mean_sd(x), _mean_sd(y)
    vx, vy = sx ** 2 / len(x), sy ** 2 / len(y)
    df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    h = stats.t.ppf(0.975, df) * math.sqrt(vx + vy)
    iv = S.welch_interval(x, y)
    assert (iv.method, iv.n) == ("Welch t", (5, 7))
    assert iv.estimate == pytest.approx(mx - my, abs=1e-14)
    assert (iv.low, iv.high) == (pytest.approx(mx - my - h, abs=1e-12), pytest.approx(mx - my + h, abs=1e-12))
    ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    assert (iv.low, iv.high) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))


def _splits(x, y):
    """Every way to split the pooled values into groups of len(x) and len(y)."""
    pooled = list(x) + list(y)
    for idx in itertools.combinations(range(len(pooled)), len(x)):
        chosen = set(idx)
        yield [pooled[i] for i in idx], [pooled[i] for i in range(len(pooled)) if i not in chosen]


def _u(x, y):
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def _enumerated_p(x, y, statistic, alternative):
    obs = statistic(x, y)
    null = [statistic(a, b) for a, b in _splits(x, y)]
    tol = 1e-9 * max(1.0, abs(obs))
    greater = sum(s >= obs - tol for s in null) / len(null)
    less = sum(s <= obs + tol for s in null) / len(null)
    return {"greater": greater, "less": less, "two-sided": min(1.0, 2 * min(greater, less))}[alternative]


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_mann_whitney_exact_p_is_the_enumerated_one(alternative):
    x, y = [0.9, 0.35, 0.7, 0.61], [0.3, 0.5, 0.1, 0.65, 0.2]  # no ties: scipy's exact distribution
    r = S.mann_whitney(x, y, alternative)
    assert r.method == "exact" and r.statistic == _u(x, y) == 17
    assert r.p == pytest.approx(_enumerated_p(x, y, _u, alternative), abs=1e-12)
    xt, yt = [0.9, 0.5, 0.7, 0.5], [0.3, 0.5, 0.1, 0.7, 0.2]  # ties: a permutation test of U, every split
    rt = S.mann_whitney(xt, yt, alternative)
    assert rt.method == "permutation, exact (126)" and rt.statistic == _u(xt, yt)
    assert rt.p == pytest.approx(_enumerated_p(xt, yt, _u, alternative), abs=1e-12)


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_permutation_p_of_the_mean_difference_is_the_enumerated_one(alternative):
    x, y = [0.21, 0.35, 0.18, 0.4, 0.33], [0.1, 0.25, 0.05, 0.2, 0.12, 0.3]

    def diff(a, b):
        return math.fsum(a) / len(a) - math.fsum(b) / len(b)

    r = S.permutation_test_mean(x, y, alternative)
    assert r.method == "permutation, exact (462)"
    assert r.statistic == pytest.approx(diff(x, y), abs=1e-14)
    assert r.p == pytest.approx(_enumerated_p(x, y, diff, alternative), abs=1e-12)
    # beyond the limit: Monte Carlo, close to the exact value
    mc = S.permutation_test_mean(x, y, alternative, exact_limit=100, reps=20_000)
    assert mc.method == "permutation, 20000 random" and mc.p == pytest.approx(r.p, abs=0.02)


def test_exact_permutation_is_scipys_bit_for_bit():
    """The enumerated splits give scipy.stats.permutation_test's exact p and statistic to the bit (its null from the
    same arrays, its 100-eps tolerance), with ties and without, for both statistics and every alternative."""
    from scipy import stats

    def diff(a, b, axis=-1):
        return a.mean(axis=-1) - b.mean(axis=-1)

    def u(a, b, axis=-1):
        return S._poi(a, b) * a.shape[-1] * b.shape[-1]
    rng = np.random.default_rng(1)
    cases = [(rng.normal(size=nx), rng.normal(size=ny)) for nx, ny in rng.integers(2, 8, (8, 2))]
    cases += [(a.round(1), b.round(1)) for a, b in cases]  # ties
    cases += [(rng.integers(0, 3, nx) / 3, rng.integers(0, 3, ny) / 3) for nx, ny in rng.integers(2, 8, (8, 2))]
    cases.append((rng.normal(size=8), rng.normal(0.3, 1, size=8)))  # C(16, 8) = 12,870 splits
    for x, y in cases:
        for statistic in (diff, u):
            for alternative in ("less", "greater", "two-sided"):
                ref = stats.permutation_test((x, y), statistic, permutation_type="independent", vectorized=True,
                                             n_resamples=np.inf, alternative=alternative)
                got = S._exact_permutation(x, y, statistic, alternative)
                assert got == (float(ref.pvalue), float(ref.statistic)), (x, y, statistic, alternative)
    # the splits themselves: each once, each side ascending, in itertools' order
    ix, iy = S._splits(3, 2)
    assert [tuple(r) for r in ix] == list(itertools.combinations(range(5), 3))
    assert [sorted(set(range(5)) - set(a)) for a in ix.tolist()] == iy.tolist()


def test_probability_of_improvement_is_the_double_loop_on_run_scores():
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.2, 0.1, (5, 2)).round(1), rng.normal(0.1, 0.1, (6, 2)).round(1)  # rounding makes ties
    rx, ry = [math.fsum(r) / 2 for r in x.tolist()], [math.fsum(r) / 2 for r in y.tolist()]
    want = _u(rx, ry) / (len(rx) * len(ry))
    assert S.probability_of_improvement(x, y) == pytest.approx(want, abs=1e-14)
    assert S.probability_of_improvement(x, y, lower_is_better=True) == pytest.approx(_u(ry, rx) / 30, abs=1e-14)
    # rliable's reading: per task, then the mean over tasks
    per_task = [_u(x[:, k].tolist(), y[:, k].tolist()) / 30 for k in range(2)]
    assert S.probability_of_improvement(x, y, per_task=True) == pytest.approx(sum(per_task) / 2, abs=1e-14)
    # it is Mann-Whitney's U / (n_x n_y), the statistic the test beside it uses
    assert S.mann_whitney(x, y).statistic == pytest.approx(want * 30, abs=1e-12)


def test_bootstrap_over_run_indices_is_scipys_bootstrap_of_the_run_scores():
    """Resampling run indices and averaging the rows is the bootstrap of the run means, draw for draw."""
    from scipy import stats

    m = np.random.default_rng(4).normal(size=(7, 3))
    for method in ("BCa", "percentile"):
        iv = S.bootstrap_interval(m, "mean", method, reps=3000, seed=5)
        ref = stats.bootstrap((m.mean(axis=1),), np.mean, n_resamples=3000, method=method,
                              rng=np.random.default_rng(5))
        assert (iv.low, iv.high) == (pytest.approx(ref.confidence_interval.low, abs=1e-12),
                                     pytest.approx(ref.confidence_interval.high, abs=1e-12))


def test_iqm_and_median_are_over_all_cells():
    from scipy import stats

    m = np.random.default_rng(6).normal(size=(6, 4))
    assert S.iqm(m) == pytest.approx(stats.trim_mean(m.ravel(), 0.25), abs=1e-14)
    assert S.statistic_value(m, "median") == pytest.approx(float(np.median(m)), abs=1e-14)
    assert S.interval(m, "iqm").method == S.interval(m, "median").method == "percentile"


# ---------------------------------------------------------------------------------------------------------------------
# run-level resampling
# ---------------------------------------------------------------------------------------------------------------------


def _per_task_percentile(m, reps=4000, seed=0):
    """The stratified bootstrap (each task's runs resampled independently), for contrast."""
    rng = np.random.default_rng(seed)
    n, k = m.shape
    means = m[rng.integers(0, n, size=(reps, n, k)), np.arange(k)].mean(axis=(1, 2))
    return np.percentile(means, [2.5, 97.5])


@pytest.mark.parametrize("method", ["BCa", "percentile"])
def test_perfectly_correlated_tasks_give_the_interval_of_one_task(method):
    """Three tasks that move together (task k = run score + k) carry the information of one task: resampling whole
    runs gives exactly one task's interval (shifted by the mean offset); resampling each task's runs independently
    would make it ~sqrt(3) narrower."""
    x = np.round(np.random.default_rng(8).normal(0.5, 0.2, size=8) * 64) / 64  # dyadic: every mean below is exact
    m = np.stack([x, x + 1, x + 2], axis=1)
    one = S.bootstrap_interval(x, "mean", method, reps=4000, seed=1)
    three = S.bootstrap_interval(m, "mean", method, reps=4000, seed=1)
    assert three.n == one.n == 8
    assert (three.low - 1, three.high - 1) == (pytest.approx(one.low, abs=1e-12), pytest.approx(one.high, abs=1e-12))
    assert S.t_interval(m).high - S.t_interval(m).low == pytest.approx(S.t_interval(x).high - S.t_interval(x).low)
    lo, hi = _per_task_percentile(m)
    assert (hi - lo) < 0.75 * (one.high - one.low)  # the test would fail for per-task resampling


# CLEAR's forgetting over all later visits (`forgetting_all_visits`, the report's "isolated" forgetting) in the
# committed forgetting experiment v1 (bench/results/forgetting_minatar/report.json, 5 seeds x SpaceInvaders,
# Breakout; the two games correlate +0.94).
CLEAR_FORGETTING = [[0.24946004319654427, 0.05660377358490565], [0.3401727861771059, 0.05031446540880502],
                    [0.1598272138228941, 0.0062893081761006275], [0.034557235421166344, -0.02515723270440251],
                    [-0.08153347732181424, -0.03144654088050314]]


def test_run_level_interval_of_the_forgetting_experiment_is_the_audits():
    """The outside audit (issue 45) resampled whole runs with its own code: [-0.004, 0.156], where the report's
    per-task bootstrap printed [0.007, 0.141]; the t interval, the default, is [-0.053, 0.204]."""
    m = np.array(CLEAR_FORGETTING)
    assert S.interval(m, method="percentile").format() == "0.076 [-0.004, 0.156] (percentile, n=5)"
    assert str(S.interval(m)) == "0.076 [-0.053, 0.204] (t, n=5)"
    lo, hi = _per_task_percentile(m)
    assert hi - lo < 0.85 * 0.160


def test_probability_of_improvement_interval_resamples_whole_runs():
    rng = np.random.default_rng(9)
    x, y = rng.normal(0.6, 0.3, 6), rng.normal(0.4, 0.3, 6)
    one = S.probability_of_improvement_interval(x, y, reps=3000)
    both = S.probability_of_improvement_interval(np.stack([x, x], 1), np.stack([y, y], 1), per_task=True, reps=3000)
    assert (both.estimate, both.low, both.high) == (pytest.approx(one.estimate), pytest.approx(one.low),
                                                    pytest.approx(one.high))
    assert one.n == (6, 6) and one.method == "BCa" and 0 <= one.low < one.estimate < one.high <= 1


# ---------------------------------------------------------------------------------------------------------------------
# degenerate data, missing cells, the result types
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("statistic,method", [("mean", "auto"), ("mean", "BCa"), ("mean", "percentile"),
                                              ("mean", "studentized"), ("iqm", "auto"), ("median", "BCa")])
def test_degenerate_data_give_a_nan_interval_with_a_reason(statistic, method):
    for scores, reason in (([], "no runs"), ([0.3], "fewer than 2 runs"), ([[0.3, None]], "fewer than 2 runs"),
                           ([0.2, 0.2, 0.2], "same")):
        iv = S.interval(scores, statistic, method)
        assert not iv.ok and math.isnan(iv.low) and math.isnan(iv.high) and reason in iv.reason, (scores, iv)
        assert "no interval" in str(iv)
        assert iv.as_dict()["ci"] == [None, None]
    assert S.interval([0.2, 0.2, 0.2], statistic, method).estimate == pytest.approx(0.2)


def test_complete_separation_and_tiny_groups_do_not_crash():
    c = S.compare([1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.1, 0.2, 0.3, 0.4])
    assert c.probability_of_improvement.estimate == 1.0 and not c.probability_of_improvement.ok
    assert "every bootstrap resample gives 1" in c.probability_of_improvement.reason
    assert c.mann_whitney.p == pytest.approx(1 / 252) and c.permutation.p == pytest.approx(1 / 252)
    tiny = S.compare([1.0], [2.0, 2.0])
    assert math.isnan(tiny.permutation.p) and "fewer than 2" in tiny.permutation.reason
    assert not tiny.mean_difference.ok and not tiny.probability_of_improvement.ok


def test_missing_cells_leave_the_runs_mean_and_empty_runs_are_dropped():
    m = [[0.25, 0.75], [0.5, None], [None, None], [0.875, 0.125]]
    assert S.run_scores(m).tolist() == [0.5, 0.5, 0.5]
    iv = S.t_interval(m)
    assert iv.n == 3 and iv.reason == "every run has the same score"
    assert S.t_interval([[0.2, 0.4], [0.3, float("nan")], [0.6, 0.8]]).n == 3


def test_compare_directions():
    """lower_is_better: X improves on Y when it is lower; the tests are one-sided towards improvement, the mean
    difference stays mean(X) - mean(Y)."""
    x, y = [0.05, 0.1, 0.02, 0.08, 0.11], [0.2, 0.3, 0.15, 0.25, 0.12]  # forgetting: X forgets less
    c = S.compare(x, y, lower_is_better=True, reps=2000)
    assert c.probability_of_improvement.estimate == 1.0
    assert c.mann_whitney.p == pytest.approx(1 / 252) and c.mann_whitney.alternative == "greater"
    assert c.mean_difference.estimate < 0 and c.mean_difference.high < 0
    assert c.mean_difference_bootstrap.high < 0
    worse = S.compare(x, y, reps=2000)
    assert worse.probability_of_improvement.estimate == 0.0 and worse.mann_whitney.p == 1.0
    two = S.compare(x, y, lower_is_better=True, one_sided=False, reps=2000)
    assert two.mann_whitney.p == pytest.approx(2 / 252) and two.permutation.alternative == "two-sided"
    d = c.as_dict()
    assert d["mann_whitney"]["method"] == "exact" and d["lower_is_better"] is True
    assert "Mann-Whitney p = 0.00397 (exact, one-sided)" in str(c)


def test_interval_format():
    assert str(S.Interval(0.1234, 0.0771, 0.1612, "t", 10)) == "0.123 [0.077, 0.161] (t, n=10)"
    assert S.Interval(-0.05, -0.1, 0.01, "Welch t", (5, 7)).format(2, signed=True) == \
        "-0.05 [-0.10, +0.01] (Welch t, n=5 vs 7)"
    assert str(S.Interval(0.5, 0.1, 0.9, "BCa", 6, confidence=0.9)) == "0.500 [0.100, 0.900] (90%, BCa, n=6)"
    with pytest.raises(ValueError):
        S.interval([1.0, 2.0], "iqm", "t")
    with pytest.raises(ValueError):
        S.interval([1.0, 2.0], method="basic")


def test_welch_power_counts_the_welch_intervals_above_zero_of_its_draws():
    """welch_power is the fraction of simulated experiments whose `welch_interval` (the report's) lies above 0: the
    same draws, one experiment at a time, give the same count."""
    sims, n_x, n_y = 400, 5, 4
    rng = np.random.default_rng(3)
    x, y = rng.normal(2.0, 1.5, (sims, n_x)), rng.normal(0.0, 2.5, (sims, n_y))
    above = sum(S.welch_interval(x[i], y[i]).low > 0 for i in range(sims))
    assert S.welch_power(2.0, 1.5, 2.5, n_x, n_y, sims=sims, seed=3) == above / sims
    with pytest.raises(ValueError):
        S.welch_power(1.0, 1.0, 1.0, 1, 5)


@pytest.mark.parametrize("n,delta", [(5, 2.0), (12, 1.0)])
def test_welch_power_is_the_noncentral_t_power_of_students_test_at_equal_spreads(n, delta):
    """With equal sizes and spreads Welch's statistic is Student's and only its degrees of freedom (at most 2n - 2)
    differ, so its power is at most the exact one of Student's one-sided test at 2.5% (noncentral t) and close to it."""
    from scipy import stats

    df, nc = 2 * n - 2, delta / math.sqrt(2 / n)
    exact = float(stats.nct.sf(stats.t.ppf(0.975, df), df, nc))
    power = S.welch_power(delta, 1.0, 1.0, n, n, sims=40_000)
    assert exact - 0.03 < power < exact + 3 * math.sqrt(exact * (1 - exact) / 40_000)
