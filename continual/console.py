"""What a person watches on the console: tables (rich; eval.py, the metrics CLI, the benchmarks) and the training
progress bar (tqdm, on stderr: steps, SPS, regime and recent return)."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table
from tqdm import tqdm


def print_table(title: Optional[str], columns: Sequence[str], rows: Iterable[Sequence[Any]],
                width: Optional[int] = None) -> None:
    """First column left-aligned, the rest right-aligned; cells are str()-ed."""
    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(str(c), justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*(str(c) for c in r))
    Console(width=width).print(table)


class Progress:
    def __init__(self, session, enabled: bool = True):
        self.session = session
        self.bar = tqdm(total=session.total_timesteps, initial=session.global_step, unit="step", disable=not enabled,
                        dynamic_ncols=True, mininterval=1.0)

    def update(self) -> None:
        s = self.session
        self.bar.update(s.global_step - self.bar.n)
        recent = f"{np.mean(s.recent_returns):.1f}" if s.recent_returns else "-"
        self.bar.set_postfix_str(f"sps={s.sps()} regime={s.modification or '(none)'} return={recent}", refresh=False)

    def close(self) -> None:
        self.bar.close()
