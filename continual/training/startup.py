"""Everything before a run's first env: resolve flags (or a checkpoint to resume), build and check the curriculum,
create the run directory and logger, seed. An agent file's `main` is `agent_main` (`parse_train_args`,
`print_config`, then its `train`); `train` calls `start_run`, which returns the `RunSession` its loop drives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from continual.config.args import Args, default_args
from continual.config.loading import DEFAULT_TOTAL_TIMESTEPS, Curriculum, args_from_dict, args_to_dict, cli, parse_args
from continual.config.validation import validate_args
from continual.curricula import FactoryConfigError, ModificationFactory, make_factory, make_run_factory
from continual.envs.backends import game_name, task_compat, validate_action_space, validate_env_id, validate_task
from continual.envs.vector import EnvSettings, make_env
from continual.errors import FULL_DISK_ERRNOS, StorageError, UserError, exit_on_user_error
from continual.machine import machine
from continual.modstrings import parse_eval_modifs, parse_task, task_env_ids
from continual.specs import CLEAR_REPLAY, NEEDS_SWITCHES, SPECS, defaults_line
from continual.training import checkpoint as ckpt_lib
from continual.training.provenance import code_revision
from continual.training.session import RunSession
from continual.training.tracking import RunLogger, check_writable, create_run_dir, write_json

# flags that may differ from the checkpoint's when resuming; the rest would change the run being continued
RESUME_OVERRIDABLE = {"resume", "verbose", "total_timesteps", "progress_bar", "track", "wandb_project_name", "wandb_entity",
                      "wandb_dir", "wandb_group", "wandb_tags", "checkpoint_every", "checkpoint_minutes", "keep_checkpoints", "capture_video",
                      "video_every", "save_agent_with_switch", "save_agent_wandb", "cuda", "config", "runs_dir",
                      # continual evaluation never changes training
                      "eval_every", "eval_at_switches", "eval_final_only", "eval_episodes", "eval_modifs", "eval_greedy", "eval_num_envs",
                      "eval_seed", "eval_reseed", "eval_max_episode_steps", "eval_background", "metrics", "plots",
                      # where IMPALA's actors run (a run resumed on another cluster, or on one machine)
                      "actor_backend", "ray_address", "actor_max_restarts",
                      # the same steps to float rounding: a run may be resumed compiled, or on another device
                      "compile", "cudagraphs"}


def parse_train_args(argv: Optional[Sequence[str]] = None, description: Optional[str] = None,
                     architectures: Sequence[str] = (), architecture: Optional[str] = None
                     ) -> tuple[Args, Curriculum, Optional[dict]]:
    """Flags (+ --config), or a checkpoint's saved configuration when --resume is given. `architectures`: those the
    entry point can run (checked here for a resumed checkpoint); `architecture`: the one agent file that parses
    (`python agents/ppo.py`), which sets --architecture and resumes only its own checkpoints."""
    argv = list(sys.argv[1:] if argv is None else argv)
    resume = None
    for i, a in enumerate(argv):
        if a in ("--resume",) and i + 1 < len(argv):
            resume = argv[i + 1]
        elif a.startswith("--resume="):
            resume = a.split("=", 1)[1]
    if resume is None:
        # an agent file's own architecture is in force when the flags are validated (DQN-only flags, ...)
        # (last, so that its own defaults are the ones in force: the spec's of the file that parses)
        args, curriculum = parse_args([*argv, "--architecture", architecture] if architecture else argv,
                                      description=description)
        if architecture is not None:
            args.architecture = architecture
        # the effective clip goes into config.json, the printout and checkpoints (None there would hide it)
        args.max_grad_norm = args.grad_clip_norm()
        return args, curriculum, None
    state = ckpt_lib.load_checkpoint(resume)
    missing = [k for k in ckpt_lib.RESUME_KEYS if k not in state]
    if missing:
        raise UserError(f"checkpoint {state['path']!r} cannot be resumed: it lacks {', '.join(missing)}")
    if not (ckpt_lib.in_checkpoint_dir(state["path"])
            and os.path.exists(os.path.join(ckpt_lib.run_dir_of(state["path"]), "config.json"))):
        raise UserError(f"--resume needs a checkpoint inside a run directory (<run>/checkpoints/...): "
                        f"{state['path']!r} is not")
    if architecture is not None and state["architecture"] != architecture:
        raise UserError(f"checkpoint {state['path']!r} was written by {state['architecture']}, not {architecture}: resume it "
                        f"with continual_training_example.py --resume ...")
    if architectures and state["architecture"] not in architectures:
        raise UserError(f"checkpoint architecture {state['architecture']!r} is not available; available: "
                        f"{', '.join(architectures)}")
    saved = args_from_dict(state["args"])
    args = cli(Args, argv, default=saved, description=description)
    changed = [f.name for f in dataclasses.fields(Args)
               if getattr(args, f.name) != getattr(saved, f.name) and f.name not in RESUME_OVERRIDABLE]
    if changed:
        raise UserError(f"--resume continues a run with its saved configuration; cannot change: {', '.join(changed)}")
    validate_args(args)
    return args, Curriculum(**state["curriculum"]), state


def build_factory(args: Args, curriculum: Curriculum, granularity: int,
                  saved_granularity: Optional[int] = None) -> ModificationFactory:
    """The run's curriculum. `granularity` is the agent's rollout size: built-in factories ignore it (they decide
    per step, one schedule for every agent); a curriculum with your own factory is asked once per rollout.
    `saved_granularity` (resume): the granularity the run was started with, kept so that it continues its schedule
    (checkpoints written before built-in curricula were per step hold the rollout size)."""
    name, kwargs = curriculum.factory, curriculum.kwargs
    if name is None:
        name = "SequentialModificationFactory"
        kwargs = {"num_total_steps": args.total_timesteps or DEFAULT_TOTAL_TIMESTEPS, "modifications": [args.modifs],
                  "switching_thresholds": []}
    try:
        if saved_granularity is not None:
            return make_factory(name, kwargs, seed=args.seed, granularity=saved_granularity)
        return make_run_factory(name, kwargs, seed=args.seed, rollout_size=granularity)
    except FactoryConfigError as e:
        raise UserError(str(e)) from None


def resolve_total(args: Args, factory: ModificationFactory, granularity: int) -> int:
    """Steps to train: whole rollouts of `granularity` steps covering --total_timesteps (default: the whole
    curriculum), the last rollout rounded up so that the curriculum's last switch is reached."""
    total = args.total_timesteps if args.total_timesteps is not None else factory.total_timesteps
    if total > factory.total_timesteps:
        raise UserError(f"total_timesteps: {total} exceeds the curriculum length {factory.total_timesteps}")
    return -(-total // granularity) * granularity


def rounding_note(args: Args, factory: ModificationFactory, granularity: int, total: int) -> Optional[str]:
    """The line saying how the steps to train were rounded to whole rollouts (None if nothing was rounded)."""
    asked = args.total_timesteps if args.total_timesteps is not None else factory.total_timesteps
    if asked == total:
        return None
    what = "--total_timesteps" if args.total_timesteps is not None else "the curriculum's"
    return (f"note: {what} {asked} steps rounded up to {total} = {total // granularity} rollouts of {granularity} "
            f"steps (the last rollout runs {total - asked} steps past {asked}, in the regime of its start)")


def check_modifications(args: Args, factory: ModificationFactory, extra: Sequence[str] = ()) -> list[str]:
    """Every string the curriculum can emit, validated against the game before any env exists."""
    validate_env_id(args.backend, args.env_id)
    try:
        regimes = factory.possible_modifications()
    except FactoryConfigError as e:  # a seed-style factory's get_modification failed or returned a non-string
        raise UserError(str(e)) from None
    tasks = [parse_task(s, args.backend, args.env_id) for s in [*regimes, *extra]]
    for task in tasks:
        validate_task(task)
    if args.task_id_input and args.her:
        raise UserError("task_id_input: HER observations carry goals; use one or the other")
    if args.task_id_input and args.backend in ("HackAtari", "OCAtari") and args.obs_mode != "dqn":
        raise UserError(f"task_id_input: needs frames (obs_mode dqn), MinAtar grids or vector observations, "
                        f"not obs_mode {args.obs_mode}")
    games = task_env_ids(tasks)
    if len(games) > 1:  # a task sequence across games: one agent needs one observation and action space
        if args.her:
            raise UserError(f"her: goal spaces are per game; a sequence of several games ({', '.join(games)}) "
                            f"cannot use --her")
        for game in games:
            validate_action_space(args.architecture, args.backend, game, args.her)
        task_compat(args.backend, games, args.obs_mode)
    return regimes


def set_torch_threads(args: Args, obs_shape: Sequence[int]) -> None:
    """--torch_threads, or 1 for non-pixel observations (small MLPs and the small CNN of MinAtar's 10x10 grids): a
    second thread pays only on idle cores without OpenMP's PASSIVE wait (Args.torch_threads says by how much)."""
    small = len(obs_shape) != 3 or obs_shape[1] < 36
    threads = args.torch_threads if args.torch_threads else (1 if small else None)
    if threads:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def acting_threads(args: Args):
    """--act_threads while a rollout acts, the update's count (set_torch_threads) again after it. A forward pass over
    num_envs frames is too small to split: a second OpenMP thread costs more in synchronisation, and in spinning
    against the env workers that step next, than it saves (tests/test_agents_ppo.py: the same actions, log-probs and
    values bit for bit)."""
    update = torch.get_num_threads()
    act = args.act_threads or update
    if act == update:
        yield
        return
    torch.set_num_threads(act)
    try:
        yield
    finally:
        torch.set_num_threads(update)


# glibc mallopt(3) parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
_TRIM_THRESHOLD = 1 << 30


def retain_freed_memory() -> bool:
    """Keep the memory an update frees for the next update's allocations instead of giving it back to the OS.

    glibc hands large freed blocks back (mmapped ones at once, the heap's top above a threshold that adapts), so every
    PPO minibatch's ~29 MB float batch and its activations are page-faulted in anew: 130k-280k minor faults and ~0.3 s of
    kernel time per Nature-CNN iteration on CPU. Fixed thresholds (the largest mmap threshold glibc accepts, 32 MiB,
    and a 1 GiB trim threshold) keep such blocks in the heap; peak memory is what it was. Nothing is done off glibc,
    or where the user chose malloc settings (MALLOC_* variables, GLIBC_TUNABLES) or another allocator (LD_PRELOAD).
    Returns whether the thresholds were set."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc" or "GLIBC_TUNABLES" in os.environ or "LD_PRELOAD" in os.environ or any(
            k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def seed_everything(seed: int, torch_deterministic: bool) -> np.random.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic
    return np.random.default_rng(seed)


def default_run_name(args: Args) -> str:
    return f"{game_name(args.env_id)}__{args.exp_name or args.architecture.lower()}__s{args.seed}__{int(time.time())}"


def resolve_backend_defaults(args: Args) -> None:
    """Defaults that depend on the backend, recorded resolved: MiniHack's rewards (1 a win, -0.001 a step) are not
    clipped, and its pixel observation is `pixel_crop`."""
    if args.reward_scaling is None:
        args.reward_scaling = "none" if args.backend == "MiniHack" else "clip"
    if args.backend == "MiniHack" and args.obs_mode == "dqn":
        args.obs_mode = "pixel_crop"


@dataclasses.dataclass
class Plan:
    """What `preflight` resolved: the curriculum, the run's length and every regime it can emit."""

    factory: ModificationFactory
    total: int
    regimes: list[str]


def granularity_of(args: Args) -> int:
    """Agent steps per iteration, the curriculum's granularity (the agents pass the same to `start_run`)."""
    return SPECS[args.architecture].steps_per_iteration(args)


def replay_unroll_bytes(unroll_length: int, obs_shape: Sequence[int], obs_itemsize: int, n_actions: int) -> int:
    """CLEAR (agents/clear.py): bytes of one stored unroll of one env: T+1 observations, T actions (int64), behaviour
    logits (float32 per action), rewards and behaviour values (float32) and dones (bool), and its regime (int64)."""
    T = unroll_length
    return (T + 1) * int(np.prod(obs_shape)) * obs_itemsize + T * (8 + 4 * n_actions + 4 + 4 + 1) + 8


def replay_buffer_bytes(args: Args, regimes: Sequence[str]) -> int:
    """CLEAR: bytes of the whole replay buffer (clear_buffer_frames // unroll_length unrolls). Atari frames
    (4x84x84 uint8 + task-id planes, at most 18 actions) are counted without an env; other observations from one
    env built and closed here (uint8 stays uint8, anything else is stored as float32)."""
    capacity = args.clear_buffer_frames // args.unroll_length
    settings = EnvSettings.from_args(args, regimes=regimes)
    if settings.atari and args.obs_mode == "dqn":
        shape, itemsize, n_actions = (args.buffer_window_size + len(settings.task_ids), 84, 84), 1, 18
    else:
        env = make_env(settings, 0, regimes[0] if regimes else args.modifs)()
        try:
            space = env.observation_space
            shape, itemsize = space.shape, 1 if space.dtype == np.uint8 else 4
            n_actions = int(env.action_space.n)
        finally:
            env.close()
    return capacity * replay_unroll_bytes(args.unroll_length, shape, itemsize, n_actions)


def check_replay_disk(args: Args, regimes: Sequence[str], run_dir: str) -> None:
    """CLEAR keeps its replay buffer in a preallocated file under <run>/replay (a full disk fails at the start, never
    in the middle of a write to the mapped file) and a copy of it in every checkpoint: the disk must hold both."""
    need = 2 * replay_buffer_bytes(args, regimes)
    folder = os.path.abspath(run_dir)
    have = 0  # a resumed run overwrites its own buffer files
    for f in glob.glob(os.path.join(folder, "replay", "*.npy")):
        have += os.path.getsize(f)
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    free = shutil.disk_usage(folder).free + have
    if need > free:
        raise UserError(f"clear_buffer_frames: a replay buffer of {args.clear_buffer_frames} frames takes "
                        f"{need / 2e9:.2f} GB on disk, {need / 1e9:.2f} GB with the copy a checkpoint holds; only "
                        f"{free / 1e9:.2f} GB free under {folder!r}")


def check_creatable(folder: str) -> None:
    """Fail when `folder` could not be created or written, creating nothing: a probe folder is made and removed in
    its nearest existing parent (permission bits alone would pass /proc or a read-only mount for root)."""
    parent = os.path.abspath(folder)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UserError(f"output folder {folder!r} is not writable: {parent!r} is a file")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=parent))
    except OSError as e:
        if e.errno in FULL_DISK_ERRNOS:  # not bad input: the run can start once space is back (exit 1)
            raise StorageError(folder, e) from None
        raise UserError(f"output folder {folder!r} is not writable: {e.strerror or e} in {parent!r}") from None


def check_output_folders(args: Args, run_dir: str) -> None:
    """Every folder the run will write: the run directory (checkpoints, videos and W&B files by default go below
    it) and --wandb_dir; checked before the configuration is printed."""
    check_creatable(run_dir)
    if args.track and args.wandb_dir:
        check_creatable(args.wandb_dir)


def preflight(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None,
              granularity: Optional[int] = None) -> Plan:
    """Every check that needs no env and creates nothing: curriculum, length, modification names, action space,
    output folders. Also resolves the effective --exp_name and --run_name. Runs before the configuration is printed
    (so bad input is one line) and again in `start_run`."""
    granularity = granularity_of(args) if granularity is None else granularity
    if not args.exp_name:  # recorded in config.json, checkpoints and W&B as the name actually used
        args.exp_name = args.architecture.lower()
    resolve_backend_defaults(args)
    if args.obs_mode == "ori" and args.backend != "Gymnasium":
        raise UserError("obs_mode: 'ori' (raw RGB frames) is for evaluation videos; train with dqn or obj")
    saved = resume_state.get("factory_state") if resume_state is not None else None
    saved_granularity = saved.get("granularity") if isinstance(saved, dict) else None
    factory = build_factory(args, curriculum, granularity,
                            saved_granularity if isinstance(saved_granularity, int) and saved_granularity > 0 else None)
    total = resolve_total(args, factory, granularity)
    regimes = check_modifications(args, factory, [args.modifs, *parse_eval_modifs(args.eval_modifs)])
    if SPECS[args.architecture].supports(CLEAR_REPLAY):
        run_dir = (ckpt_lib.run_dir_of(resume_state["path"]) if resume_state is not None
                   else os.path.join(args.runs_dir, args.run_name or default_run_name(args)))
        check_replay_disk(args, regimes, run_dir)
    if args.ewc != "none" and len(regimes) < 2:  # EWC consolidates at task boundaries
        raise UserError(f"ewc: the curriculum never switches (its regimes: {regimes}), so EWC would never consolidate"
                        f"; use --ewc none or a curriculum with task switches")
    for flag, on in (("redo", args.redo and not args.redo_every), ("reset_layers", args.reset_layers and not args.reset_every)):
        if on and len(regimes) < 2:  # at switches only: it would never act
            raise UserError(f"{flag}: acts at regime switches, but the curriculum never switches (its regimes: "
                            f"{regimes}); give --{flag.split('_')[0]}_every N or a curriculum with task switches")
    if args.plasticity_injection == "at_switches" and len(regimes) < 2:
        raise UserError(f"plasticity_injection: at_switches, but the curriculum never switches (its regimes: "
                        f"{regimes}); use every or step, or a curriculum with task switches")
    if args.plasticity_injection == "step" and args.injection_step >= total:
        raise UserError(f"injection_step: {args.injection_step} is not before the run's end ({total} steps)")
    if SPECS[args.architecture].supports(NEEDS_SWITCHES) and len(regimes) < 2:  # e.g. P&C's per-task phases
        raise UserError(f"architecture: {args.architecture} needs task boundaries, but the curriculum never switches (its regimes: "
                        f"{regimes}); use a curriculum with task switches")
    # action spaces: validate_args (continual.envs.backends.validate_action_space) has checked them
    if args.capture_video:
        try:
            import moviepy  # noqa: F401
        except ImportError:
            raise UserError("capture_video: video support needs moviepy (pip install moviepy)") from None
    if resume_state is not None:
        try:
            factory.load_state_dict(resume_state["factory_state"])
        except FactoryConfigError as e:
            raise UserError(f"checkpoint does not match its curriculum: {e}") from None
        try:
            check_output_folders(args, ckpt_lib.checkpoint_dir(ckpt_lib.run_dir_of(resume_state["path"])))
        except StorageError as e:
            e.last_checkpoint, e.last_step = resume_state["path"], resume_state["global_step"]
            raise
    else:
        if args.run_name is None:
            args.run_name = default_run_name(args)
        path = os.path.join(args.runs_dir, args.run_name)
        if os.path.lexists(path):
            raise UserError(f"run directory {path!r} already exists; pass --resume {path} to continue it, or another "
                            f"--run_name")
        check_output_folders(args, path)
    return Plan(factory, total, regimes)


def start_run(args: Args, curriculum: Curriculum, resume_state: Optional[dict], granularity: int
              ) -> RunSession:
    """Everything before the first env: validate, create or reopen the run directory, seed, open the logger."""
    try:
        return _start_run(args, curriculum, resume_state, granularity)
    except StorageError as e:  # a full disk already: the checkpoint being resumed is the last one
        if resume_state is not None and e.last_checkpoint is None:
            e.last_checkpoint, e.last_step = resume_state["path"], resume_state["global_step"]
        raise


def _start_run(args: Args, curriculum: Curriculum, resume_state: Optional[dict], granularity: int) -> RunSession:
    plan = preflight(args, curriculum, resume_state, granularity)
    factory, total, regimes = plan.factory, plan.total, plan.regimes
    retain_freed_memory()
    if resume_state is not None:
        run_dir = ckpt_lib.run_dir_of(resume_state["path"])
        check_writable(run_dir)
        ckpt_lib.remove_partial_writes(ckpt_lib.checkpoint_dir(run_dir))
        ckpt_lib.set_aside_corrupt(resume_state.get("skipped_corrupt", []))
    else:
        run_dir = create_run_dir(args.runs_dir, args.run_name)
    config = {**args_to_dict(args), "modification_factory": curriculum.factory,
              "modification_factory_kwargs": curriculum.kwargs, "resolved_total_timesteps": total,
              "possible_modifications": regimes, "library_version": ckpt_lib.LIBRARY_VERSION,
              "code_revision": code_revision()}
    if resume_state is None:
        write_json(os.path.join(run_dir, "config.json"), config)
    np_rng = seed_everything(args.seed, args.torch_deterministic)
    logger = RunLogger(run_dir, config, track=args.track, wandb_project=args.wandb_project_name,
                       wandb_entity=args.wandb_entity, wandb_dir=args.wandb_dir, run_name=args.run_name or "",
                       wandb_group=args.wandb_group,
                       wandb_tags=[t.strip() for t in args.wandb_tags.split(",") if t.strip()],
                       resume_step=resume_state["global_step"] if resume_state else None,
                       resume_modification=resume_state["modification"] if resume_state else None,
                       wandb_id=resume_state.get("wandb_id") if resume_state else None)
    # every start, resumes too: which code and which machine produced the steps from here on
    logger.record("start", resume_state["global_step"] if resume_state else 0, resumed=resume_state is not None,
                  code_revision=config["code_revision"], library_version=ckpt_lib.LIBRARY_VERSION, machine=machine())
    print(f"run directory: {run_dir}")
    note = rounding_note(args, factory, granularity, total)
    if note:
        print(note)
    return RunSession(args, curriculum, factory, total, run_dir, logger, regimes, np_rng, resume_state, granularity)


def print_config(args: Args, curriculum: Curriculum, resume_state: Optional[dict] = None) -> None:
    """Validate everything `preflight` can (bad input stays one line, `error: ...`), then print the start-of-run
    summary (`run_summary`); with --verbose every setting first (config.json in the run directory holds them all
    either way)."""
    plan = preflight(args, curriculum, resume_state)
    if args.verbose:
        items = args_to_dict(args)
        width = max(map(len, items))
        print("resolved configuration:")
        for k, v in items.items():
            print(f"  {k:<{width}} = {v!r}")
        if curriculum.factory:
            print(f"  {'curriculum':<{width}} = {curriculum.factory}")
    for line in run_summary(args, curriculum, plan, resume_state):
        print(line)


# set for every run by the library, not by the user: not listed among the settings that differ from the defaults
SUMMARY_SKIPPED = ("run_name", "resume", "config", "verbose")


def resolved_defaults(args: Args) -> Args:
    """The settings this run would have with no flag and no config file but its architecture, game and backend,
    resolved as a run resolves them (exp_name, reward scaling, observation mode, gradient clip)."""
    ref = default_args(args.architecture)
    ref.env_id, ref.backend = args.env_id, args.backend
    ref.exp_name = ref.architecture.lower()
    resolve_backend_defaults(ref)
    ref.max_grad_norm = ref.grad_clip_norm()
    return ref


def _wrap(items: Sequence[str], indent: str = "  ", width: int = 110) -> list[str]:
    lines, line = [], ""
    for item in items:
        if line and len(indent) + len(line) + 2 + len(item) > width:
            lines.append(indent + line + ",")
            line = item
        else:
            line = f"{line}, {item}" if line else item
    return lines + ([indent + line] if line else [])


def run_summary(args: Args, curriculum: Curriculum, plan: Plan, resume_state: Optional[dict] = None) -> list[str]:
    """The start of a run in ~10 lines: what trains on what and where, how long, the curriculum, evaluation, and the
    settings that differ from the architecture's defaults (config.json holds every setting; --verbose prints them)."""
    device = "cuda" if torch.cuda.is_available() and args.cuda else "cpu"
    granularity = granularity_of(args)
    iterations = plan.total // granularity
    out = [f"{args.architecture} on {args.env_id} ({args.backend}), seed {args.seed}, device {device}"
           + (f", config {args.config}" if args.config else "")]
    if resume_state is not None:
        out.append(f"resuming {ckpt_lib.run_dir_of(resume_state['path'])} at step {resume_state['global_step']:,}")
    out.append(f"steps: {plan.total:,} ({iterations:,} iteration{'s' * (iterations != 1)} of {granularity:,} steps, "
               f"{args.num_envs} env{'s' * (args.num_envs != 1)})")
    shown = [repr(r) if r else "'' (unmodified)" for r in plan.regimes[:4]]
    more = f", ... ({len(plan.regimes)} in all)" if len(plan.regimes) > 4 else ""
    if curriculum.factory:
        out.append(f"curriculum: {curriculum.factory}, regimes {', '.join(shown)}{more}")
    else:
        out.append(f"curriculum: none, modifications {shown[0] if shown else repr(args.modifs)} throughout")
    if args.eval_every > 0 or args.eval_at_switches or args.eval_final_only:
        when = ", ".join(w for w in (f"every {args.eval_every:,} steps" if args.eval_every else "",
                                     "before every switch" if args.eval_at_switches else "",
                                     "at the end only" if args.eval_final_only else "") if w)
        cap = args.eval_max_episode_steps or args.max_episode_steps
        out.append(f"evaluation: {when}, {args.eval_episodes} game{'s' * (args.eval_episodes != 1)} per regime"
                   + (f" capped at {cap} steps" if cap else " (whole games)"))
    ref = resolved_defaults(args)
    changed = [f"{f.name}={getattr(args, f.name)!r}" for f in dataclasses.fields(Args)
               if f.name not in SUMMARY_SKIPPED and getattr(args, f.name) != getattr(ref, f.name)]
    if changed:
        out.append(f"settings that differ from {args.architecture}'s defaults:")
        out += _wrap(changed)
    out.append("every setting: config.json in the run directory (--verbose prints them here)")
    return out


@exit_on_user_error
def agent_main(train: Callable[[Args, Curriculum, Optional[dict]], str], architecture: str, doc: str,
               argv: Optional[Sequence[str]] = None) -> str:
    """`python agents/<name>.py`: flags (or --resume of the agent's own checkpoint), everything validated and the
    configuration printed, then `train`; bad input is one line and exit 2, a training failure exit 1."""
    description = f"{doc.splitlines()[0]} ({defaults_line(architecture)})"  # its own defaults (continual/specs.py)
    args, curriculum, resume_state = parse_train_args(argv, description=description, architecture=architecture)
    print_config(args, curriculum, resume_state)  # validates everything first
    return train(args, curriculum, resume_state)
