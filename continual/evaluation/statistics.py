"""Statistics for reports over few runs (5-20 seeds): run-level intervals, pairwise tests, probability of improvement.

Data. One method's scores are a runs x tasks matrix (a 1-D array is one task): row r holds run r's per-task score
(a per-regime metric: final score, forgetting, ...). The run is the unit of every statistic here, because a run's
tasks share its seed, network and history (in the forgetting experiment both games of a CLEAR seed correlate +0.94):

- A run's score is the mean of its row over the tasks it has (`run_scores`). NaN marks a missing cell: it is left out
  of its run's mean, and a run with no finite cell is dropped; `n` counts the runs used. With missing cells the runs'
  means are over different tasks, which a caller should avoid where it can.
- Every bootstrap resamples whole rows (runs) with replacement and recomputes the statistic on the resampled matrix;
  tasks are never resampled independently (rliable's stratified bootstrap, `metrics.stratified_bootstrap`, does:
  with positively correlated tasks its intervals are too narrow).

Intervals (`interval`; `Interval` is the result: estimate, low, high, method, n). The default at 95%:

- the mean: Student-t on the run scores, mean +- t_{0.975, n-1} sd / sqrt(n) (`t_interval`);
- any other statistic (IQM or median over all cells, a callable of the runs x tasks matrix): the run-level
  percentile bootstrap (`bootstrap_interval`: `scipy.stats.bootstrap` over run indices, `RESAMPLES` resamples);
  `method="BCa"` gives BCa.

Why (da56a98:bench/statistics_coverage.py -> bench/results/statistics_coverage.json: coverage of the true value by the 95%
interval in 2,000 simulated samples per cell, Monte Carlo standard error 0.005; tables in docs/evaluation.md):

- mean, n = 5 / 10: t covers 0.94 / 0.96 of normal samples, 0.95 / 0.95 with mild skew (lognormal sigma 0.25,
  beta(2, 5): 0.94 / 0.95), 0.93 / 0.94 for a 50/50 mix of runs that learn and runs that do not, 0.92 / 0.91-0.93
  with skewness 1.4-1.8 (gamma 2, lognormal 0.5) and 0.83 / 0.84 for lognormal sigma 1. The percentile and BCa
  bootstraps cover 0.83 / 0.91 of normal samples and 0.80-0.85 / 0.86-0.91 of skewed ones: they use the plug-in sd
  (divisor n) and normal quantiles where t_{0.975, 4} = 2.78. The studentized bootstrap (`method="studentized"`)
  does better with strong skew (0.90 / 0.90 for lognormal 1, 0.925-0.95 for skewness 1.4-1.8) at 1.1-1.7x the t
  interval's width (2.7x on the 50/50 mix at n = 5) and erratic endpoints at n = 5; available, not the default.
  No interval computed from 5 values covers a mix with a rare mode: with P(learn) = 0.8 all 5 runs learn in 33% of
  samples (t 0.77, percentile 0.67, studentized 0.82).
- two tasks per run correlated +0.94, mean over the matrix, n = 5 / 10: run-level t 0.95 / 0.96, run-level
  percentile 0.83 / 0.91, rliable's per-task (stratified) percentile bootstrap 0.72 / 0.80.
- IQM and median, n = 5 / 10: the percentile bootstrap covers at least as often as BCa in every setting measured
  (IQM: 0.90-0.95 / 0.92-0.94 against BCa's 0.89-0.94 / 0.89-0.93; median 0.94-0.95 / 0.93-0.95 both).
- probability of improvement (normal, shift 0-1 sd), n = 5 / 10 per group: BCa 0.92-0.97 / 0.97, percentile
  0.90-0.91 / 0.93-0.94, so BCa is its default. When every run of X beats every run of Y (36% of 5-vs-5 samples at a
  2-sd shift) every resample gives 1 and there is no interval; the exact p-value carries the claim.
- difference of means (lognormal against normal), n = 5 / 10: Welch t 0.95 / 0.96, BCa 0.87 / 0.92.

Degenerate data gives an `Interval` with low = high = NaN and a `reason` (fewer than 2 runs, every run equal, every
bootstrap resample equal), never an exception.

Pairwise comparisons (`compare`: X against Y, higher is better unless `lower_is_better`):

- probability of improvement, rliable's definition P(X > Y) + P(X = Y) / 2 over all pairs of one run of X and one of
  Y, here on the runs' scores (their mean over tasks; rliable computes it per task and averages over tasks:
  `per_task=True`), with a run-level bootstrap interval (both methods' runs resampled, whole runs);
- the one-sided (default, H1: X improves on Y) or two-sided Mann-Whitney test on the same run scores (its U / (n_x
  n_y) is exactly that probability): scipy's exact null distribution without ties, with ties a permutation test of U
  (every one of the C(n_x + n_y, n_x) splits enumerated up to `EXACT_LIMIT`, C(20, 10) = 184,756; else Monte Carlo);
- the difference of the mean run scores, mean(X) - mean(Y) on the original scale, with its Welch t interval and a
  run-level bootstrap interval, and a permutation test of it (exact enumeration up to `EXACT_LIMIT`).

A two-sided p-value is twice the smaller one-sided one (capped at 1), as scipy computes both tests.
`metrics.py`'s stratified bootstrap and probability of improvement are rliable's per-task readings and stay there
for the existing reports; this module is the home of the report statistics.

Planning (`welch_power`): the probability that the Welch interval of a difference lies above 0 at given spreads and
numbers of runs, by simulation; for choosing the seeds before an experiment runs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import warnings
from typing import Any, Callable, Optional, Union

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 10_000  # bootstrap resamples (BCa's acceleration and bias terms want more than a percentile interval)
EXACT_LIMIT = 200_000  # enumerate every permutation up to this many splits; C(20, 10) = 184,756
STATISTICS = ("mean", "iqm", "median")
INTERVAL_METHODS = ("auto", "t", "BCa", "percentile", "studentized")

Statistic = Union[str, Callable[[np.ndarray], float]]


# ---------------------------------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval. low = high = NaN with a `reason` where none can be computed.
    n: the runs used (one method), or (n_x, n_y) for a comparison of two."""

    estimate: float
    low: float
    high: float
    method: str
    n: Union[int, tuple[int, int]]
    confidence: float = CONFIDENCE
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def n_text(self) -> str:
        return f"{self.n[0]} vs {self.n[1]}" if isinstance(self.n, tuple) else str(self.n)

    def format(self, digits: int = 3, signed: bool = False) -> str:
        """'0.123 [0.077, 0.161] (t, n=10)'; without an interval '0.123 [no interval: <reason>] (t, n=1)'."""
        f = f"{{:{'+' if signed else ''}.{digits}f}}".format
        est = "nan" if not math.isfinite(self.estimate) else f(self.estimate)
        ci = f"[{f(self.low)}, {f(self.high)}]" if self.ok else f"[no interval: {self.reason}]"
        level = "" if self.confidence == CONFIDENCE else f"{100 * self.confidence:g}%, "
        return f"{est} {ci} ({level}{self.method}, n={self.n_text()})"

    def __str__(self) -> str:
        return self.format()

    def as_dict(self) -> dict:
        """JSON-ready: NaN as None, the interval as `ci` = [low, high]."""
        return {"estimate": _num(self.estimate), "ci": [_num(self.low), _num(self.high)], "method": self.method,
                "n": list(self.n) if isinstance(self.n, tuple) else self.n, "confidence": self.confidence,
                "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class PValue:
    """A test's p-value. method: 'exact' (the statistic's exact null distribution), 'permutation, exact (K)' (all K
    splits enumerated) or 'permutation, K random' (Monte Carlo); alternative: 'greater', 'less' or 'two-sided'."""

    p: float
    statistic: float
    method: str
    alternative: str
    reason: Optional[str] = None

    def format(self) -> str:
        if not math.isfinite(self.p):
            return f"p = nan ({self.reason})"
        sided = "two-sided" if self.alternative == "two-sided" else "one-sided"
        return f"p = {self.p:.3g} ({self.method}, {sided})"

    def __str__(self) -> str:
        return self.format()

    def as_dict(self) -> dict:
        return {"p": _num(self.p), "statistic": _num(self.statistic), "method": self.method,
                "alternative": self.alternative, "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """X against Y (`compare`). `probability_of_improvement` and the tests are in the direction of improvement (with
    lower_is_better, X improves on Y when it is lower); the mean differences are mean(X) - mean(Y) as given."""

    probability_of_improvement: Interval
    mann_whitney: PValue
    mean_difference: Interval  # Welch t
    mean_difference_bootstrap: Interval
    permutation: PValue  # difference of means
    lower_is_better: bool
    per_task: bool

    def format(self, digits: int = 2) -> str:
        return (f"P(improvement) {self.probability_of_improvement.format(digits)}, Mann-Whitney "
                f"{self.mann_whitney}; mean difference {self.mean_difference.format(digits + 1, signed=True)}, "
                f"permutation {self.permutation}")

    def __str__(self) -> str:
        return self.format()

    def as_dict(self) -> dict:
        return {"probability_of_improvement": self.probability_of_improvement.as_dict(),
                "mann_whitney": self.mann_whitney.as_dict(), "mean_difference": self.mean_difference.as_dict(),
                "mean_difference_bootstrap": self.mean_difference_bootstrap.as_dict(),
                "permutation": self.permutation.as_dict(), "lower_is_better": self.lower_is_better,
                "per_task": self.per_task}


def _num(x: float) -> Optional[float]:
    return float(x) if x is not None and math.isfinite(x) else None


def _no_interval(estimate: float, method: str, n, confidence: float, reason: str) -> Interval:
    return Interval(float(estimate), math.nan, math.nan, method, n, confidence, reason)


# ---------------------------------------------------------------------------------------------------------------------
# data: runs x tasks
# ---------------------------------------------------------------------------------------------------------------------


def run_matrix(scores: Any) -> np.ndarray:
    """The runs x tasks float64 matrix of `scores` (a 1-D sequence is one task; None -> NaN), without the runs that
    have no finite cell."""
    m = np.array(scores, dtype=np.float64)
    if m.ndim == 1:
        m = m[:, None]
    if m.ndim != 2:
        raise ValueError(f"scores must be runs x tasks (2-D) or one task (1-D), got shape {m.shape}")
    m[~np.isfinite(m)] = np.nan
    return m[~np.isnan(m).all(axis=1)]


def run_scores(scores: Any) -> np.ndarray:
    """One score per run: the mean of its row over the tasks it has."""
    m = run_matrix(scores)
    if m.shape[0] == 0:
        return np.zeros(0)
    return m.mean(axis=1) if not np.isnan(m).any() else np.nanmean(m, axis=1)


def _cells(m: np.ndarray) -> np.ndarray:
    """(..., runs, tasks) -> (..., runs * tasks)."""
    return m.reshape(*m.shape[:-2], m.shape[-2] * m.shape[-1])


def iqm(scores: Any) -> float:
    """Interquartile mean of all cells of a runs x tasks matrix, rliable's aggregate_iqm (scipy's trim_mean with
    proportiontocut 0.25 over every cell); NaN cells left out."""
    return float(_iqm_cells(_cells(run_matrix(scores))))


def _iqm_cells(c: np.ndarray) -> np.ndarray:
    from scipy import stats

    if not np.isnan(c).any():
        return stats.trim_mean(c, 0.25, axis=-1)
    flat = c.reshape(-1, c.shape[-1])
    out = np.array([stats.trim_mean(row[~np.isnan(row)], 0.25) for row in flat])
    return out.reshape(c.shape[:-1])


def _batched_statistic(name: str, m: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """statistic(run indices of shape (..., k)) -> (...): `name` of the matrix made of those rows of `m`."""
    if name == "mean":
        r = run_scores(m)
        return lambda idx: r[idx].mean(axis=-1)
    if name == "iqm":
        return lambda idx: _iqm_cells(_cells(m[idx]))
    if name == "median":
        return lambda idx: np.nanmedian(_cells(m[idx]), axis=-1)
    raise ValueError(f"statistic must be one of {STATISTICS} or a callable, got {name!r}")


def statistic_value(scores: Any, statistic: Statistic = "mean") -> float:
    """The statistic of a runs x tasks matrix: 'mean' (of the run scores), 'iqm', 'median' (over all cells) or a
    callable of the matrix."""
    m = run_matrix(scores)
    if m.shape[0] == 0:
        return math.nan
    if callable(statistic):
        return float(statistic(m))
    return float(_batched_statistic(statistic, m)(np.arange(m.shape[0])))


# ---------------------------------------------------------------------------------------------------------------------
# intervals for one method
# ---------------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _t_quantile(q: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


def t_interval(scores: Any, confidence: float = CONFIDENCE) -> Interval:
    """Student-t interval of the mean of the run scores: mean +- t_{(1+c)/2, n-1} sd / sqrt(n)."""
    r = run_scores(scores)
    n = int(r.size)
    if n == 0:
        return _no_interval(math.nan, "t", 0, confidence, "no runs")
    mean = float(r.mean())
    if n < 2:
        return _no_interval(mean, "t", n, confidence, "fewer than 2 runs")
    if np.ptp(r) == 0:
        return _no_interval(float(r[0]), "t", n, confidence, "every run has the same score")
    sd = float(r.std(ddof=1))
    h = _t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - h, mean + h, "t", n, confidence)


def _run_bootstrap(data: tuple, statistic, estimate: float, method: str, n, reps: int, seed: int,
                   confidence: float, vectorized: bool = True, cells: int = 1) -> Interval:
    """scipy.stats.bootstrap over run-index arrays `data` (one per group), in batches of about 2M `cells` (the
    numbers one resample's statistic touches); NaN interval with a reason where the bootstrap distribution is
    degenerate or BCa is undefined."""
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DegenerateDataWarning, 0/0 in BCa's terms: reported as `reason` below
        res = stats.bootstrap(data, statistic, n_resamples=reps, vectorized=vectorized, method=method,
                              confidence_level=confidence, rng=np.random.default_rng(seed),
                              batch=max(100, 2_000_000 // max(1, cells)))
    dist = np.asarray(res.bootstrap_distribution, dtype=np.float64)
    if np.all(dist == dist[0]):
        return _no_interval(estimate, method, n, confidence,
                            f"every bootstrap resample gives {dist[0]:.3g}")
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return _no_interval(estimate, method, n, confidence, f"{method} undefined for these data")
    return Interval(estimate, lo, hi, method, n, confidence)


def bootstrap_interval(scores: Any, statistic: Statistic = "mean", method: str = "BCa", reps: int = RESAMPLES,
                       seed: int = 0, confidence: float = CONFIDENCE) -> Interval:
    """Run-level bootstrap interval of `statistic` of a runs x tasks matrix: whole rows resampled with replacement
    (scipy.stats.bootstrap on the run indices; BCa's jackknife leaves out one run at a time). method: 'BCa',
    'percentile', or 'studentized' (bootstrap-t, the mean only)."""
    m = run_matrix(scores)
    n = int(m.shape[0])
    estimate = statistic_value(m, statistic) if n else math.nan
    if n < 2:
        return _no_interval(estimate, method, n, confidence, "no runs" if n == 0 else "fewer than 2 runs")
    if np.ptp(run_scores(m)) == 0 and (statistic == "mean" or np.array_equal(m, np.broadcast_to(m[0], m.shape),
                                                                          equal_nan=True)):
        return _no_interval(estimate, method, n, confidence, "every run has the same score")
    if method == "studentized":
        if statistic != "mean":
            raise ValueError("the studentized bootstrap is for the mean only")
        return _studentized(run_scores(m), reps, seed, confidence)
    if method not in ("BCa", "percentile"):
        raise ValueError(f"method must be BCa, percentile or studentized, got {method!r}")
    if callable(statistic):
        def stat(idx):
            return statistic(m[idx])
        return _run_bootstrap((np.arange(n),), stat, estimate, method, n, reps, seed, confidence, vectorized=False)
    f = _batched_statistic(statistic, m)
    return _run_bootstrap((np.arange(n),), lambda idx, axis=-1: f(idx), estimate, method, n, reps, seed,
                          confidence, cells=m.size)


def _studentized(r: np.ndarray, reps: int, seed: int, confidence: float) -> Interval:
    """Bootstrap-t: the quantiles of (mean* - mean) / se* over resamples of the runs replace t's. A resample of one
    repeated run (se* = 0) counts as +-inf on its side."""
    n = r.size
    mean, se = float(r.mean()), float(r.std(ddof=1)) / math.sqrt(n)
    rng = np.random.default_rng(seed)
    t = np.empty(reps)
    for start in range(0, reps, 2000):
        x = r[rng.integers(0, n, size=(min(2000, reps - start), n))]
        d = x.mean(axis=1) - mean
        s = x.std(axis=1, ddof=1) / math.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            t[start:start + len(x)] = np.where(s > 0, d / np.where(s > 0, s, 1), np.sign(d) * np.inf)
    t = np.nan_to_num(t, nan=0.0)  # 0/0: a resample equal to the sample mean with no spread
    a = (1 - confidence) / 2
    q_lo, q_hi = np.quantile(t, [a, 1 - a])
    return Interval(mean, float(mean - q_hi * se), float(mean - q_lo * se), "studentized", n, confidence)


def interval(scores: Any, statistic: Statistic = "mean", method: str = "auto", reps: int = RESAMPLES, seed: int = 0,
             confidence: float = CONFIDENCE) -> Interval:
    """The report's interval of `statistic` over a runs x tasks matrix. method 'auto': Student-t for the mean, the
    run-level percentile bootstrap otherwise (the module docstring says why); 't', 'BCa', 'percentile',
    'studentized'."""
    if method not in INTERVAL_METHODS:
        raise ValueError(f"method must be one of {INTERVAL_METHODS}, got {method!r}")
    if method == "auto":
        method = "t" if statistic == "mean" else "percentile"
    if method == "t":
        if statistic != "mean":
            raise ValueError("the t interval is for the mean only")
        return t_interval(scores, confidence)
    return bootstrap_interval(scores, statistic, method, reps, seed, confidence)


# ---------------------------------------------------------------------------------------------------------------------
# two methods
# ---------------------------------------------------------------------------------------------------------------------


def _poi(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + P(X = Y)/2 over all pairs, along the last axes of x (..., nx) and y (..., ny)."""
    a, b = x[..., :, None], y[..., None, :]
    return ((a > b) + 0.5 * (a == b)).mean(axis=(-1, -2))


def _poi_per_task(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """rliable's reading on (..., nx, k) and (..., ny, k): per task over all run pairs (pairs with a NaN left out),
    then the mean over tasks."""
    a, b = x[..., :, None, :], y[..., None, :, :]
    valid = ~(np.isnan(a) | np.isnan(b))
    wins = ((a > b) + 0.5 * (a == b)) * valid
    with np.errstate(invalid="ignore"):
        per_task = wins.sum(axis=(-2, -3)) / valid.sum(axis=(-2, -3))
    return np.nanmean(per_task, axis=-1)


def probability_of_improvement(x: Any, y: Any, lower_is_better: bool = False, per_task: bool = False) -> float:
    """P(X > Y) + P(X = Y) / 2 over all pairs of one run of X and one of Y (rliable's definition), on the runs'
    scores (mean over tasks); per_task=True: rliable's reading, per task then averaged over tasks. lower_is_better:
    P(X < Y) + P(X = Y) / 2."""
    sign = -1.0 if lower_is_better else 1.0
    if per_task:
        mx, my = run_matrix(x), run_matrix(y)
        if mx.shape[0] == 0 or my.shape[0] == 0:
            return math.nan
        return float(_poi_per_task(sign * mx, sign * my))
    rx, ry = run_scores(x), run_scores(y)
    if rx.size == 0 or ry.size == 0:
        return math.nan
    return float(_poi(sign * rx, sign * ry))


def probability_of_improvement_interval(x: Any, y: Any, lower_is_better: bool = False, per_task: bool = False,
                                        method: str = "BCa", reps: int = RESAMPLES, seed: int = 0,
                                        confidence: float = CONFIDENCE) -> Interval:
    """The probability of improvement with a run-level bootstrap interval: the runs of X and of Y resampled
    independently, whole runs (BCa's jackknife leaves out one run of either group at a time)."""
    sign = -1.0 if lower_is_better else 1.0
    mx, my = sign * run_matrix(x), sign * run_matrix(y)
    n = (int(mx.shape[0]), int(my.shape[0]))
    estimate = probability_of_improvement(mx, my, per_task=per_task) if min(n) else math.nan
    if min(n) < 2:
        return _no_interval(estimate, method, n, confidence, "fewer than 2 runs in a group")
    if per_task:
        def stat(ix, iy, axis=-1):
            return _poi_per_task(mx[ix], my[iy])
    else:
        rx, ry = run_scores(mx), run_scores(my)

        def stat(ix, iy, axis=-1):
            return _poi(rx[ix], ry[iy])
    return _run_bootstrap((np.arange(n[0]), np.arange(n[1])), stat, estimate, method, n, reps, seed, confidence,
                          cells=mx.size * my.shape[0] if per_task else n[0] * n[1])


def _check_alternative(alternative: str) -> None:
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative must be greater, less or two-sided, got {alternative!r}")


class _TooFew(Exception):
    pass


def _permutation_count(nx: int, ny: int) -> int:
    return math.comb(nx + ny, nx)


def _permutation(x: np.ndarray, y: np.ndarray, statistic, alternative: str, exact_limit: int, reps: int,
                 seed: int) -> tuple[float, float, str]:
    """scipy.stats.permutation_test over the splits of the pooled runs: every split when there are at most
    `exact_limit` (`_exact_permutation`, the same p), else `reps` random ones."""
    from scipy import stats

    if min(x.size, y.size) < 2:
        raise _TooFew()
    total = _permutation_count(x.size, y.size)
    if total <= exact_limit:
        p, observed = _exact_permutation(x, y, statistic, alternative)
        return p, observed, f"permutation, exact ({total})"
    res = stats.permutation_test((x, y), statistic, permutation_type="independent", vectorized=True,
                                 n_resamples=reps, alternative=alternative, rng=np.random.default_rng(seed))
    return float(res.pvalue), float(res.statistic), f"permutation, {reps} random"


@functools.lru_cache(maxsize=4)
def _splits(nx: int, ny: int) -> tuple[np.ndarray, np.ndarray]:
    """Every split of range(nx + ny) into nx and ny indices, each side ascending, in the order of
    itertools.combinations: the splits scipy's exact test enumerates, in its order."""
    n, total = nx + ny, _permutation_count(nx, ny)
    ix = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), nx)), dtype=np.intp,
                     count=total * nx).reshape(total, nx)
    rest = np.ones((total, n), dtype=bool)
    rest[np.arange(total)[:, None], ix] = False
    iy = np.nonzero(rest)[1].reshape(total, ny)
    ix.flags.writeable = iy.flags.writeable = False
    return ix, iy


def _exact_permutation(x: np.ndarray, y: np.ndarray, statistic, alternative: str) -> tuple[float, float]:
    """scipy.stats.permutation_test(..., n_resamples=np.inf)'s p-value and statistic, bit for bit: its null is the
    statistic on every split (the same arrays, so the same floats), its comparison allows 100 eps of the observed
    value. scipy builds the splits in a Python generator (~3 s for C(20, 10)); here they are indexed at once."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    pooled = np.concatenate([x, y])
    ix, iy = _splits(x.size, y.size)
    observed = np.asarray(statistic(x, y, axis=-1))
    null = np.concatenate([statistic(pooled[ix[k:k + 65536]], pooled[iy[k:k + 65536]], axis=-1)
                           for k in range(0, ix.shape[0], 65536)])
    gamma = np.abs(np.finfo(observed.dtype).eps * 100 * observed) if np.issubdtype(observed.dtype, np.floating) \
        else 0
    less = np.count_nonzero(null <= observed + gamma) / null.size
    greater = np.count_nonzero(null >= observed - gamma) / null.size
    p = {"less": less, "greater": greater, "two-sided": min(less, greater) * 2}[alternative]
    return float(np.clip(p, 0.0, 1.0)), float(observed)


def mann_whitney(x: Any, y: Any, alternative: str = "greater", exact_limit: int = EXACT_LIMIT,
                 reps: int = RESAMPLES, seed: int = 0) -> PValue:
    """Mann-Whitney U test on the run scores (mean over tasks). statistic: U of X, the number of pairs with X > Y
    plus half the ties. Without ties: scipy's exact null distribution (method 'exact'); with ties: a permutation test
    of U, exact up to `exact_limit` splits. alternative (scipy's): 'greater' = X tends to be larger."""
    from scipy import stats

    _check_alternative(alternative)
    rx, ry = run_scores(x), run_scores(y)
    if rx.size == 0 or ry.size == 0:
        return PValue(math.nan, math.nan, "exact", alternative, "a group has no runs")
    pooled = np.concatenate([rx, ry])
    if np.unique(pooled).size == pooled.size:
        res = stats.mannwhitneyu(rx, ry, alternative=alternative, method="exact")
        return PValue(float(res.pvalue), float(res.statistic), "exact", alternative)

    def u(a, b, axis=-1):
        return _poi(a, b) * a.shape[-1] * b.shape[-1]
    try:
        p, stat, method = _permutation(rx, ry, u, alternative, exact_limit, reps, seed)
    except _TooFew:
        return PValue(math.nan, float(u(rx, ry)), "permutation", alternative,
                      "ties, and fewer than 2 runs in a group for the permutation test")
    return PValue(min(1.0, p), stat, method, alternative)


def permutation_test_mean(x: Any, y: Any, alternative: str = "greater", exact_limit: int = EXACT_LIMIT,
                          reps: int = RESAMPLES, seed: int = 0) -> PValue:
    """Permutation test of mean(X) - mean(Y) on the run scores: every split of the pooled runs into groups of the
    same sizes when there are at most `exact_limit` (C(10, 5) = 252, C(20, 10) = 184,756), else `reps` random ones.
    alternative: 'greater' = X's mean is larger."""
    _check_alternative(alternative)
    rx, ry = run_scores(x), run_scores(y)
    if rx.size == 0 or ry.size == 0:
        return PValue(math.nan, math.nan, "permutation", alternative, "a group has no runs")

    def diff(a, b, axis=-1):
        return a.mean(axis=-1) - b.mean(axis=-1)
    try:
        p, stat, method = _permutation(rx, ry, diff, alternative, exact_limit, reps, seed)
    except _TooFew:
        return PValue(math.nan, float(diff(rx, ry)), "permutation", alternative, "fewer than 2 runs in a group")
    return PValue(min(1.0, p), stat, method, alternative)


def _welch_half_width(vx, vy, n_x: int, n_y: int, confidence: float):
    """Welch's t interval half-width from the squared standard errors vx = s_x^2 / n_x and vy (scalars or arrays):
    t_{(1 + confidence) / 2, df} sqrt(vx + vy) with the Welch-Satterthwaite df."""
    from scipy import stats

    df = (vx + vy) ** 2 / (vx ** 2 / (n_x - 1) + vy ** 2 / (n_y - 1))
    return stats.t.ppf((1 + confidence) / 2, df) * np.sqrt(vx + vy)


def welch_interval(x: Any, y: Any, confidence: float = CONFIDENCE) -> Interval:
    """mean(X) - mean(Y) of the run scores with Welch's t interval (unequal variances, Welch-Satterthwaite df)."""
    rx, ry = run_scores(x), run_scores(y)
    n = (int(rx.size), int(ry.size))
    estimate = float(rx.mean() - ry.mean()) if min(n) else math.nan
    if min(n) < 2:
        return _no_interval(estimate, "Welch t", n, confidence, "fewer than 2 runs in a group")
    vx, vy = rx.var(ddof=1) / n[0], ry.var(ddof=1) / n[1]
    if vx + vy == 0:
        return _no_interval(estimate, "Welch t", n, confidence, "every run of each group has the same score")
    h = float(_welch_half_width(vx, vy, n[0], n[1], confidence))
    return Interval(estimate, estimate - h, estimate + h, "Welch t", n, confidence)


def mean_difference_bootstrap(x: Any, y: Any, method: str = "BCa", reps: int = RESAMPLES, seed: int = 0,
                              confidence: float = CONFIDENCE) -> Interval:
    """mean(X) - mean(Y) of the run scores with a run-level bootstrap interval (both groups' runs resampled)."""
    rx, ry = run_scores(x), run_scores(y)
    n = (int(rx.size), int(ry.size))
    estimate = float(rx.mean() - ry.mean()) if min(n) else math.nan
    if min(n) < 2:
        return _no_interval(estimate, method, n, confidence, "fewer than 2 runs in a group")

    def stat(ix, iy, axis=-1):
        return rx[ix].mean(axis=-1) - ry[iy].mean(axis=-1)
    return _run_bootstrap((np.arange(n[0]), np.arange(n[1])), stat, estimate, method, n, reps, seed, confidence,
                          cells=sum(n))


def compare(x: Any, y: Any, lower_is_better: bool = False, one_sided: bool = True, per_task: bool = False,
            reps: int = RESAMPLES, seed: int = 0, confidence: float = CONFIDENCE, exact_limit: int = EXACT_LIMIT,
            poi_method: str = "BCa") -> Comparison:
    """X against Y (runs x tasks matrices, or 1-D run scores): the probability of improvement with its run-level
    bootstrap interval, the Mann-Whitney test of it (one-sided: H1 X improves on Y), mean(X) - mean(Y) with Welch's
    and a bootstrap interval, and the permutation test of the difference of means (in the direction of
    improvement)."""
    sign = -1.0 if lower_is_better else 1.0
    alternative = "greater" if one_sided else "two-sided"
    mx, my = run_matrix(x), run_matrix(y)
    return Comparison(
        probability_of_improvement=probability_of_improvement_interval(mx, my, lower_is_better, per_task, poi_method,
                                                                       reps, seed, confidence),
        mann_whitney=mann_whitney(sign * mx, sign * my, alternative, exact_limit, reps, seed),
        mean_difference=welch_interval(mx, my, confidence),
        mean_difference_bootstrap=mean_difference_bootstrap(mx, my, "BCa", reps, seed, confidence),
        permutation=permutation_test_mean(sign * mx, sign * my, alternative, exact_limit, reps, seed),
        lower_is_better=lower_is_better, per_task=per_task)


def welch_power(delta: float, sd_x: float, sd_y: float, n_x: int, n_y: int, confidence: float = CONFIDENCE,
                sims: int = 20_000, seed: int = 0) -> float:
    """How many seeds an experiment needs: the probability that `welch_interval` of X against Y lies wholly above 0
    when X's runs score N(delta, sd_x) and Y's N(0, sd_y), n_x and n_y runs, estimated from `sims` simulated
    experiments (Monte Carlo standard error <= 0.5 / sqrt(sims)). Decide the seeds from it before any result: adding
    seeds only when a result is unclear is optional stopping."""
    if min(n_x, n_y) < 2:
        raise ValueError("welch_power needs at least 2 runs a group")
    rng = np.random.default_rng(seed)
    x = rng.normal(delta, sd_x, (sims, n_x))
    y = rng.normal(0.0, sd_y, (sims, n_y))
    vx, vy = x.var(axis=1, ddof=1) / n_x, y.var(axis=1, ddof=1) / n_y
    low = x.mean(axis=1) - y.mean(axis=1) - _welch_half_width(vx, vy, n_x, n_y, confidence)
    return float(np.mean(low > 0))
