"""Continual behaviour is pinned (tests/helpers/extension_reference.py): every agent with the continual methods it
supports plays the same games, logs the same scalars and evaluation table, writes checkpoints of the same structure
and reaches the same weights as the recording made before the extension interface (issue 50)."""

from __future__ import annotations

import ast
import glob
import json
import os

import pytest
import torch

from continual.training.extensions import Extension, Extensions
from helpers.extension_reference import CASES, DATA, FAST, ROOT, recorded, recordings, run_case, run_reference_here
from helpers.reference_revision import expected_for

with open(DATA) as f:
    RECORDED = json.load(f)


def test_every_case_is_recorded_and_the_recording_is_small():
    assert sorted(RECORDED["cases"]) == sorted(CASES)
    assert os.path.getsize(DATA) < 200_000
    for path in glob.glob(DATA[:-len(".json")] + ".*.json"):  # machine recordings: cases of the plain file, and why
        with open(path) as f:
            machine = json.load(f)
        assert set(machine["cases"]) <= set(CASES) and machine["same_as"], path


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == FAST else pytest.mark.slow) for c in CASES])
def test_the_case_behaves_as_recorded(tmp_path, case):
    """Equal to a recording (the reference revision's outputs on some machine), else to the reference revision run
    here (a machine with other kernels), else compared with the recording meant for this machine."""
    got = run_case(case, str(tmp_path / "case"))
    expected = expected_for(got, recordings(case), lambda: run_reference_here(case, str(tmp_path / "reference")),
                            lambda: recorded()[case])
    if expected is None:
        return
    assert got["episodes"] == expected["episodes"], "episodes"
    for i, (g, e) in enumerate(zip(got["records"], expected["records"])):
        assert g == e, f"record {i}: {g} != {e}"
    assert len(got["records"]) == len(expected["records"]), "records"
    assert got["names"] == expected["names"], "the scalars logged"
    assert got["eval_table"] == expected["eval_table"], "evaluation table"
    assert got["checkpoints"] == expected["checkpoints"], "checkpoints"
    assert got["weights"] == expected["weights"], "final weights"


def test_a_machine_no_recording_matches_runs_the_reference_revision_and_is_compared_with_it(tmp_path, monkeypatch):
    """The path of a machine with new kernels: no recording matches, so the reference revision runs here from its
    worktree, and the case must equal what it did."""
    import sys

    from helpers.extension_reference import REFERENCE_REVISION
    from helpers.reference_revision import checkout

    if checkout(REFERENCE_REVISION) is None:
        pytest.skip(f"this checkout has no {REFERENCE_REVISION} (no git history, a shallow clone)")
    ran, original = [], run_reference_here

    def spy(case, workdir):
        ran.append(original(case, workdir))
        return ran[-1]
    monkeypatch.setattr(sys.modules[__name__], "recordings", lambda case: [])
    monkeypatch.setattr(sys.modules[__name__], "run_reference_here", spy)
    test_the_case_behaves_as_recorded(tmp_path, FAST)
    assert ran and ran[0] is not None and ran[0]["episodes"], "the reference revision did not run here"


# --- one extension interface ------------------------------------------------------------------------------------------

HOOKS = {k for k, v in vars(Extension).items() if callable(v) and not k.startswith("_")} - {
    "state_dict", "load_state_dict"}  # every network has those


def test_the_composite_calls_every_hook():
    own = {k for k, v in vars(Extensions).items() if callable(v) and not k.startswith("_")}
    assert HOOKS - {"attach", "loss_terms"} <= own, HOOKS - own


def test_no_agent_defines_a_hook_protocol_of_its_own():
    """Continual behaviour reaches an agent's loop through `Extension` only: a class in agents/ that defines a
    method named like one of its hooks (or like the old protocols': commit, on_switch, ...) must be an Extension."""
    old = {"commit", "on_switch", "after_optimizer_step", "record_grads", "maybe_log", "take_log", "penalty"}
    offenders = []
    for path in sorted(glob.glob(os.path.join(ROOT, "agents", "*.py"))):
        tree = ast.parse(open(path).read())
        classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}

        def is_extension(cls: ast.ClassDef) -> bool:
            bases = [ast.unparse(b).split(".")[-1] for b in cls.bases]
            return any(b in ("Extension", "HerExtension") or (b in classes and is_extension(classes[b]))
                       for b in bases)

        for cls in classes.values():
            methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
            hooks = methods & (HOOKS | old)
            if hooks and not is_extension(cls):
                offenders.append(f"{os.path.basename(path)}:{cls.name} {sorted(hooks)}")
    assert not offenders, offenders


def test_continual_behaviour_enters_ppos_loop_at_few_call_sites():
    """The loop's calls into the extensions (`ext.<point>`), HER's rollout included: obs after a switch, the envs'
    step (with its time-limit bootstraps' observations), the update's batch, a minibatch, the loss, before and after
    the optimizer step, after the update (issue 50: at most ~8). The scalars join the log in the session, not in the
    loop."""
    from agents import ppo

    assert continual_call_sites(ppo.train) <= 8


def continual_call_sites(fn) -> int:
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    loop = next(n for n in ast.walk(tree) if isinstance(n, ast.For) and ast.unparse(n.target) == "iteration")
    return sum(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
               and n.func.value.id == "ext" for n in ast.walk(loop))


def test_plain_ppos_loss_knows_no_sample_weights():
    """Issue 50: HER's importance weights do not leak into plain PPO's loss. A minibatch's losses are averaged by the
    reduction the extensions give (`Extension.minibatch`): `torch.mean` without one, the same bits as CleanRL's
    `.mean()`; HER's weights its relabelled samples inside continual/her.py (its pinned references fix the bits)."""
    import inspect
    import textwrap

    from agents import ppo

    tree = ast.parse(textwrap.dedent(inspect.getsource(ppo.train)))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not [n for n in names if "weight" in n.lower()], names
    module = ast.parse(inspect.getsource(ppo))
    imported = {a.name for n in ast.walk(module) if isinstance(n, ast.ImportFrom) for a in n.names} | {
        n.module for n in ast.walk(module) if isinstance(n, ast.ImportFrom)}
    assert "continual.her" not in imported and not [n for n in imported if "weight" in (n or "").lower()]

    batch = {"obs": torch.arange(12.0).reshape(6, 2)}
    obs, inputs, mean = Extensions([Extension()]).minibatch(batch, torch.tensor([4, 1, 3]))
    assert torch.equal(obs, batch["obs"][[4, 1, 3]]) and inputs == {}
    x = torch.randn(257, generator=torch.Generator().manual_seed(0))
    assert mean is torch.mean and torch.equal(mean(x), x.mean())


AGENTS = ["ppo", "a2c", "dqn", "impala", "clear", "pnc", "ppo_cbp"]


@pytest.mark.parametrize("name", AGENTS)
def test_each_agents_continual_setup_is_a_few_lines(name):
    """Issue 50: each agent's setup <= 8 lines (was 20-30): the statements next to `add_continual` that give the
    session the agent's state and continual behaviour (those that use the session, and the extension lists and spaces
    passed to it); a variant's whole `train`."""
    import importlib

    assert continual_setup_lines(importlib.import_module(f"agents.{name}").train) <= 8


def continual_setup_lines(fn) -> int:
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    block = next((b for n in ast.walk(tree) for b in (getattr(n, "body", None),) if isinstance(b, list)
                  and any(isinstance(s, (ast.Assign, ast.Expr)) and "add_continual(" in ast.unparse(s) for s in b)),
                 None)
    if block is None:  # a variant: train() hands its network and extensions to PPO's or IMPALA's
        return sum(s.end_lineno - s.lineno + 1 for s in tree.body[0].body)
    at = next(i for i, s in enumerate(block)
              if isinstance(s, (ast.Assign, ast.Expr)) and "add_continual(" in ast.unparse(s))
    passed = {n.id for n in ast.walk(block[at]) if isinstance(n, ast.Name)}

    def setup(s) -> bool:
        text = ast.unparse(s)
        assigned = {t.id for t in getattr(s, "targets", []) if isinstance(t, ast.Name)}
        hands_session = any(isinstance(n, ast.Call) and any(isinstance(a, ast.Name) and a.id == "session" for a in n.args)
                            for n in ast.walk(s))
        return hands_session or any(f"session.{k}" in text for k in ("register(", "describe_policy(", "resum")) or bool(assigned & passed - {
            "session", "agent", "q_network", "optimizer", "device", "args"})

    lo, hi = at, at
    while lo > 0 and setup(block[lo - 1]):
        lo -= 1
    while hi + 1 < len(block) and setup(block[hi + 1]):
        hi += 1
    return sum(s.end_lineno - s.lineno + 1 for s in block[lo:hi + 1])
