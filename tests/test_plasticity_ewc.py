"""EWC and online EWC (continual/plasticity/ewc.py): the Fisher diagonal against hand computation and an independent
float64 per-sample computation, the penalties and their gradients against hand computation, consolidation at switches
(ewc: one anchor per ended regime; online: F <- gamma*F + F_new), the checkpoint round trip, bad flags, and PPO
CartPole runs with a 2-regime gravity curriculum (the penalty is 0 before the switch and > 0 after; resuming the switch
checkpoint does not consolidate twice)."""

from __future__ import annotations

import io
import os
import shutil
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from agents import ppo
from conftest import exit_2, run_main, run_script, write_config
from continual.config.args import Args
from continual.config.validation import validate_ewc_args
from continual.errors import UserError
from continual.plasticity.ewc import EWC, diagonal_fisher, ewc_penalty
from continual.training.extensions import SwitchEvent
from continual.training.tracking import read_metrics


class Tiny(nn.Module):
    """obs (3,) -> tanh hidden (4) -> logits (3) and a value (never in the Fisher)."""

    def __init__(self, continuous: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.actor, self.critic = nn.Linear(3, 4), nn.Linear(4, 2 if continuous else 3), nn.Linear(4, 1)
        self.continuous = continuous
        if continuous:
            self.actor_logstd = nn.Parameter(torch.tensor([[0.3, -0.5]]))


def head(model: Tiny, x: torch.Tensor):
    h = torch.tanh(model.body(x.float()))
    if model.continuous:
        mean = model.actor(h)
        return mean, model.actor_logstd.expand_as(mean)
    return model.actor(h)


def same_actions(model: Tiny, obs: torch.Tensor, seed: int) -> torch.Tensor:
    """The actions diagonal_fisher draws (one chunk: the same generator calls in the same order)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out = head(model, obs)
        if model.continuous:
            mean, log_std = out
            return mean + log_std.exp() * torch.randn(mean.shape, generator=gen)
        return torch.multinomial(torch.softmax(out.double(), -1), 1, generator=gen).squeeze(-1)


def reference_fisher(model: Tiny, obs: torch.Tensor, actions: torch.Tensor) -> dict[str, torch.Tensor]:
    """Independent float64: a copy of the model, one autograd pass per sample, squares averaged."""
    m64 = Tiny(model.continuous).double()
    m64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    names = [n for n, _ in m64.named_parameters()]
    sums = {n: torch.zeros_like(p) for n, p in m64.named_parameters()}
    for x, a in zip(obs.double(), actions):
        h = torch.tanh(m64.body(x))
        if model.continuous:
            mean, log_std = m64.actor(h), m64.actor_logstd[0]
            logp = torch.distributions.Normal(mean, log_std.exp()).log_prob(a.double()).sum()
        else:
            logp = torch.log_softmax(m64.actor(h), -1)[a]
        grads = torch.autograd.grad(logp, list(m64.parameters()), allow_unused=True)
        for n, g in zip(names, grads):
            if g is not None:
                sums[n] += g**2
    return {n: s / len(obs) for n, s in sums.items()}


@pytest.mark.parametrize("continuous", [False, True])
def test_fisher_matches_an_independent_float64_per_sample_computation(continuous):
    model = Tiny(continuous)
    obs = torch.randn(9, 3, generator=torch.Generator().manual_seed(1))
    fisher = diagonal_fisher(model, head, obs, continuous, torch.Generator().manual_seed(5))
    ref = reference_fisher(model, obs, same_actions(model, obs, 5))
    assert set(fisher) == set(ref)
    for n in ref:
        torch.testing.assert_close(fisher[n].double(), ref[n], rtol=1e-5, atol=1e-9)
    assert fisher["critic.weight"].abs().sum() == 0 and fisher["body.weight"].abs().sum() > 0


def test_fisher_of_a_softmax_layer_by_hand():
    """logits = W x + b: d log pi(a|x) / dW = (e_a - p) x^T, d/db = e_a - p (hand formula, numpy float64)."""
    layer = nn.Linear(2, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.5, -1.0], [0.2, 0.3], [-0.4, 0.8]]))
        layer.bias.copy_(torch.tensor([0.1, 0.0, -0.2]))
    obs = torch.tensor([[1.0, 2.0], [-0.5, 0.25]])
    fisher = diagonal_fisher(layer, lambda m, x: m(x), obs, False, torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    actions = torch.multinomial(torch.softmax(layer(obs).detach().double(), -1), 1, generator=gen).squeeze(-1)
    W, b = layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy()
    fw, fb = np.zeros((3, 2)), np.zeros(3)
    for x, a in zip(obs.double().numpy(), actions.numpy()):
        z = W @ x + b
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        d = np.eye(3)[a] - p
        fw += np.outer(d, x) ** 2 / 2
        fb += d**2 / 2
    np.testing.assert_allclose(fisher["weight"].double().numpy(), fw, rtol=1e-5)
    np.testing.assert_allclose(fisher["bias"].double().numpy(), fb, rtol=1e-5)


def test_fisher_is_the_true_fisher_in_expectation():
    """Many draws at one state -> sum_a pi(a|s) g_a^2 (the exact expectation over the policy's actions)."""
    model = Tiny()
    obs = torch.randn(1, 3, generator=torch.Generator().manual_seed(2)).repeat(4000, 1)
    fisher = diagonal_fisher(model, head, obs, False, torch.Generator().manual_seed(0))
    logits = head(model, obs[:1])[0]
    probs = torch.softmax(logits, -1).detach()
    exact = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for a in range(3):
        grads = torch.autograd.grad(torch.log_softmax(head(model, obs[:1])[0], -1)[a], list(model.parameters()),
                                    allow_unused=True)
        for (n, _), g in zip(model.named_parameters(), grads):
            if g is not None:
                exact[n] += probs[a] * g**2
    for n in ("actor.weight", "actor.bias", "body.weight"):
        torch.testing.assert_close(fisher[n], exact[n], rtol=0.08, atol=1e-6)  # ~1/sqrt(4000) Monte-Carlo error


def test_penalties_and_gradients_by_hand():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    a1 = ({"weight": torch.tensor([[0.0, -1.0]]), "bias": torch.tensor([0.0])},
          {"weight": torch.tensor([[2.0, 3.0]]), "bias": torch.tensor([4.0])})
    a2 = ({"weight": torch.tensor([[1.5, -2.0]]), "bias": torch.tensor([1.5])},
          {"weight": torch.tensor([[1.0, 0.0]]), "bias": torch.tensor([0.5])})
    # a1: 2*1^2 + 3*(-1)^2 + 4*0.5^2 = 6;  a2: 1*(-0.5)^2 + 0 + 0.5*(-1)^2 = 0.75
    lam = 3.0
    p = ewc_penalty(model, [a1, a2], lam)
    assert p.item() == pytest.approx(0.5 * lam * 6.75)
    p.backward()
    # d/dtheta = lam * sum_k F_k (theta - theta*_k)
    torch.testing.assert_close(model.weight.grad, lam * torch.tensor([[2.0 * 1 + 1.0 * -0.5, 3.0 * -1 + 0.0]]))
    torch.testing.assert_close(model.bias.grad, lam * torch.tensor([4.0 * 0.5 + 0.5 * -1.0]))
    assert ewc_penalty(model, [a1, a2], lam, scale_by_count=True).item() == pytest.approx(0.5 * lam * 6.75 / 2)
    assert ewc_penalty(model, [], lam).item() == 0.0


def _consolidate(mode: str, regimes: list[str], **kw) -> tuple[EWC, list[tuple[dict, dict]]]:
    """Run an EWC callback through switches ending `regimes`, changing the weights and observations in between;
    returns it and the (theta*, F) of every switch computed independently."""
    model = Tiny()
    ewc = EWC(model, head, False, mode, lam=2.0, gamma=0.5, samples=8, seed=3, **kw)
    ewc.attach(types.SimpleNamespace(modification=regimes[0]))
    expected = []
    for count, old in enumerate(regimes, start=1):
        obs = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(count))
        ewc.observe({"obs": obs, "obs_shape": (3,)})
        theta = {n: p.detach().clone() for n, p in model.named_parameters()}
        f = diagonal_fisher(model, head, obs.reshape(10, 3)[-8:], False,
                            torch.Generator().manual_seed(3 * 1_000_003 + count))
        expected.append((theta, f))
        event = SwitchEvent(old, "next", 100 * count, count)
        ewc.on_switch_start(event)
        ewc.on_switch_end(event)
        ewc.penalty()  # as training does between switches (a cached merge must not go stale)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * count)
    return ewc, expected


def _assert_anchor(got: tuple[dict, dict], theta: dict, fisher: dict) -> None:
    for n in fisher:
        torch.testing.assert_close(got[0][n], theta[n], rtol=0, atol=0)
        torch.testing.assert_close(got[1][n], fisher[n], rtol=1e-6, atol=1e-12)


def _assert_penalty(ewc: EWC, anchors: list, scale: bool = False) -> None:
    """The callback's merged quadratic against the definition (ewc_penalty): value and gradient."""
    ref = ewc_penalty(ewc.model, anchors, ewc.lam, scale)
    ref_grads = torch.autograd.grad(ref, list(ewc.model.parameters()))
    got = ewc.penalty()
    got_grads = torch.autograd.grad(got, list(ewc.model.parameters()))
    assert ref.item() > 0 and got.item() == pytest.approx(ref.item(), rel=1e-5)
    for g, r in zip(got_grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)


def test_ewc_keeps_one_anchor_per_ended_regime_and_a_revisit_replaces_it():
    ewc, exp = _consolidate("ewc", ["a", "b", "a"])
    assert list(ewc.anchors) == ["b", "a"]
    _assert_anchor(ewc.anchors["b"], *exp[1])
    _assert_anchor(ewc.anchors["a"], *exp[2])
    _assert_penalty(ewc, [exp[1], exp[2]])
    ewc.scale_by_tasks = True
    _assert_penalty(ewc, [exp[1], exp[2]], scale=True)
    ewc.scale_by_tasks, ewc.omit_current = False, True  # the session's regime is "a": its own anchor is left out
    _assert_penalty(ewc, [exp[1]])
    ewc.session.modification = "b"
    _assert_penalty(ewc, [exp[2]])


def test_online_ewc_decays_the_running_fisher_and_keeps_the_latest_anchor():
    ewc, exp = _consolidate("online", ["a", "b", "c"])
    assert list(ewc.anchors) == ["online"]
    gamma = 0.5
    running = {n: gamma * (gamma * exp[0][1][n] + exp[1][1][n]) + exp[2][1][n] for n in exp[0][1]}
    _assert_anchor(ewc.anchors["online"], exp[2][0], running)
    _assert_penalty(ewc, [(exp[2][0], running)])
    ewc.scale_by_tasks = True  # ewc only: online has one anchor
    _assert_penalty(ewc, [(exp[2][0], running)])


def test_normalize_full_divides_each_fisher_tensor_by_its_norm():
    ewc, exp = _consolidate("ewc", ["a"], normalize="full")
    _assert_anchor(ewc.anchors["a"], exp[0][0], {n: f / f.norm().clamp_min(1e-30) for n, f in exp[0][1].items()})


@pytest.mark.parametrize("mode", ["ewc", "online"])
def test_checkpoint_round_trip_is_exact_and_a_resumed_switch_is_not_consolidated_twice(mode):
    ewc, _ = _consolidate(mode, ["a", "b"])
    ewc.observe({"obs": torch.randn(3, 3, generator=torch.Generator().manual_seed(9)), "obs_shape": (3,)})
    buf = io.BytesIO()
    torch.save(ewc.state_dict(), buf)
    buf.seek(0)
    resumed = EWC(ewc.model, head, False, mode, lam=2.0, gamma=0.5, samples=8, seed=3)
    resumed.attach(ewc.session)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert resumed.penalty().item() == ewc.penalty().item()
    resumed.on_switch_start(SwitchEvent("a", "b", 150, 2))  # the switch that wrote the checkpoint, redone
    assert resumed.consolidated == 2
    for obj in (ewc, resumed):  # online: a second consolidation would decay F once more; both must match here
        assert list(obj.anchors) == list(ewc.anchors)
    for k in ewc.anchors:
        for part in (0, 1):
            for n, t in ewc.anchors[k][part].items():
                assert torch.equal(t, resumed.anchors[k][part][n])
    for obj in (ewc, resumed):  # the next switch consolidates identically (the buffer came back too)
        obj.on_switch_start(SwitchEvent("c", "a", 300, 3))
    for k in ewc.anchors:
        for part in (0, 1):
            for n, t in ewc.anchors[k][part].items():
                assert torch.equal(t, resumed.anchors[k][part][n])
    other = "online" if mode == "ewc" else "ewc"
    with pytest.raises(ValueError, match="mode"):
        EWC(ewc.model, head, False, other, 1.0, 0.5, 8, 3).load_state_dict(ewc.state_dict())


@pytest.mark.parametrize("field, value, match", [
    ("ewc_lambda", -1.0, "ewc_lambda"), ("ewc_lambda", float("nan"), "ewc_lambda"), ("ewc_gamma", 1.5, "ewc_gamma"),
    ("ewc_samples", 0, "ewc_samples"), ("ewc_fisher_batch", 0, "ewc_fisher_batch"),
    ("ewc_fisher_batches", -1, "ewc_fisher_batches"), ("her", True, "ewc: not supported with --her"),
])
def test_bad_ewc_flags_are_refused(field, value, match):
    args = Args(ewc="online")
    setattr(args, field, value)
    with pytest.raises(UserError, match=match):
        validate_ewc_args(args)


def test_a_run_saved_before_ewc_fisher_existed_resumes_with_the_true_fisher():
    from continual.config.loading import args_from_dict, args_to_dict

    saved = args_to_dict(Args(ewc="online"))
    del saved["ewc_fisher"], saved["ewc_fisher_batch"], saved["ewc_fisher_batches"]
    assert args_from_dict(saved).ewc_fisher == "true"
    assert args_from_dict(args_to_dict(Args(ewc="online"))).ewc_fisher == "cora"


CARTPOLE = {
    "env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 2, "num_steps": 64, "update_epochs": 2,
    "reward_scaling": "none", "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": 1024, "modifications": ["", "gravity=15"],
                                    "switching_thresholds": [512]},
}


def test_a_curriculum_that_never_switches_is_refused_before_any_env(tmp_path, capsys):
    cfg = write_config(tmp_path, {**CARTPOLE, "modification_factory_kwargs": {
        "num_total_steps": 1024, "modifications": ["gravity=15"], "switching_thresholds": []}}, "cfg.json")
    out, err = exit_2(ppo.main, ["--config", str(cfg), "--runs_dir", str(tmp_path / "runs"), "--ewc", "ewc",
                                 "--no-progress-bar"], capsys)
    assert err.strip().splitlines() == [err.strip()] and err.startswith("error: ewc:")
    assert "never switches" in err and not out.strip()
    assert not os.path.exists(tmp_path / "runs")


def _ewc_state(run_dir: str, name: str) -> dict:
    return torch.load(os.path.join(run_dir, "checkpoints", name), weights_only=True)["ewc"]


def test_ppo_cartpole_gravity_switch_penalty_and_switch_checkpoint_resume(tmp_path):
    cfg = write_config(tmp_path, CARTPOLE, "cfg.json")
    runs = tmp_path / "runs"
    run_main("agents/ppo.py", "--config", str(cfg), "--runs_dir", str(runs), "--run_name", "full", "--ewc", "ewc",
             "--ewc_lambda", "1000", "--save_agent_with_switch", "--no-progress-bar")
    full = str(runs / "full")
    records = [r for r in read_metrics(os.path.join(full, "metrics.jsonl")) if r["kind"] == "iteration"]
    penalty = {r["global_step"]: r["losses/ewc_penalty"] for r in records}
    assert sorted(penalty) == list(range(128, 1025, 128))
    assert all(penalty[s] == 0.0 for s in range(128, 513, 128))  # no anchor before the first switch
    assert all(penalty[s] > 0.0 for s in range(640, 1025, 128))
    switch_ckpt = "switch__no_modif__step512.cleanrl_model"
    at_switch, final = _ewc_state(full, switch_ckpt), _ewc_state(full, "final__step1024.cleanrl_model")
    assert at_switch["consolidated"] == 1 and [a[0] for a in at_switch["anchors"]] == [""]
    assert final["consolidated"] == 1 and [a[0] for a in final["anchors"]] == [""]
    assert final["buffer"]["obs"].shape == (1024, 4) and final["filled"] == 512  # 4 rollouts of the new regime
    assert final["fisher"] == "cora" and set(final["buffer"]) == {"obs", "action", "advantage", "return"}

    # resume the switch checkpoint (in a copy of the run): the switch is redone, not consolidated again
    shutil.copytree(full, runs / "resumed")
    run_main("agents/ppo.py", "--resume", str(runs / "resumed" / "checkpoints" / switch_ckpt), "--no-progress-bar")
    resumed = _ewc_state(str(runs / "resumed"), "final__step1024.cleanrl_model")
    assert resumed["consolidated"] == 1 and len(resumed["anchors"]) == 1
    for part in (1, 2):  # theta* and F of the anchor: bit-identical to the uninterrupted run's
        for n, t in final["anchors"][0][part].items():
            assert torch.equal(t, resumed["anchors"][0][part][n]), n
    rec = [r for r in read_metrics(os.path.join(runs / "resumed", "metrics.jsonl")) if r["kind"] == "iteration"]
    assert [r["global_step"] for r in rec] == list(range(128, 1025, 128))
    assert [r["losses/ewc_penalty"] for r in rec[:4]] == [penalty[s] for s in range(128, 513, 128)]
    assert all(r["losses/ewc_penalty"] > 0 for r in rec[4:])


@pytest.mark.slow
def test_impala_cartpole_online_ewc(tmp_path):
    cfg = write_config(tmp_path, {**CARTPOLE, "num_envs": 2, "num_actors": 1, "unroll_length": 16, "batch_size": 2,
                                  "modification_factory_kwargs": {**CARTPOLE["modification_factory_kwargs"],
                                                                  "num_total_steps": 2048,
                                                                  "switching_thresholds": [1024]}}, "cfg.json")
    run_script("agents/impala.py", "--config", str(cfg), "--runs_dir", str(tmp_path / "runs"), "--run_name", "r",
               "--ewc", "online", "--ewc_lambda", "100", "--no-progress-bar")
    run_dir = str(tmp_path / "runs" / "r")
    records = [r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "iteration"]
    before = [r["losses/ewc_penalty"] for r in records if r["global_step"] <= 1024]
    after = [r["losses/ewc_penalty"] for r in records if r["global_step"] > 1024 + 64]
    assert before and all(p == 0.0 for p in before) and after and all(p > 0.0 for p in after)
    final = _ewc_state(run_dir, "final__step2048.cleanrl_model")
    assert final["mode"] == "online" and [a[0] for a in final["anchors"]] == ["online"]


# --- CORA's formulas (continual_rl, policies/ewc/ewc_monobeast.py, checkpoint_task), re-written in float64 ----------


def test_online_full_normalisation_keeps_unit_norm_over_three_consolidations_as_cora():
    """CORA: F <- gamma * F_old + F_new, then F /= ||F|| per tensor, so every tensor has norm 1 after every
    consolidation (normalising F_new before the sum would let the norm grow towards 1/(1 - gamma))."""
    regimes = ["a", "b", "c"]
    ewc, exp = _consolidate("online", regimes, normalize="full")
    running = None
    for k in range(1, 4):
        state, _ = _consolidate("online", regimes[:k], normalize="full")  # the same draws, stopped after k switches
        new = {n: f.double() for n, f in exp[k - 1][1].items()}
        running = new if running is None else {n: 0.5 * running[n] + new[n] for n in new}  # gamma = 0.5
        running = {n: f / torch.linalg.vector_norm(f) for n, f in running.items()}
        got = state.anchors["online"][1]
        for n, f in running.items():
            if n.startswith("critic"):  # the true Fisher gives the value head 0: 0/0 stays 0
                assert got[n].abs().sum() == 0
                continue
            assert torch.linalg.vector_norm(got[n].double()).item() == pytest.approx(1.0, abs=1e-6)
            torch.testing.assert_close(got[n].double(), f, rtol=1e-5, atol=1e-8)
    assert ewc.anchors["online"][0] is not None


def _cora_reference(losses, params: list[torch.Tensor], batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """1/M sum_m (d L_m / d theta)^2, L_m = losses(idx_m), in float64 with plain autograd."""
    sums = [torch.zeros_like(p) for p in params]
    for idx in batches:
        for s, g in zip(sums, torch.autograd.grad(losses(idx), params)):
            s += g**2
    return [s / len(batches) for s in sums]


def _drawn_batches(seed: int, count: int, n_rows: int, per_batch: int, batches: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + count)  # the switch's generator, as EWC seeds it
    return [torch.randint(n_rows, (per_batch,), generator=gen) for _ in range(batches)]


def test_cora_fisher_of_a_ppo_net_against_float64():
    """PPO's batch loss (-sum A log pi(a|s) + vf_coef/2 sum (R - V)^2) through the EWC callback: 5 batches of 6
    samples from the last 16 observed; against a float64 copy of the network with the loss written out."""
    args = Args(ewc="ewc")
    torch.manual_seed(0)
    agent = ppo.Agent((4,), 3)
    g = torch.Generator().manual_seed(4)
    data = {"obs": torch.randn(20, 4, generator=g), "action": torch.randint(3, (20,), generator=g),
            "advantage": torch.randn(20, generator=g), "return": torch.randn(20, generator=g)}
    ewc = EWC(agent, ppo.policy_head, False, "ewc", lam=1.0, gamma=1.0, samples=16, seed=7, fisher="cora",
              batch_loss=ppo.ewc_batch_loss(args), fisher_batch=6, fisher_batches=5)
    ewc.attach(types.SimpleNamespace(modification="a"))
    ewc.observe({"obs": data["obs"], "obs_shape": (4,), "rows": data})
    ewc.on_switch_start(SwitchEvent("a", "b", 100, 1))
    fisher = ewc.anchors["a"][1]

    a64 = ppo.Agent((4,), 3).double()
    a64.load_state_dict({k: v.double() for k, v in agent.state_dict().items()})
    kept = {k: v[4:].double() if v.is_floating_point() else v[4:] for k, v in data.items()}  # the ring's 16 rows

    def loss(idx):
        h = a64.network(kept["obs"][idx])
        logp = torch.log_softmax(a64.actor(h), -1).gather(-1, kept["action"][idx].unsqueeze(-1)).squeeze(-1)
        v = a64.critic(h).squeeze(-1)
        return -(kept["advantage"][idx] * logp).sum() + 0.5 * 0.5 * ((v - kept["return"][idx]) ** 2).sum()

    names = [n for n, _ in a64.named_parameters()]
    ref = _cora_reference(loss, list(a64.parameters()), _drawn_batches(7, 1, 16, 6, 5))
    for n, r in zip(names, ref):
        torch.testing.assert_close(fisher[n].double(), r, rtol=1e-5, atol=1e-10)
    assert fisher["critic.weight"].abs().sum() > 0  # the value loss enters, as in CORA


def test_cora_fisher_of_an_impala_net_against_float64():
    """IMPALA's V-trace batch loss on stored unrolls (whole unrolls per batch: fisher_batch 8 / T 4 = 2), against a
    float64 copy with V-trace from its definition (tests/helpers/vtrace_reference.py) and the loss written out."""
    from agents import impala, ppo
    from helpers.vtrace_reference import reference_vtrace

    args = Args(ewc="ewc", architecture="IMPALA")
    T, n_actions = 4, 3
    torch.manual_seed(1)
    agent = ppo.Agent((4,), n_actions)
    g = torch.Generator().manual_seed(5)
    rows = {"obs": torch.randn(5, T + 1, 4, generator=g), "action": torch.randint(n_actions, (5, T), generator=g),
            "logits": torch.randn(5, T, n_actions, generator=g), "reward": torch.randn(5, T, generator=g),
            "done": torch.rand(5, T, generator=g) < 0.2}
    ewc = EWC(agent, ppo.policy_head, False, "ewc", lam=1.0, gamma=1.0, samples=16, seed=2, fisher="cora",
              batch_loss=impala.ewc_batch_loss(args), row_steps=T, fisher_batch=8, fisher_batches=3)
    ewc.attach(types.SimpleNamespace(modification="a"))
    ewc.observe({"obs": rows["obs"][:, :T], "obs_shape": (4,), "rows": rows})
    ewc.on_switch_start(SwitchEvent("a", "b", 100, 1))
    fisher = ewc.anchors["a"][1]

    a64 = ppo.Agent((4,), n_actions).double()
    a64.load_state_dict({k: v.double() for k, v in agent.state_dict().items()})
    kept = {k: v[1:] for k, v in rows.items()}  # capacity 16 // 4 = 4 unrolls: the last 4

    def loss(idx):
        obs = kept["obs"][idx].double()  # [n, T+1, 4]
        h = a64.network(obs.reshape(-1, 4)).view(len(idx), T + 1, -1)
        logp_all, values = torch.log_softmax(a64.actor(h[:, :T]), -1), a64.critic(h).squeeze(-1)
        act = kept["action"][idx]
        logp = logp_all.gather(-1, act.unsqueeze(-1)).squeeze(-1)
        mu = torch.log_softmax(kept["logits"][idx].double(), -1).gather(-1, act.unsqueeze(-1)).squeeze(-1)
        disc = args.gamma * (~kept["done"][idx]).double()
        vs, adv = reference_vtrace(mu.numpy().T, logp.detach().numpy().T, kept["reward"][idx].double().numpy().T,
                                   disc.numpy().T, values[:, :T].detach().numpy().T, values[:, T].detach().numpy(),
                                   args.vtrace_rho_bar, args.vtrace_c_bar)
        vs, adv = torch.as_tensor(vs.T), torch.as_tensor(adv.T)
        return -(logp * adv).sum() + args.vf_coef * 0.5 * ((vs - values[:, :T]) ** 2).sum()

    names = [n for n, _ in a64.named_parameters()]
    ref = _cora_reference(loss, list(a64.parameters()), _drawn_batches(2, 1, 4, 2, 3))
    for n, r in zip(names, ref):
        torch.testing.assert_close(fisher[n].double(), r, rtol=1e-4, atol=1e-10)
    assert fisher["critic.weight"].abs().sum() > 0


def test_true_fisher_of_the_minatar_cnn_against_float64():
    """The agents' pixel input goes channels-last (ppo.Agent.scaled_input); the true Fisher runs on it, and equals a
    float64 copy of the network with one autograd pass per sample."""
    from agents import ppo

    torch.manual_seed(2)
    agent = ppo.Agent((6, 10, 10), 6)
    obs = torch.rand(5, 6, 10, 10, generator=torch.Generator().manual_seed(3))
    fisher = diagonal_fisher(agent, ppo.policy_head, obs, False, torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        actions = torch.multinomial(torch.softmax(ppo.policy_head(agent, obs).double(), -1), 1, generator=gen)
    a64 = ppo.Agent((6, 10, 10), 6).double().to(memory_format=torch.contiguous_format)
    a64.load_state_dict({k: v.double().contiguous() for k, v in agent.state_dict().items()})
    names = [n for n, _ in a64.named_parameters()]
    sums = {n: torch.zeros_like(p) for n, p in a64.named_parameters()}
    for x, a in zip(obs.double(), actions[:, 0]):
        logp = torch.log_softmax(a64.actor(a64.network(x[None])), -1)[0, a]
        for n, g in zip(names, torch.autograd.grad(logp, list(a64.parameters()), allow_unused=True)):
            if g is not None:
                sums[n] += g**2
    for n in names:
        torch.testing.assert_close(fisher[n].double(), sums[n] / len(obs), rtol=1e-4, atol=1e-10)
    assert fisher["network.0.weight"].abs().sum() > 0
