"""PPO_CBP's overhead: training steps/s of PPO_CBP vs PPO on HackAtari Freeway, same settings, back to back.

    python bench/cbp_overhead.py [--iterations 6] [--repeats 3]

Both run CleanRL's defaults (8 envs x 128 steps, 4 epochs x 4 minibatches); PPO_CBP with the paper's RL preset
(--replacement_rate 1e-4 --maturity_threshold 10000 would never replace anything in a short run, so the benchmark
uses --maturity_threshold 10 to make replacements happen and be paid for). Steady-state steps/s from the
iteration timestamps in metrics.jsonl, excluding the first iteration; repeats alternate the order; medians.
Target: PPO_CBP >= 0.85x PPO.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

KINDS = {
    "PPO": ["--architecture", "PPO"],
    "PPO_CBP": ["--architecture", "PPO_CBP", "--replacement_rate", "1e-4", "--maturity_threshold", "10"],
}


def steady_sps(run_dir: str, warmup: int = 1) -> tuple[float, int]:
    its = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"iteration"' in line]
    steps = its[-1]["global_step"] - its[warmup - 1]["global_step"]
    replaced = 0
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        rec = json.loads(line)
        if rec["kind"] == "plasticity":
            replaced = sum(v for k, v in rec.items() if k.startswith("plasticity/replaced/"))
    return steps / (its[-1]["time"] - its[warmup - 1]["time"]), replaced


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    info = common.machine_info()
    sps: dict[str, list[float]] = {k: [] for k in KINDS}
    replaced: dict[str, list[int]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            order = list(KINDS) if rep % 2 == 0 else list(KINDS)[::-1]
            for kind in order:
                name = f"{kind}_{rep}"
                subprocess.run([sys.executable, "continual_training_example.py", "--env_id", "ALE/Freeway-v5",
                                "--total_timesteps", str(a.iterations * 1024), "--runs_dir", tmp, "--run_name", name,
                                "--no-progress-bar", "--diagnostics_every", str(a.iterations * 1024 - 1),
                                *KINDS[kind]], cwd=common.REPO_ROOT, check=True, stdout=subprocess.DEVNULL,
                               env={**os.environ, "WANDB_MODE": "disabled"})
                rate, n = steady_sps(os.path.join(tmp, name))
                sps[kind].append(rate)
                replaced[kind].append(n)
                print(f"repeat {rep + 1} {kind:8s} {rate:7.1f} steps/s (units replaced: {n})", flush=True)
    med = {k: common.median(v) for k, v in sps.items()}
    common.print_table("PPO_CBP overhead on HackAtari Freeway (8 envs x 128 steps)", ["run", "median steps/s",
                       "runs", "ratio vs PPO"],
                       [[k, common.fmt(med[k]), len(sps[k]), f"{med[k] / med['PPO']:.3f}"] for k in KINDS])
    print(f"machine: {info['cpu_model']}, {info['nproc']} cores, load at start {info['loadavg_start']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": info, "sps": sps, "median": med, "replaced": replaced,
                       "ratio": med["PPO_CBP"] / med["PPO"]}, f, indent=1)


if __name__ == "__main__":
    main()
