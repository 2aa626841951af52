"""continual.api: the Python API (train, evaluate, load_*) and the examples of docs/python_api.md, which run here as
they are written (in one namespace, in order, in a temporary folder), on CartPole with tiny budgets."""

from __future__ import annotations

import json
import os
import re
import signal

import pandas as pd
import pytest
import torch

from conftest import ROOT, write_config
from continual import api
from continual.config.args import Args
from continual.config.loading import Curriculum
from continual.curricula import FACTORIES, SequentialModificationFactory
from continual.errors import UserError
from continual.evaluation.table import COLUMNS

DOC = os.path.join(ROOT, "docs", "python_api.md")
CARTPOLE = dict(env_id="CartPole-v1", backend="Gymnasium", num_envs=2, num_steps=64, update_epochs=1,
                progress_bar=False)


def python_blocks(path: str) -> list[str]:
    """The page's ```python blocks (a block with a title, ```python title="x.py", is a script of its own: below)."""
    with open(path) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def script_block(path: str, name: str) -> str:
    with open(path) as f:
        return re.search(rf'```python title="{re.escape(name)}"\n(.*?)```', f.read(), re.S).group(1)


def test_the_page_has_examples_for_every_function():
    code = "\n".join(python_blocks(DOC))
    for name in ("train(", "evaluate(", "load_episodes(", "load_evaluations(", "load_metrics(", "make_args("):
        assert name in code, name


def test_docs_examples_run(tmp_path, monkeypatch, capsys):
    """Every ```python block of docs/python_api.md, in order, in one namespace; the outputs it shows are checked."""
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "docs_python_api"}
    for block in python_blocks(DOC):
        exec(compile(block, DOC, "exec"), ns)
    out = capsys.readouterr().out
    # the two-task run: both tasks were trained and evaluated, the switch at 1024
    assert ns["run_dir"] == ns["run_dir"].__class__("runs/cartpole_two_tasks")
    assert set(ns["episodes"]["modification"]) == {"", "gravity=15"}
    assert sorted(ns["evals"]["step"].unique()) == [0, 512, 1024, 1536, 2048]
    assert list(ns["results"]["modification"]) == ["", "gravity=15", "length=0.8"]
    # the page's printed errors are the messages raised
    shown = re.search(r"prints\n\n```\n(.*?)```", open(DOC).read(), re.S).group(1)
    for line in shown.splitlines():
        assert line in out, line
    # the function curriculum: asked per rollout (128 steps), a new string at 512
    sw = api.load_metrics(ns["fn_run"], kind="switch")
    assert sw["global_step"].tolist() == [512] and sw["modification"].tolist() == ["gravity=14.8"]
    assert ns["args"].seed == 7 and ns["curriculum"].factory == "Sequential"
    config = json.load(open(os.path.join(ns["config_run"], "config.json")))
    assert config["seed"] == 7 and config["modification_factory"] == "Sequential"


def test_train_bad_kwargs_are_one_line_user_errors_and_create_nothing(tmp_path):
    runs = tmp_path / "runs"
    cases = [
        (dict(lerning_rate=1e-3), "train(): unknown key 'lerning_rate'; did you mean 'learning_rate'?"),
        (dict(learning_rate="fast"), "learning_rate: expected a number, got 'fast'"),
        (dict(architecture="SAC"), "architecture: must be one of PPO, PPO_CBP, IMPALA, CLEAR, PNC, DQN, A2C; got 'SAC'"),
        (dict(num_envs=0), "num_envs: must be positive, got 0"),
        (dict(modifs="gravity=nope"), "modification 'gravity=nope': 'nope' is not a number"),
        (dict(resume="runs/x"), "resume: train() starts new runs"),
        (dict(_comment="x"), "train(): unknown key '_comment'"),
        (dict(curriculum=[("", 0)]), "modification_factory_kwargs.tasks[0].steps: must be a positive integer"),
        (dict(curriculum=[("", 64, "extra")]), "curriculum[0]: a task is (modifications, steps)"),
        (dict(curriculum=lambda step: "", total_timesteps=None), "total_timesteps: a curriculum given as a function needs total_timesteps"),
        (dict(curriculum=SequentialModificationFactory), "curriculum: give an instance or a function"),
        (dict(curriculum=[("", 256)], modification_factory="Sequential",
              modification_factory_kwargs={"num_total_steps": 256, "modifications": [""], "switching_thresholds": []}),
         "curriculum: given twice"),
    ]
    for kwargs, message in cases:
        with pytest.raises(UserError) as info:
            # total_timesteps: a case that wrongly passed would train for seconds, not for 10M steps
            api.train(**{**CARTPOLE, "runs_dir": str(runs), "total_timesteps": 256, **kwargs})
        assert "\n" not in str(info.value)
        if message is not None:
            assert str(info.value).startswith(message), (kwargs, str(info.value))
    with pytest.raises(UserError, match="args: expected an Args"):
        api.train({"env_id": "CartPole-v1"})
    assert not runs.exists()


def test_train_messages_are_the_cli_ones(tmp_path):
    """A value the CLI's validation refuses gives the same line from train() as from the command line (its main, in
    this process: tests/test_bad_input.py runs such refusals as processes too)."""
    from conftest import run_main

    for flags, kwargs in ((["--num_envs", "0"], dict(num_envs=0)),  # validation of Args
                          (["--modifs", "wings=2"], dict(modifs="wings=2"))):  # preflight (the backend)
        proc = run_main("continual_training_example.py", "--env_id", "CartPole-v1", "--backend", "Gymnasium",
                        *flags, "--total_timesteps", "256", "--runs_dir", str(tmp_path), check=False)
        assert proc.returncode == 2 and proc.stdout == ""
        with pytest.raises(UserError) as info:
            api.train(env_id="CartPole-v1", backend="Gymnasium", total_timesteps=256, runs_dir=str(tmp_path), **kwargs)
        assert proc.stderr.strip() == f"error: {info.value}"
    assert not os.listdir(tmp_path)


def test_make_args_order_args_then_config_then_kwargs(tmp_path):
    cfg = write_config(tmp_path, {"seed": 5, "learning_rate": 1e-3, "modification_factory": "Sequential",
                                  "modification_factory_kwargs": {"num_total_steps": 256, "modifications": [""],
                                                                  "switching_thresholds": []}}, "cfg.json")
    args, curriculum = api.make_args(Args(seed=2, gamma=0.9, **CARTPOLE), config=str(cfg), learning_rate=2e-3)
    assert (args.seed, args.gamma, args.learning_rate, args.config) == (5, 0.9, 2e-3, str(cfg))
    assert curriculum.factory == "Sequential"
    assert args.max_grad_norm == args.grad_clip_norm()  # resolved as the CLI resolves it
    # curriculum= replaces the file's
    _, curriculum = api.make_args(config=str(cfg), curriculum=[("", 128), ("length=0.8", 128)])
    assert curriculum.factory == "TaskSequence"


def test_as_curriculum_forms():
    assert api.as_curriculum(None) == Curriculum()
    spec = Curriculum("Sequential", {"num_total_steps": 10})
    assert api.as_curriculum(spec) is spec
    tasks = api.as_curriculum([("a", 5), {"env_id": "MinAtar/Breakout", "steps": 7}])
    assert tasks == Curriculum("TaskSequence", {"tasks": [{"modifications": "a", "steps": 5},
                                                          {"env_id": "MinAtar/Breakout", "steps": 7}]})
    seq = api.as_curriculum(SequentialModificationFactory(100, ["", "x"], [40], seed=3))
    assert seq.factory == "SequentialModificationFactory"
    assert seq.kwargs == {"num_total_steps": 100, "modifications": ["", "x"], "switching_thresholds": [40]}

    class Alternating:  # the seed's contract, as in modification_factories.py
        def __init__(self, num_total_steps, period):
            self.num_total_steps, self.period = num_total_steps, period

        def get_modification(self, step):
            return ["", "x"][(step // self.period) % 2]

    alt = api.as_curriculum(Alternating(300, 100))
    assert alt.kwargs == {"num_total_steps": 300} and alt.factory.endswith("Alternating")
    assert FACTORIES[alt.factory](300).get_modification(150) == "x"
    with pytest.raises(UserError, match="expected a list of tasks"):
        api.as_curriculum(42)
    with pytest.raises(UserError, match="the list of tasks is empty"):
        api.as_curriculum([])


@pytest.fixture(scope="module")
def two_task_run(tmp_path_factory):
    """A list-of-tasks curriculum whose first task ends inside a rollout (rollout 2 x 64 = 128 steps)."""
    runs = tmp_path_factory.mktemp("api") / "runs"
    sigint = signal.getsignal(signal.SIGINT)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_dir = api.train(**CARTPOLE, runs_dir=str(runs), run_name="two", curriculum=[("", 300), ("gravity=15", 212)],
                            eval_every=256, eval_episodes=2)
        handlers_back = signal.getsignal(signal.SIGINT) is sigint
        threads_back = torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    return run_dir, handlers_back, threads_back


def test_train_returns_the_run_directory_and_switches_at_the_first_rollout_after_a_task(two_task_run):
    run_dir, handlers_back, threads_back = two_task_run
    assert run_dir.is_dir() and run_dir.name == "two" and (run_dir / "config.json").is_file()
    switches = api.load_metrics(run_dir, kind="switch")
    assert switches["global_step"].tolist() == [384]  # task 1 ends at 300: the first rollout start at or after it
    assert switches["modification"].tolist() == ["gravity=15"]
    iterations = api.load_metrics(run_dir)
    assert iterations["global_step"].tolist() == list(range(128, 513, 128))
    assert iterations["modification"].tolist() == ["", "", "", "gravity=15"]
    assert handlers_back and threads_back  # the notebook's Ctrl-C and thread count are its own again


def test_load_functions_columns(two_task_run):
    run_dir = two_task_run[0]
    episodes = api.load_episodes(run_dir)
    assert isinstance(episodes, pd.DataFrame) and len(episodes)
    assert set(api.EPISODE_COLUMNS) <= set(episodes.columns)
    assert (episodes["return"] == episodes["length"]).all()  # CartPole: +1 per step
    evals = api.load_evaluations(str(run_dir))
    assert list(evals.columns) == COLUMNS
    assert sorted(evals["step"].unique()) == [0, 256, 512] and set(evals["modification"]) == {"", "gravity=15"}
    iterations = api.load_metrics(run_dir)
    assert {"global_step", "time", "iteration", "modification", "charts/SPS", "losses/policy_loss"} <= set(iterations)
    everything = api.load_metrics(run_dir, kind=None)
    assert {"iteration", "episode", "switch", "eval"} <= set(everything["kind"])


def test_load_metrics_drops_a_crash_cut_last_line(two_task_run, tmp_path):
    run_dir = two_task_run[0]
    copy = tmp_path / "cut"
    copy.mkdir()
    (copy / "config.json").write_text((run_dir / "config.json").read_text())
    text = (run_dir / "metrics.jsonl").read_text()
    (copy / "metrics.jsonl").write_text(text + '{"kind": "iteration", "global_st')
    assert len(api.load_metrics(copy, kind=None)) == len(text.splitlines())
    assert list(api.load_evaluations(copy).columns) == COLUMNS and api.load_evaluations(copy).empty
    with pytest.raises(UserError, match="is not a run directory"):
        api.load_episodes(tmp_path / "nothing")


def test_evaluate_returns_a_row_per_modification(two_task_run, tmp_path):
    run_dir = two_task_run[0]
    df = api.evaluate(run_dir, modifications=["", "gravity=15"], episodes=2, output=tmp_path / "ev")
    assert list(df["modification"]) == ["", "gravity=15"] and (df["episodes"] == 2).all()
    assert ["modification", "episodes", "mean", "std", "min", "max", "mean_length", "max_episode_steps",
            "capped"] == list(df.columns)
    assert df["max_episode_steps"].isna().all() and (df["capped"] == 0).all()  # whole games
    assert (tmp_path / "ev.csv").is_file()
    one = api.evaluate(run_dir / "ppo.cleanrl_model", modifications="length=0.8", episodes=1,
                       output=tmp_path / "one")
    assert list(one["modification"]) == ["length=0.8"]
    with pytest.raises(UserError, match="eval_episodes: must be positive"):
        api.evaluate(run_dir, episodes=0)
    with pytest.raises(UserError, match="episodes: expected an integer"):
        api.evaluate(run_dir, episodes=2.5)


def test_ctrl_c_saves_an_interrupted_checkpoint_and_raises_keyboard_interrupt(tmp_path):
    """SIGINT during train(): the iteration finishes, an interrupted checkpoint is saved, KeyboardInterrupt (not
    SystemExit) reaches the caller, and the caller's SIGINT handler is back."""
    import threading
    import time

    sigint = signal.getsignal(signal.SIGINT)
    metrics = tmp_path / "cut" / "metrics.jsonl"

    def press_ctrl_c_after_the_first_iteration():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.exists() and '"iteration"' in metrics.read_text():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=press_ctrl_c_after_the_first_iteration, daemon=True)
    thread.start()
    with pytest.raises(KeyboardInterrupt, match="holds an interrupted checkpoint; continue it with "
                                                "`python continual_training_example.py --resume "):
        api.train(**CARTPOLE, runs_dir=str(tmp_path), run_name="cut", total_timesteps=100_000)
    thread.join()
    assert signal.getsignal(signal.SIGINT) is sigint
    names = os.listdir(tmp_path / "cut" / "checkpoints")
    assert any(n.startswith("interrupted__step") for n in names), names
    assert api.load_metrics(tmp_path / "cut")["global_step"].max() < 100_000


def test_docs_atari_example_runs_as_a_plain_script(tmp_path):
    """The page's Atari example, as written, without `if __name__ == "__main__":`: HackAtari Freeway's envs run in
    worker processes (2 envs: async, training and evaluation), which must not run the script again; exit 0, three
    rows of games capped at 100 steps, nothing about a bootstrapping phase."""
    import subprocess
    import sys

    pytest.importorskip("hackatari")
    code = script_block(DOC, "freeway.py")
    assert "__main__" not in code.replace('`if __name__ == "__main__":`', "")
    (tmp_path / "freeway.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": ROOT, "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "freeway.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bootstrapping" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert os.listdir(tmp_path / "runs") == ["freeway_plain_script"]  # one run: no worker started another
    table = [ln.split() for ln in proc.stdout.splitlines() if ln.split()[:1] in (["0"], ["1"], ["2"])]
    assert [row[-3:] for row in table] == [["100.0", "100", "2"]] * 3, proc.stdout[-2000:]


MAIN_CHECK = """
import sys
sys.path.insert(0, {root!r})
from continual.processes import unguarded_main_call

def call():
    return unguarded_main_call()

print("top", call())
if __name__ == "__main__":
    print("guarded", call())
"""


def test_an_unguarded_top_level_call_is_told_from_a_guarded_one(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text(MAIN_CHECK.format(root=ROOT))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    lines = dict(ln.split(" ", 1) for ln in out.splitlines())
    assert lines["top"] == f"{script}:9" and lines["guarded"] == "None"
    # interactive use (no main file): nothing to protect
    proc = subprocess.run([sys.executable, "-c", MAIN_CHECK.format(root=ROOT)], capture_output=True, text=True,
                          check=True)
    assert proc.stdout.split() == ["top", "None", "guarded", "None"]


def test_a_call_reached_again_inside_a_worker_is_one_line_naming_the_guard(monkeypatch, tmp_path):
    monkeypatch.setattr(api, "importing_main_in_worker", lambda: True)
    with pytest.raises(UserError, match='put the script\'s calls under `if __name__ == "__main__":`'):
        api.train(**CARTPOLE, runs_dir=str(tmp_path), total_timesteps=128)
    assert not os.listdir(tmp_path)
