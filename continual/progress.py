"""Progress bar: steps, SPS, regime and recent return (tqdm, on stderr)."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm


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
