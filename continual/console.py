"""Tables on the console (rich): the one table printer for eval.py, the metrics CLI and the benchmarks."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from rich.console import Console
from rich.table import Table


def print_table(title: Optional[str], columns: Sequence[str], rows: Iterable[Sequence[Any]],
                width: Optional[int] = None) -> None:
    """First column left-aligned, the rest right-aligned; cells are str()-ed."""
    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(str(c), justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*(str(c) for c in r))
    Console(width=width).print(table)
