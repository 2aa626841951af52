"""Files of a run: written whole or not at all, and JSONL read with one rule for a crash-cut end.

Atomic write: a temporary file next to the target (`.tmp-<random>-<name>`), flushed, fsynced, renamed over the target.
A crash leaves the previous file (or none) and at most a `.tmp-*` file; an exception removes the temporary file.
The temporary file gets the usual permissions (umask), like a plain `open(path, "w")`.

JSONL rule: lines are read in order, blank lines skipped; the last line is dropped when it is not valid JSON (a write
cut by a crash); any other line that is not valid JSON is an error (the file was damaged, not cut).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import secrets
from typing import IO, Any, Callable, Iterator, Optional

from continual.errors import UserError
from continual.testing.faults import inject

TMP_PREFIX = ".tmp-"


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", *, newline: Optional[str] = None,
                fault: Optional[str] = None) -> Iterator[IO]:
    """A file to write `path` through: renamed over `path` when the block ends cleanly. `mode`: "w" or "wb".
    `fault`: the TEST HOOK point (continual.testing.faults) reached between fsync and rename."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f"{TMP_PREFIX}{secrets.token_hex(4)}-{os.path.basename(path)}")
    try:
        with open(tmp, mode.replace("w", "x"), newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if fault is not None:
            inject(fault)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # not created, or the folder is the problem
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes, *, fault: Optional[str] = None) -> str:
    with atomic_open(path, "wb", fault=fault) as f:
        f.write(data)
    return path


def atomic_write_text(path: str, text: str) -> str:
    with atomic_open(path, "w") as f:
        f.write(text)
    return path


def atomic_write_json(path: str, data: Any, *, sort_keys: bool = False,
                      default: Optional[Callable[[Any], Any]] = None) -> str:
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=sort_keys, default=default)
    return path


def atomic_write_csv(path: str, fieldnames: list[str], rows: list[dict]) -> str:
    with atomic_open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_jsonl_lines(path: str) -> list[tuple[str, dict]]:
    """(line, record) for every record of a JSONL file (see the module docstring for the rule); [] if it does not
    exist. A damaged line other than the last is a UserError naming the file and line."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    out = []
    for i, (n, line) in enumerate(lines):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            if i == len(lines) - 1:
                break  # a line cut by a crash
            why = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise UserError(f"{path}:{n}: not a JSON record ({why}); only the last line may be cut by a crash") from None
        out.append((line, rec))
    return out


def read_jsonl(path: str) -> list[dict]:
    """The records of a JSONL file; see `read_jsonl_lines`."""
    return [rec for _, rec in read_jsonl_lines(path)]
