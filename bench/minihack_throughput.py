"""Benchmark: steps/s of the MiniHack backend, the env alone and PPO training on it.

- env alone: one `continual.envs.backends.make_backend_env("MiniHack", ...)` env in this process, random actions,
  resets included, for each `--obs_modes` (pixel_crop: CORA's 84x84 RGB image; glyphs_crop: the one-hot glyph crop);
  MiniHack's own env with the raw observation key next to it (the cost of our preprocessing);
- PPO: `agents/ppo.py` subprocesses (`--num_envs` envs, 128 steps per env per rollout, 4 epochs x 4 minibatches,
  CPU), steady-state steps/s from metrics.jsonl between the end of iteration `--warmup` and the end of the last one
  (start-up and env creation excluded), once per obs mode and `--vector_env` kind.

Run from the repository root:  python bench/minihack_throughput.py [--env_id MiniHack-Room-Random-5x5-v0]
    [--env_steps 3000] [--iterations 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)


def env_alone(env_id: str, obs_mode: str, steps: int, raw: bool) -> float:
    import gymnasium as gym
    import numpy as np

    from continual.envs.backends import make_backend_env
    from continual.envs.minihack import CORA_KWARGS, import_minihack

    if raw:  # MiniHack's own env, its observation as it comes
        import_minihack()
        env = gym.make(env_id, observation_keys=(obs_mode,), **CORA_KWARGS)
        env.unwrapped.seed(1, 1, False)
        env.reset()
    else:
        env = make_backend_env("MiniHack", env_id, "", obs_mode=obs_mode)
        env.reset(seed=1)
    actions = np.random.default_rng(0).integers(0, env.action_space.n, steps)
    t0 = time.perf_counter()
    for a in actions:
        _, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            env.reset()
    sps = steps / (time.perf_counter() - t0)
    env.close()
    return sps


def ppo(env_id: str, obs_mode: str, vector_env: str, args: argparse.Namespace, tmp: str) -> dict:
    name = f"ppo_{obs_mode}_{vector_env}"
    total = args.iterations * args.num_envs * 128
    cmd = [sys.executable, os.path.join(common.REPO_ROOT, "agents", "ppo.py"), "--backend", "MiniHack", "--env_id",
           env_id, "--obs_mode", obs_mode, "--vector_env", vector_env, "--num_envs", str(args.num_envs),
           "--num_steps", "128", "--total_timesteps", str(total), "--runs_dir", tmp, "--run_name", name,
           "--no-progress-bar", "--checkpoint_minutes", "0", "--no-metrics", "--no-cuda", "--seed", "1"]
    wall = common.run(cmd)["wall_s"]
    s = common.steady(common.metrics(os.path.join(tmp, name), "iteration"), args.warmup)
    return {"obs_mode": obs_mode, "vector_env": vector_env, "steps": s["steps"], "seconds": s["seconds"],
            "sps": s["sps"], "wall_s": wall, **{k: s[f"{k}_s"] for k in ("env", "act", "learn")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env_id", default="MiniHack-Room-Random-5x5-v0")
    p.add_argument("--obs_modes", default="glyphs_crop,pixel_crop")
    p.add_argument("--vector_envs", default="sync,async")
    p.add_argument("--env_steps", type=int, default=3000)
    p.add_argument("--num_envs", type=int, default=8)
    p.add_argument("--iterations", type=int, default=5, help="PPO iterations of num_envs x 128 steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--skip_ppo", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    modes = args.obs_modes.split(",")
    out: dict = {"machine": common.machine_info(), "args": vars(args), "env": [], "ppo": []}
    for mode in modes:
        for raw in (False, True):
            sps = env_alone(args.env_id, mode, args.env_steps, raw)
            out["env"].append({"obs_mode": mode, "raw_minihack": raw, "sps": sps})
            print(f"env {'MiniHack raw' if raw else 'backend':12s} {mode:12s}: {sps:7.0f} steps/s "
                  f"load {common.loadavg()}", flush=True)
    if not args.skip_ppo:
        tmp = tempfile.mkdtemp(prefix="bench_minihack_")
        try:
            for mode in modes:
                for vector_env in args.vector_envs.split(","):
                    r = ppo(args.env_id, mode, vector_env, args, tmp)
                    out["ppo"].append(r)
                    print(f"PPO {mode:12s} {vector_env:5s}: {r['sps']:6.0f} steps/s ({r['steps']} steps in "
                          f"{r['seconds']:.1f} s; env {r['env']:.1f} s, act {r['act']:.1f} s, learn {r['learn']:.1f} s)"
                          f" load {common.loadavg()}", flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        common.write_json(args.json, out)


if __name__ == "__main__":
    main()
