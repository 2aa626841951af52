"""Run some entries of a launcher experiment file on a lent device machine, for a fixed time, then pack what came out.

    python -m continual.launch.device EXPERIMENT.json --entries 0 1 --seconds 420 --out $OUT [--keep-checkpoints]

Each entry runs as `continual_training_example.py --config <entry config>` (the launcher's own run config; `--script`
another training script) under `timeout -s TERM`, which makes a run write an interrupted checkpoint and exit; all
entries at once, one process each. Run directories go to FOLDER/runs/<entry> (`--folder`, default
experiments/<name>: the launcher's layout, so `python -m continual.launch` resumes them where the checkpoints came
back). Packed into OUT: one <entry>.tar.gz per run (config, metrics, eval table, TensorBoard events, logs; checkpoints
only with --keep-checkpoints), device.json (machine, versions, per-run wall time, steps reached, steps/s). Bad input
(an entry the file does not have, a time that is not positive) is one line and exit 2 before anything is created.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from typing import Optional, Sequence

from continual.errors import UserError, exit_on_user_error
from continual.launch.experiment import load_experiment, run_config


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m continual.launch.device", description=__doc__.splitlines()[0])
    p.add_argument("experiment")
    p.add_argument("--entries", type=int, nargs="+", required=True)
    p.add_argument("--seconds", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--keep-checkpoints", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--folder", help="the experiment folder (default: experiments/<the experiment's name>)")
    p.add_argument("--script", default="continual_training_example.py", help="the training script")
    a = p.parse_args(argv)
    exp = load_experiment(a.experiment)
    for i in a.entries:
        if not 0 <= i < len(exp.entries):
            raise UserError(f"--entries: {a.experiment} has entries 0-{len(exp.entries) - 1}, not {i}")
    if a.seconds <= 0:
        raise UserError(f"--seconds must be positive, got {a.seconds}")
    folder = a.folder or os.path.join("experiments", exp.name)
    os.makedirs(os.path.join(folder, "configs"), exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    procs = []
    for i in a.entries:
        entry = exp.entries[i]
        cfg_path = os.path.join(folder, "configs", f"{entry.name}.json")
        with open(cfg_path, "w") as f:
            json.dump(run_config(entry, exp.name), f, indent=1)
        log = open(os.path.join(folder, f"{entry.name}.log"), "w")
        env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
        cmd = ["timeout", "-s", "TERM", "-k", "60", str(a.seconds), sys.executable, a.script,
               "--config", cfg_path, "--runs_dir", os.path.join(folder, "runs"), "--run_name", entry.name]
        procs.append((entry, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), time.time(), log))
        print("started", entry.index, entry.label, flush=True)
    report = {"machine": platform.node(), "cpus": os.cpu_count(), "python": sys.version.split()[0], "runs": {}}
    try:
        import torch
        report["torch"] = torch.__version__
        report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as e:  # noqa: BLE001
        report["torch"] = repr(e)
    for entry, proc, t0, log in procs:
        rc = proc.wait()
        log.close()
        run_dir = os.path.join(folder, "runs", entry.name)
        steps = None
        path = os.path.join(run_dir, "metrics.jsonl")
        if os.path.exists(path):
            for line in open(path):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                steps = rec.get("global_step", steps)
        wall = time.time() - t0
        report["runs"][entry.name] = {"rc": rc, "wall_s": round(wall, 1), "steps": steps,
                                      "steps_per_s": round(steps / wall, 1) if steps else None}
        print(entry.name, report["runs"][entry.name], flush=True)
        with tarfile.open(os.path.join(a.out, f"{entry.name}.tar.gz"), "w:gz") as tar:
            tar.add(os.path.join(folder, f"{entry.name}.log"), arcname=f"{entry.name}/device.log")
            if os.path.isdir(run_dir):
                for root, _, files in os.walk(run_dir):
                    for fn in files:
                        full = os.path.join(root, fn)
                        if fn.endswith(".cleanrl_model") and not a.keep_checkpoints:
                            continue
                        tar.add(full, arcname=os.path.join(entry.name, os.path.relpath(full, run_dir)))
    with open(os.path.join(a.out, "device.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
