"""The two kinds of error a run reports as one line. UserError: bad flags, configs, checkpoints or modification
names, reported as one line (`error: ...`) with exit code 2, before any work starts, never as a traceback.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

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


class EnvWorkerError(TrainingError):
    """An environment worker process died or raised."""


class NumericalError(TrainingError):
    """A non-finite loss or parameter."""

    def __init__(self, message: str, weights_ok: bool = True):
        super().__init__(message)
        self.weights_ok = weights_ok  # False: the parameters themselves are broken, do not checkpoint them
