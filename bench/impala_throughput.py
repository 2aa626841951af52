"""Benchmark: IMPALA training throughput against our PPO on HackAtari Freeway, and IMPALA's scaling with actors.

Run kinds (every training run is a fresh subprocess; the kinds run round-robin, the order rotating every repeat):
- `ppo`: agents.ppo with its defaults (8 envs x 128 steps, 4 epochs x 4 minibatches), through
  `continual.training.startup.parse_train_args` + `agents.ppo.train`;
- `ppo_1thread`: the same with `torch.set_num_threads(1)`, a control: the IMPALA learner on CPU takes
  (cores - actors) threads, and on a loaded machine PPO's default OpenMP threads can slow its update many times over;
- `impala_a1`, `impala_a2`, `impala_a4`: agents.impala with 1, 2 or 4 actor processes sharing the same 8 envs, unroll
  20, batch 4 unrolls, IMPALA's usual hyperparameters (configs/impala_freeway.json without its curriculum);
- with `--backends process ray`, every IMPALA kind also runs with its actors as Ray actors (`impala_a2_ray`:
  `--actor_backend ray`, a Ray instance of the run's own on this machine, --max_in_flight 2), the same actors and
  envs, in the same round-robin: the ratio of the two is Ray's overhead on one machine.
All runs train the unmodified game for the same number of env steps.

Steady-state steps/s = env steps consumed between the first iteration that ends at or after `--warmup-steps` and the
last iteration / the time between them (start-up, env creation and the first iterations are excluded). Utilisation
(share of time busy), from metrics.jsonl over the same window:
- learner: learn time (batch copy + forward/backward + RMSprop step + weight publish) / wall time;
- actors: (env stepping + inference and bookkeeping) / (that + waiting for a free buffer slot), over all actors;
- PPO: env / act / learn split of its iterations (it does one thing at a time).

Run from the repository root:  python bench/impala_throughput.py [--json bench/out/impala_throughput.json]
Ray against processes:         python bench/impala_throughput.py --kinds impala_a2 --backends process ray
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

KINDS = ("ppo", "ppo_1thread", "impala_a1", "impala_a2", "impala_a4")
LABELS = {"ppo": "PPO (8 envs x 128)", "ppo_1thread": "PPO, 1 torch thread", "impala_a1": "IMPALA 1 actor x 8 envs",
          "impala_a2": "IMPALA 2 actors x 4 envs", "impala_a4": "IMPALA 4 actors x 2 envs"}
BACKENDS = ("process", "ray")


def label(kind: str) -> str:
    """`impala_a<N>[_ray]`: N actors, processes or Ray actors."""
    base = kind.removesuffix("_ray")
    text = LABELS.get(base, f"IMPALA {base.split('_a')[-1]} actors")
    return text + ", Ray" if kind.endswith("_ray") else text


def with_backends(kinds, backends) -> list[str]:
    """Every IMPALA kind once per actor backend (Ray: `<kind>_ray`), PPO kinds once."""
    out = []
    for k in kinds:
        if k.startswith("impala"):
            out += [k if b == "process" else f"{k}_ray" for b in backends]
        else:
            out.append(k)
    return out


# --------------------------------------------------------------------------------------------------------------------
# workers (one training run each, in a subprocess)
# --------------------------------------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> dict:
    from continual.training.startup import parse_train_args

    argv = ["--env_id", args.env_id, "--backend", "HackAtari", "--modifs", "", "--num_envs", str(args.num_envs),
            "--total_timesteps", str(args.steps), "--runs_dir", args.tmp, "--run_name", args.run_name,
            "--no-progress-bar", "--seed", str(args.seed)]
    if args.worker.startswith("ppo"):
        import torch

        import agents.ppo as agent_module

        argv += ["--num_steps", str(args.num_steps)]
        if args.worker == "ppo_1thread":
            torch.set_num_threads(1)
    else:
        import agents.impala as agent_module

        cfg = json.load(open(os.path.join(common.REPO_ROOT, "configs", "impala_freeway.json")))
        cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and not k.startswith("modification_factory")}
        path = os.path.join(args.tmp, args.run_name + "_config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        argv = ["--config", path, *argv, "--num_actors", args.worker.removesuffix("_ray").split("_a")[1],
                "--unroll_length", str(args.unroll_length), "--batch_size", str(args.batch_size)]
        if args.worker.endswith("_ray"):
            argv += ["--actor_backend", "ray"]
    t0 = time.time()
    parsed, curriculum, _ = parse_train_args(argv)
    run_dir = agent_module.train(parsed, curriculum, None)
    t1 = time.time()
    iterations = [{k: rec[k] for k in rec if k in ("global_step", "time") or k.startswith("time/")}
                  for rec in common.metrics(run_dir, "iteration")]
    return {"start": t0, "end": t1, "iterations": iterations}


# --------------------------------------------------------------------------------------------------------------------
# orchestration and analysis
# --------------------------------------------------------------------------------------------------------------------


def num(x) -> float:
    return float(x) if isinstance(x, (int, float)) else float("nan")


def steady(kind: str, run: dict, warmup_steps: int) -> dict:
    its = run["iterations"]
    w = next((i for i, it in enumerate(its) if it["global_step"] >= warmup_steps), 0)
    w = min(w, len(its) - 2)
    window = its[w + 1:]
    wall = its[-1]["time"] - its[w]["time"]
    out = {"sps": (its[-1]["global_step"] - its[w]["global_step"]) / wall, "iterations_measured": len(window),
           "wall_total_s": run["end"] - run["start"], "first_iteration_s": its[0]["time"] - run["start"]}
    # CPU the run's processes used over the window (all of them: learner, actors, Ray's own), and everyone else's
    samples = [x for x in run.get("cpu_samples", []) if x["t"] >= its[w]["time"] and x["t0"] <= its[-1]["time"]]
    if samples:
        out["cores_ours"] = sum(x["ours_cores"] for x in samples) / len(samples)
        out["cores_foreign"] = sum(x["foreign_cores"] for x in samples) / len(samples)
        out["cpu_ms_per_step"] = out["cores_ours"] / out["sps"] * 1e3
    if kind.startswith("ppo"):
        env, act, learn = (sum(num(it[f"time/{c}_s"]) for it in window) for c in ("env", "act", "learn"))
        out["share"] = {"env": env / wall, "act": act / wall, "learn": learn / wall}
    else:
        learn = sum(num(it["time/learn_s"]) for it in window)
        busy = sum(num(it["time/actor_env_s"]) + num(it["time/actor_act_s"]) for it in window)
        waiting = sum(num(it["time/actor_wait_s"]) for it in window)
        env = sum(num(it["time/actor_env_s"]) for it in window)
        steps = its[-1]["global_step"] - its[w]["global_step"]
        out["learner_utilisation"] = learn / wall
        out["actor_utilisation"] = busy / (busy + waiting) if busy + waiting > 0 else float("nan")
        out["actor_env_share"] = env / busy if busy > 0 else float("nan")
        out["learn_s_per_update"] = learn / len(window)
        # per env step: learner time, and busy actor time (env stepping + inference), for sizing a bigger machine
        out["learner_ms_per_step"] = learn / steps * 1e3
        out["actor_ms_per_step"] = busy / steps * 1e3
        out["actor_env_ms_per_step"] = env / steps * 1e3
    return out


def orchestrate(args: argparse.Namespace) -> dict:
    tmp = tempfile.mkdtemp(prefix="impala_bench_")
    runs: dict[str, list[dict]] = {k: [] for k in args.runs}
    failures = []
    try:
        for rep in range(args.repeats):
            for kind in common.rotation(args.runs, rep):
                name = f"{kind}_r{rep}"
                out, log = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".log")
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--worker-out", out, "--tmp", tmp,
                       "--run-name", name, "--steps", str(args.steps), "--num-envs", str(args.num_envs),
                       "--num-steps", str(args.num_steps), "--unroll-length", str(args.unroll_length),
                       "--batch-size", str(args.batch_size), "--env-id", args.env_id, "--seed", str(args.seed)]
                t = time.time()
                with common.LoadSampler(interval=1.0) as sampler:  # our process tree's cores, and the others'
                    run = common.run_worker(cmd, name, log, out, args.run_timeout, failures)
                if run is None:
                    continue
                run["cpu_samples"] = sampler.samples
                run["analysis"] = steady(kind, run, args.warmup_steps)
                run["load"] = common.loadavg()
                runs[kind].append(run)
                print(f"  repeat {rep + 1}/{args.repeats} {label(kind):<31} steady {run['analysis']['sps']:7.1f} "
                      f"steps/s  (run {time.time() - t:5.1f} s, load {run['load']})", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"runs": runs, "failures": failures}


def summarize(args: argparse.Namespace, res: dict) -> dict:
    runs = res["runs"]
    sps = {k: [r["analysis"]["sps"] for r in v] for k, v in runs.items()}
    med = {k: common.median(v) for k, v in sps.items()}
    out: dict = {"sps": sps, "median_sps": med, "vs_ppo": {}, "utilisation": {}}
    for k in runs:
        if k != "ppo" and "ppo" in med and sps[k]:
            paired = common.median([a / b for a, b in zip(sps[k], sps["ppo"])])
            out["vs_ppo"][k] = {"ratio_of_medians": common.ratio(med[k], med["ppo"]), "median_paired_ratio": paired}
        a = [r["analysis"] for r in runs[k]]
        if not a:
            continue
        if k.startswith("ppo"):
            out["utilisation"][k] = {c: common.median([x["share"][c] for x in a]) for c in ("env", "act", "learn")}
        else:
            out["utilisation"][k] = {c: common.median([x[c] for x in a]) for c in
                                     ("learner_utilisation", "actor_utilisation", "actor_env_share",
                                      "learn_s_per_update", "learner_ms_per_step", "actor_ms_per_step",
                                      "actor_env_ms_per_step")}
        out["utilisation"][k]["wall_total_s"] = common.median([x["wall_total_s"] for x in a])
        if all("cpu_ms_per_step" in x for x in a):
            out["cpu"] = out.get("cpu", {})
            out["cpu"][k] = {c: common.median([x[c] for x in a]) for c in
                             ("cores_ours", "cores_foreign", "cpu_ms_per_step")}
    # Ray's overhead on one machine: a Ray run against the process run with the same actors (same repeat: paired)
    out["ray_vs_process"] = {
        k: {"ratio_of_medians": common.ratio(med[k], med[k.removesuffix("_ray")]),
            "median_paired_ratio": common.median([a / b for a, b in zip(sps[k], sps[k.removesuffix("_ray")])])}
        for k in runs if k.endswith("_ray") and sps[k] and sps.get(k.removesuffix("_ray"))}
    impalas = [k for k in med if k.startswith("impala") and not k.endswith("_ray") and sps[k]]
    best = max(impalas, key=lambda k: med[k], default=None)
    out["best_impala"] = best
    if "impala_a2" in out["vs_ppo"]:
        out["target_2x_met_default_2_actors"] = out["vs_ppo"]["impala_a2"]["ratio_of_medians"] >= 2.0
    if best and "ppo" in med:
        out["target_2x_met_best"] = out["vs_ppo"][best]["ratio_of_medians"] >= 2.0
    if best and sps.get("ppo_1thread"):
        out["best_impala_vs_ppo_1thread"] = common.ratio(med[best], med["ppo_1thread"])
    return out


def report(args: argparse.Namespace, info: dict, s: dict) -> str:
    common.print_machine(info)
    rows = []
    for k in args.runs:
        v = s["sps"].get(k, [])
        if not v:
            rows.append([label(k), "0", "-", "-", "-", "-", "-", "-"])
            continue
        u = s["utilisation"][k]
        util = (f"learner {u['learner_utilisation'] * 100:.0f}%, actors {u['actor_utilisation'] * 100:.0f}%"
                if not k.startswith("ppo") else f"env {u['env'] * 100:.0f}% / act {u['act'] * 100:.0f}% / "
                                   f"learn {u['learn'] * 100:.0f}%")
        ratio = s["vs_ppo"].get(k, {}).get("ratio_of_medians")
        rows.append([label(k), len(v), common.fmt(s["median_sps"][k]), common.fmt(min(v)), common.fmt(max(v)),
                     "1.00" if k == "ppo" else (f"{ratio:.2f}" if ratio is not None else "-"), util,
                     common.fmt(u["wall_total_s"])])
    title = (f"training steps/s, HackAtari {args.env_id}, {args.num_envs} envs, {args.steps} env steps per run, "
             f"steady state after {args.warmup_steps} steps")
    columns = ["run", "n", "median steps/s", "min", "max", "vs PPO", "utilisation (busy share)", "run wall s"]
    common.print_table(title, columns, rows)
    lines = [f"| {' | '.join(columns)} |", "|" + "---|" * len(columns)]
    lines += [f"| {' | '.join(str(c) for c in r)} |" for r in rows]
    text = title + "\n\n" + "\n".join(lines)

    # sizing: what one core of learner and one core of actor do per env step (medians; wall time while busy, so
    # inflated by contention when processes outnumber cores)
    cost_rows = [[label(k), f"{u['learner_ms_per_step']:.2f}", f"{u['actor_ms_per_step']:.2f}",
                  f"{u['actor_env_ms_per_step']:.2f}"]
                 for k, u in s["utilisation"].items() if k.startswith("impala")]
    if cost_rows:
        title2 = "IMPALA cost per env step (ms): learner (CPU), actors busy (env + inference), of which env"
        cols2 = ["run", "learner ms/step", "actor ms/step", "env ms/step"]
        common.print_table(title2, cols2, cost_rows)
        text += "\n\n" + title2 + "\n\n" + "\n".join(
            [f"| {' | '.join(cols2)} |", "|" + "---|" * len(cols2)] + [f"| {' | '.join(r)} |" for r in cost_rows])
    if s.get("cpu"):
        title3 = ("CPU over the steady window (medians): cores the run's processes used (learner, actors, Ray's own), "
                  "other processes' cores meanwhile, and the run's CPU ms per env step")
        cols3 = ["run", "run's cores", "others' cores", "CPU ms/step"]
        rows3 = [[label(k), f"{c['cores_ours']:.2f}", f"{c['cores_foreign']:.2f}", f"{c['cpu_ms_per_step']:.2f}"]
                 for k, c in s["cpu"].items()]
        common.print_table(title3, cols3, rows3)
        text += "\n\n" + title3 + "\n\n" + "\n".join(
            [f"| {' | '.join(cols3)} |", "|" + "---|" * len(cols3)] + [f"| {' | '.join(r)} |" for r in rows3])
    return text


def worker_kind(kind: str) -> str:
    if kind in KINDS or re.fullmatch(r"impala_a[1-9][0-9]*(_ray)?", kind):
        return kind
    raise argparse.ArgumentTypeError(f"unknown run kind {kind!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="ALE/Freeway-v5")
    p.add_argument("--num-envs", type=int, default=8, help="envs in every run (IMPALA: split between the actors)")
    p.add_argument("--num-steps", type=int, default=128, help="PPO rollout length")
    p.add_argument("--unroll-length", type=int, default=20, help="IMPALA unroll length")
    p.add_argument("--batch-size", type=int, default=4, help="IMPALA unrolls per update")
    p.add_argument("--steps", type=int, default=3072, help="env steps per training run (PPO: 3 iterations)")
    p.add_argument("--warmup-steps", type=int, default=1024, help="steps excluded from steady-state steps/s")
    p.add_argument("--repeats", type=int, default=3, help="round-robin repeats of every run kind")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="run kinds to compare")
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=["process"],
                   help="IMPALA's actor backends: each IMPALA kind runs once per backend (Ray: `<kind>_ray`)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-timeout", type=int, default=900, help="seconds before a training run is killed")
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--markdown", help="write the table as markdown to this path (for bench/RESULTS.md)")
    p.add_argument("--reanalyze", metavar="JSON", help="summarise the runs of an earlier --json output again")
    # internal: one training run
    # (any impala_a<N>: a GPU machine runs more actors than KINDS lists)
    p.add_argument("--worker", type=worker_kind, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--run-name", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        out = worker(args)
        with open(args.worker_out, "w", encoding="utf-8") as f:
            json.dump(out, f)
        return
    if not 0 < args.warmup_steps < args.steps:
        p.error("--warmup-steps must be in (0, steps)")
    ppo_batch = args.num_envs * args.num_steps
    if any(k.startswith("ppo") for k in args.kinds) and args.steps // ppo_batch * ppo_batch < args.warmup_steps + ppo_batch:
        p.error(f"--steps {args.steps} leaves no PPO iteration ({ppo_batch} steps each) after --warmup-steps "
                f"{args.warmup_steps} to measure")

    args.runs = with_backends(args.kinds, args.backends)
    if args.reanalyze:
        with open(args.reanalyze, encoding="utf-8") as f:
            old = json.load(f)
        info = old["machine"]
        for k, v in old["config"].items():
            if k not in ("json", "markdown", "reanalyze"):
                setattr(args, k, v)
        args.runs = with_backends(args.kinds, args.backends)  # (outputs before --backends: processes only)
        res = {"runs": old["runs"], "failures": old["failures"]}
        for k, runs in res["runs"].items():
            for run in runs:
                run["analysis"] = steady(k, run, args.warmup_steps)
    else:
        info = common.machine_info()
        t0 = time.time()
        print(f"{args.repeats} repeats x {len(args.runs)} runs of {args.steps} env steps, round-robin ...", flush=True)
        res = orchestrate(args)
        info["loadavg_end"] = common.loadavg()
        info["wall_s"] = time.time() - t0
    summary = summarize(args, res)
    table = report(args, info, summary)
    for k, v in summary["vs_ppo"].items():
        print(f"{label(k)} / PPO: {v['ratio_of_medians']:.2f} (median of paired per-repeat ratios "
              f"{v['median_paired_ratio']:.2f})")
    if "target_2x_met_default_2_actors" in summary:
        print(f"target >= 2x PPO with the default 2 actors: {summary['target_2x_met_default_2_actors']}; "
              f"best IMPALA setting: {summary['best_impala']} ({summary['target_2x_met_best']})")
    for k, v in summary["ray_vs_process"].items():
        print(f"{label(k)} / the same actors as processes: {v['ratio_of_medians']:.2f} (median of paired per-repeat "
              f"ratios {v['median_paired_ratio']:.2f}); load average at the end {info['loadavg_end']}")
    if "best_impala_vs_ppo_1thread" in summary:
        print(f"best IMPALA / PPO with 1 torch thread: {summary['best_impala_vs_ppo_1thread']:.2f}")
    print(f"wall time: {info['wall_s']:.0f} s")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    common.write_json(args.json, {"benchmark": "impala_throughput", "command": " ".join([sys.executable] + sys.argv),
                                  "machine": info, "config": vars(args), "summary": summary, "runs": res["runs"],
                                  "failures": res["failures"]})
    if res["failures"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
