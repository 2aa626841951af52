"""The Python API: train, evaluate and read runs from a script or a notebook (docs/python_api.md).

    from continual.api import train, evaluate, load_episodes, load_evaluations, load_metrics

    run_dir = train(env_id="CartPole-v1", backend="Gymnasium", total_timesteps=2048,
                    curriculum=[("", 1024), ("gravity=15", 1024)])
    evaluate(run_dir, modifications=["", "gravity=15"], episodes=5)   # a DataFrame, a row per modification
    load_episodes(run_dir)                                             # a row per training game

`train` takes the flags of `continual_training_example.py` as keyword arguments (or an `Args`), goes through the same
validation (a bad value is a `UserError` with the CLI's one-line message; nothing is created before) and the same
run code (`run`, which the CLI calls too). `evaluate` is eval.py's machinery.

This module is an entry point, like the scripts: it imports `agents` (to start the architecture asked for), and
nothing under continual/ or agents/ imports it (tests/test_imports.py). For that reason `continual/__init__.py` does
not re-export it: every `import continual.x` runs that file, so it would load all agents and close a cycle
continual -> agents -> continual.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import threading
from typing import Any, Callable, Optional, Sequence, Union

import torch

from agents import AGENT_MODULES, agent_module
from continual.config.args import Args, default_args
from continual.config.loading import Curriculum, args_to_dict, load_json_file, split_config
from continual.config.validation import validate_args
from continual.curricula import FACTORIES, ModificationFactory
from continual.errors import UserError
from continual.evaluation.checkpoints import EvalArgs, evaluate_checkpoint
from continual.evaluation.table import COLUMNS, EVAL_TABLE, read_eval_table
from continual.processes import MAIN_GUARD, importing_main_in_worker, unguarded_main_call, workers_skip_main
from continual.training.session import resume_command
from continual.training.startup import print_config
from continual.training.tracking import read_metrics

PathLike = Union[str, "os.PathLike[str]"]
# a task of a list curriculum: (modifications, steps) or TaskSequence's {"env_id", "modifications", "steps"}
Task = Union[tuple, dict]
CurriculumLike = Union[None, Curriculum, ModificationFactory, Sequence[Task], Callable[[int], str]]


# ---------------------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------------------


def _workers_skip_main(function: str):
    """Where a worker process would run the calling script again: a script's unguarded top-level call has its
    workers start without that import (continual.processes); the same call reached again inside a worker (the
    script imported some other way) is refused in one line."""
    if importing_main_in_worker():
        raise UserError(f"{function}() was called again inside a worker process that is importing your script; put "
                        f"the script's calls under `{MAIN_GUARD}`")
    return workers_skip_main(unguarded_main_call() is not None)


def run(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None) -> str:
    """Start (or resume) a run from resolved arguments: the body of continual_training_example.py's `main`, shared
    with `train`. Returns the run directory."""
    if args.architecture not in AGENT_MODULES:
        raise UserError(f"architecture: {args.architecture} is not available yet; available: "
                        f"{', '.join(AGENT_MODULES)}")
    print_config(args, curriculum, resume_state)  # validates everything first
    return agent_module(args.architecture).train(args, curriculum, resume_state)


def _callable_factory(fn: Callable[[int], str], length: Optional[int]) -> Curriculum:
    """A function step -> modification string as a seed-style factory (asked once per rollout start, in order, like
    those of modification_factories.py), registered for this process under a name that says what it is."""
    if length is None:
        raise UserError("total_timesteps: a curriculum given as a function needs total_timesteps (its length)")

    class PythonCallableFactory:
        def __init__(self, num_total_steps: int):
            self.num_total_steps = num_total_steps

        def get_modification(self, step: int) -> str:
            return fn(step)

    owner = getattr(fn, "__self__", None)  # a bound get_modification: name its class
    what = type(owner).__qualname__ if owner is not None else getattr(fn, "__qualname__", type(fn).__qualname__)
    name = f"python:{getattr(fn, '__module__', None) or '?'}.{what}"
    # one entry per name: the run being started uses it; a config.json naming it cannot be resumed in another process
    FACTORIES[name] = PythonCallableFactory
    return Curriculum(name, {"num_total_steps": length})


def _task(item: Any, i: int) -> dict:
    if isinstance(item, dict):
        return dict(item)  # TaskSequence checks its keys and values
    if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], (str, list)):
        return {"modifications": item[0], "steps": item[1]}
    raise UserError(f"curriculum[{i}]: a task is (modifications, steps) or {{'env_id', 'modifications', 'steps'}}, "
                    f"got {item!r}")


def as_curriculum(curriculum: CurriculumLike, total_timesteps: Optional[int] = None) -> Curriculum:
    """The curriculum spec (factory name and kwargs, as config.json records it) of a Python object:

    - None: the constant `modifs` string;
    - a list of tasks, each `(modifications, steps)` or `{"env_id": ..., "modifications": ..., "steps": N}`: a
      TaskSequence, run in order (a switch at the first rollout start at or after each task's end);
    - a `ModificationFactory` (Sequential, Random, Combined, TaskSequence, ...; continual.curricula): its name and
      constructor arguments (the run's seed replaces the object's);
    - a function `step -> modification string`, or an object with `get_modification(step)` (the seed's contract of
      modification_factories.py): asked for every rollout start, in order, before training (the strings are
      checked first); `total_timesteps` is its length (or the object's `num_total_steps`);
    - a `Curriculum` (continual.config.loading) as it is."""
    if curriculum is None:
        return Curriculum()
    if isinstance(curriculum, Curriculum):
        return curriculum
    if isinstance(curriculum, ModificationFactory):
        return Curriculum(curriculum.factory_name(), curriculum.config())
    if isinstance(curriculum, (list, tuple)):
        if not curriculum:
            raise UserError("curriculum: the list of tasks is empty")
        return Curriculum("TaskSequence", {"tasks": [_task(t, i) for i, t in enumerate(curriculum)]})
    if isinstance(curriculum, type):
        raise UserError(f"curriculum: give an instance or a function, not the class {curriculum.__qualname__}")
    get = getattr(curriculum, "get_modification", None)
    if callable(get):
        return _callable_factory(get, getattr(curriculum, "num_total_steps", None) or total_timesteps)
    if callable(curriculum):
        return _callable_factory(curriculum, total_timesteps)
    raise UserError(f"curriculum: expected a list of tasks, a factory or a function step -> modification string, got "
                    f"{type(curriculum).__name__}")


def make_args(args: Optional[Args] = None, *, curriculum: CurriculumLike = None, **kwargs: Any
              ) -> tuple[Args, Curriculum]:
    """The resolved `Args` and curriculum of `train` without training: `args` (default: the architecture's own
    defaults, `default_args`) < the JSON file of `config=` < keyword arguments; every value type-checked as a config
    file's and validated as the CLI's flags."""
    if args is not None and not isinstance(args, Args):
        raise UserError(f"args: expected an Args (continual.config.args), got {type(args).__name__}")
    config = kwargs.pop("config", None)
    if kwargs.get("resume") is not None:
        raise UserError("resume: train() starts new runs; continue one with "
                        "`python continual_training_example.py --resume RUN_DIR`")
    kwargs.pop("resume", None)
    file_curriculum = Curriculum()
    file_fields: dict = {}
    if config is not None:
        path = os.fspath(config)
        file_fields, file_curriculum = split_config(load_json_file(path), f"config {path!r}")
    if args is None:  # the architecture's own defaults where neither the config nor a keyword argument sets a value
        architecture = kwargs.get("architecture", file_fields.get("architecture", "PPO"))
        args = default_args(architecture if isinstance(architecture, str) else "PPO")
    merged = {k: v for k, v in args_to_dict(args).items() if k not in ("config", "resume")}
    merged.update(file_fields)
    for key in kwargs:
        if key.startswith("_"):  # a config file's "_comment" keys are skipped; a keyword argument is a typo
            raise UserError(f"train(): unknown key {key!r}")
    merged.update(kwargs)
    # names (unknown -> "did you mean ...?") and value types, checked as a config file's keys are
    fields, resolved = split_config(merged, "train()")
    if curriculum is not None:
        if resolved.factory is not None:
            raise UserError("curriculum: given twice (curriculum= and modification_factory=); give one")
        resolved = as_curriculum(curriculum, fields.get("total_timesteps"))
    elif resolved.factory is None:
        resolved = file_curriculum
    out = dataclasses.replace(Args(), **fields)
    if config is not None:
        out.config = os.fspath(config)
    validate_args(out)
    # as parse_train_args: the effective clip goes into config.json, the printout and checkpoints
    out.max_grad_norm = out.grad_clip_norm()
    return out, resolved


def train(args: Optional[Args] = None, *, curriculum: CurriculumLike = None, **kwargs: Any) -> pathlib.Path:
    """Train one run and return its directory.

    `args`: an `Args` (continual.config.args) to start from; `kwargs`: any of its fields (the CLI's flags without
    `--`: `architecture="DQN"`, `total_timesteps=50_000`, ...), plus `config="run_config.json"`; `curriculum`: see
    `as_curriculum`. Bad input raises `UserError` (one line) before anything is created. A run stopped by Ctrl-C
    saves an `interrupted__step<N>` checkpoint and raises KeyboardInterrupt; a run-stopping fault saves what it can
    and raises `TrainingError`. Signal handlers and torch's thread count are given back as they were. Called at the
    top level of a script without `if __name__ == "__main__":`, its worker processes (Atari envs) start without
    running the script again."""
    workers = _workers_skip_main("train")
    resolved, spec = make_args(args, curriculum=curriculum, **kwargs)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    try:
        with workers:
            return pathlib.Path(run(resolved, spec))
    except SystemExit as e:  # the run's answer to SIGINT/SIGTERM (exit code 128 + signal) for the CLI
        if isinstance(e.code, int) and e.code > 128:
            where = os.path.join(resolved.runs_dir, resolved.run_name or "")
            raise KeyboardInterrupt(f"training stopped by signal {e.code - 128}; {where} holds an interrupted "
                                    f"checkpoint; continue it with `{resume_command(where)}`") from None
        raise
    finally:
        # the session binds SIGINT/SIGTERM to itself: a later Ctrl-C in the notebook must interrupt as usual
        if threading.current_thread() is threading.main_thread():
            for s, h in handlers.items():
                if h is not None:
                    signal.signal(s, h)
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------------------------------


def evaluate(run_or_checkpoint: PathLike, *, modifications: Union[None, str, Sequence[str]] = None,
             episodes: int = 10, all_regimes: bool = False, greedy: bool = False, seed: int = 1,
             num_envs: Optional[int] = None, env_id: Optional[str] = None, backend: Optional[str] = None,
             max_episode_steps: Optional[int] = None, output: Optional[PathLike] = None, progress_bar: bool = False,
             cuda: bool = True):
    """eval.py from Python: evaluate a run directory (its newest checkpoint), a checkpoint or a final policy file
    under `modifications` (default: the unmodified game; `all_regimes=True`: every regime of the curriculum),
    `episodes` whole games each (whatever cap the run trained with; `max_episode_steps`: cap them at this many agent
    steps). Returns a pandas DataFrame, a row per modification, with columns modification, episodes, mean, std, min,
    max, mean_length, max_episode_steps (the cap, None: whole games), capped (games the cap cut short) (+
    success_rate, goal_distance for HER agents). Writes the same CSV/JSON as eval.py (under <run>/eval/ unless
    `output`, a path without extension)."""
    import pandas as pd  # imported when used: the training CLI imports this module for `run`

    if not isinstance(run_or_checkpoint, (str, os.PathLike)):
        raise UserError(f"run_or_checkpoint: expected a path, got {type(run_or_checkpoint).__name__} (several "
                        f"checkpoints: call evaluate for each and pandas.concat the results)")
    if isinstance(modifications, str):
        modifications = [modifications]
    for name, value in (("episodes", episodes), ("seed", seed), ("num_envs", num_envs),
                        ("max_episode_steps", max_episode_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise UserError(f"{name}: expected an integer, got {value!r}")
    args = EvalArgs(agent_path=[os.fspath(run_or_checkpoint)],
                    modifs=None if modifications is None else [str(m) for m in modifications],
                    all_regimes=all_regimes, env_id=env_id, backend=backend, eval_episodes=episodes,
                    eval_max_episode_steps=max_episode_steps,
                    num_envs=num_envs, greedy=greedy, seed=seed, progress_bar=progress_bar, cuda=cuda,
                    output=None if output is None else os.fspath(output))
    with _workers_skip_main("evaluate"):
        return pd.DataFrame(evaluate_checkpoint(args, agent_module))


# ---------------------------------------------------------------------------------------------------------------------
# reading runs
# ---------------------------------------------------------------------------------------------------------------------

EPISODE_COLUMNS = ["global_step", "modification", "return", "length"]


def _run_file(run_dir: PathLike, name: str) -> str:
    run_dir = os.fspath(run_dir)
    if not os.path.isfile(os.path.join(run_dir, "config.json")):
        raise UserError(f"{run_dir!r} is not a run directory (it has no config.json)")
    return os.path.join(run_dir, name)


def load_metrics(run_dir: PathLike, kind: Optional[str] = "iteration"):
    """metrics.jsonl as a DataFrame (a last line cut by a crash is dropped). `kind="iteration"` (default): a row per
    training iteration, columns global_step, time, iteration, modification and the logged scalars
    ("charts/SPS", "losses/policy_loss", ...); other kinds: "episode", "switch", "eval", "plasticity", ...; None: every
    record, with its `kind` column."""
    import pandas as pd  # imported when used: the training CLI imports this module for `run`

    records = read_metrics(_run_file(run_dir, "metrics.jsonl"))
    if kind is not None:
        records = [{k: v for k, v in r.items() if k != "kind"} for r in records if r.get("kind") == kind]
    return pd.DataFrame(records)


def load_episodes(run_dir: PathLike):
    """The training games: a row per finished game, columns global_step, modification, return, length (+ time, env
    where recorded)."""
    df = load_metrics(run_dir, "episode")
    return df if len(df) else df.reindex(columns=EPISODE_COLUMNS)


def load_evaluations(run_dir: PathLike):
    """The continual evaluation (`--eval_every`, `--eval_at_switches`): eval_table.csv, a row per evaluation step x
    regime, columns step, modification, slug, split, episodes, mean, std, min, max, mean_length, seconds, greedy,
    success_rate. Empty (with those columns) when the run evaluated nothing."""
    import pandas as pd  # imported when used: the training CLI imports this module for `run`

    path = _run_file(run_dir, EVAL_TABLE)
    if not os.path.exists(path):
        return pd.DataFrame(columns=COLUMNS)
    return pd.DataFrame(read_eval_table(path)).reindex(columns=COLUMNS)
