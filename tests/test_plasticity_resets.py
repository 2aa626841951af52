"""Layer resetting (Nikishin et al. 2022): the last k layers take a fresh network's weights and lose their optimizer
state; everything else is untouched."""

from __future__ import annotations

import copy

import pytest
import torch

from agents import ppo
from continual.plasticity.resets import layer_groups, reset_last_layers


def test_layer_groups_count_from_the_heads():
    agent = ppo.Agent((4, 84, 84), 6)
    assert layer_groups(agent) == [["actor", "critic"], ["network.7"], ["network.4"], ["network.2"], ["network.0"]]


@pytest.mark.parametrize("k", [1, 2])
def test_reset_last_layers_copies_the_fresh_weights_and_drops_their_optimizer_state(k):
    torch.manual_seed(0)
    agent = ppo.Agent((4, 10, 10), 3)
    opt = torch.optim.Adam(agent.parameters(), lr=1e-2)
    x = (torch.rand(16, 4, 10, 10) > 0.5).float()
    for _ in range(2):
        opt.zero_grad()
        _, lp, _, v = agent.get_action_and_value(x)
        (v.pow(2).mean() - lp.mean()).backward()
        opt.step()
    before = copy.deepcopy(agent)
    torch.manual_seed(7)
    fresh = ppo.Agent((4, 10, 10), 3)
    names = reset_last_layers(agent, k, fresh, opt)
    assert names == ["actor", "critic", "network.3"][: 2 if k == 1 else 3]
    old, new = dict(before.named_parameters()), dict(fresh.named_parameters())
    for name, p in agent.named_parameters():
        reset = name.rsplit(".", 1)[0] in names
        assert torch.equal(p, new[name] if reset else old[name]), name
        assert (p not in opt.state) == reset, name
    # the optimizer goes on: the reset parameters restart Adam from step 1
    opt.zero_grad()
    _, lp, _, v = agent.get_action_and_value(x)
    (v.pow(2).mean() - lp.mean()).backward()
    opt.step()
    assert float(opt.state[agent.actor.weight]["step"]) == 1.0 and float(opt.state[agent.network[0].weight]["step"]) == 3.0


def test_more_layers_than_the_network_has_is_refused():
    import types

    from continual.config.args import Args
    from continual.errors import UserError
    from continual.plasticity.methods import PlasticityMethods

    agent = ppo.Agent((4,), 2)  # two hidden layers and the heads: 3 layers
    opt = torch.optim.Adam(agent.parameters())
    session = types.SimpleNamespace(args=Args(reset_layers=3), global_step=0)
    PlasticityMethods(session, agent, opt, lambda: None)
    with pytest.raises(UserError, match="reset_layers: this network has 3 layers"):
        PlasticityMethods(types.SimpleNamespace(args=Args(reset_layers=4), global_step=0), agent, opt, lambda: None)
