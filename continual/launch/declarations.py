"""What an experiment file declares before any run, the rules the launcher enforces on it, and the record of it kept
in the experiment folder.

    "declared": {                                  # recorded verbatim; read by the reports
      "primary_metric": "cora_forgetting",
      "pairs": [["CLEAR", "IMPALA"], ["IMPALA+EWC lambda=", "IMPALA"]],   # method labels (entries' exp_name) or a
                                                                          # sweep's prefix (its chosen value)
      "normalisation": {"kind": "reference_runs", "references": {...}}    # or {"kind": "fixed",
                                                                          #     "ranges": {task: [low, high]}}
      "evaluation": {"greedy": false, "episodes": 8},
      "secondary_metrics": [...], "primary_pair": ["CLEAR", "IMPALA"], "primary_claim": "...", "statistics": "...",
      "post_hoc_declaration": "...",               # when the block itself was written after the results
      "published": {"source": "...", "budget": "...", "seeds": 12, "protocol": "...", "statistics": "...",
                    "results": {"Double DQN": {"mean": 22.044, "se": 0.733, "n": 12}, ...}}   # the numbers ours are
    },                                                                        # compared with: label -> name -> number                                             # primary_metric and secondary_metrics: a name or {"name", ...}
    "tuning": {"seeds": [101, 102, 103], "criterion": "highest mean P(T)",
               "rule": {"metric": "cw_average_performance", "normalise": "references", "aggregate": "mean",
                        "ties": "larger"},                        # the criterion, machine-readable: what
                                                                  # `python -m continual.report tuning` computes
               "sweeps": {"IMPALA+EWC lambda=": "ewc_lambda"},    # label prefix -> the flag it sweeps
               "experiment": "forgetting_minatar_tuning.json"},   # optional: the file that runs the sweeps (its
                                                                  # seeds and sweeps are these)
    "reporting_seeds": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    "post_hoc": ["TRAC reference", {"label": "NaP torso", "reason": "NaP failed", "added": "2026-12-01"}]

and, on the flag object of a sweep's chosen value (top-level flags, a runs item or a grid 'flags' item):

    "chosen_from_tuning": "forgetting_minatar_tuning.json"     # the experiment file that tuned it

Rules (each a one-line error before anything runs):
- tuning seeds and reporting seeds are disjoint; with reporting_seeds given, every entry runs on one or the other;
- an entry whose label starts with a sweep's prefix is an arm of that sweep and sets the swept flag; on a seed that is
  not a tuning seed (a reporting seed) only the arm marked `chosen_from_tuning` may run, one per sweep, and the file it
  names declares tuning seeds disjoint from this file's reporting seeds and ran that arm on them (the file itself may
  be named: tuning and reporting entries in one file; with tuning.experiment, that file);
- labels in pairs and post_hoc are the file's method labels (pairs may also name a sweep's prefix), and a file that
  declares anything runs each label once per seed (the reports group runs by label).

The record, `declarations.json` in the experiment folder (and in its archive), is written when the launcher first
starts the folder: the experiment file's sha256, the git revision it was committed at (and whether it was), the
declarations above, the method labels then, and the post-hoc labels. A later launch is refused when the declarations
differ from the record (entries may be appended; declarations may not change), when a post-hoc label was removed,
or when it adds a method label that is neither listed in post_hoc nor a declared sweep's chosen value. Each launch
with a changed file appends its sha256 and revision to the record's `revisions`, so every edit of the file is
visible. The record's `code` lists the revisions the runs are pinned to (continual/launch/code.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import hashlib
import json
import math
import os
import subprocess
from typing import Any, Iterable, Optional, Sequence

from continual.config.args import Args, field_names
from continual.config.loading import load_json_file
from continual.errors import UserError
from continual.evaluation.metrics import method_label

KEYS = ("declared", "tuning", "reporting_seeds", "post_hoc")  # the experiment file's top-level declaration keys
DECLARED_KEYS = ("primary_metric", "pairs", "normalisation", "evaluation", "secondary_metrics", "primary_pair",
                 "primary_claim", "statistics", "post_hoc_declaration", "published")
PUBLISHED_KEYS = ("source", "budget", "seeds", "protocol", "statistics", "results", "note")
TUNING_KEYS = ("seeds", "criterion", "rule", "sweeps", "experiment")
# tuning.rule: each key and the values it takes. metric: a per-run metric of continual.evaluation.cw (P(T) is
# higher-better, CW's forgetting lower-better); normalise: returns divided per task by the mean final return of the
# tuning folder's single-task reference runs, or raw; aggregate: over the tuning seeds; ties: which swept value wins.
RULE = {"metric": ("cw_average_performance", "cw_forgetting"), "normalise": ("references", "none"),
        "aggregate": ("mean", "median"), "ties": ("larger", "smaller")}
NORMALISATION_KINDS = ("reference_runs", "fixed")
CHOSEN = "chosen_from_tuning"  # the key of a flag object that marks a sweep's chosen value
RECORD = "declarations.json"
POST_HOC_MARK = "\u2020"  # the dagger the reports put after a post-hoc label
FIXED = ("declared", "tuning", "reporting_seeds")  # may not change once a folder has started


@dataclasses.dataclass
class Declarations:
    declared: dict = dataclasses.field(default_factory=dict)
    tuning: Optional[dict] = None
    reporting_seeds: Optional[list] = None
    post_hoc: dict = dataclasses.field(default_factory=dict)  # label -> {"label", "reason", "added"}
    chosen: dict = dataclasses.field(default_factory=dict)  # label -> the tuning experiment file, as given

    @property
    def tuning_seeds(self) -> list:
        return list(self.tuning["seeds"]) if self.tuning else []

    @property
    def sweeps(self) -> dict:
        return dict(self.tuning.get("sweeps", {})) if self.tuning else {}

    def sweep_of(self, label: str) -> Optional[str]:
        """The prefix of the sweep that `label` is an arm of (the longest that matches), else None."""
        matches = [p for p in self.sweeps if label.startswith(p)]
        return max(matches, key=len) if matches else None

    def fixed(self) -> dict:
        """What may not change once the experiment has started, as the file gives it."""
        return {"declared": self.declared, "tuning": self.tuning, "reporting_seeds": self.reporting_seeds}


def _did_you_mean(key: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(options), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _keys(obj: dict, allowed: Sequence[str], where: str) -> None:
    for key in obj:
        if isinstance(key, str) and key.startswith("_"):
            continue  # "_comment"
        if key not in allowed:
            raise UserError(f"{where}: unknown key {key!r}" + _did_you_mean(key, allowed) +
                            f" (keys: {', '.join(allowed)})")


def _seeds(value: Any, where: str) -> list:
    if not isinstance(value, list) or not value or \
            not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise UserError(f"{where} must be a non-empty list of integer seeds, got {value!r}")
    if len(set(value)) != len(value):
        raise UserError(f"{where} lists a seed twice: {value!r}")
    return value


def _label(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(f"{where} must be a method label (a non-empty string), got {value!r}")
    return value


def _published(pub: Any, where: str) -> None:
    """The published numbers ours are set beside: where from, under which budget, seeds and protocol, and per method
    label an object of named numbers (mean, se, n, or a score per modification)."""
    if not isinstance(pub, dict):
        raise UserError(f"{where} must be an object ({', '.join(PUBLISHED_KEYS)}), got {pub!r}")
    _keys(pub, PUBLISHED_KEYS, where)
    for key in ("source", "results"):
        if key not in pub:
            what = "where the numbers come from" if key == "source" else "method label -> {name: number}"
            raise UserError(f"{where} needs {key} ({what})")
    if not isinstance(pub["source"], str) or not pub["source"]:
        raise UserError(f"{where}.source must say where the numbers come from, got {pub['source']!r}")
    results = pub["results"]
    if not isinstance(results, dict) or not results:
        raise UserError(f"{where}.results must be a non-empty object of method label -> {{name: number}}")
    for label, cells in results.items():
        if not isinstance(cells, dict) or not cells or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in cells.values()):
            raise UserError(f"{where}.results[{label!r}] must be a non-empty object of name -> finite number, "
                            f"got {cells!r}")


def _rule(rule: Any, where: str) -> None:
    """tuning.rule: the criterion as the tuning report computes it, every key of RULE given one of its values."""
    if not isinstance(rule, dict):
        raise UserError(f"{where} must be an object ({', '.join(f'{k}: {v[0]!r}' for k, v in RULE.items())}), "
                        f"got {rule!r}")
    _keys(rule, tuple(RULE), where)
    for key, values in RULE.items():
        if key not in rule:
            raise UserError(f"{where} needs {key} (one of {', '.join(values)})")
        if rule[key] not in values:
            raise UserError(f"{where}.{key}: unknown value {rule[key]!r}" +
                            (_did_you_mean(rule[key], values) if isinstance(rule[key], str) else "") +
                            f" (one of {', '.join(values)})")


def parse(data: dict, where: str) -> Declarations:
    """The declaration keys of an experiment file's top level, checked for shape (labels and seeds are checked
    against the entries by `check_entries`)."""
    d = Declarations()
    declared = data.get("declared", {})
    if not isinstance(declared, dict):
        raise UserError(f"{where}: declared must be an object ({', '.join(DECLARED_KEYS)})")
    _keys(declared, DECLARED_KEYS, f"{where}: declared")
    for key in ("primary_metric", *(["secondary_metrics"] if "secondary_metrics" in declared else [])):
        metrics = declared.get(key)
        if key == "secondary_metrics" and not isinstance(metrics, list):
            raise UserError(f"{where}: declared.secondary_metrics must be a list of metrics, got {metrics!r}")
        for m in (metrics if key == "secondary_metrics" else [metrics] if key in declared else []):
            name = m.get("name") if isinstance(m, dict) else m
            if not isinstance(name, str) or not name:
                raise UserError(f"{where}: declared.{key}: a metric is a name or an object with a name (and its "
                                f"parameters), got {m!r}")
    pairs = declared.get("pairs", [])
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise UserError(f"{where}: declared.pairs must be a list of [A, B] method label pairs, got {pairs!r}")
    named = [(f"pairs[{i}]", p) for i, p in enumerate(pairs)]
    if "primary_pair" in declared:
        named.append(("primary_pair", declared["primary_pair"]))
        if not isinstance(declared["primary_pair"], list) or len(declared["primary_pair"]) != 2:
            raise UserError(f"{where}: declared.primary_pair must be a pair [A, B], got {declared['primary_pair']!r}")
    for name, (a, b) in named:
        _label(a, f"{where}: declared.{name}[0]")
        _label(b, f"{where}: declared.{name}[1]")
        if a == b:
            raise UserError(f"{where}: declared.{name} compares {a!r} with itself")
    for key in ("primary_claim", "post_hoc_declaration"):  # the latter: declarations written after the results
        if key in declared and not isinstance(declared[key], str):
            raise UserError(f"{where}: declared.{key} must be a sentence, got {declared[key]!r}")
    if "normalisation" in declared:
        norm = declared["normalisation"]
        if not isinstance(norm, dict) or not isinstance(norm.get("kind"), str):
            raise UserError(f"{where}: declared.normalisation must be an object with a kind "
                            f"({' or '.join(NORMALISATION_KINDS)}), got {norm!r}")
        if norm["kind"] not in NORMALISATION_KINDS:
            raise UserError(f"{where}: declared.normalisation: unknown kind {norm['kind']!r}" +
                            _did_you_mean(norm["kind"], NORMALISATION_KINDS) +
                            f" (kinds: {', '.join(NORMALISATION_KINDS)})")
        if norm["kind"] == "reference_runs" and not isinstance(norm.get("references", norm.get("rule")), (dict, str)):
            raise UserError(f"{where}: declared.normalisation of kind 'reference_runs' needs references (an object: "
                            f"which runs normalise which task) or a rule (a sentence)")
        if norm["kind"] == "fixed":
            ranges = norm.get("ranges")
            if not isinstance(ranges, dict) or not ranges:
                raise UserError(f"{where}: declared.normalisation of kind 'fixed' needs ranges "
                                f"{{task: [low, high]}}, got {ranges!r}")
            for task, r in ranges.items():
                if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, (int, float))
                                                                    and not isinstance(x, bool) for x in r)
                        and r[0] < r[1]):
                    raise UserError(f"{where}: declared.normalisation.ranges[{task!r}] must be [low, high] with "
                                    f"low < high, got {r!r}")
    if "published" in declared:
        _published(declared["published"], f"{where}: declared.published")
    if "evaluation" in declared and not isinstance(declared["evaluation"], dict):
        raise UserError(f"{where}: declared.evaluation must be an object (how the runs are evaluated), "
                        f"got {declared['evaluation']!r}")
    d.declared = declared

    if "tuning" in data:
        tuning = data["tuning"]
        if not isinstance(tuning, dict):
            raise UserError(f"{where}: tuning must be an object ({', '.join(TUNING_KEYS)})")
        _keys(tuning, TUNING_KEYS, f"{where}: tuning")
        if "seeds" not in tuning:
            raise UserError(f"{where}: tuning needs seeds (the seeds hyperparameters are chosen on)")
        _seeds(tuning["seeds"], f"{where}: tuning.seeds")
        if "criterion" in tuning and (not isinstance(tuning["criterion"], str) or not tuning["criterion"]):
            raise UserError(f"{where}: tuning.criterion must say how a value is chosen, got {tuning['criterion']!r}")
        if "rule" in tuning:
            _rule(tuning["rule"], f"{where}: tuning.rule")
        if "experiment" in tuning and (not isinstance(tuning["experiment"], str) or not tuning["experiment"]):
            raise UserError(f"{where}: tuning.experiment must name the experiment file that runs the sweeps, got "
                            f"{tuning['experiment']!r}")
        sweeps = tuning.get("sweeps", {})
        if not isinstance(sweeps, dict):
            raise UserError(f"{where}: tuning.sweeps must be an object of method label prefix -> swept flag")
        names = field_names()
        for prefix, param in sweeps.items():
            if not prefix:
                raise UserError(f"{where}: tuning.sweeps: a prefix must not be empty")
            if not isinstance(param, str) or param not in names:
                raise UserError(f"{where}: tuning.sweeps[{prefix!r}]: {param!r} is no flag" +
                                (_did_you_mean(param, sorted(names)) if isinstance(param, str) else ""))
        d.tuning = tuning

    if "reporting_seeds" in data:
        d.reporting_seeds = _seeds(data["reporting_seeds"], f"{where}: reporting_seeds")
    overlap = sorted(set(d.tuning_seeds) & set(d.reporting_seeds or []))
    if overlap:
        raise UserError(f"{where}: seeds {overlap} are both tuning and reporting seeds: hyperparameters chosen on "
                        f"the reported seeds bias the report; the two lists must be disjoint")

    post_hoc = data.get("post_hoc", [])
    if not isinstance(post_hoc, list):
        raise UserError(f"{where}: post_hoc must be a list of method labels or {{label, reason, added}} objects")
    for i, item in enumerate(post_hoc):
        if isinstance(item, str):
            item = {"label": item}
        if not isinstance(item, dict):
            raise UserError(f"{where}: post_hoc[{i}] must be a label or an object {{label, reason, added}}")
        _keys(item, ("label", "reason", "added"), f"{where}: post_hoc[{i}]")
        label = _label(item.get("label"), f"{where}: post_hoc[{i}].label")
        for k in ("reason", "added"):
            if k in item and not isinstance(item[k], str):
                raise UserError(f"{where}: post_hoc[{i}].{k} must be a string, got {item[k]!r}")
        if label in d.post_hoc:
            raise UserError(f"{where}: post_hoc lists {label!r} twice")
        d.post_hoc[label] = {"label": label, **{k: item[k] for k in ("reason", "added") if k in item}}
    return d


def entry_label(config: dict) -> str:
    """The method label of a run: what the reports group it by (its exp_name, else architecture, +S&P, ...)."""
    return method_label(config)


def entry_seed(config: dict) -> int:
    return config.get("seed", Args.seed)


def split_problems(decl: Declarations, runs: Iterable[tuple[str, int]]) -> list[str]:
    """The runs (method label, seed) that break the tuning/reporting split: a seed outside both lists (when reporting
    seeds are declared), or a sweep's arm that is not its chosen value on a seed that is not a tuning seed. The
    launcher refuses such an entry; a report can check its runs with the same function."""
    problems = []
    tuning = set(decl.tuning_seeds)
    reporting = set(decl.reporting_seeds) if decl.reporting_seeds is not None else None
    for label, seed in runs:
        if reporting is not None and seed not in reporting and seed not in tuning:
            problems.append(f"{label!r} runs on seed {seed}, neither a reporting seed {sorted(reporting)} nor a "
                            f"tuning seed {sorted(tuning)}")
            continue
        prefix = decl.sweep_of(label) if decl.tuning else None
        if prefix is not None and seed not in tuning and label not in decl.chosen:
            problems.append(f"{label!r} is an arm of the sweep {prefix!r} on reporting seed {seed}: sweeps run on "
                            f"the tuning seeds {sorted(tuning)}; only the chosen value (marked {CHOSEN!r}) runs on "
                            f"reporting seeds")
    return problems


def check_entries(decl: Declarations, entries: Sequence, where: str, path: str,
                  load: Optional[Any] = None) -> None:
    """The declarations against the file's entries (`Entry`s with `.config` and `.chosen_from_tuning`): chosen
    values, the seed split, the labels of pairs and post_hoc. `load(path)`: an experiment file loaded without this
    check of its own chosen values (the tuning file a chosen value names); None: do not open it."""
    labels = {entry_label(e.config) for e in entries}
    if decl.declared or decl.tuning or decl.reporting_seeds or decl.post_hoc:  # the reports group runs by label
        seen: dict[tuple, Any] = {}
        for e in entries:
            key = (entry_label(e.config), entry_seed(e.config))
            if key in seen:
                raise UserError(f"{where}: entries {seen[key].index} ({seen[key].label}) and {e.index} ({e.label}) "
                                f"both run {key[0]!r} on seed {key[1]}: a report could not tell them apart (give "
                                f"each method its own exp_name)")
            seen[key] = e
    chosen: dict[str, str] = {}
    for e in entries:
        label = entry_label(e.config)
        if e.chosen_from_tuning is None:
            continue
        if not isinstance(e.chosen_from_tuning, str) or not e.chosen_from_tuning:
            raise UserError(f"{where}: entry {e.index} ({e.label}): {CHOSEN} must name the tuning experiment file, "
                            f"got {e.chosen_from_tuning!r}")
        if decl.tuning is None:
            raise UserError(f"{where}: entry {e.index} ({e.label}): {CHOSEN} needs a tuning block (its seeds and "
                            f"sweeps)")
        if decl.sweep_of(label) is None:
            raise UserError(f"{where}: entry {e.index} ({e.label}): {CHOSEN} on {label!r}, which is no arm of a "
                            f"sweep in tuning.sweeps ({', '.join(map(repr, decl.sweeps)) or 'none'})")
        if chosen.setdefault(label, e.chosen_from_tuning) != e.chosen_from_tuning:
            raise UserError(f"{where}: {label!r} names two tuning files: {chosen[label]!r} and "
                            f"{e.chosen_from_tuning!r}")
    by_sweep: dict[str, list[str]] = {}
    for label in chosen:
        by_sweep.setdefault(decl.sweep_of(label), []).append(label)
    for prefix, ls in by_sweep.items():
        if len(ls) > 1:
            raise UserError(f"{where}: the sweep {prefix!r} has {len(ls)} chosen values ({', '.join(map(repr, ls))});"
                            f" a sweep has one")
    decl.chosen = chosen

    here = os.path.dirname(os.path.abspath(path))
    resolve = lambda f: os.path.abspath(f if os.path.isabs(f) else os.path.join(here, f))  # noqa: E731
    loaded: dict[str, Any] = {}

    def tuning_experiment(file: str, what: str) -> Optional[tuple[Sequence, set]]:
        """The entries and tuning seeds of the experiment file `file` (this one, or another opened with `load`)."""
        full = resolve(file)
        if full == os.path.abspath(path):
            return entries, set(decl.tuning_seeds)
        if load is None:
            return None
        if not os.path.isfile(full):
            raise UserError(f"{where}: {what} {file!r}, which does not exist")
        if full not in loaded:
            loaded[full] = load(full)
        if loaded[full].declarations.tuning is None:
            raise UserError(f"{where}: {what} {file!r}, which declares no tuning block")
        return loaded[full].entries, set(loaded[full].declarations.tuning_seeds)

    tuning_file = decl.tuning.get("experiment") if decl.tuning else None
    tuned_there: list[str] = []  # the labels the tuning experiment runs
    if tuning_file is not None:
        got = tuning_experiment(tuning_file, "tuning.experiment is")
        other = loaded.get(resolve(tuning_file))
        if other is not None:
            if set(other.declarations.tuning_seeds) != set(decl.tuning_seeds) or \
                    other.declarations.sweeps != decl.sweeps:
                raise UserError(f"{where}: tuning: its seeds and sweeps must be those of tuning.experiment "
                                f"{tuning_file!r} ({sorted(other.declarations.tuning_seeds)}, "
                                f"{other.declarations.sweeps})")
        tuned_there = [entry_label(t.config) for t in got[0]] if got is not None else []

    for prefix, param in decl.sweeps.items():
        arms = [e for e in entries if decl.sweep_of(entry_label(e.config)) == prefix]
        if not arms and not any(decl.sweep_of(label) == prefix for label in tuned_there) and \
                not (tuning_file is not None and load is None):
            raise UserError(f"{where}: tuning.sweeps[{prefix!r}]: no entry's label starts with it (labels: "
                            f"{', '.join(sorted(map(repr, labels | set(tuned_there))))})")
        for e in arms:
            if param not in e.config:
                raise UserError(f"{where}: entry {e.index} ({e.label}) is an arm of the sweep {prefix!r} but does not "
                                f"set {param!r}")
    for e in entries:
        problems = split_problems(decl, [(entry_label(e.config), entry_seed(e.config))])
        if problems:
            raise UserError(f"{where}: entry {e.index} ({e.label}): {problems[0]}")

    reporting = set(decl.reporting_seeds) if decl.reporting_seeds is not None else \
        {entry_seed(e.config) for e in entries} - set(decl.tuning_seeds)
    for label, file in chosen.items():
        if tuning_file is not None and resolve(file) != resolve(tuning_file):
            raise UserError(f"{where}: {label!r} is chosen from {file!r}, not from tuning.experiment {tuning_file!r}")
        got = tuning_experiment(file, f"{label!r} is chosen from")
        if got is None:
            continue
        tuned, tuning_seeds = got
        if tuning_seeds & reporting:
            raise UserError(f"{where}: {label!r} is chosen from {file!r}, whose tuning seeds "
                            f"{sorted(tuning_seeds & reporting)} are reporting seeds here")
        if not any(entry_label(t.config) == label and entry_seed(t.config) in tuning_seeds for t in tuned):
            raise UserError(f"{where}: {label!r} is chosen from {file!r}, which does not run it on its tuning seeds "
                            f"{sorted(tuning_seeds)}")

    known = sorted(labels)
    named = [(f"pairs[{i}]", p) for i, p in enumerate(decl.declared.get("pairs", []))]
    named += [("primary_pair", decl.declared["primary_pair"])] if "primary_pair" in decl.declared else []
    for name, pair in named:
        for label in pair:
            if label not in labels and label not in decl.sweeps:
                raise UserError(f"{where}: declared.{name}: {label!r} is no method label of the file (an "
                                f"entry's exp_name) or sweep prefix" + _did_you_mean(label, known + list(decl.sweeps)))
    for label in decl.declared.get("published", {}).get("results", {}):
        if label not in labels:
            raise UserError(f"{where}: declared.published.results: {label!r} is no method label of the file (an "
                            f"entry's exp_name)" + _did_you_mean(label, known))
    for label in decl.post_hoc:
        if label not in labels:
            raise UserError(f"{where}: post_hoc: {label!r} is no method label of the file (an entry's exp_name)" +
                            _did_you_mean(label, known))


# --- the record in the experiment folder -------------------------------------------------------------------------


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _git(folder: str, *args: str) -> Optional[str]:
    try:
        p = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_info(path: str) -> dict:
    """The file's place in its git repository: the path from the repository's top, HEAD's revision, and whether the
    file is committed unchanged at HEAD (False: edited or untracked; None: not in a git repository)."""
    folder = os.path.dirname(os.path.abspath(path))
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top is None:
        return {"file": os.path.basename(path), "git_revision": None, "committed": None}
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(top))
    tracked = bool(_git(top, "ls-files", "--", rel))
    clean = _git(top, "status", "--porcelain", "--", rel) == ""
    return {"file": rel, "git_revision": _git(top, "rev-parse", "HEAD"), "committed": tracked and clean}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def revision(path: str, n_entries: int) -> dict:
    return {"sha256": sha256_file(path), **git_info(path), "entries": n_entries, "recorded": now()}


def read_record(folder: str) -> Optional[dict]:
    path = os.path.join(folder, RECORD)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path!r} cannot be read ({e}): restore it (git checkout) or use another --folder") from None
    if not isinstance(record, dict) or not isinstance(record.get("declarations"), dict):
        raise UserError(f"{path!r} is no declarations record: restore it (git checkout) or use another --folder")
    return record


def check_record(record: dict, experiment: Any, folder: str) -> None:
    """Refuse `experiment` (an `Experiment`) on the folder whose record this is: its declarations changed, a post-hoc
    label was removed, or a new method label is neither marked post hoc nor a declared sweep's chosen value."""
    decl: Declarations = experiment.declarations
    first = (record.get("revisions") or [{}])[0]
    where = (f"experiment {experiment.path!r}: {folder!r} was started with other declarations ({RECORD}: sha256 "
             f"{str(first.get('sha256'))[:12]}, revision {str(first.get('git_revision'))[:12]})")
    old, new = record["declarations"], decl.fixed()
    for key in FIXED:
        if old.get(key) != new[key]:
            raise UserError(f"{where}: {key} changed; declarations may not change once an experiment has started "
                            f"(entries may be appended): use another --folder")
    for label, file in (record.get("chosen") or {}).items():
        if decl.chosen.get(label) != file:
            raise UserError(f"{where}: the chosen value {label!r} ({CHOSEN} {file!r}) changed; use another --folder")
    removed = [p for p in record.get("post_hoc") or {} if p not in decl.post_hoc]
    if removed:
        raise UserError(f"{where}: post_hoc no longer lists {removed[0]!r}; a post-hoc label stays")
    methods = set(record.get("methods") or [])
    for e in experiment.entries:
        label = entry_label(e.config)  # a sweep's chosen value, appended once tuning is done, is the declared plan
        if label not in methods and label not in decl.post_hoc and label not in decl.chosen:
            raise UserError(f"experiment {experiment.path!r}: entry {e.index} ({e.label}) adds the method {label!r} "
                            f"after {folder!r} was started: list it in post_hoc (a label, or {{label, reason, added}})")


def updated_record(record: Optional[dict], experiment: Any, started_before: int = 0) -> dict:
    """The record to write: a new one (first start; `started_before`: entries the folder had run before it was
    recorded), or `record` with the file's revision appended when the file changed and the post-hoc labels now
    given."""
    decl: Declarations = experiment.declarations
    rev = revision(experiment.path, len(experiment.entries))
    if record is None:
        record = {"declarations": decl.fixed(), "chosen": dict(decl.chosen),
                  "chosen_sha256": {label: _sha_or_none(experiment.path, file) for label, file in decl.chosen.items()},
                  "methods": sorted({entry_label(e.config) for e in experiment.entries}), "post_hoc": {},
                  "entries_before_record": started_before, "revisions": [rev]}
    else:
        record = json.loads(json.dumps(record))
        if record.get("revisions", [{}])[-1].get("sha256") != rev["sha256"]:
            record.setdefault("revisions", []).append(rev)
        for label, file in decl.chosen.items():
            if label not in record.setdefault("chosen", {}):
                record["chosen"][label] = file
                record.setdefault("chosen_sha256", {})[label] = _sha_or_none(experiment.path, file)
    record["post_hoc"] = {label: {**info, "recorded": (record.get("post_hoc") or {}).get(label, {}).get("recorded")
                                  or now()} for label, info in decl.post_hoc.items()}
    return record


def _sha_or_none(experiment_path: str, file: str) -> Optional[str]:
    full = file if os.path.isabs(file) else os.path.join(os.path.dirname(experiment_path), file)
    return sha256_file(full) if os.path.isfile(full) else None


# --- for the reports -----------------------------------------------------------------------------------------------


def read_declarations(path: str) -> Declarations:
    """The declarations of an experiment file, or of an experiment folder (its record, else its experiment.json)."""
    if os.path.isdir(path):
        record = read_record(path)
        if record is not None:
            fixed = record["declarations"]
            d = parse({k: v for k, v in fixed.items() if v is not None}, f"{RECORD} in {path!r}")
            d.post_hoc = dict(record.get("post_hoc") or {})
            d.chosen = dict(record.get("chosen") or {})
            return d
        path = os.path.join(path, "experiment.json")
    data = load_json_file(path, "experiment")
    return parse({k: data[k] for k in KEYS if k in data}, f"experiment {path!r}")


def post_hoc_labels(path: str) -> dict:
    """label -> {"label", "reason", "added"} of the arms an experiment (file or folder) marks post hoc."""
    return read_declarations(path).post_hoc


def is_post_hoc(path: str, label: str) -> bool:
    return label in post_hoc_labels(path)


def mark(label: str, post_hoc: dict) -> str:
    """A label as a report's table prints it: "NaP torso\u2020" when it is post hoc."""
    return label + POST_HOC_MARK if label in post_hoc else label


def footnote(post_hoc: dict) -> str:
    """The footnote under a table with post-hoc arms ("" when none)."""
    if not post_hoc:
        return ""
    parts = []
    for label, info in post_hoc.items():
        detail = "; ".join(x for x in (info.get("reason"), f"added {info['added']}" if info.get("added") else None) if x)
        parts.append(f"{label}" + (f" ({detail})" if detail else ""))
    return f"{POST_HOC_MARK} added after the first results (post hoc): " + ", ".join(parts) + "."
