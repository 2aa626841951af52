"""Continual World's average performance, forgetting and forward transfer, computed as Continual World's code does.

Source: awarelab/continual_world (Wolczyk et al. 2021, "Continual World: A Robotic Benchmark For Continual
Reinforcement Learning", NeurIPS), commit 73f63bb4fa0b5d00bda973e20dfb783bfcf1b8aa (2023-05-18), file
`continualworld/results_processing/tables.py` (`calculate_data_at_the_end`, lines 96-108;
`calculate_forgetting_individual`, lines 112-142; `calculate_forward_transfer`, lines 145-265; `normalized_ft`,
lines 86-87; `calculate_metrics`, lines 300-325), fed by `continualworld/sac/sac.py` (one log row every `log_every` =
20,000 steps, lines 608-617, with every test task's success rate and `train/active_env` = the task being trained,
whose `seq_idx` is set before the step that ends the task, `continualworld/envs.py` lines 127-141) and the paper's
definitions (section 4: F_i = p_i(i Delta) - p_i(T); FT_i = (AUC_i - AUC_i^b) / (1 - AUC_i^b)).

What Continual World's code computes (p = a task's test success rate, in [0, 1]):
- a row logged at step t belongs to the task trained up to t: a visit (s, e] owns the evaluations with s < t <= e
  (CW has no evaluation at step 0; one here belongs to no visit);
- performance at the end of training on a task = the mean of the **last 5** evaluations logged while that task was
  being trained (`groupby(...).tail(5)`; fewer if the visit has fewer); the final performance = the mean of the last 5
  evaluations of the run (`calculate_data_at_the_end`, over all rows of the run, so they may reach back into an
  earlier visit). With 1M-step tasks and a log every 20k steps, 5 evaluations are the last 10% of a task;
- forgetting of a task = end-of-training performance - final performance; the method's forgetting = the mean over all
  tasks of the sequence, the one trained last included (0 when its visit has >= 5 evaluations), per run, then over
  runs (`compute_mean_and_ci`: `data[columns].mean(axis=1)`);
- average performance P(T) = the mean over tasks of the final performance;
- forward transfer: AUC_i = the plain mean of task i's evaluations logged while i was trained (all of them, equally
  spaced: a right Riemann sum of the paper's integral), AUC_i^b the same over the whole single-task run of i (every
  reference run of that task, averaged over them); FT_i = (mean over runs of AUC_i - mean over reference runs of
  AUC_i^b) / (1 - mean over reference runs of AUC_i^b); the method's FT = the mean of FT_i over tasks. Being linear in
  AUC_i, that equals the mean over runs of each run's (AUC_i - AUC_i^b) / (1 - AUC_i^b), which is what `per_run`
  holds here. The 1 is the best success rate; on normalised returns it is `ceiling` (1 by default).

Repeated tasks: CW's only sequence with repeats, CW20, is CW10 twice, and its code treats every position of the
sequence as a task of its own: 20 test columns (a test env per position), forgetting and forward transfer per
position, averaged over the 20 (each against the same single-task reference). Here a regime has one evaluation curve
whatever the visit, so the reading is a parameter:
- `per_visit` (default, CW20's): one entry per visit, F = end of that visit - final; FT of every visit against the
  reference; averages over visits;
- `last`: one entry per trained regime, at the end of its last visit (what the library printed as forgetting (CW)
  before, with single evaluations instead of 5);
- `first`: one entry per trained regime, at the end of its first visit (forward transfer proper: the first visit
  only, before the regime was ever trained).
Without repeats the three are the same.

Not reproduced here: CW's 90% percentile bootstrap intervals (the library's own statistics give intervals) and its
deterministic-policy columns (CW's tables use the stochastic test, `test/stochastic/...`); which evaluation the
curves hold is the run's `eval_greedy` setting.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

import numpy as np

CW_REPO = "awarelab/continual_world"
CW_COMMIT = "73f63bb4fa0b5d00bda973e20dfb783bfcf1b8aa"
CW_SOURCE = f"{CW_REPO}@{CW_COMMIT[:7]} continualworld/results_processing/tables.py"
CW_LAST_EVALUATIONS = 5  # tail(5)
READINGS = ("per_visit", "last", "first")
DEFAULT_READING = "per_visit"

Curve = Sequence[tuple[int, float]]


class _Visit(Protocol):
    regime: str
    start: int
    end: int


class CWRun(Protocol):
    """What the functions read from a run (`metrics.RunData` has it)."""
    evals: Mapping[str, Curve]
    visits: Sequence[_Visit]


def _check(reading: str, n_last: int) -> None:
    if reading not in READINGS:
        raise ValueError(f"reading must be one of {', '.join(READINGS)}, got {reading!r}")
    if n_last < 1:
        raise ValueError(f"n_last must be >= 1, got {n_last}")


def _curve(run: CWRun, regime: str, normalizer: Optional[Callable[[str, float], float]]) -> list[tuple[int, float]]:
    curve = sorted(run.evals.get(regime) or [])
    return [(s, normalizer(regime, y) if normalizer else float(y)) for s, y in curve]


def tail_mean(curve: Curve, n_last: int = CW_LAST_EVALUATIONS, start: Optional[float] = None,
              end: Optional[float] = None) -> Optional[float]:
    """Mean of the last `n_last` evaluations with start < step <= end (no bound: the whole curve); None if none."""
    ys = [y for s, y in curve if (start is None or s > start) and (end is None or s <= end)]
    return float(np.mean(ys[-n_last:])) if ys else None


def visit_mean(curve: Curve, start: float, end: float) -> Optional[float]:
    """CW's AUC of a visit: the plain mean of the evaluations with start < step <= end; None if none."""
    ys = [y for s, y in curve if start < s <= end]
    return float(np.mean(ys)) if ys else None


def _trained(run: CWRun) -> list[str]:
    out: list[str] = []
    for v in run.visits:
        if v.regime not in out:
            out.append(v.regime)
    return out


def _selected(run: CWRun, reading: str) -> list[tuple[int, _Visit]]:
    """(visit number from 1, visit) of the visits a reading uses."""
    visits = list(enumerate(run.visits, 1))
    if reading == "per_visit":
        return visits
    pick: dict[str, tuple[int, _Visit]] = {}
    for k, v in visits:
        if reading == "last" or v.regime not in pick:
            pick[v.regime] = (k, v)
    return [pick[r] for r in _trained(run)]


def _summary(entries: list[dict]) -> tuple[Optional[float], dict[str, Optional[float]]]:
    vals = [e["value"] for e in entries if e["value"] is not None]
    per_regime: dict[str, list[float]] = {}
    for e in entries:
        if e["value"] is not None:
            per_regime.setdefault(e["regime"], []).append(e["value"])
    return (float(np.mean(vals)) if vals else None), {r: float(np.mean(v)) for r, v in per_regime.items()}


def cw_average_performance(run: CWRun, n_last: int = CW_LAST_EVALUATIONS,
                           normalizer: Optional[Callable[[str, float], float]] = None) -> dict[str, Any]:
    """P(T): the mean over the trained regimes of the mean of each one's last `n_last` evaluations."""
    _check(DEFAULT_READING, n_last)
    per_regime = {r: tail_mean(_curve(run, r, normalizer), n_last) for r in _trained(run)}
    vals = [v for v in per_regime.values() if v is not None]
    return {"metric": "cw_average_performance", "source": CW_SOURCE, "n_last": n_last,
            "value": float(np.mean(vals)) if vals else None, "per_regime": per_regime}


def cw_forgetting(run: CWRun, reading: str = DEFAULT_READING, n_last: int = CW_LAST_EVALUATIONS,
                  normalizer: Optional[Callable[[str, float], float]] = None) -> dict[str, Any]:
    """Continual World's forgetting of one run: for each selected visit (`reading`), the mean of the regime's last
    `n_last` evaluations in the visit minus the mean of its last `n_last` evaluations of the run; `value` = the mean
    over the entries (CW's per-run forgetting; the method's is the mean over runs). Positive = forgotten."""
    _check(reading, n_last)
    entries = []
    for k, v in _selected(run, reading):
        curve = _curve(run, v.regime, normalizer)
        at_end, final = tail_mean(curve, n_last, v.start, v.end), tail_mean(curve, n_last)
        entries.append({"regime": v.regime, "visit": k, "start": v.start, "end": v.end, "at_end": at_end,
                        "final": final, "value": None if at_end is None or final is None else at_end - final})
    value, per_regime = _summary(entries)
    return {"metric": "cw_forgetting", "source": CW_SOURCE, "reading": reading, "n_last": n_last, "value": value,
            "per_regime": per_regime, "entries": entries}


def reference_aucs(references: Sequence[CWRun], regime: str,
                   normalizer: Optional[Callable[[str, float], float]] = None) -> list[float]:
    """AUC^b of each reference run that trains the regime: the mean of its evaluations over its first visit of the
    regime (a single-task run: the whole run)."""
    out = []
    for ref in references:
        v = next((w for w in ref.visits if w.regime == regime), None)
        if v is not None:
            auc = visit_mean(_curve(ref, regime, normalizer), v.start, v.end)
            if auc is not None:
                out.append(auc)
    return out


def cw_forward_transfer(run: CWRun, references: Sequence[CWRun], reading: str = DEFAULT_READING,
                        ceiling: Union[float, Callable[[str], float]] = 1.0,
                        normalizer: Optional[Callable[[str, float], float]] = None) -> dict[str, Any]:
    """Continual World's forward transfer of one run: for each selected visit, FT = (AUC - AUC^b) / (ceiling -
    AUC^b), AUC = the mean of the regime's evaluations in the visit, AUC^b = the mean over the reference runs of
    theirs (`reference_aucs`); `value` = the mean over the entries. The method's FT (CW's `total_normalized_ft`) is
    the mean of the runs' values when every run has every entry. `ceiling`: a number or regime -> number (1: CW's
    success rate, and normalised returns). The references should train each task for as many
    steps as a visit (CW: steps_per_task both); `length` and `reference_length` record both."""
    _check(reading, 1)
    entries = []
    for k, v in _selected(run, reading):
        auc = visit_mean(_curve(run, v.regime, normalizer), v.start, v.end)
        aucs = reference_aucs(references, v.regime, normalizer)
        ref_len = [w.end - w.start for w in (next((w for w in r.visits if w.regime == v.regime), None)
                                             for r in references) if w is not None]
        auc_b = float(np.mean(aucs)) if aucs else None
        top = float(ceiling(v.regime)) if callable(ceiling) else float(ceiling)
        value = None
        if auc is not None and auc_b is not None and not math.isclose(top, auc_b, abs_tol=1e-12):
            value = (auc - auc_b) / (top - auc_b)
        entries.append({"regime": v.regime, "visit": k, "start": v.start, "end": v.end, "length": v.end - v.start,
                        "reference_length": ref_len[0] if ref_len else None, "auc": auc, "auc_reference": auc_b,
                        "references": len(aucs), "ceiling": top, "value": value})
    value, per_regime = _summary(entries)
    return {"metric": "cw_forward_transfer", "source": CW_SOURCE, "reading": reading, "value": value,
            "per_regime": per_regime, "entries": entries}


def method_mean(values: Sequence[Optional[float]]) -> Optional[float]:
    """A method's number from its runs' values: the mean over the runs that have one (CW's tables)."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(xs)) if xs else None
