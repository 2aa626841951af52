"""RunSession: what happens around an agent's loop once the run has started: regime switches and their hooks,
episode and iteration logging, checkpoints (periodic, time-based, at switches, after a crash or a signal), the
end of the run.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import sys
import time
from typing import Any, Callable, Optional

import numpy as np

from continual.config.args import Args
from continual.config.loading import Curriculum, args_to_dict
from continual.curricula import ModificationFactory
from continual.envs.vector import regime_slug
from continual.errors import TrainingError
from continual.testing.faults import inject
from continual.training import checkpoint as ckpt_lib
from continual.training.tracking import RunLogger


# flags that may differ from the checkpoint's when resuming; the rest would change the run being continued
@dataclasses.dataclass
class SwitchEvent:
    old: str
    new: str
    global_step: int
    count: int  # switches so far, this one included


SwitchHook = Callable[["RunSession", SwitchEvent], None]


class RunSession:
    """State shared by the agent files: factory, logger, per-regime statistics, switch hooks, checkpoints."""

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
        self.before_switch: list[SwitchHook] = []
        self.after_switch: list[SwitchHook] = []
        # hooks taking the session: after each iteration's logging, before the final checkpoint, at close
        self.iteration_hooks: list[Callable[["RunSession"], None]] = []
        self.finish_hooks: list[Callable[["RunSession"], None]] = []
        self.close_hooks: list[Callable[["RunSession"], None]] = []
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=20)
        self.start_time = time.time()
        self.start_step = self._last_iteration_step = self.global_step
        self.checkpoint_dir = ckpt_lib.checkpoint_dir(run_dir)
        self.video_dir = os.path.join(run_dir, "videos")
        if args.save_agent_with_switch:
            self.before_switch.append(lambda session, ev: session.request_checkpoint(
                f"switch__{regime_slug(ev.old)}__step{ev.global_step}"))
        self._checkpoint_requests: list[str] = []
        self.save_fn: Optional[Callable[[], dict]] = None
        self._last_save_time = time.monotonic()  # the clock of --checkpoint_minutes starts with the (resumed) run
        self.stop_signal: Optional[int] = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

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
        themselves are broken)."""
        saved = self.save_after_failure() if getattr(error, "weights_ok", True) else None
        where = f"saved {saved}" if saved else f"the newest checkpoint in {self.checkpoint_dir} is the last good one"
        return TrainingError(f"{error}; {where}")

    def finish(self) -> str:
        """Final checkpoint: `final__step<N>` after a complete run, `interrupted__step<N>` after SIGINT/SIGTERM
        (then the process exits with 128 + signal number, as a shell would report it)."""
        for hook in self.finish_hooks:
            hook(self)
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
        """Ask the curriculum; on a new string run the before-hooks, switch the envs in place, run the after-hooks.

        Returns the envs' new first observations after a switch, else None.
        """
        new = self.next_modification()
        if new == self.modification:
            return None
        event = SwitchEvent(self.modification, new, self.global_step, self.switches + 1)
        for hook in self.before_switch:
            hook(self, event)
        self.flush_checkpoints()  # before-switch checkpoints hold the pre-switch state: resuming redoes the switch
        self.switches += 1
        inject("switch")
        obs, _ = envs.switch(new, self.global_step)
        self.modification = new
        self.logger.record("switch", self.global_step, modification=new, previous=event.old,
                           regime=self.regime_index(new), switches=self.switches)
        self.logger.text("charts/modification", new or "(none)", self.global_step)
        for hook in self.after_switch:
            hook(self, event)
        return obs

    # --- statistics ----------------------------------------------------------------------------------------------
    def episode(self, ret: float, length: int, step: int, modification: Optional[str] = None) -> None:
        """A finished game; `modification` defaults to the current regime (IMPALA passes the regime of the unroll)."""
        regime = self.modification if modification is None else modification
        self.recent_returns.append(ret)
        self.logger.scalars({"charts/episodic_return": ret, "charts/episodic_length": length,
                             f"episodic_return_by_modif/{regime_slug(regime or '')}": ret}, step)
        self.logger.record("episode", step, modification=regime, **{"return": ret, "length": length})

    def sps(self) -> int:
        return int((self.global_step - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def end_iteration(self, iteration: int, scalars: dict[str, float]) -> None:
        scalars = {**scalars, "charts/SPS": self.sps(), "charts/regime": self.regime_index(self.modification or ""),
                   "charts/switches": self.switches}
        self.logger.scalars(scalars, self.global_step)
        self.logger.record("iteration", self.global_step, iteration=iteration, modification=self.modification,
                           **scalars)
        if self.args.capture_video:
            self.logger.log_new_videos(self.video_dir, self.global_step)
        for hook in self.iteration_hooks:
            hook(self)
        every, minutes = self.args.checkpoint_every, self.args.checkpoint_minutes
        due_steps = every and self.global_step // every != self._last_iteration_step // every
        # wall time since the last checkpoint of any kind: by default a crash (SIGKILL, OOM) loses at most minutes
        due_time = minutes and time.monotonic() - self._last_save_time >= 60.0 * minutes
        if (due_steps or due_time) and not self._checkpoint_requests:
            self.request_checkpoint(f"periodic__step{self.global_step}")
        self.flush_checkpoints()
        self._last_iteration_step = self.global_step

    # --- checkpoints ---------------------------------------------------------------------------------------------
    def request_checkpoint(self, name: str) -> None:
        self._checkpoint_requests.append(name)

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
        self._last_save_time = time.monotonic()
        self._last_payload = payload
        if name.startswith("periodic__"):
            ckpt_lib.prune_periodic(self.checkpoint_dir, self.args.keep_checkpoints)
        if self.args.save_agent_wandb:
            self.logger.log_artifact(path, f"{os.path.basename(self.run_dir)}__{name}".replace("=", "-"),
                                     {"global_step": self.global_step, "modification": self.modification})
        return path

    def close(self) -> None:
        try:
            for hook in self.close_hooks:
                hook(self)
            if self.args.capture_video:  # the last video is written when the envs close, after the last iteration
                self.logger.log_new_videos(self.video_dir, self.global_step)
        finally:
            self.logger.close()
