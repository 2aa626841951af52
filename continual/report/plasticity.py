"""Report of the loss-of-plasticity experiment (configs/experiments/plasticity_minatar.json): per method, how much
worse plain and remedied PPO learn the late regimes of a long permuted-MinAtar sequence than the early ones.

    python bench/plasticity_report.py EXPERIMENT_FOLDER --out bench/results/plasticity_minatar [--early 3 --late 5]

Statistics (fixed before any run of the experiment):
- regime return: the mean return of the training episodes (the sampling policy) that end inside a regime's visit,
  (start, end], i.e. the area under the regime's learning curve: it falls when a network learns a new regime more
  slowly or to a lower level. `final quarter`: the same over the visit's last 25% of steps.
- early = mean regime return of the first `--early` regimes (the first is learned from a fresh network), late = mean of
  the last `--late` regimes; drop = early - late (> 0: late regimes are learned worse: loss of plasticity), and the
  relative drop, drop / early. Defaults 3 and 5: for the experiment's 10 regimes, the first 3 against the second half
  (set before the experiment's runs, after the pilots, where plain PPO's collapse and recovery fell at different
  regimes from run to run, so the last 3 alone depended on where a recovery fell; the pilots used 3 and 3).
- 95% CIs: percentile bootstrap over the method's seeds (`continual.evaluation.metrics.bootstrap_mean`: the
  stratified bootstrap with one task; 2,000 resamples). Differences to PPO (late return, drop): both methods' seeds
  resampled independently (`paired_bootstrap`), and rliable's probability that the method's late return is above
  PPO's, with its CI; the same against PPO_fresh (a fresh network every regime), the level a remedy that fully
  restores plasticity would reach (added when PPO and PPO_fresh had finished and 2 of the 60 remedy runs, PPO_NSAdam
  seeds 1-2). With 5 seeds a percentile bootstrap is narrow; the t-interval is in report.json as well.
- sensitivity (added after PPO and PPO_fresh ran, a second weighting of the same episodes, not the statistic the
  conclusions use): the time-average regime return, the mean over TIME_BINS equal parts of a visit of the episodes
  ending in each part. The episode average weights a regime's failing start (many short episodes) more than its
  learned end (few long ones); the time average weights each part of the visit the same.
- policy collapse: the share of PPO updates (iteration records) whose policy entropy `losses/entropy` is below
  COLLAPSED_ENTROPY, where the policy is deterministic, every gradient vanishes and the regime cannot be learned (the
  pilots' collapse; added after them).
- diagnostics (`plasticity/*` records at every switch): dormant fraction (all hidden units), effective rank of the
  penultimate features, the weight norm (the root sum of squares of the per-layer norms), at the first and at the
  last record (the last switch, unless the run logs them every --diagnostics_every steps).
- TRAC (runs that log `plasticity/trac_scale`, from e77a843 on): its scale S at the end of each regime (median over
  seeds) and the share of iterations that ended with S = 0.

Runs are grouped by method: the run directory name's "NNN_seed=S_<method>" or "NNN_<method>_seed=S" (the launcher's
naming for a grid of seeds and named flag sets), else the config's architecture (+S&P). Unfinished runs are listed and left out.
Writes report.md, report.json, regimes.png (regime return per regime, one panel per method beside PPO and PPO_fresh,
mean and CI band), drop.png (the drop per method with CIs) and diagnostics.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from continual.evaluation.metrics import (  # noqa: E402
    COLLAPSED_ENTROPY,
    bootstrap_mean,
    collapsed_share,
    load_run,
    mean_ci,
    method_label,
    paired_bootstrap,
    probability_of_improvement,
    provenance,
    provenance_lines,
)
from continual.io import jsonl_file  # noqa: E402

# the launcher's entry names for a grid of named flag sets and seeds, in either key order
RUN_NAMES = (re.compile(r"^\d+_seed=(?P<seed>\d+)_(?P<method>.+)$"), re.compile(r"^\d+_(?P<method>.+)_seed=(?P<seed>\d+)$"))


def parse_run_name(name: str) -> Optional[tuple[str, int]]:
    """'003_seed=2_PPO_ReDo' or '003_PPO_ReDo_seed=2' -> ('PPO_ReDo', 2); None for other names."""
    for pattern in RUN_NAMES:
        m = pattern.match(name)
        if m:
            return m.group("method"), int(m.group("seed"))
    return None
DIAGNOSTICS = ("dormant", "effective_rank", "weight_norm")
TIME_BINS = 10  # the time-average regime return: the mean over this many equal parts of a visit


def _mean(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return float(np.mean(xs)) if xs else None


def weight_norm(record: dict) -> float:
    return math.sqrt(sum(v * v for k, v in record.items() if k.startswith("plasticity/weight_norm/")))


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
    if len(regimes) >= early + late:
        out["early"] = _mean(regimes[:early])
        out["late"] = _mean(regimes[-late:])
        out["drop"] = None if out["early"] is None or out["late"] is None else out["early"] - out["late"]
        out["relative_drop"] = None if not out["early"] or out["drop"] is None else out["drop"] / abs(out["early"])
        out["late_final_quarter"] = _mean(finals[-late:])
        out["early_final_quarter"] = _mean(finals[:early])
        out["late_time_average"] = _mean(timed[-late:])
        out["early_time_average"] = _mean(timed[:early])
        out["drop_time_average"] = (None if out["early_time_average"] is None or out["late_time_average"] is None
                                    else out["early_time_average"] - out["late_time_average"])
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


def fmt_ci(d: dict, digits: int = 1) -> str:
    if d["mean"] is None:
        return "-"
    if d.get("ci95") is None:
        return f"{d['mean']:.{digits}f}"
    lo, hi = d["ci95"]
    return f"{d['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


BASELINES = ("PPO", "PPO_fresh")  # plain PPO, and a fresh network every regime: the from-scratch level


def summarize(runs: list[dict], baselines: tuple[str, ...] = BASELINES) -> dict:
    methods: dict[str, list[dict]] = {}
    for r in runs:
        if r["done"] and "drop" in r:
            methods.setdefault(r["method"], []).append(r)
    table = {}
    for method, rs in methods.items():
        rs = sorted(rs, key=lambda r: (r["seed"] is None, r["seed"]))
        row = {"n": len(rs), "seeds": [r["seed"] for r in rs]}
        for key in ("early", "late", "drop", "relative_drop", "early_final_quarter", "late_final_quarter", "collapsed",
                    "early_time_average", "late_time_average", "drop_time_average"):
            row[key] = bootstrap_mean(r[key] for r in rs)
            row[key]["t_ci95_half_width"] = mean_ci(r[key] for r in rs)["ci95"]
            row[key]["per_seed"] = [r[key] for r in rs]
        if all("trac_scale_end" in r for r in rs):
            ends = np.array([r["trac_scale_end"] for r in rs], dtype=np.float64)
            row["trac_scale_end_median"] = [float(x) for x in np.nanmedian(ends, axis=0)]
            row["trac_scale_zero"] = [r["trac_scale_zero"] for r in rs]
        for diag in DIAGNOSTICS:
            first = [r["diagnostics"][0][diag] for r in rs if r["diagnostics"]]
            last = [r["diagnostics"][-1][diag] for r in rs if r["diagnostics"]]
            row[f"{diag}_first_switch"], row[f"{diag}_end"] = _mean(first), _mean(last)
        for baseline in baselines:
            base = methods.get(baseline)
            if not base or method == baseline:
                continue
            for key in ("late", "drop", "late_time_average"):
                x = np.array([[r[key]] for r in rs], dtype=np.float64)
                y = np.array([[r[key]] for r in base], dtype=np.float64)
                lo, hi = paired_bootstrap(x, y, lambda a, b: float(a.mean() - b.mean()))
                row[f"{key}_minus_{baseline}"] = {"mean": float(x.mean() - y.mean()), "ci95": [lo, hi]}
            x = np.array([[r["late"]] for r in rs], dtype=np.float64)
            y = np.array([[r["late"]] for r in base], dtype=np.float64)
            lo, hi = paired_bootstrap(x, y, probability_of_improvement)
            row[f"p_late_above_{baseline}"] = {"mean": probability_of_improvement(x, y), "ci95": [lo, hi]}
        table[method] = row
    return table


def markdown(table: dict, runs: list[dict], args, baselines: tuple[str, ...] = BASELINES) -> list[str]:
    n_regimes = max((len(r["regimes"]) for r in runs), default=0)
    baselines = tuple(b for b in baselines if b in table)
    versus = "".join(f" late - {b} | P(late > {b}) |" for b in baselines)
    lines = [f"Regime return = mean training-episode return over a regime's visit; early = regimes 1-{args.early}, "
             f"late = regimes {n_regimes - args.late + 1}-{n_regimes} of {n_regimes}; drop = early - late (> 0: late "
             f"regimes learned worse). Mean over seeds [95% percentile-bootstrap CI]. Against PPO_fresh (a fresh "
             f"network every regime): a late return at or above it means the method learns the late regimes as "
             f"well as from scratch.", "",
             f"Collapsed = share of updates with policy entropy < {COLLAPSED_ENTROPY} nats.", "",
             *provenance_lines(provenance((r["run"], r.get("starts", [])) for r in runs)), "",
             f"| method | seeds | early | late | drop | drop / early |{versus} "
             "collapsed | dormant (1st -> last switch) | eff. rank (1st -> last switch) | "
             "weight norm (1st -> last switch) |",
             "|---" * (10 + 2 * len(baselines)) + "|"]
    order = [b for b in baselines] + sorted(m for m in table if m not in baselines)

    def arrow(row: dict, key: str, digits: int) -> str:
        a, b = row[f"{key}_first_switch"], row[f"{key}_end"]
        return "-" if a is None or b is None else f"{a:.{digits}f} -> {b:.{digits}f}"

    for method in order:
        row = table[method]
        cells = "".join(f" {fmt_ci(row[f'late_minus_{b}']) if f'late_minus_{b}' in row else ''} |"
                        f" {fmt_ci(row[f'p_late_above_{b}'], 2) if f'p_late_above_{b}' in row else ''} |"
                        for b in baselines)
        lines.append(f"| {method} | {row['n']} | {fmt_ci(row['early'])} | {fmt_ci(row['late'])} | "
                     f"{fmt_ci(row['drop'])} | {fmt_ci(row['relative_drop'], 2)} |{cells} "
                     f"{fmt_ci(row['collapsed'], 2)} | {arrow(row, 'dormant', 3)} | "
                     f"{arrow(row, 'effective_rank', 1)} | {arrow(row, 'weight_norm', 1)} |")
    fresh = "PPO_fresh" if "PPO_fresh" in baselines else None
    lines += ["", f"Sensitivity to the regime return's weighting (added after PPO and PPO_fresh ran): an episode average "
              f"counts the many short episodes of a regime's failing start more than the few long ones that follow; "
              f"the time average is the mean over {TIME_BINS} equal parts of the visit of the episodes ending in each.",
              "", "| method | drop (episode average) | drop (time average) | late (time average) |" +
              (" late - PPO_fresh (time average) |" if fresh else ""),
              "|---|---|---|---|" + ("---|" if fresh else "")]
    for method in order:
        row = table[method]
        cell = f" {fmt_ci(row['late_time_average_minus_PPO_fresh'])} |" if fresh and method != fresh else " |"
        lines.append(f"| {method} | {fmt_ci(row['drop'])} | {fmt_ci(row['drop_time_average'])} | "
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
            lines.append(f"| {m} | " + " | ".join(f"{x:.3g}" for x in row["trac_scale_end_median"]) + " | "
                         + ", ".join(f"{x:.2f}" for x in row["trac_scale_zero"]) + " |")
    running = [r for r in runs if not r["done"]]
    if running:
        lines += ["", "Not finished (left out): " + ", ".join(f"{r['run']} (at {r['steps']:,} of {r['total']:,})"
                                                           for r in running)]
    return lines


def plots(table: dict, runs: list[dict], out: str, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in runs if r["done"]]
    methods = sorted({r["method"] for r in done}, key=lambda m: (m not in BASELINES, BASELINES.index(m)
                                                                  if m in BASELINES else 0, m))

    def curve(method: str) -> tuple[np.ndarray, np.ndarray, list]:
        rows = np.array([[np.nan if x is None else x for x in r["regimes"]] for r in done if r["method"] == method])
        ci = [bootstrap_mean(rows[:, j].tolist()).get("ci95") or [np.nan, np.nan] for j in range(rows.shape[1])]
        return np.arange(1, rows.shape[1] + 1), np.nanmean(rows, 0), ci

    # one panel per method, each beside the baselines: 14 curves on one axes cannot be read
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
        ax.axvspan(0.5, args.early + 0.5, color="grey", alpha=0.08)
        ax.axvspan(len(x) - args.late + 0.5, len(x) + 0.5, color="grey", alpha=0.08)
        n = int((np.asarray([r["method"] for r in done]) == method).sum())
        ax.set_title(f"{method} ({n} seeds)", fontsize=9)
        ax.legend(fontsize=6, loc="upper right")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("regime")
    for ax in axes[:, 0]:
        ax.set_ylabel("mean training return")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "regimes.png"), dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 0.4 * max(3, len(table)) + 1))
    names = sorted(table, key=lambda m: table[m]["drop"]["mean"])
    for i, m in enumerate(names):
        d = table[m]["drop"]
        lo, hi = d["ci95"] or [d["mean"], d["mean"]]
        ax.errorbar(d["mean"], i, xerr=[[d["mean"] - lo], [hi - d["mean"]]], fmt="o", capsize=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("early - late regime return (95% bootstrap CI); > 0: loss of plasticity")
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
            ax.plot(np.asarray(steps) / 1e6, np.nanmean(vals, 0), marker=".", label=method)
    for ax, title in zip(axes, ("dormant fraction (all hidden units)", "effective rank (penultimate features)",
                                "weight norm")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("steps (M)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "diagnostics.png"), dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="the experiment folder (its runs/ holds one run directory per entry)")
    p.add_argument("--out", help="write report.md, report.json and the plots here")
    p.add_argument("--early", type=int, default=3, help="regimes counted as early (the first N)")
    p.add_argument("--late", type=int, default=5, help="regimes counted as late (the last N)")
    args = p.parse_args()
    if args.early < 1 or args.late < 1:
        print("error: --early and --late must be at least 1", file=sys.stderr)
        sys.exit(2)
    runs_root = os.path.join(args.folder, "runs")
    if not os.path.isdir(runs_root):
        print(f"error: {args.folder}: no runs/ folder (is it an experiment folder?)", file=sys.stderr)
        sys.exit(2)
    runs = [s for s in (run_summary(os.path.join(runs_root, d), args.early, args.late)
                        for d in sorted(os.listdir(runs_root))) if s]
    if not runs:
        print(f"error: {runs_root}: no run with training episodes yet", file=sys.stderr)
        sys.exit(2)
    table = summarize(runs)
    lines = markdown(table, runs, args)
    print("\n".join(lines))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as f:
            f.write(f"# Loss of plasticity on permuted MinAtar ({args.folder})\n\n" + "\n".join(lines) +
                    "\n\n![regime returns](regimes.png)\n\n![drop](drop.png)\n\n![diagnostics](diagnostics.png)\n")
        with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "machine": {"cpu": common.cpu_model(), "load": common.loadavg()},
                       "table": table, "runs": runs}, f, indent=1)
        plots(table, runs, args.out, args)
        print(f"report written to {args.out}")


if __name__ == "__main__":
    main()
