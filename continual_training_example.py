"""Train an agent through a curriculum of environment modifications.

    python continual_training_example.py --config run_config.json [--architecture PPO|PPO_CBP|IMPALA|CLEAR|PNC|DQN|A2C] [flags]

Flags override run_config.json, which overrides the defaults (`--help` lists every flag). `--resume RUN_DIR`
continues a run from its newest checkpoint.
"""

from __future__ import annotations

import importlib
from typing import Optional, Sequence

import modification_factories  # noqa: F401  (registers your factories by name)
from agents import AGENT_MODULES
from continual.errors import UserError, exit_on_user_error
from continual.training.startup import parse_train_args, print_config


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> str:
    args, curriculum, resume_state = parse_train_args(argv, description=__doc__.splitlines()[0], architectures=list(AGENT_MODULES))
    if args.architecture not in AGENT_MODULES:
        raise UserError(f"architecture: {args.architecture} is not available yet; available: "
                        f"{', '.join(AGENT_MODULES)}")
    print_config(args, curriculum, resume_state)  # validates everything first
    agent_module = importlib.import_module(AGENT_MODULES[args.architecture])
    return agent_module.train(args, curriculum, resume_state)


if __name__ == "__main__":
    main()
