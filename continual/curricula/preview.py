"""Preview a config's schedule: `python modification_factories.py run_config.json` (or
`python -m continual.curricula.preview run_config.json`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from continual.curricula.base import DEFAULT_GRANULARITY, FactoryConfigError, ModificationFactory, _check_int, _one_line
from continual.curricula.builtin import granularity_rule, make_run_factory
from continual.curricula.registry import make_factory


# --------------------------------------------------------------------------- #
# Preview CLI
# --------------------------------------------------------------------------- #
def _factory_from_config(
    config: Any, *, granularity: int | None, seed: int | None
) -> tuple[ModificationFactory, str]:
    if not isinstance(config, dict):
        raise FactoryConfigError(f"config must be a JSON object, got {type(config).__name__}")
    if "modification_factory" not in config:
        raise FactoryConfigError("missing in the config", path="modification_factory")
    name = config["modification_factory"]
    kwargs = config.get("modification_factory_kwargs", {})
    if seed is None:
        seed = config.get("seed", 1)
    seed = _check_int(seed, "seed", minimum=0)
    if granularity is not None:
        granularity = _check_int(granularity, "granularity", minimum=1)
        return make_factory(name, kwargs, seed=seed, granularity=granularity), str(name)
    # As training builds it (make_run_factory); the rollout size only matters for your own factories.
    if "num_envs" in config and "num_steps" in config:
        rollout = _check_int(config["num_envs"], "num_envs", minimum=1) * _check_int(
            config["num_steps"], "num_steps", minimum=1
        )
    else:
        rollout = DEFAULT_GRANULARITY
    return make_run_factory(name, kwargs, seed=seed, rollout_size=rollout), str(name)


def _print_preview(factory: ModificationFactory, name: str, max_rows: int) -> None:
    rows: list[tuple[int, int, str]] = []
    n_runs = 0
    for run in factory.iter_schedule():
        n_runs += 1
        if max_rows == 0 or len(rows) < max_rows:
            rows.append(run)
    hidden = n_runs - len(rows)
    possible = factory.possible_modifications()
    header = (
        f"{name}: total {factory.total_timesteps} steps, granularity {factory.granularity}, "
        f"seed {factory.seed}, {max(n_runs - 1, 0)} switches"
    )
    cells = [(str(s), str(e), str(e - s), m or "(none)") for s, e, m in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # type: ignore[assignment,misc]
    if Console is not None:
        widest = max([len(c[3]) for c in cells] + [len(p) for p in possible] + [len(header), 20])
        # Wide enough that long modification strings are never wrapped when piped.
        console = Console(width=None if sys.stdout.isatty() else widest + 60, highlight=False)
        console.print(header, markup=False)
        console.print(granularity_rule(factory), markup=False, soft_wrap=True)
        table = Table()
        for column in ("start", "end", "steps"):
            table.add_column(column, justify="right")
        table.add_column("modification", overflow="fold")
        for cell in cells:
            table.add_row(*cell)
        console.print(table)
        if hidden:
            console.print(f"... {hidden} more rows (use --max-rows 0 to show all)", markup=False)
        console.print(f"possible modifications ({len(possible)}):", markup=False)
        for p in possible:
            console.print(f"  {p or '(none)'}", markup=False)
        return
    print(header)
    print(granularity_rule(factory))
    titles = ("start", "end", "steps", "modification")
    widths = [max([len(t)] + [len(c[i]) for c in cells]) for i, t in enumerate(titles)]
    print("  ".join(t.rjust(w) if i < 3 else t for i, (t, w) in enumerate(zip(titles, widths))))
    for cell in cells:
        print("  ".join(c.rjust(w) if i < 3 else c for i, (c, w) in enumerate(zip(cell, widths))))
    if hidden:
        print(f"... {hidden} more rows (use --max-rows 0 to show all)")
    print(f"possible modifications ({len(possible)}):")
    for p in possible:
        print(f"  {p or '(none)'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="modification_factories.py",
        description="Preview the modification schedule of a training config.",
    )
    parser.add_argument("config", help="JSON file with modification_factory and modification_factory_kwargs")
    parser.add_argument("--granularity", type=int, default=None, help="steps per decision (default num_envs*num_steps, else 1024)")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: the config's seed, else 1)")
    parser.add_argument("--max-rows", type=int, default=200, help="table rows to print, 0 for all (default 200)")
    args = parser.parse_args(argv)
    try:
        if args.max_rows < 0:
            raise FactoryConfigError(f"must be >= 0, got {args.max_rows}", path="--max-rows")
        try:
            with open(args.config, encoding="utf-8") as fh:
                config = json.load(fh)
        except OSError as exc:
            raise FactoryConfigError(f"cannot read config: {exc.strerror or exc}", path=args.config) from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FactoryConfigError(f"invalid JSON: {exc}", path=args.config) from exc
        factory, name = _factory_from_config(config, granularity=args.granularity, seed=args.seed)
        _print_preview(factory, name, args.max_rows)
    except (FactoryConfigError, ValueError, TypeError) as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
