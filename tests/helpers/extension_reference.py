"""Continual behaviour pinned: short real runs of every agent with the continual methods each supports, recorded
before the extension refactor (issue 50) so that it is shown to change nothing.

`tests/test_training_extensions.py` reruns each case and compares with `tests/data/extension_reference.json`: the
games played (step, env, return, length), every logged scalar but timings, the continual-evaluation table, the keys
of every checkpoint and a hash of the final weights. Each case runs in its own process
(`python tests/helpers/extension_reference.py --run CASE DIR`). IMPALA's family plays through `SyncFleet`: its
unrolls in the learner's process, one actor after another, with the newest published weights, so the games do not
depend on the actor processes' timing. Regenerate only when behaviour is meant to change, and say so in the commit:
`python tests/helpers/extension_reference.py --write` (records the revision it ran on).

The same code gives other floats with other CPU kernels (oneDNN's convolutions dispatch by instruction set; see
tests/helpers/dqn_reference.py): the MinAtar DQN cases recorded at da56a98 differ on an AMD EPYC whose oneDNN reports
"AVX-512 with Intel DL Boost and bfloat16 support", where 6fdc4fb, the revision that committed the recording, and
main give the same outputs as each other; on an Intel Xeon whose oneDNN reports "AVX 10.1" (2026-12-01) all 18 cases
differ, and again 6fdc4fb and main agree there. So a machine's cases come from the most specific recording there is,
`extension_reference.<capability>.<oneDNN isa>.json`, then `extension_reference.<capability>.json`, over the plain
file's. `--write-machine CASE ... --same-as REV` writes such a file for the cases named, at a revision whose outputs
on this machine equal REV's, a revision where the plain recording passed (so the code is known not to have changed
what is learned).

Every recording is REFERENCE_REVISION's outputs on some machine, so a case passes when it equals any of them, else
when it equals that revision run on this machine (tests/helpers/reference_revision.py): the slug of oneDNN's
instruction set is not the behaviour's key (an Intel Xeon whose oneDNN reports "AVX 10.1 and AMX with bfloat16 and
8-bit integer support" gave, 2026-12-01, the outputs recorded on the "AVX 10.1" one in all 18 cases).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, run as a script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "extension_reference.json")

_CARTPOLE = {"env_id": "CartPole-v1", "backend": "Gymnasium", "reward_scaling": "none", "checkpoint_every": 0,
             "torch_threads": 1, "modification_factory": "SequentialModificationFactory"}
_EVAL = ["--eval_every", "1024", "--eval_episodes", "2", "--eval_num_envs", "2", "--eval_max_episode_steps", "60"]
PPO = {**_CARTPOLE, "num_envs": 4, "num_steps": 64, "update_epochs": 2, "num_minibatches": 4, "seed": 3,
       "modification_factory_kwargs": {"num_total_steps": 3072, "modifications": ["", "gravity=15"],
                                       "switching_thresholds": [1536]}}
HER = {"env_id": "continual/GoalGrid-v0", "backend": "Gymnasium", "reward_scaling": "none", "checkpoint_every": 0,
       "torch_threads": 1, "her": True, "num_envs": 2, "num_steps": 64, "num_minibatches": 2, "update_epochs": 2,
       "seed": 4, "modification_factory": "SequentialModificationFactory",
       "modification_factory_kwargs": {"num_total_steps": 1536, "modifications": ["", "slip=0.3"],
                                       "switching_thresholds": [768]}}
DQN = {"architecture": "DQN", "env_id": "MinAtar/SpaceInvaders", "backend": "MinAtar", "num_envs": 1, "num_steps": 128,
       "learning_rate": 0.0003, "anneal_lr": False, "reward_scaling": "none", "buffer_size": 2048,
       "learning_starts": 256, "train_frequency": 1, "target_network_frequency": 256, "replay_batch_size": 32,
       "start_e": 1.0, "end_e": 0.1, "exploration_fraction": 0.25, "double_dqn": True, "seed": 7,
       "checkpoint_every": 0, "torch_threads": 1, "modification_factory": "TaskSequence",
       "modification_factory_kwargs": {"cycles": 1, "tasks": [
           {"env_id": "MinAtar/SpaceInvaders", "steps": 1024},
           {"env_id": "MinAtar/SpaceInvaders", "modifications": "sticky_action_prob=0.3", "steps": 1024}]}}
A2C = {**_CARTPOLE, "architecture": "A2C", "num_envs": 4, "num_steps": 8, "seed": 5,
       "modification_factory_kwargs": {"num_total_steps": 2048, "modifications": ["", "gravity=15"],
                                       "switching_thresholds": [1024]}}
IMPALA = {**_CARTPOLE, "architecture": "IMPALA", "num_envs": 4, "num_actors": 2, "unroll_length": 16,
          "batch_size": 2, "seed": 6,
          "modification_factory_kwargs": {"num_total_steps": 2048, "modifications": ["", "gravity=15"],
                                          "switching_thresholds": [1024]}}  # 64 steps per update

# name: (config, extra flags); every case switches regime once, inside the run
CASES: dict[str, tuple[dict, list[str]]] = {
    "ppo": (PPO, [*_EVAL, "--save_agent_with_switch", "--diagnostics_every", "512"]),
    "ppo_ewc": (PPO, ["--ewc", "ewc", "--ewc_fisher", "true", "--ewc_samples", "128"]),
    "ppo_ewc_cora": (PPO, ["--ewc", "online", "--ewc_fisher", "cora", "--ewc_samples", "128"]),
    "ppo_shrink_perturb": (PPO, ["--shrink_and_perturb", "--reset_optimizer_on_switch"]),
    "ppo_redo_l2_init": (PPO, ["--redo", "--l2_init", "--diagnostics_every", "512"]),
    "ppo_resets_parseval_nap": (PPO, ["--reset_layers", "1", "--parseval", "--nap", "--l2"]),
    "ppo_trac": (PPO, ["--trac"]),
    "ppo_c_chain": (PPO, ["--c_chain"]),
    "ppo_cbp": ({**PPO, "architecture": "PPO_CBP"}, ["--replacement_rate", "0.01", "--maturity_threshold", "4"]),
    "her": (HER, ["--eval_every", "512", *_EVAL[2:]]),
    "her_cbp": ({**HER, "architecture": "PPO_CBP"}, ["--replacement_rate", "0.01", "--maturity_threshold", "4"]),
    "dqn": (DQN, ["--save_agent_with_switch"]),
    "dqn_c_chain_shrink_perturb": (DQN, ["--c_chain", "--shrink_and_perturb", "--redo"]),
    "a2c": (A2C, ["--shrink_and_perturb", *_EVAL]),
    "impala": (IMPALA, ["--save_agent_with_switch", *_EVAL]),
    "impala_ewc_redo": (IMPALA, ["--ewc", "ewc", "--ewc_samples", "64", "--redo", "--shrink_and_perturb"]),
    "clear": ({**IMPALA, "architecture": "CLEAR"}, ["--clear_buffer_frames", "2048"]),
    "pnc": ({**IMPALA, "architecture": "PNC"}, ["--ewc_samples", "64", "--eval_at_switches", "--eval_episodes", "2",
                                                "--eval_num_envs", "2", "--eval_max_episode_steps", "60"]),
}
FAST = "ppo"  # the case of the default suite; the others are marked slow
REFERENCE_REVISION = "6fdc4fb"  # committed the plain recording; the machine recordings are of its outputs (same_as)



def _timing(key: str) -> bool:
    """A value that measures time, not behaviour."""
    return key in ("time", "charts/SPS", "seconds") or key.startswith("time/") or key.endswith(("_seconds", "_s"))


class SyncFleet:
    """IMPALA's fleet (agents/impala.py's `ActorFleet` interface) played in the learner's process: at `get_batch`
    the actors' `Unroller`s play one unroll each in turn with the newest published weights."""

    def __init__(self, args, settings, session, obs_space, n_actions: int, make_agent_fn=None):
        self.args, self.settings, self.session, self.make_agent_fn = args, settings, session, make_agent_fn
        self.obs_space, self.n_actions = obs_space, n_actions
        self.n = args.num_envs // args.num_actors
        self.modification = session.modification
        self.epoch = session.switches
        self.epoch_modification = {self.epoch: session.modification}
        self.unrollers: list = []
        self.weights: Optional[dict] = None
        self.version, self.turn = 0, 0

    def start(self) -> None:
        from agents.impala import Unroller

        self.unrollers = [Unroller(i, self.args, self.settings, self.modification, self.session.global_step, self.n,
                                   None, self.make_agent_fn) for i in range(self.args.num_actors)]

    def pids(self) -> list[int]:
        return []

    def describe(self) -> dict:
        return {"backend": "sync"}

    def local_actors(self) -> int:
        return self.args.num_actors

    def switch(self, modification: str, step: int = 0, seed: Optional[int] = None):
        self.epoch += 1
        self.modification = self.epoch_modification[self.epoch] = modification
        for u in self.unrollers:
            u.switch(modification, step)
        return None, {}  # as ActorFleet: the actors' envs reset where they run

    def publish(self, agent, version: int, force: bool = False) -> None:
        self.weights = {k: v.detach().cpu().clone() for k, v in agent.state_dict().items()}
        self.version = version

    def get_batch(self, count: int):
        import numpy as np
        import torch

        from agents.impala import unroll_specs

        items = []
        for _ in range(count):
            i, self.turn = self.turn, (self.turn + 1) % len(self.unrollers)
            u = self.unrollers[i]
            with torch.no_grad():
                for k, t in u.weights.items():
                    t.copy_(self.weights[k])
            specs = unroll_specs(self.args.unroll_length, self.n, self.obs_space, self.n_actions)
            arrays = {k: torch.zeros(shape, dtype=dtype).numpy() for k, (shape, dtype) in specs.items() if len(shape)}
            n_eps, _ = u.play(arrays)
            items.append((arrays, {"epoch": self.epoch, "regime": self.session.regime_index(self.modification),
                                   "version": self.version, "actor": i, "ep_count": n_eps}))
        batch = {k: torch.from_numpy(np.stack([a[k] for a, _ in items])) for k in items[0][0]}
        batch.update({k: torch.tensor([s[k] for _, s in items], dtype=torch.int64) for k in items[0][1]})
        return batch, [s["actor"] for _, s in items]

    def stats_delta(self) -> dict:
        return {}

    def scaler_states(self) -> list:
        return [None] * self.args.num_actors

    def load_scaler_states(self, states: list) -> None:
        pass

    def close(self) -> None:
        for u in self.unrollers:
            u.close()


def _run_in_this_process(case: str, workdir: str) -> None:
    """Train `case` here (the child process of `run_case`), IMPALA's family through `SyncFleet`."""
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    import agents.impala as impala

    impala.make_fleet = lambda args, settings, session, obs_space, n_actions, make_agent_fn: SyncFleet(
        args, settings, session, obs_space, n_actions, make_agent_fn)
    impala.start_forkserver = lambda settings: None
    import continual_training_example

    config, extra = CASES[case]
    cfg = os.path.join(workdir, f"{case}.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    continual_training_example.main(["--config", cfg, "--runs_dir", os.path.join(workdir, "runs"), "--run_name", case,
                                     "--no-progress-bar", *extra])


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def _behaviour(record: dict) -> list:
    """[kind, step, a digest of its names and values] (timings and the wall clock left out)."""
    kept = {k: v for k, v in record.items() if not _timing(k)}
    return [record["kind"], record.get("global_step"), _digest(kept)]


def _weights_hash(state: dict) -> str:
    import torch

    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(t.float().numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes())
    return h.hexdigest()[:20]


def _keys(value, depth: int = 0):
    """A checkpoint's structure: its keys, one level into dicts of named parts."""
    if isinstance(value, dict) and depth < 2 and all(isinstance(k, str) for k in value) and len(value) <= 40:
        return {k: _keys(v, depth + 1) for k, v in sorted(value.items())}
    return type(value).__name__


def run_case(case: str, workdir: str, root: str = ROOT) -> dict:
    """Train `case` in a subprocess with the code of the checkout `root` (its own copy of this helper runs the case);
    what it did: episodes, every other metrics record without timings, the evaluation table, the checkpoints' names
    and keys, the final weights' hash."""
    import torch

    from helpers.reference_revision import env_for

    os.makedirs(workdir, exist_ok=True)
    proc = subprocess.run([sys.executable, os.path.join(root, "tests", "helpers", "extension_reference.py"), "--run",
                           case, workdir], cwd=root, capture_output=True, text=True, timeout=900,
                          env=env_for(root, WANDB_MODE="offline", OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise RuntimeError(f"{case} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    run_dir = os.path.join(workdir, "runs", case)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    episodes = [[r["global_step"], r.get("env"), r["return"], r["length"]] for r in records if r["kind"] == "episode"]
    # every record but the episodes (above), the run's start (its code revision) and the evaluation's time share
    others = [r for r in records if r["kind"] not in ("episode", "start", "eval_summary")]
    names: dict[str, set] = {}  # what each kind of record logs
    for r in others:
        names.setdefault(r["kind"], set()).update(k for k in r if not _timing(k))
    table = None
    path = os.path.join(run_dir, "eval_table.csv")
    if os.path.exists(path):
        with open(path) as f:
            lines = f.read().splitlines()
        cols = lines[0].split(",")
        keep = [i for i, c in enumerate(cols) if not _timing(c)]
        table = [",".join(row.split(",")[i] for i in keep) for row in lines]
    checkpoints, weights = {}, None  # the final one's structure, the others' digest
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    for name in sorted(os.listdir(ckpt_dir)):
        state = torch.load(os.path.join(ckpt_dir, name), weights_only=False)
        keys = _keys({k: v for k, v in state.items() if k not in ("args", "rng", "curriculum")})
        checkpoints[name] = keys if name.startswith("final") else _digest(keys)
        if name.startswith("final"):
            weights = _weights_hash(state["model"])
    return {"episodes": episodes, "records": [_behaviour(r) for r in others],
            "names": {k: sorted(v) for k, v in sorted(names.items())}, "eval_table": table,
            "checkpoints": checkpoints, "weights": weights}


@functools.lru_cache(maxsize=1)
def machine_paths() -> tuple[str, str]:
    """This machine's recordings, the most specific first (see the module docstring); read once (kernel_isa starts a
    Python process)."""
    import torch

    from helpers.dqn_reference import kernel_isa

    base, capability = DATA[:-len(".json")], torch.backends.cpu.get_cpu_capability()
    return f"{base}.{capability}.{kernel_isa()}.json", f"{base}.{capability}.json"


def recorded() -> dict:
    """case -> recording on this machine: the plain file's, each replaced by the most specific machine file's."""
    with open(DATA) as f:
        cases = json.load(f)["cases"]
    for path in reversed(machine_paths()):
        if os.path.exists(path):
            with open(path) as f:
                cases.update(json.load(f)["cases"])
    return cases


def recordings(case: str) -> list[dict]:
    """Every recording of `case`: the plain file's and each machine file's that holds it."""
    with open(DATA) as f:
        out = [json.load(f)["cases"][case]]
    for path in sorted(glob.glob(glob.escape(DATA[:-len(".json")]) + ".*.json")):
        with open(path) as f:
            cases = json.load(f)["cases"]
        if case in cases:
            out.append(cases[case])
    return out


def run_reference_here(case: str, workdir: str) -> Optional[dict]:
    """`case` as REFERENCE_REVISION runs it on this machine; None when this checkout has no such revision."""
    from helpers.reference_revision import checkout

    tree = checkout(REFERENCE_REVISION)
    return None if tree is None else run_case(case, workdir, root=tree)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--run":
        return _run_in_this_process(sys.argv[2], sys.argv[3])
    if sys.argv[1:2] == ["--write-machine"] and "--same-as" in sys.argv[:-1]:
        at = sys.argv.index("--same-as")
        cases, same_as = sys.argv[2:at], sys.argv[at + 1]
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                  text=True).stdout.strip()
        out = {"revision": revision, "same_as": same_as, "cases": {}}
        for case in cases:
            with tempfile.TemporaryDirectory() as tmp:
                out["cases"][case] = run_case(case, tmp)
        with open(machine_paths()[0], "w") as f:
            json.dump(out, f, separators=(",", ":"))
        return print("wrote", machine_paths()[0])
    if sys.argv[1:2] != ["--write"]:
        sys.exit("usage: python tests/helpers/extension_reference.py --write [CASE ...]   (rewrites "
                 "tests/data/extension_reference.json)")
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    data = {"revision": revision, "cases": {}}
    if os.path.exists(DATA):
        with open(DATA) as f:
            data["cases"] = json.load(f)["cases"]
    for case in sys.argv[2:] or CASES:
        with tempfile.TemporaryDirectory() as tmp:
            data["cases"][case] = run_case(case, tmp)
        print(case, len(data["cases"][case]["episodes"]), "episodes", flush=True)
        with open(DATA, "w") as f:
            json.dump(data, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
