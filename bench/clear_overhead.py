"""Benchmark: CLEAR's cost over IMPALA (issue 15): training steps/s, and the size of the default replay buffer.

1. Throughput: `continual_training_example.py --architecture IMPALA` and `--architecture CLEAR` with the same flags
   (configs/impala_cartpole.json without its curriculum, or `--env` minatar: MinAtar/Breakout), each run a fresh
   subprocess, the two kinds round-robin with the order rotated every repeat. Steady steps/s = env steps consumed
   between the first iteration at or after `--warmup-steps` and the last / the time between them; also the median
   learner time per update (`time/learn_s`: CLEAR's learner works on twice the columns at the default mix).
2. Size: the default buffer (--clear_buffer_frames 100000, unroll 20) for Atari frames, MinAtar and CartPole, from
   `continual.training.startup.replay_buffer_bytes` (the preflight's estimate, equal to the buffer's size);
   with `--checkpoint-cost`, a real Atari-sized buffer (4x84x84 uint8 frames, 18 actions) is filled with random
   data and written to / read from a checkpoint file: its size, write and read times, the peak RSS while reading.

Run from the repository root:  python bench/clear_overhead.py [--repeats 3] [--steps 20000] [--checkpoint-cost]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

KINDS = ("IMPALA", "CLEAR")
ENVS = {"cartpole": ["--config", "configs/impala_cartpole.json"],
        "minatar": ["--backend", "MinAtar", "--env_id", "MinAtar/Breakout", "--num_envs", "8", "--num_actors", "2",
                    "--unroll_length", "20", "--batch_size", "4", "--learning_rate", "6e-4", "--max_grad_norm", "40"]}


def run_one(kind: str, env: str, steps: int, tmp: str, name: str) -> dict:
    argv = [sys.executable, "continual_training_example.py", *ENVS[env], "--architecture", kind,
            "--total_timesteps", str(steps), "--runs_dir", tmp, "--run_name", name, "--no-progress-bar",
            "--checkpoint_minutes", "0", "--modifs", ""]
    if env == "cartpole":  # its curriculum would outlast a short run; the unmodified game
        cfg = json.load(open(os.path.join(common.REPO_ROOT, "configs", "impala_cartpole.json")))
        cfg = {k: v for k, v in cfg.items() if not k.startswith("modification_factory") and not k.startswith("_")}
        path = os.path.join(tmp, name + ".json")
        json.dump(cfg, open(path, "w"))
        argv[2:4] = ["--config", path]
    t0 = time.time()
    subprocess.run(argv, cwd=common.REPO_ROOT, check=True, capture_output=True, text=True,
                   env={**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"})
    its = []
    with open(os.path.join(tmp, name, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "iteration":
                its.append(rec)
    return {"wall_s": time.time() - t0, "iterations": its}


def steady(run: dict, warmup: int) -> dict:
    its = run["iterations"]
    w = min(next((i for i, it in enumerate(its) if it["global_step"] >= warmup), 0), len(its) - 2)
    wall = its[-1]["time"] - its[w]["time"]
    return {"sps": (its[-1]["global_step"] - its[w]["global_step"]) / wall,
            "learn_s": common.median([it["time/learn_s"] for it in its[w + 1:]]), "wall_s": run["wall_s"]}


def sizes() -> list[list[str]]:
    from continual.config.args import Args
    from continual.training.startup import replay_buffer_bytes

    rows = []
    for label, kw in (("HackAtari Freeway (4x84x84 uint8, <=18 actions)", dict(env_id="ALE/Freeway-v5")),
                      ("MinAtar Breakout (4x10x10 float32)", dict(backend="MinAtar", env_id="MinAtar/Breakout")),
                      ("CartPole (4 float32)", dict(backend="Gymnasium", env_id="CartPole-v1"))):
        args = Args(architecture="CLEAR", **kw)
        b = replay_buffer_bytes(args, [""])
        rows.append([label, f"{args.clear_buffer_frames:,}", f"{args.clear_buffer_frames // args.unroll_length:,}",
                     f"{b / 1e9:.3f} GB"])
    return rows


def checkpoint_cost(folder: str) -> dict:
    """A filled default Atari buffer through save_checkpoint / load_checkpoint."""
    import numpy as np
    import torch

    from agents.clear import ReservoirReplay
    from continual.training.checkpoint import load_checkpoint, save_checkpoint

    buf = ReservoirReplay(os.path.join(folder, "replay"), 5000, 20, (4, 84, 84), np.uint8, 18, seed=0)
    rng = np.random.default_rng(0)
    t = time.time()
    for start in range(0, 5000, 100):  # random frames (incompressible), written in chunks
        buf.data["obs"][start:start + 100] = rng.integers(0, 256, size=(100, 21, 4, 84, 84), dtype=np.uint8)
    buf.seen = 5000
    fill_s = time.time() - t
    path = os.path.join(folder, "checkpoints", "x.cleanrl_model")
    t = time.time()
    save_checkpoint(path, {"architecture": "CLEAR", "args": {}, "model": {}, "global_step": 0,
                           "clear": buf.state_dict()})
    write_s = time.time() - t
    size = os.path.getsize(path)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.time()
    state = load_checkpoint(path)
    read_s = time.time() - t
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert torch.equal(state["clear"]["data"]["obs"][-1], torch.from_numpy(np.asarray(buf.data["obs"][-1])))
    return {"buffer_bytes": buf.nbytes(), "checkpoint_bytes": size, "fill_s": fill_s, "write_s": write_s,
            "read_s": read_s, "peak_rss_growth_gb_on_read": (rss1 - rss0) / 1e6}


def extension_cost(folder: str, updates: int = 60) -> dict:
    """In-process: the CLEAR learner extension alone per update (sample + copy R replayed unrolls into the batch,
    then insert the B new ones), for a CartPole-sized and an Atari-sized default buffer (2 actors x 4 envs, batch 4:
    16 new + 16 replayed single-env unrolls), median ms with the buffer half full."""
    import types

    import gymnasium as gym
    import numpy as np
    import torch

    from agents.clear import Clear
    from continual.config.args import Args

    out = {}
    for label, shape, dtype in (("cartpole", (4,), np.float32), ("atari", (4, 84, 84), np.uint8)):
        args = Args(architecture="CLEAR", num_envs=8, num_actors=2, batch_size=4, unroll_length=20)
        session = types.SimpleNamespace(run_dir=os.path.join(folder, label), modification="", regime_index=lambda m: 0)
        space = gym.spaces.Box(0, 255, shape, dtype)
        ext = Clear(args, session, space, 18, torch.device("cpu"))
        rng = np.random.default_rng(0)
        S, T, n = 4, 20, 4
        batch = {"obs": torch.as_tensor(rng.integers(0, 255, size=(S, T + 1, n, *shape)).astype(dtype)),
                 "action": torch.zeros((S, T, n), dtype=torch.int64), "logits": torch.zeros((S, T, n, 18)),
                 "reward": torch.zeros((S, T, n)), "done": torch.zeros((S, T, n), dtype=torch.bool),
                 "value": torch.zeros((S, T, n)), "regime": torch.zeros(S, dtype=torch.int64)}

        def tm(x):
            return x.transpose(0, 1).reshape(x.shape[1], S * n, *x.shape[3:])
        new = [tm(batch[k]) for k in ("obs", "action", "logits", "reward", "done")]
        ext.buffer.seen = ext.buffer.capacity // 2  # sampling reaches across a half-full map, as later in a run
        times = []
        for _ in range(updates):
            t = time.perf_counter()
            ext.extend_batch(batch, *new)
            ext.commit()
            times.append(time.perf_counter() - t)
        out[label] = {"median_ms": common.median(times) * 1e3, "max_ms": max(times) * 1e3}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=list(ENVS), default="cartpole")
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--warmup-steps", type=int, default=4000)
    p.add_argument("--repeats", type=int, default=3, help="round-robin repeats (0: only the sizes and costs)")
    p.add_argument("--checkpoint-cost", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    info = common.machine_info()
    tmp = tempfile.mkdtemp(prefix="clear_bench_")
    res: dict = {"machine": info, "runs": {k: [] for k in KINDS}}
    try:
        for rep in range(args.repeats):
            for kind in (KINDS if rep % 2 == 0 else KINDS[::-1]):
                run = run_one(kind, args.env, args.steps, tmp, f"{kind}_{rep}")
                a = steady(run, args.warmup_steps)
                res["runs"][kind].append(a)
                print(f"  repeat {rep + 1}/{args.repeats} {kind:<6} {a['sps']:8.1f} steps/s, learn "
                      f"{a['learn_s'] * 1e3:.1f} ms/update (run {a['wall_s']:.0f} s, load {common.loadavg()})",
                      flush=True)
        res["extension_cost"] = extension_cost(tmp)
        print("CLEAR extension per update:", json.dumps(res["extension_cost"]), flush=True)
        if args.checkpoint_cost:
            res["checkpoint_cost"] = checkpoint_cost(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["loadavg_end"] = common.loadavg()
    if args.repeats:
        med = {k: common.median([r["sps"] for r in v]) for k, v in res["runs"].items()}
        res["median_sps"] = med
        res["clear_vs_impala"] = med["CLEAR"] / med["IMPALA"]
        rows = [[k, len(v), f"{med[k]:.0f}", " ".join(f"{r['sps']:.0f}" for r in v),
                 f"{common.median([r['learn_s'] for r in v]) * 1e3:.1f}"] for k, v in res["runs"].items()]
        common.print_table(f"{args.env}: steady steps/s ({args.steps} steps per run, warm-up {args.warmup_steps})",
                           ["agent", "n", "median steps/s", "runs", "learn ms/update"], rows)
        print(f"CLEAR / IMPALA: {res['clear_vs_impala']:.2f}")
    res["sizes"] = sizes()
    common.print_table("default replay buffer (--clear_buffer_frames 100000, --unroll_length 20)",
                       ["observations", "frames", "unrolls", "bytes on disk (and per checkpoint)"], res["sizes"])
    if "checkpoint_cost" in res:
        print(json.dumps(res["checkpoint_cost"], indent=1))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
