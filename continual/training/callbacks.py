"""Callbacks of a run session, in the form of Stable-Baselines3's `common/callbacks.py`: a `Callback` base class
whose events a subclass overrides, registered with `RunSession.add_callback` (which calls `init_callback`), called in
the order registered.

Events (the session calls them; an agent file never does):
  on_switch_start(event)  the curriculum asked for a new regime; the envs still run the old one
  on_switch_end(event)    the envs run the new regime
  on_iteration_end()      an iteration has been logged; checkpoints requested here are written right after
  on_checkpoint(path, name)  a checkpoint was written
  on_training_end()       the last iteration is done (or a signal stopped the run), before the final checkpoint
  on_close()              the run ends, whatever the reason (release processes and files here)

The concrete callbacks of this module are those every run has: periodic/time-based checkpoints, checkpoints at
switches, W&B uploads. Others live next to what they do: `continual.plasticity.shrink_perturb.SwitchRemedies`,
`continual.plasticity.diagnostics.PlasticityMonitor`, `continual.evaluation.continual.ContinualEvaluator`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from continual.envs.vector import regime_slug


@dataclasses.dataclass
class SwitchEvent:
    old: str
    new: str
    global_step: int
    count: int  # switches so far, this one included


class Callback:
    """Base class: override the events you need (each does nothing here)."""

    session: Any  # the continual.training.session.RunSession that registered it (which imports this module)

    def init_callback(self, session: Any) -> None:
        self.session = session

    def on_switch_start(self, event: SwitchEvent) -> None:
        pass

    def on_switch_end(self, event: SwitchEvent) -> None:
        pass

    def on_iteration_end(self) -> None:
        pass

    def on_checkpoint(self, path: str, name: str) -> None:
        pass

    def on_training_end(self) -> None:
        pass

    def on_close(self) -> None:
        pass


class CheckpointCallback(Callback):
    """`periodic__step<N>` every `every` steps (--checkpoint_every) and whenever `minutes` of wall time have passed
    since the last checkpoint of any kind (--checkpoint_minutes: by default a crash, SIGKILL or OOM, loses at most
    that much); the newest `keep` periodic checkpoints are kept (--keep_checkpoints)."""

    def __init__(self, every: int, minutes: float):
        self.every, self.minutes = every, minutes

    def init_callback(self, session: Any) -> None:
        super().init_callback(session)
        self._last_step = session.global_step

    def on_iteration_end(self) -> None:
        s = self.session
        due_steps = self.every and s.global_step // self.every != self._last_step // self.every
        due_time = self.minutes and time.monotonic() - s.last_save_time >= 60.0 * self.minutes
        if (due_steps or due_time) and not s.checkpoint_requested:
            s.request_checkpoint(f"periodic__step{s.global_step}")
        self._last_step = s.global_step


class SwitchCheckpointCallback(Callback):
    """`switch__<old regime>__step<N>` right before every switch (--save_agent_with_switch): the pre-switch state,
    so that resuming it redoes the switch."""

    def on_switch_start(self, event: SwitchEvent) -> None:
        self.session.request_checkpoint(f"switch__{regime_slug(event.old)}__step{event.global_step}")


class WandbCallback(Callback):
    """With --track: finished videos (--capture_video) after every iteration and at the end; every checkpoint as a
    model artifact (--save_agent_wandb)."""

    def __init__(self, videos: bool, checkpoints: bool):
        self.videos, self.checkpoints = videos, checkpoints

    def on_iteration_end(self) -> None:
        if self.videos:
            self.session.logger.log_new_videos(self.session.video_dir, self.session.global_step)

    def on_checkpoint(self, path: str, name: str) -> None:
        if self.checkpoints:
            s = self.session
            s.logger.log_artifact(path, f"{os.path.basename(s.run_dir)}__{name}".replace("=", "-"),
                                  {"global_step": s.global_step, "modification": s.modification})

    def on_close(self) -> None:
        if self.videos:  # the last video is written when the envs close, after the last iteration
            self.session.logger.log_new_videos(self.session.video_dir, self.session.global_step)
