"""TRAC (Muppidi et al. 2024): the scaled iterate against float64 re-implementations of the reference code's update
(the default) and of the paper's Algorithm 1 (--trac_keep_base) on a toy regression whose target flips, with SGD and
Adam as the base optimizer; checkpoints restore it exactly; old checkpoints resume in the form they ran."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.special import erfi

from continual.config.args import Args
from continual.config.loading import args_from_dict, args_to_dict
from continual.plasticity.trac import BETAS, TRAC


def paper_trac(theta0, grad_fn, base_update, steps, s_init=1e-8, eps=1e-8):
    """Algorithm 1 of the paper in float64 (the base iterate kept): the scaled iterates theta_1..theta_steps and the
    scales S. `grad_fn(theta, t)`, `base_update(g, t)`."""
    betas = np.array(BETAS)
    ref = theta0.copy()
    base = theta0.copy()
    theta = theta0.copy()
    v, sigma = np.zeros(6), np.zeros(6)
    out, scales = [], []
    for t in range(steps):
        g = grad_fn(theta, t)
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


def reference_code_trac(theta0, grad_fn, base_update, steps, s_init=1e-8, eps=1e-8):
    """ComputationalRobotics/TRAC's `_step` (as vendored by Plasticine) in float64: the base iterate's displacement
    recovered from the weights as (theta - ref) / (sum s + eps) every step, sigma starting at 1e-8."""
    betas = np.array(BETAS)
    ref = theta0.copy()
    theta = theta0.copy()
    v, sigma, s = np.zeros(6), np.full(6, 1e-8), np.zeros(6)
    out, scales = [], []
    for t in range(steps):
        g = grad_fn(theta, t)
        delta = (theta - ref) / (s.sum() + eps)
        h = float(delta @ g)
        delta = delta + base_update(g, t)  # the base optimizer's step from the scaled weights
        v = betas ** 2 * v + h * h
        sigma = betas * sigma - h
        s = s_init / erfi(1 / np.sqrt(2)) * erfi(sigma / (np.sqrt(2) * np.sqrt(v) + eps))
        scale = max(s.sum(), 0.0)
        theta = ref + delta * scale
        out.append(theta.copy())
        scales.append(scale)
    return out, scales


SWITCH = 150  # the regression target flips (and triples) here: the gradients then point away from the displacement


def toy(base_kind, lr=0.05):
    rng = np.random.default_rng(0)
    A, b = rng.normal(size=(8, 3)), rng.normal(size=8)
    theta0 = rng.normal(size=3) * 0.1

    def target(t):
        return b if t < SWITCH else -3 * b

    def grad_fn(th, t):
        return A.T @ (A @ th - target(t)) / 8

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

    def run_ours(keep_base, steps):
        p = torch.nn.Parameter(torch.tensor(theta0, dtype=torch.float64))
        base = torch.optim.SGD([p], lr=lr) if base_kind == "sgd" else torch.optim.Adam([p], lr=lr)
        opt = TRAC(base, keep_base=keep_base)
        At = torch.tensor(A)
        for t in range(steps):
            opt.zero_grad()
            (0.5 * (At @ p - torch.tensor(target(t))).pow(2).sum() / 8).backward()
            opt.step()
            yield p.detach().numpy().copy(), opt.scale

    return theta0, grad_fn, base_update, run_ours


@pytest.mark.parametrize("base_kind", ["sgd", "adam"])
@pytest.mark.parametrize("keep_base", [False, True])
def test_trac_follows_the_reference_code_or_the_papers_algorithm_through_a_switch(base_kind, keep_base):
    """Default: the reference code's update; --trac_keep_base: the paper's Algorithm 1. On a toy regression whose
    target flips at SWITCH, S grows from s_init, then falls to 0 after the flip: the reference code's base iterate
    then restarts from the initial weights, the paper's keeps its displacement."""
    steps = 400
    theta0, grad_fn, base_update, run_ours = toy(base_kind)
    want, scales = (paper_trac if keep_base else reference_code_trac)(theta0, grad_fn, base_update, steps)
    assert scales[SWITCH - 1] > 1e-3 > scales[0]  # the scale grows while the gradients keep agreeing
    for t, (theta, scale) in enumerate(run_ours(keep_base, steps)):
        # erfi's exponential growth amplifies float64 rounding differences a little over the steps
        assert np.allclose(theta, want[t], rtol=1e-5, atol=1e-12), t
        assert scale == pytest.approx(scales[t], rel=1e-5, abs=1e-15), t
    zero = [t for t in range(SWITCH, steps) if scales[t] == 0.0]
    if not keep_base:
        assert zero, "S never fell to 0 after the switch"
        assert np.array_equal(want[zero[0]], theta0)  # the weights (and the recovered iterate) are the initial ones


@pytest.mark.parametrize("base_kind", ["sgd", "adam"])
def test_the_two_forms_agree_until_the_scale_is_small_and_differ_after_the_switch(base_kind):
    theta0, grad_fn, base_update, _ = toy(base_kind)
    paper, s_paper = paper_trac(theta0, grad_fn, base_update, 400)
    code, s_code = reference_code_trac(theta0, grad_fn, base_update, 400)
    assert s_code[SWITCH - 1] > 0.1 and s_paper[SWITCH - 1] > 0.1
    assert not np.allclose(paper[-1], code[-1], rtol=1e-2)


@pytest.mark.parametrize("keep_base", [False, True])
def test_trac_state_dict_resumes_exactly(keep_base):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    x, y = torch.randn(16, 4), torch.randn(16, 2)

    def steps(opt, n):
        for _ in range(n):
            opt.zero_grad()
            (net(x) - y).pow(2).mean().backward()
            opt.step()

    opt = TRAC(torch.optim.Adam(net.parameters(), lr=1e-2), keep_base=keep_base)
    steps(opt, 30)
    saved = {k: v.clone() for k, v in net.state_dict().items()}
    state = copy.deepcopy(opt.state_dict())  # as torch.save would: Adam's state_dict holds its live tensors
    steps(opt, 20)
    after = {k: v.clone() for k, v in net.state_dict().items()}
    net.load_state_dict(saved)
    opt2 = TRAC(torch.optim.Adam(net.parameters(), lr=1e-2), keep_base=keep_base)
    opt2.load_state_dict(state)
    steps(opt2, 20)
    assert all(torch.equal(after[k], net.state_dict()[k]) for k in after)


def test_checkpoints_saved_before_the_flag_resume_with_the_base_iterate_kept():
    saved = args_to_dict(Args(trac=True))
    del saved["trac_keep_base"]
    assert args_from_dict(saved).trac_keep_base
    assert not args_from_dict({k: v for k, v in args_to_dict(Args()).items() if k != "trac_keep_base"}).trac_keep_base
