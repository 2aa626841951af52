"""Benchmark: the working tree against a git revision, same run, round-robin (a code change's speed A/B).

Checks out `--base` (default HEAD: the last commit, so uncommitted changes are what is measured) into a temporary git
worktree and runs `bench/ppo_throughput.py --repeats 1` from each tree in turn, `--repeats` times, alternating which
tree goes first. Each call is a fresh process, so each tree's own `agents/` and `continual/` are measured (the bench's
`common.py` puts its tree's root first on sys.path); both use this Python and its installed packages.

    python bench/ab_revisions.py --kinds ours ours_bf16 --repeats 3 --iterations 12 --json bench/out/ab.json
    python bench/ab_revisions.py --base 04a22c9 --kinds ours        # the working tree against an older commit

Reports per kind: each tree's steady-state steps/s per repeat, their medians, the ratio of medians and the median of
the paired ratios (same repeat), each tree's learn/act/env seconds per iteration, and the load around every call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ppo_throughput  # noqa: E402  (its run kinds)

ROOT = common.REPO_ROOT
PARTS = ("learn", "act", "env")
KINDS = ppo_throughput.KINDS + ppo_throughput.EXTRA_KINDS + ppo_throughput.THREAD_KINDS


def run_tree(tree: str, kinds: list[str], iterations: int, out: str, extra: list[str]) -> dict:
    cmd = [sys.executable, os.path.join(tree, "bench", "ppo_throughput.py"), "--kinds", *kinds, "--repeats", "1",
           "--iterations", str(iterations), "--json", out, *extra]
    load = common.loadavg()
    if common.run(cmd, cwd=tree, check=False)["rc"] != 0:
        raise SystemExit(f"error: ppo_throughput.py failed in {tree} (its output's tail is above)")
    with open(out, encoding="utf-8") as f:
        data = json.load(f)
    s = data["summary"]
    return {"load_before": load, "sps": s["median_sps"], "foreign_cores": s["foreign_cores"],
            "breakdown": {k: {part: v[part]["median_s"] for part in PARTS}
                          for k, v in s["breakdown"].items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="HEAD", help="git revision measured against the working tree")
    p.add_argument("--kinds", nargs="+", default=["ours"], choices=KINDS, help="bench/ppo_throughput.py run kinds")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=12, help="PPO iterations per training run")
    p.add_argument("--json", help="write the results as JSON to this path")
    args, extra = p.parse_known_args()  # the rest goes to ppo_throughput.py (e.g. --env-id)
    if args.repeats < 1 or args.iterations < 3:
        p.error("--repeats must be >= 1 and --iterations >= 3 (2 warm-up iterations are excluded)")
    base_sha = common.revision_or_exit(p, args.base)

    info = common.machine_info()
    common.print_machine(info)
    tmp = tempfile.mkdtemp(prefix="ab_revisions_")
    runs: dict[str, list[dict]] = {"base": [], "work": []}
    t0 = time.time()
    with common.revision_tree(base_sha, tmp) as base_tree:
        trees = {"base": base_tree, "work": ROOT}
        for r in range(args.repeats):
            order = common.rotation(["base", "work"], r)
            for name in order:
                out = os.path.join(tmp, f"{name}_{r}.json")
                runs[name].append(run_tree(trees[name], args.kinds, args.iterations, out, extra))
                print(f"repeat {r + 1} {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in runs[name][-1]["sps"].items())
                      + f" steps/s (load {runs[name][-1]['load_before']})", flush=True)

    summary = {}
    rows = []
    for k in args.kinds:
        b = [run["sps"][k] for run in runs["base"]]
        w = [run["sps"][k] for run in runs["work"]]
        paired = [wi / bi for wi, bi in zip(w, b)]
        parts = {name: {part: common.median([run["breakdown"][k][part] for run in runs[name]])
                        for part in PARTS} for name in runs}
        summary[k] = {"base_sps": b, "work_sps": w, "ratio_of_medians": common.ratio(common.median(w), common.median(b)),
                      "median_paired_ratio": common.median(paired), "seconds_per_iteration": parts}
        rows.append([k, common.fmt(common.median(b), 0), common.fmt(common.median(w), 0),
                     common.fmt(summary[k]["ratio_of_medians"], 3), common.fmt(summary[k]["median_paired_ratio"], 3),
                     " / ".join(common.fmt(parts["base"][x], 2) for x in PARTS),
                     " / ".join(common.fmt(parts["work"][x], 2) for x in PARTS)])
    common.print_table(f"working tree vs {args.base} ({base_sha[:8]}), medians of {args.repeats} round-robin repeats",
                       ["kind", "base steps/s", "work steps/s", "work/base", "paired", "base learn/act/env s",
                        "work learn/act/env s"], rows)
    info["loadavg_end"] = common.loadavg()
    info["wall_s"] = time.time() - t0
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    common.write_json(args.json, {"benchmark": "ab_revisions", "command": " ".join([sys.executable] + sys.argv),
                                  "machine": info, "base": base_sha, "work_tree_dirty": bool(dirty),
                                  "config": vars(args), "extra_args": extra, "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
