"""Report: wall time for PPO to learn MinAtar, new settings against a baseline's 1M-step return.

Reads finished runs (their metrics.jsonl): `--baseline DIR...` (e.g. the Atari-settings PPO of an older revision,
1M steps) and `--ours DIR...` (e.g. `configs/experiments/minatar_ppo_1m.json`'s runs). Per game:
- the baseline's 1M-step return R: the mean of its training episodes in the last 10% of its steps, averaged over
  seeds (each seed's value shown);
- for each of our runs, the first step at which the mean return of its training episodes in the preceding
  `--window` steps reaches R, and the wall time to that step (from the run's first record, start-up included);
- the baseline's wall time to its last step; ratios of steps and of wall times (medians over seeds).
Wall times are only comparable when the runs shared a machine and its load: the report prints each run's mean
charts/SPS so a reader can see it, and the step ratio x a quiet same-run steps/s ratio (bench/small_env_throughput.py)
gives the load-free estimate.

    python bench/minatar_wall_time.py --baseline /work/baseline_runs/Breakout_s* --ours EXP/runs/*Breakout* --game Breakout
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def load(run_dir: str) -> dict:
    records = common.metrics(run_dir)
    episodes = [(r["global_step"], r["return"]) for r in records if r["kind"] == "episode"]
    its = [r for r in records if r["kind"] == "iteration"]
    if not its:
        raise SystemExit(f"error: {run_dir}: no iterations in metrics.jsonl")
    return {"episodes": episodes, "iterations": [(r["global_step"], r["time"]) for r in its],
            "start": records[0]["time"], "last_step": its[-1]["global_step"],
            "sps": common.median([r["charts/SPS"] for r in its if "charts/SPS" in r])}


def final_return(run: dict, fraction: float = 0.1) -> float:
    cut = run["last_step"] * (1 - fraction)
    tail = [ret for step, ret in run["episodes"] if step > cut]
    return sum(tail) / len(tail)


def time_to(run: dict, target: float, window: int) -> tuple[int | None, float | None]:
    """The first iteration end whose preceding `window` steps' training episodes average >= target."""
    eps = run["episodes"]
    lo = 0
    total, count = 0.0, 0
    hi = 0
    for step, t in run["iterations"]:
        while hi < len(eps) and eps[hi][0] <= step:
            total, count, hi = total + eps[hi][1], count + 1, hi + 1
        while lo < hi and eps[lo][0] <= step - window:
            total, count, lo = total - eps[lo][1], count - 1, lo + 1
        if step >= window and count and total / count >= target:
            return step, t - run["start"]
    return None, None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", nargs="+", required=True)
    p.add_argument("--ours", nargs="+", required=True)
    p.add_argument("--game", default="")
    p.add_argument("--window", type=int, default=100_000)
    args = p.parse_args()
    base = [load(d) for d in args.baseline]
    ours = [load(d) for d in args.ours]
    per_seed = [final_return(b) for b in base]
    target = sum(per_seed) / len(per_seed)
    base_wall = [b["iterations"][-1][1] - b["start"] for b in base]
    rows = []
    reached = []
    for d, run in zip(args.ours, ours):
        step, wall = time_to(run, target, args.window)
        reached.append((step, wall))
        rows.append([os.path.basename(d), common.fmt(final_return(run), 2), step if step else "not reached",
                     common.fmt(wall, 0), common.fmt(run["sps"], 0)])
    for d, run, w in zip(args.baseline, base, base_wall):
        rows.append([f"baseline {os.path.basename(d)}", common.fmt(final_return(run), 2), run["last_step"],
                     common.fmt(w, 0), common.fmt(run["sps"], 0)])
    common.print_table(f"{args.game}: baseline 1M return {target:.2f} (seeds: "
                       f"{', '.join(f'{x:.2f}' for x in per_seed)}), window {args.window} steps",
                       ["run", "final return (last 10%)", "step reaching it", "wall s to it", "median SPS"], rows)
    steps = [s for s, _ in reached if s]
    walls = [w for _, w in reached if w]
    if len(steps) == len(ours):
        step_ratio = common.median(steps) / common.median([b["last_step"] for b in base])
        wall_ratio = common.median(walls) / common.median(base_wall)
        sps_ratio = common.median([r["sps"] for r in ours]) / common.median([b["sps"] for b in base])
        print(f"steps to the baseline's 1M return: median {common.median(steps):.0f} = {step_ratio:.3f} of the "
              f"baseline's; wall time {wall_ratio:.3f} of the baseline's (median SPS ratio in these runs "
              f"{sps_ratio:.2f})")
    else:
        print(f"{len(ours) - len(steps)} of our runs did not reach the baseline's 1M return")


if __name__ == "__main__":
    main()
