"""Our own modification registry, for modifications that the pinned hackatari 0.0.6 lacks.

A modification is a function `make(env, rng) -> Hooks`, registered per game with `@modification(game, name)`.
`env` is the live HackAtari env (`env.get_ram()`, `env.set_ram(i, v)`), `rng` a `numpy.random.Generator` seeded per
env, and the returned hooks run: `step` before every emulator frame, `reset` after every reset, `post` after object
detection. A fresh `make` call happens at every switch, so per-modification state lives in the closure.

Adding one: write the function in `continual/envs/modifications/<game>.py`, decorate it with `@modification`
(from `.registry`), and import the module below.
Names registered here take precedence over hackatari's own names.
"""

from __future__ import annotations

from continual.envs.modifications import freeway  # noqa: F401  (each game's module registers on import)
from continual.envs.modifications.registry import REGISTRY, Hooks, modification, registered

__all__ = ["REGISTRY", "Hooks", "modification", "registered"]
