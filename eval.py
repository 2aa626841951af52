"""Evaluate a checkpoint under one or several modification strings; one row per modification.

    python eval.py --agent_path runs/<run>/<exp_name>.cleanrl_model --modifs "" "all_green_cars"

`--agent_path` takes the final policy (`runs/<run>/<exp_name>.cleanrl_model`, a plain state_dict: the run's
config.json next to it describes the agent), a full checkpoint (`runs/<run>/checkpoints/*.cleanrl_model`) or a run
directory (its newest checkpoint). The architecture, observation settings and environment come from the run;
`--env_id` / `--backend` only change them when given, `--her` / `--game_specific_goals` are checked against it.
Default: the unmodified game (or the `--modifs` given); `--all_regimes` evaluates every regime of the curriculum.
Episodes are whole games (no life cuts). Writes CSV and JSON next to the run.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Optional, Sequence

import torch

from agents import AGENT_MODULES
from continual.config.loading import cli
from continual.errors import exit_on_user_error
from continual.evaluation import checkpoints
from continual.evaluation.checkpoints import (  # noqa: F401  (eval.X, as before the machinery moved)
    EvalArgs,
    check_training_flags,
    evaluate_checkpoint,
    matrix,
    print_table,
    regimes_to_evaluate,
)


def agent_module(architecture: str) -> Optional[ModuleType]:
    """The module with `make_agent` for an architecture (None: not available)."""
    return importlib.import_module(AGENT_MODULES[architecture]) if architecture in AGENT_MODULES else None


def load_policy(state: dict, obs_space, action_space, device: torch.device):
    return checkpoints.load_policy(state, obs_space, action_space, device, agent_module)


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(EvalArgs, argv, default=None, description=__doc__.splitlines()[0])
    args.given_flags = tuple(name for name in ("her", "game_specific_goals") if flag_given(argv, name))
    return matrix(args, agent_module) if len(args.agent_path) > 1 else evaluate_checkpoint(args, agent_module)


def flag_given(argv: Sequence[str], name: str) -> bool:
    spellings = {name, name.replace("_", "-")}
    return any(a.split("=", 1)[0] in {f"--{p}{n}" for n in spellings for p in ("", "no-", "no_")} for a in argv)


if __name__ == "__main__":
    main()
