"""Your curricula: the file to edit to add a modification factory.

A modification factory maps the training global step (agent steps summed over all envs) to a modification string
("all_green_cars reverse_car_speed_top", "gravity=12.0", or "" for the unmodified game); when the string changes, the
training loop switches the environments in place. Add one in three steps:

1. Write a class with `__init__(self, num_total_steps, **kwargs)` and `get_modification(self, step) -> str` (the
   seed's contract: it is asked once per rollout, in order, and may keep state or draw from `random`/`np.random`;
   a resumed run replays the calls), or subclass `ModificationFactory` (pure, any order; see the guide).
2. Register it: `modification_factory_mapping["MyFactory"] = MyFactory`.
3. Name it in run_config.json: `"modification_factory": "MyFactory", "modification_factory_kwargs": {...}`.

Preview a schedule: `python modification_factories.py run_config.json`. The guide to the contract (granularity,
randomness, checkpoints): `continual/curricula/__init__.py`; the seven built-in factories (Sequential, Random,
Combined, ...): `continual/curricula/builtin.py`. All of them are importable from here, as before.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # the preview: this file is imported as the module `modification_factories` and only then run, so that each of
    # your factories is defined and registered once, under the name configs use ("modification_factories:MyFactory")
    import modification_factories

    sys.exit(modification_factories.main())

from continual.curricula import *  # noqa: E402,F401,F403  (the built-ins and the machinery, by their old names)
from continual.curricula import modification_factory_mapping  # noqa: E402


class AlternatingModificationFactory:
    """Example of the seed's contract: `modifications[0]` and `modifications[1]` take turns every `period` steps."""

    def __init__(self, num_total_steps: int, modifications: list[str], period: int):
        self.num_total_steps, self.modifications, self.period = num_total_steps, modifications, period

    def get_modification(self, step: int) -> str:
        return self.modifications[(step // self.period) % 2]


modification_factory_mapping["Alternating"] = AlternatingModificationFactory
# modification_factory_mapping["MyFactory"] = MyFactory

