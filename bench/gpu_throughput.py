"""Benchmark: PPO, SB3 PPO and IMPALA training steps/s on HackAtari Freeway pixels with 8-64 envs, on whatever device
torch finds (meant for a GPU machine; on CPU it runs the same settings on the CPU).

Settings (every training run is a fresh subprocess, the settings run round-robin with the order rotating every
repeat, until `--budget-s` would be exceeded; the JSON is rewritten after every run so a cut-off call keeps its
results):
- `ppo<N>`: agents.ppo (Nature CNN, CleanRL's Atari hyperparameters, `--num_steps 128`) with N envs, through the
  worker of bench/ppo_throughput.py; steady-state steps/s after `--ppo-warmup` iterations, and the per-iteration
  env / act / learn split from metrics.jsonl;
- `sb3<N>`: Stable-Baselines3 PPO, same hyperparameters, same env stack, torch device `--sb3-device` (default:
  the device ours uses);
- `base_ppo<N>`: agents.ppo from another checkout (`--base-root`, e.g. main before the GPU fixes), for an A/B of
  the fixes in the same call;
- `impala<A>x<E>`: agents.impala with A actor processes x E envs each (batch `--impala-batch` unrolls of 20
  steps), through the worker of bench/impala_throughput.py.
GPU utilisation: nvidia-smi sampled every 0.5 s in the background (mean over each run's measured window).

Run from the repository root:  python bench/gpu_throughput.py --json bench/out/gpu_throughput.json
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)
import impala_throughput  # noqa: E402
import ppo_throughput  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))


class GpuSampler:
    """nvidia-smi utilisation and memory every 0.5 s in a background process (nothing when there is no nvidia-smi)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms",
                 "500"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                util, mem = (float(x) for x in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((time.time(), util, mem))

    def mean(self, t0: float, t1: float) -> dict:
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        if not s:
            return {"gpu_util_pct": None, "gpu_mem_mib_max": None}
        return {"gpu_util_pct": sum(x[1] for x in s) / len(s), "gpu_mem_mib_max": max(x[2] for x in s)}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()


def parse_setting(name: str) -> dict:
    m = re.fullmatch(r"(ppo|sb3|base_ppo)(\d+)", name)
    if m:
        return {"kind": m.group(1), "num_envs": int(m.group(2))}
    m = re.fullmatch(r"impala(\d+)x(\d+)", name)
    if m:
        actors, per = int(m.group(1)), int(m.group(2))
        return {"kind": "impala", "num_envs": actors * per, "actors": actors}
    raise argparse.ArgumentTypeError(f"unknown setting {name!r} (ppo<N>, sb3<N>, base_ppo<N>, impala<A>x<E>)")


def command(args: argparse.Namespace, setting: dict, name: str, out: str, tmp: str) -> tuple[list[str], dict]:
    env = dict(os.environ)
    n = setting["num_envs"]
    if setting["kind"] == "impala":
        steps = args.impala_steps
        cmd = [sys.executable, os.path.join(BENCH, "impala_throughput.py"), "--worker", f"impala_a{setting['actors']}",
               "--worker-out", out, "--tmp", tmp, "--run-name", name, "--steps", str(steps), "--num-envs", str(n),
               "--unroll-length", "20", "--batch-size", str(args.impala_batch), "--env-id", args.env_id,
               "--seed", str(args.seed)]
        return cmd, env
    root = common.REPO_ROOT
    if setting["kind"] == "base_ppo":
        root = os.path.abspath(args.base_root)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.join(root, "bench", "ppo_throughput.py"),
           "--worker", "sb3" if setting["kind"] == "sb3" else "ours", "--worker-out", out, "--tmp", tmp,
           "--run-name", name, "--iterations", str(args.ppo_iterations), "--num-envs", str(n), "--num-steps", "128",
           "--env-id", args.env_id, "--seed", str(args.seed)]
    if setting["kind"] == "sb3":
        cmd += ["--sb3-device", args.sb3_device]
    return cmd, env


def analyse(args: argparse.Namespace, setting: dict, run: dict) -> dict:
    if setting["kind"] == "impala":
        a = impala_throughput.steady(f"impala_a{setting['actors']}", run, args.impala_steps // 4)
        its = run["iterations"]
        w = next((i for i, it in enumerate(its) if it["global_step"] >= args.impala_steps // 4), 0)
        a["window"] = (its[min(w, len(its) - 2)]["time"], its[-1]["time"])
        return a
    a = ppo_throughput.steady(run, args.ppo_warmup)
    per = a.pop("per_iteration")
    a["split_s"] = {c: common.median([p[c] for p in per]) for c in ("wall", "env", "act", "learn", "other")}
    its = run["iterations"]
    a["window"] = (its[max(1, min(args.ppo_warmup, len(its) - 1)) - 1]["end"], its[-1]["end"])
    return a


def summarize(results: dict) -> dict:
    out = {}
    for name, runs in results.items():
        sps = [r["analysis"]["sps"] for r in runs]
        if not sps:
            continue
        row = {"n": len(sps), "sps": sps, "median_sps": common.median(sps),
               "gpu_util_pct": common.median([r["gpu"]["gpu_util_pct"] for r in runs
                                              if r["gpu"]["gpu_util_pct"] is not None]),
               "wall_s": common.median([r["analysis"]["wall_total_s"] for r in runs])}
        if "split_s" in runs[0]["analysis"]:
            row["split_s"] = {c: common.median([r["analysis"]["split_s"][c] for r in runs])
                              for c in runs[0]["analysis"]["split_s"]}
        if "learner_utilisation" in runs[0]["analysis"]:
            row["learner_utilisation"] = common.median([r["analysis"]["learner_utilisation"] for r in runs])
            row["actor_utilisation"] = common.median([r["analysis"]["actor_utilisation"] for r in runs])
        out[name] = row
    for name in list(out):
        m = re.fullmatch(r"ppo(\d+)", name)
        if m and f"sb3{m.group(1)}" in out:
            out[name]["vs_sb3"] = out[name]["median_sps"] / out[f"sb3{m.group(1)}"]["median_sps"]
        if m and f"base_ppo{m.group(1)}" in out:
            out[name]["vs_base"] = out[name]["median_sps"] / out[f"base_ppo{m.group(1)}"]["median_sps"]
    return out


def report(summary: dict, device: str) -> None:
    rows = []
    for name, r in summary.items():
        split = r.get("split_s")
        detail = (f"env {split['env']:.2f} / act {split['act']:.2f} / learn {split['learn']:.2f} / "
                  f"other {split['other']:.2f} of {split['wall']:.2f}" if split else
                  f"learner busy {r['learner_utilisation'] * 100:.0f}%, actors busy {r['actor_utilisation'] * 100:.0f}%"
                  if "learner_utilisation" in r else "")
        ratio = " ".join(f"{k.removeprefix('vs_')} {r[k]:.2f}" for k in ("vs_sb3", "vs_base") if k in r)
        rows.append([name, r["n"], common.fmt(r["median_sps"]), " ".join(f"{x:.0f}" for x in r["sps"]), ratio,
                     common.fmt(r["gpu_util_pct"], 0), detail, common.fmt(r["wall_s"])])
    common.print_table(f"training steps/s on {device}, HackAtari Freeway pixels (steady state, medians)",
                       ["setting", "n", "median steps/s", "per run", "ratio", "GPU util %",
                        "seconds per iteration: env / act / learn / other", "run wall s"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", default=["ppo8", "sb38", "ppo16", "sb316", "ppo32", "sb332", "ppo64",
                                                     "sb364", "impala8x4", "impala15x4"],
                   help="ppo<N>, sb3<N>, base_ppo<N>, impala<A>x<E> (default: ppo and sb3 at 8 16 32 64 envs, "
                        "impala 8x4 15x4)")
    p.add_argument("--env-id", default="ALE/Freeway-v5")
    p.add_argument("--ppo-iterations", type=int, default=6, help="PPO iterations per run (128 steps x N envs each)")
    p.add_argument("--ppo-warmup", type=int, default=2, help="first PPO iterations left out of steady-state steps/s")
    p.add_argument("--impala-steps", type=int, default=40960, help="env steps per IMPALA run (first quarter warm-up)")
    p.add_argument("--impala-batch", type=int, default=8, help="IMPALA unrolls per update")
    p.add_argument("--sb3-device", default=None, help="SB3's torch device (default: cuda when there is one)")
    p.add_argument("--base-root", default=None, help="checkout whose agents.ppo the base_ppo<N> settings run")
    p.add_argument("--repeats", type=int, default=2, help="round-robin repeats at most")
    p.add_argument("--budget-s", type=float, default=540.0, help="start no run after this many seconds, roughly")
    p.add_argument("--run-timeout", type=int, default=300, help="seconds before a training run is killed")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the results as JSON to this path (rewritten after every run)")
    args = p.parse_args()
    names = args.settings
    try:
        settings = {n: parse_setting(n) for n in names}
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if any(s["kind"] == "base_ppo" for s in settings.values()) and not args.base_root:
        p.error("base_ppo<N> settings need --base-root")

    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    args.sb3_device = args.sb3_device or ("cuda" if torch.cuda.is_available() else "cpu")
    info = common.machine_info()
    info["device"] = device
    print(f"device: {device}; settings: {' '.join(names)}; up to {args.repeats} repeats in {args.budget_s:.0f} s",
          flush=True)
    tmp = tempfile.mkdtemp(prefix="gpu_bench_")
    results: dict[str, list] = {n: [] for n in names}
    failures: list[dict] = []
    gpu = GpuSampler()
    t_start, durations = time.time(), {}
    try:
        for rep in range(args.repeats):
            order = common.rotation(names, rep)
            for name in order:
                expected = durations.get(name, 60.0)
                if time.time() - t_start + expected > args.budget_s:
                    print(f"  skip {name} r{rep}: budget", flush=True)
                    continue
                run_name = f"{name}_r{rep}"
                out, log = os.path.join(tmp, run_name + ".json"), os.path.join(tmp, run_name + ".log")
                cmd, env = command(args, settings[name], run_name, out, tmp)
                t = time.time()
                run = common.run_worker(cmd, run_name, log, out, args.run_timeout, failures, env=env)
                durations[name] = time.time() - t
                if run is None:
                    continue
                run["analysis"] = analyse(args, settings[name], run)
                run["gpu"] = gpu.mean(*run["analysis"]["window"])
                results[name].append(run)
                a = run["analysis"]
                split = a.get("split_s")
                print(f"  r{rep} {name:<12} {a['sps']:8.1f} steps/s  GPU {run['gpu']['gpu_util_pct'] or 0:3.0f}%  "
                      + (f"env/act/learn {split['env']:.2f}/{split['act']:.2f}/{split['learn']:.2f} s  " if split else
                         f"learner {a['learner_utilisation'] * 100:.0f}% actors {a['actor_utilisation'] * 100:.0f}%  ")
                      + f"(run {durations[name]:.0f} s, load {common.loadavg()})", flush=True)
                common.write_json(args.json, {"benchmark": "gpu_throughput", "machine": info, "config": vars(args),
                                              "summary": summarize(results), "failures": failures,
                                              "runs": {k: [{kk: vv for kk, vv in r.items() if kk != "iterations"}
                                                           for r in v] for k, v in results.items()}})
    finally:
        gpu.close()
        shutil.rmtree(tmp, ignore_errors=True)
    info["wall_s"] = time.time() - t_start
    common.print_machine(info)
    report(summarize(results), device)
    print(f"wall time: {info['wall_s']:.0f} s; {len(failures)} failed run(s)")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
