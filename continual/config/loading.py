"""Configuration: `Args` defaults < the architecture's own (continual/specs.py) < run_config.json < flags given on the command line (a flag that overrides a config
key prints one `note: --flag X overrides run_config.json's Y` line).

`parse_args()` returns the resolved `Args` and the curriculum spec. Every problem is a one-line `UserError` naming the
field, raised before any environment is created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import json
import math
import os
import sys
import types
import typing
from typing import Any, Optional, Sequence

import tyro

from continual.config.args import Args, default_args, field_names, from_grouped, grouped_class, to_grouped
from continual.config.validation import validate_args
from continual.errors import UserError, one_line

CURRICULUM_KEYS = ("modification_factory", "modification_factory_kwargs")
MAX_CONFIG_BYTES = 4 * 1024 * 1024
DEFAULT_TOTAL_TIMESTEPS = 10_000_000


@dataclasses.dataclass
class Curriculum:
    """The `modification_factory` part of a run config (None: a constant `--modifs` string)."""

    factory: Optional[str] = None
    kwargs: dict = dataclasses.field(default_factory=dict)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed")


def load_json_file(path: str, what: str = "config") -> dict:
    if os.path.isdir(path):
        raise UserError(f"{what} {path!r} is a directory, expected a JSON file")
    if not os.path.exists(path):
        raise UserError(f"{what} {path!r} does not exist")
    try:
        size = os.path.getsize(path)
        if size > MAX_CONFIG_BYTES:
            raise UserError(f"{what} {path!r} is {size} bytes; refusing files over {MAX_CONFIG_BYTES} bytes")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what} {path!r} cannot be read: {e}") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise UserError(f"{what} {path!r}: JSON nested too deeply") from None
    except ValueError as e:
        raise UserError(f"{what} {path!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path!r}: the top level must be a JSON object, got {type(data).__name__}")
    return data


def _type_hints() -> dict[str, Any]:
    return typing.get_type_hints(Args)


def _check_value(name: str, value: Any, tp: Any) -> Any:
    """Check a JSON value against a field annotation; returns the value converted (int -> float where needed)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return _check_value(name, value, a)
            except UserError as e:
                errors.append(str(e))
        raise UserError(errors[0])
    if origin is typing.Literal:
        if value not in args:
            raise UserError(f"{name}: must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"{name}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{name}: expected an integer, got {value!r}")
        if isinstance(value, float):
            if not math.isfinite(value) or not value.is_integer():
                raise UserError(f"{name}: expected an integer, got {value!r}")
            value = int(value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{name}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise UserError(f"{name}: must be finite, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"{name}: expected a string, got {value!r}")
        return value
    raise UserError(f"{name}: cannot be set from a config file")


def split_config(data: dict, source: str) -> tuple[dict, Curriculum]:
    """Separate Args fields from the curriculum keys, checking names and types."""
    hints = _type_hints()
    names = field_names()
    fields: dict = {}
    curriculum = Curriculum()
    for key, value in data.items():
        if not isinstance(key, str):
            raise UserError(f"{source}: keys must be strings")
        if key.startswith("_"):
            continue  # "_comment" style keys are documentation
        if key == "modification_factory":
            if not isinstance(value, str) or not value:
                raise UserError(f"modification_factory: expected a factory name, got {value!r}")
            curriculum.factory = value
        elif key == "modification_factory_kwargs":
            if not isinstance(value, dict):
                raise UserError(f"modification_factory_kwargs: expected an object, got {type(value).__name__}")
            curriculum.kwargs = value
        elif key in ("config", "resume"):
            raise UserError(f"{key}: cannot be set inside a config file")
        elif key in names:
            fields[key] = _check_value(key, value, hints[key])
        elif key in REMOVED_KEYS:  # saved configs of older runs still load when the key's value changes nothing
            neutral, why = REMOVED_KEYS[key]
            if value != neutral:
                raise UserError(f"{source}: {key} was removed ({why}); only {key}={json.dumps(neutral)} is accepted")
        else:
            close = difflib.get_close_matches(key, sorted(names) + list(CURRICULUM_KEYS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UserError(f"{source}: unknown key {key!r}{hint}")
    if curriculum.kwargs and curriculum.factory is None:
        raise UserError("modification_factory: missing (modification_factory_kwargs is given)")
    return fields, curriculum


# keys of earlier versions: (the value that behaves as today, why the key went)
REMOVED_KEYS = {
    "env_groups": (1, "stepping envs in groups did not pay on any machine measured; see docs/benchmarks/small-envs.md"),
}


def _config_path_from_argv(argv: Sequence[str]) -> Optional[str]:
    for i, a in enumerate(argv):
        if a in ("--config",):
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UserError("--config: expected a path")
            return argv[i + 1]
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return None


def _architecture_from_argv(argv: Sequence[str]) -> Optional[str]:
    """The last --architecture on the command line (the one tyro keeps); tyro reports a bad value."""
    found = None
    for i, a in enumerate(argv):
        if a == "--architecture" and i + 1 < len(argv):
            found = argv[i + 1]
        elif a.startswith("--architecture="):
            found = a.split("=", 1)[1]
    return found


def _tyro_error_line(text: str) -> str:
    """The message of tyro's error box: the first section after the title, joined (tyro wraps at 80 columns)."""
    rows = [ln.strip(" │╭╮╰╯") for ln in text.splitlines()]
    sections: list[list[str]] = [[]]
    for ln in rows:
        if ln and set(ln) <= set("─-━ "):
            sections.append([])
        elif ln.strip():
            sections[-1].append(ln.strip())
    sections = [sec for sec in sections if sec]
    if not sections:
        return "invalid command line"
    # the first section holds the box title ("Value error") and, in tyro's layout, usually the message right after
    body = sections[1] if len(sections) > 1 and len(sections[0]) == 1 else sections[0][1:] or sections[0]
    body = [ln for ln in body if not ln.lower().startswith(("for full helptext", "argument helptext"))]
    return one_line(" ".join(body)) if body else one_line(sections[0][0])


def _flags_of(cls: type) -> dict[str, Any]:
    """The flags of a dataclass as tyro parses it here (nested dataclasses flattened, as OmitArgPrefixes makes
    them): name -> type."""
    out: dict[str, Any] = {}
    for name, tp in typing.get_type_hints(cls).items():
        if name == "given_flags":  # eval.py's, suppressed
            continue
        if dataclasses.is_dataclass(tp):
            out.update(_flags_of(tp))
        else:
            out[name] = tp
    return out


BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "0", "1")


def flag_hints(cls: type, argv: Sequence[str], message: str) -> str:
    """What tyro's "Unrecognized options" error leaves out: the flag meant by a misspelt one (`--lerning_rate` ->
    `--learning_rate`), and that a switch takes no value (`--track False` -> `--no_track`)."""
    if not message.startswith("Unrecognized options:"):
        return ""
    flags = _flags_of(cls)
    switches = {name for name, tp in flags.items() if tp is bool}
    names = sorted(flags) + [f"no_{name}" for name in sorted(switches)]
    unknown = [t.strip() for t in message.split(":", 1)[1].split(",")]
    hints, meant = [], []
    for token in unknown:
        if token.startswith("--"):
            typed = token[2:].split("=", 1)[0].replace("-", "_")
            close = difflib.get_close_matches(typed, names, n=1, cutoff=0.75)
            if close:
                meant.append((token, f"--{close[0]}"))
        elif token.lower() in BOOL_WORDS:
            i = argv.index(token) if token in argv else -1
            before = argv[i - 1][2:].replace("-", "_") if i > 0 and argv[i - 1].startswith("--") else ""
            if before in switches:
                on = token.lower() in ("true", "yes", "on", "1")
                hints.append(f"--{before} is a switch and takes no value: "
                             + (f"--{before} turns it on" if on else f"--no_{before} turns it off"))
    if len(meant) == 1:
        hints.insert(0, f"did you mean {meant[0][1]}?")
    elif meant:
        hints.insert(0, "did you mean " + ", ".join(f"{flag} for {token}" for token, flag in meant) + "?")
    return "; ".join(hints)


def cli(cls: type, argv: Sequence[str], default: Any, description: Optional[str] = None) -> Any:
    """tyro.cli with errors turned into one-line UserErrors; --help prints normally."""
    if cls is Args:  # --help in panels (run, environment, PPO, ...) with the same flat flag names
        grouped = grouped_class()
        return from_grouped(cli(grouped, argv, to_grouped(default if default is not None else Args(), grouped),
                                description))
    # --help in the underscore form the docs and configs write (--eval_every); --eval-every parses as well
    kwargs: dict[str, Any] = {"args": list(argv), "description": description, "use_underscores": True}
    if default is not None:
        kwargs["default"] = default
    if any(a in ("-h", "--help") for a in argv):
        return tyro.cli(cls, **kwargs)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf):
            return tyro.cli(cls, **kwargs)
    except SystemExit as e:
        if e.code in (0, None):
            sys.stdout.write(buf.getvalue())
            raise
        message = _tyro_error_line(buf.getvalue())
        hint = flag_hints(cls, list(argv), message)
        raise UserError(f"{message} ({hint})" if hint else message) from None


def parse_args(argv: Optional[Sequence[str]] = None, description: Optional[str] = None) -> tuple[Args, Curriculum]:
    """Resolve defaults < --config JSON < command-line flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config_path = _config_path_from_argv(argv)
    curriculum = Curriculum()
    fields: dict = {}
    if config_path is not None:
        data = load_json_file(config_path)
        fields, curriculum = split_config(data, f"config {config_path!r}")
    # the architecture's own defaults apply where neither the config nor the command line set a flag
    architecture = _architecture_from_argv(argv) or fields.get("architecture", "PPO")
    defaults = dataclasses.replace(default_args(architecture), **fields)
    if argv in ([], ["--config", config_path], [f"--config={config_path}"]):
        # nothing for tyro to parse (the launcher's and a config-only run's command line): the config's values are
        # already checked and converted by split_config, and building tyro's parser costs ~0.3 CPU-s (the same Args:
        # tests/test_config_loading.py)
        args = dataclasses.replace(defaults, config=config_path)
    else:
        args = cli(Args, argv, default=defaults, description=description)
    validate_args(args)
    if config_path is not None:
        for note in override_notes(args, fields, os.path.basename(config_path)):
            print(note)
    return args, curriculum


def override_notes(args: Args, config_fields: dict, config_name: str) -> list[str]:
    """One line per config key that a command-line flag overrode with a different value (flags win, unlike the
    seed document's rule, so the user is told)."""
    notes = []
    for key, config_value in config_fields.items():
        value = getattr(args, key)
        if value == config_value:
            continue
        shown = value if isinstance(value, str) else json.dumps(value)
        notes.append(f"note: --{key} {shown} overrides {config_name}'s {json.dumps(config_value)}")
    return notes


def args_to_dict(args: Any) -> dict:
    return dataclasses.asdict(args)


def args_from_dict(data: dict) -> Args:
    """Rebuild Args from a saved resolved config (a checkpoint or config.json); unknown keys are an error."""
    if not isinstance(data, dict):
        raise UserError(f"saved config: expected an object, got {type(data).__name__}")
    fields, _ = split_config({k: v for k, v in data.items() if k not in ("config", "resume")}, "saved config")
    if fields.get("ewc", "none") != "none" and "ewc_fisher" not in fields:
        fields["ewc_fisher"] = "true"  # saved before --ewc_fisher existed: the run (and its EWC state) used the true Fisher
    if fields.get("nap") and "nap_project_heads" not in fields:
        fields["nap_project_heads"] = True  # saved before --nap_project_heads existed: NaP projected the heads too
    if fields.get("trac") and "trac_keep_base" not in fields:
        fields["trac_keep_base"] = True  # saved before --trac_keep_base existed: TRAC kept its base iterate
    return dataclasses.replace(Args(), **fields)
