"""Videos follow gymnasium's capped cubic schedule by default, as CleanRL's do (not one video per episode)."""

from __future__ import annotations

import os

import gymnasium as gym
import pytest

from continual.envs.vector import RegimeVideo

pytest.importorskip("moviepy")


def play(env: gym.Env, episodes: int) -> None:
    for _ in range(episodes):
        env.reset(seed=0)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            done = term or trunc


def videos(folder) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.endswith(".mp4")) if os.path.isdir(folder) else []


@pytest.mark.parametrize("every, episodes, expected_ids", [
    (0, 30, [0, 1, 8, 27]),  # the cubes below 30 (hand computed)
    (0, 65, [0, 1, 8, 27, 64]),
    (10, 25, [0, 10, 20]),
])
def test_video_schedule(tmp_path, every, episodes, expected_ids):
    env = RegimeVideo(gym.make("CartPole-v1", render_mode="rgb_array", max_episode_steps=3), str(tmp_path), every,
                      "", start_step=0)
    play(env, episodes)
    env.close()
    assert videos(tmp_path) == sorted(f"no_modif__step0-episode-{i}.mp4" for i in expected_ids)


def test_first_episode_of_each_regime_is_recorded_once(tmp_path):
    """Switches add the first episode of a new regime; a revisited regime adds nothing beyond the schedule."""
    env = RegimeVideo(gym.make("CartPole-v1", render_mode="rgb_array", max_episode_steps=3), str(tmp_path), 0,
                      "", start_step=0)
    play(env, 3)  # episodes 0, 1, 2: 0 and 1 recorded
    env.start_regime("gravity=15", 30)
    play(env, 4)  # episodes 3..6: 3 recorded (first of the regime)
    env.start_regime("", 70)
    play(env, 3)  # episodes 7..9: the regime was recorded before; 8 is on the schedule
    env.close()
    assert videos(tmp_path) == ["gravity=15__step30-episode-3.mp4", "no_modif__step0-episode-0.mp4",
                                "no_modif__step0-episode-1.mp4", "no_modif__step70-episode-8.mp4"]


def test_training_default_is_the_capped_cubic_schedule():
    from continual.config.args import Args
    from continual.envs.vector import EnvSettings

    assert EnvSettings.from_args(Args(capture_video=True), video_dir="videos").video_every == 0


def test_a_video_that_cannot_be_written_warns_once_and_the_env_goes_on(tmp_path, capfd):
    folder = tmp_path / "videos"
    env = RegimeVideo(gym.make("CartPole-v1", render_mode="rgb_array", max_episode_steps=3), str(folder), 1, "",
                      start_step=0)
    folder.rmdir()
    folder.write_text("a file where the videos folder was")  # every video write now fails (not a directory)
    play(env, 4)
    env.close()
    err = capfd.readouterr().err.splitlines()
    assert len([ln for ln in err if ln.startswith("warning: video write failed")]) == 1, err  # 4 videos failed
    assert "Traceback" not in "\n".join(err)
