"""EWC's overhead: training steps/s of an agent with --ewc ewc / online vs without, same run settings, round-robin.

    python bench/ewc_overhead.py [--games CartPole Freeway MinAtar] [--agents PPO IMPALA] [--iterations 6]
                                 [--rounds 2] [--json out.json]

Each game runs a 2-regime curriculum that switches after the first rollout (CartPole-v1 gravity=15, Gymnasium;
HackAtari Freeway all_green_cars), CleanRL's defaults otherwise (8 envs x 128 steps, 4 epochs x 4 minibatches), so
EWC's penalty is paid in every update after the switch. Steady-state steps/s from the iteration timestamps and steps in
metrics.jsonl over the iterations after the switch iteration (IMPALA: 2 actors, one update per 4 unrolls of 20 steps) (which, with EWC, also estimates the Fisher: its extra
time is reported separately as "switch s", the switch iteration's duration minus the median steady iteration).
Rounds rotate the order of the runs of an agent; medians over rounds. Target: EWC >= 0.85x the agent without.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

GAMES = {
    "CartPole": {"env_id": "CartPole-v1", "backend": "Gymnasium", "modifications": ["", "gravity=15"]},
    "Freeway": {"env_id": "ALE/Freeway-v5", "backend": "HackAtari", "modifications": ["", "all_green_cars"]},
    "MinAtar": {"env_id": "MinAtar/Breakout", "backend": "MinAtar", "modifications": ["", "sticky_action_prob=0.2"]},
}
EWC = {"": [], "+ewc": ["--ewc", "ewc"], "+online": ["--ewc", "online"]}
AGENTS = {"PPO": ["--architecture", "PPO"],
          "IMPALA": ["--architecture", "IMPALA", "--num_actors", "2", "--max_grad_norm", "40"]}
ROLLOUT = 1024  # 8 envs x 128 steps: PPO's iteration, and the step of the switch


def timings(run_dir: str) -> tuple[float, float]:
    """(steady steps/s after the switch iteration, the switch iteration's extra seconds)."""
    its = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"iteration"' in line]
    # the switch (and, with EWC, the Fisher) happens in the first iteration that starts at or after ROLLOUT steps;
    # records carry the step count at their end (PPO: iteration 2; IMPALA, 320-step updates: the 5th)
    k = next(i for i in range(1, len(its)) if its[i - 1]["global_step"] >= ROLLOUT)
    durations = [b["time"] - a["time"] for a, b in zip(its[k - 1:], its[k:])]  # durations[0]: the switch iteration
    steady = durations[1:]
    sps = (its[-1]["global_step"] - its[k]["global_step"]) / sum(steady)
    return sps, durations[0] - common.median(steady)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
    p.add_argument("--agents", nargs="+", default=["PPO"], choices=list(AGENTS))
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ewc_samples", type=int, default=1024)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    info = common.machine_info()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for game in a.games:
            g = GAMES[game]
            cfg = os.path.join(tmp, f"{game}.json")
            with open(cfg, "w") as f:
                json.dump({"env_id": g["env_id"], "backend": g["backend"],
                           "modification_factory": "SequentialModificationFactory",
                           "modification_factory_kwargs": {"num_total_steps": a.iterations * ROLLOUT,
                                                           "modifications": g["modifications"],
                                                           "switching_thresholds": [ROLLOUT]}}, f)
            kinds = {f"{agent}{e}": AGENTS[agent] + EWC[e] for agent in a.agents for e in EWC}
            base = {k: k.split("+")[0] for k in kinds}
            sps: dict[str, list[float]] = {k: [] for k in kinds}
            switch_s: dict[str, list[float]] = {k: [] for k in kinds}
            for rnd in range(a.rounds):
                names = list(kinds)
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for kind in order:
                    name = f"{game}_{kind}_{rnd}".replace("+", "_")
                    subprocess.run([sys.executable, "continual_training_example.py", "--config", cfg,
                                    "--runs_dir", tmp, "--run_name", name, "--no-progress-bar",
                                    "--ewc_samples", str(a.ewc_samples), "--torch_threads", "1",
                                    "--checkpoint_minutes", "0", *kinds[kind]],
                                   cwd=common.REPO_ROOT, check=True, stdout=subprocess.DEVNULL,
                                   env={**os.environ, "WANDB_MODE": "disabled"})
                    rate, extra = timings(os.path.join(tmp, name))
                    sps[kind].append(rate)
                    switch_s[kind].append(extra)
                    print(f"{game} round {rnd + 1} {kind:10s} {rate:8.1f} steps/s, switch +{extra:.2f} s "
                          f"(load {common.loadavg()})", flush=True)
            med = {k: common.median(v) for k, v in sps.items()}
            common.print_table(f"EWC overhead on {game} (8 envs, --ewc_samples {a.ewc_samples}, 1 torch thread)",
                               ["run", "median steps/s", "runs", "ratio vs without", "switch s (median)"],
                               [[k, common.fmt(med[k]), len(sps[k]), f"{med[k] / med[base[k]]:.3f}",
                                 f"{common.median(switch_s[k]):.2f}"] for k in kinds])
            results[game] = {"sps": sps, "switch_s": switch_s, "median": med}
    print(f"machine: {info['cpu_model']}, {info['nproc']} cores, load at start {info['loadavg_start']}, "
          f"at end {common.loadavg()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
