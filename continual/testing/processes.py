"""Process facts from /proc (Linux): is a pid alive, which live processes descend from a pid.

Used by the tests and benchmarks that check that switches create no process and that failures leave none behind.
"""

from __future__ import annotations

import os
from typing import Optional


def proc_stat(pid: int) -> Optional[tuple[str, int]]:
    """(state, ppid) of a process, None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            data = f.read()
    except (OSError, ValueError):
        return None
    rest = data[data.rfind(")") + 2:].split()  # the command name may contain spaces and parentheses
    return rest[0], int(rest[1])


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def descendants(root: int) -> set[int]:
    """Live (non-zombie) descendants of `root`."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st[0] not in ("Z", "X"):
                children.setdefault(st[1], []).append(int(name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _live_with(field: int, value: int) -> set[int]:
    """Live (non-zombie) processes whose /proc/<pid>/stat field `field` (counted after the command) is `value`."""
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if rest[0] not in ("Z", "X") and int(rest[field]) == value:
                out.add(int(name))
    return out


def group(pgid: int) -> set[int]:
    """Live (non-zombie) processes of process group `pgid` (a run started with start_new_session: all it started)."""
    return _live_with(2, pgid)


def session_members(sid: int) -> set[int]:
    """Live (non-zombie) processes of session `sid` (a run started with start_new_session: all it started, also
    those in process groups of their own, such as Ray's workers, and those orphaned since)."""
    return _live_with(3, sid)
