"""The registry of our own modifications: `@modification(game, name)` and `registered(game)`."""

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
