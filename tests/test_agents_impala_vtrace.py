"""V-trace (agents/impala.py) against plain float64 loops written from the paper's definition (Espeholt et al. 2018):

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),  V(x_T) given
    pg advantage_s = rho_s (r_s + gamma_s v_{s+1} - V(x_s)),  v_T = V(x_T)

with rho_t = min(rho_bar, pi/mu), c_i = min(c_bar, pi/mu) and gamma_t = gamma * (1 - done_t), so an episode end inside
an unroll cuts every sum there (gamma^{t-s} when no episode ends).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.impala import vtrace
from helpers.vtrace_reference import reference_vtrace


def random_unrolls(seed: int, T: int = 9, B: int = 6, n_actions: int = 4, done_p: float = 0.2, gamma: float = 0.97):
    rng = np.random.default_rng(seed)
    behaviour_logits = rng.normal(size=(T, B, n_actions))
    target_logits = behaviour_logits + rng.normal(scale=0.8, size=(T, B, n_actions))
    actions = rng.integers(0, n_actions, size=(T, B))

    def logp(logits):
        logits = logits - logits.max(-1, keepdims=True)
        lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return np.take_along_axis(lp, actions[..., None], -1)[..., 0]

    dones = rng.random((T, B)) < done_p
    dones[T // 2, 0] = True  # at least one episode end inside an unroll
    return dict(behaviour_logp=logp(behaviour_logits), target_logp=logp(target_logits),
                rewards=rng.normal(size=(T, B)), discounts=gamma * (~dones).astype(np.float64),
                values=rng.normal(size=(T, B)), bootstrap=rng.normal(size=B))


def run_ours(d: dict, rho_bar: float, c_bar: float, dtype=torch.float32):
    t = {k: torch.as_tensor(v, dtype=dtype) for k, v in d.items()}
    out = vtrace(t["behaviour_logp"], t["target_logp"], t["rewards"], t["discounts"], t["values"], t["bootstrap"],
                 rho_bar=rho_bar, c_bar=c_bar)
    return out.vs.double().numpy(), out.pg_advantages.double().numpy()


@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 1.0), (1.5, 0.3), (0.5, 0.5), (0.7, 1.2), (1e9, 1e9)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vtrace_matches_the_definition(seed, rho_bar, c_bar):
    d = random_unrolls(seed)
    ref_vs, ref_pg = reference_vtrace(*(d[k] for k in ("behaviour_logp", "target_logp", "rewards", "discounts",
                                                       "values", "bootstrap")), rho_bar, c_bar)
    vs, pg = run_ours(d, rho_bar, c_bar, dtype=torch.float64)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-10, atol=1e-10)
    vs32, pg32 = run_ours(d, rho_bar, c_bar, dtype=torch.float32)  # what the learner runs
    np.testing.assert_allclose(vs32, ref_vs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pg32, ref_pg, rtol=1e-4, atol=1e-4)


def test_truncation_levels_matter():
    """rho_bar > c_bar changes the targets relative to rho_bar = c_bar (the test data are off-policy enough)."""
    d = random_unrolls(3)
    vs_11, _ = run_ours(d, 1.0, 1.0, torch.float64)
    vs_21, _ = run_ours(d, 2.0, 1.0, torch.float64)
    vs_22, _ = run_ours(d, 2.0, 2.0, torch.float64)
    assert not np.allclose(vs_11, vs_21) and not np.allclose(vs_21, vs_22)


def n_step_returns(rewards, discounts, bootstrap):
    """G_s = r_s + gamma_s r_{s+1} + ... + (prod_{i=s}^{T-1} gamma_i) V(x_T), computed forward for every s."""
    T, B = rewards.shape
    out = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            g, scale = 0.0, 1.0
            for t in range(s, T):
                g += scale * rewards[t, b]
                scale *= discounts[t, b]
            out[s, b] = g + scale * bootstrap[b]
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_on_policy_vtrace_is_the_n_step_return(seed):
    d = random_unrolls(seed)
    d["target_logp"] = d["behaviour_logp"].copy()  # pi = mu
    vs, pg = run_ours(d, 1.0, 1.0, torch.float64)
    returns = n_step_returns(d["rewards"], d["discounts"], d["bootstrap"])
    np.testing.assert_allclose(vs, returns, rtol=1e-10, atol=1e-10)
    # the policy-gradient advantage is then the one-step TD error towards the next n-step return
    next_returns = np.concatenate([returns[1:], d["bootstrap"][None]], 0)
    np.testing.assert_allclose(pg, d["rewards"] + d["discounts"] * next_returns - d["values"], rtol=1e-10, atol=1e-10)


def test_episode_end_cuts_the_trace():
    """After a done at step t, nothing from steps > t reaches v_s for s <= t."""
    d = random_unrolls(4, done_p=0.0)
    d["discounts"][4, :] = 0.0
    vs_a, _ = run_ours(d, 1.0, 1.0, torch.float64)
    d["rewards"][5:] += 100.0
    d["bootstrap"] += 100.0
    vs_b, _ = run_ours(d, 1.0, 1.0, torch.float64)
    np.testing.assert_allclose(vs_a[:5], vs_b[:5], rtol=1e-12, atol=1e-12)
    assert not np.allclose(vs_a[5:], vs_b[5:])
