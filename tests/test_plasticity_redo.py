"""ReDo (Sokar et al. 2023): exactly the tau-dormant units are re-initialised from a fresh network, their outgoing
weights are zero, and the optimizer's state of exactly those weights is reset; the network's output is unchanged."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from agents import ppo
from continual.plasticity.cbp import AdamGnT
from continual.plasticity.redo import hidden_layers, recycle


def scores_float64(h: np.ndarray) -> np.ndarray:
    """s_i = E|h_i| / mean_k E|h_k| (Sokar et al., eq. 1), expectation over batch (and positions)."""
    axes = (0, 2, 3) if h.ndim == 4 else (0,)
    e = np.abs(h.astype(np.float64)).mean(axis=axes)
    return e / e.mean()


@pytest.mark.parametrize("opt_kind", ["adam", "adamgnt"])
def test_redo_recycles_exactly_the_dormant_units(opt_kind):
    torch.manual_seed(0)
    agent = ppo.Agent((4, 10, 10), 3)  # MinAtar network: conv 16 channels -> flatten -> 128 units -> heads
    conv, fc = agent.network[0], agent.network[3]
    obs = (torch.rand(64, 4, 10, 10) > 0.6).float()
    with torch.no_grad():  # silence 3 conv channels and 5 hidden units
        conv.bias[[1, 7, 12]] = -50.0
        fc.bias[[0, 3, 50, 99, 127]] = -100.0
    opt = torch.optim.Adam(agent.parameters(), lr=1e-3) if opt_kind == "adam" else AdamGnT(agent.parameters())
    for _ in range(3):  # non-zero optimizer state everywhere that gets gradients
        opt.zero_grad()
        _, lp, ent, v = agent.get_action_and_value(obs)
        (v.pow(2).mean() - lp.mean() - ent.mean()).backward()
        opt.step()

    # the dormant units by an independent float64 computation of the score
    with torch.no_grad():
        h0 = torch.relu(conv(agent.scaled_input(obs)))
        h1 = torch.relu(fc(h0.flatten(1)))
    tau = 0.1
    expect = [scores_float64(h0.numpy()) <= tau, scores_float64(h1.numpy()) <= tau]
    assert expect[0].sum() >= 3 and expect[1].sum() >= 5

    before = copy.deepcopy(agent)
    state_before = {p: {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)} for p in agent.parameters()}
    torch.manual_seed(123)
    fresh = ppo.Agent((4, 10, 10), 3)
    with torch.no_grad():
        out_before = agent.get_action_and_value(obs, greedy=True)
    counts = recycle(agent, obs, tau, fresh, opt)
    assert list(counts.values()) == [int(e.sum()) for e in expect]

    # the reference: per parameter, which entries become fresh, which become zero (outgoing wins), and the optimizer
    # state entries zeroed (both)
    m0, m1 = (torch.as_tensor(e) for e in expect)
    cols_fc = torch.repeat_interleave(m0, fc.in_features // 16)
    fresh_rows = {"network.0.weight": m0, "network.0.bias": m0, "network.3.weight": m1, "network.3.bias": m1}
    zero_cols = {"network.3.weight": cols_fc, "actor.weight": m1, "critic.weight": m1}
    old_params, new_params = dict(before.named_parameters()), dict(fresh.named_parameters())
    for name, p in agent.named_parameters():
        want = old_params[name].detach().clone()
        reset = torch.zeros_like(want, dtype=torch.bool)
        if name in fresh_rows:
            want[fresh_rows[name]] = new_params[name].detach()[fresh_rows[name]]
            reset[fresh_rows[name]] = True
        if name in zero_cols:
            want[:, zero_cols[name]] = 0.0
            reset[:, zero_cols[name]] = True
        # 1. incoming weights: the fresh network's rows; 2. outgoing weights zero; untouched elsewhere
        assert torch.equal(p.detach(), want), name
        # 3. the optimizer's per-weight state is zero on exactly the recycled weights
        for key, value in opt.state[p].items():
            if torch.is_tensor(value) and value.shape == p.shape:
                assert torch.all(value[reset] == 0), (name, key)
                assert torch.equal(value[~reset], state_before[p][key][~reset]), (name, key)
    assert all(torch.all(opt.state[p]["exp_avg_sq"] != 0) for n, p in agent.named_parameters() if n == "critic.bias")
    # Adam's per-tensor step count is shared and stays (Dopamine); AdamGnT's per-weight counts restart above
    if opt_kind == "adam":
        assert float(opt.state[conv.weight]["step"]) == 3.0
    # tau = 0: only the silent units (activation exactly 0) are recycled, and with their outgoing weights zero the
    # network computes the same function
    agent2 = copy.deepcopy(before)
    counts = recycle(agent2, obs, 0.0, fresh, None)
    assert counts["network.0"] >= 3 and counts["network.3"] >= 5
    with torch.no_grad():
        out_after = agent2.get_action_and_value(obs, greedy=True)
    assert torch.equal(out_before[0], out_after[0])
    assert torch.allclose(out_before[3], out_after[3], atol=1e-6)


def test_hidden_layers_of_the_nature_cnn_and_the_mlp():
    cnn = ppo.Agent((4, 84, 84), 6)
    assert [h.name for h in hidden_layers(cnn)] == ["network.0", "network.2", "network.4", "network.7"]
    assert hidden_layers(cnn)[-1].outs == [cnn.actor, cnn.critic]
    mlp = ppo.Agent((4,), 2)
    assert [h.name for h in hidden_layers(mlp)] == ["network.1", "network.3"]
