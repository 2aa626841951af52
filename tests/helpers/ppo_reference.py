"""PPO's learning pinned: the games a short run plays and the weights it reaches, recorded from a past revision.

`tests/test_agents_ppo.py::test_ppo_plays_the_games_of_the_pinned_reference` reruns each case and compares with
`tests/data/ppo_reference_<case>.json`, so a speed change to PPO's loop (env stepping, sampling, the optimizer, the
networks' memory layout) is shown not to change what is learned. Regenerate only when learning is meant to change,
and say so in the commit: `python tests/helpers/ppo_reference.py --write` (records the revision it ran on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, run as a script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")

# A switch in each: CartPole's gravity, MinAtar's game (another env id: padded channels, another action set)
CASES = {
    "cartpole": {
        "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 4, "num_steps": 64, "update_epochs": 2,
        "num_minibatches": 4, "reward_scaling": "none", "seed": 3, "checkpoint_every": 0,
        "modification_factory": "SequentialModificationFactory",
        "modification_factory_kwargs": {"num_total_steps": 3072, "modifications": ["", "gravity=15"],
                                        "switching_thresholds": [1536]},
    },
    "minatar": {
        "env_id": "MinAtar/Breakout", "backend": "MinAtar", "num_envs": 8, "num_steps": 32, "update_epochs": 2,
        "num_minibatches": 4, "seed": 5, "checkpoint_every": 0,
        "modification_factory": "TaskSequence",
        "modification_factory_kwargs": {"cycles": 1, "tasks": [{"env_id": "MinAtar/Breakout", "steps": 2048},
                                                                {"env_id": "MinAtar/SpaceInvaders", "steps": 2048}]},
    },
}


def run_case(case: str, workdir: str, extra: tuple[str, ...] = (), config: dict | None = None,
             root: str = ROOT) -> dict:
    """Train the case (`config`, default CASES[case]) in a subprocess with the code of the checkout `root`; its
    episodes (step, env, return, length), iterations (step, TD loss: DQN) and a summary of the final weights."""
    from helpers.reference_revision import env_for

    os.makedirs(workdir, exist_ok=True)
    cfg = os.path.join(workdir, f"{case}.json")
    with open(cfg, "w") as f:
        json.dump(CASES[case] if config is None else config, f)
    runs = os.path.join(workdir, "runs")
    proc = subprocess.run([sys.executable, "continual_training_example.py", "--config", cfg, "--runs_dir", runs,
                           "--run_name", case, "--no-progress-bar", *extra], cwd=root, capture_output=True,
                          text=True, timeout=600, env=env_for(root, WANDB_MODE="offline"))
    if proc.returncode != 0:
        raise RuntimeError(f"{case} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return read_run(os.path.join(runs, case))


def read_run(run_dir: str) -> dict:
    """A finished run's episodes (step, env, return, length), iterations (step, TD loss: DQN) and a summary of its
    final weights, as the references hold them."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    episodes = [[r["global_step"], r.get("env"), r["return"], r["length"]] for r in records if r["kind"] == "episode"]
    losses = [[r["global_step"], r["losses/td_loss"]] for r in records if r["kind"] == "iteration"
              and "losses/td_loss" in r]
    import torch

    final = [p for p in os.listdir(os.path.join(run_dir, "checkpoints")) if p.startswith("final")]
    state = torch.load(os.path.join(run_dir, "checkpoints", final[0]), weights_only=False)["model"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a sum's order (so its last bit) follows the thread count: the tests' one thread
    try:
        weights = {k: {"sum": float(v.double().sum()), "abs_sum": float(v.double().abs().sum()),
                       "first": [float(x) for x in v.double().flatten()[:8]]}
                   for k, v in state.items() if v.is_floating_point()}
    finally:
        torch.set_num_threads(threads)
    return {"episodes": episodes, "weights": weights, **({"td_losses": losses} if losses else {})}


def main() -> None:
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/helpers/ppo_reference.py --write   (rewrites tests/data/ppo_reference_*.json)")
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    os.makedirs(DATA, exist_ok=True)
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_case(case, tmp)
        with open(os.path.join(DATA, f"ppo_reference_{case}.json"), "w") as f:
            json.dump({"revision": revision, "config": CASES[case], **result}, f, indent=1)
        print(case, len(result["episodes"]), "episodes")


if __name__ == "__main__":
    main()
