"""Plasticity injection (Nikishin et al. 2023) against the paper's definition: at injection the heads h_theta are
frozen and a fresh head h_theta' and its frozen copy h_theta'^- are added, output = h_theta + h_theta' - h_theta'^-;
the output does not change, only theta' (and the torso) learns, the frozen copy equals the new head at injection, and
checkpoints rebuild the structure."""

from __future__ import annotations

import copy

import pytest
import torch

from agents import dqn, ppo
from continual.config.args import Args
from continual.config.validation import validate_injection_args
from continual.errors import UserError
from continual.plasticity.injection import (
    InjectedHead,
    folded_state_dict,
    head_linears,
    inject,
    injection_count,
    restore_injection,
    saved_injections,
)
from continual.plasticity.redo import recycle


def trained_agent(seed: int = 0, steps: int = 3):
    """A MinAtar-shaped PPO agent after a few Adam steps (heads away from their initialisation), its optimizer and a
    batch of observations."""
    torch.manual_seed(seed)
    agent = ppo.Agent((4, 10, 10), 3)
    opt = agent.make_optimizer(1e-2)
    x = (torch.rand(32, 4, 10, 10) > 0.5).float()
    for _ in range(steps):
        step(agent, opt, x)
    return agent, opt, x


def loss_of(agent, x):
    _, logp, ent, v = agent.get_action_and_value(x, torch.arange(len(x)) % 3)
    return v.pow(2).mean() - logp.mean() - 0.01 * ent.mean()


def step(agent, opt, x):
    opt.zero_grad()
    loss_of(agent, x).backward()
    opt.step()


def outputs(agent, x):
    with torch.no_grad():
        hidden = agent.features(x)
        return agent.actor(hidden), agent.critic(hidden)


def test_injection_keeps_the_output_and_adds_a_fresh_trainable_head_with_its_frozen_copy():
    agent, opt, x = trained_agent()
    before = outputs(agent, x)
    old_actor, old_critic = agent.actor, agent.critic
    old_values = {n: p.detach().clone() for n, p in agent.named_parameters()}
    torch.manual_seed(7)
    fresh = ppo.Agent((4, 10, 10), 3)
    new_params = inject(agent, fresh, opt)
    for name, old in (("actor", old_actor), ("critic", old_critic)):
        head = getattr(agent, name)
        assert isinstance(head, InjectedHead) and head.old is old
        # theta'^- = theta' at injection, both the fresh network's head (its own initialisation)
        for a, b, f in zip(head.new.parameters(), head.frozen.parameters(), getattr(fresh, name).parameters()):
            assert torch.equal(a, f) and torch.equal(b, f) and a.data_ptr() != b.data_ptr()
    after = outputs(agent, x)
    for b, a in zip(before, after):  # h_theta + h_theta' - h_theta'^- = h_theta, to float rounding
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (a - b).abs().max()
    # exactly the new heads and the torso are trainable; the old heads and the frozen copies are not
    trainable = {n for n, p in agent.named_parameters() if p.requires_grad}
    torso = {n for n in old_values if n.startswith("network.")}
    assert trainable == torso | {f"{h}.new.{k}" for h in ("actor", "critic") for k in ("weight", "bias")}
    assert {id(p) for p in new_params} == {id(p) for h in (agent.actor, agent.critic) for p in h.new.parameters()}
    # the new parameters joined the first group (learning-rate annealing reaches them) with no optimizer state
    group = opt.param_groups[0]["params"]
    assert all(any(p is q for q in group) for p in new_params) and not any(p in opt.state for p in new_params)
    assert injection_count(agent) == 1


def test_gradients_flow_only_into_the_new_head_and_the_torso():
    agent, opt, x = trained_agent()
    ref = copy.deepcopy(agent)
    torch.manual_seed(3)
    inject(agent, ppo.Agent((4, 10, 10), 3), opt)
    agent.zero_grad()
    ref.zero_grad()
    loss_of(agent, x).backward()
    loss_of(ref, x).backward()
    for h in ("actor", "critic"):
        head = getattr(agent, h)
        assert all(p.grad is None for p in (*head.old.parameters(), *head.frozen.parameters()))
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.new.parameters())
        # at injection the new head's gradient is the old head's (same output, same input)
        assert torch.allclose(head.new.weight.grad, getattr(ref, h).weight.grad, atol=1e-6)
    # the torso learns through all three heads; at injection the new and frozen copies' input gradients cancel
    for (n, p), q in zip(agent.network.named_parameters(), ref.network.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), n
    # one optimizer step: the frozen parameters do not move, the new head and the torso do
    frozen = {n: p.detach().clone() for n, p in agent.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in agent.named_parameters() if p.requires_grad}
    opt.step()
    params = dict(agent.named_parameters())
    assert frozen and all(torch.equal(params[n], v) for n, v in frozen.items())
    assert all(not torch.equal(params[n], v) for n, v in trainable.items()), "every trainable tensor moves"


def test_a_second_injection_freezes_the_injected_head_and_keeps_the_output():
    agent, opt, x = trained_agent()
    inject(agent, ppo.Agent((4, 10, 10), 3), opt)
    for _ in range(3):
        step(agent, opt, x)
    before = outputs(agent, x)
    inject(agent, ppo.Agent((4, 10, 10), 3), opt)
    for b, a in zip(before, outputs(agent, x)):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    assert isinstance(agent.actor.old, InjectedHead) and injection_count(agent) == 2
    assert not any(p.requires_grad for p in agent.actor.old.parameters())
    assert saved_injections(agent.state_dict()) == 2
    assert len(head_linears(agent)) == 2 * 5  # per head: old.old, old.new, old.frozen, new, frozen


def test_restore_rebuilds_the_structure_and_the_optimizer_so_training_resumes_exactly():
    agent, opt, x = trained_agent()
    inject(agent, ppo.Agent((4, 10, 10), 3), opt)
    step(agent, opt, x)
    inject(agent, ppo.Agent((4, 10, 10), 3), opt)
    step(agent, opt, x)
    saved = copy.deepcopy({"model": agent.state_dict(), "optimizer": opt.state_dict()})
    torch.manual_seed(99)
    other = ppo.Agent((4, 10, 10), 3)
    other_opt = other.make_optimizer(1e-2)
    assert restore_injection(other, saved["model"], other_opt) == 2
    other.load_state_dict(saved["model"])
    other_opt.load_state_dict(saved["optimizer"])
    assert [n for n, p in other.named_parameters() if p.requires_grad] == \
        [n for n, p in agent.named_parameters() if p.requires_grad]
    for _ in range(2):
        step(agent, opt, x)
        step(other, other_opt, x)
    for (n, p), q in zip(agent.state_dict().items(), other.state_dict().values()):
        assert torch.equal(p, q), n
    assert restore_injection(ppo.Agent((4, 10, 10), 3), ppo.Agent((4, 10, 10), 3).state_dict()) == 0


def test_folded_weights_give_a_plain_network_the_injected_function():
    """IMPALA's actors keep the built structure: the injected heads folded into one layer (W_old + W_new - W_frozen)
    compute the learner's outputs to float rounding."""
    agent, opt, x = trained_agent()
    for _ in range(2):
        inject(agent, ppo.Agent((4, 10, 10), 3), opt)
        for _ in range(3):
            step(agent, opt, x)
    plain = ppo.Agent((4, 10, 10), 3)
    folded = folded_state_dict(agent)
    assert set(folded) == set(plain.state_dict())
    plain.load_state_dict(folded)
    for a, b in zip(outputs(agent, x), outputs(plain, x)):
        assert torch.allclose(a, b, rtol=0, atol=1e-5) and not torch.equal(a, outputs(ppo.Agent((4, 10, 10), 3), x)[0])
    assert folded_state_dict(plain).keys() == plain.state_dict().keys()


def test_dqn_target_network_gets_the_same_fresh_head():
    torch.manual_seed(0)
    q = dqn.QNetwork((4, 10, 10), 5)
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    x = (torch.rand(8, 4, 10, 10) > 0.5).float()
    before = q(x).detach()
    inject(q, dqn.QNetwork((4, 10, 10), 5), opt, followers=(target,))
    assert torch.allclose(q(x), before, atol=1e-6) and torch.allclose(target(x), before, atol=1e-6)
    assert [n for n, _ in q.named_parameters()] == [n for n, _ in target.named_parameters()]
    assert torch.equal(q.q_head.new.weight, target.q_head.new.weight)
    assert not any(p is r for p in q.parameters() for r in target.parameters())
    assert opt.param_groups[0]["params"][-2:] == [q.q_head.new.weight, q.q_head.new.bias]


def test_redo_after_an_injection_zeroes_the_outgoing_weights_in_every_head():
    agent, opt, x = trained_agent()
    inject(agent, ppo.Agent((4, 10, 10), 3), opt)
    step(agent, opt, x)
    counts = recycle(agent, x, 1.0, ppo.Agent((4, 10, 10), 3), opt)  # tau 1: about half the units are dormant
    assert 0 < counts["network.3"] < 128
    zero_cols = [set(torch.nonzero((m.weight == 0).all(0)).flatten().tolist()) for m in head_linears(agent)]
    assert len(zero_cols) == 6 and len(zero_cols[0]) == counts["network.3"] and all(z == zero_cols[0] for z in zero_cols)
    assert opt.state[agent.actor.new.weight]["exp_avg"][:, sorted(zero_cols[0])].abs().sum() == 0


def test_cbp_after_an_injection_reads_the_effective_weights_and_keeps_the_output():
    """PPO_CBP: the last hidden layer's tracker now feeds the injected heads; its contribution utility uses their
    effective weights (old + new - frozen = old at injection), and replacing units moves their mean contribution into
    all three heads' biases, so the injected agent's output after a replacement is the plain agent's."""
    from agents import ppo_cbp

    torch.manual_seed(0)
    agent = ppo_cbp.CBPAgent((4, 10, 10), 3, Args(architecture="PPO_CBP"))
    opt = agent.make_optimizer(1e-2)
    x = (torch.rand(32, 4, 10, 10) > 0.5).float()
    for _ in range(3):
        agent.cbp.capture(True)
        step(agent, opt, x)
        agent.cbp.step(opt)
        agent.cbp.capture(False)
    plain = copy.deepcopy(agent)
    plain_opt = plain.make_optimizer(1e-2)
    inject(agent, ppo_cbp.CBPAgent((4, 10, 10), 3, Args(architecture="PPO_CBP")), opt)
    last, plain_last = agent.cbp.trackers[-1], plain.cbp.trackers[-1]
    assert last.out_layers == [agent.actor, agent.critic]
    assert torch.allclose(last._out_weight_mass(), plain_last._out_weight_mass(), rtol=1e-5, atol=1e-6)
    units = torch.tensor([0, 5, 77])
    with torch.no_grad():
        for tracker, o in ((last, opt), (plain_last, plain_opt)):
            torch.manual_seed(1)
            tracker._replace(units, o)
    for head in (agent.actor, agent.critic):
        assert all((m.weight[:, units] == 0).all() for m in (head.old, head.new, head.frozen))
    for a, b in zip(outputs(agent, x), outputs(plain, x)):
        assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()


@pytest.mark.parametrize("flags,message", [
    (dict(plasticity_injection="every"), "every needs --injection_every"),
    (dict(injection_every=100), "add --plasticity_injection every"),
    (dict(injection_step=100, plasticity_injection="at_switches"), "add --plasticity_injection step"),
    (dict(plasticity_injection="step", architecture="PNC"), "supported by PPO, PPO_CBP, IMPALA, CLEAR, DQN, not PNC"),
    (dict(plasticity_injection="at_switches", reset_layers=1), "not with --reset_layers"),
    (dict(plasticity_injection="at_switches", trac=True), "not with --trac"),
    (dict(plasticity_injection="at_switches", ewc="online"), "not with --ewc"),
    (dict(plasticity_injection="at_switches", shrink_and_perturb=True, perturb_mode="fresh_init"), "fresh_init"),
])
def test_bad_injection_flags_are_refused(flags, message):
    with pytest.raises(UserError, match=message):
        validate_injection_args(Args(**flags))


def test_combinations_that_make_sense_are_accepted():
    for flags in (dict(plasticity_injection="at_switches", redo=True, l2_init=True, shrink_and_perturb=True),
                  dict(plasticity_injection="every", injection_every=1000, architecture="DQN"),
                  dict(plasticity_injection="step")):
        validate_injection_args(Args(**flags))
