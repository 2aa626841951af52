"""The kinds of error a run reports as one line. UserError: bad flags, configs, checkpoints or modification
names, reported as one line (`error: ...`) with exit code 2, before any work starts, never as a traceback.
TrainingError (StorageError among them): a fault during the run, one line, exit code 1.
"""

from __future__ import annotations

import errno
import functools
import sys
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


class UserError(Exception):
    """A problem with what the user gave us; the message is one line that names the problem."""


class TrainingError(RuntimeError):
    """A run-stopping fault (dead env worker, non-finite loss, failed write), reported as one line after the run
    has saved what it could; exit code 1."""


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def exit_on_user_error(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorate a script's `main`: a `UserError` (or a factory config error) becomes `error: ...` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            print(f"error: {one_line(str(e))}", file=sys.stderr)
            raise SystemExit(2) from None
        except TrainingError as e:
            print(f"error: {one_line(str(e))}", file=sys.stderr)
            raise SystemExit(1) from None

    return wrapper


class StorageError(TrainingError):
    """A file of the run could not be written (a full disk, an I/O error, a file system gone read-only). Checkpoint
    writes are atomic, so the previous checkpoint is intact: the message names it, and `--resume` continues from it
    once the disk is fixed. `last_checkpoint`/`last_step` are filled in by the run session, which knows them."""

    def __init__(self, file: str, cause: OSError, last_checkpoint: Optional[str] = None,
                 last_step: Optional[int] = None, hint: Optional[str] = None):
        super().__init__(file)
        self.file, self.cause, self.hint = file, cause, hint  # hint: what to do, for writers other than a run
        self.last_checkpoint, self.last_step = last_checkpoint, last_step

    def __str__(self) -> str:
        what = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EIO: "I/O error"}.get(
            self.cause.errno or 0, self.cause.strerror or str(self.cause))
        if self.hint:
            return f"{what} writing {self.file}; {self.hint}"
        last = (f"the last checkpoint is {self.last_checkpoint} (step {self.last_step})" if self.last_checkpoint
                else "no checkpoint was written yet")
        return f"{what} writing {self.file}; {last}; free space and --resume"


# errors of the storage rather than of the program: reported as StorageError (exit 1, retried by the launcher)
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


# of these, the ones that are no property of the folder (a read-only one is bad input at the start of a run)
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})


def is_storage_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in STORAGE_ERRNOS


class EnvWorkerError(TrainingError):
    """An environment worker process died or raised."""


class ActorFailure(TrainingError):
    """An IMPALA actor died or failed (agents/impala.py, agents/impala_ray.py); the message is one line that names
    it."""


class NumericalError(TrainingError):
    """A non-finite loss or parameter."""

    def __init__(self, message: str, weights_ok: bool = True):
        super().__init__(message)
        self.weights_ok = weights_ok  # False: the parameters themselves are broken, do not checkpoint them
