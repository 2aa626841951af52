"""An experiment's finished runs kept where they outlive the machine: a copy of the experiment folder without what
only a running or resuming run needs.

    python -m continual.launch EXPERIMENT.json --folder SCRATCH --archive KEPT   # archive each run as it finishes
    python -m continual.launch.archive FOLDER KEPT                               # archive a folder's finished runs

KEPT has the experiment folder's layout (`experiment.json`, `configs/`, `queue/<entry>.status.json`, `runs/<entry>/`),
holding the entries whose state is "done" and, of each run directory, every file except what only a resume needs or
another tool keeps (checkpoints, the final policy file, CLEAR's replay buffer, TensorBoard event files, W&B and video
folders) and any file over 20 MB (named in the entry's `archive_left_out.json`); `metrics.jsonl` is stored gzipped
(`metrics.jsonl.gz`, read back transparently by `continual.io.read_jsonl`) as a compact record: its iteration records
keep only the fields the reports read (ITERATION_FIELDS; the losses and timings stay in the experiment folder and
TensorBoard), its episode records lose their wall-clock time. A MinAtar run of 2M steps keeps 0.1-0.25 MB, so KEPT
fits in a git repository: the reports read it as they read the folder, and a launch with a
new, empty folder and the same `--archive` restores the archived entries first and runs only the others (a session
whose scratch disk is gone loses only its unfinished runs).

Each entry is written to a temporary name and renamed into place, its status file last: a kill leaves an entry whole
or absent, never a run directory without the status that makes it count.

KEPT/manifest.json lists every file of KEPT (but itself) with its sha256 and size, one file a line:

    {"format": "continual-archive-manifest/1", "archiving": [], "files": {
     "configs/000_seed=1_PPO.json": {"bytes": 1234, "sha256": "9f86d0..."}, ...}}

The archive writes it as it writes an entry: the entry is named in "archiving" first, then copied, then its files'
lines replace the old ones and the name leaves "archiving". Only files the archive itself has just written get
lines, so the manifest never blesses an edit. `verify_manifest(KEPT)` lists what does not match (a changed, missing
or unlisted file, an archive that was interrupted); the reports call `check_manifest(KEPT)` first, and the launcher
refuses an archive that does not match (an archive interrupted by a kill is redone from the finished runs of the
folder). An archive written before the manifest existed gets one with `--write-manifest`, once, after a look at its
runs (it records the files as they are then):

    python -m continual.launch.archive --verify KEPT            # exit 2 with one line when it does not match
    python -m continual.launch.archive --write-manifest KEPT    # the first manifest of an older archive

A finished experiment's records can shrink further, to what its report reads (`Records`; the manifest keeps each
raw file's digest under "compacted", and the reports refuse a folder compacted to records they do not read):

    python -m continual.launch.archive --compact KEPT --records forgetting
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import sys
from typing import Iterator, Literal, Optional, Sequence

import tyro

from continual.config.loading import cli
from continual.errors import UserError, exit_on_user_error, one_line
from continual.evaluation.table import EVAL_TABLE
from continual.io import atomic_write_text
from continual.launch import declarations
from continual.launch.declarations import RECORD
from continual.launch.queue import DONE, Queue

SKIPPED_DIRS = ("checkpoints", "replay", "wandb", "videos")  # replay: CLEAR's buffer (252 MB on MinAtar)
MAX_FILE_BYTES = 20 * 2**20
SKIPPED_PREFIXES = ("events.out.tfevents.",)
SKIPPED_SUFFIXES = (".cleanrl_model",)  # the final policy: a checkpoint, for evaluation, not read by the reports
ITERATION_FIELDS = ("kind", "global_step", "iteration", "modification", "losses/entropy", "pnc/compress",
                    "plasticity/trac_scale")
METRICS = "metrics.jsonl"
CARRY = "carry"  # continual.launch.carry's folder in an archive


@dataclasses.dataclass(frozen=True)
class Records:
    """Which records of metrics.jsonl a compact record keeps: the kinds `only` names (None: every kind), of a kind in
    `fields` only those fields, of a kind in `dropped` all but those; other records, and a line that is not a JSON
    object (a damaged last line), as written. `reports`: the reports that can read it (None: every report)."""
    name: str
    fields: dict = dataclasses.field(default_factory=dict)
    dropped: dict = dataclasses.field(default_factory=dict)
    only: Optional[tuple] = None
    reports: Optional[tuple] = None


# What the archive keeps of every run: all records as written, but for the two kinds that are most of the bytes (an
# IMPALA learner writes one iteration record per update): an iteration record keeps only the fields a report reads
# (policy entropy for collapse, P&C's phase, TRAC's scale), an episode record drops its wall-clock time.
ARCHIVED = Records("archived", fields={"iteration": ITERATION_FIELDS}, dropped={"episode": ("time",)})
# What the forgetting and tuning reports read through continual.evaluation.metrics.load_run, besides eval_table.csv:
# the switches (the visits) and each iteration's step and task (the first task, the last step); the "start" records
# stay as the runs' provenance (commit, resumes). `--compact FOLDER --records forgetting` turns a folder's records
# into these (forgetting v1's 85 runs: 76.0 MB of metrics.jsonl.gz to 0.95 MB, its report unchanged).
FORGETTING = Records("forgetting", fields={"iteration": ("kind", "global_step", "modification")},
                     only=("switch", "iteration", "start"), reports=("forgetting",))
RECORDS = {r.name: r for r in (ARCHIVED, FORGETTING)}
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "continual-archive-manifest/1"
EXPERIMENT_FILES = ("experiment.json", RECORD)  # the files of the whole experiment, rewritten with every entry


def kept(name: str, is_dir: bool) -> bool:
    return not (name in SKIPPED_DIRS if is_dir else name.startswith(SKIPPED_PREFIXES) or
                name.endswith(SKIPPED_SUFFIXES))


def compact_line(line: bytes, records: Records = ARCHIVED) -> Optional[bytes]:
    """One metrics.jsonl line as `records` keeps it, None when it drops the record."""
    try:
        rec = json.loads(line)
    except ValueError:
        return line
    if not isinstance(rec, dict):
        return line
    kind = rec.get("kind")
    if records.only is not None and kind not in records.only:
        return None
    if kind in records.fields:
        rec = {k: v for k, v in rec.items() if k in records.fields[kind]}
    elif kind in records.dropped:
        rec = {k: v for k, v in rec.items() if k not in records.dropped[kind]}
    else:
        return line
    return (json.dumps(rec) + "\n").encode()


def compact_metrics(src: str, dst: str, records: Records = ARCHIVED) -> dict:
    """metrics.jsonl `src` (gzipped when it ends in .gz) as `records` keeps it, gzipped into `dst`; the digest of
    `src`. The same input gives the same bytes (gzip without a time stamp or name: no churn in a git repository)."""
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rb") as f, open(dst, "wb") as out, \
            gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=out, mtime=0) as g:
        for line in f:
            kept_line = compact_line(line, records)
            if kept_line is not None:
                g.write(kept_line)
    return digest(src)


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
            compact_metrics(path, os.path.join(dst, name + ".gz"))
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
    if archived(kept_queue, entry) and kept_queue.status(entry) == status and in_manifest(kept_queue.folder, entry):
        return False  # archived already
    kept_queue.create()
    begin(kept_queue.folder, entry)
    for name in EXPERIMENT_FILES:
        if os.path.exists(os.path.join(queue.folder, name)):
            shutil.copy2(os.path.join(queue.folder, name), os.path.join(kept_queue.folder, name))
    shutil.copy2(queue.config_path(entry), kept_queue.config_path(entry))
    dst = kept_queue.run_dir(entry)
    tmp = dst + ".archiving"
    shutil.rmtree(tmp, ignore_errors=True)
    copy_run(queue.run_dir(entry), tmp)
    shutil.rmtree(dst, ignore_errors=True)  # an older copy (the entry was re-run)
    os.replace(tmp, dst)
    copy_status(queue, kept_queue, entry)
    commit(kept_queue.folder, entry)
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


def check_archive(kept: str, configs: dict, what: str, source: Optional[Queue] = None) -> None:
    """Refuse an archive of another experiment: an entry archived there whose config is not `configs[entry]` (the
    configs of the experiment `what`; entries appended to the experiment are fine). Refuse an archive that does not
    match its manifest, except an archive of an entry that was interrupted and that `source` holds finished (it is
    archived again)."""
    kept_queue = Queue(kept)
    if not os.path.isdir(kept) or (read_manifest(kept) is None and not scan(kept)):
        return  # nothing archived yet
    folder = os.path.join(kept, "configs")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        entry = name[:-len(".json")]
        if not name.endswith(".json") or not os.path.exists(kept_queue.run_dir(entry)):
            continue
        with open(os.path.join(folder, name)) as f:
            old = json.load(f)
        if old != configs.get(entry):
            why = "has no such entry" if entry not in configs else "configures it differently"
            raise UserError(f"archive: {kept!r} holds another experiment (its entry {entry!r}: {what!r} {why}): use "
                            f"another --archive for a changed experiment")
    problems = _problems(kept)
    redo = {e for e in (read_manifest(kept) or {}).get("archiving", [])
            if source is not None and source.status(e).get("state") == DONE and os.path.isdir(source.run_dir(e))}
    left = [msg for path, msg in problems if not (redo and (path in EXPERIMENT_FILES or _entry_of(path) in redo))]
    if left:
        hint = ("python -m continual.launch.archive --write-manifest on an archive written before manifests"
                if read_manifest(kept) is None else "git status / git checkout the folder")
        raise UserError(f"archive: {kept!r} does not match its {MANIFEST} ({len(left)} problems; first: {left[0]}): "
                        f"{hint}")


# --- the manifest ------------------------------------------------------------------------------------------------


def digest(path: str) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"bytes": os.path.getsize(path), "sha256": h.hexdigest()}


def scan(folder: str, under: str = "") -> dict:
    """relative path -> digest of every file under `folder` (or its subfolder `under`), but the manifest and the
    unfinished runs' carry (continual/launch/carry.py: rewritten at every carry, it has its own digests)."""
    out = {}
    root = os.path.join(folder, under) if under else folder
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not (dirpath == root and not under and d == CARRY))
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/")
            if rel != MANIFEST:
                out[rel] = digest(os.path.join(dirpath, name))
    return out


def read_manifest(folder: str) -> Optional[dict]:
    """{"files": {path: {"bytes", "sha256"}}, "archiving": [entry, ...], "compacted": {path: {"records": name,
    "from": {"bytes", "sha256"}}}}, None when there is none; a manifest that does not parse is a UserError."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("files"), dict) or \
                not isinstance(data.get("archiving", []), list) or not isinstance(data.get("compacted", {}), dict):
            raise ValueError(f"not a {MANIFEST_FORMAT} manifest")
    except (OSError, ValueError, AttributeError) as e:
        raise UserError(f"{path!r} cannot be read: {one_line(str(e))[:200]}") from None
    return {"files": data["files"], "archiving": list(data.get("archiving", [])),
            "compacted": dict(data.get("compacted", {}))}


def write_manifest(folder: str, manifest: dict) -> None:
    """One file a line (a change shows as the lines of the files that changed in git diff), written atomically; the
    "compacted" block only when a file was compacted (older manifests read and write back the same bytes)."""
    def block(name: str, entries: dict) -> str:
        lines = [f"  {json.dumps(rel)}: {json.dumps(d, sort_keys=True)}" for rel, d in sorted(entries.items())]
        return f'\n "{name}": {{\n' + ",\n".join(lines) + "\n }"

    compacted = manifest.get("compacted") or {}
    text = (f'{{\n "format": {json.dumps(MANIFEST_FORMAT)},\n "archiving": {json.dumps(sorted(manifest["archiving"]))},'
            + block("files", manifest["files"]) + ("," + block("compacted", compacted) if compacted else "") + "\n}\n")
    atomic_write_text(os.path.join(folder, MANIFEST), text)


@contextlib.contextmanager
def _locked(folder: str) -> Iterator[None]:
    """Several launchers archiving into one folder update the manifest one at a time (an flock on the folder; where
    the file system has none, as some NFS mounts, without it)."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _entry_files(entry: str) -> tuple[str, list[str]]:
    """The run directory's prefix and the other files of an entry in an archive."""
    return f"runs/{entry}/", [f"configs/{entry}.json", f"queue/{entry}.status.json"]


def _entry_of(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    parts = path.split("/")  # an entry's files, and those an archive of it leaves when it is killed
    if parts[0] == "runs" and len(parts) > 2:
        return parts[1][:-len(".archiving")] if parts[1].endswith(".archiving") else parts[1]
    if parts[0] == "configs" and len(parts) == 2 and parts[1].endswith(".json"):
        return parts[1][:-len(".json")]
    for suffix in (".status.json", ".status.json.copying"):
        if parts[0] == "queue" and len(parts) == 2 and parts[1].endswith(suffix):
            return parts[1][:-len(suffix)]
    return None


def _entry_lines(folder: str, entry: str) -> dict:
    prefix, files = _entry_files(entry)
    lines = scan(folder, prefix.rstrip("/")) if os.path.isdir(os.path.join(folder, prefix)) else {}
    lines.update({f: digest(os.path.join(folder, f)) for f in files if os.path.isfile(os.path.join(folder, f))})
    return lines


def begin(folder: str, entry: str) -> None:
    """Name `entry` in the manifest's "archiving" before its files are written."""
    with _locked(folder):
        manifest = read_manifest(folder) or {"files": {}, "archiving": [], "compacted": {}}
        if entry not in manifest["archiving"]:
            manifest["archiving"].append(entry)
            write_manifest(folder, manifest)


def commit(folder: str, entry: str) -> None:
    """The lines of `entry`'s files (and the experiment's files), as just written, in place of the old ones."""
    with _locked(folder):
        manifest = read_manifest(folder) or {"files": {}, "archiving": [], "compacted": {}}
        prefix, files = _entry_files(entry)
        kept = {rel: d for rel, d in manifest["files"].items()
                if not rel.startswith(prefix) and rel not in files and rel not in EXPERIMENT_FILES}
        kept.update(_entry_lines(folder, entry))
        kept.update({f: digest(os.path.join(folder, f)) for f in EXPERIMENT_FILES
                     if os.path.isfile(os.path.join(folder, f))})
        compacted = {rel: c for rel, c in manifest["compacted"].items() if not rel.startswith(prefix)}  # a new copy
        write_manifest(folder, {"files": kept, "archiving": [e for e in manifest["archiving"] if e != entry],
                                "compacted": compacted})


def in_manifest(folder: str, entry: str) -> bool:
    """The manifest lists exactly `entry`'s files as they are, and no archive of it is under way."""
    manifest = read_manifest(folder)
    if manifest is None or entry in manifest["archiving"]:
        return False
    prefix, files = _entry_files(entry)
    listed = {rel: d for rel, d in manifest["files"].items() if rel.startswith(prefix) or rel in files}
    return listed == _entry_lines(folder, entry)


def _problems(folder: str) -> list[tuple[Optional[str], str]]:
    manifest = read_manifest(folder)
    if manifest is None:
        return [(None, f"no {MANIFEST}")]
    problems: list[tuple[Optional[str], str]] = [
        (f"runs/{e}/", f"the archive of entry {e!r} was interrupted") for e in manifest["archiving"]]
    found = scan(folder)
    for rel, d in sorted(manifest["files"].items()):
        if rel not in found:
            problems.append((rel, f"{rel} is missing"))
        elif found[rel] != d:
            what = f"{found[rel]['bytes']} bytes, the manifest says {d.get('bytes')}" \
                if found[rel]["bytes"] != d.get("bytes") else "its sha256 differs"
            problems.append((rel, f"{rel} was changed ({what})"))
    problems += [(rel, f"{rel} is not in the manifest") for rel in sorted(set(found) - set(manifest["files"]))]
    problems += [(rel, f"{rel} is named as compacted but not listed") for rel in sorted(manifest["compacted"])
                 if rel not in manifest["files"]]
    return problems


def verify_manifest(folder: str) -> list[str]:
    """What in an archived experiment folder does not match its manifest.json, one line each (empty: it matches):
    a changed, missing or unlisted file, an interrupted archive, no manifest."""
    return [msg for _, msg in _problems(folder)]


def check_manifest(folder: str, require: bool = True) -> int:
    """Refuse (UserError: one line, exit 2) an experiment folder that does not match its manifest; the number of
    files checked. `require=False`: a folder without a manifest (a launcher's folder, not an archive) passes."""
    if not os.path.isdir(folder):
        raise UserError(f"{folder!r} is not a folder")
    if not require and not os.path.exists(os.path.join(folder, MANIFEST)):
        return 0
    problems = verify_manifest(folder)
    if problems:
        raise UserError(f"{folder!r} does not match its {MANIFEST} ({len(problems)} problems; first: {problems[0]}): "
                        f"its files were changed after they were archived")
    return len(read_manifest(folder)["files"])


def write_first_manifest(folder: str) -> int:
    """The manifest of an archive written before manifests: every file as it is now; refused when it has one."""
    if not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, "experiment.json")):
        raise UserError(f"write_manifest: {folder!r} is not an archived experiment folder (no experiment.json)")
    if os.path.exists(os.path.join(folder, MANIFEST)):
        raise UserError(f"write_manifest: {folder!r} has a {MANIFEST} already (check it with --verify; a manifest "
                        f"is written once, then kept by the archive)")
    files = scan(folder)
    write_manifest(folder, {"files": files, "archiving": []})
    return len(files)


def compact_folder(folder: str, records: Records) -> int:
    """Every runs/<entry>/metrics.jsonl.gz of an archived folder rewritten in place as `records` keeps it (a
    temporary file renamed into place), its manifest line replaced and the digest of the file it came from recorded
    under "compacted" (git history holds that file: `git log --all -- PATH` finds it, sha256sum checks it). Refused
    (UserError) when the folder does not match its manifest or a file was compacted to other records; a file
    compacted to these records already is left as it is. The number of files compacted. A kill between a rename and
    its manifest line leaves a folder that does not match (git checkout the folder and run it again)."""
    check_manifest(folder)
    manifest = read_manifest(folder)
    todo = []
    for rel in sorted(manifest["files"]):
        parts = rel.split("/")
        if len(parts) != 3 or parts[0] != "runs" or parts[2] != METRICS + ".gz":
            continue
        done = manifest["compacted"].get(rel)
        if done is not None and done.get("records") != records.name:
            raise UserError(f"compact: {rel} holds the {done.get('records')!r} records already; compacting it to "
                            f"{records.name!r} would lose the digest of its raw file (start from that file)")
        if records.only is not None and "eval" not in records.only and \
                f"runs/{parts[1]}/{EVAL_TABLE}" not in manifest["files"]:
            raise UserError(f"compact: runs/{parts[1]} has no {EVAL_TABLE}: its evaluations are only in its metrics "
                            f"records, which {records.name!r} drops")
        if done is None:
            todo.append(rel)
    for rel in todo:  # nothing written before every file passed
        path = os.path.join(folder, rel)
        with _locked(folder):
            source = compact_metrics(path, path + ".compacting", records)
            os.replace(path + ".compacting", path)
            manifest["files"][rel] = digest(path)
            manifest["compacted"][rel] = {"records": records.name, "from": source}
            write_manifest(folder, manifest)
    return len(todo)


def check_records(folder: str, report: str) -> None:
    """Refuse (UserError) the report `report` on a folder whose metrics were compacted to records it does not read
    from (e.g. the plasticity report needs the training episodes that the forgetting records drop)."""
    compacted = (read_manifest(folder) or {"compacted": {}})["compacted"]
    for name in sorted({str(c.get("records")) for c in compacted.values()}):
        records = RECORDS.get(name)
        if records is None or (records.reports is not None and report not in records.reports):
            readers = "no report known here" if records is None else f"the {' and '.join(records.reports)} reports"
            raise UserError(f"{folder!r}: its metrics.jsonl.gz keep only the {name!r} records ({readers}; "
                            f"manifest.json, \"compacted\"), not what the {report} report reads: take the raw files "
                            f"from git history")


@dataclasses.dataclass
class ArchiveArgs:
    folder: tyro.conf.Positional[Optional[str]] = None
    """the experiment folder (as given to python -m continual.launch --folder)"""
    archive: tyro.conf.Positional[Optional[str]] = None
    """where its finished runs are kept (created if missing; entries already there are replaced)"""
    verify: Optional[str] = None
    """check an archived experiment folder against its manifest.json (exit 2 with one line when it does not match)"""
    write_manifest: Optional[str] = None
    """write the first manifest.json of an archive written before manifests (every file as it is now)"""
    compact: Optional[str] = None
    """rewrite an archived folder's metrics.jsonl.gz in place as --records keeps them (the manifest keeps each raw digest)"""
    records: Optional[Literal["archived", "forgetting"]] = None
    """with --compact: archived (the archive's form) or forgetting (what the forgetting report reads)"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(ArchiveArgs, argv, default=None, description=__doc__.splitlines()[0])
    if (args.verify is not None) + (args.write_manifest is not None) + (args.compact is not None) + \
            (args.folder is not None) != 1:
        raise UserError("give FOLDER ARCHIVE, --verify ARCHIVE, --write-manifest ARCHIVE or --compact ARCHIVE "
                        "--records NAME (one of them)")
    if (args.compact is None) != (args.records is None):
        raise UserError("--compact ARCHIVE and --records NAME go together")
    if args.compact is not None:
        n = compact_folder(args.compact, RECORDS[args.records])
        print(f"{n} metrics.jsonl.gz of {args.compact} compacted to the {args.records!r} records")
        return 0
    if args.verify is not None:
        n = check_manifest(args.verify)
        print(f"{n} files of {args.verify} match its {MANIFEST}")
        return 0
    if args.write_manifest is not None:
        n = write_first_manifest(args.write_manifest)
        print(f"{MANIFEST} of {args.write_manifest} written: {n} files")
        return 0
    if args.archive is None:
        raise UserError("archive: give the folder to keep the runs in (FOLDER ARCHIVE)")
    if not os.path.exists(os.path.join(args.folder, "experiment.json")):
        raise UserError(f"folder: {args.folder!r} is not an experiment folder (no experiment.json)")
    queue, kept_queue = Queue(args.folder), Queue(args.archive)
    configs = {}
    for name in os.listdir(os.path.join(queue.folder, "configs")):
        if name.endswith(".json"):
            with open(os.path.join(queue.folder, "configs", name)) as f:
                configs[name[:-len(".json")]] = json.load(f)
    check_archive(args.archive, configs, args.folder, source=queue)
    mine, theirs = declarations.read_record(queue.folder), declarations.read_record(kept_queue.folder) \
        if os.path.isdir(kept_queue.folder) else None
    if mine is not None and theirs is not None and mine["declarations"] != theirs["declarations"]:
        raise UserError(f"archive: {args.archive!r} was started with other declarations than {args.folder!r} "
                        f"({declarations.RECORD}): use another archive")
    names = sorted(n[:-len(".status.json")] for n in os.listdir(queue.dir) if n.endswith(".status.json"))
    n = sum(archive_entry(queue, kept_queue, e) for e in names)
    print(f"{n} finished entries of {len(names)} archived in {kept_queue.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main)())
