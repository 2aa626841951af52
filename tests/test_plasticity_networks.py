"""Network options (LayerNorm, CReLU, deep Fourier features) applied to a built agent: the forward pass against a
hand-written one, and the widened layers initialised as the originals were."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agents import ppo
from continual.plasticity.networks import CReLU, FourierFeatures, apply_network_options


def build(obs_shape, n, **flags):
    torch.manual_seed(0)
    args = types.SimpleNamespace(**{"layer_norm": False, "activation": "default", **flags})
    return apply_network_options(ppo.Agent(obs_shape, n), args)


def test_layer_norm_sits_between_every_hidden_layer_and_its_activation():
    agent = build((4, 10, 10), 3, layer_norm=True)
    # a ReLU subclass (agents.ppo.ContiguousReLU: the same values, contiguous for Flatten) counts as a ReLU
    kinds = [nn.ReLU if isinstance(m, nn.ReLU) else type(m) for m in agent.network]
    assert kinds == [nn.Conv2d, nn.GroupNorm, nn.ReLU, nn.Flatten, nn.Linear, nn.LayerNorm, nn.ReLU]
    x = (torch.rand(5, 4, 10, 10) > 0.5).float()
    conv, fc = agent.network[0], agent.network[4]
    h = conv(x)
    mu, var = h.mean(dim=(1, 2, 3), keepdim=True), h.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
    h = torch.relu((h - mu) / torch.sqrt(var + 1e-5))  # LayerNorm over (C, H, W); the affine starts at 1, 0
    z = fc(h.flatten(1))
    z = torch.relu((z - z.mean(1, keepdim=True)) / torch.sqrt(z.var(1, unbiased=False, keepdim=True) + 1e-5))
    assert torch.allclose(agent.features(x), z, atol=1e-5)


@pytest.mark.parametrize("activation", ["crelu", "fourier"])
def test_doubling_activations_widen_the_next_layer_and_keep_its_initialisation(activation):
    agent = build((4, 10, 10), 3, activation=activation)
    conv, fc = agent.network[0], agent.network[3]
    assert conv.out_channels == 16 and fc.in_features == 2 * 16 * 8 * 8 and fc.out_features == 128
    assert agent.actor.in_features == 256 and agent.critic.in_features == 256
    f = (lambda v: torch.cat((F.relu(v), F.relu(-v)), 1)) if activation == "crelu" else \
        (lambda v: torch.cat((torch.sin(v), torch.cos(v)), 1))
    x = (torch.rand(5, 4, 10, 10) > 0.5).float()
    assert torch.allclose(agent.features(x), f(fc(f(conv(x)).flatten(1))), atol=1e-6)
    assert isinstance(agent.network[1], CReLU if activation == "crelu" else FourierFeatures)
    # orthogonal with the original gains: sqrt(2) for the torso, 0.01 for the actor, 1 for the critic; zero biases
    for layer, gain in ((fc, 2 ** 0.5), (agent.actor, 0.01), (agent.critic, 1.0)):
        w = layer.weight.detach().double()
        assert torch.allclose(w @ w.T, gain ** 2 * torch.eye(w.shape[0], dtype=torch.float64), atol=1e-5)
        assert torch.all(layer.bias == 0)
    _, logp, _, v = agent.get_action_and_value(x)
    assert logp.shape == (5,) and v.shape == (5, 1)


def test_no_option_leaves_the_agent_as_it_was():
    torch.manual_seed(0)
    plain = ppo.Agent((4,), 2)
    same = build((4,), 2)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), same.state_dict().values()))
    assert [type(m) for m in plain.network] == [type(m) for m in same.network]
