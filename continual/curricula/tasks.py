"""Task sequences (CORA's experiments): a list of tasks, each (environment, modifications, steps), run in order
`cycles` times. One run, one agent, one optimizer across all tasks.

A task's regime is the modification string ``env=<env_id> <modifications>`` (`continual.modstrings.Task`):
the env token makes the workers rebuild their env in place when the game changes, and everything keyed by the
modification string (checkpoints, continual evaluation, metrics, plots, eval.py) treats each task as a regime.
A task without ``env_id`` runs the run's ``--env_id`` (only its modifications change).

    {"modification_factory": "TaskSequence",
     "modification_factory_kwargs": {"cycles": 3, "tasks": [
         {"env_id": "MinAtar/Breakout", "steps": 100000},
         {"env_id": "MinAtar/Freeway", "modifications": "sticky_action_prob=0", "steps": 100000}]}}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from continual.curricula.base import (
    DEFAULT_PATH,
    FactoryConfigError,
    _check_int,
    _check_list,
    _check_steps,
    _first_point,
    _fmt_typed,
)
from continual.curricula.builtin import _BuiltinFactory
from continual.curricula.registry import register_factory
from continual.modstrings import ENV_TOKEN, names_a_game, normalize_modification

TASK_KEYS = ("env_id", "modifications", "steps")


def task_string(env_id: str | None, modifications: str | list[str] = "") -> str:
    """The regime string of a task: ``env=<env_id>`` plus its modifications, normalised."""
    parts = [modifications] if isinstance(modifications, str) else list(modifications)
    return normalize_modification(([f"{ENV_TOKEN}{env_id}"] if env_id else []) + parts)


@register_factory("TaskSequence")
class TaskSequenceModificationFactory(_BuiltinFactory):
    """``tasks`` in order, each for its ``steps`` agent steps, the whole list ``cycles`` times
    (``total_timesteps = cycles * sum(steps)``)."""

    def __init__(self, tasks: list[dict[str, Any]], cycles: int = 1, *, seed: int = 0, granularity: int = 1,
                 _path: str = DEFAULT_PATH) -> None:
        super().__init__(seed=seed, granularity=granularity, _path=_path)
        self._cycles = _check_int(cycles, f"{_path}.cycles", minimum=1)
        items = _check_list(tasks, f"{_path}.tasks", what="tasks ({env_id, modifications, steps} objects)")
        if not items:
            raise FactoryConfigError("must be a non-empty list of tasks", path=f"{_path}.tasks")
        self._tasks: list[dict[str, Any]] = []
        for i, task in enumerate(items):
            path = f"{_path}.tasks[{i}]"
            if not isinstance(task, dict):
                raise FactoryConfigError(f"must be an object with keys {', '.join(TASK_KEYS)}, got {_fmt_typed(task)}",
                                         path=path)
            for key in task:
                if key not in TASK_KEYS:
                    raise FactoryConfigError(f"unknown key; expected one of: {', '.join(TASK_KEYS)}",
                                             path=f"{path}.{key}")
            if "steps" not in task:
                raise FactoryConfigError("missing: every task needs its number of steps", path=f"{path}.steps")
            env_id = task.get("env_id")
            if env_id is not None and (not isinstance(env_id, str) or not env_id or " " in env_id):
                raise FactoryConfigError(f"must be an env id string, got {_fmt_typed(env_id)}", path=f"{path}.env_id")
            mods = task.get("modifications", "")
            if not isinstance(mods, (str, list)) or (isinstance(mods, list) and not all(isinstance(m, str) for m in mods)):
                raise FactoryConfigError(f"must be a string or a list of strings, got {_fmt_typed(mods)}",
                                         path=f"{path}.modifications")
            if names_a_game(mods):
                raise FactoryConfigError("name the game with env_id, not an env= token", path=f"{path}.modifications")
            steps = _check_steps(task["steps"], f"{path}.steps")
            self._tasks.append({"env_id": env_id, "modifications": normalize_modification(mods), "steps": steps})
        lengths = [t["steps"] for t in self._tasks]
        self._total = self._cycles * sum(lengths)
        # entry k = cycle k // len(tasks), task k % len(tasks); _ends[k] is where it stops
        self._ends = np.cumsum(np.tile(np.asarray(lengths, dtype=np.int64), self._cycles))
        self._task_codes = np.asarray([self._intern(task_string(t["env_id"], t["modifications"]))
                                       for t in self._tasks], dtype=np.int64)

    def config(self) -> dict[str, Any]:
        tasks = [{k: v for k, v in t.items() if v is not None} for t in self._tasks]
        return {"tasks": tasks, "cycles": self._cycles}

    @property
    def tasks(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self._tasks]

    @property
    def cycles(self) -> int:
        return self._cycles

    def task_at(self, step: int) -> tuple[int, int]:
        """(cycle, task index) of local ``step``."""
        k = int(np.searchsorted(self._ends, step, side="right"))
        return k // len(self._tasks), k % len(self._tasks)

    def _code(self, step: int) -> int:
        return int(self._task_codes[self.task_at(step)[1]])

    def _codes(self, steps: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self._ends, steps, side="right")
        return self._task_codes[k % len(self._tasks)]

    def _support(self, offset: int) -> set[str]:
        starts = np.concatenate([[0], self._ends[:-1]])
        return {self._vocab[int(self._task_codes[k % len(self._tasks)])]
                for k in range(len(self._ends))
                if _first_point(offset, int(starts[k]), self._granularity) < int(self._ends[k])}
