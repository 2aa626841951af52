"""python -m continual.report KIND FOLDER [--out DIR] [options]

Kinds: forgetting (a task sequence: CORA's and Continual World's metrics, run-level statistics, the experiment's
declarations), robustness (agents trained on curricula, evaluated at the end under a table of modifications; the
seed project's table beside ours), plasticity (early against late regimes of a long sequence, against plain PPO and a
fresh network; `plasticity --from-report report.json` rebuilds it from a stored report's per-run records), minatar
(single-task MinAtar runs: the final training return per game and protocol beside the published numbers; `minatar
--from-report report.json` likewise), c_chain
(C-CHAIN's Continual MinAtar table: the paper's score per run, mean +- standard error and t intervals, the paper's
numbers beside), budget (a pilot: the step count its declared rule sets for a placeholder such as BUDGET), tuning (a tuning experiment: each declared sweep's values on the tuning seeds by its declared
rule, and the chosen value; `forgetting --tuning TUNING_FOLDER` checks the reporting arms against it).

An archived folder (one with a manifest.json, continual/launch/archive.py) is read only when every file matches its
manifest: a changed, missing or extra file is refused in one line (exit 2) before anything is computed; so is a folder
whose metrics were compacted to records the report does not read from (`python -m continual.launch.archive
--compact`, e.g. bench/experiments/forgetting_minatar keeps what the forgetting report reads).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from continual.errors import UserError, exit_on_user_error
from continual.launch.archive import check_manifest, check_records
from continual.report import budget, c_chain, forgetting, minatar, plasticity, robustness, tuning

KINDS = ("forgetting", "robustness", "plasticity", "minatar", "c_chain", "tuning", "budget")


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m continual.report", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("folder", nargs="?", help="the experiment folder (its runs/ holds one run directory per entry)")
    p.add_argument("--out", help="write report.md, report.json and the figures here")
    p.add_argument("--seed-table", default="freeway", help="robustness: the seed project's numbers to print beside "
                   "ours ('none' for none)")
    p.add_argument("--baseline", nargs="+", help="robustness: eval.py's JSON(s) of a --constant_action evaluation "
                   "under the same modifications, printed as a row of its own (what a policy that ignores the screen "
                   "scores); the learned check reads it under each run's training strings. c_chain: eval.py's JSON "
                   "of a --random_actions evaluation of the three games, for its learned check")
    p.add_argument("--variant", help="robustness: a folder of eval.py JSONs, one per run (<run>.json), of a declared "
                   "evaluation variant (e.g. greedy games), shown as a second table without a claim")
    p.add_argument("--post-hoc", help="robustness: as --variant, for an evaluation added after the experiment "
                   "started, labelled so; its folder's README.md says why (first line)")
    p.add_argument("--experiment", help="forgetting: the experiment file whose declarations apply; plasticity: the "
                   "experiment file whose post-hoc arms and chosen defaults are marked (default: the folder's "
                   "experiment.json, or the one the stored report names)")
    p.add_argument("--from-report", help="plasticity, minatar: rebuild the report from this report.json's per-run records "
                   "instead of a folder")
    p.add_argument("--early", type=int, help="plasticity: regimes counted as early (the first N; default 3, or the "
                   "stored report's)")
    p.add_argument("--late", type=int, help="plasticity: regimes counted as late (the last N; default 5, or the "
                   "stored report's)")
    p.add_argument("--threshold", type=float, help="budget: the return every run must reach (default 20, the "
                   "Freeway pilot's)")
    p.add_argument("--declared-threshold", type=float, help="budget: the bar the pilot declared before it ran, when "
                   "--threshold amends it afterwards; the report labels the rule amended and gives both budgets")
    p.add_argument("--window", type=int, help="budget: the steps the training return is averaged over (default 20480)")
    p.add_argument("--multiple", type=int, help="budget: the budget is a multiple of this many steps (default 20480)")
    p.add_argument("--tuning", help="forgetting: the tuning experiment's folder; the report checks that every arm "
                   "marked chosen_from_tuning runs the value its tuning report chose")
    a = p.parse_args(argv)
    if a.folder is None and a.from_report is None and a.kind != "plasticity":  # plasticity's message names both
        raise UserError(f"{a.kind}: give the experiment FOLDER")
    for flag, value, kinds in (("--from-report", a.from_report, ("plasticity", "minatar")),
                               ("--early", a.early, ("plasticity",)), ("--late", a.late, ("plasticity",)),
                               ("--tuning", a.tuning, ("forgetting",)),
                               ("--baseline", a.baseline, ("robustness", "c_chain")),
                               ("--variant", a.variant, ("robustness",)), ("--post-hoc", a.post_hoc, ("robustness",)),
                               ("--threshold", a.threshold, ("budget",)),
                               ("--declared-threshold", a.declared_threshold, ("budget",)),
                               ("--window", a.window, ("budget",)), ("--multiple", a.multiple, ("budget",))):
        if value is not None and a.kind not in kinds:
            raise UserError(f"{flag} is for the {' and '.join(kinds)} report{'s' if len(kinds) > 1 else ''}, "
                            f"not {a.kind}")
    if a.folder is not None:
        check_manifest(a.folder, require=False)  # a launcher's folder has none; an archive's must match
        check_records(a.folder, a.kind)
    if a.tuning is not None:
        check_manifest(a.tuning, require=False)
        check_records(a.tuning, "tuning")
    if a.kind == "forgetting":
        check = tuning.check(a.folder, a.tuning) if a.tuning is not None else None
        result = forgetting.report(a.folder, a.out, experiment=a.experiment, tuning_check=check)
        for failure in (check or {}).get("failed", []):
            print(f"FAILED CHECK (tuning): {failure}", file=sys.stderr)
    elif a.kind == "tuning":
        result = tuning.report(a.folder, a.out)
    elif a.kind == "budget":
        rule = {k: v for k, v in (("threshold", a.threshold), ("window", a.window), ("multiple", a.multiple),
                                  ("declared_threshold", a.declared_threshold)) if v is not None}
        result = budget.report(a.folder, a.out, **rule)
    elif a.kind == "minatar":
        result = minatar.report(a.folder, a.out, from_report=a.from_report)
    elif a.kind == "c_chain":
        if a.baseline is not None and len(a.baseline) != 1:
            raise UserError(f"--baseline: the c_chain report reads one eval.py JSON, got {len(a.baseline)}")
        result = c_chain.report(a.folder, a.out, baseline=a.baseline[0] if a.baseline else None)
    elif a.kind == "robustness":
        result = robustness.report(a.folder, a.out, seed_table=None if a.seed_table == "none" else a.seed_table,
                                   baseline=a.baseline, variant=a.variant, post_hoc=a.post_hoc)
    else:
        result = plasticity.report(a.folder, a.out, early=a.early, late=a.late, experiment=a.experiment,
                                   from_report=a.from_report)
    print("\n".join(result["markdown"]))
    if a.out:
        print(f"report written to {a.out}")


if __name__ == "__main__":
    sys.exit(main())
