"""Benchmark: DQN and A2C training throughput on HackAtari Freeway next to PPO's (short runs).

Each run is a fresh subprocess of `agents/<x>.py` with the same env stack (HackAtari Freeway, dqn observations,
`--num_envs` async envs, clipped rewards); the kinds run round-robin (the order rotates every repeat). Steady-state
steps/s = steps after the first `--warmup` iterations / time between the end of iteration `--warmup` and the end of
the last one (startup and env creation excluded), from metrics.jsonl.

- PPO: CleanRL ppo_atari (128 steps per env per rollout, 4 epochs x 4 minibatches);
- DQN: CleanRL dqn_atari's update (batch 32, one gradient step per `--train_frequency` agent steps, target copy every
  1000 steps), learning from the first iteration on (`--learning_starts 0`) so every iteration pays for its updates;
  128 vector steps per iteration;
- A2C: 5-step rollouts, one RMSprop step each (`--num_steps 5`; the curriculum is asked every 5 x num_envs steps).

Run from the repository root:  python bench/dqn_a2c_throughput.py [--iterations 6] [--repeats 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

KINDS = {
    "PPO": ["agents/ppo.py", "--num_steps", "128"],
    "DQN": ["agents/dqn.py", "--num_steps", "128", "--learning_starts", "0", "--buffer_size", "100000",
            "--learning_rate", "1e-4", "--no-anneal-lr"],
    "A2C": ["agents/a2c.py", "--num_steps", "5", "--learning_rate", "7e-4", "--rmsprop_eps", "1e-5",
            "--gae_lambda", "1.0", "--no-norm-adv"],
}


def run_one(kind: str, args: argparse.Namespace, tmp: str, name: str) -> dict:
    script, *flags = KINDS[kind]
    steps_per_iteration = args.num_envs * int(flags[flags.index("--num_steps") + 1])
    iterations = args.iterations if kind != "A2C" else args.iterations * 128 // 5  # about the same steps
    total = iterations * steps_per_iteration
    cmd = [sys.executable, os.path.join(common.REPO_ROOT, script), "--env_id", args.env_id, "--backend", "HackAtari",
           "--num_envs", str(args.num_envs), "--total_timesteps", str(total), "--runs_dir", tmp, "--run_name", name,
           "--no-progress-bar", "--checkpoint_minutes", "0", "--no-metrics", "--seed", "1", "--modifs", "",
           *flags, *(["--train_frequency", str(args.train_frequency)] if kind == "DQN" else [])]
    if args.torch_threads:
        cmd += ["--torch_threads", str(args.torch_threads)]
    wall = common.run(cmd)["wall_s"]
    s = common.steady(common.metrics(os.path.join(tmp, name), "iteration"),
                      max(1, args.warmup if kind != "A2C" else args.warmup * 128 // 5))
    return {"kind": kind, "steps": s["steps"], "seconds": s["seconds"], "sps": s["sps"], "wall_s": wall,
            **{k: s[f"{k}_s"] for k in ("env", "act", "learn")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env_id", default="ALE/Freeway-v5")
    p.add_argument("--num_envs", type=int, default=8)
    p.add_argument("--iterations", type=int, default=6, help="PPO/DQN iterations of num_envs x 128 steps")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--train_frequency", type=int, default=4)
    p.add_argument("--torch_threads", type=int, default=None)
    p.add_argument("--kinds", default="PPO,DQN,A2C")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    kinds = args.kinds.split(",")
    tmp = tempfile.mkdtemp(prefix="bench_dqn_a2c_")
    results = []
    try:
        for rep in range(args.repeats):
            for kind in common.rotation(kinds, rep):
                results.append(run_one(kind, args, tmp, f"{kind}_{rep}"))
                r = results[-1]
                print(f"{kind:4s} repeat {rep}: {r['sps']:.0f} steps/s ({r['steps']} steps in {r['seconds']:.1f} s; "
                      f"env {r['env']:.1f} s, act {r['act']:.1f} s, learn {r['learn']:.1f} s) load {common.loadavg()}",
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"machine": common.machine_info(), "args": vars(args), "results": results}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
