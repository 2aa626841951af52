"""Train an agent through a curriculum of environment modifications.

    python continual_training_example.py --config run_config.json [--architecture PPO|PPO_CBP|IMPALA|CLEAR|PNC|DQN|A2C] [flags]

Flags override run_config.json, which overrides the defaults (`--help` lists every flag). `--resume RUN_DIR`
continues a run from its newest checkpoint.
"""

from __future__ import annotations

from typing import Optional, Sequence

import modification_factories  # noqa: F401  (registers your factories by name)
from agents import AGENT_MODULES
from continual.api import run
from continual.errors import exit_on_user_error
from continual.training.startup import parse_train_args


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> str:
    args, curriculum, resume_state = parse_train_args(argv, description=__doc__.splitlines()[0], architectures=list(AGENT_MODULES))
    return run(args, curriculum, resume_state)  # the same run code as the Python API's train()


if __name__ == "__main__":
    main()
