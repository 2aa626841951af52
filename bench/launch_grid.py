"""Wall time of a 2 seeds x 2 methods CartPole grid through `python -m continual.launch` (local Ray, runs in
parallel) against the same four runs one after another with the training CLI.

    python bench/launch_grid.py [--total_timesteps 2048] [--num_cpus 2] [--out DIR]

Prints both wall times and /proc/loadavg before and after each (a shared machine: report the load with them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Optional

import tyro

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)


@dataclasses.dataclass
class BenchArgs:
    total_timesteps: int = 2048
    """steps per run"""
    num_cpus: int = 2
    """CPUs of the launcher's local Ray instance (runs at once)"""
    out: Optional[str] = None
    """folder for the runs (default: a temporary folder)"""


def main() -> None:
    args = tyro.cli(BenchArgs)
    out = args.out or tempfile.mkdtemp(prefix="launch-grid-")
    os.makedirs(out, exist_ok=True)
    env = {"PYTHONPATH": common.REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "WANDB_MODE": "offline"}
    flags = {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64,
             "total_timesteps": args.total_timesteps}
    grid = {"architecture": ["PPO", "PPO_CBP"], "seed": [1, 2]}
    exp = os.path.join(out, "grid.json")
    with open(exp, "w") as f:
        json.dump({"flags": flags, "grid": grid}, f)
    rows = []
    r = common.run([sys.executable, "-m", "continual.launch", exp, "--folder", os.path.join(out, "launched"),
                    "--num_cpus", str(args.num_cpus)], env=env)
    rows.append(("launcher (local Ray)", r["wall_s"], r["loadavg_start"], r["loadavg_end"]))
    before = common.loadavg()
    t0 = time.perf_counter()
    for arch in grid["architecture"]:
        for seed in grid["seed"]:
            argv = [a for k, v in {**flags, "architecture": arch, "seed": seed}.items() for a in (f"--{k}", str(v))]
            common.run(common.train_command(argv, os.path.join(out, "serial"), f"{arch}_{seed}"), env=env)
    rows.append(("one after another", time.perf_counter() - t0, before, common.loadavg()))
    print(f"2x2 CartPole grid, {args.total_timesteps} steps per run, {os.cpu_count()} cores; runs in {out}")
    print(f"{'how':<24}{'wall s':>10}   loadavg before -> after")
    for name, secs, b, a in rows:
        print(f"{name:<24}{secs:>10.1f}   {b} -> {a}")


if __name__ == "__main__":
    main()
