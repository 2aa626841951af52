"""Plasticity loss and its remedies on a fast continual task: PPO vs PPO_CBP vs PPO + shrink & perturb.

Task: CartPole whose push direction flips at every switch (force_mag = +10 / -10), so each regime must be
relearned, with mild gravity changes on top; 8 regimes of 12288 steps, no learning-rate annealing (annealing would
slow late regimes by itself). For each method and seed we measure per-regime learning speed (mean training return
during a visit) and the dormant fraction of the hidden layers at every switch.

    python bench/plasticity.py                   # 3 methods x 3 seeds, ~10-15 min on 2 cores
    python bench/plasticity.py --seeds 1 --regimes 4 --steps_per_regime 8192   # quick look
    python bench/plasticity.py --methods PPO_CBP   # one method (e.g. to compare a change to it)
    python bench/plasticity.py --methods all       # + every plasticity method of continual/plasticity (13 in all)

Writes bench/results/plasticity.json and bench/results/plasticity.png and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import date

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (also puts the repository root on sys.path)

ROOT = common.REPO_ROOT
METHODS = {
    "PPO": ["--architecture", "PPO"],
    "PPO_CBP": ["--architecture", "PPO_CBP", "--replacement_rate", "1e-4", "--maturity_threshold", "100"],
    "PPO+S&P": ["--architecture", "PPO", "--shrink_and_perturb"],
    # the plasticity methods of continual/plasticity/methods.py, each at its paper's defaults (--methods all)
    "PPO+ReDo": ["--architecture", "PPO", "--redo"],
    "PPO+L2": ["--architecture", "PPO", "--l2"],
    "PPO+L2Init": ["--architecture", "PPO", "--l2_init"],
    "PPO+Parseval": ["--architecture", "PPO", "--parseval"],
    "PPO+LN": ["--architecture", "PPO", "--layer_norm"],
    "PPO+CReLU": ["--architecture", "PPO", "--activation", "crelu"],
    "PPO+DFF": ["--architecture", "PPO", "--activation", "fourier"],
    "PPO+reset": ["--architecture", "PPO", "--reset_layers", "1"],
    "PPO+NaP": ["--architecture", "PPO", "--nap"],
    "PPO+TRAC": ["--architecture", "PPO", "--trac"],
    "PPO+injection": ["--architecture", "PPO", "--plasticity_injection", "at_switches"],
}
DEFAULT_METHODS = ["PPO", "PPO_CBP", "PPO+S&P"]
REGIMES = ["force_mag=10", "force_mag=-10 gravity=12", "force_mag=10 gravity=7", "force_mag=-10"]


def curriculum(regimes: int, steps: int) -> dict:
    mods = [REGIMES[i % len(REGIMES)] for i in range(regimes)]
    return {
        "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 8, "num_steps": 32, "num_minibatches": 1,
        "update_epochs": 20, "gamma": 0.98, "gae_lambda": 0.8, "learning_rate": 1e-3, "ent_coef": 0.0,
        "clip_coef": 0.2, "reward_scaling": "none", "anneal_lr": False,
        "modification_factory": "SequentialModificationFactory",
        "modification_factory_kwargs": {"num_total_steps": regimes * steps, "modifications": mods,
                                        "switching_thresholds": [steps * (i + 1) for i in range(regimes - 1)]},
    }


def run(method: str, seed: int, cfg_path: str, runs: str) -> dict:
    name = f"{method.replace('+', '_').replace('&', '')}_s{seed}"
    r = common.run(common.train_command(["--config", cfg_path, "--seed", str(seed), *METHODS[method]], runs, name))
    return {"wall_s": r["wall_s"], "records": common.metrics(os.path.join(runs, name))}


def per_regime(records: list[dict], steps: int, regimes: int) -> tuple[list[float], list[float]]:
    episodes = [(r["global_step"], r["return"]) for r in records if r["kind"] == "episode"]
    speed = []
    for i in range(regimes):
        rs = [ret for s, ret in episodes if i * steps < s <= (i + 1) * steps]
        speed.append(float(np.mean(rs)) if rs else float("nan"))
    dormant = [r["plasticity/dormant_fraction/all"] for r in records if r["kind"] == "plasticity"]
    erank = [r["plasticity/effective_rank"] for r in records if r["kind"] == "plasticity"]
    return speed, dormant, erank


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--regimes", type=int, default=8)
    p.add_argument("--steps_per_regime", type=int, default=12288)
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma-separated subset of " + ", ".join(METHODS) + ", or all")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = p.parse_args()
    methods = list(METHODS) if a.methods == "all" else [m for m in a.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        print(f"error: --methods: unknown {unknown or 'empty'}; choose from {', '.join(METHODS)}", file=sys.stderr)
        sys.exit(2)
    os.makedirs(a.out, exist_ok=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = os.path.join(tmp, "cfg.json")
        with open(cfg_path, "w") as f:
            json.dump(curriculum(a.regimes, a.steps_per_regime), f)
        for seed in range(1, a.seeds + 1):  # round-robin over methods so machine noise hits all alike
            for method in methods:
                out = run(method, seed, cfg_path, os.path.join(tmp, "runs"))
                speed, dormant, erank = per_regime(out["records"], a.steps_per_regime, a.regimes)
                results.setdefault(method, {"speed": [], "dormant": [], "erank": [], "wall_s": []})
                results[method]["speed"].append(speed)
                results[method]["dormant"].append(dormant)
                results[method]["erank"].append(erank)
                results[method]["wall_s"].append(out["wall_s"])
                print(f"{method:8s} seed {seed}: per-regime mean return {np.round(speed, 0).tolist()}", flush=True)

    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {date.today()}")
    print(f"task: CartPole, {a.regimes} regimes x {a.steps_per_regime} steps, {a.seeds} seeds")
    header = f"{'method':9s} {'first 3 regimes':>16s} {'last 3 regimes':>15s} {'all regimes':>12s} " \
             f"{'dormant@last':>13s} {'erank@last':>11s} {'wall s':>7s}"
    print(header)
    summary = {}
    for method, r in results.items():
        speed = np.asarray(r["speed"])
        dormant = np.asarray([d[-1] if d else np.nan for d in r["dormant"]])
        erank = np.asarray([e[-1] if e else np.nan for e in r["erank"]])
        row = {"first3": float(np.nanmean(speed[:, :3])), "last3": float(np.nanmean(speed[:, -3:])),
               "all": float(np.nanmean(speed)), "all_std_over_seeds": float(np.nanstd(np.nanmean(speed, axis=1))),
               "dormant_last": float(np.nanmean(dormant)), "erank_last": float(np.nanmean(erank)),
               "wall_s": float(np.median(r["wall_s"]))}
        summary[method] = row
        print(f"{method:9s} {row['first3']:16.1f} {row['last3']:15.1f} {row['all']:8.1f}±{row['all_std_over_seeds']:<4.0f}"
              f"{row['dormant_last']:13.3f} {row['erank_last']:11.2f} {row['wall_s']:7.0f}")
    with open(os.path.join(a.out, "plasticity.json"), "w") as f:
        json.dump({"date": str(date.today()), "args": vars(a), "summary": summary, "results": results}, f, indent=1)
    plot(results, a, os.path.join(a.out, "plasticity.png"))
    print(f"wrote {a.out}/plasticity.json and plasticity.png")


def plot(results: dict, a, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.5))
    for method, r in results.items():
        speed = np.asarray(r["speed"])
        x = np.arange(1, speed.shape[1] + 1)
        m, s = np.nanmean(speed, 0), np.nanstd(speed, 0)
        ax1.plot(x, m, marker="o", label=method)
        ax1.fill_between(x, m - s, m + s, alpha=0.2)
        for ax, key in ((ax2, "dormant"), (ax3, "erank")):
            series = [d for d in r[key] if d]
            if series:
                n = min(len(d) for d in series)
                d = np.asarray([x[:n] for x in series])
                ax.plot(np.arange(1, n + 1), d.mean(0), marker="o", label=method)
    ax1.set(title="Learning speed per regime (mean training return during the visit)", xlabel="regime (visit order)",
            ylabel="mean episodic return")
    ax2.set(title="Dormant units at each switch (tau-dormant, all hidden layers)", xlabel="switch",
            ylabel="dormant fraction")
    ax3.set(title="Effective rank of the penultimate features at each switch", xlabel="switch",
            ylabel="effective rank (of 64)")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"CartPole with a flipping push direction: {a.regimes} regimes x {a.steps_per_regime} steps, "
                 f"{a.seeds} seeds (mean ± std)")
    common.save_figure(fig, path)


if __name__ == "__main__":
    main()
