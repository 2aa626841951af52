"""Benchmark: the cost of continual evaluation on the default config (run_config.json and its eval settings).

The same seeded training run, short budget, with the config's evaluation settings ("with") and with `--eval_every 0
--no-eval_at_switches` ("without"), alternating which goes first. Reported per run: wall time of the process, the
run's own total and evaluation seconds (metrics.jsonl `eval_summary`: evaluation seconds spent by the training
process / total seconds = `eval/time_share`), the number of evaluation rounds; then

- wall ratio with / without (noisy on a shared machine: other processes' load changes between runs);
- the measured evaluation time share of the short run;
- the full-run estimate: rounds_full x (evaluation seconds per round) / (that + training seconds per step x total
  steps), with the round cost and the per-step training cost measured here (the short budget has more rounds per
  step than the full run: step 0 and the end are always evaluated);
- whether the training records (episodes, losses, switches) of both runs are identical (they must be).

    python bench/eval_overhead.py [--config run_config.json] [--budget 16384] [--repeats 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


def read_records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def training_records(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("time", "charts/SPS") and not k.startswith("time/")}
            for r in records if r["kind"] in ("episode", "iteration", "switch")]


def run_once(config: str, budget: int, seed: int, tmp: str, name: str, with_eval: bool) -> dict:
    argv = [sys.executable, "continual_training_example.py", "--config", config, "--total_timesteps", str(budget),
            "--runs_dir", tmp, "--run_name", name, "--no-progress-bar", "--seed", str(seed), "--no-plots"]
    if not with_eval:
        argv += ["--eval_every", "0", "--no-eval_at_switches"]
    t0 = time.time()
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, env={**os.environ,
                                                                                    "WANDB_MODE": "offline"})
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    run_dir = os.path.join(tmp, name)
    records = read_records(run_dir)
    iters = [r for r in records if r["kind"] == "iteration"]
    summary = next((r for r in records if r["kind"] == "eval_summary"), None)
    rounds = len({r["global_step"] for r in records if r["kind"] == "eval"})
    out = {"name": name, "with_eval": with_eval, "wall_s": wall,
           "train_s": sum(r["time/env_s"] + r["time/act_s"] + r["time/learn_s"] for r in iters),
           **{f"{k}_s": sum(r[f"time/{k}_s"] for r in iters) for k in ("env", "act", "learn")},
           "iterations": len(iters), "rounds": rounds, "records": training_records(records),
           "loadavg": os.getloadavg()[0]}
    if summary:
        out.update(eval_s=summary["eval_seconds"], total_s=summary["total_seconds"], time_share=summary["time_share"])
    config_json = json.load(open(os.path.join(run_dir, "config.json")))
    out["config"] = {k: config_json.get(k) for k in ("eval_every", "eval_episodes", "eval_max_episode_steps",
                                                     "eval_num_envs", "eval_greedy", "eval_background", "num_envs",
                                                     "num_steps", "possible_modifications")}
    return out


def full_run_rounds(total: int, every: int, granularity: int) -> int:
    """Step 0, the first iteration end at or after every multiple of `every`, and the end."""
    steps = {0, total}
    last = 0
    for s in range(granularity, total + 1, granularity):
        if every and s // every != last // every:
            steps.add(s)
        last = s
    return len(steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="run_config.json")
    p.add_argument("--budget", type=int, default=16384, help="agent steps per run")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    from continual.config.loading import parse_args
    from continual.training.startup import build_factory, resolve_total

    args, curriculum = parse_args(["--config", a.config])
    if not args.eval_every:
        raise SystemExit(f"{a.config} does not turn continual evaluation on (eval_every)")
    granularity = args.rollout_size()
    full_total = resolve_total(args, build_factory(args, curriculum, granularity), granularity)
    tmp = tempfile.mkdtemp(prefix="eval_overhead_")
    results = []
    try:
        for rep in range(a.repeats):
            order = [True, False] if rep % 2 == 0 else [False, True]
            for with_eval in order:
                name = f"{'with' if with_eval else 'without'}_{rep}"
                print(f"running {name} ({a.budget} steps)...", flush=True)
                results.append(run_once(a.config, a.budget, a.seed, tmp, name, with_eval))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    withs = [r for r in results if r["with_eval"]]
    withouts = [r for r in results if not r["with_eval"]]
    identical = all(w["records"] == withouts[0]["records"] for w in withs + withouts)
    wall_ratio = sum(r["wall_s"] for r in withs) / sum(r["wall_s"] for r in withouts)
    share = sum(r["eval_s"] for r in withs) / sum(r["total_s"] for r in withs)
    per_round = sum(r["eval_s"] for r in withs) / sum(r["rounds"] for r in withs)
    per_step = sum(r["train_s"] for r in withouts) / sum(r["iterations"] * granularity for r in withouts)
    rounds_full = full_run_rounds(full_total, args.eval_every, granularity)
    full_share = rounds_full * per_round / (rounds_full * per_round + per_step * full_total)
    print(f"\n{'run':<12}{'wall s':>9}{'in-run s':>10}{'eval s':>9}{'share':>8}{'rounds':>8}{'train s':>9}"
          f"{'env s':>8}{'act s':>8}{'learn s':>9}{'load':>7}")
    for r in results:
        print(f"{r['name']:<12}{r['wall_s']:>9.1f}{r.get('total_s', float('nan')):>10.1f}"
              f"{r.get('eval_s', 0):>9.1f}{100 * r.get('time_share', 0):>7.1f}%{r['rounds']:>8}"
              f"{r['train_s']:>9.1f}{r['env_s']:>8.1f}{r['act_s']:>8.1f}{r['learn_s']:>9.1f}{r['loadavg']:>7.2f}")
    print(f"\nsettings: {withs[0]['config']}")
    print(f"wall ratio with/without: {wall_ratio:.3f}; evaluation time share (short run): {100 * share:.1f}%")
    print(f"evaluation round: {per_round:.1f} s; training: {1000 * per_step:.2f} ms/step")
    print(f"full run estimate ({full_total} steps, {rounds_full} rounds): evaluation share {100 * full_share:.1f}%")
    print(f"training records identical with and without evaluation: {identical}")
    if a.json:
        for r in results:
            r.pop("records")
        with open(a.json, "w") as f:
            json.dump({"budget": a.budget, "results": results, "wall_ratio": wall_ratio, "short_share": share,
                       "round_s": per_round, "train_ms_per_step": 1000 * per_step, "full_rounds": rounds_full,
                       "full_share_estimate": full_share, "identical_training": identical}, f, indent=2)


if __name__ == "__main__":
    main()
