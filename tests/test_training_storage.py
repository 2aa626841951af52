"""Storage faults (continual.training: checkpoints, metrics, eval table, final model; continual.io.AppendFile): a full
disk at several moments stops the run with one line and exit 1, the checkpoint it names loads, and --resume ends the
run as an uninterrupted one does; a corrupt newest checkpoint is skipped by --resume RUN_DIR and eval.py RUN_DIR,
and only a run whose checkpoints are all corrupt is refused. Tiny CartPole PPO runs, a few seconds each."""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil
import subprocess
import uuid

import pytest
import torch

from conftest import assert_resume_matches, run_main, run_script, write_config
from continual.errors import StorageError
from continual.io import AppendFile, read_jsonl
from continual.training.checkpoint import load_checkpoint
from continual.training.tracking import read_metrics

TRAIN = "continual_training_example.py"
ROLLOUT = 128  # 2 envs x 64 steps
TOTAL = 1536
CONFIG = {
    "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64, "update_epochs": 1,
    "reward_scaling": "none", "checkpoint_every": 256, "keep_checkpoints": 3, "eval_every": 512, "eval_episodes": 2,
    "eval_num_envs": 1, "progress_bar": False,
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": TOTAL, "modifications": ["", "gravity=15", "length=0.8"],
                                    "switching_thresholds": [512, 1024]},
}
FINAL = f"final__step{TOTAL}.cleanrl_model"
SWITCHES = (512, 1024)  # a resume from a switch checkpoint (or the final one) is exact; from elsewhere the envs restart
# their episodes at the resumed step (docs/outputs.md: Resuming), so only the schedule and the steps are the same
ERROR_LINE = re.compile(r"^error: no space left on device writing (\S+); the last checkpoint is (\S+) \(step (\d+)\); "
                        r"free space and --resume$")


def _train(runs: str, name: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cfg = os.path.join(runs, "cfg.json")
    if not os.path.exists(cfg):
        os.makedirs(runs, exist_ok=True)
        write_config(runs, CONFIG, "cfg.json")
    argv = ("--config", cfg, "--runs_dir", runs, "--run_name", name, *extra)
    # a planned fault needs a process of its own (tests/helpers/trainer_faults.py); a plain run goes in-process
    return run_script(TRAIN, *argv, env=env, check=False) if env else run_main(TRAIN, *argv, check=False)


def _schedule(run_dir: str) -> list[tuple[int, str]]:
    return [(r["global_step"], r["modification"]) for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))
            if r["kind"] == "switch"]


def _iteration_steps(run_dir: str) -> list[int]:
    return [r["global_step"] for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "iteration"]


def _eval_steps(run_dir: str) -> list[int]:
    with open(os.path.join(run_dir, "eval_table.csv")) as f:
        return sorted({int(line.split(",")[0]) for line in list(f)[1:]})


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    """The uninterrupted run."""
    runs = str(tmp_path_factory.mktemp("ref"))
    proc = _train(runs, "ref")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return os.path.join(runs, "ref")


def _assert_one_storage_line(proc: subprocess.CompletedProcess, file_pattern: str) -> tuple[str, int]:
    """One `error:` line on stderr (warnings of TensorBoard may come before it), no traceback, exit 1; returns the
    checkpoint it names and its step."""
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-3000:]
    assert all(ln.startswith(("warning:", "error:")) for ln in lines), proc.stderr[-3000:]
    m = ERROR_LINE.match(errors[0])
    assert m, errors[0]
    assert re.search(file_pattern, m.group(1)), errors[0]
    return m.group(2), int(m.group(3))


# the moment, its fault plan, the file it fails
MOMENTS = {
    "checkpoint": ("write_checkpoint:3", r"checkpoints/periodic__step768\.cleanrl_model$"),
    "metrics": ("write_metrics:17", r"metrics\.jsonl$"),  # of 30 writes (per-game lines go with their iteration)
    "eval_table": ("write_eval_table:2", r"eval_table\.csv$"),
    "final_model": ("write_final_model:1", r"ppo\.cleanrl_model$"),
}


# the default suite fails one write of each kind (a checkpoint, an appended record, the final policy); -m slow adds
# the eval table's rows, appended as metrics.jsonl's records are
@pytest.mark.parametrize("moment", [pytest.param(m, marks=[pytest.mark.slow] if m == "eval_table" else [])
                                    for m in sorted(MOMENTS)])
def test_full_disk_stops_with_one_line_and_resume_ends_like_an_uninterrupted_run(tmp_path, reference, moment):
    plan, file_pattern = MOMENTS[moment]
    runs = str(tmp_path)
    run_dir = os.path.join(runs, "cut")
    proc = _train(runs, "cut", env={"CONTINUAL_FAULT": plan})
    named, step = _assert_one_storage_line(proc, file_pattern)
    # the checkpoint it names is intact and the newest; the failed write left no temporary file, no torn line
    assert load_checkpoint(named)["global_step"] == step
    assert load_checkpoint(run_dir)["path"] == named
    assert not glob.glob(os.path.join(run_dir, "**", ".tmp-*"), recursive=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
        assert f.read().endswith(b"\n")
    read_jsonl(os.path.join(run_dir, "metrics.jsonl"))  # every line a record
    if moment == "final_model":
        assert os.path.basename(named) == FINAL and not os.path.exists(os.path.join(run_dir, "ppo.cleanrl_model"))

    proc = run_main(TRAIN, "--resume", run_dir, "--no-progress-bar", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _schedule(run_dir) == _schedule(reference)
    assert _iteration_steps(run_dir) == list(range(ROLLOUT, TOTAL + 1, ROLLOUT))
    assert _eval_steps(run_dir) == _eval_steps(reference)
    if step in SWITCHES:
        assert_resume_matches(reference, run_dir, FINAL, after_step=step)
    elif step == TOTAL:  # the final checkpoint itself was whole: the resumed run only writes the files again
        a, b = (torch.load(os.path.join(d, "checkpoints", FINAL), weights_only=True) for d in (reference, run_dir))
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    policy = torch.load(os.path.join(run_dir, "ppo.cleanrl_model"), weights_only=True)
    assert policy.keys() == torch.load(os.path.join(reference, "ppo.cleanrl_model"), weights_only=True).keys()


# --- corrupt checkpoints ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> str:
    """A run stopped at step 768 (--total_timesteps) with periodic checkpoints at 256, 512 and 768."""
    runs = str(tmp_path_factory.mktemp("three"))
    proc = _train(runs, "three", "--total_timesteps", "768")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = os.path.join(runs, "three")
    ck = os.path.join(run_dir, "checkpoints")
    os.unlink(os.path.join(ck, "final__step768.cleanrl_model"))
    os.unlink(os.path.join(run_dir, "ppo.cleanrl_model"))
    assert sorted(os.listdir(ck)) == [f"periodic__step{s}.cleanrl_model" for s in (256, 512, 768)]
    return run_dir


def _copy(three: str, tmp_path) -> tuple[str, str]:
    run_dir = str(tmp_path / "run")
    shutil.copytree(three, run_dir)
    return run_dir, os.path.join(run_dir, "checkpoints")


def _truncate(path: str) -> None:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _garbage(path: str) -> None:
    with open(path, "wb") as f:
        f.write(uuid.uuid4().bytes * 512)


# garbage in the newest checkpoint: -m slow (the default suite refuses it in the test below, every checkpoint corrupt)
@pytest.mark.parametrize("damage", [_truncate, pytest.param(_garbage, marks=pytest.mark.slow)],
                         ids=["truncated", "garbage"])
def test_resume_run_dir_skips_a_corrupt_newest_checkpoint(tmp_path, three, damage):
    run_dir, ck = _copy(three, tmp_path)
    newest = os.path.join(ck, "periodic__step768.cleanrl_model")
    damage(newest)
    proc = run_main(TRAIN, "--resume", run_dir, "--total_timesteps", "1024", "--no-progress-bar", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert "periodic__step768.cleanrl_model" in warnings[0] and "periodic__step512.cleanrl_model (step 512)" in \
        warnings[0]
    assert os.path.exists(newest + ".corrupt")  # set aside for inspection
    # resumed from 512: iterations 640 and 768 were trained again, none is duplicated
    assert _iteration_steps(run_dir) == list(range(ROLLOUT, 1024 + 1, ROLLOUT))
    assert load_checkpoint(run_dir)["global_step"] == 1024
    # eval.py given the directory of a run whose newest checkpoint is corrupt: the same choice, one warning
    run_dir2, ck2 = _copy(three, tmp_path / "b")
    damage(os.path.join(ck2, "periodic__step768.cleanrl_model"))
    out = str(tmp_path / "eval" / "r")
    proc = run_main("eval.py", "--agent_path", run_dir2, "--eval_episodes", "1", "--num_envs", "1", "--output", out,
                    "--no-cuda", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "periodic__step512" in warnings[0], proc.stderr[-3000:]
    with open(out + ".json") as f:
        assert "periodic__step512" in json.dumps(json.load(f))


def test_every_checkpoint_corrupt_or_a_corrupt_file_named_is_one_line_exit_2(tmp_path, three):
    run_dir, ck = _copy(three, tmp_path)
    _truncate(os.path.join(ck, "periodic__step768.cleanrl_model"))
    # a corrupt file named explicitly is refused even though older ones are fine
    proc = run_main(TRAIN, "--resume", os.path.join(ck, "periodic__step768.cleanrl_model"), check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "truncated" in lines[0], proc.stderr
    _garbage(os.path.join(ck, "periodic__step512.cleanrl_model"))
    with open(os.path.join(ck, "periodic__step256.cleanrl_model"), "wb"):
        pass  # empty
    before = sorted(os.listdir(ck))
    for script, argv in ((TRAIN, ["--resume", run_dir]), ("eval.py", ["--agent_path", run_dir, "--no-cuda"])):
        proc = run_main(script, *argv, check=False)
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: ") and "all 3 checkpoints are corrupt" in lines[0], lines[0]
        assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(ck)) == before  # nothing renamed when nothing could be resumed


# --- a real full disk: a small tmpfs ---------------------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_real_full_tmpfs_then_more_space_and_resume(tmp_path, tmpfs, reference):
    cfg = write_config(tmp_path, CONFIG, "cfg.json")
    run_dir = os.path.join(tmpfs, "runs", "cut")
    proc = run_main(TRAIN, "--config", cfg, "--runs_dir", os.path.join(tmpfs, "runs"), "--run_name", "cut",
                    check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]
    m = ERROR_LINE.match(errors[0])
    assert m, errors[0]
    state = load_checkpoint(m.group(2))
    assert state["global_step"] == int(m.group(3))
    read_jsonl(os.path.join(run_dir, "metrics.jsonl"))  # no torn line
    # resumed on the still full disk: the same kind of stop (exit 1, one line), never "bad input" (exit 2)
    proc = run_main(TRAIN, "--resume", run_dir, "--no-progress-bar", check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and ERROR_LINE.match(errors[0]), proc.stderr[-3000:]
    assert load_checkpoint(ERROR_LINE.match(errors[0]).group(2))
    subprocess.run(["mount", "-o", "remount,size=8m", tmpfs], check=True)  # space is back
    proc = run_main(TRAIN, "--resume", run_dir, "--no-progress-bar", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _schedule(run_dir) == _schedule(reference)
    assert _iteration_steps(run_dir) == list(range(ROLLOUT, TOTAL + 1, ROLLOUT))
    if int(m.group(3)) in SWITCHES:
        assert_resume_matches(reference, run_dir, FINAL, after_step=int(m.group(3)))


# --- AppendFile --------------------------------------------------------------------------------------------------------


def test_append_file_cuts_a_short_write_back_off(tmp_path, monkeypatch):
    path = str(tmp_path / "m.jsonl")
    f = AppendFile(path)
    f.write('{"a": 1}\n')
    real_write = os.write

    def short(fd, data):  # the disk fills after 3 bytes of the line
        return real_write(fd, data[:3])

    monkeypatch.setattr(os, "write", short)
    with pytest.raises(StorageError, match="no space left on device writing .*m.jsonl"):
        f.write('{"b": 2}\n')
    monkeypatch.setattr(os, "write", real_write)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StorageError):
        f.write('{"c": 3}\n')
    monkeypatch.setattr(os, "write", real_write)
    f.write('{"d": 4}\n')
    f.close()
    assert open(path).read() == '{"a": 1}\n{"d": 4}\n'


def test_a_full_disk_at_the_start_is_exit_1_not_bad_input(tmp_path, monkeypatch):
    import tempfile

    from continual.training import tracking
    from continual.training.startup import check_creatable

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    with pytest.raises(StorageError, match="no space left on device writing"):
        check_creatable(str(tmp_path / "runs"))
    monkeypatch.setattr(tracking, "open", full, raising=False)
    with pytest.raises(StorageError):
        tracking.check_writable(str(tmp_path))
