"""continual/specs.py: one spec per agent. Every architecture trains with its own algorithm's defaults, the
precedence defaults < spec < run_config.json < command line holds, the docs' table is the specs', and no code under
continual/ or agents/ compares an architecture with a literal (the spec says it)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from conftest import ROOT, write_config
from continual.config.args import Args, default_args
from continual.config.loading import parse_args
from continual.specs import AGENT_END, AGENT_START, FEATURES, SPECS, agent_block, agent_file, docs_with_defaults
from continual.training.startup import granularity_of, parse_train_args

CARTPOLE = ["--env_id", "CartPole-v1", "--backend", "Gymnasium"]


@pytest.mark.parametrize("name", list(SPECS))
def test_every_architecture_trains_with_its_own_defaults(name):
    args, _ = parse_args(["--architecture", name, *CARTPOLE])
    for key, value in SPECS[name].defaults.items():
        assert getattr(args, key) == value, (name, key)
    untouched = {k for k in vars(Args()) if k not in SPECS[name].defaults and k != "architecture"}
    assert all(getattr(args, k) == getattr(Args(), k) for k in untouched - {"env_id", "backend"})


def test_dqn_learning_rate_is_not_ppo_s():
    """CleanRL's dqn_atari: Adam 1e-4, constant, one env; PPO's 2.5e-4 annealed is Args' own."""
    dqn, _ = parse_args(["--architecture", "DQN", *CARTPOLE])
    ppo, _ = parse_args(CARTPOLE)
    assert (dqn.learning_rate, dqn.anneal_lr, dqn.num_envs) == (1e-4, False, 1)
    assert (ppo.learning_rate, ppo.anneal_lr, ppo.num_envs) == (2.5e-4, True, 8)
    a2c, _ = parse_args(["--architecture", "A2C", *CARTPOLE])
    assert (a2c.learning_rate, a2c.num_steps, a2c.gae_lambda) == (7e-4, 5, 1.0)


def test_precedence_spec_below_config_below_command_line(tmp_path):
    config = write_config(tmp_path, {"architecture": "DQN", "env_id": "CartPole-v1", "backend": "Gymnasium",
                                     "num_envs": 2})
    args, _ = parse_args(["--config", config])
    assert (args.learning_rate, args.num_envs, args.anneal_lr) == (1e-4, 2, False)  # spec, config, spec
    args, _ = parse_args(["--config", config, "--learning_rate", "3e-3", "--anneal_lr"])
    assert (args.learning_rate, args.num_envs, args.anneal_lr) == (3e-3, 2, True)  # command line wins
    config = write_config(tmp_path, {"architecture": "DQN", "env_id": "CartPole-v1", "backend": "Gymnasium",
                                     "learning_rate": 5e-4})
    assert parse_args(["--config", config])[0].learning_rate == 5e-4  # the config wins over the spec
    # the command line's architecture picks the spec; the config's values still apply over it
    args, _ = parse_args(["--config", config, "--architecture", "A2C"])
    assert (args.architecture, args.learning_rate, args.num_steps) == ("A2C", 5e-4, 5)


def test_an_agent_file_parses_with_its_own_defaults():
    """`python agents/dqn.py` (parse_train_args with its architecture) resolves as --architecture DQN."""
    args, _, _ = parse_train_args(CARTPOLE, architecture="DQN")
    assert (args.architecture, args.learning_rate, args.num_envs) == ("DQN", 1e-4, 1)
    args, _, _ = parse_train_args([*CARTPOLE, "--learning_rate", "0.01"], architecture="DQN")
    assert args.learning_rate == 0.01


def test_the_python_api_resolves_as_the_command_line():
    from continual.api import make_args

    args, _ = make_args(architecture="DQN", env_id="CartPole-v1", backend="Gymnasium")
    assert (args.learning_rate, args.num_envs) == (1e-4, 1)
    args, _ = make_args(architecture="DQN", env_id="CartPole-v1", backend="Gymnasium", learning_rate=0.01)
    assert args.learning_rate == 0.01
    # an Args given explicitly is taken as it is
    args, _ = make_args(Args(architecture="DQN", env_id="CartPole-v1", backend="Gymnasium"))
    assert args.learning_rate == Args().learning_rate


def test_default_args_and_gradient_clip_follow_the_spec():
    assert default_args("IMPALA").grad_clip_norm() == Args(architecture="IMPALA").grad_clip_norm() == 40.0
    assert default_args("DQN").learning_rate == 1e-4 and default_args("NOPE") == Args()


def test_specs_are_well_formed():
    for name, spec in SPECS.items():
        assert spec.name == name and spec.module == f"agents.{name.lower()}" and spec.summary
        assert spec.features <= set(FEATURES), name
        assert set(spec.defaults) <= set(vars(Args())), name
        assert "architecture" not in spec.defaults


def test_granularity_is_the_spec_s_iteration():
    impala = Args(architecture="IMPALA", num_envs=8, num_actors=2, batch_size=4, unroll_length=20)
    assert granularity_of(impala) == 4 * 20 * 4
    assert granularity_of(Args(num_envs=8, num_steps=128)) == 1024


def test_docs_table_is_the_specs():
    with open(os.path.join(ROOT, "docs", "extending.md")) as f:
        text = f.read()
    assert docs_with_defaults(text) == text, "run: python -m continual.specs --update-docs"


def _architecture_comparisons(path: Path) -> list[int]:
    """Lines where `architecture` (a name or an attribute) is compared with a string or a tuple of strings."""
    def is_architecture(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "architecture") or (
            isinstance(node, ast.Attribute) and node.attr == "architecture")

    def is_literal(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(is_literal(e) for e in node.elts)

    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_architecture(s) for s in sides) and any(is_literal(s) for s in sides):
                lines.append(node.lineno)
    return lines


def test_no_architecture_is_named_outside_its_spec():
    """Per-architecture knowledge lives in the spec: nothing under continual/ or agents/ compares an architecture
    with a literal name (the spec's features, defaults and iteration size say what differs)."""
    root = Path(ROOT)
    found = {str(p.relative_to(root)): lines for d in ("continual", "agents") for p in sorted((root / d).rglob("*.py"))
             if (lines := _architecture_comparisons(p))}
    assert found == {}


def test_each_agent_file_shows_its_own_defaults_and_features():
    """A reader of agents/dqn.py sees its learning rate (1e-4) there, and `--help` says it: both generated from
    SPECS (`python -m continual.specs --update-docs`)."""
    from continual.io import between_markers

    for name in SPECS:
        with open(os.path.join(ROOT, agent_file(name))) as f:
            text = f.read()
        assert between_markers(text, AGENT_START, AGENT_END, agent_block(name)) == text, (
            f"{agent_file(name)}: run python -m continual.specs --update-docs")
    assert "--learning_rate 0.0001" in agent_block("DQN")
