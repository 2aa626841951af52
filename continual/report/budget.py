"""Budget report: the step count a pilot sets for the experiments that wait on it (a placeholder such as BUDGET of
configs/experiments/hackatari_freeway_robustness.json), by a rule declared before the pilot ran.

    python -m continual.report budget PILOT_FOLDER [--out DIR] [--threshold 20] [--window 20480] [--multiple 20480]
                                                   [--declared-threshold D]

The rule (hackatari_freeway_pilot.json's `tuning.criterion`, issue 46): the budget is the smallest step count S, a
multiple of `multiple`, at which every pilot run's mean training-episode return over the last `window` steps is >=
`threshold`: the episodes a run logged with S - window < global_step <= S (the training policy, sampled; whole games,
the raw game score). A step no run has reached, or a window without an episode, is not >= the threshold. The report
prints each run's windowed return at every `every` steps, the first step at which each run alone reaches the
threshold, and the budget, or why there is none yet. The defaults are the Freeway pilot's declared numbers.

A bar changed after the pilot ran is an amendment, and the report says so: with --declared-threshold D (the bar the
pilot declared) and a --threshold that differs, the rule is labelled amended after the pilot, and the budget the
declared bar gives is printed beside the amended one (the Freeway pilot: declared >= 20, which always pressing UP
meets; amended to >= 28).
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

import numpy as np

from continual.errors import UserError
from continual.evaluation.metrics import load_run, provenance, provenance_lines
from continual.launch.queue import run_dirs


def windowed_returns(episodes: Sequence[tuple[int, float]], steps: Sequence[int], window: int) -> list[Optional[float]]:
    """Per step S: the mean return of the episodes with S - window < step <= S (None: no episode there)."""
    ep = sorted(episodes)
    at = np.array([s for s, _ in ep], dtype=np.int64)
    returns = [r for _, r in ep]
    out: list[Optional[float]] = []
    for s in steps:
        lo, hi = int(np.searchsorted(at, s - window, side="right")), int(np.searchsorted(at, s, side="right"))
        # a correctly rounded sum (not a difference of running sums): a mean exactly at the threshold stays there
        out.append(math.fsum(returns[lo:hi]) / (hi - lo) if hi > lo else None)
    return out


def budget(runs: Sequence[dict], threshold: float, window: int, multiple: int) -> Optional[int]:
    """The smallest multiple of `multiple` at which every run's windowed return is >= threshold (None: none yet)."""
    if not runs:
        return None
    last = min(r["end_step"] for r in runs)  # past it some run has no value
    steps = list(range(multiple, last + 1, multiple))
    ok = np.ones(len(steps), dtype=bool)
    for r in runs:
        values = windowed_returns(r["episodes"], steps, window)
        ok &= np.array([v is not None and v >= threshold for v in values], dtype=bool)
    hit = np.flatnonzero(ok)
    return steps[int(hit[0])] if hit.size else None


def first_reached(run: dict, threshold: float, window: int, multiple: int) -> Optional[int]:
    return budget([run], threshold, window, multiple)


def load_runs(folder: str) -> list[dict]:
    root = os.path.join(folder, "runs")
    if not os.path.isdir(root):
        raise UserError(f"{folder}: no runs/ folder (is it an experiment folder?)")
    runs = []
    for path in run_dirs(folder):
        d = os.path.basename(path)
        if not os.path.isfile(os.path.join(path, "config.json")):
            continue
        run = load_run(path)
        runs.append({"run": d, "label": run.config.get("exp_name") or run.config.get("architecture", "?"),
                     "seed": run.config.get("seed"), "total_timesteps": run.config.get("total_timesteps"),
                     "end_step": int(run.end_step), "episodes": [(int(s), float(r)) for s, _, r in run.episodes],
                     "starts": run.starts})
    if not runs:
        raise UserError(f"{root}: no run directory with a config.json yet")
    return runs


def report(folder: str, out: Optional[str] = None, threshold: float = 20.0, window: int = 20480,
           multiple: int = 20480, every: int = 250000, declared_threshold: Optional[float] = None) -> dict:
    for name, v in (("window", window), ("multiple", multiple), ("every", every)):
        if not isinstance(v, int) or v <= 0:
            raise UserError(f"--{name} must be a positive number of steps, got {v!r}")
    for name, v in (("threshold", threshold), ("declared-threshold", declared_threshold)):
        if v is not None and not math.isfinite(v):
            raise UserError(f"--{name} must be a finite return, got {v!r}")
    amended = declared_threshold is not None and declared_threshold != threshold
    runs = load_runs(folder)
    chosen = budget(runs, threshold, window, multiple)
    last = max(r["end_step"] for r in runs)
    shown = list(range(every, last + 1, every))
    rows = []
    for r in runs:
        values = windowed_returns(r["episodes"], [s for s in shown if s <= r["end_step"]], window)
        rows.append({"run": r["run"], "label": r["label"], "seed": r["seed"], "end_step": r["end_step"],
                     "total_timesteps": r["total_timesteps"], "episodes": len(r["episodes"]),
                     "first_reached": first_reached(r, threshold, window, multiple),
                     "windowed": dict(zip(map(str, shown), values))})
    finished = all(r["total_timesteps"] is not None and r["end_step"] >= r["total_timesteps"] for r in runs)
    why = None if chosen is not None else (
        f"no step up to {min(r['end_step'] for r in runs):,} (where the shortest run is) has every run at >= "
        f"{threshold:g}" + ("" if finished else "; some runs have not finished"))
    rule = {"threshold": threshold, "window": window, "multiple": multiple}
    if amended:
        rule["declared_threshold"] = declared_threshold
    result = {"folder": folder, "rule": rule, "budget": chosen, "why_none": why, "all_finished": finished,
              "runs": rows, "provenance": provenance((r["run"], r["starts"]) for r in runs)}
    if amended:
        result["budget_declared"] = budget(runs, declared_threshold, window, multiple)
        for row, r in zip(rows, runs, strict=True):
            row["first_reached_declared"] = first_reached(r, declared_threshold, window, multiple)
    lines = markdown(result, shown)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
            f.write(f"# Pilot budget ({os.path.basename(os.path.normpath(folder))})\n\n" + "\n".join(lines) + "\n")
        with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return {**result, "markdown": lines}


def markdown(result: dict, shown: Sequence[int]) -> list[str]:
    rule = result["rule"]
    declared = rule.get("declared_threshold")
    when = ("declared before the pilot" if declared is None else
            f"amended after the pilot: its bar was declared >= {declared:g} before it ran, and set to "
            f">= {rule['threshold']:g} after its curves were read")
    lines = [f"Rule ({when}): the smallest step count, a multiple of {rule['multiple']:,}, at which "
             f"every run's mean training-episode return over the last {rule['window']:,} steps is >= "
             f"{rule['threshold']:g} (the training policy, sampled; whole games, raw score).", "",
             f"**Budget: {result['budget']:,} steps**" if result["budget"] is not None else
             f"**Budget: none yet** ({result['why_none']})", ""]
    if declared is not None:
        b = result["budget_declared"]
        firsts = ", ".join(f"{r['run']} " + ("-" if r["first_reached_declared"] is None
                                             else f"{r['first_reached_declared']:,}") for r in result["runs"])
        lines += [f"The declared bar (>= {declared:g}) gives " + (f"{b:,} steps" if b is not None else "no budget yet")
                  + f" (each run's first step at it: {firsts}).", ""]
    lines += ["Mean training-episode return over the last window, at each step (- : not reached, or no episode):", "",
              "| run | seed | steps | episodes | first >= threshold | " + " | ".join(f"{s / 1e6:g}M" for s in shown)
              + " |", "|---|---|---|---|---|" + "---|" * len(shown)]
    for r in result["runs"]:
        cells = [("-" if r["windowed"].get(str(s)) is None else f"{r['windowed'][str(s)]:.1f}") for s in shown]
        first = "-" if r["first_reached"] is None else f"{r['first_reached']:,}"
        lines.append(f"| {r['run']} | {r['seed']} | {r['end_step']:,} | {r['episodes']} | {first} | "
                     + " | ".join(cells) + " |")
    if result.get("provenance", {}).get("commits"):
        lines += ["", "Provenance:", ""] + provenance_lines(result["provenance"])
    return lines
