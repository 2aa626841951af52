"""Diagnostic (run, committed, then removed): aggregate training steps/s of pixel HackAtari Freeway PPO (issue 46's
pilot flags: CleanRL's Atari PPO, `--num-envs` envs x 128 steps) on this machine's cores, 1 run with torch's default threads
against 2 runs at once (1 torch thread each, or torch's default each), OMP_WAIT_POLICY=PASSIVE as the launcher sets.
Steady state per run from its metrics.jsonl (the iterations after `warmup`); a kind's aggregate = the sum of its runs'
rates (they start together and run the same length). Kinds round-robin, the order rotating every repeat.

    python bench/pixel_runs_at_once.py --iterations 30 --warmup 5 --repeats 3 --json bench/results/pixel_runs_at_once.json
    python bench/pixel_runs_at_once.py --num-envs 1 --iterations 120 --warmup 20 --repeats 3 \
        --json bench/results/pixel_runs_at_once_1env.json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import small_env_throughput  # noqa: E402

KINDS = {"one_run": (1, []), "two_runs_1_thread": (2, ["--torch_threads", "1"]), "two_runs_default_threads": (2, [])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-envs", type=int, default=8, help="envs per run (1: the seed's setting)")
    ap.add_argument("--json")
    a = ap.parse_args()
    flags = small_env_throughput.pilot_flags() + ["--num_envs", str(a.num_envs)]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}

    def rate(d: str) -> float:
        it = [json.loads(x) for x in open(glob.glob(f"{d}/*/metrics.jsonl")[0]) if '"time/learn_s"' in x]
        first, last = it[a.warmup - 1], it[-1]
        return (last["global_step"] - first["global_step"]) / (last["time"] - first["time"])

    rows = []
    names = list(KINDS)
    for rep in range(a.repeats):
        for name in common.rotation(names, rep):
            n, extra = KINDS[name]
            dirs = [tempfile.mkdtemp(prefix="runs_at_once") for _ in range(n)]
            load0 = os.getloadavg()
            procs = [subprocess.Popen([sys.executable, "continual_training_example.py", *flags, "--total_timesteps",
                                       str(a.iterations * 128 * a.num_envs), "--runs_dir", d, *extra], cwd=common.REPO_ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env) for d in dirs]
            for p in procs:
                p.wait()
            rates = [rate(d) for d in dirs]
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            row = {"repeat": rep, "kind": name, "steps_per_s": sum(rates), "each": rates,
                   "load_before": load0, "load_after": os.getloadavg(), "time": time.time()}
            rows.append(row)
            print(rep, name, round(sum(rates)), [round(r) for r in rates], "load", [round(x, 2) for x in load0], flush=True)
    med = {k: statistics.median(r["steps_per_s"] for r in rows if r["kind"] == k) for k in KINDS}
    paired = {k: statistics.median(x["steps_per_s"] / y["steps_per_s"] for x in rows for y in rows
                                   if x["kind"] == k and y["kind"] == "one_run" and x["repeat"] == y["repeat"])
              for k in KINDS if k != "one_run"}
    print("medians", {k: round(v) for k, v in med.items()}, "paired over one run", {k: round(v, 3) for k, v in paired.items()})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "machine": common.machine_info(), "medians": med,
                       "paired_over_one_run": paired, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
