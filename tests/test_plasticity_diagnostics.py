"""The plasticity metrics (continual/plasticity/diagnostics.py): dormant units and effective rank on crafted inputs,
stable rank, active fraction and weight change against float64 re-implementations, and the monitor's reference
weights across a switch and a checkpoint."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from agents import ppo
from continual.config.args import Args
from continual.plasticity.diagnostics import (
    PlasticityMonitor,
    active_fraction,
    dormant_fraction,
    effective_rank,
    stable_rank,
    weight_change,
    weight_snapshot,
)


def srank_numpy(m: np.ndarray, delta: float = 0.01) -> int:
    s = np.linalg.svd(m.astype(np.float64), compute_uv=False)  # decreasing
    acc = 0.0
    for k, v in enumerate(s, 1):
        acc += v
        if acc >= (1 - delta) * s.sum():
            return k
    return len(s)


@pytest.mark.parametrize("spectrum", [[5.0, 3.0, 1.0, 0.5, 0.01], [1.0] * 6, [10.0, 1e-3, 1e-3, 1e-3]])
def test_stable_rank_is_the_least_k_holding_99_percent_of_the_singular_values(spectrum):
    rng = np.random.default_rng(0)
    n = len(spectrum)
    u, _ = np.linalg.qr(rng.normal(size=(40, n)))
    v, _ = np.linalg.qr(rng.normal(size=(n, n)))
    m = (u * np.array(spectrum)) @ v.T
    expected = srank_numpy(m)
    assert stable_rank(torch.tensor(m, dtype=torch.float32)) == expected
    # by hand for the first spectrum: 5+3+1 = 9 of 9.51 (94.6%), 9.5 of 9.51 (99.9%) -> 4
    if spectrum[0] == 5.0:
        assert expected == 4
    if spectrum == [10.0, 1e-3, 1e-3, 1e-3]:
        assert expected == 1
    assert stable_rank(torch.zeros(8, 3)) == 0


def test_active_fraction_counts_positive_relu_and_unsaturated_tanh_entries():
    h = torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0]])
    assert active_fraction(h, "relu") == pytest.approx(3 / 6)
    t = torch.tensor([[0.995, -0.999, 0.1, -0.5]])
    assert active_fraction(t, "tanh") == pytest.approx(2 / 4)
    conv = torch.relu(torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(1)))
    assert active_fraction(conv, "relu") == pytest.approx(float((conv.numpy() > 0).mean()))


def test_weight_change_is_the_rms_parameter_difference_in_float64():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    ref = weight_snapshot(net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    diffs = np.concatenate([(p.detach().double().numpy() - ref[n].double().numpy()).ravel()
                            for n, p in net.named_parameters()])
    assert weight_change(net, ref) == pytest.approx(math.sqrt(np.mean(diffs ** 2)), rel=1e-12)
    assert weight_change(net, weight_snapshot(net)) == 0.0


class FakeLogger:
    def __init__(self):
        self.scalar_log = []

    def scalars(self, values, step):
        self.scalar_log.append((step, values))

    def record(self, *a, **k):
        pass


def test_monitor_logs_the_new_metrics_and_measures_change_since_init_and_since_the_switch():
    torch.manual_seed(0)
    agent = ppo.Agent((4, 10, 10), 3)
    session = types.SimpleNamespace(args=Args(diagnostics_every=0), global_step=0, logger=FakeLogger(),
                                    modification="", np_rng=np.random.default_rng(0))
    monitor = PlasticityMonitor(session, agent)
    monitor.observe({"obs": (torch.rand(8, 4, 4, 10, 10) > 0.7).float()})
    init = {n: p.detach().clone() for n, p in agent.named_parameters()}
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.01)
    out = monitor.compute()
    assert out["plasticity/weight_change/init"] == pytest.approx(0.01, rel=1e-5)
    assert out["plasticity/weight_change/switch"] == pytest.approx(0.01, rel=1e-5)
    # the features are the 128 ReLU units of the last layer: the stable rank of the probe batch's
    feats = agent.features(monitor.probe).detach()
    assert out["plasticity/stable_rank"] == srank_numpy(feats.numpy())
    acts = [torch.relu(agent.network[0](agent.scaled_input(monitor.probe))),
            feats]
    for i, a in enumerate(acts):
        assert out[f"plasticity/active_fraction/layer{i}"] == pytest.approx(float((a.detach().numpy() > 0).mean()))
    total = sum(int((a > 0).sum()) for a in acts) / sum(a.numel() for a in acts)
    assert out["plasticity/active_fraction/all"] == pytest.approx(total)
    # a switch: the reference of the "since the switch" change moves, the one of "since init" stays
    session.global_step = 64
    monitor.on_switch_start(types.SimpleNamespace(count=1))
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.02)
    out = monitor.compute()
    assert out["plasticity/weight_change/switch"] == pytest.approx(0.02, rel=1e-5)
    assert out["plasticity/weight_change/init"] == pytest.approx(0.03, rel=1e-5)
    # a checkpoint restores both references
    state = monitor.state_dict()
    other = PlasticityMonitor(session, agent)
    other.load_state_dict(state)
    again = other.compute() if other.probe is not None else None
    assert again is not None and again["plasticity/weight_change/init"] == pytest.approx(0.03, rel=1e-5)
    assert all(torch.equal(state["init_weights"][n], init[n]) for n in init)


def test_dormant_fraction_on_crafted_activations():
    act = torch.zeros(10, 4)
    act[:, 0] = 1.0
    act[:, 1] = 1.0
    act[:, 2] = 0.01  # score 0.01 / mean(0.5025) ~ 0.02 <= 0.025: dormant
    # unit 3 is always 0: dormant
    assert dormant_fraction(act, 0.025) == pytest.approx(0.5)
    assert dormant_fraction(act, 0.0) == pytest.approx(0.25)
    conv = torch.zeros(2, 3, 5, 5)
    conv[:, 0] = 2.0
    assert dormant_fraction(conv, 0.1) == pytest.approx(2 / 3)


def test_dormant_fraction_all_counts_dormant_units_over_all_units():
    """Sokar et al. 2023: the dormant share of a network is dormant units / all units, each unit scored against
    the mean of its own layer. Layers of 4 and 12 units, 2 and 0 dormant: 2/16, not mean(2/4, 0/12)."""
    from types import SimpleNamespace

    from continual.plasticity.diagnostics import PlasticityMonitor

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.network = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 12), nn.ReLU())

        def features(self, x):
            return self.network(x)

    net = Net()
    with torch.no_grad():
        for layer in (net.network[0], net.network[2]):
            layer.weight.zero_()
            layer.bias.fill_(1.0)
        net.network[0].bias[:2] = -1.0  # two dead units in the first layer
    session = SimpleNamespace(args=SimpleNamespace(dormant_tau=0.025, diagnostics_every=0), before_switch=[],
                              global_step=0, np_rng=np.random.default_rng(0))
    monitor = PlasticityMonitor(session, net)
    monitor.observe({"obs": torch.randn(4, 2, 3)})
    out = monitor.compute()
    assert out["plasticity/dormant_fraction/layer0"] == pytest.approx(2 / 4)
    assert out["plasticity/dormant_fraction/layer1"] == pytest.approx(0.0)
    assert out["plasticity/dormant_fraction/all"] == pytest.approx(2 / 16)


def test_effective_rank_on_known_matrices():
    eye = torch.eye(8)
    assert effective_rank(eye) == pytest.approx(8.0)
    rank_one = torch.ones(10, 1) @ torch.randn(1, 6)
    assert effective_rank(rank_one) == pytest.approx(1.0, abs=1e-6)
    diag = torch.diag(torch.tensor([3.0, 1.0]))
    p = torch.tensor([0.75, 0.25])
    assert effective_rank(diag) == pytest.approx(math.exp(-(p * p.log()).sum().item()))


# --- a remedy that did nothing says so at the end of the run ---------------------------------------------------------

def test_idle_remedies_name_what_did_nothing():
    from continual.training.remedies import idle_remedies

    cbp = {"cbp.trackers.0.replaced": torch.tensor(0), "cbp.trackers.0.age": torch.full((4,), 160),
           "cbp.trackers.0.to_replace": torch.tensor(0.24, dtype=torch.float64)}
    args = Args(architecture="PPO_CBP", shrink_and_perturb=True, redo=True, redo_every=10_000)
    notes = idle_remedies(args, {"model": cbp, "switches": 0, "global_step": 4096,
                                 "plasticity_methods": {"redo_count": 0, "reset_count": 0, "inject_count": 0}})
    assert len(notes) == 3
    assert notes[0].startswith("CBP replaced 0 units in 160 optimizer updates") and "0.24 of a unit" in notes[0]
    assert notes[1].startswith("--shrink_and_perturb did nothing: it acts at regime switches")
    assert notes[2].startswith("--redo_every never came due")
    # what acted says nothing
    acted = {"cbp.trackers.0.replaced": torch.tensor(3), "cbp.trackers.0.age": torch.full((4,), 160)}
    assert idle_remedies(args, {"model": acted, "switches": 2, "global_step": 4096,
                                "plasticity_methods": {"redo_count": 1}}) == []
    assert idle_remedies(Args(), {"model": {}, "switches": 0, "global_step": 64}) == []


def test_a_ppo_cbp_run_that_replaced_nothing_says_so_in_one_line(tmp_path):
    from conftest import run_main

    proc = run_main("continual_training_example.py", "--architecture", "PPO_CBP", "--env_id", "CartPole-v1",
                    "--backend", "Gymnasium", "--num_envs", "2", "--num_steps", "64", "--total_timesteps", "128",
                    "--shrink_and_perturb", "--runs_dir", str(tmp_path), "--no-progress-bar")
    notes = [ln for ln in proc.stdout.splitlines() if ln.startswith("note: ")]
    assert len(notes) == 2 and notes[0].startswith("note: CBP replaced 0 units in 16 optimizer updates"), notes  # 4 epochs x 4
    assert "--shrink_and_perturb did nothing" in notes[1]
