"""Benchmark: switching the game in place (a task sequence across games) against a modification switch and against
re-creating the vector env.

For each family (HackAtari: Pong <-> Breakout with the full 18-action space; MinAtar: Breakout <-> Seaquest), one
async vector env of `--num-envs` worker processes is built once; every round then times, interleaved:
  game switch          envs.switch("env=<other game>")   (each worker rebuilds its env stack in place, then resets)
  modification switch  envs.switch(<same game, other modification>)   (today's switch: hooks/parameters swapped)
  re-creation          envs.close() + make_vector_env(...) + reset(seed=...)   (new worker processes)
with `--steps-between` random steps before each switch. Worker pids are checked unchanged across in-place switches.
The vector env is built without `EnvSettings.games`, so the first switch to the other game after each (re-)creation
builds that game's stack in the workers ("first visit"); later game switches swap the kept stacks ("kept"). Training
runs set `games` and build every game's stack at the workers' start: all their game switches are "kept" ones.
Target (issue 14): a game switch <= 1 s and >= 10x faster than re-creation.

Run from the repository root:  python bench/game_switch.py [--rounds 5] [--json bench/results/game_switch.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

FAMILIES = {
    # backend, the two games, a modification of the first game (for the modification switch)
    "HackAtari": ("HackAtari", ("ALE/Pong-v5", "ALE/Breakout-v5"), "lazy_enemy"),
    "MinAtar": ("MinAtar", ("MinAtar/Breakout", "MinAtar/Seaquest"), "sticky_action_prob=0"),
}


def bench_family(name: str, args: argparse.Namespace) -> dict:
    import numpy as np

    from continual.envs.backends import task_compat
    from continual.envs.vector import EnvSettings, make_vector_env

    backend, games, modification = FAMILIES[name]
    settings = EnvSettings(env_id=games[0], backend=backend, compat=task_compat(backend, tuple(sorted(games))))
    rng = np.random.default_rng(args.seed)
    first = f"env={games[0]}"

    def build():
        e = make_vector_env(settings, args.num_envs, first, "async")
        e.reset(seed=args.seed)
        return e

    def steps(e) -> None:
        n = int(e.single_action_space.n)
        for _ in range(args.steps_between):
            e.step(rng.integers(0, n, size=args.num_envs))

    envs = build()  # the first build starts the forkserver: not timed
    first_ms, game_ms, mod_ms, create_ms = [], [], [], []
    try:
        pids = envs.worker_pids()
        step = 0
        for _ in range(args.rounds):
            for k, target in enumerate((f"env={games[1]}", first, f"env={games[1]}", first)):  # there and back
                steps(envs)
                step += 1
                t0 = time.perf_counter()
                envs.switch(target, step)
                (first_ms if k == 0 else game_ms).append(1e3 * (time.perf_counter() - t0))
            for target in (f"{first} {modification}", first):
                steps(envs)
                step += 1
                t0 = time.perf_counter()
                envs.switch(target, step)
                mod_ms.append(1e3 * (time.perf_counter() - t0))
            assert envs.worker_pids() == pids, "an in-place switch changed the worker processes"
            steps(envs)
            t0 = time.perf_counter()
            envs.close()
            envs = build()
            create_ms.append(1e3 * (time.perf_counter() - t0))
            pids = envs.worker_pids()
    finally:
        envs.close()
    out = {"games": list(games), "modification": modification, "num_envs": args.num_envs,
           "first_visit_game_switch_ms": first_ms, "game_switch_ms": game_ms, "modification_switch_ms": mod_ms,
           "recreate_ms": create_ms}
    keys = ("first_visit_game_switch_ms", "game_switch_ms", "modification_switch_ms", "recreate_ms")
    out["median_ms"] = {k: common.median(out[k]) for k in keys}
    out["recreate_over_game_switch"] = common.ratio(out["median_ms"]["recreate_ms"], out["median_ms"]["game_switch_ms"])
    out["recreate_over_first_visit"] = common.ratio(out["median_ms"]["recreate_ms"],
                                                    out["median_ms"]["first_visit_game_switch_ms"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps-between", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    info = common.machine_info()
    common.print_machine(info)
    results = {name: bench_family(name, args) for name in args.families}
    rows = []
    for name, r in results.items():
        m = r["median_ms"]
        rows.append([name, " <-> ".join(r["games"]), common.fmt(m["game_switch_ms"]),
                     common.fmt(max(r["game_switch_ms"])), common.fmt(m["first_visit_game_switch_ms"]),
                     common.fmt(m["modification_switch_ms"]), common.fmt(m["recreate_ms"]),
                     common.fmt(r["recreate_over_game_switch"]), common.fmt(r["recreate_over_first_visit"])])
    common.print_table(f"switch latency, {args.num_envs} async envs, median over {args.rounds} rounds (ms)",
                       ["family", "games", "game switch (kept)", "max", "game switch (first visit)",
                        "modification switch", "re-create", "re-create / kept", "re-create / first"], rows)
    print(f"load after: {common.loadavg()}")
    common.write_json(args.json, {"machine": info, "args": vars(args), "results": results})


if __name__ == "__main__":
    main()
