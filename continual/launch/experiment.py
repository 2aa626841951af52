"""The experiment file: its schema, its validation and the expansion of its grid into entries (runs).

    {
      "name": "cartpole_ppo_vs_cbp",                 # optional: the file name without .json
      "config": "run_config.json",                    # optional: the run_config.json every run starts from
      "flags": {"env_id": "CartPole-v1", "backend": "Gymnasium", "total_timesteps": 20000, "eval_every": 4096},
      "grid": {"seed": [1, 2, 3], "architecture": ["PPO", "PPO_CBP"]},
      "runs": [{"name": "sp", "shrink_and_perturb": true}],   # optional; each one is crossed with the grid
      "cpus_per_run": 1, "gpus_per_run": 0, "max_retries": 2,
      "seeds_per_process": 6,                         # optional: DQN only, see below
      "declared": {...}, "tuning": {...}, "reporting_seeds": [...], "post_hoc": [...],  # optional: declarations.py
      "placeholders": {"BUDGET": {"value": null, "set_by": "pilot.json", "rule": "...", "dry_run": 1048576}}
    }

A run's configuration, later keys winning: the `config` file, `flags`, its `runs` item, its grid values. Keys are
the training CLI's flags (`Args` fields) and the curriculum keys of run_config.json. Grid keys may also be `config`
(a list of run_config.json files) and `flags` (a list of flag objects, one variant each). Paths in the file are
relative to the file. A placeholder stands for a number that another experiment decides (a budget a pilot sets):
a flag value (at any depth, e.g. a curriculum's thresholds) written "$BUDGET", "3*$BUDGET" or "$BUDGET/20" is that
integer multiple or exact fraction of its value. "amended" (a string) says when and why the rule was changed after
the pilot it reads had run ("rule" is then the amended one). Until its "value" is set, a launch refuses the file in
one line (exit 2) naming "set_by"; --dry_run uses its "dry_run" stand-in instead. Entries are numbered in
expansion order (the grid's last key varies fastest); `--resume-id N` names entry N. The launcher sets runs_dir, run_name and resume itself; progress_bar is off unless a run sets it.
"seeds_per_process": K (DQN only: a file with another architecture is refused) runs up to K pending entries that
differ only by their seed in one process, `agents/dqn_seeds.py --seeds ...` (each seed's run directory is the one its
own entry would write, bit for bit); it changes how entries run, not what they learn.
What the file declares before any run (primary metric, compared pairs, normalisation, evaluation, the tuning and
reporting seeds, the chosen value of a sweep, post-hoc arms) and the rules the launcher enforces on it:
continual/launch/declarations.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import tempfile
from typing import Any, Callable, Optional

from continual.config.args import field_names
from continual.config.loading import CURRICULUM_KEYS, load_json_file, parse_args
from continual.config.validation import check_batched_across_seeds
from continual.errors import UserError, one_line
from continual.launch import declarations
from continual.launch.declarations import CHOSEN, Declarations
from continual.specs import SEEDS_IN_ONE_PROCESS, SPECS
from continual.training.startup import check_creatable, preflight

TOP_KEYS = ("name", "config", "flags", "grid", "runs", "cpus_per_run", "gpus_per_run", "max_retries", "script",
            "placeholders", "seeds_per_process", *declarations.KEYS)
PLACEHOLDER_KEYS = ("value", "set_by", "rule", "dry_run", "what", "amended")
PLACEHOLDER_USE = re.compile(r"^(?:(\d+)\*)?\$([A-Za-z_][A-Za-z0-9_]*)(?:/(\d+))?$")  # "$B", "3*$B", "$B/20"
RESERVED = ("runs_dir", "run_name", "resume")  # one run directory per entry, chosen by the launcher
DEFAULT_MAX_RETRIES = 2


@dataclasses.dataclass
class Entry:
    index: int
    name: str  # the run directory's name: "<index>_<varying values>"
    label: str  # what varies, "architecture=PPO, seed=1"
    config: dict  # the run's run_config.json (Args fields + curriculum keys)
    chosen_from_tuning: Optional[str] = None  # a sweep's chosen value: the experiment file that tuned it


@dataclasses.dataclass
class Experiment:
    path: str
    name: str
    entries: list[Entry]
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0
    max_retries: int = DEFAULT_MAX_RETRIES
    seeds_per_process: int = 1  # DQN: up to this many entries of one arm (differing by seed) in one process
    script: Optional[str] = None  # the training script named in the file (absolute)
    declarations: Declarations = dataclasses.field(default_factory=Declarations)
    placeholders: dict = dataclasses.field(default_factory=dict)  # NAME -> {value, set_by, rule, dry_run}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_")[:80]


def _short(value: Any) -> str:
    if isinstance(value, str):
        return os.path.splitext(os.path.basename(value))[0] if value.endswith(".json") else value or "''"
    return json.dumps(value, sort_keys=True)


def _check_keys(obj: dict, where: str, extra: tuple[str, ...] = ()) -> None:
    names = field_names()
    for key in obj:
        if not isinstance(key, str):
            raise UserError(f"{where}: keys must be strings")
        if key.startswith("_"):
            continue  # "_comment"
        if key in RESERVED:
            raise UserError(f"{where}: {key!r} is set by the launcher (one run directory per entry under the "
                            f"experiment folder)")
        if key not in names and key not in CURRICULUM_KEYS and key not in extra:
            import difflib

            close = difflib.get_close_matches(key, sorted(names) + list(CURRICULUM_KEYS) + list(extra), n=1)
            raise UserError(f"{where}: unknown key {key!r}" + (f"; did you mean {close[0]!r}?" if close else ""))


def _number(data: dict, key: str, default: float, path: str, integer: bool = False, minimum: float = 0) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or \
            (integer and value != int(value)):
        kind = "an integer" if integer else "a number"
        raise UserError(f"experiment {path!r}: {key} must be {kind} >= {minimum}, got {value!r}")
    return int(value) if integer else float(value)


def _placeholders(data: dict, where: str, stand_ins: bool) -> dict[str, int]:
    """name -> the integer it stands for: its value, or with `stand_ins` (a dry run) its stand-in when unset."""
    given = data.get("placeholders", {})
    if not isinstance(given, dict):
        raise UserError(f"{where}: placeholders must be an object of NAME -> {{value, set_by, rule, dry_run}}")
    out = {}
    for name, spec in given.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)) or not isinstance(spec, dict):
            raise UserError(f"{where}: placeholders[{name!r}] must be NAME (letters, digits, _) -> an object "
                            f"{{value, set_by, rule, dry_run}}")
        declarations._keys(spec, PLACEHOLDER_KEYS, f"{where}: placeholders[{name!r}]")
        for key in ("set_by", "rule", "what", "amended"):
            if key in spec and not isinstance(spec[key], str):
                raise UserError(f"{where}: placeholders[{name!r}].{key} must be a string, got {spec[key]!r}")
        for key in ("value", "dry_run"):
            v = spec.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise UserError(f"{where}: placeholders[{name!r}].{key} must be a positive integer or null, got {v!r}")
        if spec.get("value") is not None:
            out[name] = spec["value"]
        elif stand_ins and spec.get("dry_run") is not None:
            out[name] = spec["dry_run"]
        elif stand_ins:
            raise UserError(f"{where}: placeholders[{name!r}] has neither a value nor a dry_run stand-in")
        else:
            raise UserError(f"{where}: the placeholder {name} is not set yet: "
                            f"{spec.get('set_by') or 'the experiment that decides it'} sets it"
                            + (f" ({spec['rule']})" if spec.get("rule") else "")
                            + "; until then only --dry_run runs (with its stand-in)")
    return out


def _substitute(value: Any, values: dict[str, int], where: str) -> Any:
    """`value` with every placeholder use ("$B", "k*$B", "$B/d") replaced by its integer."""
    if isinstance(value, dict):
        return {k: _substitute(v, values, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, values, where) for v in value]
    m = PLACEHOLDER_USE.match(value) if isinstance(value, str) else None
    if m is None:  # any other string (a path with a '$' in it) is left as it is
        return value
    if m.group(2) not in values:
        raise UserError(f"{where}: {value!r} is no placeholder use ('$NAME', 'K*$NAME' or '$NAME/D' with NAME one of "
                        f"placeholders: {', '.join(values) or 'none'})")
    k, d = int(m.group(1) or 1), int(m.group(3) or 1)
    if d == 0 or (k * values[m.group(2)]) % d:
        raise UserError(f"{where}: {value!r} is not a whole number with {m.group(2)} = {values[m.group(2)]}")
    return k * values[m.group(2)] // d


def load_experiment(path: str, resolve_chosen: bool = True, stand_ins: bool = False) -> Experiment:
    """Read and expand an experiment file (schema errors are one-line UserErrors; the runs' own flags are checked by
    `validate`). `resolve_chosen`: open the tuning files that chosen values name (declarations.check_entries).
    `stand_ins`: an unset placeholder takes its dry-run stand-in (else it refuses the file)."""
    data = load_json_file(path, "experiment")
    base_dir = os.path.dirname(os.path.abspath(path))
    where = f"experiment {path!r}"
    for key in data:
        if not key.startswith("_") and key not in TOP_KEYS:
            import difflib

            close = difflib.get_close_matches(key, TOP_KEYS, n=1)
            raise UserError(f"{where}: unknown key {key!r}" + (f"; did you mean {close[0]!r}?" if close else "") +
                            f" (keys: {', '.join(TOP_KEYS)})")
    name = data.get("name", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(name, str) or not _slug(name):
        raise UserError(f"{where}: name must be a non-empty string, got {name!r}")

    def config_file(value: Any, what: str) -> dict:
        if not isinstance(value, str) or not value:
            raise UserError(f"{where}: {what} must be a path to a run_config.json, got {value!r}")
        file = value if os.path.isabs(value) else os.path.join(base_dir, value)
        return {**load_json_file(file, f"{what} (in {path!r})"), "_config_file": os.path.abspath(file)}

    flags = data.get("flags", {})
    if not isinstance(flags, dict):
        raise UserError(f"{where}: flags must be an object of flag -> value")
    _check_keys(flags, f"{where}: flags", extra=(CHOSEN,))
    runs = data.get("runs", [{}])
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise UserError(f"{where}: runs must be a non-empty list of objects (flag -> value, optional name)")
    for i, r in enumerate(runs):
        _check_keys(r, f"{where}: runs[{i}]", extra=("name", CHOSEN))
    grid = data.get("grid", {})
    if not isinstance(grid, dict):
        raise UserError(f"{where}: grid must be an object of key -> list of values")
    _check_keys(grid, f"{where}: grid", extra=("config", "flags"))
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}: grid {key!r} must be a non-empty list of values (an empty grid runs nothing)")
        if key == "flags":
            for j, v in enumerate(values):
                if not isinstance(v, dict):
                    raise UserError(f"{where}: grid 'flags'[{j}] must be an object of flag -> value")
                _check_keys(v, f"{where}: grid 'flags'[{j}]", extra=("name", CHOSEN))
    if "grid" not in data and "runs" not in data:
        raise UserError(f"{where}: nothing to run: give a grid and/or runs")
    base = config_file(data["config"], "config") if "config" in data else {}
    values = _placeholders(data, where, stand_ins)

    entries: list[Entry] = []
    keys = list(grid)
    names_seen: set[str] = set()
    for run in runs:
        for combo in itertools.product(*(grid[k] for k in keys)):
            cfg = {k: v for k, v in base.items()}
            parts = [str(run["name"])] if "name" in run else []
            picked = dict(zip(keys, combo))
            if "config" in picked:
                cfg = config_file(picked["config"], "grid 'config'")
            cfg.update(flags)
            cfg.update({k: v for k, v in run.items() if k != "name"})
            for k, v in picked.items():
                if k == "config":
                    parts.append(f"config={_short(v)}")
                elif k == "flags":
                    cfg.update({fk: fv for fk, fv in v.items() if fk != "name"})
                    parts.append(str(v["name"]) if "name" in v else
                                 ",".join(f"{fk}={_short(fv)}" for fk, fv in v.items() if fk != CHOSEN))
                else:
                    cfg[k] = v
                    parts.append(f"{k}={_short(v)}")
            index = len(entries)
            label = ", ".join(parts) or "run"
            entry_name = f"{index:03d}_" + "_".join(_slug(p) for p in parts) if parts else f"{index:03d}"
            if entry_name in names_seen:
                raise UserError(f"{where}: two entries are both named {entry_name!r}")
            names_seen.add(entry_name)
            chosen = cfg.pop(CHOSEN, None)
            cfg = _substitute(cfg, values, f"{where}: entry {index} ({label})")
            entries.append(Entry(index, entry_name, label, cfg, chosen))
    decl = declarations.parse(data, where)
    declarations.check_entries(decl, entries, where, path, load=(lambda p: load_experiment(
        p, resolve_chosen=False, stand_ins=stand_ins)) if resolve_chosen else None)
    script = data.get("script")
    if script is not None:
        if not isinstance(script, str) or not script:
            raise UserError(f"{where}: script must be a path, got {script!r}")
        script = script if os.path.isabs(script) else os.path.join(base_dir, script)
    return Experiment(
        path=os.path.abspath(path), name=_slug(name), entries=entries,
        cpus_per_run=_number(data, "cpus_per_run", 1.0, path, minimum=0.01),
        gpus_per_run=_number(data, "gpus_per_run", 0.0, path),
        max_retries=int(_number(data, "max_retries", DEFAULT_MAX_RETRIES, path, integer=True)), script=script,
        seeds_per_process=int(_number(data, "seeds_per_process", 1, path, integer=True, minimum=1)),
        declarations=decl, placeholders=dict(data.get("placeholders", {})))


def run_config(entry: Entry, group: str) -> dict:
    """The run_config.json the launcher writes for an entry: its configuration, W&B group = the experiment, no
    progress bar (the launcher's table shows progress)."""
    cfg = {k: v for k, v in entry.config.items() if k != "_config_file"}
    cfg.setdefault("progress_bar", False)
    cfg.setdefault("wandb_group", group)
    return cfg


def check_groupable(args: Any) -> None:
    """seeds_per_process: an entry agents/dqn_seeds.py can run with other seeds (bad input: a UserError)."""
    if not SPECS[args.architecture].supports(SEEDS_IN_ONE_PROCESS):
        grouped = ", ".join(s.name for s in SPECS.values() if s.supports(SEEDS_IN_ONE_PROCESS))
        raise UserError(f"seeds_per_process: only {grouped} runs are grouped (agents/dqn_seeds.py), this entry is "
                        f"{args.architecture}: drop the key, or put the {grouped} arms in a file of their own")
    try:
        check_batched_across_seeds(args)
    except UserError as e:
        raise UserError(f"seeds_per_process: {e}") from None


def validate(experiment: Experiment, runs_dir: str, check: Optional[Callable[[Any, Any], None]] = None) -> None:
    """Check every entry with the training CLI's own parser and preflight (curriculum, modification names, output
    folder), in-process and creating nothing: the first problem is a UserError naming the entry."""
    check_creatable(runs_dir)
    with tempfile.TemporaryDirectory(prefix="launch-validate-") as tmp:
        for entry in experiment.entries:
            path = os.path.join(tmp, f"{entry.name}.json")
            # a scratch runs_dir: an entry whose run directory exists is resumed, not refused; set in the file, so
            # the command line is --config alone and no tyro parser is built per entry
            with open(path, "w") as f:
                json.dump({**run_config(entry, experiment.name), "runs_dir": os.path.join(tmp, "runs"),
                           "run_name": entry.name}, f)
            try:
                args, curriculum = parse_args(["--config", path])
                preflight(args, curriculum)
                if experiment.seeds_per_process > 1:
                    check_groupable(args)
                if check is not None:
                    check(args, curriculum)
            except UserError as e:
                msg = one_line(str(e)).replace(f"config {path!r}: ", "").replace(path, "its config")
                raise UserError(f"experiment {experiment.path!r}: entry {entry.index} ({entry.label}): {msg}") from None
