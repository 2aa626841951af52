"""An experiment's finished runs kept where they outlive the machine: a copy of the experiment folder without what
only a running or resuming run needs.

    python -m continual.launch EXPERIMENT.json --folder SCRATCH --archive KEPT   # archive each run as it finishes
    python -m continual.launch.archive FOLDER KEPT                               # archive a folder's finished runs

KEPT has the experiment folder's layout (`experiment.json`, `configs/`, `queue/<entry>.status.json`, `runs/<entry>/`),
holding the entries whose state is "done" and, of each run directory, every file except what only a resume needs or
another tool keeps (checkpoints, CLEAR's replay buffer, TensorBoard event files, W&B and video folders) and any file
over 20 MB (named in the entry's `archive_left_out.json`); `metrics.jsonl` is stored gzipped (`metrics.jsonl.gz`, read
back transparently by `continual.io.read_jsonl`). A MinAtar run of 2M steps keeps 0.1-1.6 MB (IMPALA's learner logs
every update), so KEPT fits in a git repository: the reports read it as they read the folder, and a launch with a
new, empty folder and the same `--archive` restores the archived entries first and runs only the others (a session
whose scratch disk is gone loses only its unfinished runs).

Each entry is written to a temporary name and renamed into place, its status file last: a kill leaves an entry whole
or absent, never a run directory without the status that makes it count.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import sys
from typing import Optional, Sequence

import tyro

from continual.config.loading import cli
from continual.errors import UserError, exit_on_user_error
from continual.launch.queue import DONE, Queue

SKIPPED_DIRS = ("checkpoints", "replay", "wandb", "videos")  # replay: CLEAR's buffer (252 MB on MinAtar)
MAX_FILE_BYTES = 20 * 2**20
SKIPPED_PREFIXES = ("events.out.tfevents.",)
METRICS = "metrics.jsonl"


def kept(name: str, is_dir: bool) -> bool:
    return not (name in SKIPPED_DIRS if is_dir else name.startswith(SKIPPED_PREFIXES))


def copy_run(src: str, dst: str) -> None:
    """`src`'s kept files into a new directory `dst` (metrics.jsonl gzipped); files over MAX_FILE_BYTES are named in
    `dst/archive_left_out.json` instead."""
    left_out: list[dict] = []
    _copy(src, dst, src, left_out)
    if left_out:
        with open(os.path.join(dst, "archive_left_out.json"), "w") as f:
            json.dump(left_out, f, indent=1)


def _copy(src: str, dst: str, root: str, left_out: list[dict]) -> None:
    os.makedirs(dst)
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if not kept(name, os.path.isdir(path)):
            continue
        if os.path.isdir(path):
            _copy(path, os.path.join(dst, name), root, left_out)
        elif name == METRICS:
            # mtime 0: the same run gives the same bytes (no churn in a git repository)
            with open(path, "rb") as f, open(os.path.join(dst, name + ".gz"), "wb") as out, \
                    gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=out, mtime=0) as g:
                shutil.copyfileobj(f, g)
        elif (size := os.path.getsize(path)) > MAX_FILE_BYTES:
            left_out.append({"file": os.path.relpath(path, root), "bytes": size})
        else:
            shutil.copy2(path, os.path.join(dst, name))


def copy_status(src: Queue, dst: Queue, entry: str) -> None:
    """An entry's status file copied whole (a temporary file renamed into place): written last, it makes the entry
    count."""
    path = os.path.join(dst.dir, entry + ".status.json")
    shutil.copy2(os.path.join(src.dir, entry + ".status.json"), path + ".copying")
    os.replace(path + ".copying", path)


def archived(kept_queue: Queue, entry: str) -> bool:
    return kept_queue.status(entry).get("state") == DONE and os.path.isdir(kept_queue.run_dir(entry))


def archive_entry(queue: Queue, kept_queue: Queue, entry: str) -> bool:
    """Copy a finished entry of `queue`'s folder into the archive; False (nothing written) unless it is done there and
    not archived yet."""
    status = queue.status(entry)
    if status.get("state") != DONE or not os.path.isdir(queue.run_dir(entry)):
        return False
    if archived(kept_queue, entry) and kept_queue.status(entry) == status:
        return False  # archived already
    kept_queue.create()
    shutil.copy2(os.path.join(queue.folder, "experiment.json"), os.path.join(kept_queue.folder, "experiment.json"))
    shutil.copy2(queue.config_path(entry), kept_queue.config_path(entry))
    dst = kept_queue.run_dir(entry)
    tmp = dst + ".archiving"
    shutil.rmtree(tmp, ignore_errors=True)
    copy_run(queue.run_dir(entry), tmp)
    shutil.rmtree(dst, ignore_errors=True)  # an older copy (the entry was re-run)
    os.replace(tmp, dst)
    copy_status(queue, kept_queue, entry)
    return True


def restore_entry(kept_queue: Queue, queue: Queue, entry: str) -> bool:
    """An archived entry copied into `queue`'s folder when that folder has no run of it yet (a run there, finished
    or not, is newer than the archive and stays)."""
    if not archived(kept_queue, entry) or os.path.exists(queue.run_dir(entry)):
        return False
    tmp = queue.run_dir(entry) + ".restoring"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(kept_queue.run_dir(entry), tmp)
    os.replace(tmp, queue.run_dir(entry))
    if not os.path.exists(queue.config_path(entry)):
        shutil.copy2(kept_queue.config_path(entry), queue.config_path(entry))
    copy_status(kept_queue, queue, entry)
    return True


def check_archive(kept: str, experiment_path: str) -> None:
    """An archive of another experiment is refused (its entries would be taken for this one's)."""
    old = os.path.join(kept, "experiment.json")
    if os.path.exists(old):
        with open(old) as f, open(experiment_path) as g:
            if json.load(f) != json.load(g):
                raise UserError(f"archive: {kept!r} holds another experiment (its experiment.json differs from "
                                f"{experiment_path!r}): use another --archive for a changed experiment")


@dataclasses.dataclass
class ArchiveArgs:
    folder: tyro.conf.Positional[str]
    """the experiment folder (as given to python -m continual.launch --folder)"""
    archive: tyro.conf.Positional[str]
    """where its finished runs are kept (created if missing; entries already there are replaced)"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(ArchiveArgs, argv, default=None, description=__doc__.splitlines()[0])
    if not os.path.exists(os.path.join(args.folder, "experiment.json")):
        raise UserError(f"folder: {args.folder!r} is not an experiment folder (no experiment.json)")
    check_archive(args.archive, os.path.join(args.folder, "experiment.json"))
    queue, kept_queue = Queue(args.folder), Queue(args.archive)
    names = sorted(n[:-len(".status.json")] for n in os.listdir(queue.dir) if n.endswith(".status.json"))
    n = sum(archive_entry(queue, kept_queue, e) for e in names)
    print(f"{n} finished entries of {len(names)} archived in {kept_queue.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main)())
