"""Benchmark: HER against goal-conditioned PPO without relabelling on a sparse goal-reaching task, same budget.

Task: `continual/GoalGrid-v0` (continual/envs/goal_grid.py): a 15 x 15 grid, a uniformly drawn start cell and desired
goal cell per episode, 50 steps, goal reward 1 only on the goal cell itself (--her_tolerance 0.05 < 1/14), the env
reward withheld (--her_env_reward_weight 0). A uniformly random policy touches its goal in about 8-14% of the
episodes, so the reward is seen rarely and only for goals close to the start.

Conditions (all PPO, identical hyperparameters, seeds and budget; only the relabelling differs):
  no_her       --her --her_ratio 0                       goal-conditioned PPO with the goal reward, no relabelling
  her_future   --her --her_strategy future --her_k 4     one relabelled sample per original sample (--her_ratio 1)
  her_final    --her --her_strategy final                one relabelled copy per episode piece

Metrics: training success rate (share of episodes that touched their goal, `her/success_rate`), per iteration and
smoothed; after training, a fresh evaluation of the stochastic policy (`continual.evaluation.episodes.evaluate`, --eval_episodes
episodes, other env seeds). Outputs: a PNG of the success-rate curves (mean +- std over seeds), a JSON file, and
with --results a section appended to bench/RESULTS.md.

Run from the repository root:  python bench/her_experiment.py [--seeds 1 2 3] [--total_timesteps 60000]
Runs are in-process and sequential (one torch thread); ~30 s per run on a loaded 2-core machine (9 runs: ~5 min).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

from continual.console import print_table  # noqa: E402

CONDITIONS = {
    "no_her": ["--her_ratio", "0"],
    "her_future": ["--her_strategy", "future", "--her_k", "4", "--her_ratio", "1"],
    "her_final": ["--her_strategy", "final", "--her_ratio", "1"],
}
LABELS = {"no_her": "no HER (goal-conditioned PPO)", "her_future": "HER future (k=4)", "her_final": "HER final"}
COLORS = {"no_her": "tab:gray", "her_future": "tab:blue", "her_final": "tab:orange"}
HYPER = ["--env_id", "continual/GoalGrid-v0", "--backend", "Gymnasium", "--her", "--reward_scaling", "none",
         "--her_env_reward_weight", "0", "--her_goal_reward", "1", "--her_tolerance", "0.05", "--her_is_clip", "1",
         "--num_envs", "8", "--num_steps", "64", "--learning_rate", "1e-3", "--gamma", "0.95",
         "--no-progress-bar"]


def run_one(condition: str, seed: int, total: int, runs_dir: str, eval_episodes: int) -> dict:
    import numpy as np
    import torch

    from agents import ppo
    from continual.config.loading import args_from_dict
    from continual.envs.vector import EnvSettings, make_vector_env
    from continual.evaluation.episodes import agent_policy, evaluate
    from continual.training.checkpoint import load_checkpoint

    t0 = time.time()
    run_dir = ppo.main([*HYPER, *CONDITIONS[condition], "--seed", str(seed), "--total_timesteps", str(total),
                        "--runs_dir", runs_dir, "--run_name", f"{condition}__s{seed}"])
    train_s = time.time() - t0
    its = common.metrics(run_dir, "iteration")
    curve = [(r["global_step"], r["her/success_rate"]) for r in its if "her/success_rate" in r]

    state = load_checkpoint(run_dir)
    train_args = args_from_dict(state["args"])
    envs = make_vector_env(EnvSettings.from_args(train_args), 8, "")
    try:
        agent = ppo.make_agent(envs.single_observation_space, int(envs.single_action_space.n), train_args)
        agent.load_state_dict(state["model"])
        agent.eval()
        row = evaluate(agent_policy(agent), envs, eval_episodes, torch.device("cpu"), seed=10_000 + seed).row()
    finally:
        envs.close()
    last = [s for _, s in curve[-max(1, len(curve) // 10):]]
    fractions = [r["her/relabelled_fraction"] for r in its if "her/relabelled_fraction" in r]
    return {"condition": condition, "seed": seed, "curve": curve, "train_success_last10pct": float(np.mean(last)),
            "eval_success": row["success_rate"], "eval_goal_distance": row["goal_distance"],
            "eval_episodes": row["episodes"], "relabelled_fraction": float(np.mean(fractions)) if fractions else 0.0,
            "train_seconds": train_s, "sps": its[-1]["charts/SPS"] if its else None}


def random_policy_success(episodes: int, seed: int = 12_345) -> float:
    """Success rate of a uniformly random policy on the same task (the chance level)."""
    import torch

    from continual.config.args import Args
    from continual.envs.vector import EnvSettings, make_vector_env
    from continual.evaluation.episodes import agent_policy, evaluate

    class RandomAgent:
        def get_action_and_value(self, x, action=None, greedy=False, goal=None):
            return torch.randint(0, 5, (len(x),)), None, None, None

    args = Args(env_id="continual/GoalGrid-v0", backend="Gymnasium", her=True, her_tolerance=0.05)
    envs = make_vector_env(EnvSettings.from_args(args), 8, "")
    try:
        return evaluate(agent_policy(RandomAgent()), envs, episodes, torch.device("cpu"), seed=seed).row()["success_rate"]
    finally:
        envs.close()


def steps_to(curve: list[tuple[int, float]], level: float, smooth: int) -> float:
    """First step at which the smoothed success rate reaches `level` (nan if never)."""
    s = smoothed([v for _, v in curve], smooth)
    for (step, _), v in zip(curve, s):
        if v >= level:
            return float(step)
    return float("nan")


def smoothed(values: list[float], k: int) -> list[float]:
    import numpy as np

    v = np.asarray(values, np.float64)
    return [float(v[max(0, i - k + 1):i + 1].mean()) for i in range(len(v))]


def plot(results: list[dict], conditions: list[str], path: str, smooth: int, total: int,
         random_success: Optional[float] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for cond in conditions:
        runs = [r for r in results if r["condition"] == cond]
        grid = np.linspace(0, total, 61)[1:]
        ys = []
        for r in runs:
            steps = np.array([s for s, _ in r["curve"]], np.float64)
            vals = np.array(smoothed([v for _, v in r["curve"]], smooth))
            ys.append(np.interp(grid, steps, vals))
        ys = np.array(ys)
        mean, std = ys.mean(0), ys.std(0)
        ax.plot(grid, mean, color=COLORS[cond], label=f"{LABELS[cond]} ({len(runs)} seeds)")
        ax.fill_between(grid, mean - std, mean + std, color=COLORS[cond], alpha=0.2)
    ax.set_xlabel("agent steps")
    ax.set_ylabel(f"training success rate (moving avg. {smooth} it.)")
    ax.set_ylim(0, 1.02)
    ax.set_title("GoalGrid 15x15, sparse goal reward: HER vs no HER (mean ± std)")
    ax.grid(alpha=0.3)
    if random_success is not None:
        ax.axhline(random_success, color="k", ls=":", lw=1, label=f"uniformly random policy ({random_success:.2f})")
    ax.legend(loc="center right", fontsize=8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    common.save_figure(fig, path)
    print(f"plot written to {path}")


def summary_rows(results: list[dict], conditions: list[str], smooth: int) -> list[list[str]]:
    import numpy as np

    rows = []
    for cond in conditions:
        runs = [r for r in results if r["condition"] == cond]

        def ms(key: str) -> str:
            v = np.array([r[key] for r in runs], np.float64)
            return f"{v.mean():.3f} ± {v.std():.3f}"

        reach = [steps_to(r["curve"], 0.8, smooth) for r in runs]
        reached = [x for x in reach if x == x]
        rows.append([LABELS[cond], str(len(runs)), ms("train_success_last10pct"), ms("eval_success"),
                     ms("eval_goal_distance"), f"{len(reached)}/{len(runs)}"
                     + (f" (median {int(np.median(reached)):,})" if reached else ""),
                     f"{np.mean([r['relabelled_fraction'] for r in runs]):.2f}",
                     f"{np.mean([r['train_seconds'] for r in runs]):.0f}"])
    return rows


COLUMNS = ["condition", "seeds", "train success (last 10%)", "eval success", "eval closest distance",
           "runs reaching 80% (step)", "relabelled fraction", "s / run"]


def append_results(path: str, rows: list[list[str]], args: argparse.Namespace, png: str, info: dict) -> None:
    lines = ["", f"## HER vs no HER on a sparse goal task ({info['date'][:10]})", "",
             f"`python bench/her_experiment.py --seeds {' '.join(map(str, args.seeds))} --total_timesteps "
             f"{args.total_timesteps}` on {info['nproc']} CPU cores ({info['cpu_model']}, load average at start "
             f"{info['loadavg_start']}), torch {info['versions']['torch']}, one torch thread.", "",
             "Task: `continual/GoalGrid-v0`, 15x15 grid, random start and goal cell per episode, 50 steps, goal reward "
             "1 only on the goal cell, env reward withheld. PPO with identical hyperparameters (8 envs x 64 steps, "
             "lr 1e-3, gamma 0.95, 4 epochs x 4 minibatches); the conditions differ only in relabelling. "
             f"Success = the episode touched its goal. Eval: {args.eval_episodes} episodes of the stochastic policy "
             "per run on unseen env seeds. Mean ± std over seeds.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", f"Curves: `{os.path.relpath(png, common.REPO_ROOT)}`.", ""]
    new = not os.path.exists(path)
    with open(path, "a", encoding="utf-8") as f:
        if new:
            f.write("# Benchmark results\n")
        f.write("\n".join(lines))
    print(f"appended to {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--total_timesteps", type=int, default=60_000)
    p.add_argument("--conditions", nargs="+", default=["no_her", "her_future", "her_final"], choices=list(CONDITIONS))
    p.add_argument("--eval_episodes", type=int, default=200)
    p.add_argument("--smooth", type=int, default=10, help="moving average over this many iterations")
    p.add_argument("--png", default=os.path.join(common.REPO_ROOT, "bench", "out", "her_success.png"))
    p.add_argument("--json", default=os.path.join(common.REPO_ROOT, "bench", "out", "her_experiment.json"))
    p.add_argument("--results", default=None, help="append a section to this markdown file (e.g. bench/RESULTS.md)")
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    info = common.machine_info()
    results = []
    with tempfile.TemporaryDirectory(prefix="her_bench_") as runs_dir:
        for seed in args.seeds:
            for cond in args.conditions:
                r = run_one(cond, seed, args.total_timesteps, runs_dir, args.eval_episodes)
                print(f"{cond:11s} seed {seed}: train success (last 10%) {r['train_success_last10pct']:.3f}, "
                      f"eval success {r['eval_success']:.3f}, {r['train_seconds']:.0f} s", flush=True)
                results.append(r)
    info["loadavg_end"] = common.loadavg()
    chance = random_policy_success(1000)
    rows = summary_rows(results, args.conditions, args.smooth)
    rows.append(["uniformly random policy", "-", "-", f"{chance:.3f}", "-", "-", "-", "-"])
    print_table(None, COLUMNS, rows)
    plot(results, args.conditions, args.png, args.smooth, args.total_timesteps, chance)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"machine": info, "args": vars(args), "random_policy_success": chance, "results": results}, f,
                  indent=1)
    print(f"results written to {args.json}")
    if args.results:
        append_results(args.results, rows, args, args.png, info)


if __name__ == "__main__":
    main()
