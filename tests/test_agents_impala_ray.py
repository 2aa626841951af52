"""IMPALA's actors on Ray (`--actor_backend ray`, agents/impala_ray.py) with a real local Ray: the same losses as the
process backend at a policy lag of one update; an actor killed mid-run is restarted and the run completes; used-up
restarts end the run with one line and a checkpoint; a switch reaches every actor; CLEAR on Ray actors; no process
left behind. Slow: a Ray node removed mid-run (ray.cluster_utils.Cluster, two nodes on this machine); a killed
learner leaves nothing and --resume finishes; Ctrl-C and SIGTERM to the process group; P&C on Ray actors.

Every run on Ray is a subprocess in a session of its own, so that a scan of its session finds every process it
started (learner, Ray's GCS, raylet, agents and workers, also the orphaned ones)."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, run_main, run_script, write_config
from continual.testing.processes import alive, session_members
from continual.training.tracking import read_metrics

TESTS = os.path.join(ROOT, "tests")
# SlowCartPole sleeps 5 ms a step: an unroll (20 steps of 2 envs) takes ~0.2 s, far longer than an update
SLOW = {"env_id": "helpers.fault_envs:SlowCartPole-v0", "backend": "Gymnasium", "num_envs": 4, "num_actors": 2,
        "unroll_length": 20, "batch_size": 2, "reward_scaling": "none"}  # 80 steps per update
RAY = ["--actor_backend", "ray"]
GONE_S = 180.0  # Ray's dashboard and runtime-env agents can take 1-2 min to exit after their raylet was killed


def env(**extra) -> dict:
    return {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": TESTS, **extra}


def start(*argv: str, **extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def iterations(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    return [r for r in read_metrics(path) if r["kind"] == "iteration"] if os.path.exists(path) else []


def records(run_dir: str, kind: str) -> list[dict]:
    return [r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == kind]


def wait_for(proc: subprocess.Popen, what, timeout: float = 300.0, why: str = ""):
    """Poll `what()` until it returns something truthy (the run must still be running)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = what()
        if got:
            return got
        if proc.poll() is not None:
            raise AssertionError(f"run ended early ({proc.returncode}) waiting for {why}: {proc.communicate()[1][-3000:]}")
        time.sleep(0.1)
    kill_session(proc)
    raise AssertionError(f"timed out waiting for {why}")


def actors_file(run_dir: str):
    try:
        with open(os.path.join(run_dir, "actors.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def wait_session_gone(sid: int, timeout: float = GONE_S) -> list[str]:
    """The processes of session `sid` still alive after `timeout` (name and pid)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = session_members(sid)
        if not left:
            return []
        time.sleep(0.5)
    return [f"{pid}:{open(f'/proc/{pid}/comm').read().strip()}" for pid in session_members(sid) if alive(pid)]


def kill_session(proc: subprocess.Popen) -> None:
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


@pytest.fixture
def session_cleanup():
    """Whatever a test leaves running in the sessions it started is killed at its end."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        kill_session(p)


# --- the same learning signal as the process backend -------------------------------------------------------------

LOSSES = ("losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/grad_norm", "losses/approx_kl",
          "losses/rho_mean")
ONE_ACTOR = {**SLOW, "num_actors": 1, "batch_size": 1}  # 80 steps per update
# the process backend's runs are repeated until one kept the lag-one schedule for MIN_COMPARED updates (a quiet
# machine: the first run; a loaded 2-core machine preempts the actor: 4 of 12 seen in 3 runs while a pixel PPO
# experiment held both cores, hence up to ATTEMPTS runs)
UPDATES, MIN_COMPARED, ATTEMPTS = 12, 8, 6


def lag_one_prefix(its: list[dict]) -> int:
    """How many first updates trained at the lag-one schedule: 0 for the first (no update before it), then 1."""
    for k, it in enumerate(its):
        if it["charts/policy_lag"] != (0.0 if k == 0 else 1.0):
            return k
    return len(its)


@pytest.mark.long
def test_ray_losses_equal_the_process_backends_at_a_lag_of_one_update(tmp_path):
    """One actor, max_in_flight 1, weights broadcast after every update: the learner asks for unroll k+1 with the
    weights of update k-1 as soon as unroll k arrives (before training on it), so every update trains on an unroll
    played one update behind, deterministically. The process backend plays that schedule too while its learner is
    faster than an unroll (SlowCartPole) and the actor is not preempted between handing over an unroll and reading
    the weights: its own recorded lags say for which updates it did (a run where fewer than MIN_COMPARED did is
    repeated). Same seeds and the same `Unroller` code: the losses of those updates and the episodes they played
    must be equal to float rounding (another weight version changes them at the first digits)."""
    cfg = write_config(tmp_path, ONE_ACTOR)
    runs = str(tmp_path / "runs")
    common = ["agents/impala.py", "--config", cfg, "--total_timesteps", str(80 * UPDATES), "--seed", "3",
              "--runs_dir", runs, "--no-progress-bar"]
    run_script(*common, "--run_name", "ray", *RAY, "--max_in_flight", "1", "--broadcast_interval", "1",
               env={"PYTHONPATH": TESTS})
    ray_its = iterations(os.path.join(runs, "ray"))
    assert [it["charts/policy_lag"] for it in ray_its] == [0.0] + [1.0] * (UPDATES - 1)  # deterministic

    tried = []
    for attempt in range(ATTEMPTS):  # the process backend's runs: in this process (its actors fork from the forkserver)
        run_main(*common, "--run_name", f"process{attempt}")
        its = iterations(os.path.join(runs, f"process{attempt}"))
        tried.append((lag_one_prefix(its), f"process{attempt}", its))
        if tried[-1][0] >= MIN_COMPARED:
            break
    compared, name, proc_its = max(tried, key=lambda t: t[0])
    assert compared >= MIN_COMPARED, [[it["charts/policy_lag"] for it in its] for _, _, its in tried]

    for key in LOSSES:
        np.testing.assert_allclose([it[key] for it in ray_its[:compared]], [it[key] for it in proc_its[:compared]],
                                   rtol=1e-6, atol=1e-9, err_msg=key)
    last = ray_its[compared - 1]["global_step"]

    def games(run: str) -> list[tuple]:
        return [(r["global_step"], r["return"], r["length"]) for r in records(os.path.join(runs, run), "episode")
                if r["global_step"] <= last]

    assert games("ray") == games(name) and len(games("ray")) >= 5


# --- faults ----------------------------------------------------------------------------------------------------------


@pytest.mark.long
def test_a_killed_ray_actor_is_restarted_and_the_run_completes(tmp_path, session_cleanup):
    """SIGKILL of a Ray actor's process mid-run: its unroll in flight is dropped, the death is printed and recorded,
    Ray restarts it, the run trains on with it to the end, and no process of the run is left afterwards."""
    cfg = write_config(tmp_path, SLOW)
    runs = str(tmp_path / "runs")
    run_dir = os.path.join(runs, "kill")
    proc = start("agents/impala.py", "--config", cfg, "--total_timesteps", "4800", "--runs_dir", runs,
                 "--run_name", "kill", "--no-progress-bar", *RAY)
    session_cleanup.append(proc)
    wait_for(proc, lambda: actors_file(run_dir) and len(iterations(run_dir)) >= 3, why="3 iterations")
    info = actors_file(run_dir)
    assert info["backend"] == "ray" and len(info["actors"]) == 2 and info["learner"] == proc.pid
    assert set(info["actors"]) <= session_members(proc.pid)  # Ray's workers, in the run's session
    victim = info["actors"][1]
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)

    assert proc.returncode == 0, err[-3000:]
    assert f"actor 1 (pid {victim} on " in err and "Ray restarts it (1 of 3 restarts)" in err, err[-3000:]
    died, back = records(run_dir, "actor_restart"), records(run_dir, "actor_restarted")
    assert [(r["actor"], r["pid"], r["restarts"]) for r in died] == [(1, victim, 1)]
    assert len(back) == 1 and back[0]["actor"] == 1 and back[0]["pid"] != victim
    its = iterations(run_dir)
    assert its[-1]["global_step"] == 4800 and its[-1]["charts/actor_restarts"] == 1.0
    assert its[-1]["charts/dropped_unrolls"] >= 1
    assert [it for it in its if it["time"] > back[0]["time"]], "no update after the restart"
    assert actors_file(run_dir)["restarts"] == [0, 1] and actors_file(run_dir)["actors"][1] == back[0]["pid"]
    assert os.path.exists(os.path.join(run_dir, "checkpoints", "final__step4800.cleanrl_model"))
    assert wait_session_gone(proc.pid) == []


@pytest.mark.long
def test_used_up_restarts_end_the_run_with_one_line_and_a_checkpoint(tmp_path, session_cleanup):
    """Actor 1 kills itself at its 30th env step (a continual.testing.faults hook), in its first process and again in
    the one Ray restarts (--actor_max_restarts 1): the second death ends the run with one line naming it and the
    crash checkpoint of the last update, exit 1, and nothing left running."""
    from continual.training.checkpoint import load_checkpoint

    cfg = write_config(tmp_path, SLOW)
    runs = str(tmp_path / "runs")
    run_dir = os.path.join(runs, "used")
    proc = start("agents/impala.py", "--config", cfg, "--total_timesteps", "10000000", "--runs_dir", runs,
                 "--run_name", "used", "--no-progress-bar", *RAY, "--actor_max_restarts", "1",
                 CONTINUAL_FAULT="actor_step:30@1")
    session_cleanup.append(proc)
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: actor 1 (pid ") and "; no restarts left (--actor_max_restarts 1); saved " in last, \
        err[-3000:]
    assert "Traceback" not in err
    assert len(records(run_dir, "actor_restart")) == 1 and len(records(run_dir, "actor_restarted")) == 1
    saved = glob.glob(os.path.join(run_dir, "checkpoints", "crash__step*.cleanrl_model"))
    assert len(saved) == 1 and last.endswith(saved[0])
    its = iterations(run_dir)
    assert load_checkpoint(saved[0])["global_step"] == (its[-1]["global_step"] if its else 0)
    assert wait_session_gone(proc.pid) == []


# --- continual switches and the IMPALA family ----------------------------------------------------------------------

SWITCHING = {**SLOW, "env_id": "CartPole-v1", "modification_factory": "SequentialModificationFactory",
             "modification_factory_kwargs": {"num_total_steps": 4800, "modifications": ["", "gravity=15.0"],
                                             "switching_thresholds": [1600]}}


@pytest.mark.long
def test_clear_on_ray_actors_switches_every_actor_at_the_learners_step(tmp_path):
    """CLEAR (its replay in the learner) with 2 Ray actors through a switch at step 1600: the switch is recorded at
    1600, no game of the new regime ends before it, and a few updates later no unroll of the old regime is left
    (every actor plays the new one: its requests carry it); the batch's unrolls of the old regime right after the
    switch are at most the requests in flight (2 actors x max_in_flight 2)."""
    cfg = write_config(tmp_path, SWITCHING)
    runs = str(tmp_path / "runs")
    run_dir = os.path.join(runs, "clear")
    run_script("continual_training_example.py", "--architecture", "CLEAR", "--config", cfg, "--runs_dir", runs,
               "--run_name", "clear", "--no-progress-bar", "--clear_buffer_frames", "2000", *RAY)
    assert [(r["global_step"], r["modification"]) for r in records(run_dir, "switch")] == [(1600, "gravity=15.0")]
    episodes = records(run_dir, "episode")
    assert {r["modification"] for r in episodes} == {"", "gravity=15.0"}
    assert all(r["global_step"] > 1600 for r in episodes if r["modification"] == "gravity=15.0")
    its = iterations(run_dir)
    after = [it for it in its if it["global_step"] > 1600]
    # the old regime's unrolls after the switch are those of the requests in flight at it, whatever updates they land
    # in (a loaded machine delivers some late): 2 actors x max_in_flight 2 requests x 2 envs an actor
    assert sum(it["charts/previous_regime_unrolls"] for it in after) <= 2 * 2 * 2
    assert all(it["charts/previous_regime_unrolls"] == 0 for it in after[-3:])
    assert its[-1]["global_step"] == 4800 and "losses/policy_cloning" in its[-1]
    assert actors_file(run_dir)["backend"] == "ray"


@pytest.mark.slow
def test_pnc_on_ray_actors(tmp_path):
    """Progress & Compress on Ray actors: the active column's reset at the switch reaches the actors (weights are
    published at every switch), both phases run, eval.py reads the checkpoint."""
    cfg = write_config(tmp_path, SWITCHING)
    runs = str(tmp_path / "runs")
    run_script("continual_training_example.py", "--architecture", "PNC", "--config", cfg, "--runs_dir", runs,
               "--run_name", "pnc", "--no-progress-bar", *RAY)
    its = iterations(os.path.join(runs, "pnc"))
    assert {it["pnc/compress"] for it in its} == {0.0, 1.0} and its[-1]["global_step"] == 4800


# --- a learner killed, a node lost ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_learner_leaves_no_ray_process_and_resume_finishes(tmp_path, session_cleanup):
    """SIGKILL of the learner: its local Ray instance goes with it (every process of the run's session, Ray's GCS,
    raylet, agents and actors, exits: the agents within GONE_S), and --resume continues from the last periodic
    checkpoint to the end on a new Ray instance."""
    cfg = write_config(tmp_path, SLOW)
    runs = str(tmp_path / "runs")
    run_dir = os.path.join(runs, "learner")
    total = 80 * 60
    proc = start("agents/impala.py", "--config", cfg, "--total_timesteps", str(total), "--checkpoint_every", "800",
                 "--runs_dir", runs, "--run_name", "learner", "--no-progress-bar", *RAY)
    session_cleanup.append(proc)
    wait_for(proc, lambda: glob.glob(os.path.join(run_dir, "checkpoints", "periodic__*")), why="a checkpoint")
    assert len(session_members(proc.pid)) > 5  # learner, GCS, raylet, agents, 2 actors, ...
    proc.kill()
    proc.communicate(timeout=60)
    assert wait_session_gone(proc.pid) == []
    saved = max(int(p.split("step")[-1].split(".")[0])
                for p in glob.glob(os.path.join(run_dir, "checkpoints", "periodic__*")))
    assert 0 < saved < total

    run_script("agents/impala.py", "--resume", run_dir, "--no-progress-bar", env={"PYTHONPATH": TESTS})
    steps = [it["global_step"] for it in iterations(run_dir)]
    assert steps[-1] == total and sorted(set(steps)) == list(range(80, total + 1, 80))  # every update once at least
    resumed = [r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "start"][-1]
    assert resumed["resumed"] and resumed["global_step"] == saved


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_process_group_checkpoints_and_leaves_nothing(tmp_path, session_cleanup, sig):
    """Ctrl-C (Ray's processes ignore it: the learner finishes its update and stops them) and SIGTERM (Ray's
    processes die at once: the actors' deaths count as the interruption) to the run's whole process group: an
    `interrupted` checkpoint of the last update, exit 128 + signal, no process of the run left."""
    cfg = write_config(tmp_path, SLOW)
    runs = str(tmp_path / "runs")
    run_dir = os.path.join(runs, "sig")
    proc = start("agents/impala.py", "--config", cfg, "--total_timesteps", "10000000", "--runs_dir", runs,
                 "--run_name", "sig", "--no-progress-bar", *RAY)
    session_cleanup.append(proc)
    wait_for(proc, lambda: len(iterations(run_dir)) >= 3, why="3 iterations")
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "error:" not in err
    saved = glob.glob(os.path.join(run_dir, "checkpoints", "interrupted__step*.cleanrl_model"))
    assert len(saved) == 1
    assert wait_session_gone(proc.pid) == []


@pytest.mark.slow
def test_a_ray_node_removed_mid_run(tmp_path, session_cleanup):
    """A two-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head with 2 CPUs, a worker node with 1);
    the run joins it with --ray_address and its 2 actors are spread over both nodes. The worker node is removed
    (its raylet killed) mid-run: its actor is restarted on the head and the run completes; the run's actors are gone
    afterwards while the cluster stays up."""
    import ray
    from ray.cluster_utils import Cluster

    fast = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}  # notice the lost node in ~3 s
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "object_store_memory": 150 * 1024 * 1024, "_system_config": fast})
    try:
        worker = cluster.add_node(num_cpus=1, object_store_memory=100 * 1024 * 1024)
        cfg = write_config(tmp_path, SLOW)
        runs = str(tmp_path / "runs")
        run_dir = os.path.join(runs, "node")
        proc = start("agents/impala.py", "--config", cfg, "--total_timesteps", "9600", "--runs_dir", runs,
                     "--run_name", "node", "--no-progress-bar", *RAY, "--ray_address", cluster.address)
        session_cleanup.append(proc)
        wait_for(proc, lambda: actors_file(run_dir) and len(iterations(run_dir)) >= 5, why="5 iterations")
        info = actors_file(run_dir)
        assert sorted(info["nodes"]) == sorted([cluster.head_node.node_id, worker.node_id])  # spread
        lost = info["nodes"].index(worker.node_id)
        cluster.remove_node(worker, allow_graceful=False)
        _, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]
        died, back = records(run_dir, "actor_restart"), records(run_dir, "actor_restarted")
        assert [r["actor"] for r in died] == [lost], err[-3000:]
        assert len(back) == 1 and back[0]["node"] == cluster.head_node.node_id, err[-3000:]
        assert [it for it in iterations(run_dir) if it["time"] > back[0]["time"]]
        assert iterations(run_dir)[-1]["global_step"] == 9600
        deadline = time.time() + 60
        while any(alive(p) for p in actors_file(run_dir)["actors"]) and time.time() < deadline:
            time.sleep(0.5)
        assert not any(alive(p) for p in actors_file(run_dir)["actors"])  # the run's actors; the cluster stays
        ray.init(address=cluster.address, log_to_driver=False)
        assert ray.cluster_resources().get("CPU") == 2
        ray.shutdown()
    finally:
        cluster.shutdown()


# --- flags ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--ray_address", "auto"], "ray_address: only used with --actor_backend ray"),
    (["--max_in_flight", "3"], "max_in_flight: only used with --actor_backend ray"),
    (["--actor_backend", "ray", "--max_in_flight", "0"], "max_in_flight: must be positive"),
    (["--broadcast_interval", "0"], "broadcast_interval: must be positive"),
    (["--architecture", "PPO", "--actor_backend", "ray"], "actor_backend: supported by IMPALA, CLEAR and PNC, not PPO"),
])
def test_actor_backend_flags_are_checked(argv, message):
    from continual.errors import UserError
    from continual.training.startup import parse_train_args

    arch = [] if "--architecture" in argv else ["--architecture", "IMPALA"]
    with pytest.raises(UserError, match=message):
        parse_train_args(["--env_id", "CartPole-v1", "--backend", "Gymnasium", *arch, *argv])
