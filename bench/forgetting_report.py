"""Report of a forgetting experiment run by the launcher (configs/experiments/forgetting_minatar.json): per method
average performance, forgetting (two of the library's variants), forward transfer, 95% stratified-bootstrap CIs,
probabilities of improvement with CIs, the "learned" check against single-task runs, P&C's knowledge base and active
column, a markdown table and plots.

    python bench/forgetting_report.py EXPERIMENT_FOLDER --out bench/results/forgetting_minatar

Runs. Every run directory under EXPERIMENT_FOLDER/runs is grouped by its config.json's `exp_name` (the method's
label, set per entry by the experiment file) and `seed`. A run counts once it has finished: its launcher status is
"done" (queue/<run>.status.json), or, outside the launcher, it wrote metrics.json (written at the end of training).
Runs whose label starts with "reference" are single-task reference runs (one task, one visit); the others are
sequence runs. A method is in the PPO family if its architecture is PPO or PPO_CBP, else in the IMPALA family
(IMPALA, CLEAR, PNC); each family is compared with its own references ("reference PPO ...", "reference IMPALA ...").

Metrics (continual/evaluation/metrics.py, on evaluation returns divided per task by the largest |return| of any run
of the experiment, references included, `--normalize max_abs`; `raw` keeps returns):
- average performance P(T) (Continual World): final evaluation score, mean over tasks;
- forgetting at the end of the last visit (`forgetting_last_visit`; this report called it "forgetting (CW)"): score at
  the end of the task's last visit minus the final score, one evaluation each, mean over all tasks (the task trained
  last contributes 0); forgetting over all later visits (`forgetting_all_visits`; called "forgetting (CORA isolated)"
  before, which it is not: CORA's exact metric is `continual.evaluation.cora.cora_forgetting`): score drop over each
  later visit of another task, mean over those visits, then over tasks;
- forward transfer: zero-shot at the switches (change on a task while other tasks are trained before its first visit)
  and against a reference (trapezoid area under the task's first-visit curve against the same-seed single-task
  reference run of the method's family, (AUC - AUC_ref) / (1 - AUC_ref); Continual World's exact one is
  `continual.evaluation.cw.cw_forward_transfer`).
Each table cell: mean over the runs x tasks matrix, [95% percentile stratified-bootstrap CI] (runs resampled within
each task, `metrics.stratified_bootstrap`, `--reps` resamples).

Probability of improvement (Agarwal et al. 2021, rliable's `probability_of_improvement`: per task the Mann-Whitney
statistic P(X > Y) + P(X = Y)/2 over all run pairs, averaged over tasks; CI: rliable's stratified bootstrap of both
methods' runs, `metrics.paired_bootstrap`). For forgetting lower is better, so "X improves on Y" is computed on the
negated forgetting: P(F_X < F_Y). Forgetting at the end of the last visit is compared only on tasks whose last visit ends
before the end of training (on the last task it is 0 for every run, which would pull every probability to 0.5).
Pairs: each method against its family's baseline (PPO, IMPALA), PPO_CBP also against "PPO (MinAtar CNN)" (the same
network: PPO_CBP has no MLP), CLEAR against IMPALA (CORA's result: CLEAR forgets less, the CI above 0.5), and CLEAR
against the family's other methods at their chosen lambdas (CORA: online EWC and P&C forget more than CLEAR).

Learned check (issue 32): each method's evaluation return on a task at the end of its first visit, mean over seeds,
against the family's single-task references at the same number of steps on that task (their evaluation nearest to
that step count, within 5% of it); the task counts as learned if the ratio is >= 0.5.

EWC's lambda: labels "<method> lambda=<x>" with the same <method> are one sweep; the value with the highest mean
P(T) is the chosen one (a rule fixed before the runs), every value is reported, and the probabilities of
improvement use the chosen one.

P&C: evaluation plays the knowledge base (KB); the actors act with the active column, so the active column's
return at the end of a visit is the mean training-episode return over the last `--active_tail` of that visit
(sampled actions, the same env settings as evaluation). Both are reported per task and visit, with the active
column's policy entropy when its compress phase starts and how many compress updates find it collapsed (added after
seed 1's P&C run, whose active column became deterministic in the first updates of its third visit's compress phase).

Outputs under --out: report.md (tables), report.json (every number, per-run metrics), curves.png (evaluation curves
per task, mean over seeds, 95% t band), comparison.png (the table's columns with CIs), improvement.png
(probabilities of improvement with CIs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402,F401  (puts the repository root on sys.path)
import forgetting as F  # noqa: E402

from continual.evaluation import metrics as M  # noqa: E402
from continual.io import atomic_write_json  # noqa: E402

PPO_FAMILY = ("PPO", "PPO_CBP")
KEYS = (("final", "average performance P(T)"), ("forgetting_last_visit", "forgetting (end of last visit)"),
        ("forgetting_all_visits", "forgetting (all later visits)"), ("transfer_zero_shot", "forward transfer (zero-shot)"),
        ("transfer_reference", "forward transfer (vs single-task, trapezoid)"), ("average", "time-average performance"))
LOWER_IS_BETTER = ("forgetting_last_visit", "forgetting_all_visits")
LAMBDA = re.compile(r"^(?P<base>.+?) lambda=(?P<value>[0-9.eE+-]+)$")
# a method's own control where its network differs from the family baseline's (PPO_CBP has no MLP)
CONTROLS = {"PPO_CBP": "PPO (MinAtar CNN)"}


# ---------------------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------------------


def finished(folder: str, run_dir: str) -> bool:
    status = os.path.join(folder, "queue", os.path.basename(run_dir) + ".status.json")
    if os.path.exists(status):
        with open(status, encoding="utf-8") as f:
            return json.load(f).get("state") == "done"
    return os.path.exists(os.path.join(run_dir, M.METRICS_FILE))


def family(config: dict) -> str:
    return "PPO" if config.get("architecture") in PPO_FAMILY else "IMPALA"


def load_folder(folder: str) -> tuple[dict[str, list[M.RunData]], dict[str, list[M.RunData]], list[str]]:
    """(method -> its finished sequence runs, reference label -> its finished runs, both in seed order; the names of
    the unfinished run directories)."""
    root = os.path.join(folder, "runs")
    methods: dict[str, list] = {}
    refs: dict[str, list] = {}
    unfinished = []
    for d in sorted(os.listdir(root)):
        path = os.path.join(root, d)
        if not os.path.isdir(path):
            continue
        if not finished(folder, path):
            unfinished.append(d)
            continue
        run = M.load_run(path)
        label = run.config.get("exp_name") or M.method_label(run.config)
        (refs if label.startswith("reference") else methods).setdefault(label, []).append(run)
    order = lambda rs: sorted(rs, key=lambda r: r.config.get("seed", 0))  # noqa: E731
    return {k: order(v) for k, v in methods.items()}, {k: order(v) for k, v in refs.items()}, unfinished


# ---------------------------------------------------------------------------------------------------------------------
# metrics (pure: tested on hand-made run directories)
# ---------------------------------------------------------------------------------------------------------------------


def family_references(run: M.RunData, refs: dict[str, list[M.RunData]]) -> list[M.RunData]:
    """The single-task reference runs of the run's family, same seed first (one per task is what
    `metrics.run_metrics` uses: the first that has the task)."""
    fam = [r for rs in refs.values() for r in rs if family(r.config) == family(run.config)]
    seed = run.config.get("seed")
    return sorted(fam, key=lambda r: r.config.get("seed") != seed)


def cw_tasks(run: M.RunData) -> list[str]:
    """Tasks whose last visit ends before the end of training (forgetting at the end of the last visit can be
    non-zero)."""
    last = {v.regime: v.end for v in run.visits}
    return [t for t in run.trained if last[t] < run.end_step]


def probability_of_improvement(x: np.ndarray, y: np.ndarray, lower_is_better: bool = False, reps: int = 2000,
                               seed: int = 0) -> dict:
    """P(X improves on Y) (rliable's definition) on two runs x tasks matrices and its 95% bootstrap CI."""
    if lower_is_better:
        x, y = -x, -y
    lo, hi = M.paired_bootstrap(x, y, M.probability_of_improvement, reps, seed)
    return {"estimate": M.probability_of_improvement(x, y), "ci95": [lo, hi],
            "runs": [int(x.shape[0]), int(y.shape[0])]}


def task_matrix(results: Sequence[dict], key: str, tasks: Sequence[str]) -> np.ndarray:
    return np.array([[r["regimes"][t][key] for t in tasks] for r in results], dtype=np.float64)


def improvements(results: dict[str, list[dict]], runs: dict[str, list[M.RunData]], pairs: Sequence[tuple[str, str]],
                 reps: int) -> dict[str, dict]:
    """"X > Y" -> key -> probability of improvement, over the tasks both methods have a value for (last-visit forgetting:
    only the tasks that can be forgotten)."""
    out: dict[str, dict] = {}
    for a, b in pairs:
        if a not in results or b not in results:
            continue
        row = {}
        for key, _ in KEYS:
            tasks = [t for t in runs[a][0].trained
                     if all(r["regimes"].get(t, {}).get(key) is not None for r in results[a] + results[b])]
            if key == "forgetting_last_visit":
                tasks = [t for t in tasks if t in cw_tasks(runs[a][0])]
            if not tasks:
                continue
            row[key] = {**probability_of_improvement(task_matrix(results[a], key, tasks),
                                                     task_matrix(results[b], key, tasks),
                                                     key in LOWER_IS_BETTER, reps), "tasks": tasks}
        out[f"{a} > {b}"] = row
    return out


def lambda_sweeps(table: dict[str, dict]) -> dict[str, dict]:
    """base -> {values: {lambda: P(T) mean}, chosen: the label with the highest mean P(T)}."""
    sweeps: dict[str, dict] = {}
    for label, row in table.items():
        m = LAMBDA.match(label)
        if m and row["final"]["mean"] is not None:
            sweeps.setdefault(m["base"], {"values": {}, "labels": {}})
            sweeps[m["base"]]["values"][m["value"]] = row["final"]["mean"]
            sweeps[m["base"]]["labels"][m["value"]] = label
    for s in sweeps.values():
        best = max(s["values"], key=lambda v: s["values"][v])
        s["chosen"] = s["labels"][best]
    return sweeps


def learned_check(runs: dict[str, list[M.RunData]], refs: dict[str, list[M.RunData]]) -> dict[str, dict]:
    """method -> task -> {first_visit_end, value (mean over seeds of the raw evaluation return at the end of the
    first visit), reference (mean over the family's references at the same steps on the task), ratio, learned}."""
    out: dict[str, dict] = {}
    for method, rs in runs.items():
        out[method] = {}
        fam_refs = [r for r in family_references(rs[0], refs)]
        for task in rs[0].trained:
            vals, length, end = [], None, None
            for r in rs:
                v = next(v for v in r.visits if v.regime == task)
                length, end = v.end - v.start, v.end
                vals.append(M.at_or_before(r.evals[task], v.end))
            ref_vals = []
            for ref in fam_refs:
                rv = next((v for v in ref.visits if v.regime == task), None)
                if rv is None or task not in ref.evals:
                    continue
                # the reference's evaluation nearest to the same step count (visits end at whole rollouts, so the
                # sequence's visit can be a rollout shorter than the reference); none if the reference stopped
                # more than 5% short of it
                target = rv.start + length
                step, y = min(ref.evals[task], key=lambda p: abs(p[0] - target))
                if abs(step - target) <= 0.05 * length:
                    ref_vals.append(y)
            value = M._mean(vals)
            ref = M._mean(ref_vals)
            ratio = value / ref if value is not None and ref else None
            out[method][task] = {"first_visit_end": end, "value": value, "seeds": vals, "reference": ref,
                                 "reference_runs": len([x for x in ref_vals if x is not None]), "ratio": ratio,
                                 "learned": None if ratio is None else bool(ratio >= 0.5)}
    return out


def active_column(run: M.RunData, normalizer: M.Normalizer, tail: float = 0.1) -> list[dict]:
    """P&C: per visit, the knowledge base's evaluation at the visit's end and the active column's mean training
    return over the last `tail` of the visit (both normalised); the active column's policy entropy at the first
    compress update (the record is logged before the update), and the share of compress updates where it is below
    `metrics.COLLAPSED_ENTROPY`. The active column gets no gradient in the compress phase, but its adaptors read the
    KB that is being trained, so its policy can still change, and the KB is distilled towards it."""
    out = []
    for v in run.visits:
        lo = v.end - tail * (v.end - v.start)
        rets = [normalizer(m, r) for s, m, r in run.episodes if m == v.regime and lo < s <= v.end]
        kb = M.at_or_before(run.evals.get(v.regime, []), v.end)
        compress = [i["losses/entropy"] for i in run.iterations if v.start < i["global_step"] <= v.end
                    and i.get("pnc/compress") and i.get("losses/entropy") is not None]
        out.append({"regime": v.regime, "visit": v.number, "end": v.end, "episodes": len(rets),
                    "active": float(np.mean(rets)) if rets else None,
                    "kb": None if kb is None else normalizer(v.regime, kb),
                    "entropy_compress_start": compress[0] if compress else None,
                    "compress_collapsed": M.collapsed_share(compress)})
    return out


def heldout_table(results: dict[str, list[dict]], reps: int = 2000, seed: int = 0) -> dict[str, dict]:
    """method -> {final, average} over the held-out tasks (evaluated, never trained: CORA's paired evaluation tasks,
    `--eval_modifs`): mean over the runs x held-out tasks matrix with its stratified-bootstrap 95% CI, and per task
    the mean over runs. Empty without held-out tasks."""
    out: dict[str, dict] = {}
    for method, rs in results.items():
        tasks = [t for t, d in rs[0]["regimes"].items() if d.get("heldout")
                 and all(t in r["regimes"] for r in rs)] if rs else []
        if not tasks:
            continue
        out[method] = {"tasks": tasks}
        for key in ("final", "average"):
            mat = np.array([[r["regimes"][t][key] for t in tasks] for r in rs], dtype=np.float64)
            lo, hi = M.stratified_bootstrap(mat, M.rl.aggregate_mean, reps, seed)
            out[method][key] = {"mean": float(mat.mean()), "ci95": [lo, hi], "runs": len(rs),
                                "per_task": dict(zip(tasks, mat.mean(axis=0).tolist()))}
    return out


def report(folder: str, normalize: str = "max_abs", reps: int = 2000, active_tail: float = 0.1) -> dict:
    runs, refs, unfinished = load_folder(folder)
    if not runs:
        raise ValueError(f"{folder}: no finished sequence runs")
    all_runs = [r for rs in runs.values() for r in rs] + [r for rs in refs.values() for r in rs]
    norm = M.Normalizer(normalize, runs=all_runs)
    results = {m: [M.run_metrics(r, norm, references=family_references(r, refs)) for r in rs] for m, rs in runs.items()}
    table = F.method_table(results, reps, keys=KEYS)
    sweeps = lambda_sweeps(table)
    chosen = {base: s["chosen"] for base, s in sweeps.items()}
    name = lambda m: chosen.get(m, m)  # noqa: E731  ("IMPALA+EWC" -> its chosen lambda's label)
    compared = [m for m in results if not LAMBDA.match(m) or m in chosen.values()]  # a sweep: its chosen lambda
    pairs = []
    for m in compared:
        base = family(runs[m][0].config)
        if m != base:
            pairs.append((m, base))
        if CONTROLS.get(m) in results:
            pairs.append((m, CONTROLS[m]))
    pairs.append((name("CLEAR"), name("IMPALA")))
    if "CLEAR" in results:  # CORA's ordering beyond IMPALA: CLEAR against the rest of its family
        pairs += [("CLEAR", m) for m in compared
                  if family(runs[m][0].config) == "IMPALA" and m not in ("CLEAR", "IMPALA")]
    pairs = list(dict.fromkeys(pairs))
    pnc = {m: [active_column(r, norm, active_tail) for r in rs] for m, rs in runs.items()
           if runs[m][0].config.get("architecture") == "PNC"}
    return {
        "folder": os.path.abspath(folder), "normalize": normalize, "reps": reps,
        "scale": {t: norm.abs_max.get(t) for t in all_runs[0].regimes},
        "unfinished": unfinished, "references": {k: [r.run_dir for r in v] for k, v in refs.items()},
        "provenance": M.provenance((r.name, r.starts) for r in all_runs),
        "table": table, "lambda_sweeps": sweeps, "heldout": heldout_table(results, reps),
        "improvement": improvements(results, runs, pairs, reps),
        "learned": learned_check(runs, refs),
        "pnc": pnc,
        "curves": {m: F.mean_curves(rs, norm) for m, rs in runs.items()},
        "visits": [[v.regime, v.start, v.end] for v in next(iter(runs.values()))[0].visits],
        "runs": {m: [{"run_dir": x["run_dir"], "seed": r.config.get("seed"), "summary": x["summary"],
                      "regimes": {t: {k: v for k, v in d.items() if k != "reference"} for t, d in x["regimes"].items()}}
                     for x, r in zip(rs, runs[m])] for m, rs in results.items()},
    }


# ---------------------------------------------------------------------------------------------------------------------
# markdown and plots
# ---------------------------------------------------------------------------------------------------------------------


def _cell(d: Optional[dict], digits: int = 3) -> str:
    if not d or d.get("mean" if "mean" in d else "estimate") is None:
        return "-"
    m = d["mean"] if "mean" in d else d["estimate"]
    lo, hi = d["ci95"]
    return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def _task(t: str) -> str:
    """A task as tables and titles show it: the env id without `env=` and its backend's prefix."""
    return re.sub(r"^env=(MinAtar/|MiniHack-)?", "", t)


def markdown(rep: dict) -> str:
    chosen = {s["chosen"] for s in rep["lambda_sweeps"].values()}
    scale = ", ".join(f"{_task(t)} {v:g}" for t, v in rep["scale"].items() if v)
    lines = [f"# Forgetting report ({rep['folder']})", "",
             f"Scores: evaluation returns / the largest |return| of any run on the task ({rep['normalize']}: {scale}). "
             f"Cells: mean over runs x tasks [95% stratified-bootstrap CI, {rep['reps']} resamples]. Forgetting: "
             "positive = forgot; transfer: positive = helped.", ""]
    if rep["unfinished"]:
        lines += [f"Unfinished runs left out ({len(rep['unfinished'])}): {', '.join(rep['unfinished'])}", ""]
    if rep.get("provenance"):
        lines += M.provenance_lines(rep["provenance"]) + [""]
    lines += ["| method | runs | " + " | ".join(t for _, t in KEYS) + " |", "|---|---|" + "---|" * len(KEYS)]
    for m, row in rep["table"].items():
        mark = " (chosen lambda)" if m in chosen else ""
        lines.append(f"| {m}{mark} | {row['final']['runs']} | " + " | ".join(_cell(row[k]) for k, _ in KEYS) + " |")
    if rep["lambda_sweeps"]:
        lines += ["", "EWC lambda sweeps (mean P(T) per lambda; the highest is chosen):", ""]
        for base, s in rep["lambda_sweeps"].items():
            vals = ", ".join(f"lambda {v}: {p:.3f}" for v, p in s["values"].items())
            lines.append(f"- {base}: {vals} -> **{s['chosen']}**")
    if rep.get("heldout"):
        tasks = next(iter(rep["heldout"].values()))["tasks"]
        lines += ["", "## Held-out tasks (evaluated, never trained), normalised scores", "",
                  "| method | runs | final, mean [95% CI] | time-average, mean [95% CI] | "
                  + " | ".join(f"final: {_task(t)}" for t in tasks) + " |", "|---|---|---|---|" + "---|" * len(tasks)]
        for m, row in rep["heldout"].items():
            lines.append(f"| {m} | {row['final']['runs']} | {_cell(row['final'])} | {_cell(row['average'])} | "
                         + " | ".join(f"{row['final']['per_task'].get(t, float('nan')):.3f}" for t in tasks) + " |")
    if rep["improvement"]:
        lines += ["", "## Probability of improvement (X > Y; forgetting: X forgets less), [95% bootstrap CI]", "",
                  "| X > Y | P(T) | forgetting (all later visits) | forgetting (end of last visit, tasks not trained last) |",
                  "|---|---|---|---|"]
    for pair, row in rep["improvement"].items():
        lines.append(f"| {pair} | " + " | ".join(_cell(row.get(k), 2) for k in ("final", "forgetting_all_visits",
                                                                               "forgetting_last_visit")) + " |")
    lines += ["", "## Learned check: evaluation return at the end of the first visit vs the family's single-task "
              "references at the same steps (raw returns; learned = ratio >= 0.5)", "",
              "| method | task | first visit ends | return (seeds) | single-task reference (runs) | ratio | learned |",
              "|---|---|---|---|---|---|---|"]
    for m, tasks in rep["learned"].items():
        for t, d in tasks.items():
            seeds = ", ".join("-" if x is None else f"{x:.1f}" for x in d["seeds"])
            val = "-" if d["value"] is None else f"{d['value']:.2f}"
            ref = "-" if d["reference"] is None else f"{d['reference']:.2f} ({d['reference_runs']})"
            ratio = "-" if d["ratio"] is None else f"{d['ratio']:.2f}"
            lines.append(f"| {m} | {_task(t)} | {d['first_visit_end']} | {val} ({seeds}) | {ref} | {ratio} | "
                         f"{'-' if d['learned'] is None else 'yes' if d['learned'] else 'NO'} |")
    for m, per_run in rep["pnc"].items():
        lines += ["", f"## {m}: knowledge base (evaluated) vs active column (training returns, end of each visit), "
                  "normalised, mean over seeds", "",
                  "The active column is frozen in the compress phase: its policy entropy at the first compress update "
                  f"and the share of compress updates with entropy < {M.COLLAPSED_ENTROPY} (a deterministic policy the "
                  "KB is distilled towards), per seed.", "",
                  "| visit | task | ends | knowledge base | active column | active entropy, compress start | "
                  "compress updates collapsed |", "|---|---|---|---|---|---|---|"]
        for i, v in enumerate(per_run[0]):
            kb = M.mean_ci(r[i]["kb"] for r in per_run if i < len(r))
            act = M.mean_ci(r[i]["active"] for r in per_run if i < len(r))
            fmt = lambda d: "-" if d["mean"] is None else f"{d['mean']:.3f}" + (  # noqa: E731
                f" +- {d['ci95']:.3f}" if d["ci95"] else "")
            per_seed = lambda key, d: ", ".join("-" if i >= len(r) or r[i][key] is None  # noqa: E731
                                                else f"{r[i][key]:.{d}f}" for r in per_run)
            lines.append(f"| {i + 1} | {_task(v['regime'])} | {v['end']} | {fmt(kb)} | {fmt(act)} | "
                         f"{per_seed('entropy_compress_start', 3)} | {per_seed('compress_collapsed', 2)} |")
    return "\n".join(lines) + "\n"


def plot_improvement(rep: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("final", "P(T)"), ("forgetting_all_visits", "forgetting (all later visits)"),
            ("forgetting_last_visit", "forgetting (end of last visit)")]
    pairs = list(rep["improvement"])
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 0.45 * len(pairs) + 1.6), sharey=True)
    for ax, (key, title) in zip(axes, keys):
        for i, p in enumerate(pairs):
            d = rep["improvement"][p].get(key)
            if d:
                lo, hi = d["ci95"]
                ax.plot([lo, hi], [i, i], color="C0", lw=3, alpha=0.6)
                ax.plot(d["estimate"], i, "o", color="C0")
        ax.axvline(0.5, color="0.3", lw=0.8, ls="--")
        ax.set_xlim(0, 1)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.25, axis="x")
    axes[0].set_yticks(range(len(pairs)), labels=pairs, fontsize=8)
    fig.suptitle("probability of improvement (X > Y), 95% bootstrap CI", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Optional[Sequence[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="the experiment folder (its runs/ holds one run directory per entry)")
    p.add_argument("--out", required=True, help="report.md, report.json and the PNGs go here")
    p.add_argument("--normalize", default="max_abs", choices=["raw", "max_abs"])
    p.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--active_tail", type=float, default=0.1, help="P&C: share of each visit's last steps whose "
                   "training episodes give the active column's return")
    a = p.parse_args(argv)
    if not os.path.isdir(os.path.join(a.folder, "runs")):
        p.exit(2, f"error: {a.folder}: no runs/ folder (is it an experiment folder?)\n")
    if a.reps < 1 or not 0 < a.active_tail <= 1:
        p.exit(2, "error: --reps must be positive and --active_tail in (0, 1]\n")
    try:
        rep = report(a.folder, a.normalize, a.reps, a.active_tail)
    except ValueError as e:
        p.exit(2, f"error: {e}\n")
    os.makedirs(a.out, exist_ok=True)
    md = markdown(rep)
    with open(os.path.join(a.out, "report.md"), "w", encoding="utf-8") as f:
        f.write(md)
    atomic_write_json(os.path.join(a.out, "report.json"), rep, default=lambda x: None)
    title = " -> ".join(_task(v[0]) for v in rep["visits"])
    F.plot_curves(rep, os.path.join(a.out, "curves.png"), title)
    F.plot_comparison(rep, os.path.join(a.out, "comparison.png"), title)
    plot_improvement(rep, os.path.join(a.out, "improvement.png"))
    print(md)
    print(f"wrote {a.out}/report.md, report.json, curves.png, comparison.png, improvement.png")
    return rep


if __name__ == "__main__":
    main()
