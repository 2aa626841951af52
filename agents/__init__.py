"""One self-contained file per algorithm. Each module has `train(args, curriculum, resume_state)` and
`make_agent(obs_space, action_space, args)`; `AGENT_MODULES` maps `--architecture` to its module, from each
agent's spec (continual/specs.py)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

from continual.specs import SPECS

AGENT_MODULES = {name: spec.module for name, spec in SPECS.items()}


def agent_module(architecture: str) -> Optional[ModuleType]:
    """The agent file of an architecture (its `train` and `make_agent`); None when it is not available."""
    return importlib.import_module(AGENT_MODULES[architecture]) if architecture in AGENT_MODULES else None
