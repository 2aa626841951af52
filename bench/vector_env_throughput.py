"""Benchmark: env-alone throughput of the async vector env for pixel HackAtari (issue 51 item 2).

Random actions, no learner. Three kinds, built once, then measured round-robin (the order rotates every repeat),
`--seconds` each per repeat:
- `grouped`: ours (`continual.envs.grouped`, `--vector_env async`: the N envs over min(N, cores) workers, or
  `--envs-per-worker`);
- `gymnasium`: gymnasium's AsyncVectorEnv over the same env constructors (one process per env: the old default);
- `one_env`: one env stepped in this process; `min(N, cores) x` its steps/s is what N envs could reach.
Reported: medians over repeats of env steps/s, their ratios to min(N, cores) x one env (and the paired ratio of ours
to gymnasium's per repeat), env steps per CPU-second of the stepping thread and the workers (over one env's in-process, less
sensitive to a shared machine's load than wall time) and the main process's CPU per env step; the load average and
the other processes' CPU use (cores) during each kind's measurements.

Run from the repository root:
  python bench/vector_env_throughput.py --num-envs 8 --seconds 10 --repeats 5 [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

KINDS = ("grouped", "gymnasium", "one_env")


def tree_cpu(pids: list[int]) -> tuple[float, float]:
    """(this thread's CPU seconds, the workers' CPU seconds). The thread, not the process: the load sampler's thread
    scans /proc."""
    hz = os.sysconf("SC_CLK_TCK")
    return time.thread_time(), sum((common._proc_ticks(p) or 0.0) for p in pids) / hz


def measure(step, pids: list[int], seconds: float, num_envs: int) -> dict:
    """Steps `step()` (num_envs env steps each) for `seconds` of wall time."""
    main0, workers0 = tree_cpu(pids)
    load0 = common.loadavg()
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        step()
        calls += 1
    wall = time.perf_counter() - t0
    main1, workers1 = tree_cpu(pids)
    steps = calls * num_envs
    cpu = (main1 - main0) + (workers1 - workers0)
    return {"steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu if cpu > 0 else float("nan"),
            "main_cpu_us_per_step": 1e6 * (main1 - main0) / steps, "load": [load0, common.loadavg()],
            "t0": time.time() - wall, "t1": time.time()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--envs-per-worker", type=int, default=0, help="ours: 0 = spread over the cores")
    p.add_argument("--seconds", type=float, default=10.0, help="per kind and repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--env-id", default="ALE/Freeway-v5")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import gymnasium as gym
    import numpy as np
    from gymnasium.vector import AutoresetMode

    from continual.envs.grouped import GroupedVectorEnv, worker_blocks
    from continual.envs.vector import EnvSettings, make_env

    info = common.machine_info()
    n = args.num_envs
    workers = len(worker_blocks(n, args.envs_per_worker))
    cores = min(n, info["nproc"])
    settings = EnvSettings(env_id=args.env_id, backend="HackAtari")  # pixels: 4x84x84 grey frames
    fns = [make_env(settings, i, "") for i in range(n)]
    ctx = settings.worker_context().get_start_method()
    rng = np.random.default_rng(0)
    vecs = {"grouped": GroupedVectorEnv(fns, ctx, args.envs_per_worker),
            "gymnasium": gym.vector.AsyncVectorEnv(fns, context=ctx, autoreset_mode=AutoresetMode.SAME_STEP)}
    one = make_env(settings, 0, "")()
    one.reset(seed=0)
    steps = {}
    for name, vec in vecs.items():
        vec.reset(seed=0)
        space = vec.action_space
        steps[name] = (lambda vec=vec, space=space: vec.step(rng.integers(0, space.nvec)))

    def one_step():
        _, _, terminated, truncated, _ = one.step(int(rng.integers(0, one.action_space.n)))
        if terminated or truncated:
            one.reset()

    steps["one_env"] = one_step
    pids = {"grouped": [q.pid for q in vecs["grouped"].processes],
            "gymnasium": [q.pid for q in vecs["gymnasium"].processes], "one_env": []}
    sizes = {"grouped": n, "gymnasium": n, "one_env": 1}
    results: dict = {k: [] for k in KINDS}
    print(f"{args.env_id} pixels, {n} envs (ours: {workers} workers), {info['nproc']} cores, load "
          f"{info['loadavg_start']}; {args.repeats} x {args.seconds:g} s per kind", flush=True)
    try:
        with common.LoadSampler() as sampler:
            for r in range(args.repeats):
                for kind in common.rotation(KINDS, r):
                    for _ in range(20):  # warm up (caches, the workers' first steps)
                        steps[kind]()
                    m = measure(steps[kind], pids[kind], args.seconds, sizes[kind])
                    m["foreign_cores"] = sampler.summary(m["t0"], m["t1"])["foreign_cores"]
                    results[kind].append(m)
                    print(f"  repeat {r} {kind:9s} {m['steps_per_s']:8.0f} steps/s  {m['steps_per_cpu_s']:7.0f} "
                          f"steps/CPU-s  main {m['main_cpu_us_per_step']:6.1f} us/step  load {m['load'][1]}  "
                          f"other processes {m['foreign_cores']:.2f} cores", flush=True)
    finally:
        for vec in vecs.values():
            vec.close()
        one.close()
    info["loadavg_end"] = common.loadavg()

    med = {k: {key: common.median([m[key] for m in results[k]])
               for key in ("steps_per_s", "steps_per_cpu_s", "main_cpu_us_per_step", "foreign_cores")}
           for k in KINDS}
    ideal = cores * med["one_env"]["steps_per_s"]
    paired = common.median([g["steps_per_s"] / a["steps_per_s"] for g, a in zip(results["grouped"],
                                                                                   results["gymnasium"])])
    rows = []
    for k in KINDS:
        rows.append([k, common.fmt(med[k]["steps_per_s"], 0),
                     common.fmt(common.ratio(med[k]["steps_per_s"], ideal), 2) if k != "one_env" else "-",
                     common.fmt(med[k]["steps_per_cpu_s"], 0),
                     common.fmt(common.ratio(med[k]["steps_per_cpu_s"], med["one_env"]["steps_per_cpu_s"]), 2),
                     common.fmt(med[k]["main_cpu_us_per_step"], 1), common.fmt(med[k]["foreign_cores"], 2)])
    common.print_table(f"medians of {args.repeats} round-robin repeats; min(N, cores) x one env = {ideal:,.0f} "
                       f"steps/s; ours / gymnasium {common.ratio(med['grouped']['steps_per_s'], med['gymnasium']['steps_per_s']):.2f} "
                       f"(paired {paired:.2f})",
                       ["kind", "steps/s", "/ min(N,cores) x one env", "steps/CPU-s", "/ one env's", "main CPU us/step",
                        "other processes (cores)"], rows)
    common.print_machine(info)
    common.write_json(args.json, {"args": vars(args), "machine": info, "workers": workers, "medians": med,
                                  "ideal_steps_per_s": ideal, "paired_grouped_over_gymnasium": paired,
                                  "runs": results})


if __name__ == "__main__":
    main()
