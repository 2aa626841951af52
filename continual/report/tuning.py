"""Tuning report (issue 45, item 4): the value each declared sweep chose on the tuning seeds, by the rule the tuning
experiment declared before any run; the forgetting report checks its reporting arms against it.

    python -m continual.report tuning TUNING_FOLDER [--out DIR]

The folder is a launcher's (or an archive's) folder of an experiment file with a `tuning` block: its seeds, its
sweeps (method label prefix -> the swept flag), the criterion in words and as `tuning.rule` (continual.launch.
declarations.RULE), e.g. {"metric": "cw_average_performance", "normalise": "references", "aggregate": "mean",
"ties": "larger"}. The declarations are read from the folder's record (declarations.json, written at the first
launch), else its experiment.json.

Per run: the rule's metric of continual.evaluation.cw on the run's evaluation curves (`cw_average_performance`: P(T),
the mean over the trained tasks of each task's last 5 evaluations; `cw_forgetting`: CW's forgetting, the module's
default reading), each task's returns divided by the mean final return (last 5 evaluations) of the folder's
single-task reference runs on it (labels starting with "reference"; normalise "references") or raw ("none"). Per arm
of a sweep (a method label starting with the sweep's prefix): the per-seed values, their mean (or median) over the
tuning seeds with a 95% interval (Student-t for the mean). The chosen arm: the best aggregate (highest P(T), lowest
forgetting); arms whose aggregates are equal (math.isclose, rel 1e-9) are a tie, resolved by the swept value
("larger" or "smaller").

No choice is made while the plan is incomplete: an arm or a reference run that has not finished on every tuning seed
(the plan: the folder's configs/, else the finished runs) leaves the sweep's choice empty with the reason; the table
still prints what has finished. Refused (one line, exit 2): a folder without a tuning block or rule, a run on a seed
that is not a tuning seed, an arm whose runs set the swept flag to different values, and (python -m continual.report)
an archive whose files do not match its manifest.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np

from continual.errors import UserError
from continual.evaluation import cw, statistics
from continual.evaluation.metrics import RunData, load_run, provenance, provenance_lines
from continual.launch import declarations as D
from continual.launch.experiment import load_experiment
from continual.launch.queue import run_dirs
from continual.report import forgetting as F

HIGHER_IS_BETTER = {"cw_average_performance": True, "cw_forgetting": False}
METRIC_TEXT = {"cw_average_performance": "P(T), Continual World's average performance (the mean over the trained "
                                         "tasks of each one's last 5 evaluations)",
               "cw_forgetting": f"Continual World's forgetting ({cw.DEFAULT_READING} reading)"}


def metric(run: RunData, name: str, norm: Optional[Callable[[str, float], float]]) -> Optional[float]:
    if name == "cw_average_performance":
        return cw.cw_average_performance(run, normalizer=norm)["value"]
    return cw.cw_forgetting(run, normalizer=norm)["value"]


def planned(folder: str) -> list[tuple[str, int, dict]]:
    """(label, seed, config) of every entry the folder plans (its configs/), else of its finished runs."""
    root = os.path.join(folder, "configs")
    if not os.path.isdir(root):
        return [(D.entry_label(r.config), D.entry_seed(r.config), r.config) for r in F.load_runs(folder)]
    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".json"):
            with open(os.path.join(root, name), encoding="utf-8") as f:
                config = json.load(f)
            out.append((D.entry_label(config), D.entry_seed(config), config))
    return out


def value_text(value: Any) -> str:
    """A swept value as one text, whoever wrote it: the experiment file's 5 and the run's config.json 5.0 (tyro
    stores a float flag as a float) are one value."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        value = int(value)
    return json.dumps(value)


def choose(folder: str) -> dict:
    """The tuning result of an experiment folder: per sweep, its arms' per-seed values, aggregates and intervals,
    and the chosen arm (None with `why` while the plan is incomplete)."""
    decl = D.read_declarations(folder)
    if decl.tuning is None:
        raise UserError(f"{folder}: the experiment declares no tuning block (seeds, sweeps, rule): no tuning report")
    rule = decl.tuning.get("rule")
    if rule is None:
        raise UserError(f"{folder}: tuning declares no rule (tuning.rule: {{metric, normalise, aggregate, ties}}), "
                        f"only the criterion in words: the report cannot compute it")
    seeds = sorted(decl.tuning_seeds)
    plan = planned(folder)
    # none finished yet is a state of a tuning folder, not an error
    runs = [load_run(d) for d in run_dirs(folder) if F.finished(folder, os.path.basename(d))]
    for label, seed, _ in plan + [(D.entry_label(r.config), D.entry_seed(r.config), r.config) for r in runs]:
        if seed not in seeds:
            raise UserError(f"{folder}: {label!r} runs on seed {seed}, not a declared tuning seed {seeds}: a tuning "
                            f"folder holds the tuning seeds only")
    finished: dict[tuple[str, int], RunData] = {(D.entry_label(r.config), D.entry_seed(r.config)): r for r in runs}
    labels = list(dict.fromkeys([label for label, _, _ in plan] + [label for label, _ in finished]))

    references = [r for r in runs if F.is_reference(r)]
    missing_refs = [(label, s) for label in labels if label.startswith(F.REFERENCE_PREFIX) for s in seeds
                    if (label, s) not in finished]
    scores = F.reference_scores(references)
    norm = F.normalizer(scores) if rule["normalise"] == "references" else None
    # tasks the arms trained that no finished reference run scores yet: their runs cannot be normalised
    unreferenced = sorted({v.regime for r in runs if not F.is_reference(r) for v in r.visits} - set(scores)) \
        if norm else []

    sweeps = {}
    for prefix, flag in decl.sweeps.items():
        arms = []
        for label in labels:
            if decl.sweep_of(label) != prefix:
                continue
            values = {value_text(c.get(flag)) for lab, _, c in plan if lab == label}
            values |= {value_text(r.config.get(flag)) for (lab, _), r in finished.items() if lab == label}
            if len(values) != 1:
                raise UserError(f"{folder}: the arm {label!r} of the sweep {prefix!r} sets {flag} to "
                                f"{' and '.join(sorted(values))}: an arm is one value")
            per_seed = {s: metric(finished[label, s], rule["metric"], norm) for s in seeds if (label, s) in finished}
            per_seed = {s: v if v is not None and math.isfinite(v) else None for s, v in per_seed.items()}
            xs = [v for v in per_seed.values() if v is not None]
            iv = statistics.interval(np.array(xs), statistic=rule["aggregate"]) if xs else None
            arms.append({"label": label, "value": json.loads(values.pop()), "per_seed": per_seed,
                         "missing": [s for s in seeds if s not in per_seed],
                         "unscored": [s for s in seeds if s in per_seed and per_seed[s] is None],
                         "aggregate": iv.estimate if iv else None, "interval": iv.as_dict() if iv else None})
        arms.sort(key=lambda a: (0, a["value"], "") if isinstance(a["value"], (int, float)) else (1, 0, str(a["value"])))
        chosen, why = pick(arms, rule, missing_refs, unreferenced)
        sweeps[prefix] = {"flag": flag, "arms": arms, "chosen": chosen, "why": why}
    return {"folder": folder, "tuning_seeds": seeds, "rule": rule, "criterion": decl.tuning.get("criterion"),
            "sweeps_declared": decl.sweeps, "experiment_file": experiment_file(folder),
            "protocol": F.protocol(runs) if runs else None,
            "normalisation": ({"kind": "reference_runs", "reference_final_return": scores,
                               "missing": [list(m) for m in missing_refs], "unreferenced_tasks": unreferenced}
                              if norm else {"kind": "none"}),
            "sweeps": sweeps, "provenance": provenance((r.name, r.starts) for r in runs)}


def pick(arms: list[dict], rule: dict, missing_refs: list, unreferenced: Sequence[str] = ()
         ) -> tuple[Optional[dict], str]:
    """The chosen arm ({label, value, aggregate}) and why; None while an arm or a reference lacks a tuning seed, or a
    finished run has no score (a task no finished reference run scores, a run without evaluations)."""
    if not arms:
        return None, "no arm of this sweep in the folder"
    gaps = [f"{a['label']!r} lacks seed{'s' * (len(a['missing']) > 1)} {', '.join(map(str, a['missing']))}"
            for a in arms if a["missing"]]
    if rule["normalise"] == "references":
        gaps += [f"{label!r} lacks seed {s}" for label, s in missing_refs]
        if unreferenced:
            gaps.append(f"no finished reference run of {', '.join(unreferenced)} to divide by")
    gaps += [f"{a['label']!r} has no score on seed{'s' * (len(a['unscored']) > 1)} "
             f"{', '.join(map(str, a['unscored']))}" for a in arms if a.get("unscored") and not unreferenced]
    if gaps:
        return None, "incomplete: " + "; ".join(gaps)
    sign = 1.0 if HIGHER_IS_BETTER[rule["metric"]] else -1.0
    best = max(sign * a["aggregate"] for a in arms)
    tied = [a for a in arms if math.isclose(sign * a["aggregate"], best, rel_tol=1e-9, abs_tol=1e-12)]
    win = (max if rule["ties"] == "larger" else min)(tied, key=lambda a: a["value"])
    why = (f"best {rule['aggregate']}" if len(tied) == 1 else
           f"tie between {', '.join(repr(a['label']) for a in tied)} -> the {rule['ties']} value")
    return {"label": win["label"], "value": win["value"], "aggregate": win["aggregate"]}, why


def experiment_file(folder: str) -> Optional[str]:
    """The experiment file the folder was started from (its record's first revision), None without a record."""
    record = D.read_record(folder)
    revisions = (record or {}).get("revisions") or [{}]
    return revisions[0].get("file")


def _num(x: Any) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3f}"


def markdown(result: dict) -> list[str]:
    rule = result["rule"]
    norm = result["normalisation"]
    lines = [f"Tuning seeds {result['tuning_seeds']}; experiment file {result['experiment_file'] or '(no record)'}.",
             "",
             f"Rule (tuning.rule, declared before any run): {METRIC_TEXT[rule['metric']]}, "
             f"{'higher' if HIGHER_IS_BETTER[rule['metric']] else 'lower'} is better; returns "
             + ("divided per task by the mean final return (last 5 evaluations) of this folder's reference runs: " +
                (", ".join(f"{t} {v:.2f}" for t, v in norm["reference_final_return"].items()) or "none finished")
                if norm["kind"] == "reference_runs" else "raw")
             + f"; the {rule['aggregate']} over the tuning seeds; ties -> the {rule['ties']} value.",
             "", f"Criterion (in words): {result['criterion'] or '(none given)'}", ""]
    if result["protocol"]:
        lines += [f"Evaluation: {F.protocol_text(result['protocol'])} (read from the runs' configs).", ""]
    lines += [f"Cells: per tuning seed (missing: not finished; no score: finished, but not scored yet), then the "
              f"{rule['aggregate']} [95% interval] (n seeds).", "",
              "| sweep | arm | value | " + " | ".join(f"seed {s}" for s in result["tuning_seeds"]) +
              f" | {rule['aggregate']} | chosen |", "|---|---|---|" + "---|" * len(result["tuning_seeds"]) + "---|---|"]
    for prefix, sw in result["sweeps"].items():
        for a in sw["arms"]:
            iv = a["interval"]
            agg = "" if iv is None else (f"{_num(iv['estimate'])} [{_num(iv['ci'][0])}, {_num(iv['ci'][1])}] "
                                         f"(n={iv['n']})")
            lines.append(f"| {prefix} | {a['label']} | {sw['flag']}={a['value']} | " +
                         " | ".join(_num(a["per_seed"].get(s)) or ("missing" if s in a["missing"] else "no score")
                                    for s in result["tuning_seeds"]) +
                         f" | {agg} | {'**chosen**' if sw['chosen'] and sw['chosen']['label'] == a['label'] else ''} |")
    lines.append("")
    for prefix, sw in result["sweeps"].items():
        c = sw["chosen"]
        lines.append(f"- {prefix}: " + (f"chosen {sw['flag']}={c['value']} ({c['label']!r}; {sw['why']})" if c else
                                        f"no choice yet ({sw['why']})"))
    if result.get("provenance", {}).get("commits"):
        lines += ["", "Provenance (references included):", ""] + provenance_lines(result["provenance"])
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# the reporting experiment against the tuning result
# ---------------------------------------------------------------------------------------------------------------------


def marked_chosen(folder: str) -> dict[str, str]:
    """label -> tuning file of the arms a reporting folder marks `chosen_from_tuning`: its record's, and its
    experiment.json's (entries appended since the record)."""
    chosen = dict(((D.read_record(folder) or {}).get("chosen")) or {})
    path = os.path.join(folder, "experiment.json")
    if os.path.isfile(path):
        chosen.update(load_experiment(path, resolve_chosen=False, stand_ins=True).declarations.chosen)
    return chosen


def check(folder: str, tuning_folder: str) -> dict:
    """Whether the reporting folder's runs keep the tuning split: every arm marked chosen_from_tuning (and every run
    of a sweep's arm on a reporting seed) sets the swept flag to the value the tuning report chose, from a tuning
    folder with the same seeds and sweeps as declared here, and no run breaks the seed split. `failed`: one line a
    failed check (the forgetting report prints them at the top); `passed`: the checks that held."""
    decl = D.read_declarations(folder)
    tuned = choose(tuning_folder)
    failed, passed = [], []
    if decl.tuning is None:
        failed.append(f"{folder} declares no tuning block: nothing says which arms were tuned")
    else:
        if sorted(decl.tuning_seeds) != tuned["tuning_seeds"] or decl.sweeps != tuned["sweeps_declared"]:
            failed.append(f"the tuning folder declares seeds {tuned['tuning_seeds']} and sweeps "
                          f"{tuned['sweeps_declared']}, this experiment {sorted(decl.tuning_seeds)} and {decl.sweeps}")
        named = decl.tuning.get("experiment")
        if named and tuned["experiment_file"] and os.path.basename(named) != os.path.basename(
                tuned["experiment_file"]):
            failed.append(f"tuning.experiment is {named!r}, but {tuning_folder} was started from "
                          f"{tuned['experiment_file']!r}")
    runs = planned(folder)  # what the folder plans, and what ran (a run's config.json is what it ran with)
    if os.path.isdir(os.path.join(folder, "configs")) and os.path.isdir(os.path.join(folder, "runs")):
        runs += [(D.entry_label(r.config), D.entry_seed(r.config), r.config)
                 for r in (load_run(d) for d in run_dirs(folder) if F.finished(folder, os.path.basename(d)))]
    if decl.tuning is not None:
        decl.chosen = marked_chosen(folder)
        failed += [f"seed split: {p}" for p in D.split_problems(decl, list(dict.fromkeys((lab, s) for lab, s, _ in runs)))]
    arms = dict.fromkeys(decl.chosen)
    arms.update(dict.fromkeys(lab for lab, s, _ in runs if decl.tuning is not None and decl.sweep_of(lab)
                              and s not in decl.tuning_seeds))
    for label in arms:
        prefix = decl.sweep_of(label) if decl.tuning else None
        sweep = tuned["sweeps"].get(prefix)
        if sweep is None:
            failed.append(f"{label!r}: the tuning folder has no sweep {prefix!r}")
            continue
        values = sorted({value_text(c.get(sweep["flag"])) for lab, _, c in runs if lab == label})
        ran = ", ".join(f"{sweep['flag']}={v}" for v in values) or "no run yet"
        c = sweep["chosen"]
        if not values:
            passed.append(f"{label!r} has no run yet")
        elif c is None:
            failed.append(f"{label!r} runs {ran}, but the tuning report has chosen no value ({sweep['why']})")
        elif not (len(values) == 1 and json.loads(values[0]) == c["value"]):
            failed.append(f"{label!r} runs {ran}, but the tuning report chose {sweep['flag']}={c['value']} "
                          f"({c['label']!r})")
        else:
            passed.append(f"{label!r} runs {ran}, the value the tuning report chose ({sweep['why']})")
    return {"tuning_folder": tuning_folder, "failed": failed, "passed": passed,
            "chosen": {p: sw["chosen"] for p, sw in tuned["sweeps"].items()}, "rule": tuned["rule"]}


def report(folder: str, out: Optional[str] = None) -> dict:
    result = choose(folder)
    lines = markdown(result)
    result["markdown"] = lines
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
            f.write(f"# Tuning ({os.path.basename(os.path.normpath(folder))})\n\n" + "\n".join(lines) + "\n")
        with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
            json.dump({k: v for k, v in result.items() if k != "markdown"}, f, indent=1)
    return result
