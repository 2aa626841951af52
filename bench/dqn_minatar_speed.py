"""Benchmark: DQN on MinAtar at one train step per env step (C-CHAIN's Continual MinAtar protocol), steps per CPU
second and per wall second, this tree against another revision or K seeds in one process (same run, round-robin).

Each measurement is two fresh runs of `agents/dqn.py` (`configs/c_chain_minatar.json`'s DQN: one env, Double DQN,
batch 32, Adam lr 3e-4, 100k replay, target copy every 1,000 steps, one torch thread) on MinAtar SpaceInvaders,
zero-padded to Seaquest's 10 channels as in the experiment (`--no-padded`: its own 6), that differ only in length:
`--learning_starts` random steps, then `--short` or `--short + --steps` training steps (both totals multiples of
1,000: a run rounds up to whole 1,000-step iterations). Their difference in CPU seconds (user + system, getrusage)
and wall seconds is the cost of `--steps` steady-state steps, start-up and the random phase cancelling out. CPU
seconds are the figure to read on a shared machine (load printed around each run); no evaluation, no checkpoints. Variants (`--variants`): vanilla (the experiment's Double DQN), c_chain, either
with extra flags after a colon (`vanilla:--fused_adam`). `--base REV`: the variants REV knows, from a worktree of it.
`--seeds 0 2 4`: each variant as agents/dqn.py (0) and as agents/dqn_seeds.py with K seeds in one process, in steps
per CPU second per seed (K x steps / CPU s); every other repeat runs in reverse order.

    python bench/dqn_minatar_speed.py --steps 20000 --repeats 3 --variants vanilla c_chain --base HEAD~3 \\
        --json bench/results/dqn_minatar_speed.json
    python bench/dqn_minatar_speed.py --steps 5000 --repeats 3 --variants vanilla:--fused_adam c_chain:--fused_adam \\
        --seeds 0 1 2 4 6
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

FLAGS = ["--architecture", "DQN", "--backend", "MinAtar", "--num_envs", "1", "--num_steps", "1000", "--learning_rate", "0.0003", "--no-anneal-lr", "--gamma", "0.99",
         "--reward_scaling", "none", "--buffer_size", "100000", "--train_frequency", "1",
         "--target_network_frequency", "1000", "--tau", "1.0", "--replay_batch_size", "32", "--start_e", "1.0",
         "--end_e", "0.1", "--exploration_fraction", "0.1", "--double_dqn", "--torch_threads", "1",
         "--checkpoint_minutes", "0", "--no-metrics", "--seed", "1"]
VARIANTS = {"vanilla": [], "c_chain": ["--c_chain"]}
# the padded game: SpaceInvaders in a sequence with Seaquest (10 channels), never reaching the switch
PADDED = {"env_id": "MinAtar/SpaceInvaders", "backend": "MinAtar", "modification_factory": "TaskSequence",
          "modification_factory_kwargs": {"cycles": 1, "tasks": [{"env_id": "MinAtar/SpaceInvaders", "steps": 10**8},
                                                                 {"env_id": "MinAtar/Seaquest", "steps": 1000}]}}


def variant_flags(name: str) -> list[str]:
    base, _, extra = name.partition(":")
    return VARIANTS[base] + extra.split()


def knows(tree: str, flags: list[str]) -> bool:
    """Whether the tree's Args has every --flag of `flags` (a revision before the flag existed skips the variant)."""
    with open(os.path.join(tree, "continual", "config", "args.py"), encoding="utf-8") as f:
        text = f.read()
    return all(f"    {f[2:].replace('-', '_')}:" in text for f in flags if f.startswith("--") and
               not f.startswith("--no-"))


def game_flags(padded: bool, tmp: str) -> list[str]:
    if not padded:
        return ["--env_id", "MinAtar/SpaceInvaders", "--modifs", ""]
    path = os.path.join(tmp, "padded.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(PADDED, f)
    return ["--config", path]


def one_run(tree: str, total: int, learning_starts: int, flags: list[str], tmp: str, name: str, seeds: int) -> dict:
    script = ["dqn_seeds.py", "--seeds", *map(str, range(1, seeds + 1))] if seeds else ["dqn.py"]
    cmd = [sys.executable, os.path.join(tree, "agents", script[0]), *script[1:], *FLAGS,
           "--learning_starts", str(learning_starts), "--total_timesteps", str(total), *flags, "--runs_dir", tmp,
           "--run_name", name, "--no-progress-bar"]
    r = common.run(cmd, cwd=tree)
    return {"wall_s": r["wall_s"], "load": r["loadavg_start"]}


def measure(tree: str, variant: str, args: argparse.Namespace, tmp: str, tag: str, seeds: int) -> dict:
    flags = game_flags(args.padded, tmp) + variant_flags(variant)
    short = args.learning_starts + args.short
    out = {}
    for label, total in (("short", short), ("long", short + args.steps)):
        before = common._children_cpu()
        r = one_run(tree, total, args.learning_starts, flags, tmp, f"{tag}_{label}", seeds)
        r["cpu_s"] = common._children_cpu() - before
        out[label] = r
    cpu = out["long"]["cpu_s"] - out["short"]["cpu_s"]
    wall = out["long"]["wall_s"] - out["short"]["wall_s"]
    return {"variant": variant, "tree": tag.split("_")[0], "seeds": seeds, "cpu_s": cpu, "wall_s": wall,
            "steps_per_cpu_s": max(seeds, 1) * args.steps / cpu, "steps_per_wall_s": max(seeds, 1) * args.steps / wall,
            "load": [out["short"]["load"], out["long"]["load"], common.loadavg()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000, help="steady-state training steps measured")
    p.add_argument("--short", type=int, default=2000, help="training steps of the short run (warm-up)")
    p.add_argument("--learning_starts", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", nargs="+", default=["vanilla", "c_chain"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="0: agents/dqn.py; K: dqn_seeds.py, K seeds")
    p.add_argument("--padded", action=argparse.BooleanOptionalAction, default=True,
                   help="observations zero-padded to 10 channels, as in Continual MinAtar")
    p.add_argument("--base", default=None, help="also measure this git revision (a temporary worktree)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.short % 1000 or args.steps % 1000 or args.short < 0 or args.steps <= 0:
        p.error("--short and --steps must be multiples of 1,000 (a run rounds up to whole 1,000-step iterations)")
    base_sha = common.revision_or_exit(p, args.base) if args.base else None
    info = common.machine_info()
    common.print_machine(info)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        trees = [("this", common.REPO_ROOT)]
        if base_sha:
            trees.append(("base", stack.enter_context(common.revision_tree(base_sha, tmp))))
        runs = [(t, v, k) for t in trees for v in args.variants for k in args.seeds]
        for rep in range(args.repeats):
            for (tname, tree), v, k in (runs if rep % 2 == 0 else runs[::-1]):
                if not knows(tree, variant_flags(v)) or k and not os.path.exists(f"{tree}/agents/dqn_seeds.py"):
                    continue
                row = measure(tree, v, args, tmp, f"{tname}_{v.replace(':', '_').replace(' ', '')}_{k}_{rep}", k)
                row["repeat"] = rep
                rows.append(row)
                print(f"  {tname:5s} {v:28s} seeds {k} repeat {rep}: {row['steps_per_cpu_s']:7.1f} steps/CPU-s, "
                      f"{row['steps_per_wall_s']:7.1f} steps/s wall (load {row['load'][0]} -> "
                      f"{row['load'][-1]})", flush=True)
    table = []
    for (tname, _), v, k in runs:
        xs = [r for r in rows if (r["tree"], r["variant"], r["seeds"]) == (tname, v, k)]
        alone = [r["steps_per_cpu_s"] for r in rows if (r["tree"], r["variant"], r["seeds"]) == (tname, v, 0)]
        if xs:
            cpu = common.median([r["steps_per_cpu_s"] for r in xs])
            table.append([tname, v, k or "dqn.py", common.fmt(cpu), common.fmt(cpu / common.median(alone)) if alone
                          else "", common.fmt(common.median([r["steps_per_wall_s"] for r in xs])), len(xs)])
    common.print_table("DQN on MinAtar, one train step per env step (medians; per seed)",
                       ["tree", "variant", "seeds", "steps/CPU-s", "x dqn.py", "steps/s wall", "repeats"], table)
    common.write_json(args.json, {"machine": info, "args": vars(args), "base": base_sha,
                                  "head": common.resolve_revision("HEAD"),
                                  "rows": rows})


if __name__ == "__main__":
    main()
