"""Unfinished runs carried to the next machine: each unfinished entry's run directory as its resume needs it, one
lzma-compressed tar per entry in the archive's `carry/` folder, so that a session whose machine is replaced (the
scratch folder and its checkpoints gone) resumes the runs where the last carry left them, not at step 0.

    python -m continual.launch EXPERIMENT.json --folder SCRATCH --archive KEPT   # carries its unfinished runs as it stops
    python -m continual.launch.carry FOLDER KEPT                                 # carry a folder's unfinished runs now
    python -m continual.launch.carry --verify KEPT                               # before committing it: would it resume?

    KEPT/carry/
      <entry>.json              {"format", "entry", "step", "tar", "bytes", "sha256", "config", "status"}
      <entry>.step<N>.tar.xz    the run directory: every file but TensorBoard events, W&B and video folders and the
                                checkpoints other than the newest whole one (the one --resume takes), at step N
      experiment.json, declarations.json    the experiment's files (a new folder goes on with its declarations)

The launcher carries as it stops and, while its runs run, every `--carry_every` minutes (30 by default): a live
carry takes each run's newest whole checkpoint and its records as they are then; the records written after that
checkpoint are dropped when it resumes, as at any resume.

A launch with a new folder and the same `--archive` restores the archive's finished entries, then each other entry
that has a carry and no run directory there yet: the tar is checked against its digest and the entry's config against
the experiment file (either differing: one line, exit 2, before anything is written), unpacked into the entry's run
directory, and the entry resumes from that checkpoint as it would have in its own folder (the same file, byte for
byte; an entry that had failed stays failed, for --retry_failed). A run directory already in the folder is newer than
any carry and stays. An entry's carry is replaced when it is carried again from a newer checkpoint (the json, renamed
into place last, names the tar it describes: a kill leaves the old pair or the new one) and removed once the entry is
archived finished or started again from step 0 (--restart_failed). Not carried: TensorBoard events and W&B files (metrics.jsonl holds every record), the launcher's
logs, older checkpoints (those at switches too).

The carry lives in the archive's folder, outside its manifest: commit it with the archive at a session's end. Git
keeps every carried version, so the repository grows by the carried bytes at each commit (a Continual MinAtar DQN
seed with its 100k-transition replay: docs/launcher.md gives the measured size).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
import sys
import tarfile
from typing import Callable, Optional, Sequence

import tyro

from continual.config.loading import cli
from continual.errors import UserError, exit_on_user_error, one_line
from continual.io import TMP_PREFIX, atomic_write_text
from continual.launch import archive, declarations
from continual.launch import code as code_pin
from continual.launch.archive import CARRY, EXPERIMENT_FILES, digest
from continual.launch.queue import DONE, FAILED, Queue
from continual.training.checkpoint import CHECKPOINT_DIR, newest_whole, step_of

FORMAT = "continual-carry/1"
# what the archive leaves out but a resume needs (the checkpoints, CLEAR's replay) stays; temporary files go
SKIPPED_DIRS = tuple(d for d in archive.SKIPPED_DIRS if d not in (CHECKPOINT_DIR, "replay"))
SKIPPED_PREFIXES = (*archive.SKIPPED_PREFIXES, TMP_PREFIX)
PRESET = 6  # xz's default: a MinAtar DQN checkpoint of 107 MB (its replay's frames as bools) in ~3 s to ~2-4 MB


def folder_of(kept: str) -> str:
    return os.path.join(kept, CARRY)


def members(run_dir: str, checkpoint: str) -> list[str]:
    """The files of `run_dir` a carry holds (relative paths, sorted): all but TensorBoard events, temporary files,
    W&B and video folders, and of the checkpoints folder only `checkpoint`."""
    out, checkpoint = [], os.path.normpath(os.path.abspath(checkpoint))
    for dirpath, dirnames, filenames in os.walk(run_dir):
        rel_dir = os.path.relpath(dirpath, run_dir)
        dirnames[:] = sorted(d for d in dirnames if not (rel_dir == "." and d in SKIPPED_DIRS))
        for name in sorted(filenames):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if name.startswith(SKIPPED_PREFIXES):
                continue
            if rel.split(os.sep)[0] == CHECKPOINT_DIR and \
                    os.path.normpath(os.path.abspath(os.path.join(run_dir, rel))) != checkpoint:
                continue
            out.append(rel)
    return out


def read_meta(kept: str, entry: str) -> Optional[dict]:
    """An entry's carry description, None when it has none; one that does not parse is a UserError."""
    path = os.path.join(folder_of(kept), entry + ".json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("entry") != entry or \
                not all(k in meta for k in ("step", "tar", "bytes", "sha256", "config", "status")):
            raise ValueError(f"not a {FORMAT} description of {entry!r}")
    except (OSError, ValueError) as e:
        raise UserError(f"carry: {path!r} cannot be read: {one_line(str(e))[:200]}") from None
    return meta


def entries(kept: str) -> list[str]:
    folder = folder_of(kept)
    if not os.path.isdir(folder):
        return []
    return sorted(n[:-len(".json")] for n in os.listdir(folder)
                  if n.endswith(".json") and n not in EXPERIMENT_FILES)


def carry_entry(queue: Queue, kept: str, entry: str, config: dict) -> Optional[int]:
    """Carry an unfinished entry of `queue`'s folder (its newest whole checkpoint and records) into `kept`'s carry;
    the bytes written, None when there is nothing to carry (finished, no run directory or no whole checkpoint) or its
    carry already holds that checkpoint."""
    status = queue.status(entry)
    run_dir = queue.run_dir(entry)
    if status.get("state") == DONE or not os.path.isdir(run_dir):
        return None
    checkpoint = newest_whole(run_dir)
    if checkpoint is None:
        return None
    folder = folder_of(kept)
    os.makedirs(folder, exist_ok=True)
    step = step_of(checkpoint)
    source = digest(checkpoint)
    old = read_meta(kept, entry)
    if old is not None and old.get("checkpoint") == {"name": os.path.basename(checkpoint), **source} and \
            _tar_matches(folder, old):
        _remove_unnamed(folder, entry, old["tar"])  # what a carry cut after its description's rename left
        return None  # carried already
    tar_name = f"{entry}.step{step}.tar.xz"
    tmp = os.path.join(folder, tar_name + ".carrying")
    try:
        with tarfile.open(tmp, "w:xz", preset=PRESET) as tar:
            for rel in members(run_dir, checkpoint):
                info = tar.gettarinfo(os.path.join(run_dir, rel), arcname=rel.replace(os.sep, "/"))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(os.path.join(run_dir, rel), "rb") as f:
                    tar.addfile(info, f)
    except FileNotFoundError:  # a running run removed a file as it was packed (a pruned checkpoint): the next carry
        os.unlink(tmp)
        return None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    written = digest(tmp)
    os.replace(tmp, os.path.join(folder, tar_name))
    meta = {"format": FORMAT, "entry": entry, "step": step, "tar": tar_name, **written,
            "checkpoint": {"name": os.path.basename(checkpoint), **source}, "config": config, "status": status}
    atomic_write_text(os.path.join(folder, entry + ".json"), json.dumps(meta, indent=1, sort_keys=True) + "\n")
    _remove_unnamed(folder, entry, tar_name)
    return written["bytes"]


def _tar_matches(folder: str, meta: dict) -> bool:
    path = os.path.join(folder, meta["tar"])
    return os.path.isfile(path) and digest(path) == {"bytes": meta["bytes"], "sha256": meta["sha256"]}


def _remove_unnamed(folder: str, entry: str, keep: Optional[str]) -> None:
    """The tars of `entry` its description does not name (older carries, one cut by a kill)."""
    for path in glob.glob(os.path.join(glob.escape(folder), glob.escape(entry) + ".step*.tar.xz*")):
        if os.path.basename(path) != keep:
            os.unlink(path)


def drop(kept: str, entry: str) -> None:
    """Remove an entry's carry (archived finished, or started again): the description first, so no tar is left
    described."""
    folder = folder_of(kept)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, entry + ".json"))
    if os.path.isdir(folder):
        _remove_unnamed(folder, entry, None)


def check(kept: str, configs: dict, what: str) -> None:
    """Refuse, before anything is written, a carry that another experiment wrote (an entry whose config is not
    `configs[entry]`) or whose tar is missing or not the one its description names (an edit, a partial checkout)."""
    for entry in entries(kept):
        meta = read_meta(kept, entry)
        if meta["config"] != configs.get(entry):
            why = "has no such entry" if entry not in configs else "configures it differently"
            raise UserError(f"carry: {folder_of(kept)!r} holds another experiment's runs (its entry {entry!r}: "
                            f"{what!r} {why}): use another --archive for a changed experiment")
        if not _tar_matches(folder_of(kept), meta):
            raise UserError(f"carry: {os.path.join(folder_of(kept), meta['tar'])!r} is missing or not the file "
                            f"{entry}.json describes (git status / git checkout the folder, or remove both files to "
                            f"start the entry again)")


def restore_entry(kept: str, queue: Queue, entry: str) -> Optional[int]:
    """Unpack a carried entry into `queue`'s folder when that folder has no run directory of it (a run there is newer
    than any carry); the step it resumes from, None when nothing was restored. Call `check` first."""
    meta = read_meta(kept, entry)
    run_dir = queue.run_dir(entry)
    if meta is None or os.path.lexists(run_dir):
        return None
    tmp = run_dir + ".restoring"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(os.path.join(folder_of(kept), meta["tar"]), "r:xz") as tar:
        tar.extractall(tmp, filter="data")  # no absolute paths, links out of the folder or device files
    os.replace(tmp, run_dir)
    if not os.path.exists(queue.config_path(entry)):
        atomic_write_text(queue.config_path(entry), json.dumps(meta["config"], indent=2))
    status = meta["status"]  # a failed entry stays failed (--retry_failed runs it again, from this checkpoint)
    queue.set_status(entry, **{**status, "state": FAILED if status.get("state") == FAILED else "interrupted",
                               "carried": meta["step"]})
    return meta["step"]


def carry_folder(queue: Queue, kept: str, configs: dict,
                 between: Callable[[], None] = lambda: None) -> tuple[int, int]:
    """Carry every unfinished entry of `queue`'s folder that has a whole checkpoint, and the experiment's own files
    once: (entries carried now, bytes). `between` is called after each entry (a running launcher's heartbeats: a
    MinAtar DQN entry takes ~7 s)."""
    n = total = 0
    os.makedirs(folder_of(kept), exist_ok=True)
    for name in EXPERIMENT_FILES:  # as the launcher's folder has them (a new folder goes on with its declarations)
        src, dst = os.path.join(queue.folder, name), os.path.join(folder_of(kept), name)
        if os.path.exists(src):
            shutil.copy2(src, dst + ".copying")
            os.replace(dst + ".copying", dst)
    for entry in sorted(configs):
        written = carry_entry(queue, kept, entry, configs[entry])
        between()
        if written is not None:
            n, total = n + 1, total + written
    return n, total


def verify(kept: str) -> list[str]:
    """What in `kept`'s carry would not resume, one line each (empty: it would): a description that cannot be read, a
    tar missing or not the bytes its description names, a tar no description names (one a kill cut, or an edit). The
    check to run before committing a carry; a launch refuses the first two (`check`)."""
    folder, problems, named = folder_of(kept), [], set()
    for entry in entries(kept):
        try:
            meta = read_meta(kept, entry)
        except UserError as e:
            problems.append(str(e))
            continue
        named.add(meta["tar"])
        if not _tar_matches(folder, meta):
            problems.append(f"{entry}: {meta['tar']} is missing or not the file {entry}.json describes")
    for path in sorted(glob.glob(os.path.join(glob.escape(folder), "*.tar.xz*"))):
        if os.path.basename(path) not in named:
            problems.append(f"{os.path.basename(path)}: no description names it")
    return problems


def size(kept: str) -> int:
    """The bytes of the carry's tars (what a commit of it adds)."""
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(glob.escape(folder_of(kept)), "*.tar.xz")))


@dataclasses.dataclass
class CarryArgs:
    folder: tyro.conf.Positional[Optional[str]] = None
    """the experiment folder (as given to python -m continual.launch --folder)"""
    archive: tyro.conf.Positional[Optional[str]] = None
    """the archive its finished runs are kept in (python -m continual.launch --archive); the carry goes to its carry/"""
    verify: Optional[str] = None
    """check an archive's carry, writing nothing: every tar is the one its description names and no tar is left
    undescribed (exit 2 with one line when it is not; run it before committing a carry)"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(CarryArgs, argv, default=None, description=__doc__.splitlines()[0])
    given = (args.folder is not None, args.archive is not None, args.verify is not None)
    if given not in ((True, True, False), (False, False, True)):
        raise UserError("give FOLDER ARCHIVE (carry the folder's unfinished runs) or --verify ARCHIVE (one of them)")
    if args.verify is not None:
        if not os.path.isdir(folder_of(args.verify)):
            raise UserError(f"verify: {args.verify!r} has no carry/ folder")
        problems = verify(args.verify)
        if problems:
            raise UserError(f"verify: {folder_of(args.verify)!r} would not resume ({len(problems)} problems; first: "
                            f"{problems[0]})")
        metas = [read_meta(args.verify, e) for e in entries(args.verify)]
        steps = sorted(m["step"] for m in metas)
        code = code_pin.pinned(code_pin.pins_of([declarations.read_record(folder_of(args.verify))]))
        print(f"{len(metas)} entries of {folder_of(args.verify)} match their descriptions"
              + (f" (steps {steps[0]:,}-{steps[-1]:,}, {size(args.verify) / 1e6:.1f} MB)" if metas else "")
              + (f"; code pinned to {code[:12]}" if code else ""))
        return 0
    if not os.path.exists(os.path.join(args.folder, "experiment.json")):
        raise UserError(f"folder: {args.folder!r} is not an experiment folder (no experiment.json)")
    queue = Queue(args.folder)
    configs = {}
    for name in sorted(os.listdir(os.path.join(queue.folder, "configs"))):
        if name.endswith(".json"):
            with open(os.path.join(queue.folder, "configs", name)) as f:
                configs[name[:-len(".json")]] = json.load(f)
    check(args.archive, configs, args.folder)
    n, written = carry_folder(queue, args.archive, configs)
    print(f"{n} unfinished entries carried to {folder_of(args.archive)} ({written / 1e6:.1f} MB written; the carry "
          f"holds {len(entries(args.archive))} entries, {size(args.archive) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main)())
