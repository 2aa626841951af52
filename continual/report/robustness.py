"""Robustness report: agents trained on different curricula of modifications, evaluated at the end of training under
every modification of a table (the seed project's own experiment, continual_hackatari's `data/eval_data.csv`).

    python -m continual.report robustness EXPERIMENT_FOLDER --out DIR [--seed-table freeway]
        [--baseline JSON [JSON ...]] [--variant FOLDER] [--post-hoc FOLDER]

Runs. Every run directory under EXPERIMENT_FOLDER/runs with an `eval_table.csv` and a `config.json`; a run is
grouped by its config's `exp_name` (the training curriculum's label, set per arm by the experiment file) and counted
once it reached its `total_timesteps` (its last evaluation is the end-of-run one). Its score under a modification
is the mean return of the evaluation games at the run's last evaluation step (whole games unless the runs capped
them; greedy or sampled as the runs' `eval_greedy` says: both are read from the runs and printed in the heading).

Statistics (continual.evaluation.statistics): per cell, the mean over runs with a Student-t 95% interval (the run is
the unit); the comparisons the issue asks for are differences of means with Welch intervals (two curricula under one
modification; the experiment's declared pairs, else every curriculum against the first) and paired differences
within runs (one curriculum under two modifications: unmodified minus the modification, a paired t interval over its
runs).

The seed's numbers (`--seed-table freeway`, `continual/report/data/continual_hackatari_freeway.json`, extracted
unchanged from the seed's W&B export) are printed beside ours with their own protocol: 1 env, 10M steps, 5 seeds,
21 sampled games per modification; its unmodified column is the training script's post-training evaluation.

A reflex baseline (`--baseline`, the JSON of `eval.py --constant_action A`: a policy that ignores the screen, under
the runs' env settings) is printed as a row of its own, mean over its games: what a modification leaves achievable
without looking (Freeway's always UP: ~22 unmodified, ~40 with the cars stopped), so that a drop is read against it.
It also says which runs learned: a run whose training return at the end does not beat the no-agent score under its
own training strings (their mean; `--baseline` takes several JSONs, e.g. one with the curricula's strings) has not
learned to look (a run on vary_car_speeds that only walks up scores always UP's 27.0 there, above its unmodified
21.8), and where there is one, the differences between curricula are given again over the runs that learned,
labelled post hoc (not declared) with the runs left out. A curriculum of several strings draws them in blocks, so
that window may hold one string only: for such runs the report names the window's strings and gives, post hoc, each
arm's training return per training string over the last third of training beside the no-agent score under it.

A declared evaluation variant (`--variant FOLDER`: eval.py's JSON of each finished run, `FOLDER/<run>.json`, e.g.
the robustness file's greedy games, `python eval.py --agent_path RUN --greedy ... --output FOLDER/<run>`) is a
second table of cells, with its protocol read from the JSONs; it makes no claim. A run without its JSON is named.
`--post-hoc FOLDER` is the same for an evaluation added after the experiment started, labelled so, its reason the
first line of FOLDER/README.md (required).

Columns are the table's modifications (FREEWAY_COLUMNS); the strings an arm was trained on, which the evaluator adds
to each run's evaluation, are a table of their own. Per run: its first scoring training game, and its cost, the wall
time its training processes ran (each start or resume record to the last record before the next; final evaluation
included), with the total over runs.
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

import numpy as np

from continual.errors import UserError
from continual.evaluation import statistics
from continual.evaluation.metrics import provenance, provenance_lines
from continual.evaluation.table import read_no_agent_eval, read_run_table
from continual.io import read_jsonl
from continual.launch import declarations
from continual.launch.queue import run_dirs
from continual.machine import starts_with_machines
from continual.modstrings import normalize_modification
from continual.report.budget import windowed_returns

TRAINING_WINDOW = 20480  # the learned check's window: the Freeway pilot's (hackatari_freeway_pilot.json)
LATE_FRACTION = 3  # the post-hoc per-string training return: the games of the last third of training
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SEED_TABLES = {"freeway": "continual_hackatari_freeway.json"}
# the seed's table, in the column order ("" = the unmodified game)
FREEWAY_COLUMNS = ["", "all_white_cars", "all_black_cars", "stop_all_cars", "stop_all_cars_edge", "stop_random_car",
                   "vary_car_speeds", "disable_cars"]
# the seed's groups whose curricula match ours (its label -> the training strings it used)
SEED_GROUPS = {"baseline": "Freeway-v5 baseline", "colours": "Freeway-v5 Colors",
               "vary_cars_speeds (typo: unmodified)": "Freeway-v5 vary_car_speeds",
               "colours + vary_cars_speeds (typo: colours)": "Freeway-v5 Colors and vary_car_speeds"}
# the seed's group beside each arm of hackatari_freeway_robustness.json (its declared.published; the table):
# its differences and within-run costs are printed under ours, over its runs, with the same intervals
SEED_COUNTERPARTS = {"PPO unmodified": "baseline", "PPO colours": "colours",
                     "PPO colours + vary_car_speeds": "colours + vary_cars_speeds (typo: colours)"}


def load_seed_runs(name: str) -> list[dict]:
    """The seed's runs one by one: [{"label", "run" (its W&B name), "scores": {modification: mean}}], "" its
    training script's post-training evaluation on the unmodified game (its FinalReward); a mean over 5 runs hides a
    column that is 0 in some and ~40 in others."""
    with open(os.path.join(DATA, SEED_TABLES[name]), encoding="utf-8") as f:
        data = json.load(f)
    return [{"label": label, "run": r["name"], "scores": {"": r["training_final_reward"], **r["eval"]}}
            for label, group in SEED_GROUPS.items() for r in data["groups"][group]["runs"]]


def by_group(runs: Sequence[dict]) -> dict:
    """The seed's runs by group: {group label: {modification: [values per run]}}."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        for m, v in r["scores"].items():
            out.setdefault(r["label"], {}).setdefault(m, []).append(v)
    return out


def load_seed_table(name: str) -> dict:
    return by_group(load_seed_runs(name))


def run_scores(run_dir: str) -> Optional[dict]:
    """One finished run: its label, seed, protocol and {modification: mean return at the last evaluation step}."""
    read = read_run_table(run_dir)
    if read is None:
        return None
    cfg, rows = read
    last = max(r["step"] for r in rows)
    if cfg.get("total_timesteps") and last < cfg["total_timesteps"]:
        return None  # unfinished: its last evaluation is not the end-of-run one
    final = [r for r in rows if r["step"] == last]
    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    games = [(int(r["global_step"]), float(r["return"]), normalize_modification(r.get("modification") or ""))
             for r in records if r.get("kind") == "episode"]
    episodes = [(step, ret) for step, ret, _ in games]
    return {"run": os.path.basename(run_dir), "label": cfg.get("exp_name") or cfg.get("architecture", "?"),
            "seed": cfg.get("seed"), "step": last,
            "greedy": sorted({str(r.get("greedy")) for r in final}), "episodes": sorted({r["episodes"] for r in final}),
            "mean_length": {normalize_modification(r["modification"]): r["mean_length"] for r in final},
            "scores": {normalize_modification(r["modification"]): r["mean"] for r in final},
            "training": sorted({normalize_modification(r["modification"]) for r in final
                                if r.get("split") == "curriculum"}),
            "training_return": windowed_returns(episodes, [last], TRAINING_WINDOW)[0] if episodes else None,
            "training_games": len(episodes), "first_score": first_score(episodes),
            "window_strings": sorted({m for step, _, m in games if last - TRAINING_WINDOW < step <= last}),
            "late": late_by_string(games, last), "wall_seconds": wall_seconds(records),
            "starts": starts_with_machines(run_dir, records)}


def late_by_string(games: Sequence[tuple[int, float, str]], last: int) -> dict:
    """The run's training return per training string over the last third of its training: {string: {"mean",
    "games"}} over the games that ended at steps in (last - last // 3, last]. A mixture draws its strings in blocks
    (~26,600 agent steps in the Freeway files), so the learned check's last 20,480 steps may hold one of them only;
    a third of 1.5M steps holds each of five strings several times."""
    start = last - last // LATE_FRACTION
    by: dict[str, list[float]] = {}
    for step, ret, m in games:
        if start < step <= last:
            by.setdefault(m, []).append(ret)
    return {m: {"mean": math.fsum(v) / len(v), "games": len(v)} for m, v in sorted(by.items())}


def wall_seconds(records: Sequence[dict]) -> Optional[float]:
    """The seconds the run's training processes ran: from each "start" record (a launch or a resume) to the last
    record before the next one, summed, so a run stopped for hours between sessions counts only its running time
    (its final evaluation included). None for records without a start."""
    total, begun, last = 0.0, None, None
    for r in records:
        if r.get("kind") == "start":
            if begun is not None:
                total += last - begun
            begun = last = r["time"]
        elif begun is not None and "time" in r:
            last = r["time"]
    return None if begun is None else total + last - begun


def first_score(episodes: Sequence[tuple[int, float]]) -> Optional[int]:
    """The agent step at which the run's first training game with a positive return ended (None: none did): on
    Freeway it tells a run that never crossed the road from one that crossed and then lost it, and when the
    crossing was found."""
    return next((step for step, ret in sorted(episodes) if ret > 0), None)


def load_runs(folder: str) -> list[dict]:
    root = os.path.join(folder, "runs")
    if not os.path.isdir(root):
        raise UserError(f"{folder}: no runs/ folder (is it an experiment folder?)")
    runs = [s for s in (run_scores(d) for d in run_dirs(folder)) if s]
    if not runs:
        raise UserError(f"{root}: no finished run with an evaluation table yet")
    return runs


def declared_pairs(folder: str) -> list[tuple[str, str]]:
    """The pairs the experiment declared (primary pair first), [] for a folder without declarations."""
    if not any(os.path.exists(os.path.join(folder, f)) for f in (declarations.RECORD, "experiment.json")):
        return []
    declared = declarations.read_declarations(folder).declared
    pairs = [tuple(declared["primary_pair"])] if "primary_pair" in declared else []
    return list(dict.fromkeys(pairs + [tuple(p) for p in declared.get("pairs", [])]))


def load_baseline(paths: str | Sequence[str]) -> dict:
    """eval.py's JSONs of one constant-action evaluation (several: their modifications together): {"path", "action",
    "episodes", "scores": {modification: mean}}."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    loaded = [_load_baseline(p) for p in paths]
    if len({(b["action"], b["env_id"]) for b in loaded}) > 1:
        raise UserError(f"--baseline {' '.join(paths)}: not one action on one game")
    return {"path": ", ".join(paths), "action": loaded[0]["action"], "env_id": loaded[0]["env_id"],
            "episodes": sorted({e for b in loaded for e in b["episodes"]}),
            "scores": {m: v for b in loaded for m, v in b["scores"].items()}}


def _load_baseline(path: str) -> dict:
    data, rows = read_no_agent_eval(path, "constant_action")
    return {"path": path, "action": data["constant_action"], "env_id": data.get("env_id"),
            "episodes": sorted({r["episodes"] for r in rows.values()}),
            "scores": {m: r["mean"] for m, r in rows.items()}}


def load_variant(folder: str, runs: Sequence[dict], flag: str = "--variant", reason: bool = False) -> dict:
    """eval.py's JSON per run, FOLDER/<run>.json: {"runs": [run dicts with the variant's scores], "missing": [...],
    "greedy": [...], "episodes": [...], "why"} (a run dict as run_scores's, its scores those of the variant);
    `reason`: FOLDER/README.md must say why (its first line, "why")."""
    if not os.path.isdir(folder):
        raise UserError(f"{flag} {folder}: not a folder of eval.py JSONs (<run>.json)")
    out, missing, greedy, episodes = [], [], set(), set()
    for r in runs:
        path = os.path.join(folder, r["run"] + ".json")
        if not os.path.exists(path):
            missing.append(r["run"])
            continue
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            rows = data["results"]
            greedy.add(bool(data["greedy"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{flag} {path}: not an eval.py JSON ({e})") from None
        if data.get("constant_action") is not None:
            raise UserError(f"{flag} {path}: a --constant_action evaluation, not the run's agent")
        episodes.update(row["episodes"] for row in rows)
        out.append({**r, "scores": {normalize_modification(row["modification"]): row["mean"] for row in rows}})
    why = None
    if reason:
        readme = os.path.join(folder, "README.md")
        if not os.path.exists(readme):
            raise UserError(f"{flag} {folder}: no README.md saying why the evaluation was added (its first line)")
        with open(readme, encoding="utf-8") as f:
            why = f.readline().strip().lstrip("# ")
    return {"folder": folder, "runs": out, "missing": missing, "greedy": sorted(greedy), "episodes": sorted(episodes),
            "why": why}


def evaluated(runs: Sequence[dict], columns: Sequence[str]) -> list[str]:
    """The modifications these runs were evaluated under: the given columns' order first, then the others sorted."""
    asked, others = split_columns(runs, columns)
    return asked + others


def split_columns(runs: Sequence[dict], columns: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the given columns these runs were evaluated under, in their order; the other strings they were evaluated
    under, sorted): the evaluator adds each run's own training strings, which are no column of the table asked for.
    Runs evaluated under none of the given columns (another game) show all their strings as columns."""
    seen = {m for r in runs for m in r["scores"]}
    asked = [m for m in columns if m in seen]
    return (asked, sorted(seen - set(asked))) if asked else (sorted(seen), [])


def summarize(runs: Sequence[dict], columns: Sequence[str]) -> dict:
    """{label: {modification: Interval over that label's runs}} for every column some run evaluated."""
    labels = list(dict.fromkeys(r["label"] for r in runs))
    table: dict = {}
    for label in labels:
        rs = [r for r in runs if r["label"] == label]
        table[label] = {m: statistics.interval([r["scores"][m] for r in rs if m in r["scores"]])
                        for m in columns if any(m in r["scores"] for r in rs)}
    return table


def compare_labels(runs: Sequence[dict], x: str, y: str, modification: str) -> Optional[statistics.Interval]:
    """mean(x) - mean(y) under one modification, Welch interval."""
    a = [r["scores"][modification] for r in runs if r["label"] == x and modification in r["scores"]]
    b = [r["scores"][modification] for r in runs if r["label"] == y and modification in r["scores"]]
    if not a or not b:
        return None
    return statistics.welch_interval(a, b)


def paired_drop(runs: Sequence[dict], label: str, modification: str) -> Optional[statistics.Interval]:
    """Within each run of `label`: unmodified minus `modification`; t interval over runs (> 0: the modification
    costs return)."""
    d = [r["scores"][""] - r["scores"][modification] for r in runs
         if r["label"] == label and "" in r["scores"] and modification in r["scores"]]
    return statistics.interval(d) if d else None


def seed_difference(seed_runs: Sequence[dict], x: str, y: str, modification: str) -> Optional[statistics.Interval]:
    """`compare_labels` over the seed's runs: its groups beside arms x and y."""
    return compare_labels(seed_runs, SEED_COUNTERPARTS.get(x), SEED_COUNTERPARTS.get(y), modification)


def seed_drop(seed_runs: Sequence[dict], label: str, modification: str) -> Optional[statistics.Interval]:
    """`paired_drop` over the seed's runs: its group beside arm `label`."""
    return paired_drop(seed_runs, SEED_COUNTERPARTS.get(label), modification)


def _cell(iv: Optional[statistics.Interval]) -> str:
    return "" if iv is None else iv.format(digits=1)


def no_agent_training(run: dict, baseline: dict) -> tuple[float, bool]:
    """What the no-agent policy scores under the run's training strings (their mean: a curriculum's draws are
    uniform), and whether the baseline has them all; else its unmodified score, and False."""
    strings = run.get("training") or [""]
    if all(m in baseline["scores"] for m in strings):
        return float(np.mean([baseline["scores"][m] for m in strings])), True
    return baseline["scores"][""], False


def learned(run: dict, baseline: dict) -> bool:
    """The run's training return at the end beats what the no-agent policy scores under its training strings
    (a run on vary_car_speeds that only walks up scores always UP's 27.0 there, above its unmodified 21.8)."""
    return run.get("training_return") is not None and run["training_return"] > no_agent_training(run, baseline)[0]


def baseline_row(baseline: dict, columns: Sequence[str]) -> str:
    games = ", ".join(map(str, baseline["episodes"]))
    cells = [f"{baseline['scores'][m]:.1f}" if m in baseline["scores"] else "" for m in columns]
    return "| " + " | ".join([f"*no agent: action {baseline['action']} every step* ({games} games)"] + cells) + " |"


def markdown(runs: Sequence[dict], table: dict, columns: Sequence[str], seed: Optional[dict],
             pairs: Sequence[tuple[str, str]], baseline: Optional[dict] = None, extras: Sequence[tuple] = (),
             learned_pairs: Optional[dict] = None, seed_runs: Sequence[dict] = (), own: Sequence[str] = (),
             own_table: Optional[dict] = None) -> list[str]:
    """`extras`: (key, heading, loaded variant, its columns, its cells by label); `learned_pairs`: the differences
    over the runs that learned, {"left_out", "intervals": {(x, y): {modification: interval}}}; `own`: the runs'
    training strings outside `columns`, `own_table` their cells by label."""
    greedy = sorted({g for r in runs for g in r["greedy"]})
    episodes = sorted({e for r in runs for e in r["episodes"]})
    policy = {"['True']": "greedy (argmax)", "['False']": "sampled"}.get(str(greedy), f"mixed {greedy}")
    lengths = [v for r in runs for v in r["mean_length"].values()]
    lines = [f"Evaluation at the end of training: {policy} actions, {', '.join(map(str, episodes))} whole games per "
             f"modification (mean game length {min(lengths):.0f}-{max(lengths):.0f} agent steps); "
             f"cells: mean return over runs [95% t interval] (n runs).", ""]
    head = ["trained on"] + [m or "unmodified" for m in columns]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, cells in table.items():
        lines.append("| " + " | ".join([label] + [_cell(cells.get(m)) for m in columns]) + " |")
    if baseline:
        lines.append(baseline_row(baseline, columns))
        lines += ["", f"The last row plays one action ({baseline['action']}) whatever it sees: what each "
                  f"modification leaves achievable without looking (`eval.py --constant_action`, "
                  f"`{baseline['path']}`)."]
    if own:
        lines += ["", "Under the arms' own training strings (the evaluator adds each run's training strings to its "
                  "evaluation; no column of the table above)" + (", the seed's runs' means below ours" if seed else "")
                  + ":", "", "| trained on | " + " | ".join(own) + " |", "|---|" + "---|" * len(own)]
        for label, cells in (own_table or {}).items():
            if cells:
                lines.append("| " + " | ".join([label] + [_cell(cells.get(m)) for m in own]) + " |")
        for label, cells in (seed or {}).items():
            if any(m in cells for m in own):
                lines.append("| " + " | ".join([f"{label} (seed)"] + [_cell(statistics.interval(cells[m])) if m in cells
                                                                      else "" for m in own]) + " |")
        if baseline:
            lines.append(baseline_row(baseline, own))
    for _, kind, extra, shown, cells_by_label in extras:
        policy = {"[False]": "sampled", "[True]": "greedy (argmax)"}.get(str(extra["greedy"]), "mixed")
        games = ", ".join(map(str, extra["episodes"]))
        lines += ["", f"{kind}: {policy} actions, {games} whole games per modification "
                  f"(eval.py's JSONs in `{extra['folder']}`)" + (f"; why: {extra['why']}" if extra["why"] else "")
                  + "; mean over runs [95% t interval]"
                  + (f"; no JSON yet for {', '.join(extra['missing'])}" if extra["missing"] else "") + ":", ""]
        lines += ["| " + " | ".join(["trained on"] + [m or "unmodified" for m in shown]) + " |",
                  "|" + "---|" * (len(shown) + 1)]
        for label, cells in cells_by_label.items():
            lines.append("| " + " | ".join([label] + [_cell(cells.get(m)) for m in shown]) + " |")
        if baseline:
            lines.append(baseline_row(baseline, shown))
    if seed:
        lines += ["", "The seed's runs (continual_hackatari `data/eval_data.csv`: PPO with 1 env, 10M steps, 21 sampled "
                  "games; unmodified = the training script's post-training evaluation), mean over its runs "
                  "[95% t interval]:", "", "| " + " | ".join(["trained on (seed)"] + head[1:]) + " |",
                  "|" + "---|" * len(head)]
        for label, cells in seed.items():
            lines.append("| " + " | ".join([label] + [_cell(statistics.interval(cells[m])) if m in cells else ""
                                                      for m in columns]) + " |")
    if pairs:
        lines += ["", "Differences between curricula (mean of the first minus the second, Welch 95% interval):", "",
                  "| first | second | " + " | ".join(m or "unmodified" for m in columns) + " |",
                  "|---|---|" + "---|" * len(columns)]
        for x, y in pairs:
            lines.append(f"| {x} | {y} | " + " | ".join(_cell(compare_labels(runs, x, y, m)) for m in columns) + " |")
        for x, y in pairs:
            if SEED_COUNTERPARTS.get(x) in (seed or {}) and SEED_COUNTERPARTS.get(y) in (seed or {}):
                lines.append(f"| {SEED_COUNTERPARTS[x]} (seed) | {SEED_COUNTERPARTS[y]} (seed) | "
                             + " | ".join(_cell(seed_difference(seed_runs, x, y, m)) for m in columns) + " |")
    lines += ["", f"Did the runs learn? Training return at the end (the sampled training games of the last "
              f"{TRAINING_WINDOW:,} steps, under the run's own curriculum), mean over runs [95% t interval], lowest run"
              + (f"; runs whose unmodified evaluation beats the no-agent row's {baseline['scores']['']:.1f}"
                 if baseline and "" in baseline["scores"] else "") + ":", ""]
    for label in table:
        rs = [r for r in runs if r["label"] == label]
        ends = [r["training_return"] for r in rs if r.get("training_return") is not None]
        line = f"- {label}: " + (f"{_cell(statistics.interval(ends))}, lowest {min(ends):.1f}" if ends else
                                 "no training episode in the window")
        if baseline and "" in baseline["scores"]:
            beat = sum(r["scores"].get("", -math.inf) > baseline["scores"][""] for r in rs)
            line += f"; {beat} of {len(rs)} runs beat it"
            bars = sorted({(round(v, 1), whole) for v, whole in (no_agent_training(r, baseline) for r in rs)})
            shown = ", ".join(f"{v:.1f}" + ("" if whole else " (unmodified: not all its strings measured)")
                              for v, whole in bars)
            line += (f"; the no-agent score under its training strings {shown}, beaten by the training return of "
                     f"{sum(learned(r, baseline) for r in rs)} of {len(rs)} runs")
        lines.append(line)
    lines += late_lines(runs, table, baseline)
    if learned_pairs and learned_pairs["left_out"] and pairs:
        lines += ["", "Post hoc, not declared: the differences between curricula over the runs that learned (training "
                  "return at the end above the no-agent score under the run's training strings, above); left out: "
                  f"{', '.join(learned_pairs['left_out'])}:", "",
                  "| first | second | " + " | ".join(m or "unmodified" for m in columns) + " |",
                  "|---|---|" + "---|" * len(columns)]
        for x, y in pairs:
            lines.append(f"| {x} | {y} | " + " | ".join(_cell(learned_pairs["intervals"][(x, y)][m]) for m in columns)
                         + " |")
    lines += ["", "Cost of each modification within runs (unmodified minus modified, paired t 95% interval; > 0: the "
              "modification lowers the return):", "", "| trained on | " + " | ".join(m for m in columns if m) + " |",
              "|---|" + "---|" * len([m for m in columns if m])]
    for label in table:
        lines.append(f"| {label} | " + " | ".join(_cell(paired_drop(runs, label, m)) for m in columns if m) + " |")
    for label in table:
        if SEED_COUNTERPARTS.get(label) in (seed or {}):
            lines.append(f"| {SEED_COUNTERPARTS[label]} (seed) | "
                         + " | ".join(_cell(seed_drop(seed_runs, label, m)) for m in columns if m) + " |")
    # a mean over 5 runs hides a bimodal column (a stopped car: 0 or ~40 per run) and a run that never learned
    hours = [r["wall_seconds"] / 3600 for r in runs if r.get("wall_seconds") is not None]
    if hours:
        lines += ["", f"Cost: {len(hours)} runs, {min(hours):.2f}-{max(hours):.2f} h of wall time each (median "
                  f"{float(np.median(hours)):.2f}), {sum(hours):.1f} h in all: the time their training processes ran, "
                  "final evaluation included, the time between a kill and a resume left out (a stopped but living "
                  "process, SIGSTOP, still counts), on whatever machine and load they had."]
    lines += ["", "Per run: the mean return of its games under each modification, its training return at the end, "
              "the agent step at which its first scoring training game ended, and its wall time:",
              "", "| run | trained on | training | first score | hours | "
              + " | ".join(m or "unmodified" for m in columns) + " |", "|---|---|---|---|---|" + "---|" * len(columns)]
    for r in runs:
        end = "" if r.get("training_return") is None else f"{r['training_return']:.1f}"
        first = ("" if not r.get("training_games") else "never" if r.get("first_score") is None
                 else f"{r['first_score']:,}")
        wall = "" if r.get("wall_seconds") is None else f"{r['wall_seconds'] / 3600:.2f}"
        lines.append(f"| {r['run']} | {r['label']} | {end} | {first} | {wall} | "
                     + " | ".join(f"{r['scores'][m]:.1f}" if m in r["scores"] else "" for m in columns) + " |")
    if seed_runs:
        lines += ["", "The seed's runs one by one (its W&B run names; unmodified: its post-training evaluation):", "",
                  "| seed run | trained on (seed) | " + " | ".join(m or "unmodified" for m in columns) + " |",
                  "|---|---|" + "---|" * len(columns)]
        for r in seed_runs:
            lines.append(f"| {r['run']} | {r['label']} | "
                         + " | ".join(f"{r['scores'][m]:.1f}" if m in r["scores"] else "" for m in columns) + " |")
    return lines


def late_lines(runs: Sequence[dict], table: dict, baseline: Optional[dict]) -> list[str]:
    """Post hoc: which strings the learned check's window held, for runs trained on several, and each arm's training
    return per training string over the last third of training against the no-agent score under that string."""
    mixed = [r for r in runs if len(r.get("training") or ()) > 1]  # trained on several strings
    if not mixed:
        return []
    starts = ", ".join(f"{s:,}" for s in sorted({r["step"] - r["step"] // LATE_FRACTION for r in runs}))
    lines = ["", f"Post hoc, not declared (added to the report after runs had been read): a curriculum of several "
             f"strings draws them in blocks, so the {TRAINING_WINDOW:,} steps the learned check reads may hold one "
             "string only. The strings of each such run's games there: "
             + "; ".join(f"{r['run']}: {', '.join(m or 'unmodified' for m in r['window_strings']) or 'no game'}"
                         for r in mixed) + ".", "",
             f"Training return per training string over the last third of training (games ending after {starts} "
             "agent steps), mean over runs of each run's mean [95% t interval] (n runs), the no-agent score under the "
             "string and the runs above it:", "", "| trained on | training string | training return, last third | no agent | "
             "runs above it |", "|---|---|---|---|---|"]
    for label in table:
        rs = [r for r in runs if r["label"] == label]
        for m in sorted({m for r in rs for m in r.get("late") or {}}):
            means = [r["late"][m]["mean"] for r in rs if m in (r.get("late") or {})]
            bar = baseline["scores"].get(m) if baseline else None
            above = "" if bar is None else f"{sum(v > bar for v in means)} of {len(means)}"
            lines.append(f"| {label} | {m or 'unmodified'} | {_cell(statistics.interval(means))} | "
                         f"{'' if bar is None else f'{bar:.1f}'} | {above} |")
    return lines


def heatmap_rows(table: dict, columns: Sequence[str], seed: Optional[dict] = None,
                 baseline: Optional[dict] = None) -> tuple[list[str], np.ndarray]:
    """The heatmap's rows, top to bottom: our arms, the no-agent policy, the seed's groups (mean over its runs)."""
    rows = [(f"{lab} (ours)" if seed else lab, [table[lab][m].estimate if m in table[lab] else np.nan for m in columns])
            for lab in table]
    if baseline:
        rows.append((f"no agent: action {baseline['action']} every step",
                     [baseline["scores"].get(m, np.nan) for m in columns]))
    for lab, cells in (seed or {}).items():
        rows.append((f"{lab} (seed, 10M steps)", [float(np.mean(cells[m])) if m in cells else np.nan for m in columns]))
    return [lab for lab, _ in rows], np.array([v for _, v in rows], dtype=np.float64)


def heatmap(table: dict, columns: Sequence[str], path: str, seed: Optional[dict] = None,
            baseline: Optional[dict] = None) -> None:
    """Training curriculum x evaluation modification, ours above the no-agent row and the seed's groups, on one
    colour scale; lines separate the three."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values = heatmap_rows(table, columns, seed, baseline)
    fig, ax = plt.subplots(figsize=(1.3 * len(columns) + 3, 0.6 * len(labels) + 1.5))
    im = ax.imshow(values, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(columns)), [m or "unmodified" for m in columns], rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for i in range(len(labels)):
        for j in range(len(columns)):
            if np.isfinite(values[i, j]):
                ax.text(j, i, f"{values[i, j]:.1f}", ha="center", va="center", color="w", fontsize=8)
    for edge in [len(table)] + ([len(table) + 1] if baseline else []):  # below ours, below the no-agent row
        if edge < len(labels):
            ax.axhline(edge - 0.5, color="w", linewidth=2)
    fig.colorbar(im, ax=ax, label="mean evaluation return")
    ax.set_xlabel("evaluated under")
    ax.set_ylabel("trained on")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(folder: str, out: Optional[str] = None, seed_table: Optional[str] = "freeway",
           columns: Sequence[str] = FREEWAY_COLUMNS, pairs: Sequence[tuple[str, str]] = (),
           baseline: Optional[str] = None, variant: Optional[str] = None, post_hoc: Optional[str] = None) -> dict:
    reflex = load_baseline(baseline) if baseline else None
    runs = load_runs(folder)
    other = load_variant(variant, runs) if variant else None
    added = load_variant(post_hoc, runs, "--post-hoc", reason=True) if post_hoc else None
    columns, own = split_columns(runs, [normalize_modification(m) for m in columns])
    table, own_table = summarize(runs, columns), summarize(runs, own)
    seed_runs = load_seed_runs(seed_table) if seed_table else []
    seed = by_group(seed_runs) if seed_table else None
    labels = list(table)
    if not pairs:  # the experiment's declared pairs (its record or experiment.json), those with runs of both
        pairs = [(x, y) for x, y in declared_pairs(folder) if x in table and y in table]
    if not pairs and len(labels) > 1:
        pairs = [(lab, labels[0]) for lab in labels[1:]]  # every curriculum against the first (unmodified) one
    learned_pairs = None
    if reflex and "" in reflex["scores"]:
        kept = [r for r in runs if learned(r, reflex)]
        learned_pairs = {"criterion": "training return at the end > the no-agent score under the run's training "
                                      "strings (the mean over them)",
                         "left_out": [r["run"] for r in runs if not learned(r, reflex)],
                         "intervals": {(x, y): {m: compare_labels(kept, x, y, m) for m in columns} for x, y in pairs}}
    extras = []
    for key, kind, extra in (("variant", "Declared variant, no claim", other),
                             ("post_hoc", "Post-hoc evaluation, added after the experiment started (not declared)",
                              added)):
        if extra is not None:
            shown = evaluated(extra["runs"], columns)
            extras.append((key, kind, extra, shown, summarize(extra["runs"], shown)))
    lines = markdown(runs, table, columns, seed, pairs, reflex, extras, learned_pairs, seed_runs, own, own_table)
    lines += ["", "Provenance:", ""] + provenance_lines(provenance((r["run"], r["starts"]) for r in runs))
    result = {"folder": folder, "columns": columns,
              "table": {lab: {m: iv.as_dict() for m, iv in cells.items()} for lab, cells in table.items()},
              "own_columns": own,
              "own_table": {lab: {m: iv.as_dict() for m, iv in cells.items()} for lab, cells in own_table.items()},
              "pairs": {f"{x} - {y}": {m: (iv.as_dict() if (iv := compare_labels(runs, x, y, m)) else None)
                                       for m in columns} for x, y in pairs},
              "paired_drop": {lab: {m: (iv.as_dict() if (iv := paired_drop(runs, lab, m)) else None)
                                    for m in columns if m} for lab in labels},
              "runs": runs}
    if seed:  # the seed's counterparts of "pairs" and "paired_drop", keyed by our arms
        result["seed_pairs"] = {f"{x} - {y}": {m: iv.as_dict() if (iv := seed_difference(seed_runs, x, y, m)) else None
                                               for m in columns} for x, y in pairs}
        result["seed_paired_drop"] = {lab: {m: iv.as_dict() if (iv := seed_drop(seed_runs, lab, m)) else None
                                            for m in columns if m} for lab in labels}
    if reflex:
        result["baseline"] = reflex
    if learned_pairs:
        result["learned"] = {"criterion": learned_pairs["criterion"], "left_out": learned_pairs["left_out"],
                             "pairs": {f"{x} - {y}": {m: iv.as_dict() if iv else None for m, iv in cells.items()}
                                       for (x, y), cells in learned_pairs["intervals"].items()}}
    for key, _, extra, _, cells_by_label in extras:
        result[key] = {k: extra[k] for k in ("folder", "greedy", "episodes", "missing", "why")} | {
            "table": {lab: {m: iv.as_dict() for m, iv in cells.items()} for lab, cells in cells_by_label.items()}}
    if out:
        os.makedirs(out, exist_ok=True)
        heatmap(table, columns, os.path.join(out, "heatmap.png"), seed, reflex)
        with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
            f.write(f"# Robustness under modifications ({os.path.basename(os.path.normpath(folder))})\n\n" +
                    "\n".join(lines) + "\n\n![heatmap](heatmap.png)\n")
        with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    result["markdown"] = lines
    return result
