"""Does PPO on pixel Freeway find the road sooner and more surely with 1 env than with 8? A diagnostic for issue 46.

The robustness experiment (8 envs x 128 steps) has runs that never score in 1.5M steps: before any reward the policy
walks on normalised-advantage noise (bench/results/zero_reward_drift.json), and only a walk towards UP finds the road.
The seed project ran 1 env x 128 steps (8x the updates per agent step) and all its runs learned. Here each run trains
the experiment's unmodified arm (its config: CleanRL's Atari PPO, lr 2.5e-4 annealed over 1,515,520 steps) with
`--num_envs 1` or `8` (with OMP_WAIT_POLICY=PASSIVE, as the launcher's runs) and is stopped at its first scoring game (a whole game with a positive score) or at the cap,
whichever comes first; per run: the agent step of that game (None: none by the cap), the PPO updates made by then,
the policy's entropy there, and the wall time.

    python bench/first_score_envs.py --runs-dir DIR --json bench/results/first_score_envs.json
    python bench/first_score_envs.py --runs-dir DIR --summary-only --seeds ...   # the records already in DIR

A run whose record is in DIR is read again, not retrained; one cut short is trained again from its start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import common

FLAGS = ["--architecture", "PPO", "--env_id", "ALE/Freeway-v5", "--backend", "HackAtari", "--obs_mode", "dqn",
         "--num_steps", "128", "--total_timesteps", "1515520", "--eval_final_only", "--checkpoint_every", "0"]


def stop_at_first_score(run_dir: str, cap: int):
    """A `common.run` watch: polls the run's metrics and ends it at its first scoring game or at the cap."""
    def watch(proc) -> dict:
        path = os.path.join(run_dir, "metrics.jsonl")
        while proc.poll() is None:
            time.sleep(5)
            if not os.path.exists(path):
                continue
            its, games = common.metrics(run_dir, "iteration"), common.metrics(run_dir, "episode")
            scored = next((g for g in games if g["return"] > 0), None)
            if scored is not None or (its and its[-1]["global_step"] >= cap):
                proc.terminate()
                proc.wait()
                break
        return {}
    return watch


def summarize(run_dir: str, cap: int) -> dict:
    its, games = common.metrics(run_dir, "iteration"), common.metrics(run_dir, "episode")
    scored = next((g for g in games if g["return"] > 0), None)
    at = scored["global_step"] if scored else cap
    before = [r for r in its if r["global_step"] <= at] or its[:1]
    return {"first_score": scored["global_step"] if scored else None, "updates_before": before[-1]["iteration"],
            "entropy_then": before[-1]["losses/entropy"], "min_entropy_before": min(r["losses/entropy"] for r in before),
            "steps_run": its[-1]["global_step"], "games": len(games)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs-dir", required=True, help="where the runs are made (and their records found again)")
    p.add_argument("--json", help="write the per-run records and the machine here")
    p.add_argument("--seeds", type=int, nargs="*", default=[101, 102, 103, 104, 105, 106])
    p.add_argument("--envs", type=int, nargs="*", default=[1, 8])
    p.add_argument("--cap", type=int, default=204800, help="agent steps after which a run that has not scored stops")
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--summary-only", action="store_true", help="train nothing; read the records already in --runs-dir")
    a = p.parse_args()
    info = common.machine_info()
    os.makedirs(a.runs_dir, exist_ok=True)
    records = []
    for seed in a.seeds:
        for envs in a.envs:  # round-robin: both arms see the same stretch of the machine's load
            name = f"envs{envs}_s{seed}"
            run_dir, record = os.path.join(a.runs_dir, name), os.path.join(a.runs_dir, f"{name}.json")
            if not os.path.exists(record) and a.summary_only:
                continue
            if not os.path.exists(record):
                print(f"{name}: training until its first score or {a.cap:,} steps", flush=True)
                if os.path.isdir(run_dir):
                    os.rename(run_dir, f"{run_dir}.cut{int(time.time())}")
                r = common.run(common.train_command([*FLAGS, "--num_envs", str(envs), "--seed", str(seed)],
                                                    a.runs_dir, name), nice=a.nice, check=False, env={"OMP_WAIT_POLICY": "PASSIVE"},
                               log=os.path.join(a.runs_dir, f"{name}.log"), watch=stop_at_first_score(run_dir, a.cap))
                out = {"envs": envs, "seed": seed, "run": name, "wall_s": r["wall_s"]} | summarize(run_dir, a.cap)
                with open(record, "w", encoding="utf-8") as f:
                    json.dump(out, f)
            with open(record, encoding="utf-8") as f:
                records.append(json.load(f))
            print(f"  {records[-1]}", flush=True)
    info["loadavg_end"] = common.loadavg()
    common.print_table(f"Pixel Freeway PPO, first scoring game (cap {a.cap:,} steps)", [
        "run", "first scoring game", "PPO updates by then", "entropy then", "lowest entropy before", "wall s"],
        [[r["run"], "none" if r["first_score"] is None else f"{r['first_score']:,}", r["updates_before"],
          f"{r['entropy_then']:.3f}", f"{r['min_entropy_before']:.3f}", f"{r['wall_s']:.0f}"] for r in records])
    common.write_json(a.json, {"machine": info, "flags": FLAGS, "cap": a.cap, "runs": records})


if __name__ == "__main__":
    sys.exit(main())
