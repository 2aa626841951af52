"""agents/__init__.py's AGENT_MODULES is the one list of architectures for code; Args.architecture keeps a Literal
(tyro lists the choices in --help and refuses others with one line) that must name the same ones. This is the one
place that checks it."""

from __future__ import annotations

import importlib
import typing

from agents import AGENT_MODULES
from continual.config.args import Args


def test_args_architecture_choices_are_agent_modules():
    hints = typing.get_type_hints(Args)
    assert set(typing.get_args(hints["architecture"])) == set(AGENT_MODULES)


def test_every_agent_module_has_train_and_make_agent():
    for name, module in AGENT_MODULES.items():
        m = importlib.import_module(module)
        assert callable(m.train) and callable(m.make_agent), name
