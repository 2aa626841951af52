"""Experiment folders in the launcher's on-disk layout, written from hand-chosen evaluation curves, for the reports'
tests: runs/<name>/ (config.json, metrics.jsonl with the switches, eval_table.csv), configs/<name>.json (the plan),
queue/<name>.status.json, experiment.json. What continual.evaluation.metrics.load_run and the reports read."""

from __future__ import annotations

import csv
import json
import os
from typing import Optional, Sequence


def write_run(folder: str, name: str, config: dict, curves: Optional[dict], steps: Sequence[int],
              switches: Sequence[tuple] = (), greedy: bool = True) -> None:
    """One entry: planned (configs/), and with `curves` (task -> evaluation means at `steps`) run and finished;
    `switches`: (step, previous task, new task). curves=None: planned and queued, not run."""
    for sub in ("configs", "queue"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    with open(os.path.join(folder, "configs", f"{name}.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(folder, "queue", f"{name}.status.json"), "w") as f:
        json.dump({"state": "queued" if curves is None else "done"}, f)
    if curves is None:
        return
    d = os.path.join(folder, "runs", name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step, prev, new in switches:
            f.write(json.dumps({"kind": "switch", "global_step": step, "previous": prev, "modification": new}) + "\n")
        f.write(json.dumps({"kind": "iteration", "global_step": steps[-1], "modification": next(iter(curves))}) + "\n")
    with open(os.path.join(d, "eval_table.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "modification", "slug", "split", "episodes", "mean", "greedy"])
        for task, ys in curves.items():
            for s, y in zip(steps, ys):
                w.writerow([s, task, "x", "curriculum", 10, y, greedy])


def write_experiment(folder: str, data: dict) -> str:
    """The folder's copy of its experiment file."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "experiment.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    return path
