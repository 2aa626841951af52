"""DQN's learning pinned, as PPO's (tests/helpers/ppo_reference.py): the games a short MinAtar run at one train step per env
step plays, its TD losses and the weights it reaches, recorded from a past revision.

`tests/test_agents_dqn.py::test_dqn_plays_the_games_of_the_pinned_reference` reruns the case and compares with
`tests/data/dqn_reference_minatar.json` (or this CPU's own recording, `recording_path`), so a speed change to DQN's loop is shown not to change what is learned
(bit for bit: the TD losses are compared exactly). Regenerate only when learning is meant to change, and say so in
the commit: `python tests/helpers/dqn_reference.py --write` (records the revision it ran on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, run as a script
from helpers.ppo_reference import DATA, ROOT, run_case  # noqa: E402

# Continual MinAtar's DQN (configs/experiments/c_chain_minatar.json) shortened: Double DQN, one update per env step,
# a switch with the replay buffer kept across it (within one game: the recording revision's DQN did not pad its envs
# to a sequence's channels, so a switch to another game failed there)
CASE = {
    "architecture": "DQN", "env_id": "MinAtar/SpaceInvaders", "backend": "MinAtar", "num_envs": 1, "num_steps": 128,
    "learning_rate": 0.0003, "anneal_lr": False, "reward_scaling": "none", "buffer_size": 4096,
    "learning_starts": 256, "train_frequency": 1, "target_network_frequency": 256, "replay_batch_size": 32,
    "start_e": 1.0, "end_e": 0.1, "exploration_fraction": 0.25, "double_dqn": True, "seed": 7,
    "checkpoint_every": 0, "torch_threads": 1,
    "modification_factory": "TaskSequence",
    "modification_factory_kwargs": {"cycles": 1, "tasks": [
        {"env_id": "MinAtar/SpaceInvaders", "steps": 2048},
        {"env_id": "MinAtar/SpaceInvaders", "modifications": "sticky_action_prob=0.3", "steps": 2048}]},
}


def recording_path(write: bool = False) -> str:
    """The recording this machine compares with. The same code gives other floats (and, over 4,096 steps, other
    games) with torch's AVX2 kernels than with its AVX-512 ones, so a CPU capability can have a recording of its own,
    `dqn_reference_minatar.<capability>.json`, made at a revision whose recording the other capability matched; the
    plain file is the first one (ec6ef0e, an AVX-512 machine)."""
    import torch

    own = os.path.join(DATA, f"dqn_reference_minatar.{torch.backends.cpu.get_cpu_capability()}.json")
    return own if write or os.path.exists(own) else os.path.join(DATA, "dqn_reference_minatar.json")


def run(workdir: str, extra: tuple[str, ...] = ()) -> dict:
    return run_case("dqn_minatar", workdir, extra, config=CASE)


def main() -> None:
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/helpers/dqn_reference.py --write   (writes this CPU capability's recording)")
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(tmp)
    with open(recording_path(write=True), "w") as f:
        json.dump({"revision": revision, "config": CASE, **result}, f, indent=1)
    print(len(result["episodes"]), "episodes,", len(result["td_losses"]), "iterations")


if __name__ == "__main__":
    main()
