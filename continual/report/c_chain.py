"""C-CHAIN's Continual MinAtar table (Tang et al., ICML 2025, Table 4) reproduced: Double DQN against Double DQN +
C-CHAIN on SpaceInvaders -> Asterix -> Seaquest (configs/experiments/c_chain_minatar.json).

    python -m continual.report c_chain EXPERIMENT_FOLDER --out DIR

The score, as the paper's code produces it (bluecontra/C-CHAIN, crl_minatar/crl_run_double_dqn.py; the paper's text
was not available here, see docs/experiments.md for the evidence). The code evaluates the current game with 10
greedy episodes at each task's step 0 and every 50k steps (41 evaluations per task) and logs each to W&B as
`eval_return` at the run's total step; nothing else it records is a per-run summary (its saved .npz holds only the
last evaluation). At a task boundary the next task's step-0 evaluation is logged at the same W&B step as the previous
task's final one and replaces it (W&B keeps the last value of a key within a step), so the logged curve has one
value every 50k steps from 0 to 6M, 121 values: the current game's return, the next game's at 2M and 4M. Table 4's
scale (22 and 29.5, where a trained SpaceInvaders agent scores far more than its Asterix or Seaquest) is that of
an average over the whole curve, as the "average performance" of the paper's Tables 1 and 2. So:

- score (primary): the mean of those 121 values, read from the run's evaluation table (every game is evaluated at
  every step here; the row of the game the paper's code would have evaluated is taken: at step s the game of the
  task running after s, the last game at the end);
- score_all_evaluations (sensitivity): the mean over all 123 evaluations the code runs (the final evaluation of the
  first two games added back);
- per-game means over each task's own evaluations, and each game's final evaluation.

Statistics over runs (the run is the unit; continual.evaluation.statistics): mean +- standard error as Table 4
reports, a Student-t 95% interval, the published numbers beside, and the difference C-CHAIN - vanilla with its Welch
interval, the paired-by-seed t interval, the probability of improvement and exact one-sided tests. Only runs that
reached the end of the sequence count; others are listed with their progress.

Learned check (`--baseline`, eval.py's JSON of a `--random_actions` evaluation of the three games under the runs' env
settings; added 2026-12-01 after the launch, before any run had reached the end of its first task, so not in the
experiment file's declarations): per game, of the runs that reached the end of its task, how many scored more at
that end (its final evaluation, 10 greedy games) than the random policy's mean and than the best of its games. A
game counts as learned by a run whose final evaluation beats the random policy's best game: a score that is then
mostly one game's would be a score of what the agents did not learn.

The published numbers are the experiment's `declared.published` (the folder's experiment.json, as
configs/experiments/c_chain_minatar.json declares Table 4: Double DQN 22.044 +- 0.733, Double DQN + C-CHAIN
29.513 +- 0.682, mean +- SE over 12 seeds), matched to an arm by its runs' method label (exp_name); with their mean,
se and n, a t interval with n - 1 degrees of freedom and +- 1.96 SE. Without a declaration the column says "not
declared": the report carries no numbers of its own.
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

import numpy as np

from continual.curricula.tasks import task_string
from continual.errors import UserError
from continual.evaluation import statistics
from continual.evaluation.metrics import provenance, provenance_lines
from continual.evaluation.table import read_no_agent_eval, read_run_table
from continual.io import read_jsonl
from continual.launch.declarations import read_declarations
from continual.launch.queue import run_dirs
from continual.machine import starts_with_machines
from continual.modstrings import normalize_modification

ARMS = ("vanilla", "C-CHAIN")
# what the paper's code runs (crl_minatar: the run script's arguments and the agent's constructor defaults)
PAPER_PROTOCOL = {"double_dqn": True, "learning_rate": 3e-4, "replay_batch_size": 32, "buffer_size": 100_000,
                  "learning_starts": 10_000, "learning_starts_each_regime": True, "train_frequency": 1,
                  "target_network_frequency": 1000, "tau": 1.0, "gamma": 0.99, "start_e": 1.0, "end_e": 0.1,
                  "epsilon_steps": 100_000, "eval_every": 50_000, "eval_episodes": 10, "eval_greedy": True}


def tasks_of(cfg: dict) -> list[dict]:
    """The run's task sequence: [{"regime", "env_id", "start", "end"}] from its TaskSequence configuration."""
    if cfg.get("modification_factory") not in ("TaskSequence", "TaskSequenceModificationFactory"):
        raise UserError(f"run {cfg.get('run_name')!r}: not a TaskSequence run (modification_factory "
                        f"{cfg.get('modification_factory')!r})")
    kw = cfg["modification_factory_kwargs"]
    out, start = [], 0
    for _ in range(int(kw.get("cycles", 1))):
        for t in kw["tasks"]:
            env_id = t.get("env_id") or cfg["env_id"]
            out.append({"regime": normalize_modification(task_string(env_id, t.get("modifications", ""))),
                        "env_id": env_id, "start": start, "end": start + int(t["steps"])})
            start += int(t["steps"])
    return out


def arm_of(cfg: dict) -> str:
    return "C-CHAIN" if cfg.get("c_chain") else "vanilla"


def logged_task(step: int, tasks: Sequence[dict]) -> int:
    """The task whose evaluation the paper's code logs last at total step `step`: the one running after it (the next
    task's step-0 evaluation at a boundary), the last one at the end."""
    return min(sum(step >= t["end"] for t in tasks), len(tasks) - 1)


def run_record(run_dir: str) -> Optional[dict]:
    """One run's record: arm, seed, progress, the evaluation curve of the game the paper's code evaluates (step,
    game index, mean return) and the final evaluations of each game; None without a table yet."""
    read = read_run_table(run_dir)
    if read is None:
        return None
    cfg, rows = read
    tasks = tasks_of(cfg)
    cell = {(r["step"], normalize_modification(r["modification"])): r for r in rows}
    steps = sorted({r["step"] for r in rows})
    curve, missing = [], []
    for s in steps:
        k = logged_task(s, tasks)
        r = cell.get((s, tasks[k]["regime"]))
        if r is None:
            missing.append([s, k])
        else:
            curve.append([s, k, r["mean"]])
    final = {}
    for k, t in enumerate(tasks):
        r = cell.get((t["end"], t["regime"]))
        if r is not None:
            final[k] = r["mean"]
    total = tasks[-1]["end"]
    return {"run": os.path.basename(run_dir), "arm": arm_of(cfg), "seed": cfg.get("seed"),
            "exp_name": cfg.get("exp_name"), "last_step": steps[-1], "total_timesteps": total,
            "finished": steps[-1] >= total, "games": [t["env_id"] for t in tasks],
            "boundaries": [t["end"] for t in tasks], "curve": curve, "missing": missing, "final": final,
            "protocol": {k: cfg.get(k) for k in ("architecture", "double_dqn", "learning_rate", "replay_batch_size",
                                                  "buffer_size", "learning_starts", "learning_starts_each_regime",
                                                  "train_frequency", "target_network_frequency", "tau", "gamma",
                                                  "start_e", "end_e", "exploration_fraction", "eval_every",
                                                  "eval_episodes", "eval_greedy", "c_chain",
                                                  "c_chain_target_rel_loss_scale", "c_chain_coef")},
            "regimes": [t["regime"] for t in tasks],
            "greedy": sorted({str(r.get("greedy")) for r in rows}), "episodes": sorted({r["episodes"] for r in rows}),
            "starts": starts_with_machines(run_dir, read_jsonl(os.path.join(run_dir, "metrics.jsonl")))}


def scores(rec: dict) -> dict:
    """The run's scores from its record (see the module docstring)."""
    values = [v for _, _, v in rec["curve"]]
    out = {"score": float(np.mean(values)) if values else math.nan, "evaluations": len(values)}
    extra = [rec["final"][k] for k in range(len(rec["games"]) - 1) if k in rec["final"]]
    out["score_all_evaluations"] = float(np.mean(values + extra)) if values else math.nan
    per_game, last = {}, len(rec["games"]) - 1
    for k, game in enumerate(rec["games"]):
        # a task's own evaluations: its step 0 (logged at its start) to its end; a boundary's row in the curve is
        # the next task's, so an earlier task's final evaluation comes from `final`
        own = [v for _, j, v in rec["curve"] if j == k] + ([rec["final"][k]] if k < last and k in rec["final"] else [])
        per_game[game] = float(np.mean(own)) if own else math.nan
    out["per_game_mean"] = per_game
    out["per_game_final"] = {rec["games"][k]: v for k, v in rec["final"].items()}
    return out


def load(folder: str) -> list[dict]:
    root = os.path.join(folder, "runs")
    if not os.path.isdir(root):
        raise UserError(f"{folder}: no runs/ folder (is it an experiment folder?)")
    recs = [r for r in (run_record(d) for d in run_dirs(folder)) if r]
    if not recs:
        raise UserError(f"{root}: no run with an evaluation table yet")
    for r in recs:
        r["scores"] = scores(r)
    return recs


def published(folder: str, recs: Sequence[dict]) -> dict:
    """The experiment's declared published numbers per arm ({"label", "mean", "se", "n", intervals}, or None where
    not declared), matched by the arm's runs' method label, and the declaration's source and statistics."""
    block = read_declarations(folder).declared.get("published") if os.path.isfile(
        os.path.join(folder, "experiment.json")) or os.path.isfile(os.path.join(folder, "declarations.json")) else None
    out: dict = {"source": (block or {}).get("source"), "statistics": (block or {}).get("statistics"), "arms": {}}
    results = (block or {}).get("results", {})
    for arm in ARMS:
        labels = [r["exp_name"] for r in recs if r["arm"] == arm and r["exp_name"] in results]
        out["arms"][arm] = paper_interval(labels[0], results[labels[0]]) if labels else None
    return out


def paper_interval(label: str, p: dict) -> dict:
    """A published mean +- SE over n seeds with its t interval (n - 1 df) and +- 1.96 SE; what is not given is None."""
    from scipy import stats

    mean, se, n = p.get("mean"), p.get("se"), p.get("n")
    out = {"label": label, "mean": mean, "se": se, "n": n, "low": None, "high": None, "low_normal": None,
           "high_normal": None}
    if mean is not None and se is not None:
        out.update(low_normal=mean - 1.96 * se, high_normal=mean + 1.96 * se)
        if n is not None and n >= 2:
            h = float(stats.t.ppf(0.975, int(n) - 1)) * se
            out.update(low=mean - h, high=mean + h)
    return out


def _paper(p: Optional[dict]) -> list[str]:
    """The published cells of an arm's row: mean +- SE (n), t interval, +- 1.96 SE."""
    if p is None:
        return ["not declared", "", ""]
    f = (lambda x: "?" if x is None else f"{x:.3f}")
    return [f"{f(p['mean'])} +- {f(p['se'])} (n={p['n'] if p['n'] is not None else '?'}, {p['label']})",
            "" if p["low"] is None else f"[{p['low']:.2f}, {p['high']:.2f}]",
            "" if p["low_normal"] is None else f"[{p['low_normal']:.2f}, {p['high_normal']:.2f}]"]


def arm_summary(values: Sequence[float]) -> dict:
    x = np.asarray(values, np.float64)
    n = len(x)
    iv = statistics.interval(x)
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return {"n": n, "mean": float(x.mean()) if n else math.nan, "se": se, "t95": iv.as_dict()}


def summarize(recs: Sequence[dict], key: str = "score") -> dict:
    done = [r for r in recs if r["finished"]]
    out: dict = {}
    for arm in ARMS:
        vals = [r["scores"][key] for r in done if r["arm"] == arm]
        out[arm] = arm_summary(vals) if vals else None
    v = {r["seed"]: r["scores"][key] for r in done if r["arm"] == "vanilla"}
    c = {r["seed"]: r["scores"][key] for r in done if r["arm"] == "C-CHAIN"}
    if len(v) >= 2 and len(c) >= 2:
        cmp = statistics.compare(list(c.values()), list(v.values()))
        out["difference"] = {"welch": cmp.mean_difference.as_dict(), "comparison": cmp.as_dict()}
        both = sorted(set(v) & set(c))
        if len(both) >= 2:
            out["difference"]["paired"] = statistics.interval([c[s] - v[s] for s in both]).as_dict()
            out["difference"]["paired_seeds"] = both
    return out


def _pm(d: Optional[dict]) -> str:
    if not d:
        return "no finished run"
    low, high = d["t95"]["ci"]
    if low is None:
        return f"{d['mean']:.3f} (n={d['n']}; no interval: {d['t95']['reason']})"
    return f"{d['mean']:.3f} +- {d['se']:.3f} [{low:.2f}, {high:.2f}] (n={d['n']})"


def _iv(d: Optional[dict], digits: int = 2) -> str:
    if not d:
        return "n/a"
    low, high = d["ci"]
    if low is None:
        return f"{d['estimate']:+.{digits}f} (no interval: {d.get('reason')})"
    return f"{d['estimate']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def protocol_notes(recs: Sequence[dict]) -> list[str]:
    """Where the runs' settings differ from the paper code's (read from their config.json)."""
    notes = []
    for r in recs:
        p = r["protocol"]
        eps_steps = (p.get("exploration_fraction") or 0) * r["total_timesteps"]
        have = {**p, "epsilon_steps": round(eps_steps)}
        diff = {k: (have.get(k), v) for k, v in PAPER_PROTOCOL.items() if have.get(k) != v}
        if p.get("architecture") != "DQN":
            diff["architecture"] = (p.get("architecture"), "DQN")
        if diff:
            notes.append(f"{r['run']}: " + ", ".join(f"{k} {a} (paper code: {b})" for k, (a, b) in diff.items()))
    return notes


def markdown(recs: Sequence[dict], main: dict, alt: dict, paper: dict) -> list[str]:
    done = [r for r in recs if r["finished"]]
    games = done[0]["games"] if done else recs[0]["games"]
    greedy = sorted({g for r in recs for g in r["greedy"]})
    episodes = sorted({e for r in recs for e in r["episodes"]})
    lines = [f"Continual MinAtar ({' -> '.join(g.split('/')[-1] for g in games)}), "
             f"{'greedy' if greedy == ['True'] else 'policy ' + str(greedy)} evaluation, "
             f"{', '.join(map(str, episodes))} episodes per game and evaluation. Finished runs: "
             f"{sum(r['arm'] == 'vanilla' for r in done)} vanilla, {sum(r['arm'] == 'C-CHAIN' for r in done)} "
             f"C-CHAIN.", ""]
    lines += ["Score (the paper code's logged evaluation curve averaged over the run, 121 evaluations): mean +- "
              "standard error [95% t interval] (n runs), the published numbers beside (the experiment's "
              "declared.published: " + (f"{paper['source']}" if paper["source"] else "not declared") + ").", "",
              "| arm | ours | published | published 95% (t, n - 1 df) | published +- 1.96 SE |",
              "|---|---|---|---|---|"]
    for arm in ARMS:
        lines.append(f"| {arm} | {_pm(main.get(arm))} | " + " | ".join(_paper(paper["arms"][arm])) + " |")
    d = main.get("difference")
    if d:
        c = d["comparison"]
        pv, pc = paper["arms"]["vanilla"], paper["arms"]["C-CHAIN"]
        gap = (f"{pc['mean'] - pv['mean']:+.3f}" if pv and pc and None not in (pv["mean"], pc["mean"])
               else "not declared")
        lines += ["", f"C-CHAIN - vanilla: {_iv(d['welch'])} (Welch 95%); paired by seed "
                  f"{_iv(d.get('paired'))} (t 95%, seeds {d.get('paired_seeds')}); published: "
                  f"{gap}. Probability of improvement "
                  f"{c['probability_of_improvement']['estimate']:.2f}, one-sided Mann-Whitney p = "
                  f"{c['mann_whitney']['p']:.4g}, permutation test of the means p = {c['permutation']['p']:.4g}."]
    lines += ["", "Sensitivity: all 123 evaluations the code runs (the first two games' final evaluations back in): "
              + "; ".join(f"{arm} {_pm(alt.get(arm))}" for arm in ARMS)
              + (f"; difference {_iv(alt['difference']['welch'])}" if alt.get("difference") else "") + "."]
    lines += ["", "Per run (score; per game: mean over its task's evaluations / final evaluation):", "",
              "| run | arm | seed | score | " + " | ".join(g.split("/")[-1] for g in games) + " | evaluations |",
              "|---|---|---|---|" + "---|" * len(games) + "---|"]
    for r in recs:
        s = r["scores"]
        cells = [f"{s['per_game_mean'].get(g, math.nan):.2f} / {s['per_game_final'].get(g, math.nan):.2f}"
                 for g in games]
        state = "" if r["finished"] else (f" (unfinished: evaluated up to step {r['last_step']:,} of "
                                          f"{r['total_timesteps']:,})")
        lines.append(f"| {r['run']}{state} | {r['arm']} | {r['seed']} | {s['score']:.3f} | " + " | ".join(cells)
                     + f" | {s['evaluations']} |")
    notes = protocol_notes(recs)
    if notes:
        lines += ["", "Settings that differ from the paper code's:", ""] + [f"- {n}" for n in notes]
    missing = [r["run"] for r in recs if r["missing"]]
    if missing:
        lines += ["", f"Runs missing the paper's game at some evaluation step: {', '.join(missing)}"]
    lines += ["", "Provenance:", ""] + provenance_lines(provenance((r["run"], r["starts"]) for r in recs))
    return lines


def load_random_baseline(path: str) -> dict:
    """eval.py's JSON of a --random_actions evaluation: {"path", "episodes", "games": {regime: {"mean", "max"}}}."""
    _, rows = read_no_agent_eval(path, "random_actions")
    return {"path": path, "episodes": sorted({r["episodes"] for r in rows.values()}),
            "games": {m: {"mean": r["mean"], "max": r["max"]} for m, r in rows.items()}}


def learned_check(recs: Sequence[dict], baseline: dict) -> list[dict]:
    """Per arm and game: the runs that reached the end of the game's task, their final evaluations, and how many beat
    the random policy's mean and its best game (see the module docstring)."""
    out = []
    for arm in ARMS:
        rs = [r for r in recs if r["arm"] == arm]
        if not rs:
            continue
        for k, (game, regime) in enumerate(zip(rs[0]["games"], rs[0]["regimes"])):
            rand = baseline["games"].get(normalize_modification(regime))
            finals = [r["final"][k] for r in rs if k in r["final"]]
            out.append({"arm": arm, "game": game, "regime": regime, "runs": len(finals),
                        "final": statistics.interval(finals).as_dict() if finals else None,
                        "random_mean": rand and rand["mean"], "random_max": rand and rand["max"],
                        "above_mean": None if rand is None else sum(v > rand["mean"] for v in finals),
                        "learned": None if rand is None else sum(v > rand["max"] for v in finals)})
    return out


def _mean_ci(d: Optional[dict]) -> str:
    if not d:
        return ""
    low, high = d["ci"]
    return f"{d['estimate']:.2f}" + ("" if low is None else f" [{low:.2f}, {high:.2f}]") + f" (n={d['n']})"


def learned_lines(check: Sequence[dict], baseline: dict) -> list[str]:
    lines = ["", f"Learned check (added 2026-12-01 after the launch, before any run had reached the end of its first "
             f"task; not declared): each game's final evaluation at the end of its task (10 greedy games), against "
             f"uniformly random actions under the same env settings ({baseline['path']}, "
             f"{', '.join(map(str, baseline['episodes']))} games each). Learned: above the random policy's best game.",
             "", "| arm | game | runs at the task's end | final evaluation | random: mean / best game | "
             "above the random mean | learned |", "|---|---|---|---|---|---|---|"]
    for c in check:
        rand = "not evaluated" if c["random_mean"] is None else f"{c['random_mean']:.2f} / {c['random_max']:g}"
        count = (lambda n: "" if n is None or not c["runs"] else f"{n} of {c['runs']}")
        lines.append(f"| {c['arm']} | {c['game'].split('/')[-1]} | {c['runs']} | {_mean_ci(c['final'])} | {rand} | "
                     f"{count(c['above_mean'])} | {count(c['learned'])} |")
    return lines


def curves_figure(recs: Sequence[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for arm, colour in zip(ARMS, ("tab:blue", "tab:red")):
        rs = [r for r in recs if r["finished"] and r["arm"] == arm]
        if not rs:
            continue
        steps = [s for s, _, _ in rs[0]["curve"]]
        m = np.array([[v for _, _, v in r["curve"]] for r in rs if len(r["curve"]) == len(steps)])
        mean = m.mean(0)
        se = m.std(0, ddof=1) / math.sqrt(len(m)) if len(m) > 1 else np.zeros_like(mean)
        x = np.asarray(steps) / 1e6
        ax.plot(x, mean, color=colour, label=f"{arm} (n={len(m)})")
        ax.fill_between(x, mean - se, mean + se, color=colour, alpha=0.2)
    for b in (recs[0]["boundaries"][:-1]):
        ax.axvline(b / 1e6, color="grey", lw=0.5)
    ax.set_xlabel("agent steps (M)")
    ax.set_ylabel("greedy evaluation return")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(folder: str, out: Optional[str] = None, baseline: Optional[str] = None) -> dict:
    random = load_random_baseline(baseline) if baseline else None
    recs = load(folder)
    main, alt = summarize(recs, "score"), summarize(recs, "score_all_evaluations")
    paper = published(folder, recs)
    lines = markdown(recs, main, alt, paper)
    result = {"folder": folder, "paper": paper, "score": main,
              "score_all_evaluations": alt, "runs": recs}
    if random:
        result["learned_check"] = {"baseline": random, "games": learned_check(recs, random)}
        lines += learned_lines(result["learned_check"]["games"], random)
    if out:
        os.makedirs(out, exist_ok=True)
        if any(r["finished"] for r in recs):
            curves_figure(recs, os.path.join(out, "curves.png"))
        with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
            f.write(f"# C-CHAIN's Continual MinAtar ({os.path.basename(os.path.normpath(folder))})\n\n"
                    + "\n".join(lines) + ("\n\n![curves](curves.png)\n" if any(r["finished"] for r in recs) else "\n"))
        with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    result["markdown"] = lines
    return result
