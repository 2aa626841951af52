"""Continual backpropagation (continual/plasticity/cbp.py: utility, replacement, AdamGnT) on hand-computed cases, and
PPO_CBP trained on CartPole (with shrink & perturb, diagnostics and eval.py) and Freeway."""

from __future__ import annotations

import copy
import glob
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

from agents.ppo_cbp import CBPAgent
from conftest import run_main, write_config
from continual.config.args import Args
from continual.plasticity.cbp import AdamGnT, UnitTracker, init_bound


def small_net(rate=0.0, maturity=0, eta=0.9, utility="contribution"):
    torch.manual_seed(0)
    fc1, act, fc2 = nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)
    net = nn.Sequential(fc1, act, fc2)
    tracker = UnitTracker("h", fc1, act, [fc2], rate, maturity, eta, "kaiming", utility)
    return net, fc1, fc2, tracker


def test_utility_update_matches_hand_computation():
    net, fc1, fc2, tr = small_net(eta=0.9)
    x = torch.randn(5, 3)
    tr.capture = True
    h = torch.relu(fc1(x))
    net(x)
    tr.step(None)
    expected = (1 - 0.9) * h.abs().mean(0).detach() * fc2.weight.detach().abs().sum(0)
    assert torch.allclose(tr.utility, expected, atol=1e-6)
    assert torch.allclose(tr.mean_act, (1 - 0.9) * h.mean(0).detach(), atol=1e-6)
    assert (tr.age == 1).all()
    # second step: running average
    x2 = torch.randn(5, 3)
    h2 = torch.relu(fc1(x2))
    net(x2)
    tr.step(None)
    expected = 0.9 * expected + 0.1 * h2.abs().mean(0).detach() * fc2.weight.detach().abs().sum(0)
    assert torch.allclose(tr.utility, expected, atol=1e-6)


def test_mean_contribution_variant_centres_activations():
    net, fc1, fc2, tr = small_net(eta=0.5, utility="mean_contribution")
    tr.capture = True
    x = torch.randn(6, 3)
    net(x)
    tr.step(None)  # mean_act is now (1-eta)*mean(h), bias-corrected -> mean(h) at age 1
    x2 = torch.randn(6, 3)
    h2 = torch.relu(fc1(x2)).detach()
    mean_h1 = torch.relu(fc1(x)).detach().mean(0)
    net(x2)
    before = tr.utility.clone()
    tr.step(None)
    contrib = (h2 - mean_h1).abs().mean(0) * fc2.weight.detach().abs().sum(0)
    assert torch.allclose(tr.utility, 0.5 * before + 0.5 * contrib, atol=1e-5)


def test_replacement_count_only_mature_units_zero_outgoing_and_reset_moments():
    torch.manual_seed(1)
    fc1, act, fc2 = nn.Linear(8, 50), nn.ReLU(), nn.Linear(50, 3)
    net = nn.Sequential(fc1, act, fc2)
    rate, maturity, updates = 0.01, 20, 200
    tr = UnitTracker("h", fc1, act, [fc2], rate, maturity, 0.99, "kaiming", "contribution")
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    # make units 0..9 young: they must never be replaced before they mature
    replaced_total = 0
    for step in range(updates):
        tr.capture = True
        x = torch.randn(16, 8)
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ages_before = tr.age.clone()
        n = tr.step(opt)
        replaced_total += n
        if n:
            fresh = torch.nonzero(tr.age == 0).flatten()
            assert len(fresh) >= n
            assert (ages_before[fresh] + 1 > maturity).all(), "only mature units are replaced"
            assert (fc2.weight[:, fresh] == 0).all(), "zero outgoing weights"
            assert (opt.state[fc2.weight]["exp_avg"][:, fresh] == 0).all()
            assert (opt.state[fc2.weight]["exp_avg_sq"][:, fresh] == 0).all()
            assert (opt.state[fc1.weight]["exp_avg"][fresh] == 0).all()
            assert (fc1.bias[fresh] == 0).all()
            bound = init_bound(fc1, "kaiming")
            assert fc1.weight[fresh].abs().max() <= bound
    # all 50 units are eligible after `maturity` updates; replaced units need `maturity` updates to be eligible again
    # expected ~ rate * eligible * updates; eligible drops a little as replaced units are young again
    expected_upper = rate * 50 * (updates - maturity)
    assert expected_upper * 0.8 <= replaced_total <= expected_upper + 1
    assert int(tr.replaced) == replaced_total


def test_replacement_moves_mean_contribution_into_next_bias():
    net, fc1, fc2, tr = small_net(rate=1.0, maturity=0, eta=0.0)  # eta 0: utility = latest contribution
    tr.capture = True
    x = torch.randn(7, 3)
    with torch.no_grad():
        fc1.bias.fill_(1.0)  # every unit active
    h = torch.relu(fc1(x)).detach()
    net(x)
    w_before, b_before = fc2.weight.detach().clone(), fc2.bias.detach().clone()
    # rate 1.0 with 4 eligible units replaces all 4 at once
    tr.rate = 0.25
    n = tr.step(None)
    assert n == 1
    j = int(torch.nonzero(tr.age == 0).flatten()[0])
    contrib = h.abs().mean(0) * w_before.abs().sum(0)
    assert j == int(torch.argmin(contrib))  # lowest utility first
    assert torch.allclose(fc2.bias, b_before + w_before[:, j] * h.mean(0)[j], atol=1e-6)


def test_shared_head_layer_is_tracked_once_over_both_heads():
    args = Args(replacement_rate=0.5, maturity_threshold=0)
    agent = CBPAgent((4,), 2, args)
    trackers = list(agent.cbp.trackers)
    assert len(trackers) == 2  # two hidden layers in the MLP, one tracker each
    last = trackers[-1]
    assert last.out_layers == [agent.actor, agent.critic]
    opt = torch.optim.Adam(agent.parameters())
    agent.cbp.capture(True)
    _, logp, ent, v = agent.get_action_and_value(torch.randn(32, 4))
    (logp.mean() + v.mean()).backward()
    opt.step()
    agent.cbp.step(opt)
    agent.cbp.capture(False)
    fresh = torch.nonzero(last.age == 0).flatten()
    assert len(fresh) > 0
    assert (agent.actor.weight[:, fresh] == 0).all() and (agent.critic.weight[:, fresh] == 0).all()
    # the conv torso: 4 trackers (3 conv + fc), the conv->linear one groups the 49 columns of each channel
    cnn = CBPAgent((4, 84, 84), 3, args)
    assert len(cnn.cbp.trackers) == 4
    assert cnn.cbp.trackers[2]._out_weight_mass().shape == (64,)


def test_cbp_state_round_trips_through_a_checkpoint(tmp_path):
    args = Args(replacement_rate=0.3, maturity_threshold=1)
    agent = CBPAgent((4,), 2, args)
    opt = torch.optim.Adam(agent.parameters())
    for _ in range(5):
        agent.cbp.capture(True)
        _, logp, _, v = agent.get_action_and_value(torch.randn(8, 4))
        opt.zero_grad()
        (logp.mean() + v.mean()).backward()
        opt.step()
        agent.cbp.step(opt)
    path = tmp_path / "a.pt"
    torch.save({"model": agent.state_dict()}, path)
    other = CBPAgent((4,), 2, args)
    other.load_state_dict(torch.load(path, weights_only=True)["model"])
    for a, b in zip(agent.cbp.trackers, other.cbp.trackers):
        assert torch.equal(a.utility, b.utility) and torch.equal(a.age, b.age)
        assert int(a.replaced) == int(b.replaced) and float(a.to_replace) == float(b.to_replace)
    assert sum(int(t.replaced) for t in agent.cbp.trackers) > 0


def _updates_against_float64_adam(make_opt, updates=300, start_step=10_000):
    """Train a small float64 network with CBP; return each optimizer update (param after - before, flattened over
    all parameters), the same update from an independent numpy Adam with a step count per weight whose moments AND
    step restart at zero for every weight of a replaced unit (Dohare et al.: incoming row, incoming bias, outgoing
    column), and the step count of each weight in that reference (1 = first update since (re)initialisation).
    After the first update every step count is set to `start_step`, as deep into a long run."""
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-5
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(3)
        fc1, act, fc2 = nn.Linear(6, 24), nn.ReLU(), nn.Linear(24, 3)
        net = nn.Sequential(fc1, act, fc2)
        teacher = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        tr = UnitTracker("h", fc1, act, [fc2], 0.02, 30, 0.9, "kaiming", "contribution")
        opt = make_opt(net.parameters(), lr=lr, betas=(b1, b2), eps=eps)
        params = [fc1.weight, fc1.bias, fc2.weight, fc2.bias]
        m = [np.zeros(tuple(p.shape)) for p in params]
        v = [np.zeros(tuple(p.shape)) for p in params]
        t = [np.zeros(tuple(p.shape)) for p in params]
        actual, expected, steps = [], [], []
        for n in range(updates):
            x = torch.randn(32, 6)
            tr.capture = True
            loss = (net(x) - teacher(x).detach()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            before = [p.detach().clone() for p in params]
            if n == 1:  # as deep into a long run (torch.optim.Adam's step is a tensor too)
                for st in opt.state.values():
                    st["step"].fill_(start_step - 1)
                for s in t:
                    s.fill(start_step - 1)
            opt.step()
            exp_step = []
            for i, p in enumerate(params):
                g = p.grad.numpy()
                t[i] += 1
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                m_hat, v_hat = m[i] / (1 - b1 ** t[i]), v[i] / (1 - b2 ** t[i])
                exp_step.append(-lr * m_hat / (np.sqrt(v_hat) + eps))
            actual.append(np.concatenate([(p.detach() - b).numpy().ravel() for p, b in zip(params, before)]))
            expected.append(np.concatenate([e.ravel() for e in exp_step]))
            steps.append(np.concatenate([s.ravel() for s in t]))
            if tr.step(opt):
                units = torch.nonzero(tr.age == 0).flatten().numpy()
                for i, index in ((0, (units,)), (1, (units,)), (2, (slice(None), units))):
                    m[i][index] = v[i][index] = t[i][index] = 0.0
        assert int(tr.replaced) >= 20, "the test needs replacements"
        return np.array(actual), np.array(expected), np.array(steps)
    finally:
        torch.set_default_dtype(default)


def test_adamgnt_updates_of_replaced_weights_match_a_per_weight_step_float64_adam():
    actual, expected, steps = _updates_against_float64_adam(AdamGnT)
    young = steps[1:] < steps[1:].max(axis=1, keepdims=True)  # weights restarted by a replacement
    assert young.sum() > 1000
    np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-14)


def test_a_shared_step_count_fails_the_reference_on_replaced_weights():
    """The reference above catches the audit's bug: torch.optim.Adam (one step count per tensor) moves a weight
    whose moments were zeroed late in training by several times the per-weight Adam update."""
    actual, expected, steps = _updates_against_float64_adam(torch.optim.Adam)
    first = (steps == 1) & (np.abs(expected) > 1e-6)  # the first update of a replaced weight
    first[0] = False  # (not of the initial weights)
    ratio = np.abs(actual[first]) / np.abs(expected[first])
    assert first.sum() > 50 and np.median(ratio) > 2.5  # sqrt(1 / (1 - beta2)) * (1 - beta1) = 3.16 at most


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.99, 0.99)])  # PPO's; Dohare et al.'s non-stationary Adam
def test_adamgnt_equals_torch_adam_while_nothing_is_replaced(betas):
    torch.manual_seed(0)
    agent = CBPAgent((4, 84, 84), 3, Args(replacement_rate=0.0))  # channels-last conv weights
    twin = CBPAgent((4, 84, 84), 3, Args(replacement_rate=0.0))
    twin.load_state_dict(agent.state_dict())
    ours = agent.make_optimizer(2.5e-4, betas) if betas != (0.9, 0.999) else agent.make_optimizer(2.5e-4)
    adam = torch.optim.Adam(twin.parameters(), lr=2.5e-4, betas=betas, eps=1e-5)
    assert isinstance(ours, AdamGnT) and ours.defaults["eps"] == 1e-5 and ours.defaults["betas"] == betas
    for _ in range(30):
        x = torch.randint(0, 255, (8, 4, 84, 84), dtype=torch.uint8)
        actions = torch.randint(0, 3, (8,))
        for net, opt in ((agent, ours), (twin, adam)):
            _, logp, ent, v = net.get_action_and_value(x, actions)
            opt.zero_grad()
            (logp.mean() + v.pow(2).mean() - 0.01 * ent.mean()).backward()
            opt.step()
    for (name, p), q in zip(agent.named_parameters(), twin.parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-8), name
    assert all((ours.state[p]["step"] == 30).all() for p in agent.parameters())


def _cbp_updates(agent, opt, n, seed, goal_dim=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn((16, *agent.obs_shape), generator=gen)
        goal = torch.randn((16, goal_dim), generator=gen) if goal_dim else None
        agent.cbp.capture(True)
        _, logp, _, v = agent.get_action_and_value(x, goal=goal)
        opt.zero_grad()
        (logp.mean() + v.pow(2).mean()).backward()
        opt.step()
        agent.cbp.step(opt)
        agent.cbp.capture(False)


def test_adamgnt_state_resumes_exactly_through_a_checkpoint(tmp_path):
    args = Args(replacement_rate=0.05, maturity_threshold=3)
    torch.manual_seed(0)
    agent = CBPAgent((5,), 2, args)
    opt = agent.make_optimizer(1e-2)
    _cbp_updates(agent, opt, 20, seed=1)
    torch.save({"model": agent.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "c.pt")
    _cbp_updates(agent, opt, 20, seed=2)
    state = torch.load(tmp_path / "c.pt", map_location="cpu", weights_only=True)
    other = CBPAgent((5,), 2, args)
    other.load_state_dict(state["model"])
    other_opt = other.make_optimizer(1e-2)
    other_opt.load_state_dict(state["optimizer"])
    torch.manual_seed(123)  # replacement draws fresh weights: same torch RNG state for both continuations
    _cbp_updates(other, other_opt, 20, seed=2)
    resumed = {k: v.clone() for k, v in other.state_dict().items()}
    torch.manual_seed(0)
    agent = CBPAgent((5,), 2, args)
    opt = agent.make_optimizer(1e-2)
    _cbp_updates(agent, opt, 20, seed=1)
    torch.manual_seed(123)
    _cbp_updates(agent, opt, 20, seed=2)
    assert sum(int(t.replaced) for t in agent.cbp.trackers) > 0
    steps = torch.cat([opt.state[p]["step"].flatten() for p in agent.parameters()])
    assert steps.min() < steps.max()  # replaced weights have their own step counts, and they were restored
    for k, v in agent.state_dict().items():
        assert torch.equal(v, resumed[k]), k


def test_adamgnt_continues_a_torch_adam_checkpoint_like_adam():
    """A PPO_CBP checkpoint written with torch.optim.Adam (before AdamGnT) resumes: every weight takes the step."""
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    adam = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    for _ in range(7):
        adam.zero_grad()
        a(torch.randn(5, 4)).pow(2).sum().backward()
        adam.step()
    b.load_state_dict(a.state_dict())
    gnt = AdamGnT(b.parameters(), lr=1e-2, eps=1e-5)
    gnt.load_state_dict(copy.deepcopy(adam.state_dict()))  # as read from a checkpoint: no tensor shared with adam
    for _ in range(5):
        x = torch.randn(5, 4)
        for net, opt in ((a, adam), (b, gnt)):
            opt.zero_grad()
            net(x).pow(2).sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-8)
    assert all((gnt.state[p]["step"] == 12).all() for p in b.parameters())


def test_her_pixels_replaced_fused_unit_gets_fresh_goal_weights_and_state():
    """HER on pixels: a unit of the fused layer ReLU(W_h h + W_g g + b) has incoming weights on both sides; a
    replacement re-initialises both rows and resets their optimizer state (moments and step)."""
    torch.manual_seed(0)
    agent = CBPAgent((4, 84, 84), 3, Args(replacement_rate=0.05, maturity_threshold=2), goal_dim=2)
    fused = agent.cbp.trackers[-1]
    assert fused.in_layer is agent.goal_fusion
    opt = agent.make_optimizer(1e-3)
    for k in range(6):
        goal_before = agent.goal_embed.weight.detach().clone()
        image_before = agent.goal_fusion.weight.detach().clone()
        replaced_before = int(fused.replaced)
        _cbp_updates(agent, opt, 1, seed=k, goal_dim=2)
        if int(fused.replaced) == replaced_before:
            continue
        units = torch.nonzero(fused.age == 0).flatten()
        others = torch.nonzero(fused.age > 0).flatten()
        bound = init_bound(agent.goal_fusion, "kaiming", extra_fan_in=2)
        assert bound == pytest.approx(math.sqrt(2) * math.sqrt(3 / (512 + 2)))
        for layer, before in ((agent.goal_embed, goal_before), (agent.goal_fusion, image_before)):
            w = layer.weight.detach()
            assert not torch.isclose(w[units], before[units]).any(), "fresh incoming weights on both sides"
            assert w[units].abs().max() <= bound
            state = opt.state[layer.weight]
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert (state[key][units] == 0).all(), key
                assert (state[key][others] != 0).any(), key
        return
    raise AssertionError("no unit of the fused layer was replaced")


CARTPOLE = {
    "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64, "update_epochs": 2,
    "reward_scaling": "none", "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": 1536, "modifications": ["", "gravity=15", ""],
                                    "switching_thresholds": [512, 1024]},
}


def test_ppo_cbp_cartpole_smoke_with_shrink_and_perturb_and_eval(tmp_path):
    cfg = write_config(tmp_path, CARTPOLE, "c.json")
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--config", str(cfg), "--architecture", "PPO_CBP",
             "--replacement_rate", "0.01", "--maturity_threshold", "5", "--shrink_and_perturb",
             "--diagnostics_every", "512", "--runs_dir", runs, "--run_name", "cbp", "--no-progress-bar")
    run_dir = os.path.join(runs, "cbp")
    ckpt = torch.load(glob.glob(os.path.join(run_dir, "checkpoints", "final__*"))[0], weights_only=True)
    assert ckpt["architecture"] == "PPO_CBP"
    assert any(k.startswith("cbp.trackers.0.utility") for k in ckpt["model"])
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    plast = [r for r in records if r["kind"] == "plasticity"]
    assert {512, 1024} <= {r["global_step"] for r in plast}  # at both switches
    assert plast[-1]["plasticity/replaced/layer0"] > 0
    assert "plasticity/dormant_fraction/layer1" in plast[-1] and "plasticity/effective_rank" in plast[-1]
    out = str(tmp_path / "ev")
    run_main("eval.py", "--agent_path", run_dir, "--modifs", "gravity=15", "--eval_episodes", "2", "--output", out)
    assert json.load(open(out + ".json"))["architecture"] == "PPO_CBP"


def test_ppo_cbp_freeway_smoke(tmp_path):
    cfg = write_config(tmp_path, {
        "env_id": "ALE/Freeway-v5", "backend": "HackAtari", "num_envs": 2, "num_steps": 32, "num_minibatches": 2,
        "update_epochs": 1, "max_episode_steps": 60, "modification_factory": "Sequential",
        "modification_factory_kwargs": {"num_total_steps": 256, "modifications": ["", "all_green_cars"],
                                        "switching_thresholds": [128]}}, "f.json")
    runs = str(tmp_path / "runs")
    run_main("continual_training_example.py", "--config", str(cfg), "--architecture", "PPO_CBP",
             "--replacement_rate", "0.05", "--maturity_threshold", "1", "--shrink_and_perturb", "--runs_dir", runs,
             "--run_name", "fw", "--no-progress-bar")
    ckpt = torch.load(glob.glob(os.path.join(runs, "fw", "checkpoints", "final__*"))[0], weights_only=True)
    replaced = [int(ckpt["model"][f"cbp.trackers.{i}.replaced"]) for i in range(4)]
    assert len(replaced) == 4 and sum(replaced) > 0
