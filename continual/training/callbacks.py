"""The extensions every run has (`continual.training.extensions.Extension`s the session adds itself): periodic and
time-based checkpoints, checkpoints at switches, W&B uploads. The continual methods' extensions live next to what
they do and are built by `continual.methods`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from continual.envs.vector import regime_slug
from continual.training.extensions import Extension, SwitchEvent


class CheckpointCallback(Extension):
    """`periodic__step<N>` every `every` steps (--checkpoint_every) and whenever `minutes` of wall time have passed
    since the last checkpoint of any kind (--checkpoint_minutes: by default a crash, SIGKILL or OOM, loses at most
    that much); the newest `keep` periodic checkpoints are kept (--keep_checkpoints)."""

    def __init__(self, every: int, minutes: float):
        self.every, self.minutes = every, minutes

    def attach(self, session: Any) -> None:
        super().attach(session)
        self._last_step = session.global_step

    def on_iteration_end(self) -> None:
        s = self.session
        due_steps = self.every and s.global_step // self.every != self._last_step // self.every
        if due_steps or self.due_by_time(s.last_save_time, self.minutes):
            self.request(s)
        self._last_step = s.global_step

    @staticmethod
    def due_by_time(last_save_time: float, minutes: float) -> bool:
        """`minutes` of wall time have passed since `last_save_time` (0: never)."""
        return bool(minutes) and time.monotonic() - last_save_time >= 60.0 * minutes

    @staticmethod
    def request(session: Any) -> None:
        """A periodic checkpoint at the end of the iteration in progress, unless one of any kind is asked for."""
        if not session.checkpoint_requested:
            session.request_checkpoint(f"periodic__step{session.global_step}")


class SwitchCheckpointCallback(Extension):
    """`switch__<old regime>__step<N>` right before every switch (--save_agent_with_switch): the pre-switch state,
    so that resuming it redoes the switch."""

    def on_switch_start(self, event: SwitchEvent) -> None:
        self.session.request_checkpoint(f"switch__{regime_slug(event.old)}__step{event.global_step}")


class WandbCallback(Extension):
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
