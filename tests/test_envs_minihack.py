"""The MiniHack backend (continual/envs/minihack.py) against MiniHack's own envs, its union action sets, a two-task
sequence switching in place in the same worker processes, PPO and IMPALA trained, checkpointed, resumed and
evaluated on it, nothing left behind by a run (NLE's temporary folders, processes), and the one-line error of a
missing nle."""

from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import gymnasium as gym
import numpy as np
import pytest

from continual.envs.minihack import CORA_KWARGS, glyph_classes, import_minihack  # noqa: E402
from continual.errors import UserError

try:
    import_minihack()
except UserError as e:  # .ci/run installs nle and minihack: this skips only a hand-made environment without them
    pytest.skip(str(e), allow_module_level=True)

from nle import nethack  # noqa: E402

from conftest import ROOT, run_main, run_script, write_config  # noqa: E402
from continual.envs.backends import TaskCompat, make_backend_env, task_compat, validate_modification  # noqa: E402
from continual.envs.vector import EnvSettings, make_vector_env  # noqa: E402

ROOM, CORRIDOR, KEYROOM = "MiniHack-Room-Random-5x5-v0", "MiniHack-Corridor-R2-v0", "MiniHack-KeyRoom-S5-v0"


def reference(env_id: str, seed: int, actions, key: str, env_actions=None):
    """MiniHack's own env with CORA's kwargs, seeded as MiniHack seeds its levels: (observations, rewards, ends)."""
    kwargs = dict(CORA_KWARGS)
    if env_actions is not None:
        kwargs["actions"] = env_actions
    env = gym.make(env_id, observation_keys=(key,), **kwargs)
    env.unwrapped.seed(seed, seed, False)
    obs, _ = env.reset()
    out, rewards, ends = [obs[key].copy()], [], []
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        out.append(obs[key].copy())
        rewards.append(r)
        ends.append((term, trunc))
        if term or trunc:
            break
    env.close()
    return out, rewards, ends


def ours(env, seed: int, actions):
    obs, _ = env.reset(seed=seed)
    out, rewards, ends = [obs], [], []
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        out.append(obs)
        rewards.append(r)
        ends.append((term, trunc))
        if term or trunc:
            break
    return out, rewards, ends


def expected_pixels(crop: np.ndarray) -> np.ndarray:
    """CORA's preprocessing written out: pad 2 px a side with zeros, INTER_AREA to 84x84, channels first."""
    import cv2

    padded = np.zeros((148, 148, 3), np.uint8)
    padded[2:-2, 2:-2] = crop
    return cv2.resize(padded, (84, 84), interpolation=cv2.INTER_AREA).transpose(2, 0, 1)


def glyph_channel(g: int, names) -> int:
    """The channel of glyph g, by NLE's glyph ranges (independent of the table under test)."""
    if nethack.GLYPH_CMAP_OFF <= g < nethack.GLYPH_EXPLODE_OFF:
        return names.index(f"cmap{g - nethack.GLYPH_CMAP_OFF}")
    if nethack.GLYPH_MON_OFF <= g < nethack.GLYPH_PET_OFF:
        return names.index("monster")
    if nethack.GLYPH_OBJ_OFF <= g < nethack.GLYPH_CMAP_OFF:
        return names.index("object")
    if g == nethack.MAX_GLYPH:
        return names.index("none")
    raise AssertionError(f"glyph {g} outside the ranges these tasks show")


@pytest.mark.parametrize("env_id", [ROOM, CORRIDOR])
def test_observations_rewards_and_ends_match_minihack(env_id):
    actions = np.random.default_rng(0).integers(0, 8, 120).tolist()
    env = make_backend_env("MiniHack", env_id, "", obs_mode="pixel_crop")
    assert env.observation_space == gym.spaces.Box(0, 255, (3, 84, 84), np.uint8)
    mine, rewards, ends = ours(env, 5, actions)
    ref, ref_rewards, ref_ends = reference(env_id, 5, actions, "pixel_crop")
    env.close()
    assert ref[0].shape == (144, 144, 3) and len(mine) == len(ref) > 1
    assert all(np.array_equal(a, expected_pixels(b)) for a, b in zip(mine, ref))
    assert rewards == ref_rewards and ends == ref_ends
    assert -0.001 in rewards or 1.0 in rewards  # CORA's step penalty / win reward (not MiniHack's defaults)

    env = make_backend_env("MiniHack", env_id, "", obs_mode="glyphs_crop")
    _, names = glyph_classes()
    mine, rewards, _ = ours(env, 5, actions)
    ref, ref_rewards, _ = reference(env_id, 5, actions, "glyphs_crop")
    env.close()
    assert env.observation_space.shape == (len(names), 9, 9) and rewards == ref_rewards
    for a, glyphs in zip(mine, ref):
        assert a.dtype == np.float32 and np.array_equal(a.sum(0), np.ones((9, 9)))  # one-hot
        assert np.array_equal(a.argmax(0), np.vectorize(lambda g: glyph_channel(int(g), names))(glyphs))
    if env_id == ROOM:  # another seed is another room: the seed really reaches NetHack
        other = make_backend_env("MiniHack", env_id, "", obs_mode="glyphs_crop")
        assert not np.array_equal(other.reset(seed=6)[0], mine[0])
        other.close()


def test_tasks_share_the_union_of_their_action_sets():
    compat = task_compat("MiniHack", (KEYROOM, ROOM, CORRIDOR))
    room = make_backend_env("MiniHack", ROOM, "")
    own = room.unwrapped.actions
    room.close()
    assert own == tuple(int(a) for a in nethack.CompassDirection)  # 8 moves
    union = compat.actions
    assert union[:8] == own and len(union) == len(set(union)) == 13
    theirs = set()
    for e in (KEYROOM, CORRIDOR):
        env = gym.make(e, **CORA_KWARGS)
        theirs |= {int(a) for a in env.unwrapped.actions}
        env.close()
    assert set(union) == set(own) | theirs
    assert compat == TaskCompat(actions=union) and task_compat("MiniHack", (ROOM,)) == TaskCompat()
    for env_id in (ROOM, KEYROOM):  # every task made with the union: index i is the same command everywhere
        env = make_backend_env("MiniHack", env_id, "", obs_mode="glyphs_crop", actions=union)
        assert env.action_space.n == 13 and env.unwrapped.actions == union
        # the same game as MiniHack's env made with those actions
        steps = np.random.default_rng(1).integers(0, 13, 60).tolist()
        mine, rewards, _ = ours(env, 3, steps)
        ref, ref_rewards, _ = reference(env_id, 3, steps, "glyphs_crop", env_actions=[
            {int(a): a for a in nethack.ACTIONS}[u] for u in union])
        env.close()
        assert rewards == ref_rewards and len(mine) == len(ref)


def test_held_out_tasks_share_the_action_set_without_being_built_in_training():
    """--eval_modifs tasks join the union (training and evaluation envs act alike), in NLE's order whichever tasks
    the set came from, but the training workers do not build them."""
    from continual.config.args import Args

    args = Args(backend="MiniHack", env_id=ROOM, obs_mode="glyphs_crop", eval_modifs=f"env={KEYROOM}")
    settings = EnvSettings.from_args(args, regimes=[f"env={ROOM}"])
    assert settings.compat.actions == task_compat("MiniHack", (KEYROOM, ROOM)).actions and settings.games == ()
    assert len(settings.compat.actions) == 10
    a = task_compat("MiniHack", (CORRIDOR, KEYROOM)).actions
    b = task_compat("MiniHack", (KEYROOM, ROOM, CORRIDOR)).actions
    assert a == b  # the same set, the same order
    order = [int(x) for x in nethack.ACTIONS]
    assert list(b) == sorted(b, key=order.index)


@pytest.mark.parametrize("bad", ["gravity=3", "env=MiniHack-Nope-v0", "env=MinAtar/Breakout", f"env={ROOM} x=1"])
def test_bad_tasks_are_one_line_errors(bad):
    with pytest.raises(UserError) as e:
        validate_modification("MiniHack", ROOM, bad)
    assert "\n" not in str(e.value)


def test_two_tasks_switch_in_the_same_workers():
    """Room -> Corridor -> Room in 2 worker processes: the pids stay, the workers really run the other task (its
    first observation is the reference Corridor's, seeded from the run's seed and the step)."""
    games = (ROOM, CORRIDOR)
    compat = task_compat("MiniHack", games)
    settings = EnvSettings(env_id=ROOM, backend="MiniHack", obs_mode="glyphs_crop", compat=compat, games=games)
    envs = make_vector_env(settings, 2, f"env={ROOM}", "async")
    try:
        obs, _ = envs.reset(seed=10)
        pids = envs.worker_pids()
        assert len(pids) == 2 and envs.single_action_space.n == len(compat.actions) == 11
        ref = make_backend_env("MiniHack", ROOM, "", obs_mode="glyphs_crop", actions=compat.actions)
        assert np.array_equal(obs[1], ref.reset(seed=11)[0])
        ref.close()
        obs, _ = envs.switch(f"env={CORRIDOR}", step=1000)
        assert envs.worker_pids() == pids and envs.env.call("game") == (CORRIDOR, CORRIDOR)
        seed = int(np.random.SeedSequence([10, 1000]).generate_state(1)[0])
        ref = make_backend_env("MiniHack", CORRIDOR, "", obs_mode="glyphs_crop", actions=compat.actions)
        assert np.array_equal(obs[0], ref.reset(seed=seed)[0])
        ref.close()
        for _ in range(5):
            envs.step(np.array([0, 10]))
        obs, _ = envs.switch("", step=2000)
        assert envs.worker_pids() == pids and envs.env.call("game") == (ROOM, ROOM)
    finally:
        envs.close()


def sequence(architecture: str) -> dict:
    return {"env_id": ROOM, "backend": "MiniHack", "obs_mode": "glyphs_crop", "architecture": architecture,
            "num_envs": 2, "num_steps": 64, "num_minibatches": 2, "update_epochs": 1, "vector_env": "async",
            "num_actors": 1, "batch_size": 2, "unroll_length": 16, "eval_at_switches": True, "eval_episodes": 2,
            "eval_modifs": "env=MiniHack-Room-Random-15x15-v0", "progress_bar": False, "checkpoint_minutes": 0,
            "modification_factory": "TaskSequence",
            "modification_factory_kwargs": {"cycles": 2, "tasks": [{"env_id": ROOM, "steps": 128},
                                                                    {"env_id": CORRIDOR, "steps": 128}]}}


def records(run_dir: str, kind: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("kind") == kind]


def leftovers(tmp: str, marker: str) -> tuple[list[str], list[int]]:
    """Files under the run's TMPDIR (but torch's compile cache, torchinductor_<user>) and live processes started
    with it in their environment."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return sorted(f for f in os.listdir(tmp) if not f.startswith("torchinductor_")), pids


@pytest.mark.long
def test_ppo_sequence_trains_resumes_evaluates_and_leaves_nothing(tmp_path, request):
    """Room <-> Corridor x 2 cycles (512 steps) with PPO in worker processes: stopped at 256 and resumed; the
    switches land on the schedule, rewards are CORA's unclipped ones, the held-out task is evaluated; eval.py
    evaluates the checkpoint. NLE's temporary folders and the workers are gone after every run, and nothing but the
    run directory was written."""
    # a short TMPDIR: the forkserver's socket lives under it, and AF_UNIX paths stop at 107 bytes (under xdist,
    # tmp_path alone can be ~70)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="mh-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    work = tmp_path / "work"
    work.mkdir()
    env = {"TMPDIR": str(tmp), "MINIHACK_TEST_MARKER": str(tmp)}
    config = write_config(tmp_path, sequence("PPO"), "seq.json")
    run_dir = str(work / "runs" / "seq")
    run_script("continual_training_example.py", "--config", config, "--runs_dir", str(work / "runs"), "--run_name",
               "seq", "--total_timesteps", "256", timeout=300, env=env)
    assert leftovers(str(tmp), str(tmp)) == ([], [])
    run_script("continual_training_example.py", "--resume", run_dir, "--total_timesteps", "512", timeout=300, env=env)
    assert leftovers(str(tmp), str(tmp)) == ([], [])
    assert os.listdir(work) == ["runs"] and not glob.glob(os.path.join(ROOT, "nle_data"))
    room, corridor = f"env={ROOM}", f"env={CORRIDOR}"
    assert [(r["global_step"], r["modification"]) for r in records(run_dir, "switch")] == [
        (128, corridor), (256, room), (384, corridor)]
    episodes = records(run_dir, "episode")
    assert {r["modification"] for r in episodes} == {room, corridor}
    # CORA's rewards: 1 for a win, -0.001 a step that does not advance the clock (a clip would give whole numbers)
    assert any(0 < r["return"] < 1 or -1 < r["return"] < 0 for r in episodes)
    with open(os.path.join(run_dir, "config.json")) as f:
        config_saved = json.load(f)
    assert config_saved["reward_scaling"] == "none" and config_saved["obs_mode"] == "glyphs_crop"
    with open(os.path.join(run_dir, "eval_table.csv")) as f:
        assert "MiniHack-Room-Random-15x15-v0" in f.read()  # the held-out task of the pair
    out = str(tmp_path / "eval_out")
    run_script("eval.py", "--agent_path", os.path.join(run_dir, "ppo.cleanrl_model"), "--modifs", corridor,
               "env=MiniHack-Room-Random-15x15-v0", "--eval_episodes", "2", "--output", out, "--no-progress_bar",
               timeout=300, env=env)
    with open(out + ".json") as f:
        rows = json.load(f)["results"]
    assert [r["modification"] for r in rows] == [corridor, "env=MiniHack-Room-Random-15x15-v0"]
    assert leftovers(str(tmp), str(tmp)) == ([], [])


def test_impala_trains_on_a_minihack_sequence(tmp_path):
    """In this process (run_main): IMPALA's actors fork from this worker's forkserver. Its evaluations (step 0, the
    switch, the end) play games capped at 100 steps (whole games are the PPO test's): uncapped, Corridor's games last
    ~500 steps and the evaluations took three quarters of the run."""
    config = write_config(tmp_path, sequence("IMPALA"), "seq.json")
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--config", config, "--runs_dir", runs, "--run_name", "im",
             "--obs_mode", "pixel_crop", "--total_timesteps", "256", "--eval_max_episode_steps", "100")
    run_dir = os.path.join(runs, "im")
    assert [r["modification"] for r in records(run_dir, "switch")] == [f"env={CORRIDOR}"]
    assert records(run_dir, "episode") and os.path.exists(os.path.join(run_dir, "impala.cleanrl_model"))
    evals = records(run_dir, "eval")
    assert sorted({r["global_step"] for r in evals}) == [0, 128, 256] and len(evals) == 9
    assert all(r["max_episode_steps"] == 100 and r["mean_length"] <= 100 for r in evals)


def test_missing_nle_is_one_line_and_exit_2(tmp_path):
    """nle unimportable (as if not installed): one line naming the package, exit 2, nothing created."""
    code = ("import sys, runpy; sys.modules['nle'] = None; sys.argv = ['continual_training_example.py'] + "
            "sys.argv[1:]; runpy.run_path('continual_training_example.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, "--backend", "MiniHack", "--env_id", ROOM, "--runs_dir",
                           str(tmp_path / "runs"), "--total_timesteps", "256"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "'nle'" in proc.stderr and "pip install --no-deps nle==1.3.0" in proc.stderr
    assert not os.path.exists(tmp_path / "runs")
