"""TRAC (Muppidi et al. 2024): the scaled iterate against a float64 re-implementation of the paper's update
(Algorithm 1) on a toy regression, with SGD and Adam as the base optimizer; checkpoints restore it exactly."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.special import erfi

from continual.plasticity.trac import BETAS, TRAC


def paper_trac(theta0, grad_fn, base_update, steps, s_init=1e-8, eps=1e-8):
    """Algorithm 1 of the paper in float64: returns the scaled iterates theta_1..theta_steps and the scales S."""
    betas = np.array(BETAS)
    ref = theta0.copy()
    base = theta0.copy()
    theta = theta0.copy()
    v, sigma = np.zeros(6), np.zeros(6)
    out, scales = [], []
    for t in range(steps):
        g = grad_fn(theta)
        h = float(g @ (base - ref))
        base = base + base_update(g, t)
        v = betas ** 2 * v + h * h
        sigma = betas * sigma - h
        s = s_init / erfi(1 / np.sqrt(2)) * erfi(sigma / (np.sqrt(2 * v) + eps))
        scale = max(s.sum(), 0.0)
        theta = ref + (base - ref) * scale
        out.append(theta.copy())
        scales.append(scale)
    return out, scales


@pytest.mark.parametrize("base_kind", ["sgd", "adam"])
def test_trac_follows_the_papers_update_on_a_toy_regression(base_kind):
    rng = np.random.default_rng(0)
    A, b = rng.normal(size=(8, 3)), rng.normal(size=8)
    theta0 = rng.normal(size=3) * 0.1

    def grad_fn(th):
        return A.T @ (A @ th - b) / 8

    lr = 0.05
    if base_kind == "sgd":
        def base_update(g, t):
            return -lr * g
    else:  # Adam's update depends on the gradients only (no weight decay): its float64 form
        m, v2 = np.zeros(3), np.zeros(3)

        def base_update(g, t):
            nonlocal m, v2
            m = 0.9 * m + 0.1 * g
            v2 = 0.999 * v2 + 0.001 * g * g
            return -lr * (m / (1 - 0.9 ** (t + 1))) / (np.sqrt(v2 / (1 - 0.999 ** (t + 1))) + 1e-8)

    steps = 200
    want, scales = paper_trac(theta0, grad_fn, base_update, steps)
    assert scales[-1] > 1e-3 > scales[0]  # the scale grows from s_init while the gradients keep agreeing

    p = torch.nn.Parameter(torch.tensor(theta0, dtype=torch.float64))
    base = torch.optim.SGD([p], lr=lr) if base_kind == "sgd" else torch.optim.Adam([p], lr=lr)
    opt = TRAC(base)
    At, bt = torch.tensor(A), torch.tensor(b)
    for t in range(steps):
        opt.zero_grad()
        (0.5 * (At @ p - bt).pow(2).sum() / 8).backward()
        opt.step()
        # erfi's exponential growth amplifies float64 rounding differences a little over 200 steps
        assert np.allclose(p.detach().numpy(), want[t], rtol=1e-5, atol=1e-12), t
        assert opt.scale == pytest.approx(scales[t], rel=1e-5)


def test_trac_state_dict_resumes_exactly():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    x, y = torch.randn(16, 4), torch.randn(16, 2)

    def steps(opt, n):
        for _ in range(n):
            opt.zero_grad()
            (net(x) - y).pow(2).mean().backward()
            opt.step()

    opt = TRAC(torch.optim.Adam(net.parameters(), lr=1e-2))
    steps(opt, 30)
    saved = {k: v.clone() for k, v in net.state_dict().items()}
    state = copy.deepcopy(opt.state_dict())  # as torch.save would: Adam's state_dict holds its live tensors
    steps(opt, 20)
    after = {k: v.clone() for k, v in net.state_dict().items()}
    net.load_state_dict(saved)
    opt2 = TRAC(torch.optim.Adam(net.parameters(), lr=1e-2))
    opt2.load_state_dict(state)
    steps(opt2, 20)
    assert all(torch.equal(after[k], net.state_dict()[k]) for k in after)
