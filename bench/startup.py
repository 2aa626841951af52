"""Benchmark: what a training process costs before and around its first iteration, this tree against a git revision.

Every test that trains in a subprocess, every launcher entry, IMPALA actor and background evaluator pays the
start-up (imports, flag parsing, env construction) once; on a 2-core machine the suite runs hundreds of them. Each
workload is one short process of `continual_training_example.py`, run from this tree and from a worktree of
`--base` in turn, `--repeats` times with the order rotating; reported per workload and tree: the medians of the
process tree's CPU seconds and wall seconds, and the base/ours ratios of the medians.

Workloads (`--workloads`):
  help               `--help` (imports and the flag parser only)
  bad_flag           an out-of-range flag value: the one-line error and exit 2 that tests check
  minatar_ppo        configs/minatar_ppo.json on MinAtar Breakout, one 8,192-step iteration, no evaluation
  cartpole_ppo       PPO defaults on CartPole-v1, one 1,024-step iteration, no evaluation

    python bench/startup.py --base f337c45 --repeats 5 --json bench/results/startup.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

NO_EVAL = ["--eval_every", "0"]
WORKLOADS = {
    "help": (["--help"], 0),
    "bad_flag": (["--backend", "Gymnasium", "--env_id", "CartPole-v1", "--num_envs", "0"], 2),
    "minatar_ppo": (["--config", "configs/minatar_ppo.json", "--env_id", "MinAtar/Breakout", "--total_timesteps",
                     "8192", *NO_EVAL], 0),
    "cartpole_ppo": (["--backend", "Gymnasium", "--env_id", "CartPole-v1", "--total_timesteps", "1024", *NO_EVAL], 0),
}


def run_one(tree: str, workload: str, tmp: str, tag: str) -> dict:
    flags, expected_rc = WORKLOADS[workload]
    cmd = (common.train_command(flags, os.path.join(tmp, "runs"), tag) if expected_rc == 0 and "--help" not in flags
           else [sys.executable, "continual_training_example.py", *flags])
    out = common.run(cmd, cwd=tree, check=False, sample_load=True, expect_rc=expected_rc)
    if out["rc"] != expected_rc:
        return {"error": f"exit {out['rc']} (expected {expected_rc})", "load_before": out["loadavg_start"]}
    return {"cpu_s": out["cpu_s"], "wall_s": out["wall_s"], "load_before": out["loadavg_start"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--base", required=True, help="the git revision measured against (its worktree)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the results as JSON here")
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    sha = common.revision_or_exit(p, args.base)
    info = common.machine_info()
    common.print_machine(info)
    tmp = tempfile.mkdtemp(prefix="startup_")
    kinds = [(w, t) for w in args.workloads for t in ("ours", "base")]
    results: dict = {f"{w}/{t}": [] for w, t in kinds}
    t0 = time.time()
    with common.revision_tree(sha, tmp) as base_tree:
        trees = {"ours": common.REPO_ROOT, "base": base_tree}
        for r in range(args.repeats):
            for w, t in common.rotation(kinds, r):
                out = run_one(trees[t], w, tmp, f"{w}_{t}_{r}")
                results[f"{w}/{t}"].append(out)
                shown = f"{out['cpu_s']:.2f} CPU s, {out['wall_s']:.2f} s" if "cpu_s" in out else out["error"]
                print(f"repeat {r + 1} {w}/{t}: {shown} (load {out['load_before']})", flush=True)

    summary, rows = {}, []
    for w in args.workloads:
        med = {}
        for t in ("ours", "base"):
            ok = [x for x in results[f"{w}/{t}"] if "cpu_s" in x]
            med[t] = {k: common.median([x[k] for x in ok]) for k in ("cpu_s", "wall_s")} if ok else None
        both = med["ours"] and med["base"]
        summary[w] = {**med, "base_over_ours_cpu": common.ratio(med["base"]["cpu_s"], med["ours"]["cpu_s"]) if both
                      else None, "base_over_ours_wall": common.ratio(med["base"]["wall_s"], med["ours"]["wall_s"])
                      if both else None}
        rows.append([w, *(common.fmt(med[t][k], 2) if med[t] else "-" for t in ("ours", "base")
                          for k in ("cpu_s", "wall_s")),
                     common.fmt(summary[w]["base_over_ours_cpu"], 2), common.fmt(summary[w]["base_over_ours_wall"], 2)])
    common.print_table(f"start-up, medians of {args.repeats} round-robin repeats ({time.time() - t0:.0f} s)",
                       ["workload", "ours CPU s", "ours wall s", f"{args.base} CPU s", f"{args.base} wall s",
                        "base/ours CPU", "base/ours wall"], rows)
    common.write_json(args.json, {"machine": info, "base": args.base, "base_sha": sha, "repeats": args.repeats,
                                  "summary": summary, "runs": results})


if __name__ == "__main__":
    main()
