"""continual.testing.faults: its test hooks stay out of the production paths that a fixture can reach (issue 50).

The trainer's own faults (checkpoint writes, switches, full disks) are monkeypatches (tests/helpers/trainer_faults.py);
named points remain only where a patch cannot reach: inside spawned env workers and IMPALA actors, and in the IMPALA
learner's publish and switch broadcast (agents/impala.py runs as __main__ in the tests)."""

from __future__ import annotations

import ast
import os

from conftest import ROOT
from continual.testing import faults

# file -> the points it may reach (22 call sites before issue 50; these 10 remain)
ALLOWED = {
    "agents/impala.py": {"actor_switch", "actor_step", "actor_wait", "actor_weights", "broadcast_switch", "publish"},
    "continual/envs/batched.py": {"env_step"},  # IMPALA's actors step their envs in-process
    "continual/envs/vector.py": {"env_step", "env_reset", "env_switch"},  # the async vector env's workers
}


def fault_points() -> dict[str, list[str]]:
    """file -> the points named by its calls to continual.testing.faults' inject/kill_at, under continual/ and
    agents/ (continual/testing itself excluded)."""
    found: dict[str, list[str]] = {}
    for top in ("continual", "agents"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                path = os.path.join(d, name)
                rel = os.path.relpath(path, ROOT)
                if not name.endswith(".py") or rel.startswith(os.path.join("continual", "testing")):
                    continue
                tree = ast.parse(open(path, encoding="utf-8").read())
                hooks = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                         and n.module == "continual.testing.faults" for a in n.names}
                if any(isinstance(n, ast.ImportFrom) and n.module == "continual.testing"
                       and any(a.name == "faults" for a in n.names) for n in ast.walk(tree)):
                    hooks |= {"faults.inject", "faults.kill_at"}
                for n in ast.walk(tree):
                    if isinstance(n, ast.Call) and ast.unparse(n.func) in hooks:
                        found.setdefault(rel, []).append(ast.literal_eval(n.args[0]))
    return found


def test_fault_points_stay_where_no_fixture_reaches():
    found = fault_points()
    assert {f: set(p) for f, p in found.items()} == ALLOWED, found
    assert sum(len(p) for p in found.values()) == 10
    # every point that fires is documented and planned the same way: the self-killing ones in workers and actors
    assert {p for ps in ALLOWED.values() for p in ps} - {"publish", "broadcast_switch"} == faults._SELF_KILL


def test_a_plan_fires_on_its_nth_time_for_its_target_only(monkeypatch):
    monkeypatch.setattr(faults, "_PLAN", faults._parse("publish:2@1, broadcast_switch"))
    monkeypatch.setattr(faults, "_COUNTS", {})
    assert faults._PLAN == {"publish": (2, 1), "broadcast_switch": (1, None)}
    assert not faults.inject("publish", who=0)  # another target: not counted
    assert [faults.inject("publish", who=1) for _ in range(3)] == [False, True, False]
    assert faults.inject("broadcast_switch") and not faults.inject("unplanned")
