"""Benchmark: does --bf16 (bfloat16 autocast of PPO's update) change learning? Same seeds, the default update vs
the variant (`--variant bf16`; its `compile` variant went with --compile in issue 31, its runs are in
bench/results/compile_learning*.json).

PPO on MinAtar Breakout (MinAtar's small CNN; --tasks CartPole adds the MLP case), each seed trained twice (float32,
then with the variant's flag) with everything else equal; the final return is the mean of the last 20 finished games
of each run. Runs one at a time in subprocesses (resumable: a run whose directory has a final checkpoint is read, not retrained).

Run from the repository root:  python bench/bf16_learning.py [--seeds 1,2] [--json ...]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)
import numpy as np  # noqa: E402

TASKS = {
    "CartPole": (["--backend", "Gymnasium", "--env_id", "CartPole-v1", "--num_envs", "4", "--num_steps", "128",
                  "--reward_scaling", "none"], 100_000),
    "Breakout": (["--backend", "MinAtar", "--env_id", "MinAtar/Breakout", "--num_envs", "8", "--num_steps", "128"],
                 300_000),
}


VARIANTS = {"fp32": [], "bf16": ["--bf16"]}


def run(task: str, seed: int, variant: str, out_dir: str) -> dict:
    flags, steps = TASKS[task]
    name = f"{task}__{variant}__s{seed}"
    run_dir = os.path.join(out_dir, name)
    t = time.time()
    if not glob.glob(os.path.join(run_dir, "checkpoints", "final__*")):
        shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run starts over
        common.run(common.train_command(["--architecture", "PPO", *flags, "--seed", str(seed), "--total_timesteps",
                                         str(steps), "--torch_threads", "1", "--checkpoint_minutes", "0",
                                         *VARIANTS[variant]], out_dir, name))
    records = common.metrics(run_dir)
    returns = [r["return"] for r in records if r["kind"] == "episode"]
    sps = [r["charts/SPS"] for r in records if r["kind"] == "iteration"]
    return {"task": task, "seed": seed, "variant": variant, "final_return": float(np.mean(returns[-20:])),
            "episodes": len(returns), "sps": sps[-1] if sps else None, "wall_s": time.time() - t}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--tasks", default="Breakout")
    p.add_argument("--variant", default="bf16", choices=["bf16"])
    p.add_argument("--out", default=os.path.join(common.REPO_ROOT, "bench", "out", "bf16_learning"))
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows = []
    for task in a.tasks.split(","):
        for seed in (int(s) for s in a.seeds.split(",")):
            for variant in ("fp32", a.variant):
                rows.append(run(task, seed, variant, a.out))
                print(json.dumps(rows[-1]), f"load {common.loadavg()}", flush=True)
    table = []
    for task in a.tasks.split(","):
        for variant in ("fp32", a.variant):
            r = [x["final_return"] for x in rows if x["task"] == task and x["variant"] == variant]
            table.append([task, variant, " ".join(f"{v:.1f}" for v in r), f"{np.mean(r):.1f}"])
    common.print_table(f"PPO final return (mean of the last 20 games), float32 vs --{a.variant}, same seeds",
                       ["task", "update", "per seed", "mean"], table)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": common.machine_info(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
