"""The house plan's import rules, computed from the source (ast), not from what happens to be imported at runtime.

Imports flow one way: entry points (top-level scripts, bench/, code under `if __name__ == "__main__":`, and
`continual.api`, the Python API) -> agents -> continual. Nothing under continual/ imports agents or a top-level
script (`continual.api` may import agents); nothing under continual/ or agents/ imports `continual.api`; there is no cycle between modules or
between the sub-packages of continual/; and first-party modules are imported at the top of a module, never inside a
function (where an import would hide a cycle). Functions may import optional third-party packages (wandb, ray).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = {p.stem for p in ROOT.glob("*.py")}  # continual_training_example, eval, modification_factories
FIRST_PARTY = {"continual", "agents", *TOP_LEVEL}
# entry points inside the package (so that users can `from continual.api import train`): they start agents
ENTRY_MODULES = {"continual.api"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def library_files() -> dict[str, Path]:
    return {module_name(p): p for d in ("continual", "agents") for p in sorted((ROOT / d).rglob("*.py"))}


def _is_main_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def imports(path: Path, modules: set[str]) -> list[tuple[str, int, bool]]:
    """(imported first-party module, line, inside a function) for every import outside `if __name__ == ...`.
    `from pkg import name` counts as importing pkg.name when that is a module, else pkg."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if _is_main_guard(node):
            return  # a script's entry point may import anything
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno, in_function) for a in node.names if a.name.split(".")[0] in FIRST_PARTY)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] in FIRST_PARTY:
                for a in node.names:
                    full = f"{base}.{a.name}"
                    out.append((full if full in modules else base, node.lineno, in_function))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return out


def graph() -> dict[str, set[str]]:
    files = library_files()
    return {m: {t for t, _, _ in imports(p, set(files)) if t in files and t != m} for m, p in files.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle as a list of nodes (first == last), or [] (iterative DFS, three colours)."""
    colour = dict.fromkeys(edges, 0)
    for start in edges:
        if colour[start]:
            continue
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(nxt, 2) == 1:
                return path[path.index(nxt):] + [nxt]
            elif colour.get(nxt) == 0:
                colour[nxt] = 1
                stack.append((nxt, iter(sorted(edges[nxt]))))
                path.append(nxt)
    return []


def test_the_graph_is_not_empty():
    g = graph()
    assert "continual.training.startup" in g and "agents.ppo" in g
    assert "continual.curricula" in g["continual.training.startup"]  # `from continual.curricula import ...`
    assert "continual.training.startup" in g["agents.ppo"]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_continual_imports_neither_agents_nor_top_level_scripts():
    files = library_files()
    bad = [f"{p.relative_to(ROOT)}:{line} imports {target}"
           for m, p in files.items() if m.startswith("continual")
           for target, line, _ in imports(p, set(files))
           if target.split(".")[0] in TOP_LEVEL or (target.split(".")[0] == "agents" and m not in ENTRY_MODULES)]
    assert not bad, "continual/ must not import agents or a top-level script:\n" + "\n".join(bad)


def test_nothing_in_the_library_imports_an_entry_module():
    files = library_files()
    assert ENTRY_MODULES <= set(files)
    bad = [f"{p.relative_to(ROOT)}:{line} imports {target}" for m, p in files.items()
           for target, line, _ in imports(p, set(files)) if target in ENTRY_MODULES and m != target]
    assert not bad, "entry modules are imported by entry points only:\n" + "\n".join(bad)


def test_agents_import_no_top_level_script_outside_their_main_guard():
    files = library_files()
    bad = [f"{p.relative_to(ROOT)}:{line} imports {target}"
           for m, p in files.items() if m.startswith("agents")
           for target, line, _ in imports(p, set(files)) if target.split(".")[0] in TOP_LEVEL]
    assert not bad, "\n".join(bad)


def test_no_first_party_import_inside_a_function():
    files = library_files()
    bad = [f"{p.relative_to(ROOT)}:{line} imports {target} inside a function"
           for m, p in files.items() for target, line, inside in imports(p, set(files)) if inside]
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_modules():
    cycle = find_cycle(graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_subpackages():
    """continual.envs -> continual.config -> continual.envs would be a cycle even if no two modules form one."""
    def unit(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:2]) if parts[0] == "continual" else parts[0]

    units: dict[str, set[str]] = {}
    for m, targets in graph().items():
        units.setdefault(unit(m), set()).update(unit(t) for t in targets if unit(t) != unit(m))
    for u in list(itertools.chain.from_iterable(units.values())):
        units.setdefault(u, set())
    cycle = find_cycle(units)
    assert not cycle, "cycle between sub-packages: " + " -> ".join(cycle)


def test_tests_share_code_through_helpers_only():
    """Shared test code lives in tests/helpers/ (and conftest.py): no test module imports another."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not offenders, offenders


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(library_files()))
def test_every_module_imports_alone(module):
    """Each module imports in a fresh interpreter by itself (an order-dependent import would hide a cycle)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
