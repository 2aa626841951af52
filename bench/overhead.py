"""Overhead of a training method or option: steps/s of each kind of run against its baseline, same settings.

The kinds run round robin in one invocation (each repeat runs every kind once, the order rotating), so each ratio
compares runs made minutes apart on the same machine load.

    python bench/overhead.py variants --preset plasticity [--iterations 8] [--repeats 3] [--json out.json]
    python bench/overhead.py variants --base "--backend MinAtar --env_id MinAtar/Breakout" \\
        --variant plain= --variant "redo=--redo --redo_every 2048"
    python bench/overhead.py cbp [--iterations 6] [--repeats 3]                 # PPO_CBP vs PPO, HackAtari Freeway
    python bench/overhead.py ewc [--games CartPole Freeway MinAtar] [--agents PPO IMPALA] [--iterations 6]
                                 [--rounds 2] [--ewc_samples 1024]              # --ewc ewc / online vs without
    python bench/overhead.py clear [--env cartpole|minatar] [--steps 20000] [--warmup-steps 4000] [--repeats 3]
                                   [--checkpoint-cost]                          # CLEAR vs IMPALA, buffer sizes
    python bench/overhead.py pnc [--task-steps 9600] [--repeats 3]              # P&C vs IMPALA, MinAtar sequence
    python bench/overhead.py eval [--config run_config.json] [--budget 16384] [--repeats 1]  # continual evaluation

Each run is a fresh `continual_training_example.py` process (its own run directory under a temporary folder, output
discarded but shown on failure); what it measures comes from its metrics.jsonl. Every method prints a line per run
(with the load average) and a table: per kind the median over repeats of its steps/s and of each other number, the
ratio of medians to its baseline and the median of the same-repeat ratios. Run it under `nice` on a shared machine
and report the load it prints. What each method runs and measures:

- variants: the flags of `--base` (a preset's) plus each `--variant NAME=FLAGS`; the first variant is the baseline.
  Steady-state steps/s from the iteration timestamps, excluding the first iteration (start-up). Also the training
  process's CPU seconds (user + system, from /proc, read when the first and the last iteration are logged) per 1000
  steps and their ratio: on a loaded machine wall-clock rates swing with the other jobs, CPU time much less. Envs
  stepped in worker processes (Atari's async vector env) are not in that count: use it for in-process envs.
- cbp: PPO and PPO_CBP on HackAtari Freeway, CleanRL's defaults (8 envs x 128 steps, 4 epochs x 4 minibatches);
  PPO_CBP with the paper's RL rate --replacement_rate 1e-4 and --maturity_threshold 10 (the paper's 10000 would never
  replace anything in a short run) so that replacements happen and are paid for; steady steps/s excluding the first
  iteration, and the units replaced. Target: PPO_CBP >= 0.85x PPO.
- ewc: per game a 2-regime curriculum that switches after the first rollout (CartPole-v1 gravity=15, HackAtari
  Freeway all_green_cars, MinAtar sticky actions), so EWC's penalty is paid in every update after the switch;
  steady steps/s over the iterations after the switch iteration (IMPALA: 2 actors, one update per 4 unrolls of 20
  steps) and "switch_s", the switch iteration's duration minus the median steady iteration (with EWC: the Fisher).
  Target: EWC >= 0.85x the agent without.
- clear: IMPALA and CLEAR (configs/impala_cartpole.json without its curriculum, or `--env minatar`), one torch
  thread; steady steps/s between the first iteration at or after `--warmup-steps` and the last, the median learner
  time per update. Then in-process: the CLEAR learner extension's cost per update, the default replay buffer's size
  for Atari, MinAtar and CartPole (`replay_buffer_bytes`, the preflight's estimate) and, with `--checkpoint-cost`, a
  filled Atari-sized buffer written to and read from a checkpoint (size, seconds, peak RSS growth).
- pnc: P&C and IMPALA on the same MinAtar task sequence (Breakout then SpaceInvaders, `--task-steps` each; 2 actors
  x 4 envs, unroll 20, batch 4: 320 steps per update); steady steps/s over the iterations after the first two except
  the switch iteration (reported apart as switch_s: P&C's online Fisher, and for both the actors' new envs), actor
  utilisation, learner time per update and, for P&C, per phase (progress / compress).
- eval: the same seeded run of `--config` with its evaluation settings ("with") and with `--eval_every 0
  --no-eval_at_switches` ("without"): wall ratio, the evaluation time share of the short run (metrics.jsonl
  `eval_summary`), the full-run estimate (rounds of the full run x seconds per round / (that + training seconds per
  step x total steps)) and whether both runs' training records are identical (they must be).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shlex
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

# --------------------------------------------------------------------------------------------------------------------
# the round robin, shared by every method
# --------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Kinds:
    flags: dict[str, list[str]]  # kind -> training flags of its runs
    baseline: dict[str, str]  # kind -> the kind it is compared to


def round_robin(a: argparse.Namespace, kinds: Kinds, tmp: str, analyse: Callable[[str, str, dict], dict],
                threads: Optional[int] = None, watch: Optional[Callable] = None) -> dict[str, list[dict]]:
    """Every kind once per repeat, the order rotating; `analyse(kind, run_dir, common.run's record)` -> the run's
    numbers ("sps": its steps/s); `watch(process, kind, run_dir)` runs while it trains."""
    names = list(kinds.flags)
    runs: dict[str, list[dict]] = {k: [] for k in names}
    for rep in range(a.repeats):
        for kind in common.rotation(names, rep):
            name = f"k{names.index(kind)}_{rep}"
            run_dir = os.path.join(tmp, name)
            r = common.run(common.train_command(kinds.flags[kind], tmp, name), threads=threads,
                           watch=(lambda p, k=kind, d=run_dir: watch(p, k, d)) if watch else None)
            res = analyse(kind, run_dir, r)
            runs[kind].append(res)
            nums = ", ".join(f"{k} {v:.4g}" for k, v in res.items() if isinstance(v, (int, float)))
            print(f"repeat {rep + 1} {kind:45s} {nums} (load {common.loadavg()})", flush=True)
    return runs


def table(title: str, kinds: Kinds, runs: dict[str, list[dict]]) -> dict:
    """Per kind the medians over repeats, the ratio of median steps/s to its baseline's and the median of the
    same-repeat ratios; printed, and returned for the JSON output."""
    first = next((v[0] for v in runs.values() if v), {})
    numeric = [m for m, x in first.items() if m != "sps" and isinstance(x, (int, float))]
    med = {k: {m: common.median([r[m] for r in v if r.get(m) is not None]) for m in ["sps", *numeric]}
           for k, v in runs.items() if v}
    out: dict[str, Any] = {"median": med, "ratio": {}, "paired_ratio": {}}
    rows = []
    for k, v in runs.items():
        if not v:
            continue
        b = kinds.baseline[k]
        out["ratio"][k] = common.ratio(med[k]["sps"], med.get(b, {}).get("sps", float("nan")))
        paired = [x["sps"] / y["sps"] for x, y in zip(v, runs[b])]
        out["paired_ratio"][k] = common.median(paired)
        rows.append([k, common.fmt(med[k]["sps"]), len(v), f"{out['ratio'][k]:.3f}",
                     f"{out['paired_ratio'][k]:.3f}", f"{min(paired):.3f}", f"{max(paired):.3f}",
                     *(f"{med[k][m]:.3f}" for m in numeric)])
    common.print_table(title, ["kind", "median steps/s", "runs", "ratio vs baseline (medians)",
                               "same-repeat ratio (median)", "min", "max", *(f"{m} (median)" for m in numeric)], rows)
    return out


def write_config(tmp: str, name: str, cfg: dict) -> str:
    path = os.path.join(tmp, name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return path


# --------------------------------------------------------------------------------------------------------------------
# variants: any flags against a baseline (the plasticity methods' preset)
# --------------------------------------------------------------------------------------------------------------------

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


def variants(a: argparse.Namespace, tmp: str) -> dict:
    base, named = PRESETS[a.preset] if a.preset else ("", {})
    base = a.base if a.base is not None else base
    if a.variant:
        named = dict(v.split("=", 1) for v in a.variant)
    names = list(named)
    flags = {k: shlex.split(base) + shlex.split(v) for k, v in named.items()}
    # one iteration per rollout of num_envs x num_steps (8 x 128 by default)
    per_it = {k: (int(f[f.index("--num_envs") + 1]) if "--num_envs" in f else 8)
              * (int(f[f.index("--num_steps") + 1]) if "--num_steps" in f else 128) for k, f in flags.items()}
    kinds = Kinds({k: [*f, "--total_timesteps", str(a.iterations * per_it[k])] for k, f in flags.items()},
                  dict.fromkeys(names, names[0]))

    def analyse(kind: str, run_dir: str, r: dict) -> dict:
        if r["watch"] is None:  # CPU seconds between the first and the last iteration: start-up excluded
            raise SystemExit("error: the run ended before its iterations could be timed")
        return {"sps": common.steady(common.metrics(run_dir, "iteration"))["sps"],
                "cpu_s_per_1k_steps": 1000.0 * r["watch"] / ((a.iterations - 1) * per_it[kind])}

    runs = round_robin(a, kinds, tmp, analyse,
                       watch=lambda proc, kind, run_dir: common.iteration_cpu_s(proc, run_dir, 1, a.iterations))
    res = table(f"overhead vs {names[0]} ({base})", kinds, runs)
    cpu = {k: [r["cpu_s_per_1k_steps"] for r in v] for k, v in runs.items()}
    res["cpu_ratio"] = {k: common.median([x / y for x, y in zip(cpu[k], cpu[names[0]])]) for k in names}
    print("CPU s / 1k steps, median of same-repeat ratios to the baseline: "
          + ", ".join(f"{k} {v:.3f}" for k, v in res["cpu_ratio"].items()))
    return {"base": base, "variants": named, "runs": runs, **res}


# --------------------------------------------------------------------------------------------------------------------
# cbp: PPO_CBP vs PPO
# --------------------------------------------------------------------------------------------------------------------

CBP = {"PPO": ["--architecture", "PPO"],
       "PPO_CBP": ["--architecture", "PPO_CBP", "--replacement_rate", "1e-4", "--maturity_threshold", "10"]}


def cbp(a: argparse.Namespace, tmp: str) -> dict:
    total = a.iterations * 1024
    kinds = Kinds({k: ["--env_id", "ALE/Freeway-v5", "--total_timesteps", str(total), "--diagnostics_every",
                       str(total - 1), *v] for k, v in CBP.items()}, dict.fromkeys(CBP, "PPO"))

    def analyse(kind: str, run_dir: str, r: dict) -> dict:
        records = common.metrics(run_dir)
        last = ([x for x in records if x["kind"] == "plasticity"] or [{}])[-1]
        return {"sps": common.steady([x for x in records if x["kind"] == "iteration"])["sps"],
                "units_replaced": sum(v for k, v in last.items() if k.startswith("plasticity/replaced/"))}

    runs = round_robin(a, kinds, tmp, analyse)
    return {"runs": runs, **table("PPO_CBP overhead on HackAtari Freeway (8 envs x 128 steps)", kinds, runs)}


# --------------------------------------------------------------------------------------------------------------------
# ewc: --ewc ewc / online vs without, after a switch
# --------------------------------------------------------------------------------------------------------------------

GAMES = {
    "CartPole": {"env_id": "CartPole-v1", "backend": "Gymnasium", "modifications": ["", "gravity=15"]},
    "Freeway": {"env_id": "ALE/Freeway-v5", "backend": "HackAtari", "modifications": ["", "all_green_cars"]},
    "MinAtar": {"env_id": "MinAtar/Breakout", "backend": "MinAtar", "modifications": ["", "sticky_action_prob=0.2"]},
}
EWC = {"": [], "+ewc": ["--ewc", "ewc"], "+online": ["--ewc", "online"]}
EWC_AGENTS = {"PPO": ["--architecture", "PPO"],
              "IMPALA": ["--architecture", "IMPALA", "--num_actors", "2", "--max_grad_norm", "40"]}
ROLLOUT = 1024  # 8 envs x 128 steps: PPO's iteration, and the step of the switch


def switch_timings(its: list[dict]) -> dict:
    """Steady steps/s after the switch iteration, and the switch iteration's extra seconds."""
    # the switch (and, with EWC, the Fisher) happens in the first iteration that starts at or after ROLLOUT steps;
    # records carry the step count at their end (PPO: iteration 2; IMPALA, 320-step updates: the 5th)
    k = next(i for i in range(1, len(its)) if its[i - 1]["global_step"] >= ROLLOUT)
    durations = [b["time"] - a["time"] for a, b in zip(its[k - 1:], its[k:])]  # durations[0]: the switch iteration
    steady = durations[1:]
    return {"sps": (its[-1]["global_step"] - its[k]["global_step"]) / sum(steady),
            "switch_s": durations[0] - common.median(steady)}


def ewc(a: argparse.Namespace, tmp: str) -> dict:
    flags, baseline = {}, {}
    for game in a.games:
        g = GAMES[game]
        cfg = write_config(tmp, game, {
            "env_id": g["env_id"], "backend": g["backend"], "modification_factory": "SequentialModificationFactory",
            "modification_factory_kwargs": {"num_total_steps": a.iterations * ROLLOUT, "modifications":
                                            g["modifications"], "switching_thresholds": [ROLLOUT]}})
        for agent in a.agents:
            for e, extra in EWC.items():
                flags[f"{game} {agent}{e}"] = ["--config", cfg, "--ewc_samples", str(a.ewc_samples),
                                               "--torch_threads", "1", "--checkpoint_minutes", "0",
                                               *EWC_AGENTS[agent], *extra]
                baseline[f"{game} {agent}{e}"] = f"{game} {agent}"
    kinds = Kinds(flags, baseline)
    runs = round_robin(a, kinds, tmp, lambda kind, run_dir, r: switch_timings(common.metrics(run_dir, "iteration")))
    return {"runs": runs, **table(f"EWC overhead (8 envs, --ewc_samples {a.ewc_samples}, 1 torch thread)", kinds,
                                  runs)}


# --------------------------------------------------------------------------------------------------------------------
# clear: CLEAR vs IMPALA, and the replay buffer's size and checkpoint cost
# --------------------------------------------------------------------------------------------------------------------

CLEAR_ENVS = {"cartpole": ["--config", "configs/impala_cartpole.json"],
              "minatar": ["--backend", "MinAtar", "--env_id", "MinAtar/Breakout", "--num_envs", "8", "--num_actors",
                          "2", "--unroll_length", "20", "--batch_size", "4", "--learning_rate", "6e-4",
                          "--max_grad_norm", "40"]}


def clear_sizes() -> list[list[str]]:
    from continual.config.args import Args
    from continual.training.startup import replay_buffer_bytes

    rows = []
    for label, kw in (("HackAtari Freeway (4x84x84 uint8, <=18 actions)", dict(env_id="ALE/Freeway-v5")),
                      ("MinAtar Breakout (4x10x10 float32)", dict(backend="MinAtar", env_id="MinAtar/Breakout")),
                      ("CartPole (4 float32)", dict(backend="Gymnasium", env_id="CartPole-v1"))):
        args = Args(architecture="CLEAR", **kw)
        b = replay_buffer_bytes(args, [""])
        rows.append([label, f"{args.clear_buffer_frames:,}", f"{args.clear_buffer_frames // args.unroll_length:,}",
                     f"{b / 1e9:.3f} GB"])
    return rows


def clear_checkpoint_cost(folder: str) -> dict:
    """A filled default Atari buffer through save_checkpoint / load_checkpoint."""
    import numpy as np
    import torch

    from agents.clear import ReservoirReplay
    from continual.training.checkpoint import load_checkpoint, save_checkpoint

    buf = ReservoirReplay(os.path.join(folder, "replay"), 5000, 20, (4, 84, 84), np.uint8, 18, seed=0)
    rng = np.random.default_rng(0)
    t = time.time()
    for start in range(0, 5000, 100):  # random frames (incompressible), written in chunks
        buf.data["obs"][start:start + 100] = rng.integers(0, 256, size=(100, 21, 4, 84, 84), dtype=np.uint8)
    buf.seen = 5000
    fill_s = time.time() - t
    path = os.path.join(folder, "checkpoints", "x.cleanrl_model")
    t = time.time()
    save_checkpoint(path, {"architecture": "CLEAR", "args": {}, "model": {}, "global_step": 0,
                           "clear": buf.state_dict()})
    write_s = time.time() - t
    size = os.path.getsize(path)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.time()
    state = load_checkpoint(path)
    read_s = time.time() - t
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert torch.equal(state["clear"]["data"]["obs"][-1], torch.from_numpy(np.asarray(buf.data["obs"][-1])))
    return {"buffer_bytes": buf.nbytes(), "checkpoint_bytes": size, "fill_s": fill_s, "write_s": write_s,
            "read_s": read_s, "peak_rss_growth_gb_on_read": (rss1 - rss0) / 1e6}


def clear_extension_cost(folder: str, updates: int = 60) -> dict:
    """In-process: the CLEAR learner extension alone per update (sample + copy R replayed unrolls into the batch,
    then insert the B new ones), for a CartPole-sized and an Atari-sized default buffer (2 actors x 4 envs, batch 4:
    16 new + 16 replayed single-env unrolls), median ms with the buffer half full."""
    import types

    import gymnasium as gym
    import numpy as np
    import torch

    from agents.clear import Clear
    from continual.config.args import Args

    out = {}
    for label, shape, dtype in (("cartpole", (4,), np.float32), ("atari", (4, 84, 84), np.uint8)):
        args = Args(architecture="CLEAR", num_envs=8, num_actors=2, batch_size=4, unroll_length=20)
        session = types.SimpleNamespace(run_dir=os.path.join(folder, label), modification="", regime_index=lambda m: 0)
        space = gym.spaces.Box(0, 255, shape, dtype)
        ext = Clear(args, session, None, None, space, 18, torch.device("cpu"))  # agent, optimizer: unused by it
        rng = np.random.default_rng(0)
        S, T, n = 4, 20, 4
        batch = {"obs": torch.as_tensor(rng.integers(0, 255, size=(S, T + 1, n, *shape)).astype(dtype)),
                 "action": torch.zeros((S, T, n), dtype=torch.int64), "logits": torch.zeros((S, T, n, 18)),
                 "reward": torch.zeros((S, T, n)), "done": torch.zeros((S, T, n), dtype=torch.bool),
                 "value": torch.zeros((S, T, n)), "regime": torch.zeros(S, dtype=torch.int64)}

        def tm(x):
            return x.transpose(0, 1).reshape(x.shape[1], S * n, *x.shape[3:])
        new = [tm(batch[k]) for k in ("obs", "action", "logits", "reward", "done")]
        ext.buffer.seen = ext.buffer.capacity // 2  # sampling reaches across a half-full map, as later in a run
        times = []
        for _ in range(updates):
            t = time.perf_counter()
            ext.extend_batch(batch, *new)
            ext.commit()
            times.append(time.perf_counter() - t)
        out[label] = {"median_ms": common.median(times) * 1e3, "max_ms": max(times) * 1e3}
    return out


def clear(a: argparse.Namespace, tmp: str) -> dict:
    env = CLEAR_ENVS[a.env]
    if a.env == "cartpole":  # its curriculum would outlast a short run; the unmodified game
        with open(os.path.join(common.REPO_ROOT, "configs", "impala_cartpole.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        env = ["--config", write_config(tmp, "cartpole", {k: v for k, v in cfg.items() if not k.startswith(
            "modification_factory") and not k.startswith("_")})]
    kinds = Kinds({k: [*env, "--architecture", k, "--total_timesteps", str(a.steps), "--checkpoint_minutes", "0",
                       "--modifs", ""] for k in ("IMPALA", "CLEAR")}, {"IMPALA": "IMPALA", "CLEAR": "IMPALA"})

    def analyse(kind: str, run_dir: str, r: dict) -> dict:
        its = common.metrics(run_dir, "iteration")
        w = min(next((i for i, it in enumerate(its) if it["global_step"] >= a.warmup_steps), 0), len(its) - 2)
        return {"sps": common.steady(its, w + 1)["sps"],
                "learn_s": common.median([it["time/learn_s"] for it in its[w + 1:]]), "wall_s": r["wall_s"]}

    res: dict = {}
    if a.repeats:
        runs = round_robin(a, kinds, tmp, analyse, threads=1)
        res = {"runs": runs, **table(f"{a.env}: steady steps/s ({a.steps} steps per run, warm-up {a.warmup_steps})",
                                     kinds, runs)}
    res["extension_cost"] = clear_extension_cost(tmp)
    print("CLEAR extension per update:", json.dumps(res["extension_cost"]), flush=True)
    if a.checkpoint_cost:
        res["checkpoint_cost"] = clear_checkpoint_cost(tmp)
        print(json.dumps(res["checkpoint_cost"], indent=1))
    res["sizes"] = clear_sizes()
    common.print_table("default replay buffer (--clear_buffer_frames 100000, --unroll_length 20)",
                       ["observations", "frames", "unrolls", "bytes on disk (and per checkpoint)"], res["sizes"])
    return res


# --------------------------------------------------------------------------------------------------------------------
# pnc: Progress & Compress vs IMPALA on a MinAtar task sequence
# --------------------------------------------------------------------------------------------------------------------


def pnc_analysis(records: list[dict]) -> dict:
    its = [r for r in records if r["kind"] == "iteration"]
    switches = [r["global_step"] for r in records if r["kind"] == "switch"]
    spu = its[0]["global_step"]
    at_switch = [it for it in its if it["global_step"] - spu in switches]
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


def pnc(a: argparse.Namespace, tmp: str) -> dict:
    cfg = write_config(tmp, "pnc_sequence", {
        "env_id": "MinAtar/Breakout", "backend": "MinAtar", "num_envs": 8, "num_actors": 2, "unroll_length": 20,
        "batch_size": 4, "learning_rate": 6e-4, "max_grad_norm": 40.0, "ent_coef": 0.01,
        "modification_factory": "TaskSequence",
        "modification_factory_kwargs": {"cycles": 1, "tasks": [
            {"env_id": "MinAtar/Breakout", "steps": a.task_steps},
            {"env_id": "MinAtar/SpaceInvaders", "steps": a.task_steps}]}})
    kinds = Kinds({k: ["--config", cfg, "--architecture", k, "--seed", str(a.seed), "--checkpoint_minutes", "0"]
                   for k in ("IMPALA", "PNC")}, {"IMPALA": "IMPALA", "PNC": "IMPALA"})
    runs = round_robin(a, kinds, tmp, lambda kind, run_dir, r: pnc_analysis(common.metrics(run_dir)))
    return {"runs": runs, **table(f"P&C vs IMPALA, MinAtar Breakout -> SpaceInvaders ({a.task_steps} steps each)",
                                  kinds, runs)}


# --------------------------------------------------------------------------------------------------------------------
# eval: continual evaluation's cost on a config
# --------------------------------------------------------------------------------------------------------------------


def full_run_rounds(total: int, every: int, granularity: int) -> int:
    """Step 0, the first iteration end at or after every multiple of `every`, and the end."""
    steps = {0, total}
    last = 0
    for s in range(granularity, total + 1, granularity):
        if every and s // every != last // every:
            steps.add(s)
        last = s
    return len(steps)


def eval_analysis(kind: str, run_dir: str, r: dict) -> dict:
    records = common.metrics(run_dir)
    iters = [x for x in records if x["kind"] == "iteration"]
    summary = next((x for x in records if x["kind"] == "eval_summary"), None)
    out = {"wall_s": r["wall_s"], "train_s": sum(x["time/env_s"] + x["time/act_s"] + x["time/learn_s"] for x in iters),
           **{f"{k}_s": sum(x[f"time/{k}_s"] for x in iters) for k in ("env", "act", "learn")},
           "iterations": len(iters), "rounds": len({x["global_step"] for x in records if x["kind"] == "eval"}),
           "loadavg": float(r["loadavg_end"].split()[0]),
           # what training did: the same with and without evaluation
           "records": [{k: v for k, v in x.items() if k not in ("time", "charts/SPS") and not k.startswith("time/")}
                       for x in records if x["kind"] in ("episode", "iteration", "switch")]}
    if summary:
        out.update(eval_s=summary["eval_seconds"], total_s=summary["total_seconds"], time_share=summary["time_share"])
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    out["config"] = {k: config.get(k) for k in ("eval_every", "eval_episodes", "eval_max_episode_steps",
                                                "eval_num_envs", "eval_greedy", "eval_background", "num_envs",
                                                "num_steps", "possible_modifications")}
    return out


def evaluation(a: argparse.Namespace, tmp: str) -> dict:
    from continual.config.loading import parse_args
    from continual.training.startup import build_factory, resolve_total

    args, curriculum = parse_args(["--config", a.config])
    if not args.eval_every:
        raise SystemExit(f"error: {a.config} does not turn continual evaluation on (eval_every)")
    granularity = args.rollout_size()
    full_total = resolve_total(args, build_factory(args, curriculum, granularity), granularity)
    flags = ["--config", a.config, "--total_timesteps", str(a.budget), "--seed", str(a.seed), "--no-plots"]
    kinds = Kinds({"with": flags, "without": [*flags, "--eval_every", "0", "--no-eval_at_switches"]},
                  {"with": "without", "without": "without"})
    runs = round_robin(a, kinds, tmp, eval_analysis)
    withs, withouts = runs["with"], runs["without"]
    identical = all(w["records"] == withouts[0]["records"] for w in withs + withouts)
    wall_ratio = sum(r["wall_s"] for r in withs) / sum(r["wall_s"] for r in withouts)
    share = sum(r["eval_s"] for r in withs) / sum(r["total_s"] for r in withs)
    per_round = sum(r["eval_s"] for r in withs) / sum(r["rounds"] for r in withs)
    per_step = sum(r["train_s"] for r in withouts) / sum(r["iterations"] * granularity for r in withouts)
    rounds_full = full_run_rounds(full_total, args.eval_every, granularity)
    full_share = rounds_full * per_round / (rounds_full * per_round + per_step * full_total)
    common.print_table("continual evaluation's cost", ["run", "wall s", "in-run s", "eval s", "share", "rounds",
                                                       "train s", "env s", "act s", "learn s", "load"],
                       [[f"{k} {i}", f"{r['wall_s']:.1f}", f"{r.get('total_s', float('nan')):.1f}",
                         f"{r.get('eval_s', 0):.1f}", f"{100 * r.get('time_share', 0):.1f}%", r["rounds"],
                         f"{r['train_s']:.1f}", f"{r['env_s']:.1f}", f"{r['act_s']:.1f}", f"{r['learn_s']:.1f}",
                         f"{r['loadavg']:.2f}"] for k, v in runs.items() for i, r in enumerate(v)])
    print(f"settings: {withs[0]['config']}")
    print(f"wall ratio with/without: {wall_ratio:.3f}; evaluation time share (short run): {100 * share:.1f}%")
    print(f"evaluation round: {per_round:.1f} s; training: {1000 * per_step:.2f} ms/step")
    print(f"full run estimate ({full_total} steps, {rounds_full} rounds): evaluation share {100 * full_share:.1f}%")
    print(f"training records identical with and without evaluation: {identical}")
    for r in withs + withouts:
        r.pop("records")
    return {"budget": a.budget, "results": runs, "wall_ratio": wall_ratio, "short_share": share,
            "round_s": per_round, "train_ms_per_step": 1000 * per_step, "full_rounds": rounds_full,
            "full_share_estimate": full_share, "identical_training": identical}


# --------------------------------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------------------------------

METHODS: dict[str, Callable[[argparse.Namespace, str], dict]] = {
    "variants": variants, "cbp": cbp, "ewc": ewc, "clear": clear, "pnc": pnc, "eval": evaluation}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="method", required=True, metavar="{" + ",".join(METHODS) + "}")

    def method(name: str, help: str, repeats: int) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help, description=help)
        s.add_argument("--repeats", "--rounds", type=int, default=repeats, help="round-robin repeats")
        s.add_argument("--json", default=None, help="write the runs and the summary as JSON to this path")
        return s

    s = method("variants", "any flags (--variant) against the first variant, or a preset", 3)
    s.add_argument("--preset", choices=sorted(PRESETS), default=None)
    s.add_argument("--base", default=None, help="flags every run gets (a preset's if not given)")
    s.add_argument("--variant", action="append", default=[], help="NAME=FLAGS; the first is the baseline")
    s.add_argument("--iterations", type=int, default=8)
    s = method("cbp", "PPO_CBP vs PPO on HackAtari Freeway", 3)
    s.add_argument("--iterations", type=int, default=6)
    s = method("ewc", "--ewc ewc / online vs without, after a switch", 2)
    s.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
    s.add_argument("--agents", nargs="+", default=["PPO"], choices=list(EWC_AGENTS))
    s.add_argument("--iterations", type=int, default=6)
    s.add_argument("--ewc_samples", type=int, default=1024)
    s = method("clear", "CLEAR vs IMPALA; the replay buffer's size and checkpoint cost (--repeats 0: only those)", 3)
    s.add_argument("--env", choices=list(CLEAR_ENVS), default="cartpole")
    s.add_argument("--steps", type=int, default=20000)
    s.add_argument("--warmup-steps", type=int, default=4000)
    s.add_argument("--checkpoint-cost", action="store_true")
    s = method("pnc", "Progress & Compress vs IMPALA on MinAtar Breakout -> SpaceInvaders", 3)
    s.add_argument("--task-steps", type=int, default=9600, help="agent steps per task (2 tasks per run)")
    s.add_argument("--seed", type=int, default=1)
    s = method("eval", "continual evaluation's cost on a config (with vs without)", 1)
    s.add_argument("--config", default="run_config.json")
    s.add_argument("--budget", type=int, default=16384, help="agent steps per run")
    s.add_argument("--seed", type=int, default=1)
    return p


def main(argv: Optional[list[str]] = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    if a.method == "variants" and not (a.preset or a.variant) or any("=" not in v for v in getattr(a, "variant", [])):
        p.error("variants: give --preset or --variant NAME=FLAGS (one per variant, the first is the baseline)")
    info = common.machine_info()
    t0, cpu0 = time.time(), os.times()
    tmp = tempfile.mkdtemp(prefix=f"overhead_{a.method}_")
    try:
        res = METHODS[a.method](a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    end = os.times()
    child_cpu = end.children_user + end.children_system - cpu0.children_user - cpu0.children_system
    info["loadavg_end"] = common.loadavg()
    print(f"machine: {info['cpu_model']}, {info['nproc']} cores, load at start {info['loadavg_start']}, at end "
          f"{info['loadavg_end']}; wall {time.time() - t0:.0f} s, CPU {child_cpu:.0f} s")
    common.write_json(a.json, {"machine": info, "method": a.method, "args": vars(a), "wall_s": time.time() - t0,
                               "cpu_s": child_cpu, **res})


if __name__ == "__main__":
    main()
