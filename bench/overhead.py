"""Overhead of training options: steps/s of each variant vs a plain run of the same agent, same settings, run round
robin in one invocation (each repeat runs every variant once, the order rotating), so each ratio compares runs made
minutes apart on the same machine load.

    python bench/overhead.py --preset plasticity [--iterations 8] [--repeats 3] [--json out.json]
    python bench/overhead.py --base "--backend MinAtar --env_id MinAtar/Breakout" \\
        --variant plain= --variant "redo=--redo --redo_every 2048"

Each run is a fresh `continual_training_example.py` process (its own run directory under a temporary folder);
steady-state steps/s from the iteration timestamps in metrics.jsonl, excluding the first iteration (start-up). The
ratio of a variant is the median over repeats of (variant steps/s / plain steps/s of the same repeat); the first
variant is the baseline. Also the training process's CPU seconds (user + system, from /proc, read when the first
and the last iteration are logged: start-up excluded) per 1000 steps, and their ratio: on a loaded machine
wall-clock rates swing with the other jobs, CPU time much less. Envs stepped in worker processes (Atari's async
vector env) are not in that count: use it for in-process envs (MinAtar, Gymnasium). Run it under `nice -n 19` on a
shared machine and report the load it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MINATAR_BREAKOUT = ("--backend MinAtar --env_id MinAtar/Breakout --num_envs 8 --num_steps 128 "
                    "--checkpoint_minutes 0 --no-metrics")
# each method at its defaults; the ones that act at switches act on an interval here (a plain env has no switches):
# every 2 iterations, to show their cost at a high frequency
PRESETS = {
    "plasticity": (MINATAR_BREAKOUT, {
        "PPO": "",
        "ReDo (every 2048 steps)": "--redo --redo_every 2048",
        "L2": "--l2",
        "L2 Init": "--l2_init",
        "Parseval": "--parseval",
        "LayerNorm": "--layer_norm",
        "CReLU": "--activation crelu",
        "Fourier features": "--activation fourier",
        "reset last layer (every 2048 steps)": "--reset_layers 1 --reset_every 2048",
        "NaP": "--nap",
        "TRAC": "--trac",
        "plasticity injection (once, at half the run)": "--plasticity_injection step",
        "plasticity injection (every 2048 steps)": "--plasticity_injection every --injection_every 2048",
        "all combinable: ReDo+L2 Init+Parseval+LN": "--redo --redo_every 2048 --l2_init --parseval --layer_norm",
    }),
}


def steady_sps(run_dir: str, warmup: int = 1) -> float:
    its = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"iteration"' in line]
    steps = its[-1]["global_step"] - its[warmup - 1]["global_step"]
    return steps / (its[-1]["time"] - its[warmup - 1]["time"])


def iteration_ticks(proc: subprocess.Popen, metrics: str, iterations: int) -> tuple[float, float]:
    """The process's CPU clock ticks when its first and its last iteration records appear in `metrics`."""
    seen, marks = 0, []
    while len(marks) < 2 and proc.poll() is None:
        try:
            with open(metrics, encoding="utf-8") as f:
                n = sum('"iteration"' in line for line in f)
        except OSError:
            n = 0
        if n != seen and (n == 1 or n == iterations):
            marks.append(common._proc_ticks(proc.pid))
        seen = n
        time.sleep(0.02)
    if len(marks) < 2 or None in marks:
        raise SystemExit("error: the run ended before its iterations could be timed")
    return marks[0], marks[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default=None)
    p.add_argument("--base", default=None, help="flags every run gets (a preset's if not given)")
    p.add_argument("--variant", action="append", default=[], help="NAME=FLAGS; the first is the baseline")
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    base, variants = PRESETS[a.preset] if a.preset else ("", {})
    base = a.base if a.base is not None else base
    if a.variant:
        variants = dict(v.split("=", 1) for v in a.variant)
    if not variants:
        p.error("give --preset or --variant NAME=FLAGS")
    names = list(variants)
    info = common.machine_info()
    sps: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}  # CPU s per 1000 steps, whole process
    t0, cpu0 = time.time(), os.times()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                run = f"v{names.index(name)}_{rep}"
                # steps: one iteration per rollout of the base flags' num_envs x num_steps (8 x 128 by default)
                flags = shlex.split(base) + shlex.split(variants[name])
                envs = int(flags[flags.index("--num_envs") + 1]) if "--num_envs" in flags else 8
                steps = int(flags[flags.index("--num_steps") + 1]) if "--num_steps" in flags else 128
                proc = subprocess.Popen([sys.executable, "continual_training_example.py", *flags, "--total_timesteps",
                                         str(a.iterations * envs * steps), "--runs_dir", tmp, "--run_name", run,
                                         "--no-progress-bar"], cwd=common.REPO_ROOT, stdout=subprocess.DEVNULL,
                                        env={**os.environ, "WANDB_MODE": "disabled"})
                ticks = iteration_ticks(proc, os.path.join(tmp, run, "metrics.jsonl"), a.iterations)
                if proc.wait() != 0:
                    raise SystemExit(f"error: run {name!r} exited with {proc.returncode}")
                sps[name].append(steady_sps(os.path.join(tmp, run)))
                used = (ticks[1] - ticks[0]) / os.sysconf("SC_CLK_TCK")
                cpu[name].append(1000.0 * used / ((a.iterations - 1) * envs * steps))
                print(f"repeat {rep + 1} {name:45s} {sps[name][-1]:8.1f} steps/s {cpu[name][-1]:6.3f} CPU s/1k steps "
                      f"(load {common.loadavg()})", flush=True)
    ratios = {k: [v / b for v, b in zip(sps[k], sps[names[0]])] for k in names}
    cpu_ratios = {k: [v / b for v, b in zip(cpu[k], cpu[names[0]])] for k in names}
    med = {k: common.median(v) for k, v in sps.items()}
    common.print_table(f"overhead vs {names[0]} ({base})", ["variant", "median steps/s", "runs", "steps/s ratio "
                       "(median of same-repeat ratios)", "min", "max", "CPU s / 1k steps", "CPU ratio (median)"],
                       [[k, common.fmt(med[k]), len(sps[k]), f"{common.median(ratios[k]):.3f}",
                         f"{min(ratios[k]):.3f}", f"{max(ratios[k]):.3f}", f"{common.median(cpu[k]):.3f}",
                         f"{common.median(cpu_ratios[k]):.3f}"] for k in names])
    end = os.times()
    child_cpu = end.children_user + end.children_system - cpu0.children_user - cpu0.children_system
    print(f"machine: {info['cpu_model']}, {info['nproc']} cores, load at start {info['loadavg_start']}, at end "
          f"{common.loadavg()}; wall {time.time() - t0:.0f} s, CPU {child_cpu:.0f} s")
    if a.json:
        common.write_json(a.json, {"machine": info, "base": base, "variants": variants, "sps": sps, "median": med,
                                   "ratios": ratios, "cpu_per_1k_steps": cpu,
                                   "cpu_ratios": cpu_ratios, "load_end": common.loadavg(), "cpu_s": child_cpu})


if __name__ == "__main__":
    main()
