"""Forgetting report on the library's instruments (issue 45): CORA's metrics exactly as CORA's code computes them,
Continual World's beside them, run-level small-n statistics and exact tests, the experiment file's declarations.

    python -m continual.report forgetting EXPERIMENT_FOLDER --out DIR [--tuning TUNING_FOLDER]

--tuning: the folder of the experiment that tuned the sweeps (continual.report.tuning): the heading says what it
chose and whether every arm marked chosen_from_tuning runs that value on the reporting seeds; a failed check is
printed first, in bold, and on stderr.

Runs. Every run directory under EXPERIMENT_FOLDER/runs that finished (its launcher status is "done", or it wrote
metrics.json), grouped by its config's `exp_name`; labels starting with "reference" are single-task reference runs.
A method's family is PPO (architecture PPO or PPO_CBP) or IMPALA (the rest); Continual World's forward transfer
compares a method with its own family's references.

Declarations (the experiment file's "declared" block, read from the folder's copy `experiment.json`; committed
before any run): the primary metric and its settings, the compared pairs, the normalisation, the evaluation
protocol. The report prints them in its heading and computes what they name; it adds nothing to the primary claim.

Metrics, per run (continual.evaluation.cora and .cw name their sources, file and commit):
- CORA's isolated forgetting (`cora.cora_forgetting`): running mean over `rolling_mean_count` evaluation points,
  each method scaled by its own largest |smoothed return| per task, strict region bounds, the first cycle unless the
  declaration says otherwise; the primary number is the declared task's per-run value;
- Continual World's average performance P(T), forgetting and forward transfer (`cw.*`, the declared reading for
  repeated visits), on returns normalised as declared (by default: divided per task by the mean final return of the
  experiment's single-task reference runs, both families, i.e. 1.0 = the average single-task learner at a visit's
  budget), never by a maximum over the compared methods.
Statistics (continual.evaluation.statistics): per method, the mean over runs with a Student-t 95% interval (the run
is the unit: a run's tasks are never resampled apart); per declared pair, the probability of improvement (rliable's
definition on run scores) with a run-level bootstrap interval, the exact one-sided Mann-Whitney p-value, the
difference of means with a Welch interval and the exact permutation p-value of that difference.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np

from continual.errors import UserError
from continual.evaluation import cora, cw, statistics
from continual.evaluation.metrics import RunData, at_or_before, load_run, provenance, provenance_lines
from continual.launch.queue import run_dirs

PPO_FAMILY = ("PPO", "PPO_CBP")
REFERENCE_PREFIX = "reference"


# ---------------------------------------------------------------------------------------------------------------------
# the experiment folder
# ---------------------------------------------------------------------------------------------------------------------


def declarations(folder: str, experiment: Optional[str] = None) -> dict:
    """The experiment file's declared block ("declared", or "_declared" as first committed), from --experiment or
    the folder's experiment.json."""
    path = experiment or os.path.join(folder, "experiment.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    block = data.get("declared", data.get("_declared", {}))
    if not isinstance(block, dict):
        raise UserError(f"{path}: 'declared' must be an object")
    return {**block, "_post_hoc": data.get("post_hoc", data.get("_post_hoc", []))}


def finished(folder: str, run: str) -> bool:
    status = os.path.join(folder, "queue", f"{run}.status.json")
    if os.path.isfile(status):
        with open(status, encoding="utf-8") as f:
            return json.load(f).get("state") == "done"
    return os.path.isfile(os.path.join(folder, "runs", run, "metrics.json"))


def load_runs(folder: str) -> list[RunData]:
    root = os.path.join(folder, "runs")
    if not os.path.isdir(root):
        raise UserError(f"{folder}: no runs/ folder (is it an experiment folder?)")
    runs = [load_run(d) for d in run_dirs(folder) if finished(folder, os.path.basename(d))]
    if not runs:
        raise UserError(f"{root}: no finished run yet")
    return runs


def label(run: RunData) -> str:
    return str(run.config.get("exp_name") or run.config.get("architecture", "?"))


def family(run: RunData) -> str:
    return "PPO" if run.config.get("architecture") in PPO_FAMILY else "IMPALA"


def is_reference(run: RunData) -> bool:
    return label(run).startswith(REFERENCE_PREFIX)


def post_hoc_labels(decl: dict) -> set[str]:
    out = set()
    for item in decl.get("_post_hoc", []):
        out.add(item["label"] if isinstance(item, dict) else str(item))
    return out


def resolve(name: str, labels: Sequence[str]) -> Optional[str]:
    """A declared method name to a run label: itself, or the one swept arm "<name> lambda=<x>" on these seeds."""
    if name in labels:
        return name
    swept = [lab for lab in labels if lab.startswith(name + " lambda=")]
    return swept[0] if len(swept) == 1 else None


# ---------------------------------------------------------------------------------------------------------------------
# protocol and normalisation
# ---------------------------------------------------------------------------------------------------------------------


def protocol(runs: Sequence[RunData]) -> dict:
    """What the evaluation did, read from the runs (configs and eval rows), not from the declarations."""
    greedy = sorted({str(bool(r.config.get("eval_greedy", False))) for r in runs})
    return {"greedy": greedy, "episodes": sorted({int(r.config.get("eval_episodes", 0)) for r in runs}),
            "every": sorted({int(r.config.get("eval_every", 0)) for r in runs}),
            "at_switches": sorted({bool(r.config.get("eval_at_switches", False)) for r in runs}),
            "max_episode_steps": sorted({str(r.config.get("eval_max_episode_steps")) for r in runs})}


def protocol_text(p: dict) -> str:
    policy = {"['True']": "greedy (argmax) actions", "['False']": "sampled actions"}.get(str(p["greedy"]),
                                                                                          f"MIXED greedy {p['greedy']}")
    caps = "whole games" if p["max_episode_steps"] == ["None"] else f"games capped at {p['max_episode_steps']} steps"
    return (f"{policy}, {'/'.join(map(str, p['episodes']))} {caps} per task at each evaluation, every "
            f"{'/'.join(f'{e:,}' for e in p['every'])} agent steps" + (" and at every switch" if p["at_switches"] ==
                                                                         [True] else ""))


def reference_scores(references: Sequence[RunData], n_last: int = cw.CW_LAST_EVALUATIONS) -> dict[str, float]:
    """Per task: the mean over the reference runs that trained it of their final performance (mean of the last
    `n_last` evaluations, Continual World's reading)."""
    per_task: dict[str, list[float]] = {}
    for ref in references:
        for task in {v.regime for v in ref.visits}:
            curve = ref.evals.get(task, [])
            value = cw.tail_mean(curve, n_last)
            if value is not None:
                per_task.setdefault(task, []).append(value)
    return {t: float(np.mean(v)) for t, v in per_task.items()}


def fixed_normalizer(ranges: dict[str, list[float]]) -> Callable[[str, float], float]:
    """The declared fixed ranges: (return - low) / (high - low) per task ("" = the unmodified game)."""
    def norm(task: str, value: float) -> float:
        r = ranges.get(task)
        return (value - r[0]) / (r[1] - r[0]) if r else float("nan")
    return norm


def normalizer(scores: dict[str, float]) -> Callable[[str, float], float]:
    def norm(task: str, value: float) -> float:
        s = scores.get(task)
        return value / s if s else float("nan")
    return norm


# ---------------------------------------------------------------------------------------------------------------------
# per method
# ---------------------------------------------------------------------------------------------------------------------


def method_metrics(runs: Sequence[RunData], references: Sequence[RunData], decl: dict,
                   norm: Callable[[str, float], float]) -> dict:
    """Per-run values of every metric for one method's runs (lists aligned with `runs`)."""
    primary = decl.get("primary_metric", {})
    window = int(primary.get("rolling_mean_count", 20))
    cycles = int(primary.get("num_cycles_for_forgetting", 1))
    task = primary.get("task")
    reading = primary.get("cw_reading", cw.DEFAULT_READING)
    out: dict[str, Any] = {"runs": [r.name for r in runs], "seeds": [r.config.get("seed") for r in runs]}
    f = cora.cora_forgetting(runs, rolling_mean_count=window, num_cycles_for_forgetting=cycles)
    tasks = f["tasks"]
    if task is None:  # "" is a task: the unmodified game
        task = tasks[0] if tasks else None
    key = next((t for t in tasks if task is not None and (t == task or (task and t.endswith(task)))), None)
    out["primary"] = f["by_task"].get(key, {}).get("per_run", [None] * len(runs)) if key is not None else [None] * len(runs)
    out["primary_task"] = key
    out["cora_forgetting"] = f["overall"].get("per_run", [None] * len(runs))
    out["cora_forgetting_2_cycles"] = cora.cora_forgetting(runs, rolling_mean_count=window,
                                                           num_cycles_for_forgetting=2)["overall"].get("per_run")
    out["cora_forgetting_window_20"] = cora.cora_forgetting(runs, rolling_mean_count=20,
                                                            num_cycles_for_forgetting=cycles)["by_task"].get(
        key, {}).get("per_run", [None] * len(runs)) if key is not None else [None] * len(runs)
    out["cora_scales"] = f["scales"]
    out["cora_transfer"] = cora.cora_transfer(runs, rolling_mean_count=window)["overall"].get("per_run")
    out["cw_forgetting"] = [cw.cw_forgetting(r, reading, normalizer=norm)["value"] for r in runs]
    out["cw_forgetting_last"] = [cw.cw_forgetting(r, "last", normalizer=norm)["value"] for r in runs]
    # CW's FT divides by (1 - AUC_ref), 1 being a success rate's ceiling; returns in reference units have none (a
    # method can pass the references), so the report gives CW's numerator, AUC - AUC_ref, in reference units
    out["cw_forward_transfer"] = [cw.cw_forward_transfer(r, references, reading, normalizer=norm,
                                                         ceiling=_unit_ceiling(r, references, norm))["value"]
                                  for r in runs]
    out["average_performance"] = [cw.cw_average_performance(r, normalizer=norm)["value"] for r in runs]
    out["cw_per_regime"] = {}  # regime -> {metric -> per-run values}
    for r in runs:
        f_r = cw.cw_forgetting(r, reading, normalizer=norm)["per_regime"]
        p_r = cw.cw_average_performance(r, normalizer=norm)["per_regime"]
        for regime in r.trained:
            cell = out["cw_per_regime"].setdefault(regime, {"cw_forgetting": [], "final_performance": []})
            cell["cw_forgetting"].append(f_r.get(regime))
            cell["final_performance"].append(p_r.get(regime))
    out["switches"] = switch_effects(runs, norm)
    # the learned check: the end of each task's first visit against the references' final performance (= 1)
    first: dict[str, list[float]] = {}
    first_raw: dict[str, list[float]] = {}  # the same in game score, readable before any reference run finished
    for r in runs:
        seen = set()
        for v in r.visits:
            if v.regime in seen:
                continue
            seen.add(v.regime)
            points = r.evals.get(v.regime, [])
            value = cw.tail_mean([(s, norm(v.regime, y)) for s, y in points], cw.CW_LAST_EVALUATIONS, v.start, v.end)
            raw = cw.tail_mean(points, cw.CW_LAST_EVALUATIONS, v.start, v.end)
            if value is not None:
                first.setdefault(v.regime, []).append(value)
            if raw is not None:
                first_raw.setdefault(v.regime, []).append(raw)
    out["first_visit_end"] = first
    out["first_visit_end_raw"] = first_raw
    return out


def switch_effects(runs: Sequence[RunData], norm: Callable[[str, float], float]) -> list[dict]:
    """Per switch (the k-th visit after the first, into regime b from regime a at step s, the visit ending at e), per
    run: drop = a's return at s minus b's return at s (what the switch costs at once: the policy trained on a, played
    on b), recovery = b's return at e minus b's return at s (what the visit on b wins back); each the evaluation at
    or before that step (--eval_at_switches puts one at s), in the normalised units."""
    out: list[dict] = []
    for k in range(1, len(runs[0].visits)) if runs else []:
        a, b = runs[0].visits[k - 1].regime, runs[0].visits[k].regime
        drops, recoveries = [], []
        for r in runs:
            if len(r.visits) <= k or (r.visits[k - 1].regime, r.visits[k].regime) != (a, b):
                drops.append(None)
                recoveries.append(None)
                continue
            s, e = r.visits[k].start, r.visits[k].end
            ya, yb = at_or_before(r.evals.get(a, []), s), at_or_before(r.evals.get(b, []), s)
            yb_end = at_or_before(r.evals.get(b, []), e)
            drops.append(None if ya is None or yb is None else norm(a, ya) - norm(b, yb))
            recoveries.append(None if yb is None or yb_end is None else norm(b, yb_end) - norm(b, yb))
        out.append({"switch": k, "from": a, "into": b, "step": runs[0].visits[k].start, "drop": drops,
                    "recovery": recoveries})
    return out


def _unit_ceiling(run: RunData, references: Sequence[RunData], norm) -> Callable[[str], float]:
    """A ceiling of AUC_ref + 1 per task, which turns CW's (AUC - AUC_ref) / (C - AUC_ref) into AUC - AUC_ref."""
    def ceiling(task: str) -> float:
        aucs = cw.reference_aucs(references, task, norm)
        return (float(np.mean(aucs)) if aucs else 0.0) + 1.0
    return ceiling


METRIC_COLUMNS = (
    ("primary", "primary"),
    ("cora_forgetting_2_cycles", "CORA forgetting, 2 cycles"),
    ("cora_forgetting_window_20", "CORA forgetting, window 20"),
    ("cw_forgetting", "CW forgetting"),
    ("cw_forward_transfer", "transfer, AUC - AUC_ref (CW)"),
    ("average_performance", "P(T)"),
)


def _values(xs: Sequence[Optional[float]]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def _iv(xs) -> statistics.Interval:
    return statistics.interval(_values(xs))


# ---------------------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------------------


def report(folder: str, out: Optional[str] = None, experiment: Optional[str] = None,
           tuning_check: Optional[dict] = None) -> dict:
    """`tuning_check`: continual.report.tuning.check of this folder against its tuning folder (--tuning), printed at
    the top of the report, a failed check first."""
    decl = declarations(folder, experiment)
    runs = load_runs(folder)
    references = [r for r in runs if is_reference(r)]
    methods: dict[str, list[RunData]] = {}
    for r in runs:
        if not is_reference(r):
            methods.setdefault(label(r), []).append(r)
    if not methods:
        raise UserError(f"{folder}: no finished sequence run yet (only references)")
    ref_scores = reference_scores(references)
    declared_norm = decl.get("normalisation") or {}
    fixed = declared_norm.get("ranges") if declared_norm.get("kind") == "fixed" else None
    norm = fixed_normalizer(fixed) if fixed else normalizer(ref_scores)
    per_method = {m: method_metrics(rs, [ref for ref in references if family(ref) == family(rs[0])], decl, norm)
                  for m, rs in methods.items()}
    table = {m: {k: _iv(v[k]).as_dict() for k, _ in METRIC_COLUMNS} for m, v in per_method.items()}
    labels = list(methods)
    comparisons = {}
    for pair in decl.get("pairs", []):
        x, y = resolve(pair[0], labels), resolve(pair[1], labels)
        if x is None or y is None:
            comparisons[f"{pair[0]} vs {pair[1]}"] = {"missing": [n for n, r in zip(pair, (x, y)) if r is None]}
            continue
        c = {}
        for key, lower in (("primary", True), ("cw_forgetting", True), ("average_performance", False)):
            a, b = _values(per_method[x][key]), _values(per_method[y][key])
            if len(a) >= 2 and len(b) >= 2:
                c[key] = statistics.compare(a, b, lower_is_better=lower).as_dict()
        comparisons[f"{x} vs {y}"] = c
    result = {"folder": folder, "runs": [r.name for r in runs], "declared": {k: v for k, v in decl.items() if not k.startswith("_")},
              "post_hoc": sorted(post_hoc_labels(decl)), "protocol": protocol(runs),
              "normalisation": ({"kind": "fixed", "ranges": fixed} if fixed else
                                {"kind": "reference_runs", "reference_final_return": ref_scores}),
              "per_regime": {m: {regime: {k: _iv(v).as_dict() for k, v in cells.items()}
                                 for regime, cells in per_method[m]["cw_per_regime"].items()} for m in per_method},
              "switches": {m: [{**{k: w[k] for k in ("switch", "from", "into", "step")},
                                "drop": _iv(w["drop"]).as_dict(), "recovery": _iv(w["recovery"]).as_dict()}
                               for w in per_method[m]["switches"]] for m in per_method},
              "table": table, "comparisons": comparisons, "per_method": per_method,
              "provenance": provenance((r.name, r.starts) for r in runs),
              **({"tuning_check": tuning_check} if tuning_check is not None else {})}
    lines = markdown(result)
    result["markdown"] = lines
    if out:
        os.makedirs(out, exist_ok=True)
        curves(methods, norm, os.path.join(out, "curves.png"))
        with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
            f.write(f"# Forgetting ({os.path.basename(os.path.normpath(folder))})\n\n" + "\n".join(lines) +
                    "\n\n![curves](curves.png)\n")
        with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
            json.dump({k: v for k, v in result.items() if k != "markdown"}, f, indent=1)
    return result


def _fmt(d: Optional[dict], digits: int = 3, sign: str = "+") -> str:
    if not d or d.get("estimate") is None:
        return ""
    lo, hi = d["ci"]
    ci = f"[{lo:{sign}.{digits}f}, {hi:{sign}.{digits}f}]" if lo is not None else f"[no interval: {d.get('reason')}]"
    n = d["n"] if not isinstance(d["n"], list) else " vs ".join(map(str, d["n"]))
    return f"{d['estimate']:{sign}.{digits}f} {ci} (n={n})"


def _p(d: Optional[dict]) -> str:
    return "" if not d or d.get("p") is None else f"{d['p']:.3g}"


def markdown(result: dict) -> list[str]:
    decl, prot = result["declared"], result["protocol"]
    primary = decl.get("primary_metric", {})
    post = set(result["post_hoc"])
    mark = (lambda m: f"{m} †" if m in post else m)
    lines = tuning_lines(result["tuning_check"]) if "tuning_check" in result else []
    lines += ([f"**Post hoc**: {decl['post_hoc_declaration']}", ""] if decl.get("post_hoc_declaration") else []) + [
        f"Evaluation: {protocol_text(prot)} (read from the runs' configs).",
        "",
        f"Primary metric{'' if decl.get('post_hoc_declaration') else ' (declared before any run)'}: "
        f"{primary.get('name', '?')} of "
        f"{primary.get('task_is') or (primary['task'] or 'unmodified') if 'task' in primary else 'the first task'}, "
        f"CORA's code: running mean over "
        f"{primary.get('rolling_mean_count', 20)} evaluation points, first "
        f"{primary.get('num_cycles_for_forgetting', 1)} cycle(s), each method scaled by its own largest |return| "
        f"per task; positive = forgotten. Primary pair: {' vs '.join(decl.get('primary_pair', [])) or '?'}.",
        "",
        ("Normalisation of P(T) and CW's metrics (declared): (return - low) / (high - low), " +
         ", ".join(f"{t or 'unmodified'} [{r[0]}, {r[1]}]" for t, r in result["normalisation"]["ranges"].items()) + "."
         if result["normalisation"]["kind"] == "fixed" else
         "Normalisation of P(T) and CW's metrics: each task's return divided by the mean final return (last 5 "
         "evaluations) of the experiment's single-task reference runs on it: " +
         (", ".join(f"{t} {v:.2f}" for t, v in result["normalisation"]["reference_final_return"].items()) or
          "(no reference run finished yet: these columns are empty)") + "."),
        "",
        "Cells: mean over runs [95% Student-t interval] (n runs); the run is the unit of resampling.",
        "",
        "| method | " + " | ".join(name for _, name in METRIC_COLUMNS) + " |",
        "|---|" + "---|" * len(METRIC_COLUMNS),
    ]
    for m, row in result["table"].items():
        lines.append(f"| {mark(m)} | " + " | ".join(_fmt(row[k]) for k, _ in METRIC_COLUMNS) + " |")
    if post:
        lines += ["", "† added after the first results (post hoc), not part of the declared design."]
    lines += ["", "Pairs (declared): X vs Y. P(X better) = rliable's probability of improvement on run scores "
              "[run-level bootstrap 95% interval]; Mann-Whitney and permutation p-values exact, one-sided (H1: X "
              "better); difference = mean(X) - mean(Y) [Welch 95% interval].", "",
              "| pair | metric | P(X better) | Mann-Whitney p | difference | permutation p |", "|---|---|---|---|---|---|"]
    for pair, c in result["comparisons"].items():
        if "missing" in c:
            lines.append(f"| {pair} | (no finished runs of {', '.join(c['missing'])}) | | | | |")
            continue
        for key, d in c.items():
            poi = d["probability_of_improvement"]
            lines.append(f"| {pair} | {key} | {_fmt(poi, 2, sign='')} | {_p(d['mann_whitney'])} | "
                         f"{_fmt(d['mean_difference'])} | {_p(d['permutation'])} |")
    lines += ["", "Per regime (Continual World's forgetting, its reading, and final performance: the mean of the last "
              "5 evaluations of the run), mean over runs [95% t interval]:", "",
              "| method | regime | CW forgetting | final performance |", "|---|---|---|---|"]
    for m, regimes in result["per_regime"].items():
        for regime, cells in regimes.items():
            lines.append(f"| {mark(m)} | {regime or 'unmodified'} | {_fmt(cells['cw_forgetting'])} | "
                         f"{_fmt(cells['final_performance'])} |")
    lines += ["", "Switches: drop = the previous regime's return minus the new one's at the switch; recovery = the new "
              "regime's return at the end of its visit minus at the switch (the evaluation at or before each step, "
              "normalised), mean over runs [95% t interval]:", "",
              "| method | switch | step | drop | recovery |", "|---|---|---|---|---|"]
    for m, switches in result["switches"].items():
        for w in switches:
            lines.append(f"| {mark(m)} | {w['switch']}: {w['from'] or 'unmodified'} -> {w['into'] or 'unmodified'} | "
                         f"{w['step']:,} | {_fmt(w['drop'])} | {_fmt(w['recovery'])} |")
    unit = ("1.0 = the top of the declared range" if result["normalisation"]["kind"] == "fixed" else
            "1.0 = the references' final return")
    lines += ["", "Learned check: the end of each task's first visit (mean of its last 5 evaluations, normalised), mean "
              f"over runs; {unit}; a task counts as learned at >= 0.5. In brackets: the same in game score.", ""]
    tasks = sorted({t for v in result["per_method"].values()
                    for t in list(v["first_visit_end"]) + list(v.get("first_visit_end_raw", {}))})
    lines += ["| method | " + " | ".join(t or "unmodified" for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    for m, v in result["per_method"].items():
        cells = []
        for t in tasks:
            xs = [x for x in v["first_visit_end"].get(t, []) if not math.isnan(x)]
            raw = v.get("first_visit_end_raw", {}).get(t, [])
            cell = (f"{np.mean(xs):.2f}" + ("" if np.mean(xs) >= 0.5 else " (not learned)") if xs
                    else "no reference run yet" if raw else "")
            cells.append(cell + (f" ({np.mean(raw):.1f})" if raw else ""))
        lines.append(f"| {mark(m)} | " + " | ".join(cells) + " |")
    if result.get("provenance"):
        lines += ["", "Provenance (references included):", ""] + provenance_lines(result["provenance"])
    return lines


def tuning_lines(check: dict) -> list[str]:
    """The heading lines of the tuning check: each failed check loudly, then what was chosen and what held."""
    lines = [f"**FAILED CHECK (tuning, {check['tuning_folder']})**: {f}" for f in check["failed"]]
    lines.append(f"Tuning ({check['tuning_folder']}, rule {json.dumps(check['rule'])}): " +
                 "; ".join(f"{p} chose {c['label']!r}" if c else f"{p} has no choice yet"
                           for p, c in check["chosen"].items()) + ".")
    if not check["failed"] and not check["passed"]:
        lines.append("Tuning check: no arm here is marked chosen_from_tuning or runs a sweep's arm on a reporting "
                     "seed yet (nothing to check).")
    return lines + [f"Tuning check passed: {p}." for p in check["passed"]] + [""]


def curves(methods: dict[str, list[RunData]], norm: Callable[[str, float], float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({t for rs in methods.values() for r in rs for t in r.evals})
    fig, axes = plt.subplots(len(tasks), 1, figsize=(10, 3.2 * len(tasks)), squeeze=False)
    for ax, task in zip(axes[:, 0], tasks):
        for m, rs in methods.items():
            curves_ = [r.evals.get(task, []) for r in rs]
            k = min((len(c) for c in curves_), default=0)
            if k == 0:
                continue
            xs = np.array([s for s, _ in curves_[0][:k]]) / 1e6
            ys = np.array([[norm(task, y) for _, y in c[:k]] for c in curves_])
            ax.plot(xs, ys.mean(0), label=f"{m} ({len(rs)})", lw=1.2)
        for v in methods[next(iter(methods))][0].visits[1:]:
            ax.axvline(v.start / 1e6, color="k", lw=0.6, ls=":")
        ax.set_title(task, fontsize=9)
        ax.set_ylabel("return / reference")
        ax.legend(fontsize=6, ncol=3)
    axes[-1, 0].set_xlabel("agent steps (M)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
