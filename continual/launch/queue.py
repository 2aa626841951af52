"""The experiment folder as a queue that several launchers share: claims, heartbeats and per-entry status.

    <experiment folder>/
      experiment.json            the experiment file as given (a record)
      declarations.json          its sha256, git revision and declarations at the first launch (declarations.py)
      configs/<entry>.json       each entry's run_config.json
      runs/<entry>/              each entry's run directory (the training CLI's --runs_dir/--run_name)
      runs/<entry>.incomplete<k> the remains of a run started again from step 0 (kept; `run_dirs` leaves them out)
      logs/<entry>.log           the training CLI's stdout and stderr, every attempt appended
      queue/<entry>.status.json  state (done, failed, ...), attempts, last exit code and error line
      queue/<entry>.claim.<g>    who runs the entry: generation g, created with O_CREAT|O_EXCL

A claim is a file created with O_CREAT|O_EXCL: of two launchers, exactly one creates it. Its owner (host, pid, the
process's start time) refreshes its modification time (the heartbeat) while the entry runs and removes it when the
entry is finished or given up. A claim is stale when its owner is dead (same host: no process with that pid and
start time) or, on another host, when its heartbeat is older than `stale_after` seconds. A stale claim of
generation g is taken over by creating generation g + 1, again with O_EXCL, so two launchers that both see it stale
cannot both take it (CORA deletes and re-creates the claim file, which lets both win). The owner of the highest
generation owns the entry; an owner that finds a higher generation than its own has lost it and stops.
A status file is written (atomically, write + rename) only by the entry's owner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import socket
import time
from typing import Optional

from continual.errors import StorageError, is_storage_error

HOST = socket.gethostname()
DONE, FAILED = "done", "failed"


def process_start(pid: int) -> Optional[str]:
    """The start time of a process (field 22 of /proc/<pid>/stat): a pid reused by another process differs."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(pid: int, start: Optional[str]) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = process_start(pid)
    return now is None or start is None or now == start


@dataclasses.dataclass
class Claim:
    path: str
    entry: str
    generation: int

    def beat(self) -> None:
        try:
            os.utime(self.path)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


SET_ASIDE = re.compile(r"\.incomplete\d+$")  # runs/<entry>.incomplete<k>: a run started again, its remains kept


def run_dirs(folder: str) -> list[str]:
    """The run directories of an experiment folder (or of its archive), in entry order, without the remains of runs
    started again (`set_aside`); [] without a runs/ folder."""
    root = os.path.join(folder, "runs")
    if not os.path.isdir(root):
        return []
    return [os.path.join(root, d) for d in sorted(os.listdir(root))
            if not SET_ASIDE.search(d) and os.path.isdir(os.path.join(root, d))]


def set_aside(run_dir: str) -> Optional[str]:
    """Move a run directory out of its entry's way, to `<run_dir>.incomplete<k>` (the first free k), before the entry
    starts again from step 0; None when there is none."""
    if not os.path.lexists(run_dir):
        return None
    k = 1
    while os.path.lexists(f"{run_dir}.incomplete{k}"):
        k += 1
    shutil.move(run_dir, f"{run_dir}.incomplete{k}")
    return f"{run_dir}.incomplete{k}"


class Queue:
    def __init__(self, folder: str, stale_after: float = 120.0):
        self.folder = os.path.abspath(folder)
        self.dir = os.path.join(self.folder, "queue")
        self.stale_after = stale_after
        self.me = {"host": HOST, "pid": os.getpid(), "start": process_start(os.getpid())}

    def create(self) -> None:
        for sub in ("queue", "configs", "runs", "logs"):
            os.makedirs(os.path.join(self.folder, sub), exist_ok=True)

    def run_dir(self, entry: str) -> str:
        return os.path.join(self.folder, "runs", entry)

    def log_path(self, entry: str) -> str:
        return os.path.join(self.folder, "logs", entry + ".log")

    def config_path(self, entry: str) -> str:
        return os.path.join(self.folder, "configs", entry + ".json")

    # --- status ------------------------------------------------------------------------------------------------
    def status(self, entry: str) -> dict:
        try:
            with open(os.path.join(self.dir, entry + ".status.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def set_status(self, entry: str, **fields) -> dict:
        data = {**self.status(entry), **fields, "updated": time.time(), "host": HOST, "pid": os.getpid()}
        path = os.path.join(self.dir, entry + ".status.json")
        tmp = f"{path}.{HOST}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(data, f, indent=2)
            os.replace(tmp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if is_storage_error(e):  # the previous status stays: the same command continues once space is back
                raise StorageError(path, e, hint="free space and run the same command again") from None
            raise
        return data

    # --- claims ------------------------------------------------------------------------------------------------
    def claims(self, entry: str) -> list[int]:
        pattern = re.compile(re.escape(entry) + r"\.claim\.(\d+)$")
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)

    def _path(self, entry: str, generation: int) -> str:
        return os.path.join(self.dir, f"{entry}.claim.{generation}")

    def owner(self, entry: str) -> Optional[dict]:
        """The live owner of an entry (None when unclaimed or the claim is stale)."""
        gens = self.claims(entry)
        if not gens:
            return None
        path = self._path(entry, gens[-1])
        try:
            with open(path) as f:
                text = f.read()
            age = time.time() - os.path.getmtime(path)
        except FileNotFoundError:
            return None  # released meanwhile
        try:
            info = json.loads(text)
        except ValueError:
            info = None  # being written: live while young
        if info is None:
            return {"host": "?", "pid": None} if age < self.stale_after else None
        if info.get("host") == HOST:
            return info if alive(int(info["pid"]), info.get("start")) else None
        return info if age < self.stale_after else None

    def run_by_another(self, entry: str) -> bool:
        """Another live launcher holds the entry (its run is going on there)."""
        owner = self.owner(entry)
        return owner is not None and (owner.get("host"), owner.get("pid")) != (HOST, os.getpid())

    def claim(self, entry: str) -> Optional[Claim]:
        """Claim an entry (or take over its stale claim); None when a live owner holds it or another launcher won."""
        gens = self.claims(entry)
        if gens and self.owner(entry) is not None:
            return None
        generation = (gens[-1] + 1) if gens else 1
        path = self._path(entry, generation)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "w") as f:
            json.dump({**self.me, "time": time.time(), "generation": generation}, f)
        for g in gens:  # the stale generations below ours: nobody owns them any more
            try:
                os.unlink(self._path(entry, g))
            except FileNotFoundError:
                pass
        return Claim(path, entry, generation)

    def still_mine(self, claim: Claim) -> bool:
        gens = self.claims(claim.entry)
        return bool(gens) and gens[-1] == claim.generation and os.path.exists(claim.path)
