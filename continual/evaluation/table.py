"""`eval_table.csv`, the continual evaluation's table (one row per evaluation step x regime): its columns, its reader,
and the rewrite that keeps the rows up to a resumed step. Written by `continual.evaluation.continual`, read by
`continual.evaluation.metrics` and `continual.evaluation.plots`. Also the reader of eval.py's JSON of an evaluation in
which no agent acted (the reports' `--baseline`)."""

from __future__ import annotations

import csv
import json
import os
from typing import Optional

from continual.errors import UserError
from continual.io import atomic_write_csv, storage_errors
from continual.modstrings import normalize_modification

EVAL_TABLE = "eval_table.csv"
COLUMNS = ["step", "modification", "slug", "split", "episodes", "mean", "std", "min", "max", "mean_length",
           "seconds", "greedy", "success_rate",  # success_rate: HER agents only (share of games that reached the goal)
           "max_episode_steps", "capped"]  # the games' step cap (empty: whole games) and how many it cut short
FLOAT_COLUMNS = ("mean", "std", "min", "max", "mean_length", "seconds", "success_rate")
OPTIONAL_INT_COLUMNS = ("max_episode_steps", "capped")  # None where empty (whole games) or absent (older tables)


def read_no_agent_eval(path: str, policy: str) -> tuple[dict, dict[str, dict]]:
    """eval.py's JSON of an evaluation played by `policy` instead of the agent ("constant_action" or
    "random_actions", the key the JSON records): (the JSON, its rows by normalised modification). Anything else is
    a one-line UserError naming --baseline."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"--baseline {path}: cannot read an eval.py JSON ({e})") from None
    played = data.get(policy) if isinstance(data, dict) else None  # constant_action 0 is an action: not falsy here
    if played is None or played is False or not data.get("results"):
        raise UserError(f"--baseline {path}: not an evaluation with --{policy} (eval.py's JSON records {policy})")
    return data, {normalize_modification(r["modification"]): r for r in data["results"]}


def read_rows(path: str) -> list[dict[str, str]]:
    """The rows as written (strings)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_eval_table(path: str) -> list[dict]:
    """The rows with step and episodes as int and the numeric columns as float (NaN where empty or absent, e.g.
    success_rate of a non-HER agent, or a column an older table lacks); max_episode_steps and capped as int (None
    where empty: whole games, or absent)."""
    rows: list[dict] = read_rows(path)
    for r in rows:
        r["step"] = int(r["step"])
        for k in FLOAT_COLUMNS:
            r[k] = float(r[k]) if r.get(k) not in (None, "") else float("nan")
        for k in OPTIONAL_INT_COLUMNS:
            r[k] = int(r[k]) if r.get(k) not in (None, "") else None
        r["episodes"] = int(r["episodes"])
    return rows


def read_run_table(run_dir: str) -> Optional[tuple[dict, list[dict]]]:
    """A run directory's config.json and evaluation rows (`read_eval_table`); None without both or without rows."""
    table, cfg_path = os.path.join(run_dir, EVAL_TABLE), os.path.join(run_dir, "config.json")
    if not (os.path.isfile(table) and os.path.isfile(cfg_path)):
        return None
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    rows = read_eval_table(table)
    return (cfg, rows) if rows else None


def keep_rows_until(path: str, step: Optional[int]) -> set[int]:
    """Rewrite the table (atomically) with the rows up to `step` (None: all of them); the steps kept."""
    rows = read_rows(path)
    if step is not None:
        rows = [r for r in rows if int(r["step"]) <= step]
    with storage_errors(path):
        atomic_write_csv(path, COLUMNS, rows)
    return {int(r["step"]) for r in rows}
