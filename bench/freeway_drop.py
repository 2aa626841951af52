"""Freeway's drop at a switch and its recovery (issue 19): PPO next to PPO_CBP on object-centric Freeway, on a CPU.

Every run trains one agent on configs/freeway_obj_drop.json: the unmodified game (A), then speed_mode (B), then A
again (`--obs_mode obj`, the MLP; 8 envs x 128 steps; CleanRL's PPO values without learning-rate annealing). A switch
resets every env, and every visit ends half-way through a game, so each logged training game was played entirely in
one visit; Freeway's games all last 2,048 agent steps, so the k-th game of every env in a visit ends at the same
step. Per visit we report the mean return of the first and of the last game of every env (`--window_games` games per
env, 8 episodes per game): for A -> B -> A that is A's level before the switch, the drop right after it, B at its end,
A right after the return and A at the end (recovery). Numbers: mean over seeds with a 95% percentile bootstrap CI
(continual.evaluation.metrics.stratified_bootstrap, seeds resampled); the curve: per game index, the mean over envs,
then over seeds.

    python bench/freeway_drop.py                        # PPO, PPO_CBP, PPO_CBP r=1e-4 x 3 seeds (~5 min a run quiet)
    python bench/freeway_drop.py --methods PPO --seeds 1 --runs_dir /tmp/fd --out /tmp/fd   # one run
    python bench/freeway_drop.py --summarize_only      # tables, JSON and plot from the runs present

One run at a time (seeds outermost, methods round-robin), each a subprocess under `nice -n 10` with one torch thread.
Resumable: a run whose result file `<runs_dir>/<method>_s<seed>.json` exists is skipped; a run cut short is redone.
Writes bench/results/freeway_drop.json and bench/results/freeway_drop.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (puts the repository root on sys.path)

ROOT = common.REPO_ROOT
CONFIG = os.path.join(ROOT, "configs", "freeway_obj_drop.json")
# method -> training flags. PPO_CBP: the library's CBP defaults (replacement rate 1e-5, maturity 100), which replace
# only ~4 units per layer in a run this short; "PPO_CBP r=1e-4": the CBP paper's RL rate, as bench/plasticity.py.
METHODS: dict[str, list[str]] = {
    "PPO": ["--architecture", "PPO"],
    "PPO_CBP": ["--architecture", "PPO_CBP"],
    "PPO_CBP r=1e-4": ["--architecture", "PPO_CBP", "--replacement_rate", "1e-4"],
}


# --------------------------------------------------------------------------------------------------------------------
# statistics (tests/test_bench_freeway_drop.py checks them on hand-made records)
# --------------------------------------------------------------------------------------------------------------------


def visits_of(config: dict) -> list[tuple[str, int, int]]:
    """(modification, start, end) of each visit of a SequentialModificationFactory config."""
    kw = config["modification_factory_kwargs"]
    bounds = [0, *kw["switching_thresholds"], kw["num_total_steps"]]
    return [(m, bounds[i], bounds[i + 1]) for i, m in enumerate(kw["modifications"])]


def games_by_index(episodes: Sequence[dict], visit: tuple[str, int, int]) -> list[list[dict]]:
    """The visit's episodes (ending in (start, end], of its modification), grouped by game index: element k holds the
    k-th game of every env in the visit (by end step), so element 0 is the first game after the switch."""
    mod, start, end = visit
    per_env: dict[int, list[dict]] = {}
    for e in sorted(episodes, key=lambda e: e["global_step"]):
        if start < e["global_step"] <= end:
            if e["modification"] != mod:
                raise ValueError(f"episode ending at {e['global_step']} has modification {e['modification']!r}, "
                                 f"the visit ({start}, {end}] has {mod!r}")
            per_env.setdefault(int(e["env"]), []).append(e)
    out: list[list[dict]] = []
    for eps in per_env.values():
        for k, e in enumerate(eps):
            if k == len(out):
                out.append([])
            out[k].append(e)
    return out


def window_means(episodes: Sequence[dict], visit: tuple[str, int, int], games: int = 1) -> tuple[float, float]:
    """(first, last): mean return of the first and of the last `games` games of every env in the visit."""
    by_k = games_by_index(episodes, visit)
    if not by_k:
        return float("nan"), float("nan")
    first = [e["return"] for g in by_k[:games] for e in g]
    last = [e["return"] for g in by_k[-games:] for e in g]
    return float(np.mean(first)), float(np.mean(last))


def summarize(runs: dict[str, dict[int, list[dict]]], visits: Sequence[tuple[str, int, int]], games: int = 1,
              reps: int = 2000) -> dict:
    """runs[method][seed] = the run's episode records -> per method: per visit the first/last windows per seed with
    their bootstrap CI over seeds, the drop (first window of a visit minus the last of the visit before) and the
    curve (per visit and game index: mean end step, mean and CI over seeds of the per-seed mean over envs)."""
    out: dict = {"visits": [list(v) for v in visits], "window_games": games, "methods": {}}
    for method, by_seed in runs.items():
        seeds = sorted(by_seed)
        per_visit = []
        for i, v in enumerate(visits):
            firsts, lasts = zip(*(window_means(by_seed[s], v, games) for s in seeds))
            row = {"regime": v[0], "start": v[1], "end": v[2],
                   "first_by_seed": list(firsts), "last_by_seed": list(lasts),
                   "first": common.bootstrap_ci(firsts, reps), "last": common.bootstrap_ci(lasts, reps)}
            if i > 0:
                drop = [f - p for f, p in zip(firsts, per_visit[-1]["last_by_seed"])]
                row["change_at_switch_by_seed"] = drop
                row["change_at_switch"] = common.bootstrap_ci(drop, reps)
            per_visit.append(row)
        curve = {"step": [], "mean": [], "lo": [], "hi": [], "n": [], "by_seed": []}
        for v in visits:
            per_seed = [games_by_index(by_seed[s], v) for s in seeds]
            for k in range(max((len(g) for g in per_seed), default=0)):
                each = [float(np.mean([e["return"] for e in g[k]])) if k < len(g) else None for g in per_seed]
                curve["by_seed"].append(each)
                vals = [x for x in each if x is not None]
                steps = [float(np.mean([e["global_step"] for e in g[k]])) for g in per_seed if k < len(g)]
                ci = common.bootstrap_ci(vals, reps)
                curve["step"].append(float(np.mean(steps)))
                curve["mean"].append(ci["mean"])
                curve["lo"].append(ci["ci95"][0])
                curve["hi"].append(ci["ci95"][1])
                curve["n"].append(ci["n"])
        out["methods"][method] = {"seeds": seeds, "visits": per_visit, "curve": curve}
    return out


# --------------------------------------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------------------------------------


def slug(method: str, seed: int) -> str:
    return "".join(c if c.isalnum() else "_" for c in method) + f"_s{seed}"


def run_one(method: str, seed: int, runs_dir: str, config: str) -> Optional[dict]:
    name = slug(method, seed)
    run_dir, log = os.path.join(runs_dir, name), os.path.join(runs_dir, name + ".log")
    shutil.rmtree(run_dir, ignore_errors=True)  # a run cut short: redo it from its start
    cmd = common.train_command(["--config", config, "--seed", str(seed), "--torch_threads", "1", "--checkpoint_minutes",
                                "0", *METHODS[method]], runs_dir, name)
    r = common.run(cmd, log=log, nice=10, threads=1, env={"PYTHONPATH": ROOT}, sample_load=True, check=False)
    if r["rc"] != 0:
        return None
    records = common.metrics(run_dir)
    episodes = [{k: r[k] for k in ("global_step", "return", "length", "modification", "env")}
                for r in records if r["kind"] == "episode"]
    shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)  # keep metrics and TensorBoard
    result = {"method": method, "seed": seed,
              **{k: r[k] for k in ("command", "wall_s", "cpu_s", "foreign_cores", "loadavg_start", "loadavg_end")},
              "episodes": episodes}
    tmp = os.path.join(runs_dir, name + ".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(runs_dir, name + ".json"))
    return result


def load_results(runs_dir: str, methods: Sequence[str]) -> dict[str, dict[int, dict]]:
    """method -> seed -> result file, for the methods given."""
    out: dict[str, dict[int, dict]] = {}
    for fn in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
        if fn.endswith(".json"):
            with open(os.path.join(runs_dir, fn), encoding="utf-8") as f:
                r = json.load(f)
            if r.get("method") in methods:
                out.setdefault(r["method"], {})[int(r["seed"])] = r
    return {m: dict(sorted(out[m].items())) for m in methods if m in out}


# --------------------------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------------------------


def fmt_ci(d: dict) -> str:
    if d["mean"] is None:
        return "-"
    return f"{d['mean']:.1f} [{d['ci95'][0]:.1f}, {d['ci95'][1]:.1f}]"


def table_rows(summary: dict) -> list[list[str]]:
    rows = []
    for method, s in summary["methods"].items():
        for i, v in enumerate(s["visits"]):
            name = f"{i + 1}: {v['regime'] or 'unmodified'} ({v['start'] // 1000}k-{v['end'] // 1000}k)"
            rows.append([method, str(v["first"]["n"]), name, fmt_ci(v["first"]), fmt_ci(v["last"]),
                         fmt_ci(v["change_at_switch"]) if "change_at_switch" in v else "-",
                         " ".join(f"{x:.1f}/{y:.1f}" for x, y in zip(v["first_by_seed"], v["last_by_seed"]))])
    return rows


def plot(summary: dict, path: str, title: str) -> str:
    """One panel per method: each seed's curve (thin) and the mean over seeds with its bootstrap CI (thick, band);
    the seeds are shown because a seed that never finds Freeway's first reward makes the mean bimodal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(summary["methods"])
    fig, axes = plt.subplots(1, len(methods), figsize=(5.0 * len(methods), 4.2), sharey=True, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    starts = [v[1] for v in summary["visits"][1:]]
    for n, (ax, method) in enumerate(zip(axes[0], methods)):
        s, color = summary["methods"][method], colors[n % len(colors)]
        for i, (regime, start, end) in enumerate(summary["visits"]):
            if regime:
                ax.axvspan(start, end, color="0.88", lw=0, zorder=0)
                ax.text((start + end) / 2, 0.97, regime, ha="center", va="top", fontsize=9, color="0.3",
                        transform=ax.get_xaxis_transform())
            if i > 0:
                ax.axvline(start, color="0.3", lw=0.9, ls="--")
        c = s["curve"]
        x, m = np.asarray(c["step"]), np.asarray(c["mean"], dtype=float)
        lo, hi = np.asarray(c["lo"], dtype=float), np.asarray(c["hi"], dtype=float)
        per_seed = np.array([[np.nan if y is None else y for y in row] for row in c["by_seed"]], dtype=float)
        seg = np.searchsorted(starts, x)  # lines break at switches: a visit's points are its games
        for j in np.unique(seg):
            sel = seg == j
            for k, seed in enumerate(s["seeds"]):
                ax.plot(x[sel], per_seed[sel, k], lw=0.8, color=color, alpha=0.45,
                        label="seeds" if (j == seg[0] and k == 0) else None)
            ax.plot(x[sel], m[sel], marker="o", ms=3, lw=2.0, color=color,
                    label=f"mean of {len(s['seeds'])} seeds, 95% bootstrap CI" if j == seg[0] else None)
            ax.fill_between(x[sel], lo[sel], hi[sel], color=color, alpha=0.12, lw=0)
        ax.set(title=method, xlabel="agent steps (dashed: switches)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="center left")
    axes[0][0].set_ylabel("training game return (mean over 8 envs)")
    fig.suptitle(title, fontsize=11)
    return common.save_figure(fig, path)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    p.add_argument("--seeds", type=int, default=3, help="seeds 1..N per method")
    p.add_argument("--window_games", type=int, default=1, help="games per env in the first/last window of a visit")
    p.add_argument("--config", default=CONFIG, help="the curriculum (a SequentialModificationFactory config)")
    p.add_argument("--runs_dir", default=os.path.join(ROOT, "bench", "out", "freeway_drop"),
                   help="run directories and per-run result files (resumable)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="summary JSON and plot")
    p.add_argument("--summarize_only", action="store_true", help="no training: summarize the runs present")
    a = p.parse_args(argv)
    methods = [m for m in a.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    errors = []
    if bad or not methods:
        errors.append(f"--methods: unknown {bad or 'empty'}; choose from {', '.join(METHODS)}")
    if a.seeds < 1 or a.window_games < 1:
        errors.append("--seeds and --window_games must be at least 1")
    cfg = None
    try:
        with open(a.config, encoding="utf-8") as f:
            cfg = json.load(f)
        if cfg.get("modification_factory") != "SequentialModificationFactory":
            errors.append(f"--config {a.config}: needs a SequentialModificationFactory curriculum")
    except (OSError, ValueError) as e:
        errors.append(f"--config {a.config}: {e}")
    if errors:
        print(f"error: {errors[0]}", file=sys.stderr)
        sys.exit(2)
    visits = visits_of(cfg)
    info = common.machine_info()
    os.makedirs(a.runs_dir, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    if not a.summarize_only:
        for seed in range(1, a.seeds + 1):  # seeds outermost: a cut-short session still has every method
            for method in methods:
                name = slug(method, seed)
                if os.path.exists(os.path.join(a.runs_dir, name + ".json")):
                    continue
                print(f"{time.strftime('%H:%M:%S')} {name}: training (load {common.loadavg()})", flush=True)
                r = run_one(method, seed, a.runs_dir, a.config)
                if r is not None:
                    print(f"  {name}: {len(r['episodes'])} games, wall {r['wall_s']:.0f} s, CPU {r['cpu_s']:.0f} s",
                          flush=True)
    results = load_results(a.runs_dir, methods)
    if not results:
        print("no finished runs to summarize")
        return {}
    summary = summarize({m: {s: r["episodes"] for s, r in rs.items()} for m, rs in results.items()}, visits,
                        a.window_games)
    info["loadavg_end"] = common.loadavg()
    common.print_table(f"Freeway (obj) {' -> '.join(v[0] or 'unmodified' for v in visits)}: mean return of the first "
                       f"/ last {a.window_games} game(s) of each env per visit; mean [95% bootstrap CI] over seeds",
                       ["method", "seeds", "visit", "first game(s)", "last game(s)", "first - previous visit's last",
                        "per seed first/last"], table_rows(summary))
    title = "Object-centric Freeway: " + " -> ".join(v[0] or "unmodified" for v in visits)
    path = plot(summary, os.path.join(a.out, "freeway_drop.png"), title)
    common.write_json(os.path.join(a.out, "freeway_drop.json"), {
        "machine": info, "config": cfg, "methods": {m: METHODS[m] for m in methods}, "summary": summary,
        "runs": {m: {str(s): {k: r[k] for k in ("command", "wall_s", "cpu_s", "foreign_cores", "loadavg_start",
                                                "loadavg_end")} for s, r in rs.items()} for m, rs in results.items()},
        "plot": path})
    return summary


if __name__ == "__main__":
    main()
