"""Faults of the trainer's own process, planned the way continual.testing.faults plans are (`CONTINUAL_FAULT`,
`point:n`: the n-th time the point is reached, counting from 1) but installed by monkeypatching the production
functions at the moment each point stands for, so that those functions carry no test parameters:

- `checkpoint_write`: SIGKILL once a checkpoint's temporary file is written and fsynced, before its rename;
- `switch`: SIGKILL just before the envs switch (RunSession.maybe_switch, the switch already counted);
- `write_checkpoint`, `write_final_model`: a checkpoint's / the final policy's write fails as on a full disk (OSError
  ENOSPC), its temporary file written and not yet flushed;
- `write_metrics`, `write_eval_table`: a metrics.jsonl record / the continual evaluation's rows fail as on a full disk.

Kills are logged to `CONTINUAL_FAULT_LOG` as continual.testing.faults logs them. Points inside spawned processes (env
workers, IMPALA actors) and the IMPALA learner's mid-publish and mid-broadcast kills stay hooks in
continual.testing.faults (its docstring says why).

`python tests/helpers/trainer_faults.py SCRIPT ARGS...` runs SCRIPT as `__main__` with the plan's trainer points
installed; `faulty(argv, env)` puts that in front of a script's argv when the plan names one (run_script, run_killed).
"""

from __future__ import annotations

import errno
import os
import runpy
import sys

TRAINER_POINTS = {"checkpoint_write", "switch", "write_checkpoint", "write_final_model", "write_metrics",
                  "write_eval_table"}
HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def faulty(argv: list[str], env: dict | None) -> list[str]:
    """`argv` of `python argv`, run through this file when `env`'s CONTINUAL_FAULT plans a trainer point."""
    from continual.testing.faults import _parse

    plan = _parse((env or {}).get("CONTINUAL_FAULT", ""))
    return [HERE, *argv] if TRAINER_POINTS & set(plan) else list(argv)


def install(spec: str) -> None:
    """Monkeypatch the production functions for the trainer points planned in `spec` (a CONTINUAL_FAULT value)."""
    import torch

    from continual import io
    from continual.testing.faults import _kill, _parse
    from continual.training import checkpoint, session

    plan = {p: n for p, (n, _) in _parse(spec).items() if p in TRAINER_POINTS}
    counts: dict[str, int] = {}

    def fires(point: str) -> bool:
        counts[point] = counts.get(point, 0) + 1
        return counts[point] == plan.get(point)

    def full_disk(path: str) -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    replace, save, write, switch_seed = os.replace, torch.save, io.AppendFile.write, session.switch_seed
    os_write_real = os.write

    def replace_then_maybe_die(src, dst, *a, **k):
        if os.path.basename(src).startswith(io.TMP_PREFIX) and checkpoint.in_checkpoint_dir(dst) \
                and fires("checkpoint_write"):
            _kill("checkpoint_write", os.getpid())
        return replace(src, dst, *a, **k)

    def save_then_maybe_fail(obj, f, *a, **k):
        save(obj, f, *a, **k)
        name = getattr(f, "name", "")
        point = "write_checkpoint" if checkpoint.in_checkpoint_dir(name) else \
            "write_final_model" if str(name).endswith(checkpoint.SUFFIX) else None
        if point is not None and fires(point):
            raise full_disk(name)

    failing: set[int] = set()  # descriptors whose next os.write finds the disk full

    def write_or_fail(self, text):
        point = {"metrics.jsonl": "write_metrics", "eval_table.csv": "write_eval_table"}.get(
            os.path.basename(self.path))
        if point is not None and fires(point):
            failing.add(self._fd)  # the write itself fails: AppendFile's own handling runs
        return write(self, text)

    def os_write(fd, data):
        if fd in failing:
            failing.discard(fd)
            raise full_disk("")
        return os_write_real(fd, data)

    def switch_seed_or_die(*a, **k):  # maybe_switch asks for the switch's seed right before envs.switch
        if fires("switch"):
            _kill("switch", os.getpid())
        return switch_seed(*a, **k)

    if "checkpoint_write" in plan:
        os.replace = replace_then_maybe_die
    if {"write_checkpoint", "write_final_model"} & set(plan):
        torch.save = save_then_maybe_fail
    if {"write_metrics", "write_eval_table"} & set(plan):
        io.AppendFile.write, os.write = write_or_fail, os_write
    if "switch" in plan:
        session.switch_seed = switch_seed_or_die


if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    # as `python SCRIPT` would, this repository's `continual` first (the patches go into the one the script uses)
    sys.path[0:1] = [os.path.dirname(os.path.abspath(sys.argv[0])), ROOT]
    install(os.environ.get("CONTINUAL_FAULT", ""))
    runpy.run_path(sys.argv[0], run_name="__main__")
