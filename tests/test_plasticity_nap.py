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
from continual.config.loading import args_from_dict, args_to_dict
from continual.errors import UserError
from continual.plasticity.methods import PlasticityMethods
from continual.plasticity.networks import apply_network_options


@pytest.mark.parametrize("project_heads", [False, True])
def test_nap_projects_every_weight_back_to_its_initial_norm_after_each_step(project_heads):
    torch.manual_seed(0)
    args = Args(nap=True, nap_project_heads=project_heads)
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
            elif kind == "weight" and mod_name in ("actor", "critic") and not project_heads:
                assert np.array_equal(now[name], before[name]), name  # the heads stay free
            elif kind == "weight":
                assert np.linalg.norm(now[name]) == pytest.approx(np.linalg.norm(init[name]), rel=1e-6), name
                want = before[name] * np.linalg.norm(init[name]) / np.linalg.norm(before[name])
                assert np.allclose(now[name], want, rtol=1e-5, atol=1e-7), name
            else:  # the weight layers' biases stay free
                assert np.array_equal(now[name], before[name]), name
        assert any(not np.allclose(before[n], now[n]) for n in now)  # the projection did something


@pytest.mark.parametrize("project_heads", [False, True])
def test_nap_leaves_the_heads_free_unless_asked(project_heads):
    """The heads' outputs are not normalised, so projecting them bounds the outputs: PPO's actor head at its
    initial norm (0.01 per action) keeps every logit within 0.01 * sqrt(actions) * ||features|| of 0."""
    torch.manual_seed(1)
    args = Args(nap=True, nap_project_heads=project_heads)
    agent = apply_network_options(ppo.Agent((4, 10, 10), 3), args)
    opt = torch.optim.Adam(agent.parameters(), lr=0.05)
    methods = PlasticityMethods(types.SimpleNamespace(args=args, global_step=0), agent, opt, lambda: None)
    head0 = {h: float(getattr(agent, h).weight.detach().norm()) for h in ("actor", "critic")}
    torso0 = [float(m.weight.detach().norm()) for m in agent.network if isinstance(m, (nn.Linear, nn.Conv2d))]
    x = (torch.rand(64, 4, 10, 10) > 0.5).float()
    target = torch.arange(64) % 3  # a state-dependent target policy: only the actor head's weights can fit it
    for _ in range(60):
        opt.zero_grad()
        features = agent.features(x)
        loss = nn.functional.cross_entropy(agent.actor(features), target) + (agent.critic(features) - 5).pow(2).mean()
        loss.backward()
        opt.step()
        methods.after_step()
    torso = [float(m.weight.detach().norm()) for m in agent.network if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert torso == pytest.approx(torso0, rel=1e-5)  # the torso is projected either way
    actor = float(agent.actor.weight.detach().norm())
    with torch.no_grad():
        logits = agent.actor(agent.features(x)) - agent.actor.bias
        bound = actor * agent.features(x).norm(dim=1).max()
    assert float(logits.abs().max()) <= float(bound) + 1e-5
    if project_heads:
        assert actor == pytest.approx(head0["actor"], rel=1e-5)
        assert float(agent.critic.weight.detach().norm()) == pytest.approx(head0["critic"], rel=1e-5)
        assert actor == pytest.approx(0.01 * np.sqrt(3), rel=1e-4)
    else:
        assert actor > 10 * head0["actor"]  # free to grow: the policy can leave uniform
        assert float(agent.critic.weight.detach().norm()) != pytest.approx(head0["critic"], rel=1e-3)


def test_nap_resumes_a_checkpoint_that_projected_the_heads():
    """Checkpoints from before --nap_project_heads hold one norm per projected layer, the heads' included: their saved
    args read back with the heads projected, and a network that projects fewer layers refuses their state."""
    saved = args_to_dict(Args(nap=True))
    del saved["nap_project_heads"]
    args = args_from_dict(saved)
    assert args.nap_project_heads
    assert not args_from_dict({k: v for k, v in args_to_dict(Args()).items() if k != "nap_project_heads"}).nap_project_heads
    agent = apply_network_options(ppo.Agent((4, 10, 10), 3), args)
    opt = torch.optim.Adam(agent.parameters(), lr=0.05)
    old = PlasticityMethods(types.SimpleNamespace(args=Args(nap=True, nap_project_heads=True), global_step=0),
                            agent, opt, lambda: None)
    resumed = PlasticityMethods(types.SimpleNamespace(args=args, global_step=0), agent, opt, lambda: None)
    resumed.load_state_dict(old.state_dict())
    assert resumed.nap_modules == old.nap_modules and resumed.nap_norms == old.nap_norms
    torso = PlasticityMethods(types.SimpleNamespace(args=Args(nap=True), global_step=0), agent, opt, lambda: None)
    assert len(old.nap_modules) == len(torso.nap_modules) + 2
    with pytest.raises(UserError, match="nap"):
        torso.load_state_dict(old.state_dict())
