"""DQN's learning pinned, as PPO's (tests/helpers/ppo_reference.py): the games a short MinAtar run at one train step per env
step plays, its TD losses and the weights it reaches, recorded from a past revision.

`tests/test_agents_dqn.py::test_dqn_plays_the_games_of_the_pinned_reference` reruns the case and compares with
`tests/data/dqn_reference_minatar.json` (or this CPU's own recording, `recording_path`), so a speed change to DQN's loop is shown not to change what is learned
(bit for bit: the TD losses are compared exactly). Regenerate only when learning is meant to change, and say so in
the commit: `python tests/helpers/dqn_reference.py --write` (records the revision it ran on). The test passes when
the case equals any recording, else when it equals REFERENCE_REVISION run on this machine
(tests/helpers/reference_revision.py).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, run as a script
from helpers.ppo_reference import DATA, ROOT, run_case  # noqa: E402

REFERENCE_REVISION = "ec6ef0e"  # recorded the plain file; it runs CASE as the recordings do (checked 2026-12-01)

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


def kernel_isa() -> str:
    """The instruction set oneDNN dispatches its kernels for on this CPU (the "isa:" line of ONEDNN_VERBOSE, as a
    file-name slug), read in a child process: two AVX-512 machines gave different games from the same code (ec6ef0e's,
    and an AMD EPYC whose oneDNN reports "AVX-512 with Intel DL Boost and bfloat16 support", 2026-11-30)."""
    code = "import torch; torch.set_num_threads(1); torch.nn.Conv2d(10, 16, 3)(torch.zeros(32, 10, 10, 10))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ONEDNN_VERBOSE": "1"},
                         capture_output=True, text=True)
    found = re.search(r"\bisa:([^\n]*)", out.stdout + out.stderr)
    return re.sub(r"[^a-z0-9]+", "_", found.group(1).lower()).strip("_") if found else "unknown"


def recording_path(write: bool = False) -> str:
    """The recording this machine compares with. The same code gives other floats (and, over 4,096 steps, other
    games) with other CPU kernels: torch's AVX2 ones against its AVX-512 ones, and AVX-512 machines whose oneDNN
    dispatches differently. So a machine compares with the most specific recording there is:
    `dqn_reference_minatar.<capability>.<oneDNN isa>.json`, then `dqn_reference_minatar.<capability>.json`, then the
    plain file, the first one (ec6ef0e, an AVX-512 machine). A new one is written with both keys, at a revision whose
    recording another machine matched (so the code is known not to have changed what is learned)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    specific = os.path.join(DATA, f"dqn_reference_minatar.{capability}.{kernel_isa()}.json")
    if write:
        return specific
    for path in (specific, os.path.join(DATA, f"dqn_reference_minatar.{capability}.json")):
        if os.path.exists(path):
            return path
    return os.path.join(DATA, "dqn_reference_minatar.json")


def run(workdir: str, extra: tuple[str, ...] = (), root: str = ROOT) -> dict:
    return run_case("dqn_minatar", workdir, extra, config=CASE, root=root)


def recordings() -> list[dict]:
    """Every recording (the plain file's and each machine's): ec6ef0e's outputs on some machine, or a revision's whose
    outputs equal them on a machine where both ran."""
    out = []
    for path in sorted(glob.glob(os.path.join(glob.escape(DATA), "dqn_reference_minatar*.json"))):
        with open(path) as f:
            out.append(json.load(f))
    return out


def run_reference_here(workdir: str) -> Optional[dict]:
    """The case as REFERENCE_REVISION runs it on this machine (tests/helpers/reference_revision.py); None when this
    checkout has no such revision."""
    from helpers.reference_revision import checkout

    tree = checkout(REFERENCE_REVISION)
    return None if tree is None else run(workdir, root=tree)


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
