"""Benchmark: training throughput on small environments (MinAtar, CartPole), this tree against a git revision and SB3.

Each workload is a real training run in a fresh subprocess (`continual_training_example.py` of the tree measured);
steady-state steps/s = the steps of the iterations after `--warmup` / the time between the end of iteration
`--warmup` and the end of the last one (startup and the first iterations are excluded), from metrics.jsonl.
Where the time goes: the run's own split per iteration (time/env_s, time/act_s, time/learn_s; "other" = the
iteration's wall time minus those three); "outside env/forward/update" = (act - time/forward_s + other) / wall, the
share of an iteration that is neither the game, the acting forward pass nor the update (PPO logs time/forward_s;
older revisions do not, so theirs is not shown). Workloads, trees and SB3 run round-robin, `--repeats` times, the order
rotating every repeat; reported: medians, the ratio of medians and the median of paired (same-repeat) ratios, and
the load average around every run; and the CPU seconds per steady-state iteration of the training process and its
env worker processes (read from /proc as each iteration is logged: less load-sensitive than wall time) with the
paired ratio of each kind's to ours'.

Workloads (`--workloads`):
  breakout_purejaxrl / spaceinvaders_purejaxrl   configs/minatar_ppo.json: PureJaxRL's MinAtar settings (64 envs x
                                                 128 steps, 4 epochs x 8 minibatches, 64-64 relu actor and critic)
  breakout_purejaxrl_2threads                    the same with --torch_threads 2 (ours uses 1 for small inputs)
  breakout_default / spaceinvaders_default       PPO's defaults on MinAtar (8 envs x 128, 4 epochs x 4 minibatches,
                                                 MinAtar's CNN)
  cartpole_default                               PPO's defaults on CartPole-v1 (Gymnasium backend)
  a2c_breakout / impala_breakout                 A2C (16 envs x 5 steps) and IMPALA (2 actors) on MinAtar Breakout
  gymnax512 / freeway64                          configs/minatar_ppo_gymnax.json at 512 envs; pixel Freeway, 64 envs
  freeway_pilot                                  issue 46's pilot (configs/experiments/hackatari_freeway_pilot.json's
                                                 flags: pixel HackAtari Freeway, CleanRL's Atari PPO, 8 envs)
`--base REV` runs each workload from a worktree of REV too (a workload REV cannot run is reported as such);
`--sb3` adds Stable-Baselines3 PPO on the *_purejaxrl workloads: the same envs (our MinAtar env stack in SB3's
DummyVecEnv), the same hyperparameters and network (net_arch pi/vf 64-64, ReLU), with torch's default thread count
(SB3's own default) or `--sb3_threads N`. `--variant NAME=FLAGS` runs each workload of this tree again with FLAGS
added, as the kind NAME (`ours_vs_NAME` ratios), e.g. `--variant compile=--compile` (docs/benchmarks/gpu.md).

    python bench/small_env_throughput.py --base 0f4f8ee --sb3 --repeats 3 --json bench/results/small_env_throughput.json
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

ROOT = common.REPO_ROOT


def pilot_flags() -> list[str]:
    """Issue 46's pilot (pixel HackAtari Freeway, CleanRL's Atari PPO, 8 envs): its experiment file's flags, less
    its budget, checkpoints and name."""
    from continual.config.loading import load_json_file

    flags = load_json_file(os.path.join(ROOT, "configs", "experiments", "hackatari_freeway_pilot.json"))["flags"]
    return [x for k, v in flags.items() if k not in ("total_timesteps", "checkpoint_every", "exp_name")
            for x in (f"--{k}", str(v))]


MINATAR = ["--backend", "MinAtar"]
WORKLOADS = {
    "breakout_purejaxrl": ["--config", "configs/minatar_ppo.json", "--env_id", "MinAtar/Breakout"],
    "spaceinvaders_purejaxrl": ["--config", "configs/minatar_ppo.json", "--env_id", "MinAtar/SpaceInvaders"],
    # the same with 2 torch threads (our default for small observations is 1: --torch_threads)
    "breakout_purejaxrl_2threads": ["--config", "configs/minatar_ppo.json", "--env_id", "MinAtar/Breakout",
                                    "--torch_threads", "2"],
    "breakout_default": [*MINATAR, "--env_id", "MinAtar/Breakout"],
    "spaceinvaders_default": [*MINATAR, "--env_id", "MinAtar/SpaceInvaders"],
    "cartpole_default": ["--backend", "Gymnasium", "--env_id", "CartPole-v1"],
    "a2c_breakout": ["--architecture", "A2C", *MINATAR, "--env_id", "MinAtar/Breakout", "--num_envs", "16",
                     "--num_steps", "5"],
    "impala_breakout": ["--architecture", "IMPALA", *MINATAR, "--env_id", "MinAtar/Breakout", "--num_actors", "2"],
    "gymnax512": ["--config", "configs/minatar_ppo_gymnax.json", "--num_envs", "512"],  # issue 51's GPU rows
    "freeway64": ["--env_id", "ALE/Freeway-v5", "--num_envs", "64"],
    "freeway_pilot": pilot_flags(),
}
BATCH = {"breakout_purejaxrl": 8192, "breakout_purejaxrl_2threads": 8192, "spaceinvaders_purejaxrl": 8192,
         "a2c_breakout": 80, "gymnax512": 65536, "freeway64": 8192}


def steady_state(run_dir: str, warmup: int) -> dict:
    its = common.metrics(run_dir, "iteration")
    if len(its) <= warmup + 1:
        raise RuntimeError(f"{run_dir}: {len(its)} iterations, need more than {warmup + 1}")
    a, b = its[warmup], its[-1]
    parts = {"env": [], "act": [], "learn": [], "other": [], "outside": [], "outside_env_update": []}
    for prev, it in zip(its[warmup:], its[warmup + 1:]):
        wall = it["time"] - prev["time"]
        split = [it.get(f"time/{k}_s", 0.0) for k in ("env", "act", "learn")]
        for k, v in zip(("env", "act", "learn"), split):
            parts[k].append(v)
        parts["other"].append(wall - sum(split))
        parts["outside_env_update"].append((wall - split[0] - split[2]) / wall)  # acting, forward included
        # outside env, forward and update: acting's own overhead (PPO logs time/forward_s) + the iteration's rest
        if "time/forward_s" in it:
            parts["outside"].append((wall - sum(split) + split[1] - it["time/forward_s"]) / wall)
    if not parts["outside"]:
        parts.pop("outside")
    return {"sps": (b["global_step"] - a["global_step"]) / (b["time"] - a["time"]),
            "seconds_per_iteration": {k: common.median(v) for k, v in parts.items()}}


def run_ours(tree: str, workload: str, iterations: int, warmup: int, tmp: str, tag: str, extra: tuple = ()) -> dict:
    batch = BATCH.get(workload, 1024)
    runs = os.path.join(tmp, "runs")
    cmd = common.train_command([*WORKLOADS[workload], *extra, "--total_timesteps", str(batch * iterations),
                                "--checkpoint_every", "0", "--eval_every", "0"], runs, tag)
    # the tree measured: this one, or a worktree of --base; CPU seconds over the iterations after warmup + 1
    r = common.run(cmd, cwd=tree, check=False,
                   watch=lambda proc: common.iteration_cpu_s(proc, os.path.join(runs, tag), warmup + 1, iterations,
                                                            tree=True))
    if r["rc"] != 0:
        return {"error": (r["log_tail"].strip().splitlines() or [f"exit {r['rc']}"])[-1],
                "load_before": r["loadavg_start"]}
    out = steady_state(os.path.join(runs, tag), warmup)
    if r["watch"] is not None:
        out["cpu_s_per_iteration"] = r["watch"] / (iterations - warmup - 1)
    return {**out, "load_before": r["loadavg_start"]}


def run_sb3(workload: str, iterations: int, warmup: int, threads: int = 0) -> dict:
    """SB3 PPO on our MinAtar env stack, PureJaxRL's settings; steps/s between rollout ends as for ours."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

    from continual.config.loading import load_json_file
    from continual.envs.vector import EnvSettings, make_env

    cfg = load_json_file(os.path.join(ROOT, "configs", "minatar_ppo.json"))
    env_id = WORKLOADS[workload][WORKLOADS[workload].index("--env_id") + 1]
    settings = EnvSettings(env_id=env_id, backend="MinAtar")
    venv = VecMonitor(DummyVecEnv([make_env(settings, i, "") for i in range(cfg["num_envs"])]))
    ends: list[float] = []

    class Clock(BaseCallback):
        def _on_rollout_end(self) -> None:
            ends.append(time.perf_counter())

        def _on_step(self) -> bool:
            return True

    torch.set_num_threads(threads or torch.get_num_threads())
    batch = cfg["num_envs"] * cfg["num_steps"]
    model = PPO("MlpPolicy", venv, learning_rate=cfg["learning_rate"], n_steps=cfg["num_steps"],
                batch_size=batch // cfg["num_minibatches"], n_epochs=cfg["update_epochs"], gamma=cfg["gamma"],
                gae_lambda=cfg["gae_lambda"], clip_range=cfg["clip_coef"], ent_coef=cfg["ent_coef"],
                vf_coef=cfg["vf_coef"], max_grad_norm=cfg["max_grad_norm"], device="cpu", seed=1,
                policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.ReLU})
    load = common.loadavg()
    model.learn(total_timesteps=batch * (iterations + 1), callback=Clock())
    venv.close()
    # rollout end k+1 follows update k: (ends[-1] - ends[warmup]) covers iterations warmup+1 .. last
    return {"sps": batch * (len(ends) - 1 - warmup) / (ends[-1] - ends[warmup]), "load_before": load}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--base", help="a git revision measured in the same run (its worktree)")
    p.add_argument("--sb3", action="store_true", help="SB3 PPO on the *_purejaxrl workloads")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=8, help="iterations per run (for A2C/IMPALA: logged iterations)")
    p.add_argument("--warmup", type=int, default=2, help="first iterations left out")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS", help="this tree with FLAGS too")
    p.add_argument("--sb3_threads", type=int, default=0, help="SB3's torch threads (0: torch's default, SB3's)")
    p.add_argument("--sb3-worker", help=argparse.SUPPRESS)
    p.add_argument("--json", help="write the results as JSON here")
    args = p.parse_args()
    if args.sb3_worker:  # a fresh process per SB3 run, as for ours
        print(json.dumps(run_sb3(args.sb3_worker, args.iterations, args.warmup, args.sb3_threads)))
        return
    if args.repeats < 1 or args.iterations < args.warmup + 2:
        p.error("--repeats must be >= 1 and --iterations >= --warmup + 2")
    info = common.machine_info()
    common.print_machine(info)
    tmp = tempfile.mkdtemp(prefix="small_env_")
    atexit.register(shutil.rmtree, tmp, True)  # the runs' folders: only their numbers are kept
    trees = {"ours": ROOT}
    base_sha = common.revision_or_exit(p, args.base) if args.base else None
    variants = {name: tuple(flags.split()) for name, _, flags in (v.partition("=") for v in args.variant)}
    kinds = [(w, t) for w in args.workloads for t in [*trees, *(["base"] if base_sha else []), *variants]]
    if args.sb3:
        kinds += [(w, "sb3") for w in args.workloads if w.endswith("_purejaxrl")]
    results: dict = {f"{w}/{t}": [] for w, t in kinds}
    t0 = time.time()
    with common.revision_tree(base_sha, tmp) if base_sha else contextlib.nullcontext() as base_tree:
        if base_tree:
            trees["base"] = base_tree
        for r in range(args.repeats):
            order = common.rotation(kinds, r)
            for w, t in order:
                if t == "sb3":
                    proc = subprocess.run([sys.executable, __file__, "--sb3-worker", w, "--iterations",
                                           str(args.iterations), "--warmup", str(args.warmup),
                                           "--sb3_threads", str(args.sb3_threads)], cwd=ROOT,
                                          capture_output=True, text=True)
                    out = (json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0
                           else {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]})
                else:
                    out = run_ours(trees.get(t, ROOT), w, args.iterations, args.warmup, tmp, f"{w}_{t}_{r}",
                                   variants.get(t, ()))
                results[f"{w}/{t}"].append(out)
                shown = f"{out['sps']:.0f} steps/s" if "sps" in out else out["error"]
                print(f"repeat {r + 1} {w}/{t}: {shown} (load {out['load_before']})", flush=True)

    summary, rows = {}, []
    for w in args.workloads:
        med = {}
        for t in [*trees, *variants, "sb3"]:
            runs = [x for x in results.get(f"{w}/{t}", []) if "sps" in x]
            if runs:
                parts = {k: common.median([x["seconds_per_iteration"][k] for x in runs])
                         for k in runs[0]["seconds_per_iteration"]} if "seconds_per_iteration" in runs[0] else None
                med[t] = common.median([x["sps"] for x in runs])
                summary[f"{w}/{t}"] = {"sps": [x["sps"] for x in runs], "median_sps": med[t],
                                       "seconds_per_iteration": parts}
                if cpu := [x["cpu_s_per_iteration"] for x in runs if "cpu_s_per_iteration" in x]:
                    summary[f"{w}/{t}"].update(cpu_s_per_iteration=cpu, median_cpu_s_per_iteration=common.median(cpu))
        for t in [t for t in med if t != "ours"]:
            pairs = list(zip(results[f"{w}/ours"], results[f"{w}/{t}"]))
            sps = [a["sps"] / b["sps"] for a, b in pairs if "sps" in a and "sps" in b]
            cpu = [b["cpu_s_per_iteration"] / a["cpu_s_per_iteration"] for a, b in pairs  # > 1: ours needs less CPU
                   if "cpu_s_per_iteration" in a and "cpu_s_per_iteration" in b]
            summary[f"{w}/ours_vs_{t}"] = {"ratio_of_medians": common.ratio(med.get("ours", float("nan")), med[t]),
                                            "median_paired_ratio": common.median(sps) if sps else None,
                                            **({"cpu_paired_ratio": common.median(cpu)} if cpu else {})}
        parts = summary.get(f"{w}/ours", {}).get("seconds_per_iteration")
        share = parts.get("outside") if parts else None
        base_parts = summary.get(f"{w}/base", {}).get("seconds_per_iteration")
        rows.append([w, common.fmt(med.get("ours"), 0), common.fmt(med.get("base"), 0),
                     common.fmt(summary.get(f"{w}/ours_vs_base", {}).get("ratio_of_medians"), 2),
                     common.fmt(med.get("sb3"), 0), common.fmt(summary.get(f"{w}/ours_vs_sb3", {}).get(
                         "ratio_of_medians"), 2),
                     " / ".join(common.fmt(parts[k], 3) for k in ("env", "act", "learn", "other")) if parts else "",
                     common.fmt(share, 2),
                     " / ".join(common.fmt(x.get("outside_env_update") if x else None, 2) for x in (base_parts, parts))])
    common.print_table(f"steady-state steps/s, medians of {args.repeats} round-robin repeats",
                       ["workload", "ours", "base", "ours/base", "SB3", "ours/SB3", "ours env/act/learn/other s",
                        "outside env/forward/update", "outside env/update base / ours"], rows)
    print("\n".join(f"{k}: {v}" for k, v in summary.items() if "/ours_vs_" in k and k.split("_vs_")[1] in variants))
    for k, v in [(k, v) for k, v in summary.items() if "median_cpu_s_per_iteration" in v]:
        paired = summary.get(k.replace("/", "/ours_vs_"), {}).get("cpu_paired_ratio")
        print(f"{k}: {v['median_cpu_s_per_iteration']:.3f} CPU s per iteration (median)"
              + (f"; its CPU / ours', paired median {paired:.3f}" if paired else ""))
    info["loadavg_end"] = common.loadavg()
    info["wall_s"] = time.time() - t0
    common.write_json(args.json, {"benchmark": "small_env_throughput", "command": " ".join([sys.executable] + sys.argv),
                                  "machine": info, "config": vars(args), "summary": summary, "runs": results})


if __name__ == "__main__":
    main()
