"""Benchmark: in-place modification switches and env throughput of the continual vector env.

(a) Switch latency: `envs.switch(m)` (swap hooks in every worker + reset all envs) against re-creating the vector env
    (close + make_vector_env + reset(seed=...)), interleaved: every round does `--switches-per-round` in-place
    switches, then one re-creation. Checks that in-place switches create/leak no process (worker pids and the set of
    live descendant processes unchanged) and that a re-creation's old workers are gone after close.
(b) Throughput (env-steps/s, random actions): our HackAtari vector env (no modification and with an active one)
    against a plain gymnasium ALE AsyncVectorEnv with the same preprocessing and env count (and, unless
    --no-gym-backend, our Gymnasium backend). All vector envs are built once, then measured round-robin
    (the order rotates every round), `--rounds` x `--steps` env steps each.

Run from the repository root:  python bench/env_switch.py [--json bench/out/env_switch.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

SWITCH_MODS = ("all_green_cars", "disable_cars all_red_cars")


def make_plain_env(env_id: str, repeat_action_probability: float, noop_max: int, frame_skip: int, stack: int):
    """One plain gymnasium ALE env with the CleanRL-style preprocessing (module level: picklable for forkserver)."""
    import ale_py
    import gymnasium as gym

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner per worker (as our backend does)
    gym.register_envs(ale_py)
    env = gym.make(env_id, frameskip=1, repeat_action_probability=repeat_action_probability)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=84,
                                          terminal_on_life_loss=False, grayscale_obs=True)
    env = gym.wrappers.FrameStackObservation(env, stack)
    return gym.wrappers.RecordEpisodeStatistics(env)


def make_plain_vector_env(args: argparse.Namespace):
    import functools

    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    fn = functools.partial(make_plain_env, args.env_id, 0.25, 30, 4, 4)
    mode = AutoresetMode.SAME_STEP if args.plain_autoreset == "same_step" else AutoresetMode.NEXT_STEP
    return gym.vector.AsyncVectorEnv([fn] * args.num_envs, context="forkserver", autoreset_mode=mode)


# --------------------------------------------------------------------------------------------------------------------
# (a) switch latency
# --------------------------------------------------------------------------------------------------------------------


def bench_switch(args: argparse.Namespace) -> dict:
    import numpy as np

    from continual.envs.vector import EnvSettings, make_vector_env
    from continual.modstrings import normalize_modification

    settings = EnvSettings(env_id=args.env_id, backend="HackAtari")
    rng = np.random.default_rng(args.seed)
    me = os.getpid()

    t0 = time.perf_counter()
    envs = make_vector_env(settings, args.num_envs, SWITCH_MODS[0])
    envs.reset(seed=args.seed)
    first_create_s = time.perf_counter() - t0  # includes starting the forkserver (not counted below)
    n_actions = int(envs.single_action_space.n)

    def run_steps(e, n: int) -> None:
        for _ in range(n):
            e.step(rng.integers(0, n_actions, size=args.num_envs))

    run_steps(envs, args.steps_between)
    switch_ms: list[float] = []
    recreate_ms: list[dict] = []
    checks = {"switch_pids_unchanged": True, "switch_no_new_processes": True, "switch_modification_applied": True,
              "recreate_old_workers_gone": True, "recreate_process_count_stable": True, "recreate_new_pids": True}
    problems: list[str] = []
    baseline_procs = len(common.descendants(me))
    k = 0
    for rnd in range(args.rounds):
        # --- in-place switches ---
        for _ in range(args.switches_per_round):
            k += 1
            mod = SWITCH_MODS[k % 2]
            pids, procs = envs.worker_pids(), common.descendants(me)
            t = time.perf_counter()
            obs, _ = envs.switch(mod, step=k)
            switch_ms.append((time.perf_counter() - t) * 1e3)
            if envs.worker_pids() != pids:
                checks["switch_pids_unchanged"] = False
                problems.append(f"switch {k}: worker pids changed")
            new_procs = common.descendants(me) - procs
            if new_procs:
                checks["switch_no_new_processes"] = False
                problems.append(f"switch {k}: new processes {sorted(new_procs)}")
            applied = set(envs.env.get_attr("modification"))
            if applied != {normalize_modification(mod)} or envs.modification != normalize_modification(mod) or obs.shape[0] != args.num_envs:
                checks["switch_modification_applied"] = False
                problems.append(f"switch {k}: workers report {applied}, expected {normalize_modification(mod)!r}")
            run_steps(envs, args.steps_between)  # switch mid-episode, as in training
        # --- re-creation ---
        k += 1
        mod = SWITCH_MODS[k % 2]
        old = envs.worker_pids()
        t = time.perf_counter()
        envs.close()
        t_closed = time.perf_counter()
        envs = make_vector_env(settings, args.num_envs, mod)
        t_made = time.perf_counter()
        envs.reset(seed=args.seed + rnd + 1)
        t_reset = time.perf_counter()
        recreate_ms.append({"total": (t_reset - t) * 1e3, "close": (t_closed - t) * 1e3,
                            "make": (t_made - t_closed) * 1e3, "reset": (t_reset - t_made) * 1e3})
        still = [p for p in old if common.alive(p)]
        if still:
            checks["recreate_old_workers_gone"] = False
            problems.append(f"re-creation {rnd}: old workers still alive {still}")
        if set(old) & set(envs.worker_pids()):
            checks["recreate_new_pids"] = False
        n_procs = len(common.descendants(me))
        if n_procs != baseline_procs:
            checks["recreate_process_count_stable"] = False
            problems.append(f"re-creation {rnd}: {n_procs} descendant processes, {baseline_procs} before")
        run_steps(envs, args.steps_between)
    last = envs.worker_pids()
    envs.close()
    time.sleep(0.2)
    leaked = [p for p in last if common.alive(p)]
    if leaked:
        problems.append(f"after the final close: workers still alive {leaked}")

    # the floor: the same switches without the random no-op start (noop_max=0): what is left is IPC + hook swap
    floor_ms: list[float] = []
    if args.noop0_switches:
        e = make_vector_env(dataclasses.replace(settings, noop_max=0), args.num_envs, SWITCH_MODS[0])
        e.reset(seed=args.seed)
        for j in range(args.noop0_switches):
            run_steps(e, args.steps_between)
            t = time.perf_counter()
            e.switch(SWITCH_MODS[(j + 1) % 2], step=j)
            floor_ms.append((time.perf_counter() - t) * 1e3)
        e.close()

    totals = [r["total"] for r in recreate_ms]
    sw_med, rc_med = common.median(switch_ms), common.median(totals)
    return {
        "num_envs": args.num_envs, "modifications": list(SWITCH_MODS),
        "first_create_s": first_create_s,
        "switch_ms": switch_ms, "recreate_ms": recreate_ms,
        "switch_median_ms": sw_med, "switch_p90_ms": common.quantile(switch_ms, 0.9), "switch_max_ms": max(switch_ms),
        "switch_noop0_ms": floor_ms, "switch_noop0_median_ms": common.median(floor_ms),
        "recreate_median_ms": rc_med,
        "recreate_close_median_ms": common.median([r["close"] for r in recreate_ms]),
        "recreate_make_median_ms": common.median([r["make"] for r in recreate_ms]),
        "recreate_reset_median_ms": common.median([r["reset"] for r in recreate_ms]),
        "speedup": common.ratio(rc_med, sw_med),
        "checks": checks, "problems": problems, "leaked_after_final_close": leaked,
        "targets": {"switch_median_le_50ms": sw_med <= 50.0, "speedup_ge_20x": common.ratio(rc_med, sw_med) >= 20.0},
    }


# --------------------------------------------------------------------------------------------------------------------
# (b) throughput
# --------------------------------------------------------------------------------------------------------------------


def bench_throughput(args: argparse.Namespace) -> dict:
    import numpy as np

    from continual.envs.vector import EnvSettings, make_vector_env

    hack = EnvSettings(env_id=args.env_id, backend="HackAtari")
    variants: dict[str, callable] = {
        "ours HackAtari (no modification)": lambda: make_vector_env(hack, args.num_envs, ""),
        f"ours HackAtari ({args.modification})": lambda: make_vector_env(hack, args.num_envs, args.modification),
        "plain gymnasium ALE": lambda: make_plain_vector_env(args),
    }
    if args.gym_backend:
        gym_settings = EnvSettings(env_id=args.env_id, backend="Gymnasium")
        variants["ours Gymnasium backend"] = lambda: make_vector_env(gym_settings, args.num_envs, "")

    rng = np.random.default_rng(args.seed)
    envs = {}
    for name, make in variants.items():
        e = make()
        e.reset(seed=args.seed)
        envs[name] = e
    try:
        n_actions = int(next(iter(envs.values())).single_action_space.n)
        vsteps = max(1, args.steps // args.num_envs)
        for e in envs.values():  # warm-up
            for _ in range(args.warmup_steps // args.num_envs):
                e.step(rng.integers(0, n_actions, size=args.num_envs))
        names = list(envs)
        sps: dict[str, list[float]] = {n: [] for n in names}
        windows: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for rnd in range(args.rounds):
            order = common.rotation(names, rnd)
            for name in order:
                e = envs[name]
                actions = rng.integers(0, n_actions, size=(vsteps, args.num_envs))
                wall0, t = time.time(), time.perf_counter()
                for a in actions:
                    e.step(a)
                sps[name].append(vsteps * args.num_envs / (time.perf_counter() - t))
                windows[name].append((wall0, time.time()))
            print(f"  round {rnd + 1}/{args.rounds}: " + ", ".join(f"{n}={sps[n][-1]:,.0f}" for n in names),
                  flush=True)
    finally:
        for e in envs.values():
            e.close()

    med = {n: common.median(v) for n, v in sps.items()}
    plain = med["plain gymnasium ALE"]
    # per-round ratios (each against the plain env measured in the same round) are robust to slow drifts
    per_round = {n: common.median([a / b for a, b in zip(sps[n], sps["plain gymnasium ALE"])]) for n in names}
    ours = [n for n in names if n.startswith("ours HackAtari")]
    return {
        "num_envs": args.num_envs, "steps_per_measurement": vsteps * args.num_envs, "rounds": args.rounds,
        "plain_autoreset": args.plain_autoreset,
        "sps": sps, "median_sps": med, "windows": windows,
        "ratio_vs_plain": {n: common.ratio(med[n], plain) for n in names},
        "median_per_round_ratio_vs_plain": per_round,
        "targets": {f"{n} / plain >= 0.8": common.ratio(med[n], plain) >= 0.8 for n in ours},
    }


# --------------------------------------------------------------------------------------------------------------------


def report(info: dict, sw: dict | None, tp: dict | None) -> None:
    common.print_machine(info)
    if sw:
        rows = [
            ["in-place switch (envs.switch)", len(sw["switch_ms"]), common.fmt(sw["switch_median_ms"]),
             common.fmt(sw["switch_p90_ms"]), common.fmt(sw["switch_max_ms"]), "1.0x"],
        ]
        if sw["switch_noop0_ms"]:
            f = sw["switch_noop0_ms"]
            rows.append(["in-place switch, noop_max=0 (floor)", len(f), common.fmt(sw["switch_noop0_median_ms"]),
                         common.fmt(common.quantile(f, 0.9)), common.fmt(max(f)), ""])
        rows += [
            ["re-create (close + make + reset)", len(sw["recreate_ms"]), common.fmt(sw["recreate_median_ms"]),
             common.fmt(common.quantile([r["total"] for r in sw["recreate_ms"]], 0.9)),
             common.fmt(max(r["total"] for r in sw["recreate_ms"])), f"{sw['speedup']:.1f}x"],
            ["  of which close", "", common.fmt(sw["recreate_close_median_ms"]), "", "", ""],
            ["  of which make_vector_env", "", common.fmt(sw["recreate_make_median_ms"]), "", "", ""],
            ["  of which reset(seed)", "", common.fmt(sw["recreate_reset_median_ms"]), "", "", ""],
        ]
        common.print_table(f"(a) switch latency, {sw['num_envs']} HackAtari envs, alternating "
                           f"{' / '.join(repr(m) for m in sw['modifications'])} (ms)",
                           ["method", "n", "median", "p90", "max", "re-create / switch"], rows)
        rows = [[k, "ok" if v else "FAILED"] for k, v in sw["checks"].items()]
        rows.append(["workers alive after the final close", len(sw["leaked_after_final_close"])])
        common.print_table("(a) process checks", ["check", "result"], rows)
        for p in sw["problems"][:10]:
            print("  problem:", p)
        print(f"other processes used {sw['load']['foreign_cores']:.2f} cores on average during (a) "
              f"(steal {sw['load']['steal_cores']:.2f})")
        print(f"targets: median switch <= 50 ms: {sw['targets']['switch_median_le_50ms']}; "
              f"re-create/switch >= 20x: {sw['targets']['speedup_ge_20x']}")
    if tp:
        rows = []
        for n, v in tp["sps"].items():
            rows.append([n, common.fmt(tp["median_sps"][n], 0), common.fmt(min(v), 0), common.fmt(max(v), 0),
                         f"{tp['ratio_vs_plain'][n]:.2f}", f"{tp['median_per_round_ratio_vs_plain'][n]:.2f}",
                         common.fmt(tp["foreign_cores"][n], 2)])
        common.print_table(f"(b) env-steps/s, {tp['num_envs']} envs, random actions, {tp['rounds']} rounds x "
                           f"{tp['steps_per_measurement']} steps (round-robin)",
                           ["vector env", "median", "min", "max", "ratio vs plain", "median per-round ratio",
                            "other processes' cores"], rows)
        print("targets: " + "; ".join(f"{k}: {v}" for k, v in tp["targets"].items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="ALE/Freeway-v5")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds-switch", dest="rounds", type=int, default=5,
                   help="switch benchmark rounds (each: in-place switches, then one re-creation)")
    p.add_argument("--switches-per-round", type=int, default=6)
    p.add_argument("--noop0-switches", type=int, default=10,
                   help="extra in-place switches with noop_max=0 (the floor without the random no-op start); 0: skip")
    p.add_argument("--steps-between", type=int, default=10, help="vector steps between two switches")
    p.add_argument("--tp-rounds", type=int, default=5, help="throughput rounds (round-robin over the vector envs)")
    p.add_argument("--steps", type=int, default=4000, help="env steps (summed over envs) per throughput measurement")
    p.add_argument("--warmup-steps", type=int, default=800, help="env steps per vector env before measuring")
    p.add_argument("--modification", default="all_green_cars", help="active modification for the 2nd HackAtari env")
    p.add_argument("--plain-autoreset", choices=["same_step", "next_step"], default="same_step",
                   help="autoreset mode of the plain env (ours uses same_step)")
    p.add_argument("--no-gym-backend", dest="gym_backend", action="store_false",
                   help="skip our Gymnasium backend in the throughput comparison")
    p.add_argument("--skip-switch", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--json", help="write the results as JSON to this path")
    args = p.parse_args()

    info = common.machine_info()
    t0 = time.time()
    sw = tp = None
    with common.LoadSampler(interval=1.0) as sampler:
        if not args.skip_switch:
            print("(a) switch latency ...", flush=True)
            t = time.time()
            sw = bench_switch(args)
            sw["load"] = sampler.summary(t, time.time())
        if not args.skip_throughput:
            print("(b) throughput ...", flush=True)
            tp_args = argparse.Namespace(**{**vars(args), "rounds": args.tp_rounds})
            tp = bench_throughput(tp_args)
    if tp:
        # CPU used by other processes while each vector env was measured (median over its rounds)
        tp["foreign_cores"] = {n: common.median([sampler.summary(a, b)["foreign_cores"] for a, b in w])
                               for n, w in tp.pop("windows").items()}
    info["loadavg_end"] = common.loadavg()
    info["wall_s"] = time.time() - t0
    report(info, sw, tp)
    print(f"wall time: {info['wall_s']:.0f} s")
    common.write_json(args.json, {"benchmark": "env_switch", "command": " ".join([sys.executable] + sys.argv),
                                  "machine": info, "config": vars(args), "switch": sw, "throughput": tp})


if __name__ == "__main__":
    main()
