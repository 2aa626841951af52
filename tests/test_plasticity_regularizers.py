"""L2, regenerative L2 (L2 Init, Kumar et al. 2023) and Parseval (Chung et al. 2024): penalties and gradients
against float64 hand computations, through the run's PlasticityMethods."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from agents import ppo
from continual.config.args import Args
from continual.plasticity.methods import PlasticityMethods


def methods_for(agent, **flags):
    session = types.SimpleNamespace(args=Args(**flags), global_step=0)
    opt = torch.optim.Adam(agent.parameters(), lr=1e-3)
    return PlasticityMethods(session, agent, opt, lambda: None)


def grads(agent, loss):
    agent.zero_grad()
    loss.backward()
    return {n: (torch.zeros_like(p) if p.grad is None else p.grad).double().numpy().copy()
            for n, p in agent.named_parameters()}


def test_parseval_penalty_and_gradient_by_hand():
    torch.manual_seed(0)
    agent = ppo.Agent((4, 10, 10), 3)
    m = methods_for(agent, parseval=True, parseval_coef=1e-3, parseval_scale=2.0)
    pen = m.penalty()
    g = grads(agent, pen)
    total = 0.0
    for name in ("network.0", "network.3"):  # the torso's conv and linear layers; the heads are left out
        w = dict(agent.named_modules())[name].weight.detach().double().numpy().reshape(
            dict(agent.named_modules())[name].weight.shape[0], -1)
        r = w @ w.T - 2.0 * np.eye(w.shape[0])
        total += (r ** 2).sum()
        # d/dW ||W W^T - s I||_F^2 = 4 (W W^T - s I) W
        want = 4e-3 * r @ w
        assert np.allclose(g[f"{name}.weight"].reshape(want.shape), want, rtol=1e-4, atol=1e-7), name
        assert np.all(g[f"{name}.bias"] == 0)
    assert pen.item() == pytest.approx(1e-3 * total, rel=1e-5)
    assert np.all(g["actor.weight"] == 0) and np.all(g["critic.weight"] == 0)


def test_l2_init_pulls_toward_the_initial_weights_and_l2_toward_zero():
    torch.manual_seed(0)
    agent = ppo.Agent((4,), 2)
    init = {n: p.detach().double().numpy().copy() for n, p in agent.named_parameters()}
    m = methods_for(agent, l2_init=True, l2_init_coef=0.01)
    assert m.penalty().item() == 0.0
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    now = {n: p.detach().double().numpy().copy() for n, p in agent.named_parameters()}
    pen = m.penalty()
    assert pen.item() == pytest.approx(0.01 * sum(((now[n] - init[n]) ** 2).sum() for n in now), rel=1e-5)
    g = grads(agent, pen)
    for n in now:
        assert np.allclose(g[n], 0.02 * (now[n] - init[n]), rtol=1e-4, atol=1e-9), n
    m2 = methods_for(agent, l2=True, l2_coef=1e-3)
    pen = m2.penalty()
    assert pen.item() == pytest.approx(1e-3 * sum((now[n] ** 2).sum() for n in now), rel=1e-5)
    g = grads(agent, pen)
    for n in now:
        assert np.allclose(g[n], 2e-3 * now[n], rtol=1e-4, atol=1e-9), n
    g = grads(agent, methods_for(agent, l2=True).penalty())  # the default: the term Adam(weight_decay=1e-3) adds
    for n in now:
        assert np.allclose(g[n], 1e-3 * now[n], rtol=1e-4, atol=1e-9), n
    # a checkpoint keeps theta_0: a resumed run pulls toward the same weights
    restored = methods_for(agent, l2_init=True, l2_init_coef=0.01)
    restored.load_state_dict(m.state_dict())
    assert restored.penalty().item() == pytest.approx(m.penalty().item(), rel=1e-6)


def test_no_method_no_penalty():
    m = methods_for(ppo.Agent((4,), 2))
    assert m.penalty() == 0.0 and not m.active
