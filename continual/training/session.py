"""RunSession: what happens around an agent's loop once the run has started: regime switches, episode and iteration
logging, checkpoints (after a crash or a signal, and those its callbacks request: periodic, time-based, at switches),
the end of the run. What else happens at these moments is a callback (`continual.training.callbacks`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import sys
import time
from typing import Any, Callable, Optional, TypeVar

import numpy as np
import torch

from continual.config.args import Args
from continual.config.loading import Curriculum, args_to_dict
from continual.curricula import ModificationFactory
from continual.envs.vector import regime_slug, switch_seed
from continual.errors import StorageError, TrainingError
from continual.testing.faults import inject
from continual.training import checkpoint as ckpt_lib
from continual.training.callbacks import (
    Callback,
    CheckpointCallback,
    SwitchCheckpointCallback,
    SwitchEvent,
    WandbCallback,
)
from continual.training.tracking import RunLogger

C = TypeVar("C", bound=Callback)


class RunSession:
    """State shared by the agent files: factory, logger, per-regime statistics, callbacks, checkpoints."""

    def __init__(self, args: Args, curriculum: Curriculum, factory: ModificationFactory, total: int,
                 run_dir: str, logger: RunLogger, regimes: list[str], np_rng: np.random.Generator,
                 resume_state: Optional[dict]):
        self.args, self.curriculum, self.factory = args, curriculum, factory
        self.total_timesteps, self.run_dir, self.logger = total, run_dir, logger
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
        self.save_fn: Optional[Callable[[], dict]] = None
        self.last_save_time = time.monotonic()  # the clock of --checkpoint_minutes starts with the (resumed) run
        # the newest checkpoint on disk (path, step): what a storage fault's message points --resume at
        self.last_checkpoint: Optional[tuple[str, int]] = (
            (resume_state["path"], resume_state["global_step"]) if resume_state else None)
        self.callbacks: list[Callback] = []
        # stays last (add_callback inserts before it): its wall-time clock counts the iteration's other callbacks
        self._periodic = CheckpointCallback(args.checkpoint_every, args.checkpoint_minutes)
        if args.track:
            self.add_callback(WandbCallback(videos=args.capture_video, checkpoints=args.save_agent_wandb))
        if args.save_agent_with_switch:
            self.add_callback(SwitchCheckpointCallback())
        self.add_callback(self._periodic)
        self.stop_signal: Optional[int] = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def restore_torch_rng(self) -> None:
        """Resumed runs: put torch's RNG back as the checkpoint had it. Call once the networks are built and loaded,
        just before the training loop (building them drew from it after `start_run` had restored it)."""
        if self.resume_state is not None:
            torch.set_rng_state(self.resume_state["rng"]["torch"])

    def add_callback(self, callback: C) -> C:
        """Register a callback (called in the order registered, the periodic checkpoints last); returns it."""
        callback.init_callback(self)
        at = self.callbacks.index(self._periodic) if self._periodic in self.callbacks else len(self.callbacks)
        self.callbacks.insert(at, callback)
        return callback

    def _on_signal(self, signum: int, frame: Any) -> None:
        # finish the iteration in progress, then checkpoint and exit (a second signal stops at once)
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
        for cb in self.callbacks:
            cb.on_training_end()
        kind = "final" if self.stop_signal is None else "interrupted"
        path = self.save(f"{kind}__step{self.global_step}")
        print(f"{kind} checkpoint: {path}")
        if kind == "final":  # CleanRL's model file: the policy's state_dict alone, at runs/<run_name>/<exp_name>...
            policy = ckpt_lib.save_state_dict(ckpt_lib.final_policy_path(self.run_dir, self.args),
                                              self._last_payload["model"])
            print(f"model saved to {policy}")
        return path

    # --- regimes -------------------------------------------------------------------------------------------------
    def regime_index(self, modification: str) -> int:
        return self.regimes.index(modification) if modification in self.regimes else -1

    def next_modification(self) -> str:
        return self.factory.get_modification(self.global_step)

    def maybe_switch(self, envs):
        """Ask the curriculum; on a new string tell the callbacks (on_switch_start), switch the envs in place, tell them
        again (on_switch_end).

        Returns the envs' new first observations after a switch, else None.
        """
        new = self.next_modification()
        if new == self.modification:
            return None
        event = SwitchEvent(self.modification, new, self.global_step, self.switches + 1)
        for cb in self.callbacks:
            cb.on_switch_start(event)
        self.flush_checkpoints()  # before-switch checkpoints hold the pre-switch state: resuming redoes the switch
        self.switches += 1
        inject("switch")
        obs, _ = envs.switch(new, self.global_step, seed=switch_seed(self.args.seed, self.global_step))
        self.modification = new
        self.logger.record("switch", self.global_step, modification=new, previous=event.old,
                           regime=self.regime_index(new), switches=self.switches)
        self.logger.text("charts/modification", new or "(none)", self.global_step)
        for cb in self.callbacks:
            cb.on_switch_end(event)
        return obs

    # --- statistics ----------------------------------------------------------------------------------------------
    def episode(self, ret: float, length: int, step: int, modification: Optional[str] = None,
                env: Optional[int] = None) -> None:
        """A finished game; `modification` defaults to the current regime (IMPALA passes the regime of the unroll).
        `env`: the index of the env that played it (two envs can end equal games in the same vector step)."""
        regime = self.modification if modification is None else modification
        self.recent_returns.append(ret)
        self.logger.scalars({"charts/episodic_return": ret, "charts/episodic_length": length,
                             f"episodic_return_by_modif/{regime_slug(regime or '')}": ret}, step)
        extra = {} if env is None else {"env": env}
        self.logger.record("episode", step, modification=regime, **{"return": ret, "length": length}, **extra)

    def sps(self) -> int:
        return int((self.global_step - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def end_iteration(self, iteration: int, scalars: dict[str, float]) -> None:
        scalars = {**scalars, "charts/SPS": self.sps(), "charts/regime": self.regime_index(self.modification or ""),
                   "charts/switches": self.switches}
        self.logger.scalars(scalars, self.global_step)
        self.logger.record("iteration", self.global_step, iteration=iteration, modification=self.modification,
                           **scalars)
        for cb in self.callbacks:
            cb.on_iteration_end()
        self.flush_checkpoints()
        self._last_iteration_step = self.global_step

    # --- checkpoints ---------------------------------------------------------------------------------------------
    def request_checkpoint(self, name: str) -> None:
        """Written at the end of the switch or iteration in progress (`flush_checkpoints`)."""
        self._checkpoint_requests.append(name)

    @property
    def checkpoint_requested(self) -> bool:
        return bool(self._checkpoint_requests)

    def flush_checkpoints(self) -> None:
        while self._checkpoint_requests:
            self.save(self._checkpoint_requests.pop(0))

    def save(self, name: str) -> str:
        assert self.save_fn is not None, "the agent must set session.save_fn"
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
            **self.save_fn(),
        }
        path = ckpt_lib.save_checkpoint(os.path.join(self.checkpoint_dir, name + ckpt_lib.SUFFIX), payload)
        self.last_checkpoint = (path, self.global_step)
        self.last_save_time = time.monotonic()
        self._last_payload = payload
        if name.startswith("periodic__"):
            ckpt_lib.prune_periodic(self.checkpoint_dir, self.args.keep_checkpoints)
        for cb in self.callbacks:
            cb.on_checkpoint(path, name)
        return path

    def close(self) -> None:
        try:
            for cb in self.callbacks:
                cb.on_close()
        finally:
            self.logger.close()
