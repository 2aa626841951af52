"""agents/dqn_seeds.py: K seeds of agents/dqn.py's DQN in one process learn what K runs of dqn.py learn.

The update of every seed at once against dqn.py's update seed by seed (its loss, the real CChain extension's hooks in
dqn.py's order, one torch Adam per seed), bit for bit and against a float64 recomputation; whole runs on real MinAtar
games (a padded task sequence with a switch, random steps per regime, C-CHAIN, target copies, evaluations) against
dqn.py --seed s, record by record and checkpoint by checkpoint."""

from __future__ import annotations

import copy
import dataclasses
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from agents import dqn, dqn_seeds
from conftest import ROOT, write_config
from continual.plasticity.c_chain import CChain, Schedule
from continual.training.checkpoint import step_of
from helpers import corridor_envs  # noqa: F401  (registers Corridor-v0)
from helpers.run_records import assert_same_run, records

SHAPE, ACTIONS, BATCH = (10, 10, 10), 6, 32
# C-CHAIN's automatic coefficient from the second record on (the paper's warmup is 10,000 updates)
QUICK = Schedule(target=0.01, initial=50.0, window=4, warmup=2)


def _batches(rng: np.random.Generator, num_seeds: int, n: int, dtype=np.float32) -> list[tuple]:
    """n updates' (K, B, ...) MinAtar-like batches (sparse 0/1 grids) and reference batches."""
    def grids():
        return (rng.random((num_seeds, BATCH) + SHAPE) < 0.1).astype(dtype)
    return [((grids(), rng.integers(0, ACTIONS, (num_seeds, BATCH)).astype(np.int32),
              rng.random((num_seeds, BATCH)).astype(dtype), rng.random((num_seeds, BATCH)) < 0.05, grids()), grids())
            for _ in range(n)]


def _dqn_updates(nets: list, batches: list, c_chain: bool, fused: bool, target_every: int) -> dict:
    """dqn.py's update loop, seed by seed: its loss, the CChain extension's hooks in its order, its Adam."""
    out = {"td": [], "churn": [], "coef": []}
    runs = []
    for net in nets:
        opt = torch.optim.Adam(net.parameters(), lr=3e-4, **({"fused": True} if fused else {"foreach": True}))
        target = copy.deepcopy(net)
        runs.append((net, opt, target, CChain(net, QUICK, dqn.CONTINUAL.c_chain) if c_chain else None))
    for i, (batch, ref) in enumerate(batches):
        td, churn, coef = [], [], []
        for k, (net, opt, target, ext) in enumerate(runs):
            b_obs, b_actions, b_rewards, b_terminated, b_next = (torch.as_tensor(x[k]) for x in batch)
            with torch.no_grad():
                y = dqn.td_target(b_rewards, b_terminated, 0.99, target(b_next), net(b_next))
            loss = torch.nn.functional.mse_loss(y, net(b_obs).gather(1, b_actions.long().unsqueeze(1)).squeeze(1))
            total = loss
            if ext is not None:
                coef.append(ext.coef)
                total = ext.loss(loss, net, {"main_loss": loss, "reference_obs": lambda k=k: torch.as_tensor(ref[k])})
                churn.append(ext._record[1])
            opt.zero_grad()
            total.backward()
            if ext is not None:
                ext.before_step()
            opt.step()
            if ext is not None:
                ext.after_step(opt)
            td.append(loss.detach())
            if (i + 1) % target_every == 0:
                target.load_state_dict(net.state_dict())
        out["td"].append(torch.stack(td))
        out["churn"].append(None if not churn or churn[0] is None else torch.stack([c.detach() for c in churn]))
        out["coef"].append(coef)
    out["params"] = [{n: p.detach() for n, p in net.named_parameters()} for net, *_ in runs]
    return out


def _seeds_updates(nets: list, batches: list, c_chain: bool, fused: bool, target_every: int) -> dict:
    """The same updates through dqn_seeds.update: stacked parameters, one Adam, C-CHAIN's coefficients per seed."""
    from continual.plasticity.c_chain import AutoCoefficient
    params = dqn_seeds.stack(nets, split_unaligned=fused)
    for t in dqn_seeds.leaves(params):
        t.requires_grad_()
    target_params = dqn_seeds.stack(nets)
    ref_params = dqn_seeds.stack(nets) if c_chain else {}
    coefficients = [AutoCoefficient(QUICK) for _ in nets]
    opt = torch.optim.Adam(dqn_seeds.leaves(params), lr=3e-4, **({"fused": True} if fused else {"foreach": True}))
    forward = dqn_seeds.seed_forward(nets[0])
    out = {"td": [], "churn": [], "coef": []}
    for i, (batch, ref) in enumerate(batches):
        with_ref = c_chain and i >= QUICK.first_update
        coefs = [c.coef for c in coefficients]
        td, churn, _ = dqn_seeds.update(forward, params, target_params, ref_params, opt,
                                        [torch.as_tensor(x) for x in batch], torch.as_tensor(ref) if with_ref else None,
                                        coefs if with_ref else None, 0.99, True, step=i)
        if c_chain:
            for c, main, ch in zip(coefficients, td.tolist(), churn.tolist() if with_ref else [None] * len(nets)):
                c.record(main, ch)
        if (i + 1) % target_every == 0:
            dqn_seeds.assign(target_params, lambda name, k: params[name][k])
        out["td"].append(td)
        out["churn"].append(churn)
        out["coef"].append(coefs if c_chain else [])
    out["params"] = [{n: dqn_seeds.seed_params(params, k)[n].detach() for n in params} for k in range(len(nets))]
    out["grads"] = params
    return out


class Float64QNetwork(dqn.QNetwork):
    """dqn.QNetwork computing in float64 (its features() casts inputs to float32)."""

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.double())


def _nets(num_seeds: int, dtype=torch.float32) -> list:
    nets = []
    for k in range(num_seeds):
        torch.manual_seed(100 + k)
        nets.append((Float64QNetwork if dtype == torch.float64 else dqn.QNetwork)(SHAPE, ACTIONS).to(dtype))
    return nets


@pytest.mark.parametrize("c_chain", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_the_update_of_k_seeds_is_dqns_update_of_each(c_chain, fused):
    """12 updates of 3 seeds (a target copy every 4, C-CHAIN's term from the second, its automatic coefficient from
    the third): every seed's TD losses, churn terms, coefficients and weights equal, bit for bit, those of dqn.py's
    update with the seed's own network, optimizer and CChain extension (fused Adam: the unaligned head biases stay
    per seed, dqn_seeds.ALIGNED)."""
    torch.set_num_threads(1)
    batches = _batches(np.random.default_rng(0), 3, 12)
    ref = _dqn_updates(_nets(3), batches, c_chain, fused, target_every=4)
    got = _seeds_updates(_nets(3), batches, c_chain, fused, target_every=4)
    for i in range(len(batches)):
        assert torch.equal(got["td"][i], ref["td"][i]), i
        assert (got["churn"][i] is None) == (ref["churn"][i] is None), i
        if got["churn"][i] is not None:
            assert torch.equal(got["churn"][i], ref["churn"][i]), i
        assert got["coef"][i] == ref["coef"][i], i
    if c_chain:
        assert ref["coef"][-1][0] != QUICK.initial  # the automatic coefficient took over
    for k in range(3):
        for name, p in ref["params"][k].items():
            assert torch.equal(got["params"][k][name], p), (k, name)


def test_the_update_against_a_float64_recomputation():
    """One Double DQN + C-CHAIN update (its second, with a reference) of 3 seeds: the float32 losses and each seed's
    gradient against dqn.py's update computed in float64."""
    torch.set_num_threads(1)
    batches = _batches(np.random.default_rng(1), 3, 2)
    got = _seeds_updates(_nets(3), batches, True, False, target_every=100)
    batches64 = [(tuple(x.astype(np.float64) if x.dtype == np.float32 else x for x in b), r.astype(np.float64))
                 for b, r in batches]
    nets64 = _nets(3, torch.float64)
    ref = _dqn_updates(nets64, batches64, True, False, target_every=100)
    np.testing.assert_allclose(got["td"][1].numpy(), ref["td"][1].numpy(), rtol=1e-5)
    np.testing.assert_allclose(got["churn"][1].numpy(), ref["churn"][1].numpy(), rtol=1e-4)
    for k, net in enumerate(nets64):
        for name, p in net.named_parameters():
            g = got["grads"][name]
            g = g[k].grad if isinstance(g, list) else g.grad[k]
            np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-3, atol=1e-6, err_msg=f"{k} {name}")


# --- whole runs ---------------------------------------------------------------------------------------------------
# Continual MinAtar's protocol in small: a sequence of two games padded to 10 channels, random steps and no training
# at the start of each, one update per env step, Double DQN, C-CHAIN, fused Adam, target copies, greedy evaluations
RUN = {
    "backend": "MinAtar", "env_id": "MinAtar/SpaceInvaders", "num_envs": 1, "num_steps": 100,
    "learning_rate": 0.0003, "anneal_lr": False, "reward_scaling": "none", "buffer_size": 2000,
    "learning_starts": 100, "learning_starts_each_regime": True, "train_frequency": 1,
    "target_network_frequency": 150, "replay_batch_size": 32, "start_e": 1.0, "end_e": 0.1,
    "exploration_fraction": 0.25, "double_dqn": True, "c_chain": True, "fused_adam": True, "torch_threads": 1,
    "eval_every": 200, "eval_episodes": 2, "eval_greedy": True, "checkpoint_every": 300, "keep_checkpoints": 5,
    "modification_factory": "TaskSequence",
    "modification_factory_kwargs": {"cycles": 1, "tasks": [{"env_id": "MinAtar/SpaceInvaders", "steps": 400},
                                                           {"env_id": "MinAtar/Asterix", "steps": 400}]},
}
# vector observations (an MLP), two envs per seed, an update every 2 steps, plain DQN targets, foreach Adam, 2 switches
CORRIDOR = {"env_id": "helpers.corridor_envs:Corridor-v0", "backend": "Gymnasium", "num_envs": 2, "num_steps": 16,
            "reward_scaling": "none", "learning_starts": 64, "buffer_size": 300, "train_frequency": 2,
            "target_network_frequency": 64, "replay_batch_size": 16, "exploration_fraction": 0.5,
            "learning_rate": 1e-3, "checkpoint_every": 512,
            "modification_factory": "SequentialModificationFactory",
            "modification_factory_kwargs": {"num_total_steps": 1536, "modifications": ["", "goal=3", "goal=6"],
                                            "switching_thresholds": [512, 1024]}}


@pytest.mark.parametrize("data, seeds, switches", [(RUN, ("4", "9"), 1), (CORRIDOR, ("2", "5"), 2)],
                         ids=["minatar_c_chain", "corridor"])
def test_each_seed_is_its_dqn_run(tmp_path, data, seeds, switches):
    """K seeds in one process against `agents/dqn.py --seed s` for each: every record of metrics.jsonl (episodes,
    iterations' losses, C-CHAIN's coefficient, diagnostics, evaluations, switches), the evaluation table, config.json
    and every checkpoint (weights, target, Adam state, C-CHAIN's reference and records, the seed's generator) are the
    same, bit for bit; only timings and the run names differ."""
    cfg = write_config(tmp_path, data, "run.json")
    runs = str(tmp_path / "runs")
    common = ["--config", str(cfg), "--runs_dir", runs, "--no-progress-bar", "--checkpoint_minutes", "0",
              "--no-metrics"]
    got = dqn_seeds.main([*common, "--seeds", *seeds, "--run_name", "seeds"])
    assert got == [os.path.join(runs, f"seeds__s{s}") for s in seeds]
    for seed, run in zip(seeds, got):
        alone = dqn.main([*common, "--seed", seed, "--run_name", f"alone{seed}"])
        records = assert_same_run(run, alone)
        assert sum(r["kind"] == "switch" for r in records) == switches
        assert [r["charts/updates"] for r in records if r["kind"] == "iteration"][-1] > 0
        if data.get("eval_every"):
            assert sum(r["kind"] == "eval" for r in records) >= 5
        with open(os.path.join(run, "config.json")) as f:
            assert json.load(f)["seed"] == int(seed)
        assert len(glob.glob(os.path.join(run, "checkpoints", "*"))) >= 3


def _cut_copy(run: str, dst: str, step: int) -> str:
    """A copy of `run` whose checkpoints after `step` are gone (what a kill after `step` leaves)."""
    shutil.copytree(run, dst)
    for f in glob.glob(os.path.join(dst, "checkpoints", "*")):
        if step_of(f) > step:
            os.unlink(f)
    return dst


@pytest.mark.long  # ~25 s: 2 seeds x (a run, two resumes)
def test_a_group_resumes_as_each_seed_resumes_alone(tmp_path, monkeypatch):
    """`dqn_seeds.py --resume RUN RUN` (the launcher's group after a kill): each seed continues as `agents/dqn.py
    --resume RUN` continues it, record by record and checkpoint by checkpoint (Adam's moments and step, C-CHAIN's
    reference, coefficient and update count, the replay buffer, the generators); from the switch checkpoint, where
    the envs restart anyway, the final weights are the uninterrupted group's. Checkpoints at other steps: refused.
    C-CHAIN's warm-up is shortened (50 updates, not the paper's 10,000) so that its coefficient is automatic before
    the checkpoints: a numpy coefficient made the experiment's checkpoints unreadable at --resume (2026-12-01)."""
    quick = dataclasses.replace(dqn.CONTINUAL, c_chain=dataclasses.replace(
        dqn.CONTINUAL.c_chain, schedule=Schedule(target=0.01, initial=50.0, window=100, warmup=50)))
    monkeypatch.setattr(dqn, "CONTINUAL", quick)
    monkeypatch.setattr(dqn_seeds, "CONTINUAL", quick)
    cfg = write_config(tmp_path, RUN, "run.json")
    runs = str(tmp_path / "runs")
    common = ["--no-progress-bar", "--no-metrics"]
    full = dqn_seeds.main(["--config", str(cfg), "--runs_dir", runs, "--checkpoint_minutes", "0", *common,
                           "--seeds", "4", "9", "--run_name", "full", "--save_agent_with_switch",
                           "--save_replay_buffer"])
    for run in full:  # the coefficient in the checkpoint the group resumes from is automatic, a Python float
        switch, = glob.glob(os.path.join(run, "checkpoints", "switch__*step400.cleanrl_model"))
        ck = torch.load(switch, weights_only=True)["c_chain"]["coefficient"]
        assert type(ck["coef"]) is float and ck["coef"] != 50.0 and ck["records"] > 50, ck
    group = [_cut_copy(run, os.path.join(runs, f"group{k}"), 400) for k, run in enumerate(full)]
    alone = [_cut_copy(run, os.path.join(runs, f"alone{k}"), 400) for k, run in enumerate(full)]
    assert dqn_seeds.main(["--resume", *group, *common]) == group
    for g, a, f in zip(group, alone, full):
        dqn.main(["--resume", a, *common])
        got = assert_same_run(g, a, differ=("run_name", "resume"))  # the paths resumed
        assert sum(r["kind"] == "start" and r.get("resumed") for r in got) == 1
        final = [torch.load(os.path.join(run, "checkpoints", "final__step800.cleanrl_model"), weights_only=True)
                 for run in (g, f)]
        assert final[0]["c_chain"]["updates"] == final[1]["c_chain"]["updates"] > 500
        for key in ("model", "target_model"):
            for name in final[0][key]:
                assert torch.equal(final[0][key][name], final[1][key][name]), (key, name)
    # a seed one checkpoint behind the other: one line, exit 2, nothing written
    behind = [_cut_copy(full[0], os.path.join(runs, "behind0"), 400), _cut_copy(full[1], os.path.join(runs, "behind1"),
                                                                                   300)]
    before = [sorted(os.listdir(os.path.join(b, "checkpoints"))) for b in behind]
    with pytest.raises(SystemExit) as e:
        dqn_seeds.main(["--resume", *behind, *common])
    assert e.value.code == 2
    assert [sorted(os.listdir(os.path.join(b, "checkpoints"))) for b in behind] == before


def test_a_groups_seeds_checkpoint_on_one_clock(tmp_path):
    """--checkpoint_minutes in a group: every seed's periodic checkpoints at the same steps (so that a kill leaves
    checkpoints the group can resume together), though each seed's session started its clock at its own time."""
    cfg = write_config(tmp_path, {**RUN, "checkpoint_every": 0, "keep_checkpoints": 100}, "run.json")
    runs = dqn_seeds.main(["--config", str(cfg), "--runs_dir", str(tmp_path / "runs"), "--no-progress-bar",
                           "--no-metrics", "--checkpoint_minutes", "0.003", "--seeds", "4", "9", "--run_name", "g"])
    steps = [sorted(step_of(f)
                    for f in glob.glob(os.path.join(run, "checkpoints", "periodic__*"))) for run in runs]
    assert steps[0] == steps[1] and len(steps[0]) >= 2, steps


@pytest.mark.parametrize("flags, field", [(["--resume"], "resume"), (["--seeds", "1", "--resume", "x"], "resume"),
                                          (["--resume", "x"], "checkpoint"), (["--redo"], "redo"),
                                          (["--seeds", "1", "1"], "seeds"), (["--seeds", "one"], "seeds"),
                                          (["--seeds", "1", "2", "--run_names", "a"], "run_names"),
                                          (["--seeds", "1", "2", "--configs", "a.json"], "configs"),
                                          # the second seed's run directory exists: the first is not created either
                                          (["--seeds", "1", "2", "--run_names", "a", "taken"], "run directory")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, flags, field):
    os.makedirs(tmp_path / "runs" / "taken")
    with pytest.raises(SystemExit) as e:
        dqn_seeds.main(["--backend", "MinAtar", "--env_id", "MinAtar/Breakout", "--modifs", "", "--runs_dir",
                        str(tmp_path / "runs"), *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}") and "\n" not in err, err
    assert os.listdir(tmp_path / "runs") == ["taken"]


@pytest.mark.long  # ~40 s at load 4 (two groups of 2 seeds, a process start, two resumes)
def test_sigterm_saves_every_seed_and_each_resumes_alone(tmp_path):
    """SIGTERM to a process of K seeds (as the launcher stops a group): every seed finishes the iteration in progress
    and writes its own interrupted checkpoint at the same step, having logged exactly what the group never stopped
    logged up to it; the process exits 128 + SIGTERM; each seed resumed alone by `agents/dqn.py --resume` ends the
    schedule with nothing lost or logged twice. (From a checkpoint between switches the episodes in flight restart,
    so the runs differ after it: docs/outputs.md, "Resuming".)"""
    data = {**CORRIDOR, "modification_factory_kwargs": {**CORRIDOR["modification_factory_kwargs"],
                                                        "num_total_steps": 3072, "switching_thresholds": [1024, 2048]}}
    cfg = write_config(tmp_path, data, "run.json")
    runs = str(tmp_path / "runs")
    common = ["--config", str(cfg), "--runs_dir", runs, "--no-progress-bar", "--checkpoint_minutes", "0",
              "--no-metrics"]
    full = dqn_seeds.main([*common, "--seeds", "2", "5", "--run_name", "full"])

    proc = subprocess.Popen([sys.executable, "agents/dqn_seeds.py", *common, "--seeds", "2", "5", "--run_name", "cut"],
                            cwd=ROOT, env={**os.environ, "WANDB_MODE": "offline",
                                           "PYTHONPATH": os.path.join(ROOT, "tests")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last = os.path.join(runs, "cut__s5", "metrics.jsonl")  # the seed built last
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(last) and sum('"iteration"' in ln for ln in open(last)) >= 36:  # past the first switch
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    steps = []
    for seed in ("2", "5"):
        interrupted = glob.glob(os.path.join(runs, f"cut__s{seed}", "checkpoints", "interrupted__step*"))
        assert len(interrupted) == 1, seed
        steps.append(torch.load(interrupted[0], weights_only=True)["global_step"])
    cut_step = steps[0]
    assert steps == [cut_step, cut_step] and 1024 < cut_step < 3072

    def logged(run, upto=None):
        return [r for r in records(run) if r["kind"] in ("iteration", "episode", "switch")
                and (upto is None or r["global_step"] <= upto)]
    for seed, reference in zip(("2", "5"), full):
        run = os.path.join(runs, f"cut__s{seed}")
        assert logged(run) == logged(reference, cut_step), seed
        dqn.main(["--resume", run, "--no-progress-bar", "--no-metrics"])
        assert os.path.exists(os.path.join(run, "checkpoints", "final__step3072.cleanrl_model"))
        got = logged(run)
        assert [r["global_step"] for r in got if r["kind"] == "iteration"] == list(range(32, 3073, 32))
        assert [r["global_step"] for r in got if r["kind"] == "switch"] == \
            [r["global_step"] for r in logged(reference) if r["kind"] == "switch"] == [1024, 2048]
