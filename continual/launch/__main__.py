"""python -m continual.launch EXPERIMENT.json: see continual/launch/launcher.py."""

from __future__ import annotations

import importlib
import os
import sys

from continual.errors import exit_on_user_error
from continual.launch.launcher import main


def register_script_factories(script: str) -> None:
    """The factories of the modification_factories.py beside the training script, registered by name as the
    training CLI registers them, so that the launcher's check of each run knows them."""
    folder = os.path.dirname(os.path.abspath(script))
    if os.path.exists(os.path.join(folder, "modification_factories.py")):
        sys.path.insert(0, folder)
        importlib.import_module("modification_factories")


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main)(prepare=register_script_factories))
