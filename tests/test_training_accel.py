"""continual/training/accel.py: --compile and --cudagraphs. The default keeps PPO's eager functions themselves; the
flags are refused in one line where they cannot apply; compiled, PPO's act step and update loss are one graph each
(no silent fallback to eager) and a compiled run plays the pinned reference's games (tests/helpers/ppo_reference.py)
and ends at its weights to float rounding. Compiling costs ~30-60 s per run on a shared 2-core CPU: those are slow.
The CUDA graphs themselves need a GPU: the same slow tests check them there (docs/benchmarks/gpu.md)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from conftest import exit_2, write_config
from continual.config.args import Args
from continual.training.accel import compile_step

CARTPOLE = ["--env_id", "CartPole-v1", "--backend", "Gymnasium", "--num_envs", "2", "--num_steps", "32",
            "--no-progress-bar", "--total_timesteps", "64"]


def test_eager_is_the_function_itself():
    """Neither flag: PPO calls its own functions (the pinned references pin that run)."""
    def fn(x):
        return x + 1

    assert compile_step(fn, Args()) is fn
    assert compile_step(fn, dataclasses.replace(Args(), cudagraphs=True)) is fn  # validation refuses this alone


@pytest.mark.parametrize("flags,expect", [
    (["--architecture", "PPO_CBP", "--compile"], "compile: only used with --architecture PPO, not PPO_CBP"),
    (["--architecture", "DQN", "--compile"], "compile: only used with --architecture PPO, not DQN"),
    (["--cudagraphs"], "cudagraphs: replays the steps that --compile compiles; add --compile"),
    (["--compile", "--cudagraphs", "--no-cuda"], "cudagraphs: needs a CUDA device (none available, or --no-cuda)"),
    (["--compile", "--cudagraphs", "--num_minibatches", "5"], "num_envs*num_steps=64 is not a multiple of "
                                                               "num_minibatches=5"),
    (["--compile", "--cudagraphs", "--her"], "cudagraphs: needs static shapes; --her changes the minibatch size"),
], ids=["ppo-cbp", "dqn", "cudagraphs-alone", "cudagraphs-on-cpu", "uneven-minibatches", "her"])
def test_flags_are_refused_where_they_cannot_apply(tmp_path, capsys, flags, expect):
    from continual_training_example import main

    _, err = exit_2(main, [*CARTPOLE, "--runs_dir", str(tmp_path / "runs"), *flags], capsys)
    assert expect in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_compiled_act_and_loss_are_one_graph_each_with_the_eager_numbers():
    """MinAtar's CNN: the compiled act step draws the eager actions from the same random stream; the compiled loss
    gives the eager loss and gradient to float rounding. Each step is one graph (dynamo's counters: no graph break,
    no eager fallback), compiled once and reused."""
    from torch._dynamo.utils import counters

    from agents.ppo import Agent, act, ppo_loss

    args = dataclasses.replace(Args(), compile=True)
    torch.manual_seed(0)
    agent = Agent((6, 10, 10), 6)
    obs = torch.randint(0, 2, (64, 6, 10, 10)).float()
    before = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    steps = {"eager": (lambda x, inputs: act(agent, x, inputs), lambda *mb: ppo_loss(agent, args, *mb))}
    steps["compiled"] = tuple(compile_step(f, args) for f in steps["eager"])
    got = {}
    for name, (act_step, update_loss) in steps.items():
        torch.manual_seed(1)
        acted = [act_step(obs, {}) for _ in range(3)]
        action, logprob, value = acted[-1]
        mb = (obs, {}, torch.mean, action, logprob + 0.05 * torch.linspace(-1, 1, 64), torch.linspace(-1, 2, 64),
              value + 0.3, value)
        agent.zero_grad()
        for _ in range(2):
            loss, *stats = update_loss(*mb)
        loss.backward()
        got[name] = ([a for a, _, _ in acted], [lp for _, lp, _ in acted], loss.detach(), stats,
                     torch.cat([p.grad.flatten() for p in agent.parameters()]))
    (e_act, e_lp, e_loss, e_stats, e_grad), (c_act, c_lp, c_loss, c_stats, c_grad) = got["eager"], got["compiled"]
    assert all(torch.equal(a, b) for a, b in zip(e_act, c_act))
    for a, b in [*zip(e_lp, c_lp), (e_loss, c_loss), *zip(e_stats, c_stats)]:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(e_grad, c_grad, rtol=1e-4, atol=1e-6)
    assert counters["stats"]["unique_graphs"] - before[0] == 2  # act and loss: compiled once each, then reused
    assert sum(counters["graph_break"].values()) == before[1]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--compile"], ["--compile", "--cudagraphs"]], ids=["compile", "cudagraphs"])
def test_a_compiled_run_plays_the_games_of_the_eager_run(tmp_path, monkeypatch, flags):
    """The pinned MinAtar case (Breakout then SpaceInvaders) trained in-process with --compile: the eager games
    exactly and the eager weights to float rounding, and the compiled graphs ran (dynamo's counters: two graphs, no
    break, no recompile at the game switch; with CUDA, no step skipped its CUDA graph). The eager run: on a CPU the pinned reference (recorded eager), with
    CUDA an eager run of the case on the GPU (the device check, docs/benchmarks/gpu.md). On a CPU the cudagraphs case
    runs the --cudagraphs code path (mode "reduce-overhead", a graph-tree step per call) with validation bypassed,
    and torch.compile skips the CUDA graphs themselves."""
    from torch._dynamo.utils import counters

    from agents import ppo
    from continual.config import validation
    from helpers.ppo_reference import CASES, DATA, read_run

    argv = ["--config", write_config(tmp_path, CASES["minatar"]), "--runs_dir", str(tmp_path / "runs"),
            "--no-progress-bar"]
    if torch.cuda.is_available():
        ppo.main([*argv, "--run_name", "eager"])
        expected = read_run(str(tmp_path / "runs" / "eager"))
    else:
        monkeypatch.setattr(validation, "validate_compile_args", lambda args: None)  # --cudagraphs needs CUDA
        with open(os.path.join(DATA, "ppo_reference_minatar.json")) as f:
            expected = json.load(f)
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    skips = counters["inductor"]["cudagraph_skips"]
    ppo.main([*argv, "--run_name", "compiled", *flags])
    assert counters["stats"]["unique_graphs"] - graphs == 2 and sum(counters["graph_break"].values()) == breaks
    if torch.cuda.is_available() and "--cudagraphs" in flags:  # recorded and replayed, not skipped (inductor warns)
        assert counters["inductor"]["cudagraph_skips"] == skips
    got = read_run(str(tmp_path / "runs" / "compiled"))
    assert got["episodes"] == expected["episodes"] and len(got["episodes"]) > 20
    for name, w in expected["weights"].items():
        np.testing.assert_allclose([got["weights"][name]["sum"], got["weights"][name]["abs_sum"]],
                                   [w["sum"], w["abs_sum"]], rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got["weights"][name]["first"], w["first"], rtol=1e-4, atol=1e-5, err_msg=name)
