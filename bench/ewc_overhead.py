"""EWC's overhead: training steps/s of PPO with --ewc ewc / online vs plain PPO, same run settings, round-robin.

    python bench/ewc_overhead.py [--games CartPole Freeway] [--iterations 6] [--rounds 2] [--json out.json]

Each game runs a 2-regime curriculum that switches after the first rollout (CartPole-v1 gravity=15, Gymnasium;
HackAtari Freeway all_green_cars), CleanRL's defaults otherwise (8 envs x 128 steps, 4 epochs x 4 minibatches), so
EWC's penalty is paid in every update after the switch. Steady-state steps/s from the iteration timestamps in
metrics.jsonl over the iterations after the switch iteration (which, with EWC, also estimates the Fisher: its extra
time is reported separately as "switch s", the switch iteration's duration minus the median steady iteration).
Rounds rotate the order of the three runs; medians over rounds. Target: EWC >= 0.85x PPO.
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
}
KINDS = {"PPO": [], "PPO+ewc": ["--ewc", "ewc"], "PPO+online": ["--ewc", "online"]}
ROLLOUT = 1024  # 8 envs x 128 steps


def timings(run_dir: str) -> tuple[float, float]:
    """(steady steps/s after the switch iteration, the switch iteration's extra seconds)."""
    its = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"iteration"' in line]
    durations = [b["time"] - a["time"] for a, b in zip(its, its[1:])]  # durations[k]: iteration k + 2
    steady = durations[1:]  # iterations 3.. (iteration 2 starts with the switch)
    sps = ROLLOUT * len(steady) / sum(steady)
    return sps, durations[0] - common.median(steady)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
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
            sps: dict[str, list[float]] = {k: [] for k in KINDS}
            switch_s: dict[str, list[float]] = {k: [] for k in KINDS}
            for rnd in range(a.rounds):
                kinds = list(KINDS)
                order = kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]
                for kind in order:
                    name = f"{game}_{kind}_{rnd}"
                    subprocess.run([sys.executable, "agents/ppo.py", "--config", cfg, "--runs_dir", tmp,
                                    "--run_name", name, "--no-progress-bar", "--ewc_samples", str(a.ewc_samples),
                                    "--checkpoint_minutes", "0", *KINDS[kind]],
                                   cwd=common.REPO_ROOT, check=True, stdout=subprocess.DEVNULL,
                                   env={**os.environ, "WANDB_MODE": "disabled"})
                    rate, extra = timings(os.path.join(tmp, name))
                    sps[kind].append(rate)
                    switch_s[kind].append(extra)
                    print(f"{game} round {rnd + 1} {kind:10s} {rate:8.1f} steps/s, switch +{extra:.2f} s "
                          f"(load {common.loadavg()})", flush=True)
            med = {k: common.median(v) for k, v in sps.items()}
            common.print_table(f"EWC overhead, PPO on {game} (8 envs x 128 steps, --ewc_samples {a.ewc_samples})",
                               ["run", "median steps/s", "runs", "ratio vs PPO", "switch s (median)"],
                               [[k, common.fmt(med[k]), len(sps[k]), f"{med[k] / med['PPO']:.3f}",
                                 f"{common.median(switch_s[k]):.2f}"] for k in KINDS])
            results[game] = {"sps": sps, "switch_s": switch_s, "median": med}
    print(f"machine: {info['cpu_model']}, {info['nproc']} cores, load at start {info['loadavg_start']}, "
          f"at end {common.loadavg()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
