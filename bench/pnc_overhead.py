"""Benchmark: Progress & Compress (agents/pnc.py) training steps/s against IMPALA on the same MinAtar task sequence.

Both kinds run the same curriculum (MinAtar Breakout then SpaceInvaders, `--task-steps` each; P&C needs switches),
the same actors/envs/unroll/batch (2 actors x 4 envs, unroll 20, batch 4: 320 steps per update), each in a fresh
subprocess; the kinds run round-robin with the order rotating every repeat, and the load average is printed per run.
Steady steps/s = steps of the iterations after the first two, except the one that contains the switch / the sum of
their durations (`time/iteration_s`); the switch iteration's extra time is reported on its own (`switch_s`: for P&C
it holds the KB's online Fisher, `--ewc_samples` per-sample gradients; for both, the actors rebuild their envs for
the new game). The learner time per update (`time/learn_s`) is split by P&C phase (`pnc/compress`), which says
where the extra cost goes: the progress update forwards the KB column too (the adaptors' inputs) and trains the
active column and its adaptors; the compress update adds a KB forward+backward for the KL and the online-EWC
penalty, and the actors always run both columns (the active one needs the KB's laterals).

Run from the repository root:  python bench/pnc_overhead.py [--repeats 3] [--json bench/results/pnc_overhead.json]
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

KINDS = ("impala", "pnc")


def worker(args: argparse.Namespace) -> dict:
    from continual.training.startup import parse_train_args

    if args.worker == "pnc":
        import agents.pnc as agent_module
    else:
        import agents.impala as agent_module
    cfg = {"env_id": "MinAtar/Breakout", "backend": "MinAtar", "num_envs": 8, "num_actors": 2, "unroll_length": 20,
           "batch_size": 4, "learning_rate": 6e-4, "max_grad_norm": 40.0, "ent_coef": 0.01,
           "modification_factory": "TaskSequence",
           "modification_factory_kwargs": {"cycles": 1, "tasks": [
               {"env_id": "MinAtar/Breakout", "steps": args.task_steps},
               {"env_id": "MinAtar/SpaceInvaders", "steps": args.task_steps}]}}
    path = os.path.join(args.tmp, args.run_name + "_config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    argv = ["--config", path, "--architecture", args.worker.upper(), "--runs_dir", args.tmp, "--run_name",
            args.run_name, "--no-progress-bar", "--seed", str(args.seed), "--checkpoint_minutes", "0"]
    t0 = time.time()
    parsed, curriculum, _ = parse_train_args(argv)
    run_dir = agent_module.train(parsed, curriculum, None)
    keys = ("global_step", "time/iteration_s", "time/learn_s", "time/actor_utilisation", "pnc/compress")
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    its = [{k: r[k] for k in keys if k in r} for r in records if r.get("kind") == "iteration"]
    switches = [r["global_step"] for r in records if r.get("kind") == "switch"]
    return {"start": t0, "end": time.time(), "iterations": its, "switches": switches}


def analyse(run: dict) -> dict:
    its = run["iterations"]
    spu = its[0]["global_step"]
    at_switch = [it for it in its if it["global_step"] - spu in run["switches"]]
    window = [it for it in its[2:] if it not in at_switch]
    typical = common.median([it["time/iteration_s"] for it in window])
    out = {"sps": spu * len(window) / sum(it["time/iteration_s"] for it in window),
           "switch_s": sum(it["time/iteration_s"] - typical for it in at_switch),
           "actor_utilisation": common.median([u for it in window if isinstance(u := it["time/actor_utilisation"], float)
                                               and u == u]),  # nan (JSON "NaN") when the actors reported no time
           "learn_s_per_update": common.median([it["time/learn_s"] for it in window])}
    if "pnc/compress" in its[0]:
        for phase, flag in (("progress", 0.0), ("compress", 1.0)):
            out[f"learn_s_{phase}"] = common.median([it["time/learn_s"] for it in window if it["pnc/compress"] == flag])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task-steps", type=int, default=9600, help="agent steps per task (2 tasks per run)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the runs and the summary as JSON to this path")
    p.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--run-name", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        with open(args.worker_out, "w", encoding="utf-8") as f:
            json.dump(worker(args), f)
        return
    info = common.machine_info()
    tmp = tempfile.mkdtemp(prefix="pnc_bench_")
    runs: dict[str, list] = {k: [] for k in KINDS}
    failures: list = []
    try:
        for rep in range(args.repeats):
            for kind in (KINDS if rep % 2 == 0 else KINDS[::-1]):
                name = f"{kind}_r{rep}"
                out, log = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".log")
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--worker-out", out, "--tmp", tmp,
                       "--run-name", name, "--task-steps", str(args.task_steps), "--seed", str(args.seed)]
                load = common.loadavg()
                run = common.run_worker(cmd, name, log, out, 1800, failures)
                if run is None:
                    continue
                run["analysis"], run["load_before"], run["load_after"] = analyse(run), load, common.loadavg()
                runs[kind].append(run)
                a = run["analysis"]
                print(f"  repeat {rep + 1} {kind:<6} {a['sps']:7.1f} steps/s, actors busy "
                      f"{a['actor_utilisation'] * 100:.0f}%, switch +{a['switch_s']:.1f} s, learner ms/update: "
                      + " ".join(f"{k[8:] or 'all'} {v * 1e3:.0f}" for k, v in a.items() if k.startswith("learn_s")) +
                      f"  (load {load} -> {run['load_after']})", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: common.median([r["analysis"]["sps"] for r in v]) for k, v in runs.items() if v}
    summary = {"median_sps": med, "pnc_over_impala": common.ratio(med.get("pnc", float("nan")),
                                                                   med.get("impala", float("nan"))),
               "median_analysis": {k: {m: common.median([r["analysis"][m] for r in v]) for m in v[0]["analysis"]}
                                   for k, v in runs.items() if v}}
    print(json.dumps(summary, indent=1))
    common.write_json(args.json, {"machine": info, "args": vars(args), "runs": runs, "summary": summary,
                                  "failures": failures})


if __name__ == "__main__":
    main()
