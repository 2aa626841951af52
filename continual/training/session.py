"""RunSession: what happens around an agent's loop once the run has started: the state a checkpoint holds and its
restoration on resume, regime switches, episode and iteration logging, checkpoints (after a crash or a signal, and
those its extensions request: periodic, time-based, at switches), the end of the run. What else happens at these
moments is an extension (`continual.training.extensions`): the run's own (`continual.training.callbacks`) and the
continual methods (`continual.methods`).

An agent file is its algorithm plus a few session calls (docs/extending.md):

    session = start_run(args, curriculum, resume_state, granularity=batch_size)
    envs = session.closing(make_vector_env(...))       # closed when the run ends, whatever the reason
    with session.running():                            # final checkpoint, failures, close, exit code
        agent, optimizer = ...
        session.register("model", agent.state_dict, agent.load_state_dict)   # saved; loaded now when resuming
        session.register("optimizer", optimizer.state_dict, optimizer.load_state_dict)
        for iteration in session.iterations():         # RNGs restored first; progress bar; stops after a signal
            ...
            session.end_iteration(iteration, {...})
    return session.run_dir
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
import sys
import time
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

import numpy as np

from continual.config.args import Args
from continual.config.loading import Curriculum, args_to_dict
from continual.console import Progress
from continual.curricula import ModificationFactory
from continual.envs.vector import regime_slug, switch_seed
from continual.errors import StorageError, TrainingError, UserError
from continual.training import checkpoint as ckpt_lib
from continual.training.callbacks import CheckpointCallback, SwitchCheckpointCallback, WandbCallback
from continual.training.extensions import Extension, Extensions, SwitchEvent
from continual.training.remedies import idle_remedies
from continual.training.tracking import RunLogger

E = TypeVar("E", bound=Extension)
T = TypeVar("T")

# what the session itself writes into every checkpoint (an agent registers the rest)
SESSION_KEYS = ("format_version", "library_version", "architecture", "args", "curriculum", "global_step", "switches",
                "modification", "regimes", "factory_state", "rng", "wandb_id")
# without them a checkpoint can be neither evaluated (eval.py) nor resumed (checkpoint.REQUIRED_KEYS, RESUME_KEYS)
REQUIRED_STATE = ("model", "optimizer")


def resume_command(run_dir: str) -> str:
    """The command that continues a run from its newest checkpoint (any architecture)."""
    import shlex

    return f"python continual_training_example.py --resume {shlex.quote(run_dir)}"


class StateRegistry:
    """The named pieces of state an agent registers: each is saved under its name in every checkpoint and, when the
    run resumes, loaded back at once from the checkpoint being resumed (`resume_state`)."""

    def __init__(self, resume_state: Optional[dict] = None):
        self.resume_state = resume_state
        self._save: dict[str, Callable[[], Any]] = {}

    def register(self, name: str, state_dict: Callable[[], Any],
                 load_state_dict: Optional[Callable[[Any], None]] = None, *, optional: bool = False) -> None:
        """Save `state_dict()` under `name` in every checkpoint. Resuming, `load_state_dict(saved)` runs now: register
        in the order the states must load (the model before its optimizer). `optional`: a checkpoint may lack it or
        hold None (older checkpoints, a feature that was off), and then nothing is loaded; otherwise its absence is
        a one-line error. Without `load_state_dict` the value is saved only (what describes the policy to eval.py)."""
        if name in self._save or name in SESSION_KEYS:
            why = "is already registered" if name in self._save else "is written by the session itself"
            raise ValueError(f"checkpoint state {name!r} {why}")
        self._save[name] = state_dict
        if self.resume_state is None or load_state_dict is None:
            return
        saved = self.resume_state.get(name)
        if saved is not None:
            load_state_dict(saved)
        elif not optional:
            raise UserError(f"checkpoint {self.resume_state.get('path', '')!r} cannot be resumed: it holds no "
                            f"{name!r} (written by another version of the agent?)")

    def missing(self, required: Sequence[str] = REQUIRED_STATE) -> list[str]:
        return [name for name in required if name not in self._save]

    def state_dicts(self) -> dict[str, Any]:
        """Every registered state, as a checkpoint holds them."""
        return {name: fn() for name, fn in self._save.items()}


class RunSession:
    """What an agent's loop drives: the state it registers (checkpointed, restored on resume), the loop's iterations
    and tail (`iterations`, `running`), the curriculum, logging, extensions, checkpoints."""

    def __init__(self, args: Args, curriculum: Curriculum, factory: ModificationFactory, total: int,
                 run_dir: str, logger: RunLogger, regimes: list[str], np_rng: np.random.Generator,
                 resume_state: Optional[dict], granularity: int = 1):
        self.args, self.curriculum, self.factory = args, curriculum, factory
        self.total_timesteps, self.run_dir, self.logger = total, run_dir, logger
        self.granularity = granularity  # agent steps per iteration
        self.regimes = regimes
        self.np_rng = np_rng
        self.resume_state = resume_state
        self.global_step = resume_state["global_step"] if resume_state else 0
        self.switches = resume_state.get("switches", 0) if resume_state else 0
        # the regime of the last iteration (resumed) or of step 0; envs are built with it
        self.modification: str = resume_state["modification"] if resume_state else factory.get_modification(0)
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=20)
        self.start_time = time.time()
        self.start_step = self._last_iteration_step = self.global_step
        self.checkpoint_dir = ckpt_lib.checkpoint_dir(run_dir)
        self.video_dir = os.path.join(run_dir, "videos")
        self._checkpoint_requests: list[str] = []
        self.registry = StateRegistry(resume_state)
        self._closers: list[Callable[[], None]] = []
        self.last_save_time = time.monotonic()  # the clock of --checkpoint_minutes starts with the (resumed) run
        # the newest checkpoint on disk (path, step): what a storage fault's message points --resume at
        self.last_checkpoint: Optional[tuple[str, int]] = (
            (resume_state["path"], resume_state["global_step"]) if resume_state else None)
        self.extensions = Extensions()
        # stays last (add_extension inserts before it): its wall-time clock counts the iteration's other extensions
        self._periodic = CheckpointCallback(args.checkpoint_every, args.checkpoint_minutes)
        if args.track:
            self.add_extension(WandbCallback(videos=args.capture_video, checkpoints=args.save_agent_wandb))
        if args.save_agent_with_switch:
            self.add_extension(SwitchCheckpointCallback())
        self.add_extension(self._periodic)
        self.stop_signal: Optional[int] = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.on_signal)

    # --- the state a checkpoint holds --------------------------------------------------------------------------------
    @property
    def resuming(self) -> bool:
        return self.resume_state is not None

    def register(self, name: str, state_dict: Callable[[], Any],
                 load_state_dict: Optional[Callable[[Any], None]] = None, *, optional: bool = False) -> None:
        """Checkpoint `name`: see `StateRegistry.register` (resuming, the saved state is loaded now)."""
        self.registry.register(name, state_dict, load_state_dict, optional=optional)

    def describe_policy(self, agent: Any) -> None:
        """Save with every checkpoint what describes the policy network: obs_shape, n_actions, obs_scale, and
        goal_dim and continuous where the network has them."""
        self.register("obs_shape", lambda: list(agent.obs_shape))
        for name in ("n_actions", "obs_scale", "goal_dim", "continuous"):
            if hasattr(agent, name):
                self.register(name, lambda name=name: getattr(agent, name))

    def restore_rng(self) -> None:
        """Resumed runs: torch's, Python's and the session's numpy generator as the checkpoint had them. `iterations`
        calls it before the first iteration, once everything is built and loaded (building networks draws from
        torch's generator)."""
        if self.resume_state is not None:
            ckpt_lib.restore_rng_state(self.resume_state["rng"], self.np_rng)

    # --- the loop and its tail -----------------------------------------------------------------------------------
    @property
    def num_iterations(self) -> int:
        return self.total_timesteps // self.granularity

    def closing(self, thing: T) -> T:
        """Close `thing` (`thing.close()`, or `thing()` for a function) when the run ends, whatever the reason, before
        the extensions' on_close; the newest first. Returns it."""
        self._closers.append(getattr(thing, "close", thing))
        return thing

    def iterations(self) -> Iterator[int]:
        """The loop's iteration numbers, 1 to `num_iterations` (a resumed run goes on after its checkpoint's). Before
        the first: the required state must be registered, and the RNGs are restored (`restore_rng`). After each:
        the progress bar; after SIGINT/SIGTERM the loop ends (`running` then writes the interrupted checkpoint)."""
        missing = self.registry.missing()
        if missing:
            raise RuntimeError(f"the agent registered no {', '.join(map(repr, missing))} state (session.register): "
                               f"its checkpoints could be neither evaluated nor resumed")
        self.restore_rng()
        progress = Progress(self, enabled=self.args.progress_bar)
        for iteration in range(self.global_step // self.granularity + 1, self.num_iterations + 1):
            yield iteration
            progress.update()
            if self.stop_signal is not None:
                break
        progress.close()

    @contextlib.contextmanager
    def running(self, interrupted_by: tuple[type[TrainingError], ...] = ()) -> Iterator["RunSession"]:
        """The tail of every run, around the agent's setup and loop. At the end of the block: the final checkpoint
        (`finish`). A TrainingError (a dead env worker, a NaN loss caught before the step, a full disk) saves the
        last completed iteration and is raised again as one line (`failure`); after a signal, an error of a type in
        `interrupted_by` is the interruption itself (IMPALA: the signal reached its actors too). Whatever happens:
        what `closing` was given, then the extensions' on_close and the logger; after SIGINT/SIGTERM the process
        exits with 128 + the signal number."""
        try:
            try:
                yield self
            except TrainingError as e:
                if not (isinstance(e, interrupted_by) and self.stop_signal is not None):
                    raise
            self.finish()
        except TrainingError as e:
            raise self.failure(e) from None
        finally:
            try:
                while self._closers:
                    self._closers.pop()()
            finally:
                self.close()
            if self.stop_signal is not None:
                raise SystemExit(128 + self.stop_signal)

    def add_extension(self, extension: E) -> E:
        """Add an extension (called in the order added, the periodic checkpoints last); its state, when it has a
        `state_key`, joins every checkpoint (a resumed run loads it now). Returns it."""
        extension.attach(self)
        self.extensions.add(extension, before=self._periodic)
        if extension.state_key is not None:
            self.register(extension.state_key, extension.state_dict, extension.load_state_dict,
                          optional=extension.state_optional)
        return extension

    def on_signal(self, signum: int, frame: Any) -> None:
        """The SIGINT/SIGTERM handler: finish the iteration in progress, then checkpoint and exit (a second signal
        stops at once). A process that drives several sessions installs one handler that calls each one's."""
        if self.stop_signal is not None:
            raise KeyboardInterrupt
        self.stop_signal = signum
        print(f"\nreceived signal {signum}: saving a checkpoint after this iteration", file=sys.stderr)

    def save_after_failure(self) -> Optional[str]:
        """Checkpoint the last completed iteration after a fault (the rollout in progress is dropped)."""
        self.global_step = self._last_iteration_step
        try:
            return self.save(f"crash__step{self.global_step}")
        except Exception:  # the fault may be the disk itself
            return None

    def failure(self, error: Exception) -> TrainingError:
        """The error to raise after a run-stopping fault, once the last good state is saved (unless the weights
        themselves are broken). A storage fault saves nothing more (the disk is the problem): its message names the
        newest checkpoint, which is intact (checkpoints are written atomically)."""
        if isinstance(error, StorageError):
            return self.storage_failure(error)
        saved = self.save_after_failure() if getattr(error, "weights_ok", True) else None
        where = f"saved {saved}" if saved else f"the newest checkpoint in {self.checkpoint_dir} is the last good one"
        return TrainingError(f"{error}; {where}")

    def storage_failure(self, error: StorageError) -> StorageError:
        """`error` with the newest checkpoint filled in."""
        if error.last_checkpoint is None and self.last_checkpoint is not None:
            error.last_checkpoint, error.last_step = self.last_checkpoint
        return error

    def finish(self) -> str:
        """Final checkpoint: `final__step<N>` after a complete run, `interrupted__step<N>` after SIGINT/SIGTERM
        (then the process exits with 128 + signal number, as a shell would report it)."""
        self.extensions.on_training_end()
        kind = "final" if self.stop_signal is None else "interrupted"
        path = self.save(f"{kind}__step{self.global_step}")
        print(f"{kind} checkpoint: {path}")
        if kind == "final":  # CleanRL's model file: the policy's state_dict alone, at runs/<run_name>/<exp_name>...
            policy = ckpt_lib.save_state_dict(ckpt_lib.final_policy_path(self.run_dir, self.args),
                                              self._last_payload["model"])
            print(f"model saved to {policy}")
            for note in idle_remedies(self.args, self._last_payload):
                print(f"note: {note}")
        else:
            print(f"continue this run with: {resume_command(self.run_dir)}", flush=True)
        return path

    # --- regimes -------------------------------------------------------------------------------------------------
    def regime_index(self, modification: str) -> int:
        return self.regimes.index(modification) if modification in self.regimes else -1

    def next_modification(self) -> str:
        return self.factory.get_modification(self.global_step)

    def maybe_switch(self, envs):
        """Ask the curriculum; on a new string tell the extensions (on_switch_start), switch the envs in place, tell
        them again (on_switch_end).

        Returns the envs' new first observations after a switch, else None.
        """
        new = self.next_modification()
        if new == self.modification:
            return None
        event = SwitchEvent(self.modification, new, self.global_step, self.switches + 1)
        self.extensions.on_switch_start(event)
        self.flush_checkpoints()  # before-switch checkpoints hold the pre-switch state: resuming redoes the switch
        self.switches += 1
        obs, _ = envs.switch(new, self.global_step, seed=switch_seed(self.args.seed, self.global_step))
        self.modification = new
        self.logger.record("switch", self.global_step, modification=new, previous=event.old,
                           regime=self.regime_index(new), switches=self.switches)
        self.logger.text("charts/modification", new or "(none)", self.global_step)
        self.extensions.on_switch_end(event)
        return obs

    # --- statistics ----------------------------------------------------------------------------------------------
    def episode(self, ret: float, length: int, step: int, modification: Optional[str] = None,
                env: Optional[int] = None) -> None:
        """A finished game; `modification` defaults to the current regime (IMPALA passes the regime of the unroll).
        `env`: the index of the env that played it (two envs can end equal games in the same vector step)."""
        regime = self.modification if modification is None else modification
        self.recent_returns.append(ret)
        # written with the iteration's records: one write per iteration, not per game
        self.logger.scalars_later({"charts/episodic_return": ret, "charts/episodic_length": length,
                                   f"episodic_return_by_modif/{regime_slug(regime or '')}": ret}, step)
        extra = {} if env is None else {"env": env}
        self.logger.record_later("episode", step, modification=regime, **{"return": ret, "length": length}, **extra)

    def sps(self) -> int:
        return int((self.global_step - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def end_iteration(self, iteration: int, scalars: dict[str, float]) -> None:
        scalars = {**scalars, **self.extensions.scalars(),  # EWC's penalty, units recycled, HER's success, ...
                   "charts/SPS": self.sps(), "charts/regime": self.regime_index(self.modification or ""),
                   "charts/switches": self.switches}
        self.logger.scalars(scalars, self.global_step)
        self.logger.record("iteration", self.global_step, iteration=iteration, modification=self.modification,
                           **scalars)
        self.extensions.on_iteration_end()
        self.flush_checkpoints()
        self.extensions.on_iteration_saved()
        self._last_iteration_step = self.global_step

    # --- checkpoints ---------------------------------------------------------------------------------------------
    def request_checkpoint(self, name: str) -> None:
        """Written at the end of the switch or iteration in progress (`flush_checkpoints`)."""
        self._checkpoint_requests.append(name)

    @property
    def checkpoint_requested(self) -> bool:
        return bool(self._checkpoint_requests)

    def checkpoint_minutes_off(self) -> float:
        """Turn this session's --checkpoint_minutes clock off and return its minutes, for a caller that keeps one
        clock for several sessions and requests their periodic checkpoints itself (agents/dqn_seeds.py, with
        CheckpointCallback.due_by_time and .request: its seeds checkpoint at the same step); --checkpoint_every
        stays the session's."""
        minutes, self._periodic.minutes = self._periodic.minutes, 0.0
        return minutes

    def flush_checkpoints(self) -> None:
        while self._checkpoint_requests:
            self.save(self._checkpoint_requests.pop(0))

    def save(self, name: str) -> str:
        missing = self.registry.missing()
        if missing:
            raise RuntimeError(f"cannot checkpoint: the agent registered no {', '.join(map(repr, missing))} state "
                               f"(session.register)")
        payload = {
            "architecture": self.args.architecture,
            "args": args_to_dict(self.args),
            "curriculum": dataclasses.asdict(self.curriculum),
            "global_step": self.global_step,
            "switches": self.switches,
            "modification": self.modification,
            "regimes": self.regimes,
            "factory_state": self.factory.state_dict(),
            "rng": ckpt_lib.rng_state(self.np_rng),
            "wandb_id": self.logger.wandb_id,
            **self.registry.state_dicts(),
        }
        self.logger.flush()  # TensorBoard up to the checkpoint on disk: a resumed run keeps it and purges the rest
        path = ckpt_lib.save_checkpoint(os.path.join(self.checkpoint_dir, name + ckpt_lib.SUFFIX), payload)
        self.last_checkpoint = (path, self.global_step)
        self.last_save_time = time.monotonic()
        self._last_payload = payload
        if name.startswith("periodic__"):
            ckpt_lib.prune_periodic(self.checkpoint_dir, self.args.keep_checkpoints)
        self.extensions.on_checkpoint(path, name)
        return path

    def close(self) -> None:
        try:
            self.extensions.on_close()
        finally:
            self.logger.close()
