"""Learning quality on MinAtar: our PPO, IMPALA and DQN, and SB3 PPO, on MinAtar games, several seeds each.

Each run trains one agent on one game from scratch (no curriculum): ours through `continual_training_example.py
--backend MinAtar --env_id MinAtar/<Game>`, SB3 PPO (same hyperparameters as our PPO, MinAtar's small CNN) on the
same env stack (`continual.envs.vector.make_env` thunks in a DummyVecEnv, as our PPO's sync vector env for MinAtar),
so the observation, sticky actions (MinAtar's default 0.1) and episode statistics are identical.

    python bench/learning.py                                  # 2 games x 4 agents x 3 seeds, 100k steps each
    python bench/learning.py --agents IMPALA_freeway_cfg      # IMPALA with configs/impala_freeway.json's optimiser
    python bench/learning.py --steps 20000 --seeds 1 --runs_dir /tmp/l --out /tmp/l   # smoke run
    python bench/learning.py --summarize_only                 # tables, JSON and plots from the runs present

One run at a time, each in its own subprocess (`nice -n 10`, one torch thread). Resumable: a run whose result file
`<runs_dir>/<agent>_<game>_s<seed>.json` exists is skipped; a run cut by a crash is redone from its start. Per run the
result file keeps every episode's (end step, return), wall and CPU seconds. The summary (bench/results/
learning_minatar.json) keeps the final returns (mean of the last 10% of each run's episodes) with bootstrap 95% CIs
over seeds and the learning curves (mean and bootstrap CI of the seeds' binned returns); one plot per game
(bench/results/learning_<game>.png).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (puts the repository root on sys.path)

ROOT = common.REPO_ROOT
GAMES = ("Breakout", "SpaceInvaders")
AGENTS = ("PPO", "SB3_PPO", "IMPALA", "DQN", "IMPALA_freeway_cfg")
# Our PPO's defaults are CleanRL's ppo_atari values (8 envs x 128 steps, 4 epochs x 4 minibatches, Adam 2.5e-4
# annealed, clip 0.1, entropy 0.01, GAE 0.95, gamma 0.99); SB3 PPO gets the same (see worker_sb3).
PPO = {"num_envs": 8, "num_steps": 128, "num_minibatches": 4, "update_epochs": 4, "learning_rate": 2.5e-4,
       "clip_coef": 0.1, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5, "gamma": 0.99, "gae_lambda": 0.95}
AGENT_ARGS = {
    "PPO": ["--architecture", "PPO"],
    # defaults: 2 actors x 4 envs, unrolls of 20 steps, 4 unrolls per update, RMSprop 2.5e-4 annealed, entropy 0.01
    "IMPALA": ["--architecture", "IMPALA"],
    # the optimiser values of the shipped configs/impala_freeway.json (TorchBeast-like): the default max_grad_norm
    # 0.5 is PPO's and, with RMSprop's eps 0.01, leaves IMPALA's steps tiny (its gradient norms are ~100)
    "IMPALA_freeway_cfg": ["--architecture", "IMPALA", "--max_grad_norm", "40", "--learning_rate", "6e-4"],
    # MinAtar paper's DQN values (buffer 100k, batch 32, target copy every 1000 steps, learning after 5000 steps,
    # step size 2.5e-4) except: Adam (paper: RMSprop), one update per 4 agent steps (paper: every step; 4x cheaper),
    # epsilon 1 -> 0.05 over 40% of the run (paper: 1 -> 0.1 over its first 100k of 5M frames), 8 envs
    "DQN": ["--architecture", "DQN", "--buffer_size", "100000", "--replay_batch_size", "32",
            "--target_network_frequency", "1000", "--learning_starts", "5000", "--learning_rate", "2.5e-4",
            "--no-anneal_lr", "--train_frequency", "4", "--start_e", "1.0", "--end_e", "0.05",
            "--exploration_fraction", "0.4"],
}
FINAL_FRACTION = 0.1  # final return: mean of the last 10% of a run's episodes


# --------------------------------------------------------------------------------------------------------------------
# statistics (tests/test_bench_learning.py checks them by hand)
# --------------------------------------------------------------------------------------------------------------------


def final_return(returns: Sequence[float], fraction: float = FINAL_FRACTION) -> float:
    """Mean return of the last `fraction` of the episodes (at least one), in the order they ended."""
    if len(returns) == 0:
        return float("nan")
    k = max(1, math.ceil(fraction * len(returns)))
    return float(np.mean(np.asarray(returns, dtype=np.float64)[-k:]))


def binned_curve(steps: Sequence[int], returns: Sequence[float], grid: np.ndarray) -> np.ndarray:
    """Mean return of the episodes that ended in (grid[i-1], grid[i]] (grid[-1] = 0 before the first point); NaN
    for a bin without an episode end."""
    steps, returns = np.asarray(steps, dtype=np.int64), np.asarray(returns, dtype=np.float64)
    out = np.full(len(grid), np.nan)
    lo = 0
    for i, hi in enumerate(grid):
        sel = (steps > lo) & (steps <= hi)
        if sel.any():
            out[i] = returns[sel].mean()
        lo = hi
    return out


def mean_ci(values: Sequence[float], reps: int) -> tuple[float, float, float, int]:
    """(mean, lo, hi, n) of common.bootstrap_ci, NaN where there is no value (the summary's numbers and plots)."""
    d = common.bootstrap_ci(values, reps)
    return (d["mean"], *d["ci95"], d["n"]) if d["n"] else (float("nan"), float("nan"), float("nan"), 0)


def summarize(results: dict[tuple[str, str, int], dict], steps: int, points: int = 50, reps: int = 2000) -> dict:
    """results[(agent, game, seed)] = a run's result file -> per game and agent: final returns, their mean and
    bootstrap CI, and the binned learning curve (mean and CI over seeds)."""
    grid = np.linspace(steps / points, steps, points).round().astype(np.int64)
    out: dict = {"grid": grid.tolist(), "games": {}}
    for game in sorted({g for _, g, _ in results}):
        per_agent = {}
        for agent in [a for a in AGENTS if any(k[0] == a and k[1] == game for k in results)] + sorted(
                {a for a, g, _ in results if g == game and a not in AGENTS}):
            runs = {s: r for (a, g, s), r in sorted(results.items()) if a == agent and g == game}
            finals = {s: final_return(r["returns"]) for s, r in runs.items()}
            m, lo, hi, n = mean_ci(list(finals.values()), reps)
            curves = np.array([binned_curve(r["steps"], r["returns"], grid) for r in runs.values()])
            band = [mean_ci(curves[:, i], reps) for i in range(len(grid))]
            per_agent[agent] = {
                "seeds": sorted(runs), "final_by_seed": {str(s): f for s, f in finals.items()},
                "final_mean": m, "final_ci95": [lo, hi], "n": n,
                "episodes_by_seed": {str(s): len(r["returns"]) for s, r in runs.items()},
                "wall_s_by_seed": {str(s): r.get("wall_s") for s, r in runs.items()},
                "cpu_s_by_seed": {str(s): r.get("cpu_s") for s, r in runs.items()},
                "foreign_cores_by_seed": {str(s): r.get("foreign_cores") for s, r in runs.items()},
                "curve_mean": [b[0] for b in band], "curve_lo": [b[1] for b in band], "curve_hi": [b[2] for b in band],
            }
        out["games"][game] = per_agent
    return out


# --------------------------------------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------------------------------------


def run_name(agent: str, game: str, seed: int) -> str:
    return f"{agent}_{game}_s{seed}"


def ours_command(agent: str, game: str, seed: int, steps: int, runs_dir: str) -> list[str]:
    ppo = [x for k, v in PPO.items() for x in (f"--{k}", str(v))] if agent == "PPO" else []
    return common.train_command([*AGENT_ARGS[agent], *ppo, "--backend", "MinAtar", "--env_id", f"MinAtar/{game}",
                                 "--total_timesteps", str(steps), "--seed", str(seed), "--torch_threads", "1"],
                                runs_dir, run_name(agent, game, seed))


def read_episodes(run_dir: str) -> tuple[list[int], list[float]]:
    eps = common.metrics(run_dir, "episode")
    return [int(r["global_step"]) for r in eps], [float(r["return"]) for r in eps]


def worker_sb3(game: str, seed: int, steps: int, out: str) -> None:
    """SB3 PPO with our PPO's hyperparameters on our MinAtar env stack; writes {"steps", "returns"} to `out`."""
    import torch
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from stable_baselines3.common.vec_env import DummyVecEnv
    from torch import nn

    import continual.envs.vector as cenvs

    torch.set_num_threads(1)

    class MinAtarCNN(BaseFeaturesExtractor):
        """Our PPO's torso for 10x10 grids (agents/ppo.py): 16 3x3 filters, 128 units; SB3's orthogonal init (gain
        sqrt(2) here, 0.01 policy head, 1 value head) is CleanRL's layer_init."""

        def __init__(self, observation_space, features_dim: int = 128):
            super().__init__(observation_space, features_dim)
            c, h, w = observation_space.shape
            self.net = nn.Sequential(nn.Conv2d(c, 16, 3, stride=1), nn.ReLU(), nn.Flatten(),
                                     nn.Linear(16 * (h - 2) * (w - 2), features_dim), nn.ReLU())

        def forward(self, x):
            return self.net(x)

    class Episodes(BaseCallback):
        def __init__(self):
            super().__init__()
            self.steps, self.returns = [], []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # gymnasium's RecordEpisodeStatistics in our stack, at the episode's end
                    self.steps.append(int(self.num_timesteps))
                    self.returns.append(float(info["episode"]["r"]))
            return True

    settings = cenvs.EnvSettings(env_id=f"MinAtar/{game}", backend="MinAtar")
    venv = DummyVecEnv([cenvs.make_env(settings, i, "") for i in range(PPO["num_envs"])])
    venv.seed(seed)
    lr = PPO["learning_rate"]
    model = SB3PPO("MlpPolicy", venv, n_steps=PPO["num_steps"],
                   batch_size=PPO["num_envs"] * PPO["num_steps"] // PPO["num_minibatches"],
                   n_epochs=PPO["update_epochs"], learning_rate=lambda remaining: remaining * lr, gamma=PPO["gamma"],
                   gae_lambda=PPO["gae_lambda"], clip_range=PPO["clip_coef"], ent_coef=PPO["ent_coef"],
                   vf_coef=PPO["vf_coef"], max_grad_norm=PPO["max_grad_norm"], seed=seed, device="cpu", verbose=0,
                   policy_kwargs={"features_extractor_class": MinAtarCNN, "net_arch": {"pi": [], "vf": []}})
    cb = Episodes()
    model.learn(total_timesteps=steps, callback=cb)
    venv.close()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"steps": cb.steps, "returns": cb.returns}, f)


def run_one(agent: str, game: str, seed: int, steps: int, runs_dir: str) -> Optional[dict]:
    name = run_name(agent, game, seed)
    run_dir, log = os.path.join(runs_dir, name), os.path.join(runs_dir, name + ".log")
    shutil.rmtree(run_dir, ignore_errors=True)  # a run cut by a crash: redo it from its start
    sb3_out = os.path.join(runs_dir, name + ".sb3.json")
    if agent == "SB3_PPO":
        cmd = [sys.executable, os.path.abspath(__file__), "--sb3_worker", game, str(seed), str(steps), sb3_out]
    else:
        cmd = ours_command(agent, game, seed, steps, runs_dir)
    r = common.run(cmd, log=log, nice=10, threads=1, env={"PYTHONPATH": ROOT}, sample_load=True, check=False)
    if r["rc"] != 0:
        return None
    if agent == "SB3_PPO":
        with open(sb3_out, encoding="utf-8") as f:
            eps = json.load(f)
        os.unlink(sb3_out)
        ep_steps, ep_returns = eps["steps"], eps["returns"]
    else:
        ep_steps, ep_returns = read_episodes(run_dir)
        shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)  # keep metrics and TensorBoard
    result = {"agent": agent, "game": game, "seed": seed, "total_timesteps": steps,
              **{k: r[k] for k in ("command", "wall_s", "cpu_s", "foreign_cores", "loadavg_start", "loadavg_end")},
              "steps": ep_steps, "returns": ep_returns}
    tmp = os.path.join(runs_dir, name + ".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(runs_dir, name + ".json"))
    return result


def load_results(runs_dir: str, steps: int) -> dict[tuple[str, str, int], dict]:
    out = {}
    if not os.path.isdir(runs_dir):
        return out
    for fn in sorted(os.listdir(runs_dir)):
        if fn.endswith(".json") and not fn.endswith(".sb3.json"):
            with open(os.path.join(runs_dir, fn), encoding="utf-8") as f:
                r = json.load(f)
            if r.get("total_timesteps") == steps:
                out[(r["agent"], r["game"], int(r["seed"]))] = r
    return out


# --------------------------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------------------------


def print_summary(summary: dict) -> None:
    rows = []
    for game, per_agent in summary["games"].items():
        for agent, s in per_agent.items():
            walls = [w for w in s["wall_s_by_seed"].values() if w is not None]
            cpus = [c for c in s["cpu_s_by_seed"].values() if c is not None]
            foreign = [c for c in s.get("foreign_cores_by_seed", {}).values() if c is not None]
            rows.append([game, agent, s["n"], f"{s['final_mean']:.2f}",
                         f"[{s['final_ci95'][0]:.2f}, {s['final_ci95'][1]:.2f}]",
                         " ".join(f"{v:.1f}" for v in s["final_by_seed"].values()),
                         f"{np.median(walls):.0f}" if walls else "-", f"{np.median(cpus):.0f}" if cpus else "-",
                         f"{np.mean(foreign):.1f}" if foreign else "-"])
    common.print_table("final return (mean of the last 10% of episodes); 95% bootstrap CI over seeds",
                       ["game", "agent", "seeds", "mean", "95% CI", "per seed", "wall s (median)", "CPU s (median)",
                        "other processes' cores (mean)"], rows)


def plot(summary: dict, steps: int, out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    grid = np.asarray(summary["grid"])
    for game, per_agent in summary["games"].items():
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for agent, s in per_agent.items():
            m = np.asarray(s["curve_mean"], dtype=float)
            ax.plot(grid, m, label=f"{agent} (n={s['n']})")
            ax.fill_between(grid, np.asarray(s["curve_lo"], dtype=float), np.asarray(s["curve_hi"], dtype=float),
                            alpha=0.2)
        ax.set(title=f"MinAtar/{game}: training episode return ({steps:,} steps per run)", xlabel="agent steps",
               ylabel=f"mean return of episodes ending in each {steps // len(grid):,}-step bin")
        ax.grid(alpha=0.3)
        ax.legend(title="mean, 95% bootstrap CI over seeds")
        paths.append(common.save_figure(fig, os.path.join(out_dir, f"learning_{game}.png")))
    return paths


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", default=",".join(GAMES), help="comma-separated MinAtar games")
    p.add_argument("--agents", default=",".join(AGENTS[:4]), help="comma-separated subset of " + ", ".join(AGENTS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100_000, help="agent steps per run")
    p.add_argument("--runs_dir", default=os.path.join(ROOT, "bench", "out", "learning"),
                   help="run directories and per-run result files (resumable)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="summary JSON and plots")
    p.add_argument("--summarize_only", action="store_true", help="no training: summarize the runs present")
    p.add_argument("--sb3_worker", nargs=4, metavar=("GAME", "SEED", "STEPS", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.sb3_worker:
        game, seed, steps, out = a.sb3_worker
        worker_sb3(game, int(seed), int(steps), out)
        return
    from continual.envs.backends import MINATAR_GAMES

    games, agents = [g for g in a.games.split(",") if g], [x for x in a.agents.split(",") if x]
    bad = [g for g in games if g not in MINATAR_GAMES] + [x for x in agents if x not in AGENTS]
    if bad or not games or not agents or a.seeds < 1 or a.steps < 1:
        print(f"error: unknown or empty games/agents {bad or ''} (games: {', '.join(MINATAR_GAMES)}; agents: "
              f"{', '.join(AGENTS)}), --seeds and --steps at least 1", file=sys.stderr)
        sys.exit(2)
    info = common.machine_info()
    os.makedirs(a.runs_dir, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    if not a.summarize_only:
        for seed in range(1, a.seeds + 1):  # seeds outermost: a cut-short session still has every agent and game
            for game in games:
                for agent in agents:
                    name = run_name(agent, game, seed)
                    if os.path.exists(os.path.join(a.runs_dir, name + ".json")):
                        continue
                    print(f"{time.strftime('%H:%M:%S')} {name}: training {a.steps:,} steps (load {common.loadavg()})",
                          flush=True)
                    r = run_one(agent, game, seed, a.steps, a.runs_dir)
                    if r is not None:
                        print(f"  {name}: {len(r['returns'])} episodes, final return "
                              f"{final_return(r['returns']):.2f}, wall {r['wall_s']:.0f} s, CPU {r['cpu_s']:.0f} s",
                              flush=True)
    results = {k: v for k, v in load_results(a.runs_dir, a.steps).items() if k[1] in games and k[0] in agents}
    if not results:
        print("no finished runs to summarize")
        return
    summary = summarize(results, a.steps)
    info["loadavg_end"] = common.loadavg()
    print_summary(summary)
    paths = plot(summary, a.steps, a.out)
    cfg = {"steps": a.steps, "games": games, "agents": agents, "seeds": a.seeds, "ppo": PPO, "agent_args": AGENT_ARGS,
           "final_fraction": FINAL_FRACTION, "commands": {run_name(*k): r["command"] for k, r in results.items()}}
    common.write_json(os.path.join(a.out, "learning_minatar.json"),
                      {"machine": info, "config": cfg, "summary": summary, "plots": paths})


if __name__ == "__main__":
    main()
