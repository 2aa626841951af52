"""Loss-of-plasticity report (configs/experiments/plasticity_minatar.json): per method, how much worse plain and
remedied PPO learn the late regimes of a long permuted-MinAtar sequence than the early ones, and than a fresh network.

    python -m continual.report plasticity EXPERIMENT_FOLDER --out DIR [--early 3 --late 5] [--experiment FILE]
    python -m continual.report plasticity --from-report bench/results/plasticity_minatar/report.json --out DIR

The second form rebuilds everything from the per-run records a report.json keeps (its "runs" list): every statistic
below is computed from those records alone, so the table is the one the run folder would give. The records are
kept unchanged (and their sha256, `runs_sha256`, is checked when the file has one); with other --early/--late the
windowed fields are recomputed from the records' per-regime lists.

Per run (fixed before any run of the experiment, except where marked):
- regime return: the mean return of the training episodes (the sampling policy) that end inside a regime's visit,
  (start, end], i.e. the area under the regime's learning curve: it falls when a network learns a new regime more
  slowly or to a lower level. `final quarter`: the same over the visit's last 25% of steps.
- early = mean regime return of the first `--early` regimes (the first is learned from a fresh network), late = mean of
  the last `--late` regimes; drop = early - late (> 0: late regimes are learned worse: loss of plasticity), and the
  relative drop, drop / early. Defaults 3 and 5: for the experiment's 10 regimes, the first 3 against the second half
  (set before the experiment's runs, after the pilots, where plain PPO's collapse and recovery fell at different
  regimes from run to run, so the last 3 alone depended on where a recovery fell; the pilots used 3 and 3).
- sensitivity (added after PPO and PPO_fresh ran, a second weighting of the same episodes, not the statistic the
  conclusions use): the time-average regime return, the mean over TIME_BINS equal parts of a visit of the episodes
  ending in each part. The episode average weights a regime's failing start (many short episodes) more than its
  learned end (few long ones); the time average weights each part of the visit the same.
- policy collapse (added after the pilots): the share of PPO updates (iteration records) whose policy entropy
  `losses/entropy` is below COLLAPSED_ENTROPY, where the policy is deterministic, every gradient vanishes and the
  regime cannot be learned.
- diagnostics (`plasticity/*` records at every switch): dormant fraction (all hidden units), effective rank of the
  penultimate features, the weight norm (the root sum of squares of the per-layer norms), at the first and at the
  last record (the last switch, unless the run logs them every --diagnostics_every steps).
- TRAC (runs that log `plasticity/trac_scale`, from e77a843 on): its scale S at the end of each regime (median over
  seeds) and the share of iterations that ended with S = 0.

Statistics (continual.evaluation.statistics; the run, i.e. the seed, is the unit):
- per method, every quantity: the mean over its seeds with a 95% Student-t interval (`statistics.interval`);
- against PPO and PPO_fresh (a fresh network every regime: the level a remedy that fully restores plasticity
  reaches; these comparisons were added when PPO and PPO_fresh had finished and 2 of the 60 remedy runs then
  planned, PPO_NSAdam seeds 1-2): the difference of the means (late, drop, time-average late) with a 95% Welch
  interval (`statistics.welch_interval`); P(late > baseline), rliable's probability of improvement on the late
  returns, with its run-level 95% BCa bootstrap interval (`statistics.probability_of_improvement_interval`: both
  methods' seeds resampled; none when every resample gives the same value, as when every run of one method is above
  every run of the other) and beside it the exact one-sided Mann-Whitney p-value of the same comparison
  (`statistics.mann_whitney`, H1: the method's late returns are higher).

Labels (from the experiment file: --experiment, else the folder's experiment.json, else the one named in the stored
report's args, else the stored report's own lists): "post_hoc" or "_post_hoc" lists the arms added after the first
results ({label, reason, added}: continual/launch/declarations.py's form; the launcher accepts "post_hoc" only where
every entry has its own exp_name, which plasticity_minatar.json's entries do not), marked † in every table and
figure; "_defaults_chosen_here" lists flag defaults chosen from this experiment's results on its reporting seeds
({flag, value, label, set, reason}), marked ‡.

Runs are grouped by method: the run directory name's "NNN_seed=S_<method>" or "NNN_<method>_seed=S" (the launcher's
naming for a grid of seeds and named flag sets), else the config's architecture (+S&P). Unfinished runs are listed
and left out. Writes report.md, report.json (the arguments, the labels, the table, the runs' sha256 and the per-run
records), regimes.png (regime return per regime, one panel per method beside PPO and PPO_fresh, mean and t band),
drop.png (the drop per method with t intervals) and diagnostics.png.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
from typing import Any, Optional, Sequence

import numpy as np

from continual.errors import UserError
from continual.evaluation import statistics
from continual.evaluation.metrics import (
    COLLAPSED_ENTROPY,
    collapsed_share,
    load_run,
    method_label,
    provenance,
    provenance_lines,
)
from continual.io import jsonl_file
from continual.launch.declarations import POST_HOC_MARK
from continual.launch.queue import run_dirs

# the launcher's entry names for a grid of named flag sets and seeds, in either key order
RUN_NAMES = (re.compile(r"^\d+_seed=(?P<seed>\d+)_(?P<method>.+)$"), re.compile(r"^\d+_(?P<method>.+)_seed=(?P<seed>\d+)$"))
DIAGNOSTICS = ("dormant", "effective_rank", "weight_norm")
TIME_BINS = 10  # the time-average regime return: the mean over this many equal parts of a visit
BASELINES = ("PPO", "PPO_fresh")  # plain PPO, and a fresh network every regime: the from-scratch level
EARLY, LATE = 3, 5
CHOSEN_MARK = "\u2021"  # ‡ beside a default chosen here; † (POST_HOC_MARK) is the launcher's, beside a post-hoc arm
# the per-run quantities that get a t interval per method
QUANTITIES = ("early", "late", "drop", "relative_drop", "early_final_quarter", "late_final_quarter", "collapsed",
              "early_time_average", "late_time_average", "drop_time_average")
DIFFERENCES = ("late", "drop", "late_time_average")  # mean(method) - mean(baseline), Welch
STATISTICS_TEXT = ("per method: mean over seeds [95% Student-t interval]; against a baseline: difference of means "
                   "[95% Welch interval]; P(late > baseline): probability of improvement [95% run-level BCa "
                   "bootstrap interval] with the exact one-sided Mann-Whitney p")


def parse_run_name(name: str) -> Optional[tuple[str, int]]:
    """'003_seed=2_PPO_ReDo' or '003_PPO_ReDo_seed=2' -> ('PPO_ReDo', 2); None for other names."""
    for pattern in RUN_NAMES:
        m = pattern.match(name)
        if m:
            return m.group("method"), int(m.group("seed"))
    return None


def _mean(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return float(np.mean(xs)) if xs else None


def weight_norm(record: dict) -> float:
    return math.sqrt(sum(v * v for k, v in record.items() if k.startswith("plasticity/weight_norm/")))


# ---------------------------------------------------------------------------------------------------------------------
# per run
# ---------------------------------------------------------------------------------------------------------------------


def windows(run: dict, early: int, late: int) -> dict:
    """The early/late fields of a run record, from its per-regime lists (empty when it has fewer than early + late
    regimes)."""
    regimes, finals, timed = run["regimes"], run["final_quarter"], run["time_average"]
    if len(regimes) < early + late:
        return {}
    out: dict[str, Any] = {"early": _mean(regimes[:early]), "late": _mean(regimes[-late:])}
    out["drop"] = None if out["early"] is None or out["late"] is None else out["early"] - out["late"]
    out["relative_drop"] = None if not out["early"] or out["drop"] is None else out["drop"] / abs(out["early"])
    out["late_final_quarter"] = _mean(finals[-late:])
    out["early_final_quarter"] = _mean(finals[:early])
    out["late_time_average"] = _mean(timed[-late:])
    out["early_time_average"] = _mean(timed[:early])
    out["drop_time_average"] = (None if out["early_time_average"] is None or out["late_time_average"] is None
                                else out["early_time_average"] - out["late_time_average"])
    return out


def run_summary(run_dir: str, early: int, late: int) -> Optional[dict]:
    """Per-regime returns and diagnostics of one run directory (None: not a run or no episodes yet)."""
    if jsonl_file(os.path.join(run_dir, "metrics.jsonl")) is None:
        return None
    run = load_run(run_dir)
    if not run.episodes or not run.visits:
        return None
    name = os.path.basename(os.path.normpath(run_dir))
    parsed = parse_run_name(name)
    method, seed = parsed if parsed else (method_label(run.config), run.config.get("seed"))
    total = int(run.config.get("resolved_total_timesteps") or run.config.get("total_timesteps") or 0)
    switches = run.config.get("modification_factory_kwargs", {}).get("switching_thresholds") or []
    n_regimes = len(switches) + 1
    regimes, finals, timed = [], [], []
    for v in run.visits:
        rets = [(s, r) for s, reg, r in run.episodes if reg == v.regime and v.start < s <= v.end]
        regimes.append(_mean(r for _, r in rets))
        finals.append(_mean(r for s, r in rets if s > v.end - (v.end - v.start) / 4))
        width = (v.end - v.start) / TIME_BINS
        timed.append(_mean(_mean(r for s, r in rets if v.start + b * width < s <= v.start + (b + 1) * width)
                           for b in range(TIME_BINS)))
    done = run.end_step >= total and len(run.visits) >= n_regimes
    out = {"run": name, "method": method, "seed": seed, "steps": run.end_step, "total": total, "done": done,
           "regimes": regimes, "final_quarter": finals, "time_average": timed,
           "visits": [(v.regime, v.start, v.end) for v in run.visits], "starts": run.starts}
    out.update(windows(out, early, late))
    out["collapsed"] = collapsed_share(r["losses/entropy"] for r in run.iterations
                                       if r.get("losses/entropy") is not None)
    scales = [(r["global_step"], r["plasticity/trac_scale"]) for r in run.iterations if "plasticity/trac_scale" in r]
    if scales:  # TRAC: its scale S at the end of each regime, and how often it sat at 0 (weights at the initial ones)
        out["trac_scale_end"] = [next((x for s, x in reversed(scales) if v.start < s <= v.end), None)
                                 for v in run.visits]
        out["trac_scale_zero"] = sum(x == 0.0 for _, x in scales) / len(scales)
    recs = sorted(run.plasticity, key=lambda r: r["global_step"])
    out["diagnostics"] = [{"step": r["global_step"], "dormant": r.get("plasticity/dormant_fraction/all"),
                           "effective_rank": r.get("plasticity/effective_rank"), "weight_norm": weight_norm(r)}
                          for r in recs]
    return out


# ---------------------------------------------------------------------------------------------------------------------
# inputs: an experiment folder, or a stored report's records; the experiment file's labels
# ---------------------------------------------------------------------------------------------------------------------


def check_windows(early: int, late: int) -> None:
    if early < 1 or late < 1:
        raise UserError("--early and --late must be at least 1")


def load_folder(folder: str, early: int, late: int) -> list[dict]:
    runs_root = os.path.join(folder, "runs")
    if not os.path.isdir(runs_root):
        raise UserError(f"{folder}: no runs/ folder (is it an experiment folder?)")
    runs = [s for s in (run_summary(d, early, late) for d in run_dirs(folder)) if s]
    if not runs:
        raise UserError(f"{runs_root}: no run with training episodes yet")
    return runs


RECORD_KEYS = ("run", "method", "seed", "done", "regimes", "final_quarter", "time_average", "diagnostics")


def runs_digest(runs: list[dict]) -> str:
    """sha256 of the per-run records (canonical JSON: sorted keys, no spaces)."""
    text = json.dumps(runs, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_report(path: str) -> dict:
    """A stored report.json with its per-run records, checked: readable, a "runs" list of plasticity run records,
    and, when it has one, the records' sha256."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file (give a report.json written by this report)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e})") from None
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) and all(k in r for k in RECORD_KEYS)
                                                          for r in runs):
        raise UserError(f"{path}: no per-run records (a 'runs' list with {', '.join(RECORD_KEYS)}): not a plasticity "
                        f"report.json")
    digest = data.get("runs_sha256")
    if digest is not None and digest != runs_digest(runs):
        raise UserError(f"{path}: the per-run records do not match its runs_sha256 (edited after the report was "
                        f"written?)")
    return data


def read_labels(path: str) -> dict:
    """The post-hoc arms and the defaults chosen from this experiment, from an experiment file:
    {"post_hoc": [{label, reason, added}], "defaults_chosen_here": [{flag, value, label, set, reason}]}."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such experiment file")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e})") from None
    post = data.get("post_hoc", data.get("_post_hoc", []))
    chosen = data.get("defaults_chosen_here", data.get("_defaults_chosen_here", []))
    if not isinstance(post, list) or not isinstance(chosen, list):
        raise UserError(f"{path}: post_hoc and _defaults_chosen_here must be lists")
    items = []
    for i, item in enumerate(post):
        item = {"label": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("label"), str):
            raise UserError(f"{path}: post_hoc[{i}] must be a label or an object {{label, reason, added}}")
        items.append(item)
    for i, item in enumerate(chosen):
        if not isinstance(item, dict) or not isinstance(item.get("label"), str) or "flag" not in item:
            raise UserError(f"{path}: _defaults_chosen_here[{i}] must be an object {{flag, value, label, set, reason}}")
    return {"experiment": path, "post_hoc": items, "defaults_chosen_here": list(chosen)}


# ---------------------------------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------------------------------


def _values(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def summarize(runs: list[dict], baselines: tuple[str, ...] = BASELINES) -> dict:
    """Per method (finished runs with an early/late window): every quantity's mean with its t interval and per-seed
    values, the diagnostics' means, and the comparisons with each baseline that has runs."""
    methods: dict[str, list[dict]] = {}
    for r in runs:
        if r["done"] and "drop" in r:
            methods.setdefault(r["method"], []).append(r)
    table = {}
    for method, rs in methods.items():
        rs = sorted(rs, key=lambda r: (r["seed"] is None, r["seed"]))
        methods[method] = rs
        row: dict[str, Any] = {"n": len(rs), "seeds": [r["seed"] for r in rs]}
        for key in QUANTITIES:
            per_seed = [r.get(key) for r in rs]
            row[key] = {**statistics.interval(_values(per_seed)).as_dict(), "per_seed": per_seed}
        if all("trac_scale_end" in r for r in rs):
            ends = np.array([[np.nan if x is None else x for x in r["trac_scale_end"]] for r in rs], dtype=np.float64)
            row["trac_scale_end_median"] = [float(x) for x in np.nanmedian(ends, axis=0)]
            row["trac_scale_zero"] = [r["trac_scale_zero"] for r in rs]
        for diag in DIAGNOSTICS:
            first = [r["diagnostics"][0][diag] for r in rs if r["diagnostics"]]
            last = [r["diagnostics"][-1][diag] for r in rs if r["diagnostics"]]
            row[f"{diag}_first_switch"], row[f"{diag}_end"] = _mean(first), _mean(last)
        table[method] = row
    for method, row in table.items():
        for baseline in baselines:
            if baseline not in methods or method == baseline:
                continue
            rs, base = methods[method], methods[baseline]
            for key in DIFFERENCES:
                x, y = _values(r[key] for r in rs), _values(r[key] for r in base)
                row[f"{key}_minus_{baseline}"] = statistics.welch_interval(x, y).as_dict()
            x, y = _values(r["late"] for r in rs), _values(r["late"] for r in base)
            row[f"p_late_above_{baseline}"] = {
                **statistics.probability_of_improvement_interval(x, y).as_dict(),
                "mann_whitney": statistics.mann_whitney(x, y, alternative="greater").as_dict()}
    return table


# ---------------------------------------------------------------------------------------------------------------------
# markdown
# ---------------------------------------------------------------------------------------------------------------------


def fmt_ci(d: Optional[dict], digits: int = 2) -> str:
    """'1.64 [1.18, 2.10]'; the estimate alone where there is no interval; '-' without an estimate."""
    if not d or d.get("estimate") is None:
        return "-"
    lo, hi = d.get("ci") or (None, None)
    if lo is None or hi is None:
        return f"{d['estimate']:.{digits}f}"
    return f"{d['estimate']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def fmt_p(d: Optional[dict]) -> str:
    """P(late > baseline) [interval], or '1.00 (every pair)' / '0.00 (no pair)' where no bootstrap interval exists."""
    if not d or d.get("estimate") is None:
        return "-"
    if d["ci"][0] is not None:
        return fmt_ci(d)
    note = {1.0: "every pair", 0.0: "no pair"}.get(d["estimate"], "no interval")
    return f"{d['estimate']:.2f} ({note})"


def fmt_mw(d: Optional[dict]) -> str:
    p = (d or {}).get("mann_whitney", {}).get("p")
    return "-" if p is None else f"{p:.3f}"


def marks(labels: dict) -> dict[str, str]:
    """method -> its marks (' †', ' ‡', ' †‡')."""
    out: dict[str, str] = {}
    for item in labels.get("post_hoc", []):
        out[item["label"]] = out.get(item["label"], "") + POST_HOC_MARK
    for item in labels.get("defaults_chosen_here", []):
        out[item["label"]] = out.get(item["label"], "") + CHOSEN_MARK
    return {m: f" {s}" for m, s in out.items()}


def footnotes(labels: dict, methods: Sequence[str]) -> list[str]:
    lines = []
    post = [i for i in labels.get("post_hoc", []) if i["label"] in methods]
    if post:
        lines += ["", f"{POST_HOC_MARK} Post hoc: added to the experiment after its first results, not part of the "
                  "design fixed before the first run:"]
        lines += [f"- {i['label']}" + (f" (added at {i['added']})" if i.get("added") else "") +
                  (f": {i['reason']}" if i.get("reason") else "") for i in post]
    chosen = [i for i in labels.get("defaults_chosen_here", []) if i["label"] in methods]
    if chosen:
        lines += ["", f"{CHOSEN_MARK} A flag's default chosen from this experiment's results, on the seeds reported "
                  "here (no separate tuning seeds): the arm's numbers are those of the best of the values run, so they "
                  "overstate what the default gives on a new task or new seeds:"]
        lines += [f"- `--{i['flag']}` = {i.get('value')} ({i['label']}" + (f", set at {i['set']}" if i.get("set")
                                                                           else "") + ")" +
                  (f": {i['reason']}" if i.get("reason") else "") for i in chosen]
    return lines


def smallest_p(seeds: Sequence[int]) -> str:
    """'; with 5 seeds each the smallest possible is 1/252 = 0.004' (one seed count for every method), else ''."""
    if len(seeds) != 1 or seeds[0] < 2:
        return ""
    k = math.comb(2 * seeds[0], seeds[0])
    return f"; with {seeds[0]} seeds each the smallest possible is 1/{k} = {1 / k:.3f}"


def markdown(table: dict, runs: list[dict], early: int, late: int, labels: Optional[dict] = None,
             baselines: tuple[str, ...] = BASELINES, source: Optional[list[str]] = None) -> list[str]:
    labels = labels or {}
    mark = marks(labels)
    n_regimes = max((len(r["regimes"]) for r in runs), default=0)
    baselines = tuple(b for b in baselines if b in table)
    versus = "".join(f" late - {b} | P(late > {b}) | p |" for b in baselines)
    seeds = sorted({row["n"] for row in table.values()})
    lines = [f"Regime return = mean training-episode return over a regime's visit; early = regimes 1-{early}, "
             f"late = regimes {n_regimes - late + 1}-{n_regimes} of {n_regimes}; drop = early - late (> 0: late "
             f"regimes learned worse).", "",
             f"Statistics ({'/'.join(map(str, seeds))} seeds per method; the seed is the unit): cells are the mean "
             "over seeds [95% Student-t interval, mean +- t(0.975, n-1) sd / sqrt(n)]. late - B: the difference of "
             "the means [95% Welch interval]. P(late > B): the probability that a run of the method has a higher "
             "late return than a run of B (rliable's probability of improvement) [95% run-level BCa bootstrap "
             f"interval, {statistics.RESAMPLES:,} resamples; 'every pair' / 'no pair' where every run of one is above "
             "every run of the other, so that every resample gives the same value and there is no interval]; p: "
             "the exact one-sided Mann-Whitney p-value of the same comparison (H1: the method's late returns are "
             f"higher{smallest_p(seeds)}). Against PPO_fresh (a fresh network every "
             "regime): a late return at or above it means the method learns the late regimes as well as from "
             "scratch. The comparisons with PPO_fresh were added when PPO and PPO_fresh had finished and 2 remedy "
             "runs.", "",
             f"Collapsed = share of updates with policy entropy < {COLLAPSED_ENTROPY} nats (a share, so its t "
             "interval can reach below 0).", "",
             *(source if source is not None else
               provenance_lines(provenance((r["run"], r.get("starts", [])) for r in runs))), "",
             f"| method | seeds | early | late | drop | drop / early |{versus} "
             "collapsed | dormant (1st -> last switch) | eff. rank (1st -> last switch) | "
             "weight norm (1st -> last switch) |",
             "|---" * (10 + 3 * len(baselines)) + "|"]
    order = list(baselines) + sorted(m for m in table if m not in baselines)

    def arrow(row: dict, key: str, digits: int) -> str:
        a, b = row[f"{key}_first_switch"], row[f"{key}_end"]
        return "-" if a is None or b is None else f"{a:.{digits}f} -> {b:.{digits}f}"

    for method in order:
        row = table[method]
        cells = "".join(f" {fmt_ci(row[f'late_minus_{b}']) if f'late_minus_{b}' in row else ''} |"
                        f" {fmt_p(row[f'p_late_above_{b}']) if f'p_late_above_{b}' in row else ''} |"
                        f" {fmt_mw(row[f'p_late_above_{b}']) if f'p_late_above_{b}' in row else ''} |"
                        for b in baselines)
        lines.append(f"| {method}{mark.get(method, '')} | {row['n']} | {fmt_ci(row['early'])} | "
                     f"{fmt_ci(row['late'])} | {fmt_ci(row['drop'])} | {fmt_ci(row['relative_drop'])} |{cells} "
                     f"{fmt_ci(row['collapsed'])} | {arrow(row, 'dormant', 3)} | "
                     f"{arrow(row, 'effective_rank', 1)} | {arrow(row, 'weight_norm', 1)} |")
    lines += footnotes(labels, order)
    fresh = "PPO_fresh" if "PPO_fresh" in baselines else None
    lines += ["", "End of a regime: the mean return of the episodes ending in the last quarter of each visit, early "
              "and late regimes [95% t interval].", "",
              "| method | early, last quarter | late, last quarter |", "|---|---|---|"]
    for method in order:
        row = table[method]
        lines.append(f"| {method}{mark.get(method, '')} | {fmt_ci(row['early_final_quarter'], 1)} | "
                     f"{fmt_ci(row['late_final_quarter'], 1)} |")
    lines += ["", f"Sensitivity to the regime return's weighting (added after PPO and PPO_fresh ran): an episode average "
              f"counts the many short episodes of a regime's failing start more than the few long ones that follow; "
              f"the time average is the mean over {TIME_BINS} equal parts of the visit of the episodes ending in each. "
              "Means [95% t interval]; the difference [95% Welch interval].",
              "", "| method | drop (episode average) | drop (time average) | late (time average) |" +
              (" late - PPO_fresh (time average) |" if fresh else ""),
              "|---|---|---|---|" + ("---|" if fresh else "")]
    for method in order:
        row = table[method]
        cell = f" {fmt_ci(row['late_time_average_minus_PPO_fresh'])} |" if fresh and method != fresh else " |"
        lines.append(f"| {method}{mark.get(method, '')} | {fmt_ci(row['drop'])} | {fmt_ci(row['drop_time_average'])} | "
                     f"{fmt_ci(row['late_time_average'])} |" + (cell if fresh else ""))
    trac = [m for m in order if "trac_scale_end_median" in table[m]]
    if trac:
        n = len(table[trac[0]]["trac_scale_end_median"])
        lines += ["", "TRAC's scale S (logged once per iteration as `plasticity/trac_scale`): its median over seeds at the "
                  "end of each regime, and the share of iterations that ended with S = 0 (the weights at their initial "
                  "values) per seed.", "",
                  "| method | " + " | ".join(f"S, regime {k + 1}" for k in range(n)) + " | iterations with S = 0 |",
                  "|---" * (n + 2) + "|"]
        for m in trac:
            row = table[m]
            lines.append(f"| {m}{mark.get(m, '')} | " + " | ".join(f"{x:.3g}" for x in row["trac_scale_end_median"])
                         + " | " + ", ".join(f"{x:.2f}" for x in row["trac_scale_zero"]) + " |")
    running = [r for r in runs if not r["done"]]
    if running:
        lines += ["", "Not finished (left out): " + ", ".join(f"{r['run']} (at {r['steps']:,} of {r['total']:,})"
                                                           for r in running)]
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------------------------------


def plots(table: dict, runs: list[dict], out: str, early: int, late: int, labels: Optional[dict] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mark = marks(labels or {})
    done = [r for r in runs if r["done"] and r["method"] in table]
    methods = sorted({r["method"] for r in done}, key=lambda m: (m not in BASELINES, BASELINES.index(m)
                                                                  if m in BASELINES else 0, m))

    def curve(method: str) -> tuple[np.ndarray, np.ndarray, list]:
        rows = np.array([[np.nan if x is None else x for x in r["regimes"]] for r in done if r["method"] == method])
        ci = [statistics.interval(_values(rows[:, j].tolist())) for j in range(rows.shape[1])]
        return np.arange(1, rows.shape[1] + 1), np.nanmean(rows, 0), [[c.low, c.high] for c in ci]

    # one panel per method, each beside the baselines: 18 curves on one axes cannot be read
    panels = [m for m in methods if m not in BASELINES] or methods[:1]
    ncols = min(4, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.8 * nrows), sharex=True, sharey=True,
                             squeeze=False)
    base_style = {"PPO": {"color": "0.35", "lw": 1.2}, "PPO_fresh": {"color": "0.35", "lw": 1.2, "ls": "--"}}
    for ax, method in zip(axes.flat, panels):
        for b in BASELINES:
            if b in methods and b != method:
                x, mean, _ = curve(b)
                ax.plot(x, mean, label=b, **base_style[b])
        x, mean, ci = curve(method)
        ax.plot(x, mean, marker="o", ms=3, lw=2, color="C0", label=method)
        ax.fill_between(x, [c[0] for c in ci], [c[1] for c in ci], color="C0", alpha=0.2)
        ax.axvspan(0.5, early + 0.5, color="grey", alpha=0.08)
        ax.axvspan(len(x) - late + 0.5, len(x) + 0.5, color="grey", alpha=0.08)
        n = int((np.asarray([r["method"] for r in done]) == method).sum())
        ax.set_title(f"{method}{mark.get(method, '')} ({n} seeds)", fontsize=9)
        ax.legend(fontsize=6, loc="upper right")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("regime")
    for ax in axes[:, 0]:
        ax.set_ylabel("mean training return")
    fig.suptitle(f"mean over seeds, band: 95% t interval; {POST_HOC_MARK} post hoc, {CHOSEN_MARK} default chosen "
                 "here (report.md)", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "regimes.png"), dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 0.4 * max(3, len(table)) + 1))
    names = sorted(table, key=lambda m: table[m]["drop"]["estimate"])
    for i, m in enumerate(names):
        d = table[m]["drop"]
        lo, hi = d["ci"] if d["ci"][0] is not None else (d["estimate"], d["estimate"])
        ax.errorbar(d["estimate"], i, xerr=[[d["estimate"] - lo], [hi - d["estimate"]]], fmt="o", capsize=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(names)), [f"{m}{mark.get(m, '')}" for m in names])
    ax.set_xlabel("early - late regime return (mean, 95% t interval); > 0: loss of plasticity")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "drop.png"), dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for method in methods:
        rs = [r for r in done if r["method"] == method and r["diagnostics"]]
        if not rs:
            continue
        k = min(len(r["diagnostics"]) for r in rs)
        steps = [d["step"] for d in rs[0]["diagnostics"][:k]]
        for ax, diag in zip(axes, DIAGNOSTICS):
            vals = np.array([[np.nan if d[diag] is None else d[diag] for d in r["diagnostics"][:k]] for r in rs])
            ax.plot(np.asarray(steps) / 1e6, np.nanmean(vals, 0), marker=".", label=f"{method}{mark.get(method, '')}")
    for ax, title in zip(axes, ("dormant fraction (all hidden units)", "effective rank (penultimate features)",
                                "weight norm")):
        ax.set_title(f"{title}, mean over seeds", fontsize=9)
        ax.set_xlabel("steps (M)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "diagnostics.png"), dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------------------


def report(folder: Optional[str] = None, out: Optional[str] = None, early: Optional[int] = None,
           late: Optional[int] = None, experiment: Optional[str] = None, from_report: Optional[str] = None,
           figures: bool = True) -> dict:
    """The report of an experiment folder, or (from_report) of a stored report.json's per-run records. early/late:
    None = 3 and 5, or the stored report's. Returns the report.json content plus "markdown" (its lines)."""
    if (folder is None) == (from_report is None):
        raise UserError("plasticity: give an experiment FOLDER or --from-report REPORT_JSON (one of the two)")
    stored: dict = {}
    if from_report is not None:
        stored = load_report(from_report)
        stored_args = stored.get("args") or {}
        early = stored_args.get("early", EARLY) if early is None else early
        late = stored_args.get("late", LATE) if late is None else late
        check_windows(early, late)
        runs = stored["runs"]
        if (early, late) != (stored_args.get("early"), stored_args.get("late")):
            runs = [{**copy.deepcopy(r), **windows(r, early, late)} for r in runs]
        name = os.path.basename(os.path.normpath(str(stored_args.get("folder") or from_report)))
        experiment = experiment or (stored_args.get("experiment") if stored_args.get("experiment") and
                                    os.path.isfile(stored_args["experiment"]) else None)
        if experiment:
            labels = read_labels(experiment)
        else:
            labels = {"experiment": stored_args.get("experiment"), "post_hoc": stored.get("post_hoc", []),
                      "defaults_chosen_here": stored.get("defaults_chosen_here", [])}
        source = [f"Computed from the {len(runs)} per-run records of `{from_report}` (`python -m continual.report "
                  "plasticity --from-report`): every statistic here is computed from those records only, so the table "
                  "is the one the experiment folder gives."
                  + ("" if any(r.get("starts") for r in runs) else
                     " The records keep no code revision (the raw runs are gone); bench/RESULTS.md names the "
                     "revisions the runs used.")]
        if any(r.get("starts") for r in runs):
            source += provenance_lines(provenance((r["run"], r.get("starts", [])) for r in runs))
    else:
        early = EARLY if early is None else early
        late = LATE if late is None else late
        check_windows(early, late)
        path = experiment or os.path.join(folder, "experiment.json")
        labels = read_labels(path) if experiment or os.path.isfile(path) else {"experiment": None, "post_hoc": [],
                                                                                 "defaults_chosen_here": []}
        runs = load_folder(folder, early, late)
        name = os.path.basename(os.path.normpath(folder))
        source = None
    table = summarize(runs)
    if not table:
        raise UserError(f"{from_report or folder}: no finished run with {early} + {late} regimes")
    lines = markdown(table, runs, early, late, labels, source=source)
    args = {"folder": (stored.get("args") or {}).get("folder") if from_report else folder, "from_report": from_report,
            "experiment": labels.get("experiment"), "early": early, "late": late, "out": out}
    result = {"statistics": STATISTICS_TEXT, "args": args,
              **({"source": {k: stored[k] for k in ("args", "machine", "source") if k in stored}} if from_report
                 else {}),
              # only the arms this report has: an arm appended for a later run is not in its tables
              "post_hoc": [i for i in labels.get("post_hoc", []) if i["label"] in table],
              "defaults_chosen_here": labels.get("defaults_chosen_here", []),
              "table": table, "runs_sha256": runs_digest(runs), "runs": runs}
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
            f.write(f"# Loss of plasticity on permuted MinAtar ({name})\n\n" + "\n".join(lines) +
                    "\n\n![regime returns](regimes.png)\n\n![drop](drop.png)\n\n![diagnostics](diagnostics.png)\n")
        with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        if figures:
            plots(table, runs, out, early, late, labels)
    result["markdown"] = lines
    return result
