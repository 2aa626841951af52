"""Normalize-and-Project (Lyle et al. 2024): LayerNorm in the torso, and after every step each weight matrix back
at its initial Frobenius norm with its direction kept; normalisation scale and offset projected jointly."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from agents import ppo
from continual.config.args import Args
from continual.plasticity.methods import PlasticityMethods
from continual.plasticity.networks import apply_network_options


def test_nap_projects_every_weight_back_to_its_initial_norm_after_each_step():
    torch.manual_seed(0)
    args = Args(nap=True)
    agent = apply_network_options(ppo.Agent((4, 10, 10), 3), args)
    assert any(isinstance(m, nn.LayerNorm) for m in agent.network)  # NaP implies the normalisation
    init = {n: p.detach().double().numpy().copy() for n, p in agent.named_parameters()}
    opt = torch.optim.Adam(agent.parameters(), lr=0.05)
    methods = PlasticityMethods(types.SimpleNamespace(args=args, global_step=0), agent, opt, lambda: None)
    x = (torch.rand(32, 4, 10, 10) > 0.5).float()
    for _ in range(3):
        opt.zero_grad()
        _, lp, ent, v = agent.get_action_and_value(x)
        (v.pow(2).mean() - lp.mean() - ent.mean()).backward()
        opt.step()
        before = {n: p.detach().double().numpy().copy() for n, p in agent.named_parameters()}
        methods.after_step()
        now = {n: p.detach().double().numpy() for n, p in agent.named_parameters()}
        mods = dict(agent.named_modules())
        for name in now:
            mod_name, kind = name.rsplit(".", 1)
            mod = mods[mod_name]
            if isinstance(mod, (nn.LayerNorm, nn.GroupNorm)):
                other = f"{mod_name}.{'bias' if kind == 'weight' else 'weight'}"
                joint0 = np.sqrt((init[name] ** 2).sum() + (init[other] ** 2).sum())
                joint = np.sqrt((now[name] ** 2).sum() + (now[other] ** 2).sum())
                assert joint == pytest.approx(joint0, rel=1e-6), name
                factor = joint0 / np.sqrt((before[name] ** 2).sum() + (before[other] ** 2).sum())
                assert np.allclose(now[name], before[name] * factor, rtol=1e-5, atol=1e-7), name
            elif kind == "weight":
                assert np.linalg.norm(now[name]) == pytest.approx(np.linalg.norm(init[name]), rel=1e-6), name
                want = before[name] * np.linalg.norm(init[name]) / np.linalg.norm(before[name])
                assert np.allclose(now[name], want, rtol=1e-5, atol=1e-7), name
            else:  # the weight layers' biases stay free
                assert np.array_equal(now[name], before[name]), name
        assert any(not np.allclose(before[n], now[n]) for n in now)  # the projection did something
