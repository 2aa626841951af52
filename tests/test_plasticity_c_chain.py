"""continual/plasticity/c_chain.py: C-CHAIN's churn terms and automatic coefficient against hand computation
(float64, explicit sums), its reference network (the weights before the previous update), a DQN update loop equal bit
for bit to the paper code's own (crl_minatar/agents/double_dqn_c_chain.py, re-typed here), PPO's ProcGen form, and
the agents' wiring (flags, refusals, a logged coefficient)."""

from __future__ import annotations

import copy
import math
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from continual.plasticity.c_chain import (
    DQN_SCHEDULE,
    PPO_SCHEDULE,
    AutoCoefficient,
    CChain,
    Schedule,
    policy_churn,
    q_churn,
    schedule_for,
)
from continual.training.checkpoint import save_checkpoint


def tiny(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()


# --- the churn terms, by hand -------------------------------------------------------------------------------------
def test_q_churn_by_hand():
    """DQN: mean over batch x actions of (Q(s, a) - Q_ref(s, a))^2, with fixed weights and inputs."""
    net = nn.Linear(2, 2, bias=False).double()
    ref = nn.Linear(2, 2, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=torch.float64))
        ref.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, -1.0]], dtype=torch.float64))
    s = torch.tensor([[1.0, 0.0], [2.0, 3.0], [-1.0, 1.0]], dtype=torch.float64)
    # Q = s W^T: net rows (1, .5), (8, -2), (1, -1.5); ref rows (1, 0), (5, -3), (0, -1)
    # differences (0, .5), (3, 1), (1, -.5): squares 0 + .25 + 9 + 1 + 1 + .25 = 11.5 over 6 entries
    got = q_churn(net(s), ref(s).detach())
    assert float(got) == pytest.approx(11.5 / 6, abs=1e-15)
    # its gradient moves Q toward Q_ref: d/dW of the mean of squares = 2/6 * (Q - Q_ref)^T s
    got.backward()
    diff = net(s).detach() - ref(s).detach()
    torch.testing.assert_close(net.weight.grad, 2.0 / 6 * diff.T @ s, rtol=0, atol=1e-14)


def test_policy_churn_by_hand():
    """PPO: mean over the batch of -sum_a pi_ref(a|s) log(pi(a|s) + 1e-8), the policies softmaxes of logits."""
    logits = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, -1.0]], dtype=torch.float64)
    total = 0.0
    for row, rrow in zip(logits.tolist(), ref.tolist()):
        z = sum(math.exp(v) for v in row)
        zr = sum(math.exp(v) for v in rrow)
        total += -sum(math.exp(rv) / zr * math.log(math.exp(v) / z + 1e-8) for v, rv in zip(row, rrow))
    assert float(policy_churn(logits, ref)) == pytest.approx(total / 3, abs=1e-12)
    # at ref = current it is the policy's entropy (up to the 1e-8), and its gradient in the logits is ~0
    x = ref.clone().requires_grad_(True)
    policy_churn(x, ref).backward()
    assert x.grad.abs().max() < 1e-7


# --- the automatic coefficient, by hand ---------------------------------------------------------------------------
def test_auto_coefficient_by_hand():
    """coef = target * mean|main| / (mean churn + 1e-8) over the last `window` records once `warmup` are in;
    `initial` before. DQN's first record has no churn, so the churn window lags the main one by a record."""
    s = Schedule(target=0.5, initial=7.0, window=3, warmup=3)
    c = AutoCoefficient(s)
    records = [(-2.0, None), (1.0, 0.5), (-4.0, 0.25), (3.0, 1.0), (0.5, 0.75)]
    expected = [7.0, 7.0,
                0.5 * (2 + 1 + 4) / 3 / ((0.5 + 0.25) / 2 + 1e-8),  # 3 records: main 3 of them, churn the 2 it has
                0.5 * (1 + 4 + 3) / 3 / ((0.5 + 0.25 + 1.0) / 3 + 1e-8),
                0.5 * (4 + 3 + 0.5) / 3 / ((0.25 + 1.0 + 0.75) / 3 + 1e-8)]
    for (main, churn), want in zip(records, expected):
        c.record(main, churn)
        assert c.coef == pytest.approx(want, rel=1e-14)
    # a floor, a restart (ProcGen: per task), and target 0: the coefficient stays at its start
    c = AutoCoefficient(Schedule(target=1e-3, initial=10.0, window=2, warmup=1, floor=1.0))
    c.record(0.1, 10.0)
    assert c.coef == 1.0  # 1e-3 * 0.1 / 10 is below the floor
    c.restart()
    assert c.coef == 10.0 and c.records == 0
    c = AutoCoefficient(Schedule(target=0.0, initial=3.0, window=2, warmup=1))
    for _ in range(5):
        c.record(1.0, 1.0)
    assert c.coef == 3.0


def test_auto_coefficient_is_the_paper_codes_numpy_expression_bit_for_bit():
    """Over long random records (the window wraps many times) the coefficient equals, exactly, the paper code's
    `target * np.mean(np.abs(q_list[-W:])) / (np.mean(reg_list[-W:]) + 1e-8)` on growing Python lists."""
    rng = np.random.default_rng(0)
    s = Schedule(target=0.01, initial=50.0, window=37, warmup=20)
    c = AutoCoefficient(s)
    q_list, reg_list, coef = [], [], 50.0
    for i in range(500):
        q, reg = float(rng.normal() * 3), (None if i == 0 else float(rng.random() * 0.1))
        c.record(q, reg)
        q_list.append(q)
        if reg is not None:
            reg_list.append(reg)
        if i + 1 >= 20:
            coef = 0.01 * np.mean(np.abs(q_list[-37:])) / (np.mean(reg_list[-37:]) + 1e-8)
        assert c.coef == coef, i


def test_paper_presets_and_flags():
    assert (DQN_SCHEDULE.target, DQN_SCHEDULE.initial, DQN_SCHEDULE.window, DQN_SCHEDULE.warmup) == \
        (0.01, 50.0, 50_000, 10_000)
    assert (PPO_SCHEDULE.target, PPO_SCHEDULE.initial, PPO_SCHEDULE.window, PPO_SCHEDULE.warmup, PPO_SCHEDULE.floor,
            PPO_SCHEDULE.restart_at_switch, PPO_SCHEDULE.first_update) == (10_000.0, 10.0, 200, 21, 1.0, True, 2)
    s = schedule_for(DQN_SCHEDULE, 0.05, None)
    assert (s.target, s.initial) == (0.05, 50.0)
    s = schedule_for(DQN_SCHEDULE, None, 3.0)
    assert (s.target, s.initial) == (0.01, 3.0)


# --- the reference network ----------------------------------------------------------------------------------------
def test_reference_is_the_network_before_the_previous_update():
    net = tiny()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    c = CChain(net, Schedule(target=0.0, initial=1.0, window=2, warmup=1))
    x = torch.randn(5, 3, dtype=torch.float64)
    history = [copy.deepcopy(net)]  # theta_0, theta_1, ...
    for k in range(4):
        assert c.has_reference() == (k >= 1)
        if k >= 1:  # update k+1 starts from theta_k; its reference is theta_{k-1}
            torch.testing.assert_close(c.reference(lambda m, v: m(v), x), history[k - 1](x), rtol=0, atol=0)
        net(x).pow(2).mean().backward()
        c.before_step()
        opt.step()
        opt.zero_grad()
        history.append(copy.deepcopy(net))
    assert all(not p.requires_grad for p in c.ref.parameters())


def _paper_dqn_c_chain(net: nn.Module, batches, refs, target_rel: float, window: int, warmup: int) -> list[float]:
    """The C-CHAIN part of DoubleDQN_CCHAIN.train (bluecontra/C-CHAIN, crl_minatar/agents/double_dqn_c_chain.py,
    lines 141-192), re-typed: deep copies after every update, the reference his_qf_list[-2], the coefficient 50 and
    its update from update `warmup` on over the last `window` losses (10,000 and 50,000 there). The TD loss is
    replaced by a regression loss on fixed batches; returns the coefficients used."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    his = [copy.deepcopy(net)]
    q_his, reg_his, coef, update_cnt, used = [], [], 50.0, 0, []
    for (x, y), ref_x in zip(batches, refs):
        q_loss = F.mse_loss(net(x), y)
        if len(his) < 2:
            reg_loss = 0
        else:
            reg_q = net(ref_x)
            with torch.no_grad():
                frozen_q = his[-2](ref_x)
            reg_loss = F.mse_loss(reg_q, frozen_q)
        used.append(coef)
        total = q_loss + coef * reg_loss
        opt.zero_grad()
        total.backward()
        opt.step()
        update_cnt += 1
        q_his.append(q_loss.item())
        if len(his) >= 2:
            reg_his.append(reg_loss.item())
        if update_cnt >= warmup:
            coef = target_rel * np.mean(np.abs(q_his[-window:])) / (np.mean(reg_his[-window:]) + 1e-8)
        his.append(copy.deepcopy(net))
        his = his[-20:]
    return used


def test_dqn_loop_equals_the_paper_codes_bit_for_bit():
    """The loop agents/dqn.py runs (CChain: one reference copy, rolling windows) and the paper's (deep copies, lists)
    give the same weights and coefficients, exactly, from the same start and batches (float64 here, float32 too)."""
    for dtype in (torch.float64, torch.float32):
        g = torch.Generator().manual_seed(1)
        batches = [(torch.randn(8, 3, generator=g, dtype=dtype), torch.randn(8, 2, generator=g, dtype=dtype))
                   for _ in range(60)]
        refs = [torch.randn(8, 3, generator=g, dtype=dtype) for _ in range(60)]
        paper_net, ours = tiny(2).to(dtype), tiny(2).to(dtype)
        paper_used = _paper_dqn_c_chain(paper_net, batches, refs, 0.01, window=9, warmup=12)

        c = CChain(ours, Schedule(target=0.01, initial=50.0, window=9, warmup=12))
        opt = torch.optim.Adam(ours.parameters(), lr=1e-2)
        used = []
        for (x, y), ref_x in zip(batches, refs):  # as agents/dqn.py's update
            loss = F.mse_loss(ours(x), y)
            total, churn = loss, None
            if c.has_reference():
                churn = q_churn(ours(ref_x), c.reference(lambda net, v: net(v), ref_x))
                total = total + c.coef * churn
            used.append(c.coef)
            opt.zero_grad()
            total.backward()
            c.before_step()
            opt.step()
            c.record(loss.item(), None if churn is None else churn.item())
        assert used == paper_used and used[-1] != 50.0
        for a, b in zip(ours.parameters(), paper_net.parameters()):
            assert torch.equal(a, b)


def test_state_dict_round_trip_continues_exactly(tmp_path):
    """A CChain restored from its state (the reference weights, update count, coefficient and windows) through a
    checkpoint file goes on as the original would. Past its warm-up the coefficient is a Python float: it was
    numpy's, and weights_only loading refused the experiment's checkpoints."""
    s = Schedule(target=0.1, initial=5.0, window=4, warmup=3)
    net = tiny(3)
    c = CChain(net, s)
    rng = np.random.default_rng(2)
    for _ in range(7):
        c.before_step()
        c.record(float(rng.normal()), float(rng.random()))
    assert type(c.coef) is float and c.coef != s.initial
    path = save_checkpoint(str(tmp_path / "x.cleanrl_model"), {"c_chain": c.state_dict()})
    state = torch.load(path, weights_only=True)["c_chain"]
    d = CChain(tiny(4), s)
    d.load_state_dict(state)
    assert d.updates == c.updates and d.coef == c.coef
    for a, b in zip(d.ref.parameters(), c.ref.parameters()):
        assert torch.equal(a, b)
    for _ in range(6):
        m, r = float(rng.normal()), float(rng.random())
        c.record(m, r)
        d.record(m, r)
        assert d.coef == c.coef


def test_ppo_records_an_iteration_as_the_means_of_its_minibatches():
    """ProcGen's form: an iteration's record is the mean policy loss and the mean churn of its minibatches (0 for
    those without a reference); no churn term in the first two updates of the run; restart at a switch."""
    s = Schedule(target=2.0, initial=10.0, window=3, warmup=2, floor=1.0, restart_at_switch=True, first_update=2)
    c = CChain(tiny(), s)
    seen = []
    for it in range(3):
        for mb in range(2):
            seen.append(c.has_reference())
            c.add(main=-0.1 * (it + 1), churn=0.2 * (mb + 1) if c.has_reference() else None)
            c.before_step()
        c.end_iteration()
    assert seen == [False, False, True, True, True, True]
    # records: (-0.1, 0), (-0.2, 0.3), (-0.3, 0.3); from the 2nd record on: 2 * mean|main| / (mean churn + 1e-8)
    assert c.coef == pytest.approx(2.0 * (0.1 + 0.2 + 0.3) / 3 / ((0.0 + 0.3 + 0.3) / 3 + 1e-8), rel=1e-12)
    c.on_switch()
    assert c.coef == 10.0 and c.has_reference()


# --- the agents' wiring -------------------------------------------------------------------------------------------
def test_c_chain_on_ppo_logs_its_coefficient(tmp_path):
    from agents import ppo
    from continual.training.tracking import read_metrics

    runs = str(tmp_path / "runs")
    common = ["--backend", "MinAtar", "--env_id", "MinAtar/Breakout", "--modifs", "", "--num_envs", "4",
              "--num_steps", "32", "--num_minibatches", "2", "--update_epochs", "2", "--total_timesteps", "640",
              "--runs_dir", runs, "--no-progress-bar", "--checkpoint_minutes", "0", "--no-metrics", "--c_chain"]
    run = ppo.main([*common, "--run_name", "ppo"])
    rows = [r for r in read_metrics(os.path.join(run, "metrics.jsonl")) if r["kind"] == "iteration"]
    # 5 iterations of 4 minibatch updates: 10 until the 21st iteration of a task (ProcGen's warm-up)
    assert [r["plasticity/c_chain_coef"] for r in rows] == [10.0] * 5


@pytest.mark.parametrize("flags,field", [
    (["--architecture", "IMPALA", "--c_chain"], "c_chain"),
    (["--architecture", "DQN", "--c_chain_coef", "3"], "c_chain_coef"),
    (["--architecture", "DQN", "--c_chain", "--c_chain_target_rel_loss_scale", "-1"], "c_chain_target_rel_loss_scale"),
    (["--architecture", "DQN", "--c_chain", "--plasticity_injection", "at_switches"], "c_chain"),
    (["--architecture", "PPO", "--learning_starts_each_regime"], "learning_starts_each_regime"),
    (["--architecture", "PPO", "--env_id", "Pendulum-v1", "--c_chain"], "c_chain"),  # Box actions: not ported
])
def test_bad_c_chain_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, field):
    import continual_training_example

    with pytest.raises(SystemExit) as exit_info:
        continual_training_example.main(["--backend", "Gymnasium", "--env_id", "CartPole-v1",
                                         "--runs_dir", str(tmp_path / "runs"), *flags])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == ""
    assert err.startswith(f"error: {field}:") and err.count("\n") == 1, err
