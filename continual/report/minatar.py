"""Report of a MinAtar single-task experiment (configs/experiments/minatar_reference.json): a table per protocol with
our PPO's final training return per game (mean and 95% t-interval over seeds, each seed's value), the published or
side-by-side reference beside it, and learning curves.

    python -m continual.report minatar EXPERIMENT_FOLDER --out bench/results/minatar_reference
    python -m continual.report minatar --from-report bench/results/minatar_reference/report.json --out DIR

Final return: the mean return of the training episodes (the sampling policy) in the last 10% of a run's steps, the
statistic PureJaxRL's numbers below use. Runs still going are shown with the step they reached and kept out of the
means. Protocols: "minatar" (MinAtar's package: sticky actions 0.1, all 6 actions, no step cap; Freeway ends itself
after 2,500 frames) and "gymnax" (`-v1` ids: minimal action sets, no sticky actions, games cut at 1,000 steps, Freeway
at 2,500 as in gymnax); a gymnax run with another cap is shown as its own protocol. References (sources in
REFERENCES): the MinAtar paper (Young & Tian 2019, 5M frames, 30 runs, training returns, read from the figures of its
repository's README: DQN and AC(0.8)); PureJaxRL's PPO run on this kind of 2-core CPU (3 seeds, 5M steps,
shared/research/findings_to_reproduce.md); gymnax-blines' PPO (one run, evaluation return of the stochastic policy,
MLP, gamma 0.999, from the `log_return` of its committed `agents/*/ppo.pkl` logs at the log points nearest 5M).

`--from-report` rebuilds the table, report.json and curves.png from a stored report.json's per-run records (the runs
themselves are not kept in git). The stored report keeps no folder name, so the heading names the report.json instead.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Optional

from continual.errors import UserError
from continual.evaluation.metrics import mean_ci
from continual.launch.queue import run_dirs
from continual.modstrings import game_name
from continual.training.tracking import read_metrics

# (protocol, game) -> (label, value); only numbers we have a source for
PAPER = "MinAtar paper DQN / AC(0.8), 5M frames, read from its README figures"
BLINES = "gymnax-blines PPO, lr 5e-4, eval return, 1 run, at 4.8M / 5.12M"
REFERENCES = {
    ("minatar", "Asterix"): (PAPER, "~17 / ~19"),
    ("minatar", "Breakout"): (PAPER, "~10 / ~17.5"),
    ("minatar", "Freeway"): (PAPER, "~50 / ~47"),
    # the paper's Seaquest predates MinAtar 1.0.11's oxygen fix
    ("minatar", "Seaquest"): (PAPER + ", MinAtar < 1.0.11", "~20 / ~15.5"),
    ("minatar", "SpaceInvaders"): (PAPER, "~43 / ~185"),
    ("gymnax", "Asterix"): (BLINES, "8.1 / 7.6"),
    ("gymnax", "Breakout"): ("PureJaxRL PPO, 5M steps, same CPU", "36.4 (23.9, 44.3, 40.9)"),
    ("gymnax", "Freeway"): (BLINES, "52.1 / 51.2"),
    ("gymnax", "SpaceInvaders"): ("PureJaxRL PPO, 5M steps, same CPU", "144.7 (139.8, 145.3, 149.1)"),
}
GYMNAX_CAP = {"Freeway": 2500}  # gymnax's own step cap per game (1,000 for the others)
RUN_KEYS = ("run", "game", "protocol", "seed", "steps", "total", "done", "final", "curve", "sps")


def run_summary(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, "metrics.jsonl")
    cfg_path = os.path.join(run_dir, "config.json")
    if not (os.path.exists(path) and os.path.exists(cfg_path)):
        return None
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    records = read_metrics(path)
    episodes = [(r["global_step"], r["return"]) for r in records if r.get("kind") == "episode"]
    its = [r for r in records if r.get("kind") == "iteration"]
    if not its or not episodes:
        return None
    total = cfg.get("resolved_total_timesteps") or cfg["total_timesteps"]
    last = its[-1]["global_step"]
    tail = [ret for s, ret in episodes if s > 0.9 * last]
    game = game_name(cfg["env_id"])
    protocol = "gymnax" if cfg["env_id"].endswith("-v1") else "minatar"
    cap = cfg.get("max_episode_steps")
    if protocol == "gymnax" and cap != GYMNAX_CAP.get(game, 1000):
        protocol = f"gymnax, {cap}-step cap"  # not gymnax's protocol: no reference applies
    # curve: mean return per 5% of the run
    bins = 20
    curve = []
    for b in range(bins):
        lo, hi = last * b / bins, last * (b + 1) / bins
        xs = [ret for s, ret in episodes if lo < s <= hi]
        curve.append((hi, sum(xs) / len(xs) if xs else None))
    sps = [r["charts/SPS"] for r in its if "charts/SPS" in r]
    return {"run": os.path.basename(run_dir), "game": game, "protocol": protocol, "seed": cfg["seed"],
            "steps": last, "total": total, "done": last >= total, "final": sum(tail) / len(tail) if tail else None, "curve": curve,
            "sps": float(statistics.median(sps)) if sps else float("nan")}


def read_runs(folder: Optional[str], from_report: Optional[str]) -> tuple[list[dict], str]:
    """The per-run summaries and the name the heading gives them: a folder's runs, or a stored report's records."""
    if (folder is None) == (from_report is None):
        raise UserError("minatar: give the experiment FOLDER or --from-report REPORT_JSON, not both")
    if from_report is not None:
        try:
            with open(from_report, encoding="utf-8") as f:
                runs = json.load(f).get("runs")
        except (OSError, ValueError, AttributeError) as e:
            raise UserError(f"{from_report}: not a readable report.json ({e})") from None
        if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) and set(RUN_KEYS) <= set(r)
                                                              for r in runs):
            raise UserError(f"{from_report}: no per-run records ({', '.join(RUN_KEYS)}): not a minatar report.json")
        return runs, from_report
    runs_root = os.path.join(folder, "runs")
    if not os.path.isdir(runs_root):
        raise UserError(f"{folder}: no runs/ folder (is it an experiment folder?)")
    runs = [s for s in (run_summary(d) for d in run_dirs(folder)) if s]
    return runs, folder


def report(folder: Optional[str], out: Optional[str], from_report: Optional[str] = None) -> dict:
    runs, source = read_runs(folder, from_report)
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["protocol"], r["game"]), []).append(r)
    lines = ["| protocol | game | our PPO, final return (95% CI) | seeds | reference |", "|---|---|---|---|---|"]
    table = []
    for (protocol, game), rs in sorted(groups.items()):
        done = [r for r in rs if r["done"]]
        stats = mean_ci([r["final"] for r in done])
        seeds = ", ".join(("-" if r["final"] is None else f"{r['final']:.1f}") + ("" if r["done"] else f" (at {r['steps'] / 1e6:.2f}M, running)")
                          for r in sorted(rs, key=lambda r: r["seed"]))
        ref = REFERENCES.get((protocol, game), ("", "not measured"))
        m, h = stats["mean"], stats["ci95"]  # h: the t-interval's half-width (None for one seed)
        shown = "-" if m is None else f"{m:.1f}" if h is None else f"{m:.1f} [{m - h:.1f}, {m + h:.1f}]"
        lines.append(f"| {protocol} | {game} | {shown} | {seeds} | {ref[1]} {('(' + ref[0] + ')') if ref[0] else ''} |")
        table.append({"protocol": protocol, "game": game, "n_done": len(done), "mean": stats["mean"],
                      "ci95_half_width": stats["ci95"], "seeds": [{k: r[k] for k in ("seed", "final", "steps", "done", "sps")}
                                                           for r in rs], "reference": ref})
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
            f.write(f"# MinAtar single-task reference ({source})\n\nFinal return = mean training-episode return in "
                    "the last 10% of a run's steps; 95% CI: t-interval over seeds.\n\n" + "\n".join(lines) + "\n")
        with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
            json.dump({"table": table, "runs": runs}, f, indent=1)
        plot(groups, os.path.join(out, "curves.png"))
    return {"markdown": lines, "table": table, "runs": runs}


def plot(groups: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(3.2 * max(1, len(groups)), 2.8), squeeze=False)
    for ax, ((protocol, game), rs) in zip(axes[0], sorted(groups.items())):
        for r in rs:
            xs = [x / 1e6 for x, y in r["curve"] if y is not None]
            ax.plot(xs, [y for _, y in r["curve"] if y is not None], label=f"seed {r['seed']}")
        ax.set_title(f"{game} ({protocol})", fontsize=9)
        ax.set_xlabel("steps (M)")
    axes[0][0].set_ylabel("training return")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
