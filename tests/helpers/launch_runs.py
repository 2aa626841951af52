"""The launcher's tests share these (tests/test_launch*.py): a small CartPole config, a JSON writer, the environment
a child process needs to import this checkout, and a stand-in training script whose behaviour per seed a plan sets."""

from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
CARTPOLE = {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64}


def write(path, data) -> str:
    with open(path, "w") as f:
        json.dump(data, f)
    return str(path)


def env() -> dict:
    return {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), "WANDB_MODE": "offline"}


FAKE = r'''
"""Stand-in for continual_training_example.py: a run directory, a checkpoint, metrics; behaviour by seed from
plan.json beside this file (one action per attempt: ok, fail, usage, wait, storage, corrupt)."""
import glob, json, os, sys, time
argv = sys.argv[1:]
opt = lambda k: argv[argv.index(k) + 1] if k in argv else None
here = os.path.dirname(os.path.abspath(__file__))
if opt("--resume"):
    run_dir = opt("--resume")
    cfg = json.load(open(os.path.join(run_dir, "config.json")))
else:
    cfg = json.load(open(opt("--config")))
    run_dir = os.path.join(opt("--runs_dir"), opt("--run_name"))
    os.makedirs(os.path.join(run_dir, "checkpoints"))
    json.dump({**cfg, "resolved_total_timesteps": 100}, open(os.path.join(run_dir, "config.json"), "w"))
with open(os.path.join(run_dir, "attempts"), "a") as f:
    f.write(f"{os.getpid()} {'resume' if opt('--resume') else 'fresh'} {time.time()}\n")
open(os.path.join(run_dir, "omp_wait_policy"), "w").write(os.environ.get("OMP_WAIT_POLICY", "unset"))
n = len(open(os.path.join(run_dir, "attempts")).readlines())
n += sum(len(open(os.path.join(p, "attempts")).readlines()) for p in glob.glob(run_dir + ".incomplete*"))
plan = json.load(open(os.path.join(here, "plan.json"))).get(str(cfg.get("seed", 1)), ["ok"])
action = plan[min(n, len(plan)) - 1]
import zipfile
ckpt = os.path.join(run_dir, "checkpoints", f"periodic__step{50 * n}.cleanrl_model")
with zipfile.ZipFile(ckpt, "w") as z:  # a whole archive, as torch.save writes (the launcher checks for one)
    z.writestr("archive/data.pkl", b"x")
if action == "corrupt":  # a damaged newest checkpoint (a partial copy, bit rot), then a failure
    open(ckpt, "wb").write(b"PK\x03\x04 cut")
with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"kind": "iteration", "global_step": 50 * n, "charts/SPS": 7}) + "\n")
    f.write(json.dumps({"kind": "episode", "global_step": 50 * n, "return": 1.5}) + "\n")
while action == "wait" and not os.path.exists(os.path.join(here, "go")):
    time.sleep(0.1)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0.2")))
if action == "fail":
    sys.exit("RuntimeError: boom")
if action in ("storage", "corrupt"):
    sys.exit("error: no space left on device writing x; the last checkpoint is y (step 50); free space and --resume")
if action == "usage":
    print("error: refused", file=sys.stderr)
    sys.exit(2)
with open(os.path.join(run_dir, "attempts"), "a") as f:
    f.write(f"{os.getpid()} end {time.time()}\n")
'''


def fake_script(folder, plan) -> str:
    os.makedirs(folder, exist_ok=True)
    write(os.path.join(folder, "plan.json"), plan)
    path = os.path.join(folder, "fake_train.py")
    with open(path, "w") as f:
        f.write(FAKE)
    return path


def attempts(run_dir) -> list[list[str]]:
    with open(os.path.join(run_dir, "attempts")) as f:
        return [ln.split() for ln in f]
