"""Evaluations of an experiment's finished runs that need their policies, made while the policies are there.

    python -m continual.launch.evaluate FOLDER --into DIR [--watch SECONDS] -- EVAL_FLAGS...

The archive (continual.launch.archive) keeps a run without its checkpoints and final policy, so an evaluation beside
the experiment's own (a declared greedy variant, or a column added after the start) has to run on the experiment
folder while the policies are there. This runs `eval.py --agent_path RUN/<exp_name>.cleanrl_model --output DIR/<run>
EVAL_FLAGS` once for every finished run of FOLDER (one with its final policy file) that has no `DIR/<run>.json` yet,
each in a process of its own, so a failure costs that run's evaluation and is named, and the others go on.
`--watch N` makes a pass every N seconds until interrupted, to follow a launcher that is still running. The JSONs are
what `python -m continual.report robustness --variant / --post-hoc` reads.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
from typing import Optional, Sequence

from continual.errors import UserError, exit_on_user_error
from continual.launch.launcher import omp_wait_policy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESERVED = ("--agent_path", "--agent-path", "--output")  # this tool sets them, one run at a time


def final_policy(run_dir: str) -> Optional[str]:
    """The run's final policy file (written when training ends), None while the run is unfinished."""
    found = sorted(glob.glob(os.path.join(glob.escape(run_dir), "*.cleanrl_model")))
    return found[0] if len(found) == 1 else None


def pending(folder: str, into: str) -> list[tuple[str, str]]:
    """(run name, final policy) of every finished run without its JSON in `into`, in the folder's order."""
    root = os.path.join(folder, "runs")
    out = []
    for run in sorted(os.listdir(root)):
        policy = final_policy(os.path.join(root, run))
        if policy is not None and not os.path.exists(os.path.join(into, run + ".json")):
            out.append((run, policy))
    return out


def evaluate_pass(folder: str, into: str, flags: Sequence[str], script: str) -> tuple[list[str], list[str]]:
    """One pass: the runs evaluated now, and those whose evaluation failed (named, retried on the next pass)."""
    done, failed = [], []
    for run, policy in pending(folder, into):
        print(f"{time.strftime('%H:%M:%S')} evaluating {run}", flush=True)
        proc = subprocess.run([sys.executable, script, "--agent_path", policy, "--output", os.path.join(into, run),
                               "--no-progress-bar", *flags], capture_output=True, text=True,
                              env={**os.environ, "OMP_WAIT_POLICY": omp_wait_policy()})  # beside the runs
        if proc.returncode == 0 and os.path.exists(os.path.join(into, run + ".json")):
            done.append(run)
        else:
            last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
            print(f"{run}: eval.py exited {proc.returncode}: {last}", file=sys.stderr, flush=True)
            failed.append(run)
    return done, failed


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m continual.launch.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("folder", help="the experiment folder (its runs/ holds one run directory per entry)")
    p.add_argument("--into", required=True, help="where each run's eval.py output goes (DIR/<run>.json)")
    p.add_argument("--watch", type=float, help="pass again every this many seconds until interrupted")
    p.add_argument("--script", default=os.path.join(ROOT, "eval.py"), help="the eval.py to run (default: this tree's)")
    a = p.parse_args(own)
    if not os.path.isdir(os.path.join(a.folder, "runs")):
        raise UserError(f"{a.folder}: no runs/ folder (is it an experiment folder?)")
    taken = [f for f in flags if f.split("=", 1)[0] in RESERVED]
    if taken:
        raise UserError(f"{taken[0].split('=', 1)[0]} is set per run by this tool; give the other eval.py flags "
                        f"after --")
    if a.watch is not None and a.watch <= 0:
        raise UserError(f"--watch must be a positive number of seconds, got {a.watch:g}")
    if not os.path.isfile(a.script):
        raise UserError(f"--script {a.script}: no such file")
    os.makedirs(a.into, exist_ok=True)
    while True:
        done, failed = evaluate_pass(a.folder, a.into, flags, a.script)
        if a.watch is None:
            print(f"{len(done)} evaluated, {len(failed)} failed"
                  + (f" ({', '.join(failed)})" if failed else "") + f", into {a.into}")
            return 1 if failed else 0
        time.sleep(a.watch)


if __name__ == "__main__":
    sys.exit(main())
