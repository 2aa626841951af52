"""python -m continual.report KIND FOLDER [--out DIR] [options]

Kinds: forgetting (a task sequence: CORA's and Continual World's metrics, run-level statistics, the experiment's
declarations), robustness (agents trained on curricula, evaluated at the end under a table of modifications; the
seed project's table beside ours), c_chain (C-CHAIN's Continual MinAtar table: the paper's score per run, mean +-
standard error and t intervals, the paper's numbers beside).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from continual.errors import exit_on_user_error
from continual.report import c_chain, forgetting, robustness

KINDS = ("forgetting", "robustness", "c_chain")


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m continual.report", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("folder", help="the experiment folder (its runs/ holds one run directory per entry)")
    p.add_argument("--out", help="write report.md, report.json and the figures here")
    p.add_argument("--seed-table", default="freeway", help="robustness: the seed project's numbers to print beside "
                   "ours ('none' for none)")
    p.add_argument("--experiment", help="forgetting: the experiment file whose declarations apply (default: the "
                   "folder's experiment.json)")
    a = p.parse_args(argv)
    if a.kind == "forgetting":
        result = forgetting.report(a.folder, a.out, experiment=a.experiment)
        print("\n".join(result["markdown"]))
        if a.out:
            print(f"report written to {a.out}")
    if a.kind == "c_chain":
        result = c_chain.report(a.folder, a.out)
        print("\n".join(result["markdown"]))
        if a.out:
            print(f"report written to {a.out}")
    if a.kind == "robustness":
        result = robustness.report(a.folder, a.out, seed_table=None if a.seed_table == "none" else a.seed_table)
        print("\n".join(result["markdown"]))
        if a.out:
            print(f"report written to {a.out}")


if __name__ == "__main__":
    sys.exit(main())
