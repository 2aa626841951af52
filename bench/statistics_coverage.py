"""Coverage of continual/evaluation/statistics.py's 95% intervals at 5-20 runs, by simulation, through the module's own
functions (the numbers behind its defaults; docs/evaluation.md quotes them).

    python bench/statistics_coverage.py [--samples 2000] [--reps 2000] [--ns 5 10] [--out bench/results/statistics_coverage.json]

For each population with a known parameter, `--samples` samples of n runs are drawn (seeded) and each method's
interval computed; coverage = share of samples whose interval contains the true value (an interval that cannot be
computed, NaN with a reason, counts as a miss; its share is reported as `nan`); width = median width.

- mean: t, percentile, BCa, studentized (bootstrap-t) on one task, for normal, bounded-skewed (beta(2, 5)), skewed
  (lognormal sigma 0.25 / 0.5 / 1, gamma shape 2) and bimodal populations (runs that learn, N(0.8, 0.1), with
  probability p, runs that do not, N(0.1, 0.05)); the mean's Monte Carlo standard error at 2,000 samples is 0.005.
- correlated tasks: two tasks per run, correlation 0.94 (both games of a CLEAR seed in the forgetting experiment),
  the mean over the runs x tasks matrix: run-level t / percentile / BCa against the per-task (stratified)
  percentile bootstrap of `metrics.stratified_bootstrap` (written out here).
- IQM and median (one task, normal / lognormal 0.5): BCa and percentile against the population's value.
- probability of improvement, X ~ N(delta, 1) against Y ~ N(0, 1) (true value Phi(delta / sqrt 2)): BCa and
  percentile run-level bootstraps.
- difference of means, X ~ lognormal(0, 0.5) against Y ~ N(1, 0.5): Welch t, BCa, percentile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from continual.evaluation import statistics as S  # noqa: E402


def bimodal(p: float):
    def draw(rng, size):
        learn = rng.random(size) < p
        return np.where(learn, rng.normal(0.8, 0.1, size), rng.normal(0.1, 0.05, size))
    return draw


def population_quantile_mean(draw, rng, lo_q: float, hi_q: float, m: int = 4_000_000) -> float:
    """E[X | q_lo < X < q_hi] by a large sample (the population's IQM for 0.25, 0.75)."""
    x = np.sort(draw(rng, m))
    return float(x[int(lo_q * m):int(hi_q * m)].mean())


MEAN_POPULATIONS = {
    "normal": (lambda rng, size: rng.normal(0.0, 1.0, size), 0.0),
    "beta(2,5)": (lambda rng, size: rng.beta(2.0, 5.0, size), 2 / 7),
    "lognormal sigma=0.25": (lambda rng, size: rng.lognormal(0.0, 0.25, size), math.exp(0.25 ** 2 / 2)),
    "lognormal sigma=0.5": (lambda rng, size: rng.lognormal(0.0, 0.5, size), math.exp(0.5 ** 2 / 2)),
    "gamma k=2": (lambda rng, size: rng.gamma(2.0, 1.0, size), 2.0),
    "lognormal sigma=1": (lambda rng, size: rng.lognormal(0.0, 1.0, size), math.exp(0.5)),
    "bimodal p=0.5": (bimodal(0.5), 0.5 * 0.8 + 0.5 * 0.1),
    "bimodal p=0.7": (bimodal(0.7), 0.7 * 0.8 + 0.3 * 0.1),
    "bimodal p=0.8": (bimodal(0.8), 0.8 * 0.8 + 0.2 * 0.1),
}


def summarize(intervals: list, truth: float) -> dict:
    lo = np.array([iv.low for iv in intervals])
    hi = np.array([iv.high for iv in intervals])
    ok = np.isfinite(lo) & np.isfinite(hi)
    cover = ok & (lo <= truth) & (truth <= hi)
    return {"coverage": round(float(cover.mean()), 4), "width": round(float(np.median(hi[ok] - lo[ok])), 4)
            if ok.any() else None, "nan": round(float((~ok).mean()), 4)}


def stratified_percentile(m: np.ndarray, reps: int, rng) -> tuple[float, float]:
    """metrics.stratified_bootstrap of the matrix mean: each task's runs resampled independently."""
    n, k = m.shape
    rows = rng.integers(0, n, size=(reps, n, k))
    stats = m[rows, np.arange(k)].mean(axis=(1, 2))
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--reps", type=int, default=2000, help="bootstrap resamples per interval")
    p.add_argument("--ns", type=int, nargs="+", default=[5, 10])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="*", default=None, help="sections: mean correlated robust poi difference")
    p.add_argument("--out", default="bench/results/statistics_coverage.json")
    a = p.parse_args()
    sections = a.only or ["mean", "correlated", "robust", "poi", "difference"]
    out = {"samples": a.samples, "reps": a.reps, "seed": a.seed, "confidence": S.CONFIDENCE}
    if os.path.exists(a.out):
        with open(a.out) as f:
            out = {**json.load(f), **out}
    t0 = time.time()

    def log(*args):
        print(f"[{time.time() - t0:6.0f}s]", *args, flush=True)

    if "mean" in sections:
        res = {}
        for name, (draw, mu) in MEAN_POPULATIONS.items():
            for n in a.ns:
                rng = np.random.default_rng([a.seed, n, len(name)])
                xs = draw(rng, (a.samples, n))
                row = {"t": summarize([S.t_interval(x) for x in xs], mu)}
                for method in ("percentile", "BCa", "studentized"):
                    row[method] = summarize([S.bootstrap_interval(x, "mean", method, a.reps, seed=i)
                                             for i, x in enumerate(xs)], mu)
                res[f"{name}, n={n}"] = row
                log(name, n, {k: v["coverage"] for k, v in row.items()})
        out["mean"] = res

    if "correlated" in sections:
        res = {}
        rho = 0.94
        cov = np.array([[1.0, rho], [rho, 1.0]])
        for n in a.ns:
            rng = np.random.default_rng([a.seed, n, 1])
            xs = rng.multivariate_normal([0.0, 0.0], cov, size=(a.samples, n))
            row = {"run-level t": summarize([S.t_interval(x) for x in xs], 0.0)}
            for method in ("percentile", "BCa"):
                row[f"run-level {method}"] = summarize(
                    [S.bootstrap_interval(x, "mean", method, a.reps, seed=i) for i, x in enumerate(xs)], 0.0)
            los, his = zip(*(stratified_percentile(x, a.reps, rng) for x in xs))
            row["per-task percentile (stratified)"] = summarize(
                [S.Interval(0.0, lo, hi, "stratified", n) for lo, hi in zip(los, his)], 0.0)
            res[f"2 tasks, rho={rho}, n={n}"] = row
            log("correlated", n, {k: v["coverage"] for k, v in row.items()})
        out["correlated"] = res

    if "robust" in sections:
        res = {}
        for name in ("normal", "lognormal sigma=0.5", "bimodal p=0.5"):
            draw = MEAN_POPULATIONS[name][0]
            truth_rng = np.random.default_rng(123)
            truths = {"iqm": population_quantile_mean(draw, truth_rng, 0.25, 0.75),
                      "median": float(np.median(draw(truth_rng, 4_000_000)))}
            for stat, truth in truths.items():
                for n in a.ns:
                    rng = np.random.default_rng([a.seed, n, len(name), len(stat)])
                    xs = draw(rng, (a.samples, n))
                    row = {method: summarize([S.bootstrap_interval(x, stat, method, a.reps, seed=i)
                                              for i, x in enumerate(xs)], truth)
                           for method in ("BCa", "percentile")}
                    row["truth"] = round(truth, 4)
                    res[f"{stat}, {name}, n={n}"] = row
                    log(stat, name, n, {k: v["coverage"] for k, v in row.items() if k != "truth"})
        out["robust"] = res

    if "poi" in sections:
        from scipy import stats
        res = {}
        for delta in (0.0, 0.5, 1.0, 2.0):
            truth = float(stats.norm.cdf(delta / math.sqrt(2)))
            for n in a.ns:
                rng = np.random.default_rng([a.seed, n, int(10 * delta)])
                xs = rng.normal(delta, 1.0, (a.samples, n))
                ys = rng.normal(0.0, 1.0, (a.samples, n))
                row = {method: summarize([S.probability_of_improvement_interval(x, y, method=method, reps=a.reps,
                                                                                 seed=i)
                                          for i, (x, y) in enumerate(zip(xs, ys))], truth)
                       for method in ("BCa", "percentile")}
                row["truth"] = round(truth, 4)
                res[f"delta={delta}, n={n} vs {n}"] = row
                log("poi", delta, n, {k: v["coverage"] for k, v in row.items() if k != "truth"})
        out["probability_of_improvement"] = res

    if "difference" in sections:
        res = {}
        truth = math.exp(0.5 ** 2 / 2) - 1.0
        for n in a.ns:
            rng = np.random.default_rng([a.seed, n, 7])
            xs = rng.lognormal(0.0, 0.5, (a.samples, n))
            ys = rng.normal(1.0, 0.5, (a.samples, n))
            row = {"Welch t": summarize([S.welch_interval(x, y) for x, y in zip(xs, ys)], truth)}
            for method in ("BCa", "percentile"):
                row[method] = summarize([S.mean_difference_bootstrap(x, y, method, a.reps, seed=i)
                                         for i, (x, y) in enumerate(zip(xs, ys))], truth)
            res[f"lognormal(0, 0.5) - N(1, 0.5), n={n} vs {n}"] = row
            log("difference", n, {k: v["coverage"] for k, v in row.items()})
        out["difference"] = res

    out["seconds"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    log("wrote", a.out)


if __name__ == "__main__":
    main()
