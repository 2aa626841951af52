"""CORA's forgetting and zero-shot forward transfer, computed exactly as CORA's own code computes them.

Source: AGI-Labs/continual_rl (Powers et al. 2022, "CORA: Benchmarks, Baselines, and Metrics as a Platform for
Continual Reinforcement Learning Agents"), commit f2754bb282757829765beb4703f24b87efa13ff9 (2023-06-02; the file's
last change is d230e56, 2022-08-21), file `continual_rl/utils/metrics.py`, class `Metrics`, with the settings of
`continual_rl/utils/cora_metrics.py` (the paper's analysis). Line numbers below are of that commit.

What CORA computes, and what this module computes (the same):

1. Smoothing (`post_processing`, lines 225-259, filter 'ma', every benchmark in cora_metrics.py): each evaluation
   curve (one per task and run, points in step order) is replaced by its trailing running mean over the last
   `rolling_mean_count` points (a `collections.deque(maxlen=rolling_mean_count)`: the first points average the k < w
   points available, as pandas' `rolling(w, min_periods=1).mean()`). The window runs across task boundaries. An
   optional `clip_y_range` clips the raw returns first (CHORES only). cora_metrics.py: rolling_mean_count 20 for
   Atari, Procgen and MiniHack, 5 for CHORES; `num_cycles_for_forgetting` 1 everywhere.
2. Scale (`compute_metrics`, line 546): every curve of a task is divided by the largest |smoothed return| of that
   task over all points of all runs **of one method** (`visualize` calls `compute_metrics` once per model on that
   model's runs, lines 840-847): each method has its own scale, and adding a method changes no other method's
   numbers. The maximum is over the whole run, all cycles (CORA's "TODO: should only be first cycle").
3. Regions (`get_rewards_for_region`, lines 449-454): the points of a region (a, b) are those with a < step < b,
   **strictly** on both sides; an evaluation exactly at a task switch belongs to no region.
4. Isolated forgetting (`compute_forgetting_metric`, lines 456-492, `USE_ISOLATED_FORGETTING = True`): for task i,
   cycle c < num_cycles_for_forgetting and impactor task j (cycle 0: only j > i; later cycles: every j, i itself
   included, which measures relearning), with R = the region of the (c N + j)-th training period,
   F(i, j, c) = [last smoothed point with step < start of R] - [last smoothed point inside R]. Positive = forgotten.
   With isolated=False (the flag's other value, CORA's first version): the first term is the maximum smoothed value
   with step < end of task i's first training period.
5. Zero-shot forward transfer (`compute_forward_transfer_metric`, lines 494-521, `USE_ISOLATED_ZSFT = True`): for
   task i and each task p < i (first cycle only, before i is trained), Z(i, p) = [last smoothed point inside p's
   region] - baseline, baseline = the first smoothed point of the curve (whatever its step) for p = 0, else the last
   smoothed point with 0 < step < start of p's region. isolated=False: always the first point.
6. Aggregation (`plot_metrics`, lines 662-825): per cell (task, impactor, cycle) the mean and SEM (scipy.stats.sem,
   ddof 1) over runs; per task (row), per impactor (column) and overall (corner): each run's entries are averaged
   first (all of that run's entries weigh equally), then mean and SEM over runs. Every number is multiplied by
   `metric_scale` (10 in CORA's tables, line 666; 1 here by default: a fraction of the method's largest return).

CORA's code assumes every task trains for `num_task_steps` and the tasks repeat in one order: training period k of
the run is [k T, (k + 1) T] and is task k mod N. Here the periods are the run's visits (`Visit.start`, `Visit.end`),
which equal CORA's on such a schedule; a schedule that is not N tasks repeated in one order raises ValueError. Task i
is the i-th task of the first cycle.

Where this module differs from running CORA's script (none of it changes a number CORA's script prints):
- a missing point (a region without evaluations, a cycle the run did not reach, a run without the task's curve) makes
  that entry missing here; CORA raises (IndexError on `[-1]` of an empty region, KeyError on a missing tag);
- per-run aggregates are keyed by the run, not by the position in the list of values (the same when nothing is
  missing, which is the only case CORA's code handles);
- a task whose smoothed returns are all 0 keeps scale 1 (CORA divides by 0: NaN);
- SEM with one run is None (scipy: NaN);
- CORA's impactor aggregates (table bottom row) pool every cycle of impactor j and, with several cycles, land in the
  cycle-0 columns only (`range(len(forgetting_table[0]))` over a dict keyed 0..N-1, lines 768-777): `by_impactor`
  here is that pooled value, keyed by the impactor;
- CORA's 'ema' and 'smooth' filters, unused by its paper settings, are not implemented; a curve with two points at
  one step (CORA collates event files and keeps both) has one point here (the evaluation table keeps the last).
- `plot_metrics` converts with `np.float`, which NumPy >= 1.24 removed: CORA's script no longer runs unpatched.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence

import numpy as np

CORA_REPO = "AGI-Labs/continual_rl"
CORA_COMMIT = "f2754bb282757829765beb4703f24b87efa13ff9"
CORA_SOURCE = f"{CORA_REPO}@{CORA_COMMIT[:7]} continual_rl/utils/metrics.py"
# cora_metrics.py's settings per benchmark (rolling_mean_count, num_cycles_for_forgetting, clip_y_range)
CORA_SETTINGS = {
    "atari": {"rolling_mean_count": 20, "num_cycles_for_forgetting": 1, "clip_y_range": None},
    "procgen": {"rolling_mean_count": 20, "num_cycles_for_forgetting": 1, "clip_y_range": None},
    "minihack": {"rolling_mean_count": 20, "num_cycles_for_forgetting": 1, "clip_y_range": None},
    "chore_vary_env": {"rolling_mean_count": 5, "num_cycles_for_forgetting": 1, "clip_y_range": (-10, 12)},
    "chore_vary_task": {"rolling_mean_count": 5, "num_cycles_for_forgetting": 1, "clip_y_range": (-10, None)},
    "chore_vary_object": {"rolling_mean_count": 5, "num_cycles_for_forgetting": 1, "clip_y_range": (-10, None)},
    "chore_multi_traj": {"rolling_mean_count": 5, "num_cycles_for_forgetting": 1, "clip_y_range": (-10, None)},
}
CORA_TABLE_SCALE = 10.0  # metric_scale of CORA's printed tables


class _Visit(Protocol):
    regime: str
    start: int
    end: int


class CoraRun(Protocol):
    """What the functions read from a run (`metrics.RunData` has it): evaluation curves regime -> [(step, mean
    return)] in step order, raw returns, and the visits in order."""
    evals: Mapping[str, Sequence[tuple[int, float]]]
    visits: Sequence[_Visit]


# ---------------------------------------------------------------------------------------------------------------------
# CORA's building blocks
# ---------------------------------------------------------------------------------------------------------------------


def cora_smooth(values: Iterable[float], rolling_mean_count: int,
                clip_y_range: Optional[tuple[Optional[float], Optional[float]]] = None) -> np.ndarray:
    """CORA's filter 'ma': each point replaced by the mean of the last `rolling_mean_count` raw points up to it (fewer
    at the start), after the optional clip (metrics.py lines 238-246)."""
    if rolling_mean_count < 1:
        raise ValueError(f"rolling_mean_count must be >= 1, got {rolling_mean_count}")
    ys = np.asarray(list(values), dtype=np.float64)
    if clip_y_range is not None:
        ys = ys.clip(min=clip_y_range[0], max=clip_y_range[1])
    window: collections.deque = collections.deque(maxlen=rolling_mean_count)
    out = np.empty_like(ys)
    for k, y in enumerate(ys):
        window.append(y)
        out[k] = np.array(window).mean()
    return out


def cora_region(xs: np.ndarray, ys: np.ndarray, low: Optional[float], high: Optional[float]) -> np.ndarray:
    """`get_rewards_for_region`: the values with low < x < high (strict; None = unbounded)."""
    mask = np.ones(len(xs), dtype=bool)
    if low is not None:
        mask &= xs > low
    if high is not None:
        mask &= xs < high
    return ys[mask]


def cora_tasks(visits: Sequence[_Visit]) -> list[str]:
    """The tasks in their first-cycle order; ValueError unless the visits are these N tasks repeated in this order
    (CORA's schedule: training period k is task k mod N)."""
    tasks: list[str] = []
    for v in visits:
        if v.regime in tasks:
            break
        tasks.append(v.regime)
    for k, v in enumerate(visits):
        if v.regime != tasks[k % len(tasks)]:
            order = " -> ".join(w.regime or "(none)" for w in visits)
            raise ValueError(f"CORA's metrics need N tasks repeated in one order; visit {k + 1} is "
                             f"{v.regime or '(none)'!r}, expected {tasks[k % len(tasks)] or '(none)'!r} ({order})")
    return tasks


def _method_tasks(runs: Sequence[CoraRun]) -> list[str]:
    if not runs:
        raise ValueError("CORA's metrics need at least one run of the method")
    tasks = cora_tasks(runs[0].visits)
    for r in runs[1:]:
        if cora_tasks(r.visits) != tasks:
            raise ValueError("the runs of one method must train the same tasks in the same order")
    return tasks


def _curve_name(task: str, eval_regimes: Optional[Mapping[str, str]]) -> str:
    return (eval_regimes or {}).get(task, task)


def cora_smoothed(runs: Sequence[CoraRun], rolling_mean_count: int = 20,
                  clip_y_range: Optional[tuple[Optional[float], Optional[float]]] = None,
                  eval_regimes: Optional[Mapping[str, str]] = None) -> tuple[list[str], list[dict]]:
    """(tasks, per run: task -> (steps, smoothed returns)) for one method's runs; a run without a task's curve has
    no entry for it."""
    tasks = _method_tasks(runs)
    out = []
    for r in runs:
        d = {}
        for t in tasks:
            curve = r.evals.get(_curve_name(t, eval_regimes))
            if curve:
                d[t] = (np.asarray([s for s, _ in curve], dtype=np.float64),
                        cora_smooth((y for _, y in curve), rolling_mean_count, clip_y_range))
        out.append(d)
    return tasks, out


def cora_scales(smoothed: Sequence[dict], tasks: Sequence[str]) -> dict[str, float]:
    """Per task: the largest |smoothed return| over every point of every run given (one method's runs)."""
    scales = {}
    for t in tasks:
        vals = [np.abs(d[t][1]).max() for d in smoothed if t in d and len(d[t][1])]
        scales[t] = float(max(vals)) if vals else 0.0
    return scales


# ---------------------------------------------------------------------------------------------------------------------
# aggregation (plot_metrics)
# ---------------------------------------------------------------------------------------------------------------------


def _mean_sem(values: Sequence[float], scale: float) -> dict:
    xs = np.asarray(values, dtype=np.float64)
    n = int(xs.size)
    if n == 0:
        return {"mean": None, "sem": None, "n": 0}
    sem = float(xs.std(ddof=1) / math.sqrt(n)) * scale if n > 1 else None
    return {"mean": float(xs.mean()) * scale, "sem": sem, "n": n}


def _per_run(entries: Sequence[dict], n_runs: int, scale: float) -> dict:
    """Each run's entries averaged, then mean and SEM over the runs that have entries (CORA's row, column and corner
    statistics); `per_run` aligned with the runs (None without entries)."""
    by_run: dict[int, list[float]] = collections.defaultdict(list)
    for e in entries:
        by_run[e["run"]].append(e["raw"])
    means = [float(np.mean(by_run[i])) if by_run.get(i) else None for i in range(n_runs)]
    stats = _mean_sem([m for m in means if m is not None], scale)
    stats["per_run"] = [None if m is None else m * scale for m in means]
    return stats


def _aggregate(kind: str, entries: list[dict], runs: Sequence[CoraRun], tasks: Sequence[str], scales: dict,
               settings: dict) -> dict:
    scale = settings["metric_scale"]
    cells: dict[tuple, list[float]] = collections.defaultdict(list)
    for e in entries:
        cells[(e["task"], e["impactor"], e.get("cycle", 0))].append(e["raw"])
    out_entries = []
    for e in entries:
        e = dict(e)
        e["value"] = e.pop("raw") * scale
        out_entries.append(e)
    return {
        "metric": kind, "source": CORA_SOURCE, "settings": settings, "tasks": list(tasks),
        "runs": [getattr(r, "name", str(i)) for i, r in enumerate(runs)], "scales": scales,
        "entries": out_entries,
        "cells": [{"task": t, "impactor": j, "cycle": c, **_mean_sem(v, scale)} for (t, j, c), v in cells.items()],
        "by_task": {t: _per_run([e for e in entries if e["task"] == t], len(runs), scale)
                    for t in tasks if any(e["task"] == t for e in entries)},
        "by_impactor": {j: _per_run([e for e in entries if e["impactor"] == j], len(runs), scale)
                        for j in tasks if any(e["impactor"] == j for e in entries)},
        "overall": _per_run(entries, len(runs), scale),
    }


# ---------------------------------------------------------------------------------------------------------------------
# the metrics
# ---------------------------------------------------------------------------------------------------------------------


def cora_forgetting(runs: Sequence[CoraRun], rolling_mean_count: int = 20, num_cycles_for_forgetting: int = 1,
                    metric_scale: float = 1.0, clip_y_range: Optional[tuple[Optional[float], Optional[float]]] = None,
                    isolated: bool = True, eval_regimes: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """CORA's isolated forgetting of ONE method, from all of that method's runs (they set its scale).

    Returns {metric, source, settings, tasks, runs, scales, entries: [{run, task, impactor, cycle, before, after,
    value}], cells: [{task, impactor, cycle, mean, sem, n}], by_task: task -> {mean, sem, n, per_run}, by_impactor,
    overall}; `value`, `mean`, `sem` and `per_run` are in units of the method's largest |return| on the task times
    `metric_scale`, `before` and `after` the scaled smoothed returns. Positive = forgotten. `eval_regimes` maps a
    task to the regime whose evaluation curve measures it (CORA's `eval_i`; default: the task itself)."""
    if num_cycles_for_forgetting < 1:
        raise ValueError(f"num_cycles_for_forgetting must be >= 1, got {num_cycles_for_forgetting}")
    tasks, smoothed = cora_smoothed(runs, rolling_mean_count, clip_y_range, eval_regimes)
    scales = cora_scales(smoothed, tasks)
    n = len(tasks)
    entries = []
    for run_id, (run, curves) in enumerate(zip(runs, smoothed)):
        for i, task in enumerate(tasks):
            if task not in curves:
                continue
            xs, ys = curves[task]
            ys = ys / scales[task] if scales[task] > 0 else ys
            own_end = run.visits[i].end  # end of task i's first training period ((task_id + 1) * task_steps)
            for c in range(num_cycles_for_forgetting):
                for j in range(n):
                    if c == 0 and j <= i:
                        continue
                    k = c * n + j
                    if k >= len(run.visits):
                        continue
                    v = run.visits[k]
                    before_vals = cora_region(xs, ys, None, v.start if isolated else own_end)
                    inside = cora_region(xs, ys, v.start, v.end)
                    if not len(before_vals) or not len(inside):
                        continue
                    before = float(before_vals[-1] if isolated else before_vals.max())
                    after = float(inside[-1])
                    entries.append({"run": run_id, "task": task, "impactor": tasks[j], "cycle": c,
                                    "start": v.start, "end": v.end, "before": before, "after": after,
                                    "raw": before - after})
    settings = {"rolling_mean_count": rolling_mean_count, "num_cycles_for_forgetting": num_cycles_for_forgetting,
                "metric_scale": metric_scale, "clip_y_range": None if clip_y_range is None else list(clip_y_range),
                "isolated": isolated, "eval_regimes": dict(eval_regimes or {})}
    return _aggregate("cora_forgetting", entries, runs, tasks, scales, settings)


def cora_transfer(runs: Sequence[CoraRun], rolling_mean_count: int = 20, metric_scale: float = 1.0,
                  clip_y_range: Optional[tuple[Optional[float], Optional[float]]] = None, isolated: bool = True,
                  eval_regimes: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """CORA's (isolated) zero-shot forward transfer of ONE method, from all of that method's runs: for task i and
    each earlier task p of the first cycle, the change of task i's scaled smoothed return over p's training period.
    Same structure as `cora_forgetting` (entries without a cycle; `impactor` = p, `before` = the baseline).
    Positive = the earlier task helped."""
    tasks, smoothed = cora_smoothed(runs, rolling_mean_count, clip_y_range, eval_regimes)
    scales = cora_scales(smoothed, tasks)
    entries = []
    for run_id, (run, curves) in enumerate(zip(runs, smoothed)):
        for i, task in enumerate(tasks):
            if task not in curves:
                continue
            xs, ys = curves[task]
            ys = ys / scales[task] if scales[task] > 0 else ys
            if not len(ys):
                continue
            for p in range(i):
                v = run.visits[p]
                inside = cora_region(xs, ys, v.start, v.end)
                if isolated and p > 0:
                    base_vals = cora_region(xs, ys, 0, v.start)  # CORA's [0, p T]: step 0 excluded
                    baseline = float(base_vals[-1]) if len(base_vals) else None
                else:
                    baseline = float(ys[0])
                if not len(inside) or baseline is None:
                    continue
                after = float(inside[-1])
                entries.append({"run": run_id, "task": task, "impactor": tasks[p], "start": v.start, "end": v.end,
                                "before": baseline, "after": after, "raw": after - baseline})
    settings = {"rolling_mean_count": rolling_mean_count, "metric_scale": metric_scale,
                "clip_y_range": None if clip_y_range is None else list(clip_y_range), "isolated": isolated,
                "eval_regimes": dict(eval_regimes or {})}
    return _aggregate("cora_transfer", entries, runs, tasks, scales, settings)


def cora_metrics(runs: Sequence[CoraRun], rolling_mean_count: int = 20, num_cycles_for_forgetting: int = 1,
                 metric_scale: float = 1.0, clip_y_range: Optional[tuple[Optional[float], Optional[float]]] = None,
                 eval_regimes: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """Both of one method's CORA metrics: {"forgetting": cora_forgetting(...), "transfer": cora_transfer(...)}."""
    return {"forgetting": cora_forgetting(runs, rolling_mean_count, num_cycles_for_forgetting, metric_scale,
                                          clip_y_range, eval_regimes=eval_regimes),
            "transfer": cora_transfer(runs, rolling_mean_count, metric_scale, clip_y_range,
                                      eval_regimes=eval_regimes)}
