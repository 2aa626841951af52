"""CLEAR (agents/clear.py) against references: the reservoir keeps each of N unrolls with probability capacity/N
(Algorithm R's definition, checked statistically with fixed seeds); every learner batch has exactly the configured
share of replayed unrolls; the cloning losses equal a float64 hand computation; V-trace on a replayed unroll equals
the definition (tests/test_agents_impala_vtrace.py's reference) on the stored numbers; the buffer survives a
checkpoint exactly (same later inserts and samples); the preflight's size estimate is the buffer's size; a CartPole
run resumed from a switch checkpoint keeps the uninterrupted run's schedule and its restored buffer, and eval.py
loads it; bad combinations are one line, exit 2, no run directory."""

from __future__ import annotations

import glob
import itertools
import json
import os
import shutil
import types
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
import torch

import continual_training_example
import eval as eval_script
from agents import clear, impala
from conftest import exit_2, run_main, write_config
from continual.config.args import Args
from continual.training.checkpoint import load_checkpoint, save_checkpoint
from continual.training.session import StateRegistry
from continual.training.startup import replay_buffer_bytes
from continual.training.tracking import read_metrics
from helpers.vtrace_reference import reference_vtrace


def fake_session(run_dir: str, regimes=("", "gravity=15.0"), modification: str = ""):
    registry = StateRegistry()  # the session's: CLEAR registers its buffer
    return types.SimpleNamespace(run_dir=run_dir, modification=modification, registry=registry,
                                 register=registry.register,
                                 regime_index=lambda m: list(regimes).index(m) if m in regimes else -1)


def fake_batch(rng: np.random.Generator, S: int, T: int, n: int, obs_shape=(3,), n_actions: int = 4,
               regime: int = 0) -> dict[str, torch.Tensor]:
    """IMPALA learner slots [S, T(+1), n, ...] as fleet.get_batch returns them."""
    return {"obs": torch.as_tensor(rng.normal(size=(S, T + 1, n, *obs_shape)), dtype=torch.float32),
            "action": torch.as_tensor(rng.integers(0, n_actions, size=(S, T, n))),
            "logits": torch.as_tensor(rng.normal(size=(S, T, n, n_actions)), dtype=torch.float32),
            "reward": torch.as_tensor(rng.normal(size=(S, T, n)), dtype=torch.float32),
            "done": torch.as_tensor(rng.random((S, T, n)) < 0.2),
            "value": torch.as_tensor(rng.normal(size=(S, T, n)), dtype=torch.float32),
            "regime": torch.full((S,), regime, dtype=torch.int64)}


def time_major(batch: dict) -> list[torch.Tensor]:
    """What impala.train hands to extend_batch (its time_major)."""
    def tm(x):
        return x.transpose(0, 1).reshape(x.shape[1], x.shape[0] * x.shape[2], *x.shape[3:])
    return [tm(batch[k]) for k in ("obs", "action", "logits", "reward", "done")]


KEYS = ("obs", "action", "logits", "reward", "done")


def extend(ext: clear.Clear, batch: dict) -> list[torch.Tensor]:
    """impala.train's call: the time-major tensors by name, and the fleet's batch."""
    out = ext.extend_batch(None, dict(zip(KEYS, time_major(batch))), batch)
    return [out[k] for k in KEYS]


def cloning(ext: clear.Clear, logits: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """impala.train's loss call (IMPALA's own loss 0 here) and the scalars it logs."""
    return ext.loss(torch.zeros(()), None, {"logits": logits, "values": values}), ext.scalars()


def make_clear(tmp_path, **overrides) -> clear.Clear:
    args = Args(architecture="CLEAR", backend="Gymnasium", env_id="CartPole-v1", **{
        "num_envs": 4, "num_actors": 2, "unroll_length": 5, "batch_size": 2, "clear_buffer_frames": 200, **overrides})
    space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    return clear.Clear(args, fake_session(str(tmp_path)), None, None, space, 4, torch.device("cpu"))


# --- the reservoir ------------------------------------------------------------------------------------------------


def fill(buf: clear.ReservoirReplay, n_items: int, seed: int, chunks=(7, 1, 5)) -> np.ndarray:
    """Empty `buf`, seed its sampler, insert items 0..n-1 (their id in `regime`) in uneven batches; the ids kept."""
    buf.seen, buf.rng = 0, np.random.default_rng(seed)
    capacity = buf.capacity
    i = 0
    for size in itertools.cycle(chunks):
        if i >= n_items:
            break
        ids = np.arange(i, min(i + size, n_items))
        buf.insert({"obs": ids[:, None, None].repeat(2, 1).astype(np.float32),
                    "action": np.zeros((len(ids), 1), np.int64), "logits": np.zeros((len(ids), 1, 2), np.float32),
                    "reward": np.zeros((len(ids), 1), np.float32), "done": np.zeros((len(ids), 1), bool),
                    "value": np.zeros((len(ids), 1), np.float32), "regime": ids})
        i += len(ids)
    assert buf.seen == n_items and len(buf) == min(n_items, capacity)
    kept = np.asarray(buf.data["regime"][:len(buf)])
    assert np.array_equal(np.asarray(buf.data["obs"][:len(buf), 0, 0]), kept)  # every field of an item moves together
    return kept


def test_reservoir_keeps_each_item_with_probability_capacity_over_n(tmp_path):
    """Algorithm R's guarantee, measured: over 1500 seeded runs with N = 30 items and capacity 6, each item is kept in
    a share of runs within 4.5 standard errors of 6/30, every pair within tolerance of 6*5/(30*29), no duplicates;
    below capacity, everything is kept in arrival order."""
    N, c, trials = 30, 6, 1500
    buf = clear.ReservoirReplay(str(tmp_path), c, 1, (1,), np.float32, 2, seed=0)
    counts, pairs = np.zeros(N), np.zeros((N, N))
    for seed in range(trials):
        kept = fill(buf, N, seed)
        assert len(set(kept.tolist())) == c
        counts[kept] += 1
        pairs[np.ix_(kept, kept)] += 1
    p = c / N
    z = (counts / trials - p) / np.sqrt(p * (1 - p) / trials)
    assert np.abs(z).max() < 4.5, (counts / trials).round(3)
    assert abs(z.mean()) < 1e-9  # exactly c kept per run
    p2 = c * (c - 1) / (N * (N - 1))
    off = pairs[~np.eye(N, dtype=bool)] / trials
    assert abs(off.mean() - p2) < 1e-9 and np.abs(off - p2).max() < 4.5 * np.sqrt(p2 * (1 - p2) / trials) + 1e-3
    # late items are not favoured nor starved: first and last thirds kept alike
    assert abs(counts[:10].mean() - counts[-10:].mean()) / trials < 0.03
    assert fill(buf, 5, 0).tolist() == [0, 1, 2, 3, 4]


# --- the batch ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction,batch_size,num_envs,num_actors", [
    (0.5, 2, 4, 2), (0.2, 2, 4, 2), (0.75, 1, 2, 2), (0.0, 2, 4, 2), (2 / 3, 3, 2, 1)])
def test_replay_share_in_a_learner_batch_equals_the_mix(tmp_path, fraction, batch_size, num_envs, num_actors):
    """Every update: B new columns, then R = B f/(1-f) replayed ones, R/(B+R) == f; the new columns are untouched; the
    replayed ones are stored unrolls (the first update, with nothing committed, repeats its own new unrolls)."""
    ext = make_clear(tmp_path, clear_replay_fraction=fraction, batch_size=batch_size, num_envs=num_envs,
                     num_actors=num_actors)
    rng = np.random.default_rng(0)
    n = num_envs // num_actors
    B, T = batch_size * n, 5
    stored: list[np.ndarray] = []
    for update in range(6):
        batch = fake_batch(rng, batch_size, T, n)
        new = time_major(batch)
        out = extend(ext, batch)
        R = out[0].shape[1] - B
        assert Fraction(R, B + R) == Fraction(fraction).limit_denominator(100)
        for x, y in zip(new, out):
            assert torch.equal(y[:, :B], x) and y.dtype == x.dtype and y.shape[0] == x.shape[0]
        pool = stored if update else [new[0][:, j].numpy() for j in range(B)]
        for j in range(B, B + R):  # a replayed column is one of the unrolls stored (or, first, of this batch)
            assert any(np.array_equal(out[0][:, j].numpy(), s) for s in pool)
        loss, logs = cloning(ext, torch.zeros(T, B + R, 4), torch.zeros(T + 1, B + R))
        if R:
            assert logs["charts/replay_fraction"] == pytest.approx(fraction)
        ext.after_update({})
        stored += [new[0][:, j].numpy() for j in range(B)]
    assert ext.buffer.seen == 6 * B


def test_cloning_losses_match_a_float64_hand_computation(tmp_path):
    """Policy cloning = sum over replayed steps of sum_a p_stored(a) (log p_stored(a) - log p_current(a)); value
    cloning = sum of (V_current - V_stored)^2; the loss is 0.01 KL + 0.005 L2 (CORA's weights, the defaults)."""
    ext = make_clear(tmp_path)
    rng = np.random.default_rng(3)
    T, B = 5, 4
    for _ in range(2):  # one committed update, so the second one replays from the buffer
        batch = fake_batch(rng, 2, T, 2)
        out = extend(ext, batch)
        ext.after_update({})
    R = out[0].shape[1] - B
    assert R == 4
    current_logits = torch.as_tensor(rng.normal(scale=2.0, size=(T, B + R, 4)), dtype=torch.float32)
    current_values = torch.as_tensor(rng.normal(size=(T + 1, B + R)), dtype=torch.float32)
    loss, logs = cloning(ext, current_logits, current_values)

    stored_logits = out[2][:, B:].double().numpy()  # the behaviour logits of the replayed columns
    stored_values = ext.replayed["value"].double().numpy()
    cur = current_logits[:, B:].double().numpy()
    kl = l2 = 0.0
    for t in range(T):
        for r in range(R):
            ps = np.exp(stored_logits[t, r] - stored_logits[t, r].max())
            ps /= ps.sum()
            pc = np.exp(cur[t, r] - cur[t, r].max())
            pc /= pc.sum()
            kl += sum(ps[a] * (np.log(ps[a]) - np.log(pc[a])) for a in range(4))
            l2 += (float(current_values[t, B + r]) - stored_values[t, r]) ** 2
    assert float(loss) == pytest.approx(0.01 * kl + 0.005 * l2, rel=1e-5)
    assert logs["losses/policy_cloning"] == pytest.approx(kl / (T * R), rel=1e-5)
    assert logs["losses/value_cloning"] == pytest.approx(l2 / (T * R), rel=1e-5)
    # the stored values are the actors' behaviour values of those unrolls (not the learner's)
    stored = ext.buffer.data
    for r in range(R):
        k = [i for i in range(len(ext.buffer)) if np.array_equal(stored["logits"][i], stored_logits[:, r])]
        assert k and np.allclose(stored["value"][k[0]], stored_values[:, r])
    # no gradient reaches the stored targets, only the current outputs
    a = current_logits.clone().requires_grad_()
    cloning(ext, a, current_values)[0].backward()
    assert a.grad[:, :B].abs().sum() == 0 and a.grad[:, B:].abs().sum() > 0


def test_vtrace_on_a_replayed_unroll_equals_the_definition(tmp_path):
    """The learner's V-trace (impala.vtrace on the extended batch, as impala.train computes it) on each replayed
    column equals the definition applied in float64 to that unroll's stored numbers: its stored behaviour logits,
    actions, rewards and dones, with the current policy and values."""
    ext = make_clear(tmp_path)
    rng = np.random.default_rng(5)
    T, B, A, gamma = 5, 4, 4, 0.97
    for i in range(3):
        batch = fake_batch(rng, 2, T, 2, regime=i)
        obs, actions, behaviour_logits, rewards, dones = extend(ext, batch)
        ext.after_update({})
    R = obs.shape[1] - B
    logits = torch.as_tensor(rng.normal(size=(T, B + R, A)), dtype=torch.float32)
    values = torch.as_tensor(rng.normal(size=(T + 1, B + R)), dtype=torch.float32)
    # impala.train, verbatim
    logp = torch.log_softmax(logits, -1)
    action_logp = logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    behaviour_logp = torch.log_softmax(behaviour_logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    discounts = gamma * (~dones).float()
    vt = impala.vtrace(behaviour_logp, action_logp, rewards, discounts, values[:T], values[T])

    data = ext.buffer.data
    for r in range(R):  # find the stored unroll behind column B + r by its observations
        k = next(i for i in range(len(ext.buffer)) if np.array_equal(data["obs"][i], obs[:, B + r].numpy()))
        a = data["action"][k]

        def lp(z):
            z = z.astype(np.float64)
            z = z - z.max(-1, keepdims=True)
            return (z - np.log(np.exp(z).sum(-1, keepdims=True)))[np.arange(T), a]

        ref_vs, ref_pg = reference_vtrace(lp(data["logits"][k])[:, None], lp(logits[:, B + r].numpy())[:, None],
                                          data["reward"][k].astype(np.float64)[:, None],
                                          gamma * (~data["done"][k]).astype(np.float64)[:, None],
                                          values[:T, B + r].double().numpy()[:, None],
                                          values[T, B + r:B + r + 1].double().numpy(), 1.0, 1.0)
        np.testing.assert_allclose(vt.vs[:, B + r].double().numpy(), ref_vs[:, 0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(vt.pg_advantages[:, B + r].double().numpy(), ref_pg[:, 0], rtol=1e-4, atol=1e-4)


# --- checkpoints and sizes ----------------------------------------------------------------------------------------


def test_buffer_round_trips_a_checkpoint_exactly(tmp_path):
    """After replacements have begun (seen > capacity): state_dict -> checkpoint file -> a fresh buffer; both then
    make the same inserts and draw the same samples."""
    rng = np.random.default_rng(1)
    a = make_clear(tmp_path / "a", clear_buffer_frames=60)  # 12 unrolls
    for _ in range(5):
        batch = fake_batch(rng, 2, 5, 2)
        extend(a, batch)
        a.after_update({})
    assert a.buffer.seen == 20 > a.buffer.capacity == 12
    path = save_checkpoint(str(tmp_path / "ck" / "x.cleanrl_model"), {
        "architecture": "CLEAR", "args": {}, "model": {}, "global_step": 0, a.state_key: a.state_dict()})
    b = make_clear(tmp_path / "b", clear_buffer_frames=60)
    b.buffer.load_state_dict(load_checkpoint(path)["clear"])
    for _ in range(4):
        batch = fake_batch(rng, 2, 5, 2)
        outs = [extend(ext, batch) for ext in (a, b)]
        for x, y in zip(*outs):
            assert torch.equal(x, y)
        a.after_update({})
        b.after_update({})
    for k in a.buffer.data:
        assert np.array_equal(a.buffer.data[k], b.buffer.data[k]), k
    assert a.buffer.rng.bit_generator.state == b.buffer.rng.bit_generator.state


@pytest.mark.parametrize("backend,env_id", [("Gymnasium", "CartPole-v1"), ("MinAtar", "MinAtar/Breakout")])
def test_preflight_size_estimate_is_the_buffers_size(tmp_path, backend, env_id):
    args = Args(architecture="CLEAR", backend=backend, env_id=env_id, unroll_length=7, clear_buffer_frames=700)
    env = impala.make_env(impala.EnvSettings.from_args(args), 0, "")()
    space, n = env.observation_space, int(env.action_space.n)
    env.close()
    buf = clear.ReservoirReplay(str(tmp_path), 100, 7, space.shape, np.uint8 if space.dtype == np.uint8 else
                                np.float32, n, seed=0)
    assert replay_buffer_bytes(args, [""]) == buf.nbytes() == sum(
        os.path.getsize(f) - 128 for f in glob.glob(os.path.join(tmp_path, "*.npy")))  # .npy header: 128 bytes


# --- end to end ---------------------------------------------------------------------------------------------------

SWITCHING = {"env_id": "CartPole-v1", "backend": "Gymnasium", "num_envs": 4, "num_actors": 2, "unroll_length": 20,
             "batch_size": 2, "reward_scaling": "none", "modification_factory": "SequentialModificationFactory",
             "modification_factory_kwargs": {"num_total_steps": 1600, "modifications": ["", "gravity=15.0"],
                                             "switching_thresholds": [800]}}  # 80 steps (4 new unrolls) per update


def test_resume_from_a_switch_checkpoint_keeps_the_schedule_and_the_buffer(tmp_path):
    """An uninterrupted run and one resumed from its switch checkpoint (step 800): the same iteration and switch
    records, replay share 0.5 in every update, the same number of unrolls seen and the same sampler state at the end;
    the resumed run's buffer starts with the checkpoint's unrolls (restored, not re-collected); eval.py loads it."""
    cfg = write_config(tmp_path, SWITCHING, "cfg.json")
    runs = str(tmp_path / "runs")
    full = os.path.join(runs, "full")
    run_main("continual_training_example.py", "--architecture", "CLEAR", "--config", str(cfg), "--runs_dir", runs,
             "--run_name", "full", "--save_agent_with_switch", "--checkpoint_minutes", "0", "--no-progress-bar")
    switch = glob.glob(os.path.join(full, "checkpoints", "switch__*step800.cleanrl_model"))
    assert len(switch) == 1
    cut = os.path.join(runs, "cut")
    shutil.copytree(full, cut)
    for f in glob.glob(os.path.join(cut, "checkpoints", "*")):
        if "step800" not in f:
            os.unlink(f)
    run_main("continual_training_example.py", "--resume", os.path.join(cut, "checkpoints",
                                                                     os.path.basename(switch[0])), "--no-progress-bar")

    def schedule(run):
        recs = read_metrics(os.path.join(run, "metrics.jsonl"))
        return ([(r["global_step"], r["modification"]) for r in recs if r["kind"] in ("iteration", "switch")],
                [r["charts/replay_fraction"] for r in recs if r["kind"] == "iteration"])

    (s_full, f_full), (s_cut, f_cut) = schedule(full), schedule(cut)
    assert s_full == s_cut and [s for s, m in s_full if m == "gravity=15.0"][0] == 800
    assert len(f_full) == len(f_cut) == 20 and set(f_full) == set(f_cut) == {0.5}
    mid = load_checkpoint(switch[0])["clear"]
    ends = [load_checkpoint(os.path.join(r, "checkpoints", "final__step1600.cleanrl_model"))["clear"]
            for r in (full, cut)]
    assert mid["seen"] == 10 * 4 and ends[0]["seen"] == ends[1]["seen"] == 20 * 4  # 4 single-env unrolls per update
    assert ends[0]["rng"] == ends[1]["rng"]
    for end in ends:  # capacity 5000 unrolls: nothing replaced, so the first 40 are the checkpoint's
        for k, v in mid["data"].items():
            assert torch.equal(end["data"][k][:40], v), k
    assert set(mid["data"]["regime"].tolist()) == {0} and set(ends[1]["data"]["regime"][40:].tolist()) <= {0, 1}
    rows = eval_script.main(["--agent_path", cut, "--eval_episodes", "2", "--output", str(tmp_path / "ev"),
                             "--no-progress-bar"])
    assert rows[0]["episodes"] == 2 and json.load(open(str(tmp_path / "ev") + ".json"))["architecture"] == "CLEAR"


@pytest.mark.parametrize("flags,field", [
    (["--clear_buffer_frames", str(10 ** 14)], "clear_buffer_frames"),  # petabytes: more than any disk here
    (["--clear_replay_fraction", "1.0"], "clear_replay_fraction"),
    (["--clear_replay_fraction", "0.3"], "clear_replay_fraction"),  # 16 * 0.3 / 0.7 replayed unrolls: not whole
    (["--clear_policy_cloning", "-1"], "clear_policy_cloning"),
    (["--clear_buffer_frames", "10"], "clear_buffer_frames"),  # less than one unroll
])
def test_bad_clear_combinations_are_one_line_exit_2_and_no_run_dir(tmp_path, capsys, flags, field):
    runs = tmp_path / "runs"
    stdout, stderr = exit_2(continual_training_example.main, ["--architecture", "CLEAR", "--backend", "Gymnasium",
                            "--env_id", "CartPole-v1", "--runs_dir", str(runs), *flags], capsys)
    out = (stdout + stderr).strip().splitlines()
    assert len(out) <= 3 and stderr.strip().splitlines()[-1].startswith(f"error: {field}:"), out
    assert not runs.exists()
