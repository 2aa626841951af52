"""Modification strings and the tasks they name, tokenised here and nowhere else.

A curriculum entry ("all_green_cars stop_all_cars", "env=MinAtar/Freeway sticky_action_prob=0.2") is a string of
whitespace-separated tokens; its canonical form drops empties, de-duplicates, sorts and joins with one space ("" is
the unmodified game). `parse_task` reads one into a frozen `Task` (backend, env id, modification tokens, `name=value`
parameters, canonical string), which validation, backends, env building, switches and evaluation take. Strings are
parsed once per process (cached): a run's handful of regimes are tokenised a handful of times, not once per check.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterable, Optional, Sequence

from continual.errors import UserError

ENV_TOKEN = "env="  # `env=<env id>`: the game a task runs (task sequences across games)


def modification_tokens(modification: str | Sequence[str]) -> list[str]:
    """The sorted unique tokens of a modification string, or of a list of strings (each split on whitespace)."""
    return list(_parse(_joined(modification)).all_tokens)


def normalize_modification(modification: str | Sequence[str]) -> str:
    """Canonical form: whitespace-split, drop empties, de-duplicate, sort, join with one space."""
    return _parse(_joined(modification)).text


def _joined(modification: str | Sequence[str]) -> str:
    """A list of strings as one string (the same tokens)."""
    if isinstance(modification, str):
        return modification
    if not isinstance(modification, (list, tuple)):
        raise TypeError(f"modification must be a string or list of strings, got {modification!r}")
    for part in modification:
        if not isinstance(part, str):
            raise TypeError(f"modification tokens must be strings, got {part!r}")
    return " ".join(modification)


def names_a_game(modification: str | Sequence[str]) -> bool:
    """Whether a string (or list of strings) has an `env=` token."""
    return any(t.startswith(ENV_TOKEN) for t in _parse(_joined(modification)).all_tokens)


def game_name(env_id: str) -> str:
    """'ALE/Freeway-v5' -> 'Freeway'."""
    name = env_id.split("/")[-1].split("-")[0]
    for suffix in ("NoFrameskip", "Deterministic"):
        name = name.replace(suffix, "")
    return name


@dataclasses.dataclass(frozen=True)
class Task:
    """One curriculum entry, parsed: the game it runs and its modifications.

    `text` is the canonical string (the regime's name in curricula, switches, evaluation rows and reports); `env` the
    id of its `env=` token (None: the run's env id); `env_id` the game it runs (`env`, else the run's); `tokens` its
    modification tokens (the env token excluded, sorted); `parameters` each token's (name, value), value None for a
    token without '='. `source` is the string as given, which error messages quote."""

    text: str
    env: Optional[str]
    tokens: tuple[str, ...]
    parameters: tuple[tuple[str, Optional[str]], ...]
    backend: str = ""
    env_id: str = ""
    source: str = dataclasses.field(default="", compare=False)
    all_tokens: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def modification(self) -> str:
        """The modifications without the env token ("" for none)."""
        return " ".join(self.tokens)

    @property
    def quoted(self) -> str:
        """The modification as messages quote it: the string given, or its modifications when it named a game."""
        return self.source if self.env is None else self.modification

    @property
    def game(self) -> str:
        return game_name(self.env_id)


_PARSED: dict[str, Task] = {}  # string -> its syntax; its canonical form is entered with it (parsed for free)
_PARSED_MAX = 4096


def _parse(text: str) -> Task:
    """The syntax of a string (no backend, no env id): the one place a string is tokenised. A string with two env
    tokens or an empty one is kept as tokens here and refused by `parse_task` (the canonical form of any string
    exists)."""
    task = _PARSED.get(text)
    if task is None:
        tokens = sorted(set(text.split()))
        envs = [t[len(ENV_TOKEN):] for t in tokens if t.startswith(ENV_TOKEN)]
        mods = tuple(t for t in tokens if not t.startswith(ENV_TOKEN))
        parameters = tuple((name, value if sep else None) for name, sep, value in (t.partition("=") for t in mods))
        task = Task(text=" ".join(tokens), env=envs[0] if len(envs) == 1 else None, tokens=mods,
                    parameters=parameters, source=text, all_tokens=tuple(tokens))
        if len(_PARSED) >= _PARSED_MAX:  # a curriculum drawing ever new strings: start over
            _PARSED.clear()
        _PARSED[text] = task
        _PARSED.setdefault(task.text, dataclasses.replace(task, source=task.text))
    return task


@functools.lru_cache(maxsize=4096)
def parse_task(text: str, backend: str = "", env_id: str = "") -> Task:
    """The task a curriculum entry names, for a run of `backend` on `env_id` (the game of entries without an env
    token). Raises a one-line UserError when the string names more than one game or an empty one."""
    if not isinstance(text, str):
        raise TypeError(f"a task is a modification string, got {text!r}")
    task = _parse(text)
    envs = [t[len(ENV_TOKEN):] for t in task.all_tokens if t.startswith(ENV_TOKEN)]
    if len(envs) > 1:
        raise UserError(f"modification {text!r} names {len(envs)} environments ({', '.join(envs)}); a task has one")
    if envs and not envs[0]:
        raise UserError(f"modification {text!r}: 'env=' needs an env id, e.g. env=MinAtar/Breakout")
    return dataclasses.replace(task, backend=backend, env_id=task.env or env_id)


def as_task(modification: str | Task, backend: str = "", env_id: str = "") -> Task:
    """`modification` if it is already a Task, else the string parsed for (backend, env_id)."""
    return modification if isinstance(modification, Task) else parse_task(modification, backend, env_id)


def parse_tasks(strings: Iterable[str], backend: str = "", env_id: str = "") -> list[Task]:
    return [parse_task(s, backend, env_id) for s in strings]


def own_task(modification: str | Task, backend: str, env_id: str) -> Task:
    """The task of a backend env of `env_id`: a task of another game is refused (a switch of game swaps envs,
    `continual.envs.vector`)."""
    task = as_task(modification, backend, env_id)
    if task.env_id != env_id:
        raise ValueError(f"{backend} env {env_id}: {task.text!r} runs {task.env_id} (a switch of game swaps envs)")
    return task


def task_env_ids(tasks: Iterable[Task]) -> tuple[str, ...]:
    """The sorted distinct env ids a run's tasks run."""
    return tuple(sorted({t.env_id for t in tasks}))


def parse_eval_modifs(text: str) -> list[str]:
    """`--eval_modifs`: modification strings separated by ';' ("" -> none; an empty item is the unmodified game)."""
    if not text or not text.strip():
        return []
    out: list[str] = []
    for item in text.split(";"):
        m = normalize_modification(item)
        if m not in out:
            out.append(m)
    return out
