"""Forgetting on a MinAtar task sequence (issues 14, 15): methods x seeds, continual evaluation on every task.

    python bench/forgetting.py                                  # the 6 default methods x 3 seeds (~1 h on 2 cores)
    python bench/forgetting.py --methods CLEAR PNC              # more methods into the same results (after merging them)
    python bench/forgetting.py --seeds 1 --steps_per_task 4096 --out /tmp/fg   # smoke test
    python bench/forgetting.py --aggregate_only                 # tables and plots from the runs already done

Every run trains one agent on the same TaskSequence (`--games` in order, `--cycles` times, `--steps_per_task` agent
steps each; 8 envs, CleanRL's PPO settings as configs/minatar_3games_2cycles.json) and evaluates the policy on every
task at step 0, every `--eval_every` steps, right before every switch and at the end (`--eval_episodes` whole games
per task; continual/evaluation/continual.py). The metrics are the project's (continual/evaluation/metrics.py) on
returns normalised per task by max|R| over all runs of the benchmark (`--normalize max_abs`, so tasks weigh alike):

- average performance P(T) (Continual World): the final evaluation score, mean over tasks;
- forgetting at the end of the last visit (`forgetting_last_visit`): score at the end of the task's last visit minus
  the final score, one evaluation each, mean over all tasks (the one trained last contributes 0); and forgetting over
  all later visits (`forgetting_all_visits`: score drop over each later visit of another task). Neither is CORA's or
  Continual World's exact metric (continual/evaluation/cora.py, continual/evaluation/cw.py);
- forward transfer (zero-shot, at the switches): score change on a task while other tasks are trained before its
  first visit.

Each is reported per method as the mean over the runs x tasks matrix with a 95% stratified-bootstrap CI
(`metrics.stratified_bootstrap`, runs resampled within each task); `metrics.robust_aggregate` adds IQM and the
probability of improvement to the JSON.

Runs are resumable: a run whose directory holds `bench_done.json` is skipped; one without (a crash, Ctrl-C) is
deleted and trained again, so a crash loses one run. Runs go one at a time, methods round-robin within each seed,
each with `--torch_threads 1` (run this script under `nice -n 10`). Outputs under `--out`: forgetting.json,
forgetting_curves.png (tasks as panels, methods as lines, mean over seeds with a 95% CI band), forgetting_comparison.png.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (puts the repository root on sys.path)

from continual.evaluation import metrics as M  # noqa: E402
from continual.io import atomic_write_json  # noqa: E402

ROOT = common.REPO_ROOT
# IMPALA's usual optimiser values (configs/impala_freeway.json): its losses are sums over the batch (gradient norms
# ~100-200 here), which the default clip of 0.5 (PPO's) cuts ~300x, below RMSprop's eps of 0.01
IMPALA = ["--num_actors", "2", "--learning_rate", "0.0006", "--max_grad_norm", "40"]
# method -> training flags. One line per method. EWC lambdas are CORA's defaults (500 ewc, 25 online) with CORA's
# Fisher (--ewc_fisher cora, the default): IMPALA's losses are sums over the batch, as CORA's.
METHODS: dict[str, list[str]] = {
    "PPO": ["--architecture", "PPO"],
    "PPO_CBP": ["--architecture", "PPO_CBP"],
    "PPO+S&P": ["--architecture", "PPO", "--shrink_and_perturb"],
    "IMPALA": ["--architecture", "IMPALA", *IMPALA],
    "IMPALA+EWC": ["--architecture", "IMPALA", *IMPALA, "--ewc", "ewc"],
    "IMPALA+online EWC": ["--architecture", "IMPALA", *IMPALA, "--ewc", "online", "--ewc_lambda", "25"],
    "CLEAR": ["--architecture", "CLEAR", *IMPALA],
    "PNC": ["--architecture", "PNC", *IMPALA],
}
DEFAULT_METHODS = ["PPO", "PPO_CBP", "PPO+S&P", "IMPALA", "IMPALA+EWC", "IMPALA+online EWC"]
GAMES = ("Breakout", "Freeway", "SpaceInvaders", "Asterix", "Seaquest")
DONE = "bench_done.json"
# (key, column title): per-task metrics reported per method; forgetting: positive = forgot, transfer: positive = gained
TABLE_KEYS = (("final", "average performance P(T)"), ("average", "time-average performance"),
              ("forgetting_last_visit", "forgetting (end of last visit)"),
              ("forgetting_all_visits", "forgetting (all later visits)"),
              ("transfer_zero_shot", "forward transfer (zero-shot)"))


def run_slug(method: str, seed: int) -> str:
    return "".join(c if c.isalnum() else "_" for c in method) + f"__s{seed}"


def sequence_config(games: Sequence[str], steps: int, cycles: int, eval_every: int, eval_episodes: int) -> dict:
    return {
        "env_id": f"MinAtar/{games[0]}", "backend": "MinAtar", "num_envs": 8, "num_steps": 128,
        "num_minibatches": 4, "update_epochs": 4, "learning_rate": 0.00025, "ent_coef": 0.01,
        "eval_every": eval_every, "eval_at_switches": True, "eval_episodes": eval_episodes,
        "modification_factory": "TaskSequence",
        "modification_factory_kwargs": {"cycles": cycles,
                                        "tasks": [{"env_id": f"MinAtar/{g}", "steps": steps} for g in games]},
    }


def train(method: str, seed: int, cfg_path: str, runs_dir: str, extra: Sequence[str], log) -> float:
    """One training run in its own process; its directory gets DONE when it exits cleanly. Returns wall seconds."""
    name = run_slug(method, seed)
    run_dir = os.path.join(runs_dir, name)
    cmd = common.train_command(["--config", cfg_path, "--seed", str(seed), "--torch_threads", "1",
                                "--checkpoint_minutes", "0", *METHODS[method], *extra], runs_dir, name)
    wall = common.run(cmd, log=log.name, log_mode="a")["wall_s"]  # a failure: common.RunFailed, a CalledProcessError
    atomic_write_json(os.path.join(run_dir, DONE), {"method": method, "seed": seed, "wall_s": wall, "cmd": cmd,
                                                     "loadavg_end": common.loadavg()})
    return wall


# ---------------------------------------------------------------------------------------------------------------------
# aggregation (pure: tested on hand-made run directories)
# ---------------------------------------------------------------------------------------------------------------------


def load_done(runs_dir: str, methods: Sequence[str]) -> dict[str, list[M.RunData]]:
    """method -> its finished runs (seed order), for the methods given."""
    out: dict[str, list[M.RunData]] = {}
    for d in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
        path = os.path.join(runs_dir, d)
        if not os.path.exists(os.path.join(path, DONE)):
            continue
        info = json.load(open(os.path.join(path, DONE)))
        if info["method"] in methods:
            out.setdefault(info["method"], []).append((info["seed"], M.load_run(path)))
    return {m: [r for _, r in sorted(out[m], key=lambda x: x[0])] for m in methods if m in out}


def method_table(results: dict[str, list[dict]], reps: int = 2000, seed: int = 0,
                 keys: Sequence[tuple[str, str]] = TABLE_KEYS) -> dict[str, dict]:
    """method -> key -> {mean, ci95: [lo, hi], runs, tasks, matrix}: the mean over the runs x tasks matrix of the
    per-task metric (tasks where every run of the method has a value) and its stratified-bootstrap 95% CI."""
    table: dict[str, dict] = {}
    for method, rs in results.items():
        table[method] = {}
        for key, _ in keys:
            mats, tasks = M.score_matrices(rs, [{"architecture": method}] * len(rs), key)
            mat = mats.get(method, np.zeros((len(rs), 0)))
            if not tasks:
                table[method][key] = {"mean": None, "ci95": None, "runs": len(rs), "tasks": [], "matrix": []}
                continue
            lo, hi = M.stratified_bootstrap(mat, M.rl.aggregate_mean, reps, seed)
            table[method][key] = {"mean": float(M.rl.aggregate_mean(mat)), "ci95": [lo, hi], "runs": len(rs),
                                  "tasks": tasks, "matrix": mat.tolist()}
    return table


def mean_curves(runs: Sequence[M.RunData], normalizer: M.Normalizer) -> dict[str, dict]:
    """task -> {steps, mean, ci95 (t half-width), n}: the runs' normalised evaluation curves, interpolated onto the
    union of their evaluation steps (runs of one method share them; other agents' iterations differ)."""
    out = {}
    tasks = [t for t in runs[0].regimes if all(t in r.evals for r in runs)] if runs else []
    for task in tasks:
        curves = [normalizer.curve(task, r.evals[task]) for r in runs]
        grid = sorted({s for c in curves for s, _ in c})
        rows = np.array([np.interp(grid, [s for s, _ in c], [y for _, y in c]) for c in curves], dtype=np.float64)
        stats = [M.mean_ci(rows[:, j]) for j in range(len(grid))]
        out[task] = {"steps": grid, "mean": [s["mean"] for s in stats],
                     "ci95": [s["ci95"] or 0.0 for s in stats], "n": len(runs)}
    return out


def aggregate(done: dict[str, list[M.RunData]], normalize: str = "max_abs", reps: int = 2000,
              scale: Optional[dict[str, float]] = None) -> dict:
    """Every number of the benchmark from the finished runs: per-run metrics, the method table, curves, rliable.
    `scale`: task -> the max|R| to divide by (another benchmark's, `--scale_from`) instead of these runs' own."""
    all_runs = [r for rs in done.values() for r in rs]
    norm = M.Normalizer("reference_scores", scores=scale, runs=all_runs) if scale else \
        M.Normalizer(normalize, runs=all_runs)
    results = {m: [M.run_metrics(r, norm) for r in rs] for m, rs in done.items()}
    flat = [x for rs in results.values() for x in rs]
    configs = [{"architecture": m} for m, rs in results.items() for _ in rs]
    return {
        "normalize": normalize,
        "scale": dict(scale) if scale else {t: norm.abs_max.get(t) for t in (all_runs[0].regimes if all_runs else [])},
        "table": method_table(results, reps),
        "curves": {m: mean_curves(rs, norm) for m, rs in done.items()},
        "visits": [[v.regime, v.start, v.end] for v in all_runs[0].visits] if all_runs else [],
        "robust": M.robust_aggregate(flat, configs, reps=reps, gamma=None) if len(flat) > 1 else None,
        "runs": {m: [{"run_dir": x["run_dir"], "summary": x["summary"],
                      "regimes": {t: {k: v for k, v in d.items() if k != "reference"} for t, d in x["regimes"].items()}}
                     for x in rs] for m, rs in results.items()},
    }


def fmt_cell(d: dict) -> str:
    if d["mean"] is None:
        return "-"
    lo, hi = d["ci95"]
    return f"{d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def table_rows(table: dict[str, dict]) -> list[list[str]]:
    return [[m, str(next(iter(t.values()))["runs"]), *(fmt_cell(t[k]) for k, _ in TABLE_KEYS)] for m, t in table.items()]


# ---------------------------------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------------------------------


def _colors(methods: Sequence[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap, extra = colormaps["tab10"], colormaps["tab20b"]
    # other labels (bench/forgetting_report.py's, e.g. one per EWC lambda) get distinct colours of their own
    others = [m for m in methods if m not in METHODS]
    return {m: cmap(list(METHODS).index(m) % 10) if m in METHODS else extra(others.index(m) % 20) for m in methods}


def plot_curves(agg: dict, path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from continual.evaluation.plots import steps_formatter  # 25k, 1M tick labels

    curves = agg["curves"]
    tasks = list(next(iter(curves.values())).keys()) if curves else []
    colors = _colors(list(curves))
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(5.2 * max(1, len(tasks)), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for regime, start, end in agg["visits"]:
            if regime == task:
                ax.axvspan(start, end, color="0.85", lw=0, zorder=0)
        for method, per_task in curves.items():
            c = per_task.get(task)
            if not c:
                continue
            x, y, h = np.array(c["steps"]), np.array(c["mean"], dtype=float), np.array(c["ci95"], dtype=float)
            ax.plot(x, y, color=colors[method], lw=1.8, marker="o", ms=2.5, label=f"{method} (n={c['n']})")
            ax.fill_between(x, y - h, y + h, color=colors[method], alpha=0.15, lw=0)
        scale = agg["scale"].get(task)
        name = re.sub(r"^env=(MinAtar/|MiniHack-)?", "", task)
        ax.set_title(f"{name} (1 = return {scale:g})" if scale else name, fontsize=11)
        ax.set_xlabel("agent steps (grey: this task trained)")
        ax.xaxis.set_major_formatter(steps_formatter())
        ax.grid(alpha=0.25)
    axes[0][0].set_ylabel("evaluation return / max |return|")
    axes[0][-1].legend(fontsize=8, loc="best")
    fig.suptitle(title + "; mean over seeds, band: 95% CI (t)", fontsize=11)
    return common.save_figure(fig, path)


def plot_comparison(agg: dict, path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = agg["table"]
    methods = list(table)
    colors = _colors(methods)
    keys = [("final", "average performance P(T)\n(higher is better)"),
            ("forgetting_last_visit", "forgetting (end of last visit)\n(lower is better)"),
            ("forgetting_all_visits", "forgetting (all later visits)\n(lower is better)"),
            ("transfer_zero_shot", "forward transfer (zero-shot)\n(higher is better)")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.3 * len(keys), 4.2))
    for ax, (key, label) in zip(axes, keys):
        for i, m in enumerate(methods):
            d = table[m][key]
            if d["mean"] is None:
                continue
            lo, hi = d["ci95"]
            ax.bar(i, d["mean"], color=colors[m], edgecolor="0.2", lw=0.5,
                   yerr=[[d["mean"] - lo], [hi - d["mean"]]], capsize=3)
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set_xticks(range(len(methods)), labels=methods, rotation=35, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.25, axis="y")
    axes[0].set_ylabel("normalised return (max |return| per task = 1)")
    fig.suptitle(title + "; mean over runs x tasks, 95% stratified-bootstrap CI", fontsize=11)
    return common.save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------------


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help="of: " + ", ".join(METHODS))
    p.add_argument("--seeds", type=int, default=3, help="seeds 1..N per method")
    p.add_argument("--games", nargs="+", default=["Breakout", "SpaceInvaders"],
                   help="MinAtar games, in training order (PPO learns neither Freeway nor Asterix in 100k steps)")
    p.add_argument("--cycles", type=int, default=2)
    p.add_argument("--steps_per_task", type=int, default=50_000)
    p.add_argument("--eval_every", type=int, default=25_000, help="also evaluate every this many steps (0: only at "
                   "step 0, the switches and the end)")
    p.add_argument("--eval_episodes", type=int, default=8, help="whole games per task and evaluation")
    p.add_argument("--normalize", default="max_abs", choices=["raw", "max_abs"])
    p.add_argument("--bootstrap_reps", type=int, default=2000)
    p.add_argument("--runs_dir", default=os.path.join(ROOT, "bench", "out", "forgetting"),
                   help="run directories (one per method x seed; kept for resuming)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="JSON and PNGs go here")
    p.add_argument("--aggregate_only", action="store_true", help="train nothing; tables and plots from finished runs")
    p.add_argument("--scale_from", default=None, help="a forgetting.json: divide returns by its per-task max|R| "
                   "(its 'scale') instead of these runs' own, so methods re-run later compare with its rows")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                   help="further training flags for every run (last; e.g. --extra --ewc_lambda 100)")
    a = p.parse_args(argv)
    errors = []
    unknown = [m for m in a.methods if m not in METHODS]
    if unknown:
        errors.append(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if len(set(a.methods)) != len(a.methods):
        errors.append("--methods: a method is named twice")
    bad_games = [g for g in a.games if g not in GAMES]
    if bad_games:
        errors.append(f"--games: unknown {', '.join(bad_games)}; MinAtar has {', '.join(GAMES)}")
    for name in ("seeds", "cycles", "steps_per_task", "eval_episodes", "bootstrap_reps"):
        if getattr(a, name) < 1:
            errors.append(f"--{name}: must be positive, got {getattr(a, name)}")
    if a.eval_every < 0:
        errors.append(f"--eval_every: must be >= 0, got {a.eval_every}")
    if a.scale_from is not None:
        try:
            scale = json.load(open(a.scale_from))["scale"]
            assert isinstance(scale, dict) and all(isinstance(v, (int, float)) and v > 0 for v in scale.values())
            a.scale = scale
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            errors.append(f"--scale_from: {a.scale_from} is not a forgetting.json with a positive per-task 'scale'")
    else:
        a.scale = None
    if errors:
        print(f"error: {errors[0]}", file=sys.stderr)
        sys.exit(2)
    return a


def main(argv: Optional[Sequence[str]] = None) -> dict:
    a = parse(argv)
    os.makedirs(a.runs_dir, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    info = common.machine_info()
    cfg = sequence_config(a.games, a.steps_per_task, a.cycles, a.eval_every, a.eval_episodes)
    cfg_path = os.path.join(a.runs_dir, "sequence.json")
    if os.path.exists(cfg_path) and json.load(open(cfg_path)) != cfg:
        print(f"error: {a.runs_dir} holds runs of another sequence ({cfg_path}); use another --runs_dir",
              file=sys.stderr)
        sys.exit(2)
    atomic_write_json(cfg_path, cfg)
    walls: dict[str, float] = {}
    if not a.aggregate_only:
        with open(os.path.join(a.runs_dir, "training.log"), "a") as log:
            for seed in range(1, a.seeds + 1):  # round-robin: machine noise and crashes hit every method alike
                for method in a.methods:
                    run_dir = os.path.join(a.runs_dir, run_slug(method, seed))
                    if os.path.exists(os.path.join(run_dir, DONE)):
                        continue
                    if os.path.isdir(run_dir):  # an unfinished run (crash, Ctrl-C): train it again from scratch
                        shutil.rmtree(run_dir)
                    print(f"[{time.strftime('%H:%M:%S')}] {method} seed {seed} (load {common.loadavg()})", flush=True)
                    log.write(f"\n===== {method} seed {seed} =====\n")
                    log.flush()
                    try:
                        walls[f"{method} s{seed}"] = train(method, seed, cfg_path, a.runs_dir, a.extra, log)
                    except subprocess.CalledProcessError as e:
                        print(f"  failed (exit {e.returncode}); see {log.name}; going on", flush=True)
                        continue
                    print(f"  done in {walls[f'{method} s{seed}']:.0f} s", flush=True)
    done = load_done(a.runs_dir, a.methods)
    if not done:
        print("error: no finished runs to aggregate", file=sys.stderr)
        sys.exit(1)
    try:
        agg = aggregate(done, a.normalize, a.bootstrap_reps, a.scale)
    except ValueError as e:  # --scale_from without a task of these runs
        print(f"error: --scale_from: {e}", file=sys.stderr)
        sys.exit(2)
    title = (f"MinAtar {' -> '.join(a.games)} x {a.cycles} cycles, {a.steps_per_task // 1000}k steps per task")
    norm_name = f"max_abs of {a.scale_from}" if a.scale else a.normalize
    common.print_table(title + f" ({norm_name}); mean [95% stratified-bootstrap CI] over runs x tasks",
                       ["method", "runs", *(t for _, t in TABLE_KEYS)], table_rows(agg["table"]))
    agg.update({"machine": info, "loadavg_end": common.loadavg(), "args": vars(a), "sequence": cfg,
                "wall_s_this_call": walls,
                "wall_s": {m: [json.load(open(os.path.join(r.run_dir, DONE)))["wall_s"] for r in rs]
                           for m, rs in done.items()}})
    atomic_write_json(os.path.join(a.out, "forgetting.json"), agg, default=lambda x: None)
    paths = [plot_curves(agg, os.path.join(a.out, "forgetting_curves.png"), title),
             plot_comparison(agg, os.path.join(a.out, "forgetting_comparison.png"), title)]
    print(f"wrote {os.path.join(a.out, 'forgetting.json')}, {', '.join(paths)}")
    return agg


if __name__ == "__main__":
    main()
