"""Does PPO's policy drift when it has no reward, and is per-minibatch advantage normalisation (`--norm_adv`) what
moves it? A diagnostic for issue 46 (HackAtari Freeway: runs that never scored had drifted off UP before any reward).

Each run trains CleanRL's PPO as the robustness experiment does (8 envs x 128 steps, 4 minibatches, 4 epochs, clip 0.1,
entropy 0.01), with the learning rate held at 2.5e-4 (no annealing: a short run should see the step size of a long
run's start), and with every training reward set to 0 in the learner (`RewardScaler` returns zeros), so the run stays
in the phase before its first reward whatever it does. The env, its episode statistics (raw game scores) and the rest
are those of a normal run. Two arms, `--norm_adv` (the default, CleanRL's and the seed's) and `--no-norm_adv`, on
MinAtar Breakout-v1 (3 actions, like Freeway) and on pixel HackAtari Freeway.

    python bench/zero_reward_drift.py --runs-dir DIR --json bench/results/zero_reward_drift.json
    python bench/zero_reward_drift.py --runs-dir DIR --summary-only     # the table of runs already in DIR

Finished runs in DIR are kept and read again; a run cut short goes on from its newest checkpoint. Per run: the policy's entropy
(`losses/entropy`; ln 3 = 1.099 is uniform over 3 actions) at 25.6k, 51.2k and 102.4k steps and at the end, the mean
clip fraction, and the raw game scores: the step of the first game with a positive score and how many games scored.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import common

WORKLOADS = {
    "minatar": ["--env_id", "MinAtar/Breakout-v1", "--backend", "MinAtar"],
    "freeway": ["--env_id", "ALE/Freeway-v5", "--backend", "HackAtari", "--obs_mode", "dqn"],
}
COMMON = ["--architecture", "PPO", "--num_envs", "8", "--num_steps", "128", "--no-anneal_lr"]
ARMS = ("norm_adv", "no-norm_adv")
MARKS = (25600, 51200, 102400)


def train(argv: list[str]) -> None:
    """One run, its training rewards zeroed in the learner (this process only)."""
    import numpy as np

    import continual.training.rewards as rewards

    def zero(self, reward, done):
        return np.zeros(np.shape(reward), dtype=np.float32)

    rewards.RewardScaler.__call__ = zero
    sys.path.insert(0, common.REPO_ROOT)
    import continual_training_example

    continual_training_example.main(argv)


def summarize(run_dir: str) -> dict:
    its = common.metrics(run_dir, "iteration")
    games = common.metrics(run_dir, "episode")

    def entropy_at(step: int) -> Optional[float]:  # None: the run is shorter
        return next((r["losses/entropy"] for r in its if r["global_step"] >= step), None)

    return {"entropy": {str(s): entropy_at(s) for s in MARKS} | {"end": its[-1]["losses/entropy"]},
            "steps": its[-1]["global_step"],
            "mean_clipfrac": sum(r["losses/clipfrac"] for r in its) / len(its),
            "first_score": next((g["global_step"] for g in games if g["return"] > 0), None),
            "games": len(games), "games_scored": sum(g["return"] > 0 for g in games)}


def main() -> None:
    if sys.argv[1:2] == ["--train"]:
        return train(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs-dir", required=True, help="where the runs are made (and found again)")
    p.add_argument("--json", help="write the per-run records and the machine here")
    p.add_argument("--minatar-seeds", type=int, nargs="*", default=[101, 102, 103, 104, 105])
    p.add_argument("--freeway-seeds", type=int, nargs="*", default=[101, 102, 103])
    p.add_argument("--minatar-steps", type=int, default=245760)
    p.add_argument("--freeway-steps", type=int, default=204800)
    p.add_argument("--summary-only", action="store_true", help="train nothing; read the finished runs in --runs-dir")
    p.add_argument("--nice", type=int, default=10)
    a = p.parse_args()
    info = common.machine_info()
    os.makedirs(a.runs_dir, exist_ok=True)
    plan = [(w, arm, s) for w, seeds in (("minatar", a.minatar_seeds), ("freeway", a.freeway_seeds))
            for s in seeds for arm in ARMS]
    records = []
    for workload, arm, seed in plan:
        name = f"{workload}_{arm}_s{seed}"
        run_dir = os.path.join(a.runs_dir, name)
        done = os.path.exists(os.path.join(run_dir, "ppo.cleanrl_model"))
        if not done and not a.summary_only:
            steps = a.minatar_steps if workload == "minatar" else a.freeway_steps
            flags = ["--train", *COMMON, *WORKLOADS[workload], "--total_timesteps", str(steps), f"--{arm}",
                     "--seed", str(seed)]
            log = os.path.join(a.runs_dir, f"{name}.log")
            if os.path.isdir(run_dir):  # killed before its end: it goes on from its newest checkpoint
                print(f"{name}: resuming", flush=True)
                cmd = [sys.executable, "bench/zero_reward_drift.py", "--train", "--resume", run_dir]
                common.run(cmd, nice=a.nice, log=log, log_mode="a")
            else:
                print(f"{name}: training ({steps:,} steps)", flush=True)
                common.run(common.train_command(flags, a.runs_dir, name, script="bench/zero_reward_drift.py"),
                           nice=a.nice, log=log)
            done = True
        if done:
            records.append({"workload": workload, "arm": arm, "seed": seed, "run": name} | summarize(run_dir))
    info["loadavg_end"] = common.loadavg()
    common.print_table("PPO with zero training reward", [
        "run", "entropy 25.6k", "51.2k", "102.4k", "end", "mean clipfrac", "first scoring game", "games scored"],
        [[r["run"], *(common.fmt(r["entropy"][k], 3) for k in (*map(str, MARKS), "end")), f"{r['mean_clipfrac']:.3f}",
          "never" if r["first_score"] is None else f"{r['first_score']:,}", f"{r['games_scored']}/{r['games']}"]
         for r in records])
    common.write_json(a.json, {"machine": info, "common_flags": COMMON, "workloads": WORKLOADS, "runs": records})


if __name__ == "__main__":
    main()
