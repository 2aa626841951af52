"""Continual-learning metrics from run directories: performance, forgetting, forward transfer, plasticity.

    python -m continual.evaluation.metrics RUN_DIR [RUN_DIR ...] [--reference RUN_DIR ...] [--normalize raw|max_abs|reference_scores]
                                [--scores JSON] [--plasticity_window K] [--group_by KEY[,KEY]] [--out PATH]
                                [--cw_reading per_visit|last|first] [--cw_last 5]
                                [--cora_rolling_mean_count 20] [--cora_cycles 1] [--cora_metric_scale 1]

Inputs (written by training): `eval_table.csv` (continual evaluation, `continual.evaluation.continual`), `metrics.jsonl`
(switches -> the visits of the schedule; training episodes -> plasticity) and `config.json`.

Three families of metrics, each named for what it computes:
- CORA's metrics, exactly as CORA's code computes them (`continual.evaluation.cora`: `cora_forgetting`,
  `cora_transfer`; smoothed curves, strict region bounds, first cycle, each method scaled by its own largest return).
  They need all runs of one method, so they are computed per group of runs (`main`: the "cora" section), on raw
  returns whatever --normalize says.
- Continual World's metrics, exactly as its code computes them (`continual.evaluation.cw`: `cw_average_performance`,
  `cw_forgetting`, `cw_forward_transfer`; each performance the mean of the last 5 evaluations, AUC the mean of a
  visit's evaluations), per run, on the normalised curves, with the reading for repeated visits stated
  (--cw_reading, default per_visit as CW20).
- This library's own variants (below), kept under names that say what they compute.

Notation. Visits V_k = (m_k, s_k, e_k), k = 1..K: regime m_k trained on steps (s_k, e_k], s_1 = 0, e_K = T (the
last step). y_i(t): the evaluation return of regime i at evaluation step t, after normalisation. last_i(a, b]: y_i at
the last evaluation step t with a < t <= b; at_i(b): y_i at the last evaluation step t <= b. An evaluation at a
switch step belongs to the visit that ends there.

- final_i = y_i at the last evaluation step. `final` = mean over trained regimes (P(T) from one evaluation per
  regime; `cw_average_performance` is Continual World's, from the last 5); `final_unseen` = mean over evaluated
  regimes never trained (held-out).
- average_i = time-average of the piecewise-linear evaluation curve over [first, last evaluation step].
- Forgetting over all later visits (`forgetting_all_visits`; called "isolated forgetting (CORA)" before, which it is
  not: CORA smooths, bounds regions strictly, stops after the first cycle and scales per method), for each visit k
  of another regime after regime i was trained (m_k != i, i in {m_1..m_{k-1}}), in every cycle:
  F(i, k) = at_i(s_k) - last_i(s_k, e_k]. Positive = forgetting. forgetting_all_visits_i = mean over k;
  `forgetting_all_visits` = mean over regimes.
- Forgetting at the end of the last visit (`forgetting_last_visit`; called "forgetting (CW)" before): for every
  trained regime, at_i(e_i) - final_i with e_i the end of i's last visit (0 for the one trained last);
  `forgetting_last_visit` = mean over all trained regimes. This is `cw_forgetting` with reading "last" and one
  evaluation per point instead of the mean of the last 5 (where each last visit has an evaluation).
- Forgetting from the best score: forgetting_from_best_i = max{y_i(t): t <= e_i} - final_i, for trained regimes
  whose last visit ends before T. Never below forgetting_last_visit: it also counts what was lost before the end of
  the last visit.
- Zero-shot transfer at the switches (`transfer_zero_shot`; not CORA's `cora_transfer`: no smoothing, the points at
  or before each switch, the run's own normalisation), for each visit k before regime i's first visit (all visits for
  never-trained regimes): Z(i, k) = last_i(s_k, e_k] - at_i(s_k) (at_i(0) is the step-0 evaluation; without one,
  the first evaluation point). Regimes trained from step 0 have none.
- Forward transfer against a reference run by the trapezoid (`transfer_reference`, --reference; not CW's
  `cw_forward_transfer`, which takes the plain mean of the evaluations of the whole visit and of every reference
  run): over i's first visit (s, e), L = min(e - s, length of i's first visit in the reference), AUC_i = mean of y_i
  over [s, s + L] (trapezoid), AUC_i^ref the same over the first reference run's first visit of i;
  FT_i = (AUC_i - AUC_i^ref) / (C_i - AUC_i^ref) with the ceiling C_i = 1 on a normalised scale (max_abs,
  reference_scores) and max|R_i| over all runs for raw returns (the same value as with max_abs).
- Plasticity: for the n-th visit of a regime (s, e), window W = min(K, e - s) (K = --plasticity_window, default the
  whole visit): gain = mean return of the training episodes ending in (s + W/2, s + W] minus those ending in
  (s, s + W/2]. Reported per visit, per visit number (mean over regimes), and overall.

Normalisation (--normalize): raw; max_abs: R_i / max|R_i| (over the evaluations of every run given, references
included); reference_scores: --scores maps each regime to a score s (R / s) or to [low, high] ((R - low) / (high -
low)). It applies to every metric but CORA's, which scale by their own rule. Several runs are grouped (config.json
keys, --group_by; default: exp_name where set, as the launcher sets it to the arm's name, else architecture, + S&P)
and each scalar is reported as mean +- 95% CI half-width,
t_{0.975, n-1} * sd / sqrt(n); CORA's metrics as CORA reports them, mean +- SEM over the runs of the per-run means.
With several runs, the robust statistics of Agarwal et al. (2021, rliable) over the runs x trained-regimes matrix of
per-regime final and average scores: IQM, mean, median and (normalised scores) optimality gap at 1, each with a 95%
stratified-bootstrap CI; the probability of improvement of each method over each other one; performance profiles (in
the JSON; drawn by the plots CLI). Their intervals are percentile stratified bootstraps (`stratified_bootstrap`,
2,000 resamples by default; rliable uses 50,000; its own bootstrap, rliable.library, cannot run here: rliable 1.2
pins arch < 8, arch 7.2 does not import with pandas 3, and arch 8 rejects the random_state=None rliable passes it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any, Iterable, Optional, Sequence, TypeVar

import numpy as np
import tyro

from continual.config.loading import cli
from continual.console import print_table
from continual.errors import UserError
from continual.evaluation import cora, cw
from continual.evaluation.table import EVAL_TABLE, read_eval_table
from continual.io import atomic_write_json, read_jsonl
from continual.machine import describe, starts_with_machines
from continual.modstrings import normalize_modification

T = TypeVar("T")


def __getattr__(name: str):
    """`metrics.rl` (rliable's metrics, used by the bench reports) on first use: importing rliable and scipy costs a
    training run ~1 s at start-up, and only reports need them."""
    if name == "rl":
        from rliable import metrics as rl

        return rl
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


METRICS_FILE = "metrics.json"
Curve = list[tuple[int, float]]  # (step, value), sorted by step
SUMMARY_KEYS = ("final", "average", "final_unseen", "cw_average_performance", "cw_forgetting", "cw_forward_transfer",
                "forgetting_all_visits", "forgetting_last_visit", "forgetting_from_best", "transfer_zero_shot",
                "transfer_reference", "plasticity")
REGIME_KEYS = ("final", "average", "cw_final", "cw_forgetting", "cw_forward_transfer", "forgetting_all_visits",
               "forgetting_last_visit", "forgetting_from_best", "transfer_zero_shot", "transfer_reference")


# ---------------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Visit:
    regime: str
    start: int
    end: int
    number: int = 1  # 1 = the first visit of this regime


@dataclasses.dataclass
class RunData:
    run_dir: str
    config: dict
    evals: dict[str, Curve]  # regime -> eval curve (raw mean returns)
    visits: list[Visit]
    end_step: int
    episodes: list[tuple[int, str, float]] = dataclasses.field(default_factory=list)  # (step, regime, return)
    plasticity: list[dict] = dataclasses.field(default_factory=list)  # "plasticity" records of metrics.jsonl
    heldout: list[str] = dataclasses.field(default_factory=list)
    iterations: list[dict] = dataclasses.field(default_factory=list)  # "iteration" records (losses, learning rate)
    starts: list[dict] = dataclasses.field(default_factory=list)  # "start" records: the first start, then resumes

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.run_dir))

    @property
    def trained(self) -> list[str]:
        out: list[str] = []
        for v in self.visits:
            if v.regime not in out:
                out.append(v.regime)
        return out

    @property
    def regimes(self) -> list[str]:
        """Every evaluated regime: trained ones in order of first visit, then the curriculum's other regimes, then
        held-out ones."""
        order = list(self.trained)
        order += [r for r in self.config.get("possible_modifications") or [] if r not in order]
        order += [r for r in self.evals if r not in order and r not in self.heldout]
        order += [r for r in self.heldout if r not in order]
        return [r for r in order if r in self.evals]


def number_visits(visits: Sequence[Visit]) -> list[Visit]:
    seen: dict[str, int] = {}
    out = []
    for v in visits:
        seen[v.regime] = seen.get(v.regime, 0) + 1
        out.append(Visit(v.regime, v.start, v.end, seen[v.regime]))
    return out


def make_visits(first: str, switches: Iterable[tuple[int, str]], end_step: int) -> list[Visit]:
    """Visits from the first regime and the (step, new regime) switches."""
    visits: list[Visit] = []
    cur, start = first, 0
    for step, new in sorted(switches):
        if step > start:
            visits.append(Visit(cur, start, step))
        cur, start = new, step
    if end_step > start or not visits:
        visits.append(Visit(cur, start, max(end_step, start)))
    return number_visits(visits)


def load_run(run_dir: str) -> RunData:
    """Evaluation curves, visits, training episodes and plasticity records of a run directory."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"{run_dir!r} is not a run directory")
    config_path = os.path.join(run_dir, "config.json")
    config = json.load(open(config_path)) if os.path.exists(config_path) else {}
    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    evals: dict[str, Curve] = {}
    heldout: list[str] = []
    table = os.path.join(run_dir, EVAL_TABLE)
    rows = read_eval_table(table) if os.path.exists(table) else [
        {"step": r["global_step"], "modification": r["modification"], "mean": r["mean"], "split": r.get("split")}
        for r in records if r.get("kind") == "eval"]
    for r in rows:
        m = normalize_modification(r["modification"] or "")
        evals.setdefault(m, []).append((int(r["step"]), float(r["mean"])))
        if r.get("split") == "heldout" and m not in heldout:
            heldout.append(m)
    for m in evals:
        evals[m] = sorted(dict(evals[m]).items())  # one value per step (the last written)
    switches = sorted((r["global_step"], normalize_modification(r["modification"] or "")) for r in records
                      if r.get("kind") == "switch")
    sw_records = sorted((r for r in records if r.get("kind") == "switch"), key=lambda r: r["global_step"])
    iterations = [r for r in records if r.get("kind") == "iteration"]
    if sw_records:
        first = sw_records[0].get("previous", "")
    elif iterations:
        first = iterations[0].get("modification", "")
    else:
        first = config.get("modifs", "")
    steps = [r["global_step"] for r in iterations] + [s for c in evals.values() for s, _ in c]
    end_step = max(steps) if steps else int(config.get("resolved_total_timesteps") or 0)
    visits = make_visits(normalize_modification(first or ""), switches, end_step)
    episodes = [(r["global_step"], normalize_modification(r.get("modification") or ""), float(r["return"])) for r in records
                if r.get("kind") == "episode"]
    plasticity = [r for r in records if r.get("kind") == "plasticity"]
    starts = starts_with_machines(run_dir, records)
    return RunData(run_dir, config, evals, visits, end_step, episodes, plasticity, heldout, iterations, starts)


def provenance(runs: Iterable[tuple[str, list[dict]]]) -> dict:
    """The code runs ran at, the machines they ran on and where they were resumed, from (run name, its "start" records)
    pairs (`RunData.name`, `RunData.starts`, whose machines `continual.machine.starts_with_machines` filled in):
    {"commits": {commit (+ "-dirty"): run names}, "resumed": {run name: [steps]}, "machines": {machine: {run name:
    [steps it started at there]}}}, "machines" only when some start has one recorded. A resume from a periodic
    checkpoint restarts the episodes in flight, so such a run is a valid sample but not the bit-exact replay of its
    seed (docs/outputs.md, "Resuming"); one on another kind of machine also computes other bits from there on
    (continual/machine.py)."""
    commits: dict[str, list[str]] = {}
    resumed: dict[str, list[int]] = {}
    machines: dict[str, dict[str, list[int]]] = {}
    for name, starts in runs:
        for rec in starts:
            rev = rec.get("code_revision") or {}
            key = (rev.get("commit") or "unknown")[:7] + ("-dirty" if rev.get("dirty") else "")
            if name not in commits.setdefault(key, []):
                commits[key].append(name)
            if rec.get("resumed"):
                resumed.setdefault(name, []).append(int(rec.get("global_step", 0)))
            machines.setdefault(describe(rec.get("machine")), {}).setdefault(name, []).append(
                int(rec.get("global_step", 0)))
    if set(machines) == {describe(None)}:  # runs from before machines were recorded: their reports stay as they were
        machines = {}
    return {"commits": commits, "resumed": resumed, **({"machines": machines} if machines else {})}


def provenance_lines(prov: dict) -> list[str]:
    """Markdown bullets for a report: the commits (with their run counts) and the resumed runs."""
    lines = ["- Code: " + "; ".join(f"{c} ({len(names)} run{'s' * (len(names) != 1)})"
                                    for c, names in prov["commits"].items())]
    if prov["resumed"]:
        count = len(prov["resumed"])
        lines.append(f"- Resumed from a checkpoint ({count} run{'s' * (count != 1)}; episodes in flight restarted): "
                     + ", ".join(_resumed_entries(prov["resumed"])))
    else:
        lines.append("- Resumed from a checkpoint: none (every run is its seed's uninterrupted run)")
    if prov.get("machines"):
        lines.append("- Machines (CPU, vector ISA; runs, and the steps they started or resumed at there): " + "; ".join(
            f"{m}: {len(runs)} run{'s' * (len(runs) != 1)} at {_step_range(runs)}" for m, runs in prov["machines"].items()))
    return lines


LISTED_RESUMES = 3  # a run resumed more often is summed up in the report's text; its steps stay in its records


def _resumed_entries(resumed: dict[str, list[int]]) -> list[str]:
    """The provenance line's entries: a run resumed up to LISTED_RESUMES times with its steps; a run resumed more often
    (one that spans many sessions) by its count and range, runs with the same count and range (seeds resumed as one
    group) in one entry, so that the line stays readable as the sessions add resumes."""
    entries: list[str | tuple[str, list[str]]] = []  # a listed run's text, or a summary and its runs; first mention
    groups: dict[str, list[str]] = {}
    for name, steps in resumed.items():
        if len(steps) <= LISTED_RESUMES:
            entries.append(f"{name} at {', '.join(map(str, steps))}")
            continue
        summary = f"{len(steps)} times from {min(steps):,} to {max(steps):,}"
        if summary not in groups:
            groups[summary] = []
            entries.append((summary, groups[summary]))
        groups[summary].append(name)
    return [e if isinstance(e, str) else f"{len(e[1])} run{'s' * (len(e[1]) != 1)} ({', '.join(e[1])}) {e[0]}"
            for e in entries]


def _step_range(runs: dict[str, list[int]]) -> str:
    steps = sorted(s for ss in runs.values() for s in ss)
    return f"{steps[0]:,}" if steps[0] == steps[-1] else f"{steps[0]:,}-{steps[-1]:,}"


# ---------------------------------------------------------------------------------------------------------------------
# curve helpers
# ---------------------------------------------------------------------------------------------------------------------


def at_or_before(curve: Curve, t: float) -> Optional[float]:
    """y at the last evaluation step <= t."""
    val = None
    for s, y in curve:
        if s <= t:
            val = y
        else:
            break
    return val


def last_in(curve: Curve, a: float, b: float) -> Optional[float]:
    """y at the last evaluation step in (a, b]."""
    val = None
    for s, y in curve:
        if a < s <= b:
            val = y
    return val


def curve_mean(curve: Curve, a: float, b: float) -> Optional[float]:
    """Mean over [a, b] of the piecewise-linear curve through the points (constant beyond its ends)."""
    if not curve:
        return None
    ts = np.array([s for s, _ in curve], dtype=np.float64)
    ys = np.array([y for _, y in curve], dtype=np.float64)
    if b <= a:
        return float(np.interp(a, ts, ys))
    knots = np.unique(np.concatenate([[a, b], ts[(ts > a) & (ts < b)]]))
    vals = np.interp(knots, ts, ys)
    return float(np.sum((vals[1:] + vals[:-1]) / 2 * np.diff(knots)) / (b - a))


def time_average(curve: Curve) -> Optional[float]:
    if not curve:
        return None
    if len(curve) == 1:
        return curve[0][1]
    return curve_mean(curve, curve[0][0], curve[-1][0])


def _mean(xs: Iterable[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(vals)) if vals else None


# ---------------------------------------------------------------------------------------------------------------------
# metrics on one run (normalised curves)
# ---------------------------------------------------------------------------------------------------------------------


def forgetting_all_visits(curve: Curve, regime: str, visits: Sequence[Visit]) -> list[dict]:
    """F(i, k) = at_i(s_k) - last_i(s_k, e_k] for every visit k of another regime after the regime was trained (every
    cycle). Not CORA's forgetting (`cora.cora_forgetting`)."""
    out = []
    for k, v in enumerate(visits):
        if v.regime == regime or regime not in {w.regime for w in visits[:k]}:
            continue
        before, after = at_or_before(curve, v.start), last_in(curve, v.start, v.end)
        if before is not None and after is not None:
            out.append({"visit": k + 1, "during": v.regime, "start": v.start, "end": v.end, "before": before,
                        "after": after, "value": before - after})
    return out


def _last_end(curve: Curve, regime: str, visits: Sequence[Visit]) -> Optional[int]:
    """End of the regime's last visit, when the regime was trained and evaluated by then."""
    ends = [v.end for v in visits if v.regime == regime]
    if not ends or not curve or curve[0][0] > max(ends):
        return None
    return max(ends)


def forgetting_last_visit(curve: Curve, regime: str, visits: Sequence[Visit]) -> Optional[float]:
    """The score at the end of the regime's last visit minus the final score, one evaluation each (0 for the regime
    trained last): `cw.cw_forgetting` with reading "last" and n_last=1 when every last visit has an evaluation (without
    one, this takes the last evaluation before the visit, CW's none)."""
    end = _last_end(curve, regime, visits)
    return None if end is None else at_or_before(curve, end) - curve[-1][1]


def best_minus_final(curve: Curve, regime: str, visits: Sequence[Visit], end_step: int) -> Optional[float]:
    end = _last_end(curve, regime, visits)
    if end is not None and end >= end_step:  # trained to the end: nothing to forget after it
        return None
    return None if end is None else max(y for s, y in curve if s <= end) - curve[-1][1]


def zero_shot_transfer(curve: Curve, regime: str, visits: Sequence[Visit]) -> list[dict]:
    """Z(i, k) = last_i(s_k, e_k] - at_i(s_k) for every visit k before the regime's first visit. Not CORA's zero-shot
    transfer (`cora.cora_transfer`: smoothed, strict bounds, per-method scale)."""
    out = []
    if not curve:
        return out
    for k, v in enumerate(visits):
        if v.regime == regime:
            break  # only before the regime is trained for the first time
        base = at_or_before(curve, v.start)
        if base is None and k == 0:
            base = curve[0][1]  # the first evaluation point when there is none at step 0 (as CORA's baseline)
        after = last_in(curve, v.start, v.end)
        if base is not None and after is not None:
            out.append({"visit": k + 1, "during": v.regime, "start": v.start, "end": v.end, "baseline": base,
                        "after": after, "value": after - base})
    return out


def reference_transfer(curve: Curve, visit: Visit, ref_curve: Curve, ref_visit: Visit, ceiling: float
                       ) -> Optional[dict]:
    """Trapezoid AUCs over the first min(lengths) steps of the visit and of the reference's visit; (AUC - AUC_ref) /
    (ceiling - AUC_ref). Not Continual World's (`cw.cw_forward_transfer`)."""
    length = min(visit.end - visit.start, ref_visit.end - ref_visit.start)
    if length <= 0 or not curve or not ref_curve:
        return None
    auc = curve_mean(curve, visit.start, visit.start + length)
    auc_ref = curve_mean(ref_curve, ref_visit.start, ref_visit.start + length)
    denom = ceiling - auc_ref
    value = (auc - auc_ref) / denom if denom > 1e-12 else None
    return {"auc": auc, "auc_reference": auc_ref, "length": length, "ceiling": ceiling, "value": value}


def plasticity_gains(episodes: Sequence[tuple[int, str, float]], visits: Sequence[Visit],
                     window: Optional[int] = None, transform=None) -> list[dict]:
    out = []
    for v in visits:
        w = v.end - v.start if window is None else min(window, v.end - v.start)
        mid = v.start + w / 2
        rets = [(s, transform(v.regime, r) if transform else r) for s, m, r in episodes if m == v.regime]
        first = [r for s, r in rets if v.start < s <= mid]
        second = [r for s, r in rets if mid < s <= v.start + w]
        gain = float(np.mean(second) - np.mean(first)) if first and second else None
        out.append({"regime": v.regime, "visit": v.number, "start": v.start, "window": w,
                    "episodes": len(first) + len(second), "first_half": _mean(first), "second_half": _mean(second),
                    "gain": gain})
    return out


# ---------------------------------------------------------------------------------------------------------------------
# normalisation
# ---------------------------------------------------------------------------------------------------------------------


class Normalizer:
    def __init__(self, mode: str = "raw", scores: Optional[dict] = None, runs: Sequence[RunData] = ()):
        if mode not in ("raw", "max_abs", "reference_scores"):
            raise ValueError(f"normalize: must be raw, max_abs or reference_scores, got {mode!r}")
        self.mode = mode
        self.abs_max: dict[str, float] = {}
        for run in runs:
            for m, c in run.evals.items():
                self.abs_max[m] = max([self.abs_max.get(m, 0.0)] + [abs(y) for _, y in c])
            for _, m, r in run.episodes:
                if m not in run.evals:
                    self.abs_max[m] = max(self.abs_max.get(m, 0.0), abs(r))
        self.affine: dict[str, tuple[float, float]] = {}
        if mode == "reference_scores":
            if not scores:
                raise ValueError("normalize reference_scores: needs --scores")
            for k, v in scores.items():
                key = "" if k in ("(none)", "none") else normalize_modification(k)
                if isinstance(v, (int, float)) and v != 0:
                    self.affine[key] = (0.0, float(v))
                elif isinstance(v, (list, tuple)) and len(v) == 2 and v[1] != v[0]:
                    self.affine[key] = (float(v[0]), float(v[1]) - float(v[0]))
                else:
                    raise ValueError(f"scores: {k!r} must be a non-zero number or [low, high], got {v!r}")
            missing = sorted({m for run in runs for m in run.evals} - set(self.affine))
            if missing:
                raise ValueError(f"scores: no reference score for {', '.join(repr(m) for m in missing)}")

    def __call__(self, regime: str, value: float) -> float:
        if self.mode == "raw":
            return value
        if self.mode == "max_abs":
            scale = self.abs_max.get(regime, 0.0)
            return value / scale if scale > 0 else value
        low, span = self.affine.get(regime, (0.0, 1.0))
        return (value - low) / span

    def ceiling(self, regime: str) -> float:
        """The best value on this scale (Continual World's 1), for the reference transfer."""
        if self.mode == "raw":
            return self.abs_max.get(regime, 1.0) or 1.0
        return 1.0

    def curve(self, regime: str, curve: Curve) -> Curve:
        return [(s, self(regime, y)) for s, y in curve]


# ---------------------------------------------------------------------------------------------------------------------
# putting it together
# ---------------------------------------------------------------------------------------------------------------------


def run_metrics(run: RunData, normalizer: Optional[Normalizer] = None, references: Sequence[RunData] = (),
                plasticity_window: Optional[int] = None, cw_reading: str = cw.DEFAULT_READING,
                cw_last: int = cw.CW_LAST_EVALUATIONS) -> dict:
    """Every per-run metric of one run (normalised by `normalizer`, raw by default): this library's variants and
    Continual World's (`cw_reading` for repeated visits, the last `cw_last` evaluations per performance value).
    CORA's metrics need all runs of a method: `cora.cora_metrics`."""
    norm = normalizer or Normalizer("raw", runs=[run, *references])
    cw_perf = cw.cw_average_performance(run, cw_last, normalizer=norm)
    cw_forg = cw.cw_forgetting(run, cw_reading, cw_last, normalizer=norm)
    cw_ft = (cw.cw_forward_transfer(run, references, cw_reading, ceiling=norm.ceiling, normalizer=norm) if references
             else None)
    trained = run.trained
    per_regime: dict[str, dict] = {}
    forgetting_entries, transfer_entries = [], []
    for regime in run.regimes:
        curve = norm.curve(regime, run.evals[regime])
        iso = forgetting_all_visits(curve, regime, run.visits)
        zs = zero_shot_transfer(curve, regime, run.visits)
        forgetting_entries += [{"regime": regime, **e} for e in iso]
        transfer_entries += [{"regime": regime, **e} for e in zs]
        ref = None
        first = next((v for v in run.visits if v.regime == regime), None)
        if first is not None:
            for r in references:
                ref_visit = next((v for v in r.visits if v.regime == regime), None)
                if ref_visit is not None and regime in r.evals:
                    ref = reference_transfer(curve, first, norm.curve(regime, r.evals[regime]), ref_visit,
                                             norm.ceiling(regime))
                    if ref is not None:
                        ref["reference_run"] = r.run_dir
                        break
        per_regime[regime] = {
            "trained": regime in trained,
            "heldout": regime in run.heldout,
            "visits": sum(v.regime == regime for v in run.visits),
            "evaluations": len(curve),
            "final": curve[-1][1] if curve else None,
            "final_step": curve[-1][0] if curve else None,
            "average": time_average(curve),
            "cw_final": cw_perf["per_regime"].get(regime),
            "cw_forgetting": cw_forg["per_regime"].get(regime),
            "cw_forward_transfer": cw_ft["per_regime"].get(regime) if cw_ft else None,
            "forgetting_all_visits": _mean(e["value"] for e in iso),
            "forgetting_last_visit": forgetting_last_visit(curve, regime, run.visits),
            "forgetting_from_best": best_minus_final(curve, regime, run.visits, run.end_step),
            "transfer_zero_shot": _mean(e["value"] for e in zs),
            "transfer_reference": ref["value"] if ref else None,
            "reference": ref,
        }
    gains = plasticity_gains(run.episodes, run.visits, plasticity_window, transform=norm)
    by_visit: dict[str, Optional[float]] = {}
    for n in sorted({g["visit"] for g in gains}):
        by_visit[str(n)] = _mean(g["gain"] for g in gains if g["visit"] == n)
    seen = [r for r in run.regimes if per_regime[r]["trained"]]
    unseen = [r for r in run.regimes if not per_regime[r]["trained"]]
    summary = {
        "final": _mean(per_regime[r]["final"] for r in seen),
        "average": _mean(per_regime[r]["average"] for r in seen),
        "final_unseen": _mean(per_regime[r]["final"] for r in unseen),
        "cw_average_performance": cw_perf["value"],
        "cw_forgetting": cw_forg["value"],
        "cw_forward_transfer": cw_ft["value"] if cw_ft else None,
        "forgetting_all_visits": _mean(per_regime[r]["forgetting_all_visits"] for r in run.regimes),
        "forgetting_last_visit": _mean(per_regime[r]["forgetting_last_visit"] for r in run.regimes),
        "forgetting_from_best": _mean(per_regime[r]["forgetting_from_best"] for r in run.regimes),
        "transfer_zero_shot": _mean(per_regime[r]["transfer_zero_shot"] for r in run.regimes),
        "transfer_reference": _mean(per_regime[r]["transfer_reference"] for r in run.regimes),
        "plasticity": _mean(g["gain"] for g in gains),
        "plasticity_by_visit": by_visit,
    }
    return {
        "run_dir": os.path.abspath(run.run_dir), "run": run.name, "method": method_label(run.config),
        "normalize": norm.mode, "plasticity_window": plasticity_window, "end_step": run.end_step,
        "visits": [dataclasses.asdict(v) for v in run.visits], "summary": summary, "regimes": per_regime,
        "forgetting_matrix": forgetting_entries, "transfer_matrix": transfer_entries, "plasticity": gains,
        "cw": {"reading": cw_reading, "n_last": cw_last, "source": cw.CW_SOURCE, "forgetting": cw_forg["entries"],
               "forward_transfer": cw_ft["entries"] if cw_ft else None},
    }


def compute_run_metrics(run_dir: str, write: bool = True, **kwargs: Any) -> dict:
    """metrics.json of one run (raw returns), as written at the end of training."""
    run = load_run(run_dir)
    result = run_metrics(run, **kwargs)
    if write:
        _write_json(os.path.join(run_dir, METRICS_FILE), result)
    return result


def _write_json(path: str, data: Any) -> None:
    atomic_write_json(path, data, default=lambda x: None)


# ---------------------------------------------------------------------------------------------------------------------
# several runs: groups, confidence intervals
# ---------------------------------------------------------------------------------------------------------------------

def t_quantile_975(df: int) -> float:
    """Two-sided 95% Student-t critical value."""
    from scipy import stats

    return float(stats.t.ppf(0.975, df)) if df >= 1 else float("nan")


def mean_ci(values: Iterable[Optional[float]]) -> dict:
    """mean, 95% CI half-width (t-distribution; None for one value) and n of the non-missing values."""
    xs = [float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not xs:
        return {"mean": None, "ci95": None, "n": 0}
    if len(xs) == 1:
        return {"mean": xs[0], "ci95": None, "n": 1}
    sd = float(np.std(xs, ddof=1))
    return {"mean": float(np.mean(xs)), "ci95": t_quantile_975(len(xs) - 1) * sd / math.sqrt(len(xs)), "n": len(xs)}


# --- robust statistics over runs x tasks (Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice") ---
# Scores: one matrix per method, runs x tasks, a task being a regime and the score its per-regime metric (final or
# average). The point estimates are rliable's own functions; the stratified bootstrap (runs resampled with
# replacement within each task, percentile intervals) is rliable's StratifiedBootstrap written out here, because
# rliable.library imports `arch`, which does not import next to pandas 3.

ROBUST_KEYS = ("final", "average")
COLLAPSED_ENTROPY = 0.01  # nats: a policy this close to deterministic has collapsed (uniform over 3 actions: 1.10)


def collapsed_share(entropies: Iterable[float]) -> Optional[float]:
    """The share of updates whose policy entropy is below COLLAPSED_ENTROPY (a policy collapse, Dohare et al. 2023:
    every gradient vanishes); None without entropies."""
    es = list(entropies)
    return float(np.mean([e < COLLAPSED_ENTROPY for e in es])) if es else None


def stratified_bootstrap(scores: np.ndarray, statistic, reps: int = 2000, seed: int = 0, alpha: float = 0.05
                         ) -> tuple[float, float]:
    """Percentile (1 - alpha) interval of statistic(scores) under resampling the runs of each task (column)
    independently."""
    rng = np.random.default_rng(seed)
    n, k = scores.shape
    cols = np.arange(k)
    stats_ = np.empty(reps)
    for b in range(reps):
        rows = rng.integers(0, n, size=(n, k))
        stats_[b] = statistic(scores[rows, cols])
    lo, hi = np.percentile(stats_, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def bootstrap_mean(values: Iterable[Optional[float]], reps: int = 2000, seed: int = 0, alpha: float = 0.05) -> dict:
    """{mean, ci95: [lo, hi], n} of the finite values, the interval `stratified_bootstrap`'s with one task (runs
    resampled); one value: lo = hi = mean; none: mean and ci95 None."""
    xs = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    if xs.size == 0:
        return {"mean": None, "ci95": None, "n": 0}
    m = float(xs.mean())
    if xs.size == 1:
        return {"mean": m, "ci95": [m, m], "n": 1}
    lo, hi = stratified_bootstrap(xs[:, None], np.mean, reps, seed, alpha)
    return {"mean": m, "ci95": [lo, hi], "n": int(xs.size)}


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """rliable's probability of improvement of X over Y (runs x tasks matrices): per task P(X > Y) + P(X = Y) / 2 over
    all run pairs, averaged over tasks. The same number as `rliable.metrics.probability_of_improvement` (its
    Mann-Whitney U / (n_x n_y) is that count), by broadcasting instead of one scipy call per task, which made the
    bootstraps of a report take minutes; a task with a NaN score gives NaN, as scipy does."""
    x = np.asarray(x, dtype=np.float64)[:, None, :]
    y = np.asarray(y, dtype=np.float64)[None, :, :]
    per_task = ((x > y) + 0.5 * (x == y)).mean(axis=(0, 1))
    per_task[np.isnan(x).any(axis=(0, 1)) | np.isnan(y).any(axis=(0, 1))] = np.nan
    return float(per_task.mean())


def paired_bootstrap(x: np.ndarray, y: np.ndarray, statistic, reps: int = 2000, seed: int = 0, alpha: float = 0.05
                     ) -> tuple[float, float]:
    """The same for a statistic of two methods' score matrices, each resampled within its tasks."""
    rng = np.random.default_rng(seed)
    cols = np.arange(x.shape[1])
    stats_ = np.empty(reps)
    for b in range(reps):
        stats_[b] = statistic(x[rng.integers(0, x.shape[0], size=x.shape), cols],
                              y[rng.integers(0, y.shape[0], size=y.shape), cols])
    lo, hi = np.percentile(stats_, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def score_matrices(results: Sequence[dict], configs: Sequence[dict], key: str = "final",
                   group_by: Optional[Sequence[str]] = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """method -> runs x tasks matrix of the per-regime `key`, over the trained regimes every run has a value for."""
    groups = group_runs(results, configs, group_by)
    tasks = None
    for r in results:
        have = [reg for reg, m in r["regimes"].items() if m.get("trained") and m.get(key) is not None]
        tasks = have if tasks is None else [t for t in tasks if t in have]
    tasks = tasks or []
    return {g: np.array([[r["regimes"][t][key] for t in tasks] for r in rs], dtype=np.float64)
            for g, rs in groups.items()}, tasks


def performance_profile(scores: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """Fraction of (run, task) scores above each threshold tau (rliable's run-score distribution)."""
    return np.array([(scores > t).mean() for t in taus])


def robust_aggregate(results: Sequence[dict], configs: Sequence[dict], group_by: Optional[Sequence[str]] = None,
                     reps: int = 2000, seed: int = 0, gamma: Optional[float] = None) -> dict:
    """Per method and key (final, average): IQM, mean, median and optimality gap (at `gamma`, on normalised scores)
    with stratified-bootstrap 95% CIs; the probability that each method improves on each other one; performance
    profiles."""
    from rliable import metrics as rl

    out: dict = {"reps": reps, "seed": seed, "gamma": gamma, "keys": {}}
    for key in ROBUST_KEYS:
        mats, tasks = score_matrices(results, configs, key, group_by)
        if not tasks:
            continue
        stats_: dict[str, Any] = {"iqm": rl.aggregate_iqm, "mean": rl.aggregate_mean, "median": rl.aggregate_median}
        if gamma is not None:
            stats_["optimality_gap"] = lambda s: rl.aggregate_optimality_gap(s, gamma)
        methods = {}
        for g, m in mats.items():
            methods[g] = {"runs": int(m.shape[0])}
            for name, f in stats_.items():
                lo, hi = stratified_bootstrap(m, f, reps, seed)
                methods[g][name] = {"estimate": float(f(m)), "ci95": [lo, hi]}
        improvement = {}
        names = list(mats)
        for a in names:
            for b in names:
                if a != b:
                    x, y = mats[a], mats[b]
                    lo, hi = paired_bootstrap(x, y, probability_of_improvement, reps, seed)
                    improvement[f"{a} > {b}"] = {"estimate": probability_of_improvement(x, y),
                                                 "ci95": [lo, hi]}
        allv = np.concatenate([m.ravel() for m in mats.values()])
        taus = np.linspace(float(allv.min()), float(allv.max()), 51) if allv.size else np.zeros(0)
        profiles = {g: performance_profile(m, taus).tolist() for g, m in mats.items()}
        out["keys"][key] = {"tasks": tasks, "methods": methods, "probability_of_improvement": improvement,
                            "profile_taus": taus.tolist(), "profiles": profiles}
    return out


def method_label(config: dict, group_by: Optional[Sequence[str]] = None) -> str:
    """The group of a run: the given config.json keys; else its exp_name (CleanRL's and openrlbenchmark's grouping:
    the launcher names each run after its arm, so arms of one architecture stay apart); else architecture (+S&P,
    +opt reset)."""
    if group_by:
        return ", ".join(f"{k}={config.get(k)}" for k in group_by)
    if config.get("exp_name"):
        return str(config["exp_name"])
    label = str(config.get("architecture") or "?")
    if config.get("shrink_and_perturb"):
        label += "+S&P"
    if config.get("reset_optimizer_on_switch"):
        label += "+opt-reset"
    return label


def group_runs(items: Sequence[T], configs: Sequence[dict], group_by: Optional[Sequence[str]] = None
               ) -> dict[str, list[T]]:
    """The items (runs, their results, their configs) by `method_label` of their configs, groups in first-seen
    order: the one grouping every table, test and plot of a method uses."""
    groups: dict[str, list[T]] = {}
    for item, cfg in zip(items, configs, strict=True):
        groups.setdefault(method_label(cfg, group_by), []).append(item)
    return groups


# config.json keys that name, place or time a run, or only change what it writes: the runs of one method differ in them
RUN_BOOKKEEPING = frozenset({
    "seed", "run_name", "runs_dir", "config", "resume", "code_revision", "verbose", "progress_bar", "track",
    "wandb_project_name", "wandb_entity", "wandb_dir", "wandb_group", "wandb_tags", "checkpoint_every",
    "checkpoint_minutes", "keep_checkpoints", "capture_video", "video_every", "save_agent_with_switch",
    "save_agent_wandb", "metrics", "plots"})


def mixed_groups(configs: Sequence[dict], group_by: Optional[Sequence[str]] = None) -> dict[str, list[str]]:
    """Per group, the config.json keys (but RUN_BOOKKEEPING) in which its runs differ: a grouping that averages
    configurations the runs keep apart (e.g. plasticity arms that set no exp_name, grouped by architecture)."""
    out = {}
    for label, cfgs in group_runs(configs, configs, group_by).items():
        keys = sorted({k for c in cfgs for k in c} - RUN_BOOKKEEPING)
        differ = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in cfgs}) > 1]
        if differ:
            out[label] = differ
    return out


def warn_mixed_groups(configs: Sequence[dict], group_by: Optional[Sequence[str]] = None) -> None:
    for label, keys in mixed_groups(configs, group_by).items():
        shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
        print(f"warning: the group {label!r} averages runs whose configurations differ in {shown}; "
              f"--group_by KEY[,KEY] keeps them apart", file=sys.stderr)


def aggregate(results: Sequence[dict], configs: Sequence[dict], group_by: Optional[Sequence[str]] = None) -> dict:
    """Group per-run results; every summary scalar and per-regime metric as mean +- 95% CI over the group's runs."""
    out = {}
    for label, rs in group_runs(results, configs, group_by).items():
        summary = {k: mean_ci(r["summary"].get(k) for r in rs) for k in SUMMARY_KEYS}
        visits = sorted({n for r in rs for n in r["summary"]["plasticity_by_visit"]}, key=int)
        summary["plasticity_by_visit"] = {n: mean_ci(r["summary"]["plasticity_by_visit"].get(n) for r in rs)
                                          for n in visits}
        regimes: dict[str, dict] = {}
        for r in rs:
            for reg in r["regimes"]:
                regimes.setdefault(reg, {})
        for reg in regimes:
            regimes[reg] = {k: mean_ci(r["regimes"].get(reg, {}).get(k) for r in rs) for k in REGIME_KEYS}
        out[label] = {"runs": [r["run_dir"] for r in rs], "summary": summary, "regimes": regimes}
    return out


def cora_by_method(runs: Sequence[RunData], group_by: Optional[Sequence[str]] = None, rolling_mean_count: int = 20,
                   num_cycles_for_forgetting: int = 1, metric_scale: float = 1.0) -> dict[str, dict]:
    """CORA's forgetting and zero-shot transfer (`cora.cora_metrics`) per method (the groups of `aggregate`), each
    method's runs together (they set its scale); raw returns. A method whose schedule is not N tasks repeated in one
    order gets {"error": why}."""
    out: dict[str, dict] = {}
    for label, rs in group_runs(runs, [r.config for r in runs], group_by).items():
        try:
            out[label] = cora.cora_metrics(rs, rolling_mean_count, num_cycles_for_forgetting, metric_scale)
        except ValueError as e:
            out[label] = {"error": str(e)}
    return out


# ---------------------------------------------------------------------------------------------------------------------
# printing
# ---------------------------------------------------------------------------------------------------------------------


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def _fmt_ci(d: dict) -> str:
    if d["mean"] is None:
        return "-"
    return f"{d['mean']:.3g} ± {d['ci95']:.2g} ({d['n']})" if d["ci95"] is not None else f"{d['mean']:.3g} (1)"


def print_run_table(result: dict) -> None:
    cols = ["regime", "visits", "final", "average", "CW final", "CW forget", "CW FT", "forget (all visits)",
            "forget (last visit)", "forget (best)", "ZS transfer", "FT (ref, trapezoid)"]
    rows = []
    for reg, m in result["regimes"].items():
        name = (reg or "(none)") + (" [held-out]" if m["heldout"] else "")
        rows.append([name, str(m["visits"]), *(_fmt(m[k]) for k in REGIME_KEYS)])
    s = result["summary"]
    rows.append(["mean (trained regimes)", "", *(_fmt(s[{"cw_final": "cw_average_performance"}.get(k, k)])
                                                 for k in REGIME_KEYS)])
    print_table(f"{result['run']} ({result['method']}, {result['normalize']}; CW reading {result['cw']['reading']}, "
                f"last {result['cw']['n_last']} evaluations)", cols, rows, width=max(120, 16 * len(cols)))
    gains = s["plasticity_by_visit"]
    if gains and all(g is None for g in gains.values()):
        print("plasticity: no visit has training episodes in both halves of its window (games outlast the visits, "
              "or set --plasticity_window)")
    elif gains:
        print("plasticity (return gained within the window, by visit number): "
              + ", ".join(f"visit {n}: {_fmt(g)}" for n, g in gains.items()) + f"; overall {_fmt(s['plasticity'])}")


def _fmt_interval(d: Optional[dict]) -> str:
    if not d:
        return "-"
    lo, hi = d["ci95"]
    return f"{d['estimate']:.3g} [{lo:.3g}, {hi:.3g}]"


def print_robust_table(robust: dict) -> None:
    for key, k in robust["keys"].items():
        cols = ["method", "runs", "IQM", "mean", "median", "optimality gap"]
        rows = [[g, str(m["runs"]), *(_fmt_interval(m.get(s)) for s in ("iqm", "mean", "median", "optimality_gap"))]
                for g, m in k["methods"].items()]
        print_table(f"{key} (per regime, {len(k['tasks'])} regime(s)): point estimate [95% stratified bootstrap CI, "
                    f"{robust['reps']} resamples]", cols, rows, width=max(120, 22 * len(cols)))
        if k["probability_of_improvement"]:
            print(f"probability of improvement ({key}): " + "; ".join(
                f"P({pair}) = {_fmt_interval(d)}" for pair, d in k["probability_of_improvement"].items()))


def print_group_table(groups: dict) -> None:
    cols = ["method", "final", "average", "final (unseen)", "CW P(T)", "CW forget", "CW FT", "forget (all visits)",
            "forget (last visit)", "forget (best)", "ZS transfer", "FT (ref, trapezoid)", "plasticity"]
    rows = [[label, *(_fmt_ci(g["summary"][k]) for k in SUMMARY_KEYS)] for label, g in groups.items()]
    print_table("methods: mean ± 95% CI (runs)", cols, rows, width=max(120, 16 * len(cols)))


def _fmt_sem(d: dict) -> str:
    if d.get("mean") is None:
        return "-"
    return f"{d['mean']:.3g} ± {d['sem']:.2g} ({d['n']})" if d.get("sem") is not None else f"{d['mean']:.3g} (1)"


def print_cora_table(by_method: dict) -> None:
    for label, m in by_method.items():
        if "error" in m:
            print(f"CORA's metrics, {label}: not computed ({m['error']})")
            continue
        f, t = m["forgetting"], m["transfer"]
        st = f["settings"]
        cols = ["task", "forgetting", "zero-shot transfer", "scale (max |smoothed return|)"]
        rows = [[task or "(none)", _fmt_sem(f["by_task"].get(task, {})), _fmt_sem(t["by_task"].get(task, {})),
                 f"{f['scales'][task]:.4g}"] for task in f["tasks"]]
        rows.append(["all (per-run means)", _fmt_sem(f["overall"]), _fmt_sem(t["overall"]), ""])
        print_table(f"CORA's metrics, {label} ({len(f['runs'])} run{'s' * (len(f['runs']) != 1)}; window "
                    f"{st['rolling_mean_count']}, "
                    f"{st['num_cycles_for_forgetting']} cycle(s), x{st['metric_scale']:g}): mean ± SEM (runs)", cols,
                    rows, width=120)


# ---------------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class MetricsArgs:
    run_dirs: tyro.conf.Positional[list[str]]
    """run directories (with eval_table.csv from --eval_every)"""
    reference: Optional[list[str]] = None
    """reference run directories (e.g. one single-regime run per regime) for the Continual World forward transfer"""
    normalize: str = "raw"
    """raw | max_abs (R / max|R| per regime over all runs given) | reference_scores (needs --scores)"""
    scores: Optional[str] = None
    """reference scores: a JSON file or inline JSON object, regime -> score or [low, high]"""
    plasticity_window: Optional[int] = None
    """steps from the start of each visit used for the plasticity gain (default: the whole visit)"""
    group_by: Optional[str] = None
    """comma-separated config.json keys that define a method (default: exp_name where set, else architecture,
    + S&P)"""
    out: Optional[str] = None
    """write the results here (JSON); default: RUN_DIR/metrics.json for a single run, nothing for several"""
    bootstrap_reps: int = 2000
    """resamples of the stratified bootstrap behind the robust statistics of several runs (IQM, optimality gap,
    probability of improvement)"""
    bootstrap_seed: int = 0
    """seed of the bootstrap resampling"""
    cw_reading: str = cw.DEFAULT_READING
    """Continual World's metrics with repeated visits: per_visit (CW20's: every visit, averaged) | last (the end of a
    regime's last visit) | first (its first visit)"""
    cw_last: int = cw.CW_LAST_EVALUATIONS
    """Continual World: each performance value is the mean of this many last evaluations"""
    cora_rolling_mean_count: int = 20
    """CORA: trailing running mean over this many evaluation points (CORA: 20 for Atari, Procgen, MiniHack; 5 CHORES)"""
    cora_cycles: int = 1
    """CORA: num_cycles_for_forgetting (CORA: 1)"""
    cora_metric_scale: float = 1.0
    """CORA: multiply its metrics by this (CORA's tables: 10)"""


def _load_scores(text: Optional[str]) -> Optional[dict]:
    if text is None:
        return None
    try:
        data = json.load(open(text)) if os.path.exists(text) else json.loads(text)
    except (OSError, ValueError) as e:
        raise UserError(f"scores: neither a readable JSON file nor a JSON object: {e}") from None
    if not isinstance(data, dict):
        raise UserError("scores: expected a JSON object regime -> score or [low, high]")
    return data


def main(argv: Optional[Sequence[str]] = None) -> dict:

    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(MetricsArgs, argv, default=None, description=__doc__.splitlines()[0])
    if args.normalize not in ("raw", "max_abs", "reference_scores"):
        raise UserError(f"normalize: must be raw, max_abs or reference_scores, got {args.normalize!r}")
    if args.bootstrap_reps < 1:
        raise UserError(f"bootstrap_reps: must be positive, got {args.bootstrap_reps}")
    if args.plasticity_window is not None and args.plasticity_window <= 0:
        raise UserError(f"plasticity_window: must be positive, got {args.plasticity_window}")
    if args.cw_reading not in cw.READINGS:
        raise UserError(f"cw_reading: must be one of {', '.join(cw.READINGS)}, got {args.cw_reading!r}")
    for name in ("cw_last", "cora_rolling_mean_count", "cora_cycles"):
        if getattr(args, name) < 1:
            raise UserError(f"{name}: must be positive, got {getattr(args, name)}")
    try:
        runs = [load_run(d) for d in args.run_dirs]
        refs = [load_run(d) for d in (args.reference or [])]
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise UserError(str(e)) from None
    for r in runs:
        if not r.evals:
            raise UserError(f"{r.run_dir}: no evaluation table (train with --eval_every N or --eval_at_switches)")
    try:
        norm = Normalizer(args.normalize, _load_scores(args.scores), runs=[*runs, *refs])
    except ValueError as e:
        raise UserError(str(e)) from None
    results = [run_metrics(r, norm, refs, args.plasticity_window, args.cw_reading, args.cw_last) for r in runs]
    group_by = [k.strip() for k in args.group_by.split(",")] if args.group_by else None
    for res in results:
        print_run_table(res)
    out: dict = {"runs": results}
    out["cora"] = cora_by_method(runs, group_by, args.cora_rolling_mean_count, args.cora_cycles,
                                 args.cora_metric_scale)
    print_cora_table(out["cora"])
    if len(runs) > 1:
        warn_mixed_groups([r.config for r in runs], group_by)
        out["groups"] = aggregate(results, [r.config for r in runs], group_by)
        print_group_table(out["groups"])
        out["robust"] = robust_aggregate(results, [r.config for r in runs], group_by, args.bootstrap_reps,
                                         args.bootstrap_seed, gamma=None if args.normalize == "raw" else 1.0)
        print_robust_table(out["robust"])
    path = args.out or (os.path.join(runs[0].run_dir, METRICS_FILE) if len(runs) == 1 else None)
    if path:
        _write_json(path, {**results[0], "cora": out["cora"]} if len(runs) == 1 and not args.out else out)
        print(f"wrote {path}")
    return out


if __name__ == "__main__":
    from continual.errors import exit_on_user_error

    exit_on_user_error(main)()
