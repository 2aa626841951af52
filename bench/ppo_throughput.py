"""Benchmark: PPO training throughput on HackAtari Freeway (8 envs x 128 steps, CleanRL hyperparameters).

(a) our PPO (`agents.ppo.train`) against Stable-Baselines3 PPO with the same hyperparameters on the same env stack
    (SB3 SubprocVecEnv over `continual.envs.vector.make_env` thunks, forkserver);
(b) our PPO with a switch every 2 iterations (Sequential curriculum alternating "" and a modification) against
    no switches, same budget;
(c) where the time goes: per-iteration env / act / learn seconds (ours: from metrics.jsonl; SB3: a timing callback
    and a timing VecEnv wrapper).

Every training run is a fresh subprocess; the three kinds run round-robin (the order rotates every repeat).
Steady-state steps/s = steps of the iterations after the first `--warmup` ones / time between the end of iteration
`--warmup` and the end of the last iteration (startup, env creation and the first iterations are excluded).

Run from the repository root:  python bench/ppo_throughput.py [--json bench/out/ppo_throughput.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

KINDS = ("ours", "sb3", "ours_switch")
EXTRA_KINDS = ("ours_bf16",)  # not run by default
LABELS = {"ours": "ours (no switch)", "sb3": "SB3 PPO", "ours_switch": "ours (switch every 2 it.)",
          "ours_bf16": "ours --bf16 (no switch)"}
# our worker's flags per kind
OURS_FLAGS = {"ours": [], "ours_switch": [], "ours_bf16": ["--bf16"]}


# --------------------------------------------------------------------------------------------------------------------
# workers (one training run each, in a subprocess)
# --------------------------------------------------------------------------------------------------------------------


def worker_ours(args: argparse.Namespace, switching: bool, flags: list[str]) -> dict:
    import agents.ppo as ppo
    from continual.training.startup import parse_train_args

    batch = args.num_envs * args.num_steps
    total = args.iterations * batch
    argv = ["--env_id", args.env_id, "--backend", args.backend, "--num_envs", str(args.num_envs),
            "--num_steps", str(args.num_steps), "--total_timesteps", str(total), "--runs_dir", args.tmp,
            "--run_name", args.run_name, "--no-progress-bar", "--reward_scaling", "clip", "--seed", str(args.seed)]
    argv += flags
    if args.backend != "HackAtari":  # MinAtar/Gymnasium default to the sync vector env
        argv += ["--vector_env", "async"]
    if args.torch_threads:
        argv += ["--torch_threads", str(args.torch_threads)]
    if switching:
        every = args.switch_every * batch
        thresholds = list(range(every, total, every))
        mods = [("" if i % 2 == 0 else args.modification) for i in range(len(thresholds) + 1)]
        config = {"modification_factory": "SequentialModificationFactory",
                  "modification_factory_kwargs": {"num_total_steps": total, "modifications": mods,
                                                  "switching_thresholds": thresholds}}
        path = os.path.join(args.tmp, args.run_name + "_curriculum.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        argv += ["--config", path]
    else:
        argv += ["--modifs", ""]
    t0 = time.time()
    parsed, curriculum, _ = parse_train_args(argv)
    run_dir = ppo.train(parsed, curriculum, None)
    t1 = time.time()
    iterations, switches = [], []
    for rec in common.metrics(run_dir):
        if rec.get("kind") == "iteration":
            iterations.append({"global_step": rec["global_step"], "end": rec["time"], "env": rec["time/env_s"],
                               "act": rec["time/act_s"], "learn": rec["time/learn_s"],
                               "sps_since_start": rec["charts/SPS"]})
        elif rec.get("kind") == "switch":
            switches.append({"global_step": rec["global_step"], "modification": rec["modification"],
                             "time": rec["time"]})
    return {"start": t0, "end": t1, "iterations": iterations, "switches": switches}


def worker_sb3(args: argparse.Namespace) -> dict:

    import numpy as np
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecEnvWrapper

    import continual.envs.vector as cenvs
    from continual.processes import mp_context

    class TimedVecEnv(VecEnvWrapper):
        """Times env stepping (step_async + step_wait) and clips rewards to their sign, as ours does."""

        def __init__(self, venv):
            super().__init__(venv)
            self.env_s = 0.0

        def reset(self):
            return self.venv.reset()

        def step_async(self, actions):
            self._t = time.time()
            self.venv.step_async(actions)

        def step_wait(self):
            obs, rew, done, info = self.venv.step_wait()
            self.env_s += time.time() - self._t
            return obs, np.sign(rew).astype(np.float32), done, info

    class Timer(BaseCallback):
        def __init__(self, venv: TimedVecEnv):
            super().__init__()
            self.venv, self.records, self.t_end = venv, [], None

        def _on_rollout_start(self) -> None:
            now = time.time()
            if self.records:
                self.records[-1]["end"] = now
                self.records[-1]["learn"] = now - self.records[-1]["rollout_end"]
            self.records.append({"start": now, "env0": self.venv.env_s})

        def _on_rollout_end(self) -> None:
            r, now = self.records[-1], time.time()
            r["rollout_end"] = now
            r["env"] = self.venv.env_s - r.pop("env0")
            r["act"] = now - r["start"] - r["env"]
            r["global_step"] = self.num_timesteps

        def _on_training_end(self) -> None:
            now = time.time()
            self.records[-1]["end"] = now
            self.records[-1]["learn"] = now - self.records[-1]["rollout_end"]

        def _on_step(self) -> bool:
            return True

    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    t0 = time.time()
    # same warm worker start as our vector env (workers fork from a server that imported the env stack once)
    mp_context()
    settings = cenvs.EnvSettings(env_id=args.env_id, backend="HackAtari")
    venv = SubprocVecEnv([cenvs.make_env(settings, i, "") for i in range(args.num_envs)], start_method="forkserver")
    venv = TimedVecEnv(venv)
    lr = args.learning_rate
    model = PPO("CnnPolicy", venv, n_steps=args.num_steps, batch_size=args.num_envs * args.num_steps // 4,
                n_epochs=4, learning_rate=lambda progress_remaining: progress_remaining * lr, gamma=0.99,
                gae_lambda=0.95, clip_range=0.1, clip_range_vf=args.sb3_clip_range_vf, ent_coef=0.01, vf_coef=0.5,
                max_grad_norm=0.5, device=args.sb3_device, seed=args.seed, verbose=0)
    timer = Timer(venv)
    model.learn(total_timesteps=args.iterations * args.num_envs * args.num_steps, callback=timer)
    t1 = time.time()
    venv.close()
    iterations = [{k: r[k] for k in ("global_step", "end", "env", "act", "learn")} for r in timer.records]
    policy = model.policy
    return {"start": t0, "end": t1, "iterations": iterations, "switches": [],
            "sb3_checks": {"observation_space": str(venv.observation_space),
                           "env_wrapped_by_sb3": type(model.get_env()).__name__,
                           "features_extractor": type(policy.features_extractor).__name__,
                           "normalize_images": bool(policy.normalize_images),
                           "share_features_extractor": bool(policy.share_features_extractor)}}


def run_worker(args: argparse.Namespace) -> None:
    if args.worker == "sb3":
        out = worker_sb3(args)
    else:
        out = worker_ours(args, switching=args.worker == "ours_switch", flags=OURS_FLAGS[args.worker])
    with open(args.worker_out, "w", encoding="utf-8") as f:
        json.dump(out, f)


# --------------------------------------------------------------------------------------------------------------------
# orchestration and analysis
# --------------------------------------------------------------------------------------------------------------------


def steady(run: dict, warmup: int) -> dict:
    """Steady-state rate and per-iteration breakdown of one run, excluding the first `warmup` iterations."""
    its = run["iterations"]
    w = max(1, min(warmup, len(its) - 1))
    ends = [it["end"] for it in its]
    steps = its[-1]["global_step"] - its[w - 1]["global_step"]
    rate = steps / (ends[-1] - ends[w - 1])
    per = []
    for i in range(w, len(its)):
        wall = ends[i] - ends[i - 1]
        env, act, learn = its[i]["env"], its[i]["act"], its[i]["learn"]
        per.append({"wall": wall, "env": env, "act": act, "learn": learn, "other": wall - env - act - learn})
    switch_steps = {s["global_step"] for s in run["switches"]}
    # a switch at global step g happens at the start of the iteration that ends at g + batch
    batch = its[0]["global_step"]
    in_window = [g for g in switch_steps if its[w - 1]["global_step"] <= g < its[-1]["global_step"]]
    switch_iters = [i for i in range(w, len(its)) if its[i]["global_step"] - batch in switch_steps]
    return {"sps": rate, "iterations_measured": len(its) - w, "per_iteration": per,
            "first_iteration": {k: its[0][k] for k in ("env", "act", "learn")},
            "wall_total_s": run["end"] - run["start"], "overall_sps": its[-1]["global_step"] / (run["end"] - run["start"]),
            "switches_in_window": len(in_window), "switch_iteration_indices": switch_iters}


def wait_quiet(sampler: "common.LoadSampler", below: float, max_wait: float, window: int = 3) -> float:
    """Wait until other processes used < `below` cores over the last `window` samples (at most `max_wait` s)."""
    t0 = time.time()
    while time.time() - t0 < max_wait:
        time.sleep(sampler.interval)
        recent = [x["foreign_cores"] for x in sampler.samples[-window:] if x["t0"] >= t0]
        if len(recent) == window and sum(recent) / window < below:
            break
    return time.time() - t0


def orchestrate(args: argparse.Namespace) -> dict:
    tmp = tempfile.mkdtemp(prefix="ppo_bench_")
    runs: dict[str, list[dict]] = {k: [] for k in args.kinds}
    failures = []
    sampler = common.LoadSampler(interval=1.0).__enter__()
    try:
        for rep in range(args.repeats):
            for kind in common.rotation(args.kinds, rep):
                name = f"{kind}_r{rep}"
                out = os.path.join(tmp, name + ".json")
                log = os.path.join(tmp, name + ".log")
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--worker-out", out,
                       "--tmp", tmp, "--run-name", name, "--iterations", str(args.iterations),
                       "--num-envs", str(args.num_envs), "--num-steps", str(args.num_steps),
                       "--env-id", args.env_id, "--backend", args.backend, "--seed", str(args.seed),
                       "--modification", args.modification,
                       "--switch-every", str(args.switch_every),
                       "--sb3-clip-range-vf", str(args.sb3_clip_range_vf)]
                if args.torch_threads:
                    cmd += ["--torch-threads", str(args.torch_threads)]
                if args.quiet_below is not None:
                    waited = wait_quiet(sampler, args.quiet_below, args.quiet_max_wait)
                    print(f"  (waited {waited:.0f} s for other processes to use < {args.quiet_below} cores)", flush=True)
                t = time.time()
                run = common.run_worker(cmd, name, log, out, args.run_timeout, failures)
                if run is None:
                    continue
                run["analysis"] = steady(run, args.warmup)
                its = run["iterations"]
                w = run["analysis"]["iterations_measured"]
                # CPU load while the measured iterations ran (our process tree vs everything else on the machine)
                t_a, t_b = its[-w - 1]["end"], its[-1]["end"]
                run["load"] = common.LoadSampler.summary(sampler, t_a, t_b)
                # CPU time our process tree (learner + env workers) spent per 1000 steps: less sensitive than wall
                # time to other processes on the machine (though not immune: spinning threads, caches)
                steps = its[-1]["global_step"] - its[-w - 1]["global_step"]
                run["analysis"]["cpu_s_per_kstep"] = run["load"]["ours_cores"] * (t_b - t_a) / steps * 1000
                runs[kind].append(run)
                print(f"  repeat {rep + 1}/{args.repeats} {LABELS[kind]:<28} steady {run['analysis']['sps']:7.1f} "
                      f"steps/s  (run {time.time() - t:5.1f} s; other processes used "
                      f"{run['load']['foreign_cores']:.2f} cores, steal {run['load']['steal_cores']:.2f})", flush=True)
    finally:
        sampler.__exit__(None, None, None)
        if args.keep_tmp:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"runs": runs, "failures": failures}


def summarize(args: argparse.Namespace, res: dict) -> dict:
    runs = res["runs"]
    sps = {k: [r["analysis"]["sps"] for r in v] for k, v in runs.items()}
    med = {k: common.median(v) for k, v in sps.items()}
    out: dict = {"sps": sps, "median_sps": med,
                 "foreign_cores": {k: [r["load"]["foreign_cores"] for r in v] for k, v in runs.items()},
                 "cpu_s_per_kstep": {k: [r["analysis"]["cpu_s_per_kstep"] for r in v] for k, v in runs.items()},
                 "median_wall_s": {k: common.median([r["analysis"]["wall_total_s"] for r in v])
                                   for k, v in runs.items()}}

    def paired(a: str, b: str) -> float:
        return common.median([x / y for x, y in zip(sps.get(a, []), sps.get(b, []))])

    cpu = {k: common.median(v) for k, v in out["cpu_s_per_kstep"].items()}
    out["median_cpu_s_per_kstep"] = cpu
    if "ours" in med and "sb3" in med:
        r = common.ratio(med["ours"], med["sb3"])
        out["ours_vs_sb3"] = {"ratio_of_medians": r, "median_paired_ratio": paired("ours", "sb3"),
                              "cpu_time_ratio_sb3_over_ours": common.ratio(cpu["sb3"], cpu["ours"]),
                              "target_ge_1.0": r >= 1.0, "stretch_ge_1.3": r >= 1.3}
    if "ours_bf16" in med and "sb3" in med:
        r = common.ratio(med["ours_bf16"], med["sb3"])
        out["ours_bf16_vs_sb3"] = {"ratio_of_medians": r, "median_paired_ratio": paired("ours_bf16", "sb3"),
                                   "vs_ours_fp32": common.ratio(med["ours_bf16"], med.get("ours", float("nan"))),
                                   "stretch_ge_1.3": r >= 1.3}
    if "ours" in med and "ours_switch" in med:
        r = common.ratio(med["ours_switch"], med["ours"])
        out["switch_vs_noswitch"] = {"ratio_of_medians": r, "slowdown": 1 - r,
                                     "median_paired_ratio": paired("ours_switch", "ours"),
                                     "switches_in_window": [x["analysis"]["switches_in_window"]
                                                            for x in runs["ours_switch"]],
                                     "target_slowdown_le_10pct": (1 - r) <= 0.10}
        # time of the iterations that start with a switch, outside env/act/learn ("other")
        sw_other, plain_other = [], []
        for x in runs["ours_switch"]:
            idx = set(x["analysis"]["switch_iteration_indices"])
            w = x["analysis"]["iterations_measured"]
            first = len(x["iterations"]) - w
            for j, p in enumerate(x["analysis"]["per_iteration"]):
                (sw_other if first + j in idx else plain_other).append(p["other"])
        out["switch_vs_noswitch"]["other_s_switch_iterations_median"] = common.median(sw_other)
        out["switch_vs_noswitch"]["other_s_plain_iterations_median"] = common.median(plain_other)
    # the same comparisons restricted to runs during which other processes used < `quiet` cores
    quiet = args.quiet_below if args.quiet_below is not None else 0.5
    q = {k: [r["analysis"]["sps"] for r in v if r["load"]["foreign_cores"] < quiet] for k, v in runs.items()}
    qmed = {k: common.median(v) for k, v in q.items()}
    out["quiet"] = {"threshold_cores": quiet, "sps": q, "median_sps": qmed,
                    "ours_vs_sb3": common.ratio(qmed.get("ours", float("nan")), qmed.get("sb3", float("nan"))),
                    "switch_vs_noswitch": common.ratio(qmed.get("ours_switch", float("nan")),
                                                       qmed.get("ours", float("nan")))}
    breakdown = {}
    for k, v in runs.items():
        per = [p for r in v for p in r["analysis"]["per_iteration"]]
        if not per:
            continue
        total_wall = sum(p["wall"] for p in per)
        breakdown[k] = {c: {"median_s": common.median([p[c] for p in per]),
                            "share": sum(p[c] for p in per) / total_wall}
                        for c in ("wall", "env", "act", "learn", "other")}
        breakdown[k]["first_iteration_median_s"] = {
            c: common.median([r["analysis"]["first_iteration"][c] for r in v]) for c in ("env", "act", "learn")}
    out["breakdown"] = breakdown
    sb3_checks = [r.get("sb3_checks") for r in runs.get("sb3", []) if r.get("sb3_checks")]
    out["sb3_checks"] = sb3_checks[0] if sb3_checks else None
    return out


def report(args: argparse.Namespace, info: dict, s: dict) -> None:
    common.print_machine(info)
    batch = args.num_envs * args.num_steps
    rows = []
    base = s["median_sps"].get("sb3")
    for k in args.kinds:
        v = s["sps"].get(k, [])
        if not v:
            rows.append([LABELS[k], "0", "-", "-", "-", "-", "-"])
            continue
        rows.append([LABELS[k], len(v), common.fmt(s["median_sps"][k]), common.fmt(min(v)), common.fmt(max(v)),
                     common.fmt(s["median_wall_s"][k]), f"{common.ratio(s['median_sps'][k], base):.2f}" if base else "-",
                     common.fmt(s["median_cpu_s_per_kstep"][k], 2),
                     " ".join(f"{x:.1f}" for x in s["foreign_cores"][k])])
    common.print_table(f"(a)+(b) PPO training steps/s, {args.backend} {args.env_id}, {args.num_envs} envs x "
                       f"{args.num_steps} steps, {args.iterations} iterations ({args.iterations * batch} steps), "
                       f"steady state after {args.warmup} iterations",
                       ["run", "n", "median steps/s", "min", "max", "median wall s (incl. startup)", "vs SB3",
                        "CPU s / 1k steps", "other processes' cores, per run"], rows)
    if "ours_vs_sb3" in s:
        o = s["ours_vs_sb3"]
        print(f"ours / SB3: {o['ratio_of_medians']:.2f} (median of paired per-repeat ratios "
              f"{o['median_paired_ratio']:.2f}; CPU time per step SB3/ours {o['cpu_time_ratio_sb3_over_ours']:.2f}); "
              f"target >= 1.0: {o['target_ge_1.0']}; stretch >= 1.3: "
              f"{o['stretch_ge_1.3']}")
    if "ours_bf16_vs_sb3" in s:
        o = s["ours_bf16_vs_sb3"]
        print(f"ours --bf16 / SB3: {o['ratio_of_medians']:.2f} (paired {o['median_paired_ratio']:.2f}); --bf16 / "
              f"float32 ours: {o['vs_ours_fp32']:.2f}; stretch >= 1.3: {o['stretch_ge_1.3']}")
    if "switch_vs_noswitch" in s:
        o = s["switch_vs_noswitch"]
        print(f"switching / no switching: {o['ratio_of_medians']:.2f} (slowdown {o['slowdown'] * 100:+.1f}%, paired "
              f"{o['median_paired_ratio']:.2f}); switches in the measured window per run: {o['switches_in_window']}; "
              f"target slowdown <= 10%: {o['target_slowdown_le_10pct']}")
        print(f"  non-env/act/learn time of iterations starting with a switch: median "
              f"{o['other_s_switch_iterations_median'] * 1e3:.0f} ms (other iterations "
              f"{o['other_s_plain_iterations_median'] * 1e3:.0f} ms)")
    qt = s["quiet"]
    print(f"runs with other processes < {qt['threshold_cores']} cores: " + ", ".join(
        f"{LABELS[k]} n={len(v)} median {common.fmt(qt['median_sps'][k])}" for k, v in qt["sps"].items())
        + f"; ours/SB3 {qt['ours_vs_sb3']:.2f}; switching/no switching {qt['switch_vs_noswitch']:.2f}")
    rows = []
    for k, b in s["breakdown"].items():
        rows.append([LABELS[k]] + [f"{b[c]['median_s']:.2f} ({b[c]['share'] * 100:.0f}%)"
                                   for c in ("env", "act", "learn", "other")] + [f"{b['wall']['median_s']:.2f}"]
                    + ["/".join(f"{b['first_iteration_median_s'][c]:.1f}" for c in ("env", "act", "learn"))])
    common.print_table("(c) per-iteration seconds, median over measured iterations (share of total time)",
                       ["run", "env", "act", "learn", "other", "iteration wall", "1st iteration env/act/learn"], rows)
    if s.get("sb3_checks"):
        print("SB3 setup: " + ", ".join(f"{k}={v}" for k, v in s["sb3_checks"].items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="ALE/Freeway-v5")
    p.add_argument("--backend", default="HackAtari", choices=["HackAtari", "MinAtar", "Gymnasium"],
                   help="our runs' backend (MinAtar/Gymnasium: async envs); SB3 runs need HackAtari")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--iterations", type=int, default=6, help="PPO iterations per training run")
    p.add_argument("--repeats", type=int, default=3, help="round-robin repeats of every run kind")
    p.add_argument("--warmup", type=int, default=2, help="first iterations excluded from steady-state steps/s")
    p.add_argument("--kinds", nargs="+", choices=KINDS + EXTRA_KINDS, default=list(KINDS), help="run kinds to compare")
    p.add_argument("--modification", default="all_green_cars", help="the regime alternated with '' in switch runs")
    p.add_argument("--switch-every", type=int, default=2, help="iterations between switches in switch runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--sb3-clip-range-vf", type=float, default=0.1,
                   help="SB3 value clipping (ours clips the value loss with clip_coef=0.1, as CleanRL)")
    p.add_argument("--sb3-device", default="cpu", help="SB3's torch device (cuda on a GPU machine)")
    p.add_argument("--quiet-below", type=float, default=None,
                   help="before each run, wait until other processes use fewer than this many cores (default: no wait)")
    p.add_argument("--quiet-max-wait", type=float, default=120.0, help="longest wait for --quiet-below, seconds")
    p.add_argument("--run-timeout", type=int, default=1200, help="seconds before a training run is killed")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temporary run directories")
    p.add_argument("--json", help="write the results as JSON to this path")
    # internal: one training run
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch threads of every run (ours: --torch_threads; SB3: torch.set_num_threads); default: "
                        "each program's own default")
    p.add_argument("--worker", choices=KINDS + EXTRA_KINDS, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--run-name", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        run_worker(args)
        return
    if args.warmup < 1 or args.warmup >= args.iterations:
        p.error("--warmup must be in [1, iterations)")
    if args.backend != "HackAtari" and any(k.startswith("sb3") or "switch" in k for k in args.kinds):
        p.error("--backend: the SB3 and switch runs use HackAtari")

    info = common.machine_info()
    t0 = time.time()
    print(f"{args.repeats} repeats x {len(args.kinds)} runs of {args.iterations} iterations, round-robin ...",
          flush=True)
    res = orchestrate(args)
    info["loadavg_end"] = common.loadavg()
    info["wall_s"] = time.time() - t0
    summary = summarize(args, res)
    report(args, info, summary)
    print(f"wall time: {info['wall_s']:.0f} s")
    if res["failures"]:
        print(f"{len(res['failures'])} run(s) failed: {[f['run'] for f in res['failures']]}")
    common.write_json(args.json, {"benchmark": "ppo_throughput", "command": " ".join([sys.executable] + sys.argv),
                                  "machine": info, "config": vars(args), "summary": summary,
                                  "runs": res["runs"], "failures": res["failures"]})
    if res["failures"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
