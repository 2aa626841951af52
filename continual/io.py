"""Files of a run: written whole or not at all, and JSONL read with one rule for a crash-cut end.

Atomic write: a temporary file next to the target (`.tmp-<random>-<name>`), flushed, fsynced, renamed over the target.
A crash leaves the previous file (or none) and at most a `.tmp-*` file; an exception removes the temporary file.
The temporary file gets the usual permissions (umask), like a plain `open(path, "w")`.

Append-only files (metrics.jsonl, the evaluation table): `AppendFile` writes each record with one `os.write` of the
whole line, and cuts a short write (a disk that fills mid-line) back off, so a failed write never leaves a torn line.

Storage faults (a full disk, an I/O error, a read-only file system) met by the training process's writes become a
`StorageError` naming the file (`storage_errors`); the temporary file of an atomic write is removed first.

JSONL rule: lines are read in order, blank lines skipped; the last line is dropped when it is not valid JSON (a write
cut by a crash); any other line that is not valid JSON is an error (the file was damaged, not cut).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import gzip
import json
import os
import secrets
from typing import IO, Any, Callable, Iterator, Optional

from continual.errors import STORAGE_ERRNOS, StorageError, UserError

TMP_PREFIX = ".tmp-"


def storage_cause(e: BaseException) -> Optional[OSError]:
    """The storage fault (ENOSPC, EIO, EROFS, EDQUOT) behind `e`, following its cause and context: torch.save turns
    the OSError of a full disk into a RuntimeError raised while handling it."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return e
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def storage_errors(path: str, hint: Optional[str] = None) -> Iterator[None]:
    """Turn a storage fault met in the block into a one-line `StorageError` naming `path` (other errors pass);
    `hint`: what to do, for writers other than a training run (see StorageError)."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        cause = storage_cause(e)
        if cause is None:
            raise
        raise StorageError(path, cause, hint=hint) from None


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", *, newline: Optional[str] = None) -> Iterator[IO]:
    """A file to write `path` through: renamed over `path` when the block ends cleanly. `mode`: "w" or "wb"."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f"{TMP_PREFIX}{secrets.token_hex(4)}-{os.path.basename(path)}")
    try:
        with open(tmp, mode.replace("w", "x"), newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # not created, or the folder is the problem
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> str:
    with atomic_open(path, "wb") as f:
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


class AppendFile:
    """An append-only file of whole lines: each `write` is one `os.write` of the whole text (O_APPEND), and a short
    write is cut back off, so the file never ends in a torn line written by us (a crash can still cut one: readers
    drop a cut last line). Storage faults raise `StorageError`."""

    def __init__(self, path: str, hint: Optional[str] = None):
        self.path, self.hint = path, hint  # hint: what to do, for writers other than a run (StorageError)
        with storage_errors(path, hint):
            self._fd: Optional[int] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def write(self, text: str) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        data = text.encode("utf-8")
        with storage_errors(self.path, self.hint):
            size = os.fstat(self._fd).st_size
            try:
                n = os.write(self._fd, data)
            except OSError:
                self._cut(size)
                raise
            if n != len(data):  # the disk filled in the middle of the line
                self._cut(size)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)

    def _cut(self, size: int) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, size)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def jsonl_file(path: str) -> Optional[str]:
    """The file holding a JSONL file's records: `path`, else its gzipped copy `path.gz` (an archived run:
    `continual.launch.archive`); None when neither exists."""
    return next((p for p in (path, path + ".gz") if os.path.exists(p)), None)


def _numbered_lines(path: str) -> tuple[Optional[str], list[tuple[int, str]]]:
    """The file holding a JSONL file's records (`jsonl_file`) and its non-blank lines with their numbers."""
    found = jsonl_file(path)
    if found is None:
        return None, []
    with (gzip.open(found, "rt") if found.endswith(".gz") else open(found)) as f:
        return found, [(n, line) for n, line in enumerate(f, 1) if line.strip()]


def _decoded(found: Optional[str], lines: list[tuple[int, str]]) -> list[tuple[str, dict]]:
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
            raise UserError(f"{found}:{n}: not a JSON record ({why}); only the last line may be cut by a crash") from None
        out.append((line, rec))
    return out


def read_jsonl_lines(path: str) -> list[tuple[str, dict]]:
    """(line, record) for every record of a JSONL file (see the module docstring for the rule), or of its gzipped
    copy (`jsonl_file`); [] if neither exists. A damaged line other than the last is a UserError naming the file and
    line."""
    return _decoded(*_numbered_lines(path))


def read_jsonl(path: str) -> list[dict]:
    """The records of a JSONL file; see `read_jsonl_lines`. A whole file is decoded as one JSON array (one call
    into the C decoder, ~2x faster than a call a line on a run's ~26k records); anything else, a cut or damaged line,
    takes the line-by-line rule."""
    found, lines = _numbered_lines(path)
    try:
        records = json.loads("[" + ",".join(line for _, line in lines) + "]")
    except ValueError:
        records = None
    # a line holding "{..}, {..}" decodes here as two records: the count and the types catch it
    if records is not None and len(records) == len(lines) and all(type(r) is dict for r in records):
        return records
    return [rec for _, rec in _decoded(found, lines)]


def between_markers(text: str, start: str, end: str, body: str) -> str:
    """`text` with what lies between its `start` and `end` markers replaced by `body` (generated docs sections)."""
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}{end}{tail}"


def update_between_markers(path: str, start: str, end: str, body: str) -> None:
    with open(path) as f:
        text = between_markers(f.read(), start, end, body)
    with open(path, "w") as f:
        f.write(text)
