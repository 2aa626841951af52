"""V-trace from its definition (Espeholt et al. 2018), plain float64 loops: the independent reference that
tests/test_agents_impala_vtrace.py documents, shared with CLEAR's and EWC's tests.

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),  V(x_T) given
    pg advantage_s = rho_s (r_s + gamma_s v_{s+1} - V(x_s)),  v_T = V(x_T)
"""

from __future__ import annotations

import numpy as np


def reference_vtrace(behaviour_logp, target_logp, rewards, discounts, values, bootstrap, rho_bar, c_bar):
    """Straight from the definition: for every s and every column, the explicit sum over t with its product."""
    T, B = rewards.shape
    ratio = np.exp(target_logp - behaviour_logp)
    rho, c = np.minimum(rho_bar, ratio), np.minimum(c_bar, ratio)
    v_ext = np.concatenate([values, bootstrap[None]], 0)  # V(x_0) ... V(x_T)
    vs = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                prod = 1.0
                for i in range(s, t):
                    prod *= discounts[i, b] * c[i, b]
                delta = rho[t, b] * (rewards[t, b] + discounts[t, b] * v_ext[t + 1, b] - v_ext[t, b])
                total += prod * delta
            vs[s, b] = values[s, b] + total
    vs_ext = np.concatenate([vs, bootstrap[None]], 0)
    pg = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            pg[s, b] = rho[s, b] * (rewards[s, b] + discounts[s, b] * vs_ext[s + 1, b] - values[s, b])
    return vs, pg
