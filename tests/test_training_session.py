"""Default flags survive a crash: periodic checkpoints by wall time (--checkpoint_minutes, default 5), SIGKILL at a
random moment after the first one, --resume, and the run ends with the schedule of an uninterrupted run.

- the checkpoint rule itself, in process with a fake clock (when a periodic checkpoint is due, pruning);
- the shipped run_config.json with its default flags, a reduced budget and --checkpoint_minutes lowered so that
  every iteration checkpoints (default suite);
- `-m slow`: the shipped run_config.json with every default, killed after its first 5-minute checkpoint.

The reference schedule is the factory's own: training asks the curriculum at the first step of every rollout, and
the factory is a pure function of the step (no state to carry), so an uninterrupted run switches exactly where
`factory.get_modification(step)` changes (tests/test_training_faults.py compares against real uninterrupted runs).
"""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import continual_training_example
from conftest import ROOT, exit_2, run_main, run_script
from continual.config.args import Args
from continual.config.loading import parse_args
from continual.training.checkpoint import latest_checkpoint, load_checkpoint
from continual.training.tracking import read_metrics

SHIPPED = os.path.join(ROOT, "run_config.json")


# --------------------------------------------------------------------------------------------------------------------
# the rule: a periodic checkpoint once --checkpoint_minutes have passed since the last checkpoint of any kind
# --------------------------------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _session(tmp_path, monkeypatch, *flags: str, register: bool = True):
    import continual.training.session as session_module
    from continual.training.startup import start_run

    clock = FakeClock()
    monkeypatch.setattr(session_module.time, "monotonic", clock)
    argv = ["--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2", "--num_steps", "32",
            "--runs_dir", str(tmp_path / "runs"), "--run_name", "r", "--total_timesteps", "64000", *flags]
    args, curriculum = parse_args(argv)
    session = start_run(args, curriculum, None, granularity=args.rollout_size())
    if register:  # placeholders: checkpoints need a model and an optimizer state
        session.register("model", dict)
        session.register("optimizer", dict)
    return session, clock


def _names(session) -> list[str]:
    return sorted(os.path.basename(p)[: -len(".cleanrl_model")]
                  for p in glob.glob(os.path.join(session.checkpoint_dir, "*.cleanrl_model")))


def test_defaults_checkpoint_every_5_minutes_and_keep_3():
    assert Args().checkpoint_minutes == 5.0 and Args().keep_checkpoints == 3 and Args().checkpoint_every == 0


def test_time_rule_with_a_fake_clock(tmp_path, monkeypatch):
    """Iterations of 70 s: a periodic checkpoint at the first iteration end >= 300 s after the last checkpoint
    (hand computed: 350, 700, 1050, ... s), the newest 3 kept."""
    session, clock = _session(tmp_path, monkeypatch)
    try:
        saved_at = []
        for i in range(1, 31):
            clock.now += 70.0
            session.global_step = 64 * i
            before = set(_names(session))
            session.end_iteration(i, {})
            if set(_names(session)) - before:
                saved_at.append((i, clock.now - 1000.0))
        # 5 iterations (350 s) between checkpoints: 70 * 4 = 280 < 300 <= 350
        assert saved_at == [(5 * k, 350.0 * k) for k in range(1, 7)]
        assert _names(session) == [f"periodic__step{64 * i}" for i in (20, 25, 30)]
    finally:
        session.close()


def test_any_checkpoint_restarts_the_clock_and_switch_checkpoints_are_kept(tmp_path, monkeypatch):
    session, clock = _session(tmp_path, monkeypatch, "--keep_checkpoints", "1")
    try:
        for i in range(1, 13):
            clock.now += 100.0
            session.global_step = 64 * i
            if i in (2, 7):  # as a before-switch hook does with --save_agent_with_switch
                session.request_checkpoint(f"switch__x__step{64 * i}")
                session.flush_checkpoints()
            session.end_iteration(i, {})
        # switch at 200 s and 700 s restart the clock: periodic at 500 s (i=5), 1000 s (i=10); keep 1
        assert _names(session) == ["periodic__step640", "switch__x__step128", "switch__x__step448"]
    finally:
        session.close()


def test_step_and_time_rules_together_and_zero_turns_time_off(tmp_path, monkeypatch):
    session, clock = _session(tmp_path, monkeypatch, "--checkpoint_minutes", "0", "--checkpoint_every", "256",
                              "--keep_checkpoints", "10")
    try:
        for i in range(1, 9):
            clock.now += 10_000.0
            session.global_step = 64 * i
            session.end_iteration(i, {})
        assert _names(session) == ["periodic__step256", "periodic__step512"]
    finally:
        session.close()


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_checkpoint_minutes_must_be_finite_and_non_negative(value, tmp_path, capsys):
    out, err = exit_2(continual_training_example.main, ["--env_id", "CartPole-v1", "--backend", "Gymnasium",
                      "--runs_dir", str(tmp_path / "runs"), f"--checkpoint_minutes={value}"], capsys)
    assert out == ""
    assert err.startswith("error: checkpoint_minutes") and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------------------------------
# the state an agent registers, the RNGs, and the loop's tail (RunSession.register, iterations, running)
# --------------------------------------------------------------------------------------------------------------------


def _registered(session, net: torch.nn.Module, opt: torch.optim.Optimizer, counter: dict, optional_extra=False):
    session.register("model", net.state_dict, net.load_state_dict)
    session.register("optimizer", opt.state_dict, opt.load_state_dict)
    session.register("counter", lambda: dict(counter), counter.update)
    if optional_extra:
        session.register("extra", lambda: {"x": 1}, lambda state: counter.update(extra=state), optional=True)


def _net_and_opt(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    return net, opt


def test_registered_state_and_rngs_come_back_equal_after_resume(tmp_path, monkeypatch):
    """Saved: a model, its Adam state after a step, a plain dict; torch's, Python's and the session's numpy RNG.
    A resumed session loads each state as it is registered (into freshly built, different objects) and puts the
    RNGs back before the first iteration, whatever was drawn while building."""
    session, _ = _session(tmp_path, monkeypatch, "--no-progress-bar", register=False)
    net, opt = _net_and_opt(0)
    net(torch.ones(4, 3)).sum().backward()
    opt.step()
    counter = {"updates": 7}
    _registered(session, net, opt, counter)
    session.global_step = 192
    path = session.save("periodic__step192")
    draws = (torch.rand(3), random.random(), session.np_rng.random())  # the draws that follow the checkpoint
    session.close()

    from continual.training.startup import parse_train_args, start_run

    args, curriculum, resume_state = parse_train_args(["--resume", path, "--no-progress-bar"])
    resumed = start_run(args, curriculum, resume_state, granularity=args.rollout_size())
    try:
        net2, opt2 = _net_and_opt(1)  # other weights, no optimizer state: building draws from torch's RNG
        counter2: dict = {}
        _registered(resumed, net2, opt2, counter2, optional_extra=True)  # "extra": not in the checkpoint, optional
        for k, t in net.state_dict().items():
            assert torch.equal(t, net2.state_dict()[k]), k
        for p, p2 in zip(net.parameters(), net2.parameters()):
            for k in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(opt.state[p][k], opt2.state[p2][k]), k
        assert counter2 == {"updates": 7}
        torch.rand(5), random.random(), resumed.np_rng.random()  # whatever the setup draws
        iterations = resumed.iterations()
        assert next(iterations) == 192 // 64 + 1  # the iteration after the checkpoint's
        again = (torch.rand(3), random.random(), resumed.np_rng.random())
        assert torch.equal(again[0], draws[0]) and again[1:] == draws[1:]
        assert resumed.num_iterations == 64000 // 64
    finally:
        resumed.close()


def test_an_agent_that_registers_no_model_or_optimizer_fails_clearly(tmp_path, monkeypatch):
    session, _ = _session(tmp_path, monkeypatch, "--no-progress-bar", register=False)
    try:
        session.register("model", dict)
        with pytest.raises(RuntimeError, match=r"registered no 'optimizer' state \(session.register\)"):
            next(session.iterations())
        with pytest.raises(RuntimeError, match=r"cannot checkpoint: the agent registered no 'optimizer'"):
            session.save("x")
        with pytest.raises(ValueError, match="'model' is already registered"):
            session.register("model", dict)
        with pytest.raises(ValueError, match="'global_step' is written by the session itself"):
            session.register("global_step", int)
    finally:
        session.close()


def test_resuming_a_checkpoint_that_lacks_a_required_state_is_one_line(tmp_path, monkeypatch):
    session, _ = _session(tmp_path, monkeypatch, "--no-progress-bar", register=False)
    net, opt = _net_and_opt(0)
    _registered(session, net, opt, {})
    path = session.save("periodic__step64")
    session.close()
    from continual.errors import UserError
    from continual.training.startup import parse_train_args, start_run

    args, curriculum, resume_state = parse_train_args(["--resume", path, "--no-progress-bar"])
    resumed = start_run(args, curriculum, resume_state, granularity=args.rollout_size())
    try:
        _registered(resumed, *_net_and_opt(1), {})
        with pytest.raises(UserError, match=r"cannot be resumed: it holds no 'target_model'"):
            resumed.register("target_model", dict, lambda state: None)
    finally:
        resumed.close()


@pytest.mark.parametrize("compiled", [False, True], ids=["compile-false", "compile-true"])
def test_a_checkpoint_saved_with_compile_resumes_and_may_switch_it(tmp_path, monkeypatch, compiled):
    """--compile (issue 18, gone in issue 31, back in issue 51 with --cudagraphs): a checkpoint whose saved args hold
    it at either value and no cudagraphs key (saved before issue 31) resumes with its saved configuration, and a
    resume may switch --compile (the same steps to float rounding)."""
    from continual.config.loading import args_to_dict
    from continual.training.startup import parse_train_args, start_run

    session, _ = _session(tmp_path, monkeypatch, "--no-progress-bar", "--seed", "7", register=False)
    net, opt = _net_and_opt(0)
    _registered(session, net, opt, {})
    path = session.save("periodic__step64")
    saved = args_to_dict(session.args)
    session.close()
    state = torch.load(path, map_location="cpu", weights_only=True)
    state["args"]["compile"] = compiled
    del state["args"]["cudagraphs"]
    torch.save(state, path)

    args, curriculum, resume_state = parse_train_args(["--resume", path, "--no-progress-bar"])
    assert args_to_dict(args) == {**saved, "resume": path, "compile": compiled} and args.seed == 7
    switched, _, _ = parse_train_args(["--resume", path, "--no-progress-bar", "--no-compile" if compiled else "--compile"])
    assert switched.compile is not compiled
    resumed = start_run(args, curriculum, resume_state, granularity=args.rollout_size())
    try:
        net2, opt2 = _net_and_opt(1)
        _registered(resumed, net2, opt2, {})
        assert all(torch.equal(t, net2.state_dict()[k]) for k, t in net.state_dict().items())
    finally:
        resumed.close()


def test_running_owns_the_tail_failure_interruption_and_close(tmp_path, monkeypatch):
    """A TrainingError in the block: the last completed iteration is saved (crash__), the error comes back as one
    line naming it; a signal: interrupted__ checkpoint, exit code 128 + signal; either way what `closing` was given
    is closed, newest first, before the session's callbacks."""
    from continual.errors import TrainingError

    closed: list[str] = []
    session, _ = _session(tmp_path, monkeypatch, "--no-progress-bar", register=False)
    session.closing(lambda: closed.append("envs"))
    session.closing(lambda: closed.append("fleet"))
    _registered(session, *_net_and_opt(0), {})
    with pytest.raises(TrainingError, match=r"env worker died; saved .*crash__step64\.cleanrl_model"):
        with session.running():
            for iteration in session.iterations():
                session.global_step = 64 * iteration
                if iteration == 2:
                    raise TrainingError("env worker died")
                session.end_iteration(iteration, {})
    assert closed == ["fleet", "envs"]

    session, _ = _session(tmp_path / "b", monkeypatch, "--no-progress-bar", register=False)
    _registered(session, *_net_and_opt(0), {})
    with pytest.raises(SystemExit) as stop:
        with session.running():
            for iteration in session.iterations():
                session.global_step = 64 * iteration
                session.end_iteration(iteration, {})
                session.stop_signal = signal.SIGTERM if iteration == 3 else None
    assert stop.value.code == 128 + signal.SIGTERM
    assert "interrupted__step192" in _names(session)

    session, _ = _session(tmp_path / "c", monkeypatch, "--no-progress-bar", register=False)
    _registered(session, *_net_and_opt(0), {})
    with pytest.raises(SystemExit) as stop:  # the signal reached the actors too: an interruption, not a failure
        with session.running(interrupted_by=(TrainingError,)):
            session.global_step = 64
            session.stop_signal = signal.SIGINT
            raise TrainingError("actor 0 died")
    assert stop.value.code == 128 + signal.SIGINT and "interrupted__step64" in _names(session)


# --------------------------------------------------------------------------------------------------------------------
# SIGKILL at a random moment after the first checkpoint, then --resume
# --------------------------------------------------------------------------------------------------------------------


def _factory_schedule(total: int) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(switches, regime of each iteration record) of an uninterrupted run of the shipped config, from its factory."""
    from continual.training.startup import build_factory

    args, curriculum = parse_args(["--config", SHIPPED])
    rollout = args.rollout_size()
    factory = build_factory(args, curriculum, rollout)
    switches, iterations = [], []
    current = factory.get_modification(0)
    for start in range(0, total, rollout):
        new = factory.get_modification(start)
        if new != current:
            switches.append((start, new))
            current = new
        iterations.append((start + rollout, current))
    return switches, iterations


def _count(path: str, kind: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if f'"kind": "{kind}"' in line)


def _kill_after_first_checkpoint(run_dir: str, argv: list[str], rng: random.Random, total: int,
                                 wait_s: float, skip_if_done: bool = False, leave: int = 1) -> dict:
    """Start a training run in its own process group, wait for its first checkpoint, let it run on for a random
    fraction of an iteration or more, SIGKILL the whole group (a preempted node, the OOM killer)."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "continual_training_example.py", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    ckpts = os.path.join(run_dir, "checkpoints", "*.cleanrl_model")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    try:
        t_start = time.time()
        deadline = t_start + wait_s
        while proc.poll() is None and not glob.glob(ckpts) and time.time() < deadline:
            time.sleep(0.05)
        if skip_if_done and not glob.glob(os.path.join(run_dir, "checkpoints", "periodic__*")):
            if proc.poll() is None and glob.glob(os.path.join(run_dir, "checkpoints", "final__*")):
                proc.wait(timeout=600)  # the final checkpoint came first: the run is ending (seen 2026-12-01)
        if skip_if_done and proc.poll() == 0 and not glob.glob(os.path.join(run_dir, "checkpoints", "periodic__*")):
            pytest.skip(f"the run ended after {time.time() - t_start:.0f} s, before its first periodic checkpoint: "
                        f"on this machine a crash could not lose more than the interval")
        assert proc.poll() is None, f"the run ended before it was killed: {proc.stderr.read()[-2000:]}"
        assert glob.glob(ckpts), f"no checkpoint within {wait_s} s"
        # a random number of further iterations (0 .. all but the last `leave`), then a random moment inside the next
        # one (the sleep below lasts up to an observed iteration: a last one that ran shorter ended the true-defaults
        # run before its kill, 2026-12-01, hence leave=2 there)
        first = _count(metrics, "iteration")
        target = first + rng.randint(0, max(0, total - first - leave))
        seen, t_seen = first, [time.time()]
        while proc.poll() is None and seen < target:
            time.sleep(0.05)
            if _count(metrics, "iteration") > seen:
                seen, t_seen = _count(metrics, "iteration"), t_seen + [time.time()]
        # an iteration's duration as observed (before any was observed: half the time to the first checkpoint)
        iteration_s = (t_seen[-1] - t_seen[0]) / (len(t_seen) - 1) if len(t_seen) > 1 else (t_seen[0] - t_start) / 2
        time.sleep(rng.random() * iteration_s)
        assert proc.poll() is None, "the run ended before it was killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return {"iterations_at_kill": _count(metrics, "iteration"),
            "resume_step": load_checkpoint(latest_checkpoint(run_dir))["global_step"]}


def _assert_resumed_like_uninterrupted(run_dir: str, total: int) -> None:
    switches, iterations = _factory_schedule(total)
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [(r["global_step"], r["modification"]) for r in records if r["kind"] == "switch"] == switches
    assert [(r["global_step"], r["modification"]) for r in records if r["kind"] == "iteration"] == iterations
    # every episode once: the same (step, regime) never logged twice by the killed and the resumed process
    eps = [(r["global_step"], r.get("env"), r["return"], r["length"]) for r in records if r["kind"] == "episode"]
    assert len(eps) == len(set(eps))
    evals = [(r["global_step"], r["modification"]) for r in records if r["kind"] == "eval"]
    assert len(evals) == len(set(evals)), "an evaluation was logged twice"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir)
    acc.Reload()
    assert [e.step for e in acc.Scalars("charts/SPS")] == [s for s, _ in iterations], "TensorBoard steps"
    names = [os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "checkpoints", "*"))]
    assert f"final__step{total}.cleanrl_model" in names
    assert len([n for n in names if n.startswith("periodic__")]) <= 3, names  # --keep_checkpoints 3
    assert not [n for n in names if n.startswith(".tmp")]
    final = load_checkpoint(os.path.join(run_dir, "checkpoints", f"final__step{total}.cleanrl_model"))
    assert final["switches"] == len(switches) and final["modification"] == iterations[-1][1]


# slow since 2026-12-02 (46-95 s): a PPO run killed and resumed stays in the default suite
# (tests/test_agents_ppo.py::test_interrupted_run_resumes_with_the_same_schedule, and the fault cases)
@pytest.mark.parametrize("seed", [16])  # kills about halfway through the last rollout, after the second checkpoint
@pytest.mark.slow
def test_default_run_killed_after_a_checkpoint_resumes_with_the_same_schedule(tmp_path, seed):
    """The shipped run_config.json and default flags; only the budget (3 rollouts) and the checkpoint interval (every
    iteration) are lowered so that this runs in a couple of minutes."""
    total = 3 * 1024
    runs, name = str(tmp_path / "runs"), "cut"
    run_dir = os.path.join(runs, name)
    argv = ["--config", SHIPPED, "--runs_dir", runs, "--run_name", name, "--total_timesteps", str(total),
            "--checkpoint_minutes", "0.001", "--no-progress-bar"]
    killed = _kill_after_first_checkpoint(run_dir, argv, random.Random(seed), total // 1024, wait_s=900)
    assert 0 < killed["resume_step"] < total or killed["iterations_at_kill"] == total // 1024
    run_main("continual_training_example.py", "--resume", run_dir, "--no-progress-bar")
    _assert_resumed_like_uninterrupted(run_dir, total)
    # the evaluation rounds of an uninterrupted run: step 0 and the end (eval_every 18432 > the budget)
    evals = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert sorted({r["global_step"] for r in evals if r["kind"] == "eval"}) == [0, total]


@pytest.mark.slow
def test_true_defaults_killed_after_the_first_5_minute_checkpoint(tmp_path):
    """Every default (run_config.json as shipped, --checkpoint_minutes 5): the first periodic checkpoint comes 5
    minutes in; SIGKILL at a random moment after it, resume, and the full curriculum ends as an uninterrupted run.
    About twice a full default run (~4 min on a quiet 2-core machine, then skipped: no checkpoint before the end;
    ~30-90 min on a loaded one)."""
    args, _ = parse_args(["--config", SHIPPED])
    total = 73728
    runs, name = str(tmp_path / "runs"), "cut"
    run_dir = os.path.join(runs, name)
    argv = ["--config", SHIPPED, "--runs_dir", runs, "--run_name", name, "--no-progress-bar"]
    t0 = time.time()
    killed = _kill_after_first_checkpoint(run_dir, argv, random.Random(5), total // args.rollout_size(),
                                          wait_s=3600, skip_if_done=True, leave=2)
    first = min(glob.glob(os.path.join(run_dir, "checkpoints", "*.cleanrl_model")), key=os.path.getmtime)
    assert os.path.getmtime(first) - t0 >= 300, "a periodic checkpoint before 5 minutes"
    run_script("continual_training_example.py", "--resume", run_dir, "--no-progress-bar", timeout=7200)
    _assert_resumed_like_uninterrupted(run_dir, total)
    eval_steps = sorted({r["global_step"] for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))
                         if r["kind"] == "eval"})
    assert eval_steps == [0, 18432, 36864, 55296, 73728]
    print(f"killed after {killed['iterations_at_kill']} iterations, resumed from step {killed['resume_step']}")
