"""Our own modification registry, for modifications that the pinned hackatari 0.0.6 lacks.

A modification is a function `make(env, rng) -> Hooks`, registered per game with `@modification(game, name)`.
`env` is the live HackAtari env (`env.get_ram()`, `env.set_ram(i, v)`), `rng` a `numpy.random.Generator` seeded per
env, and the returned hooks run: `step` before every emulator frame, `reset` after every reset, `post` after object
detection. A fresh `make` call happens at every switch, so per-modification state lives in the closure.

Adding one: write the function in `continual/envs/modifications/<game>.py`, decorate it, and import the module below.
Names registered here take precedence over hackatari's own names.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

Hook = Callable[[], None]


@dataclasses.dataclass
class Hooks:
    step: Optional[Hook] = None
    reset: Optional[Hook] = None
    post: Optional[Hook] = None


Maker = Callable[[object, np.random.Generator], Hooks]

# game name in lower case -> modification name -> maker
REGISTRY: dict[str, dict[str, Maker]] = {}


def modification(game: str, name: str, doc: Optional[str] = None) -> Callable[[Maker], Maker]:
    """Register `make(env, rng) -> Hooks` as modification `name` of `game` (e.g. "Freeway")."""

    def deco(fn: Maker) -> Maker:
        REGISTRY.setdefault(game.lower(), {})[name] = fn
        fn.__doc__ = doc or fn.__doc__ or name
        return fn

    return deco


def registered(game: str) -> dict[str, Maker]:
    return REGISTRY.get(game.lower(), {})


from continual.envs.modifications import freeway  # noqa: E402,F401  (registers on import)
