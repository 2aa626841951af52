"""agents/dqn.py: TD and Double-DQN targets against hand computation and a float64 reference, the epsilon schedule,
the one-frame-per-transition replay buffer (episode ends, switch cuts and wrap-around never mix frames of two
episodes; nothing still in the rings is lost), exact resume from a switch checkpoint, eval.py and continual
evaluation on a DQN run, flag validation, and (slow) learning CartPole."""

from __future__ import annotations

import csv
import glob
import json
import os
import shutil

import numpy as np
import pytest
import torch

import continual_training_example
import eval as eval_script
from agents import dqn
from conftest import ROOT, run_script, write_config
from continual.errors import TrainingError
from continual.training.tracking import read_metrics
from helpers import corridor_envs  # noqa: F401  (registers Corridor-v0)


# --- TD targets --------------------------------------------------------------------------------------------------
def test_td_target_by_hand():
    rewards = torch.tensor([1.0, 0.5, -1.0])
    terminated = torch.tensor([False, True, False])
    next_q_target = torch.tensor([[1.0, 3.0], [2.0, 0.0], [5.0, 4.0]])
    next_q_online = torch.tensor([[4.0, 1.0], [0.0, 2.0], [1.0, 6.0]])
    # DQN: r + 0.9 * max_a Q_target(s', a), nothing after a termination
    assert dqn.td_target(rewards, terminated, 0.9, next_q_target).tolist() == pytest.approx([3.7, 0.5, 3.5])
    # Double DQN: a* = argmax Q_online = (0, 1, 1), valued by the target net: (1, 0, 4)
    assert dqn.td_target(rewards, terminated, 0.9, next_q_target, next_q_online).tolist() == \
        pytest.approx([1.9, 0.5, 2.6])


def test_td_targets_match_a_float64_loop():
    g = torch.Generator().manual_seed(0)
    r, qt, qo = torch.randn(64, generator=g), torch.randn(64, 5, generator=g), torch.randn(64, 5, generator=g)
    term = torch.rand(64, generator=g) < 0.3
    for double in (False, True):
        got = dqn.td_target(r, term, 0.97, qt, qo if double else None)
        for i in range(64):
            a = int(np.argmax(qo[i].double().numpy())) if double else int(np.argmax(qt[i].double().numpy()))
            ref = float(r[i]) + (0.0 if term[i] else 0.97 * float(qt[i, a]))
            assert float(got[i]) == pytest.approx(ref, abs=1e-6)


def test_epsilon_schedule_is_cleanrls():
    assert [dqn.linear_schedule(1.0, 0.01, 100, t) for t in (0, 50, 100, 200)] == pytest.approx([1, 0.505, 0.01, 0.01])
    assert dqn.linear_schedule(1.0, 0.05, 0, 0) == 0.05


def test_eval_policy_is_epsilon_greedy_around_the_argmax():
    net = dqn.QNetwork((8,), 4)
    x = torch.randn(16, 8)
    probs = net.actor(net.features(x)).exp()
    greedy = net(x).argmax(1)
    assert torch.allclose(probs.sum(1), torch.ones(16))
    expected = torch.full((16, 4), 0.05 / 4)
    expected[torch.arange(16), greedy] += 0.95
    assert torch.allclose(probs, expected)
    assert torch.equal(net.get_action_and_value(x, greedy=True)[0], greedy)


# --- replay buffer -------------------------------------------------------------------------------------------------
K = 4


class StackedEpisodes:
    """Envs whose frames say which env, episode and step they belong to: frame (2, 2) uint8 = (env, episode % 256,
    step % 256, pad marker). Episodes end by termination or truncation at random lengths (1 included), and
    `cut()` starts new episodes in every env as a switch does."""

    def __init__(self, num_envs: int, rng: np.random.Generator):
        self.num_envs, self.rng = num_envs, rng
        self.episode = np.zeros(num_envs, np.int64)
        self.t = np.zeros(num_envs, np.int64)
        self.length = rng.integers(1, 12, num_envs)
        self.obs = np.stack([self._first(e) for e in range(num_envs)])

    def _frame(self, e: int, t: int, pad: int = 0) -> np.ndarray:
        return np.array([[e, self.episode[e] % 256], [t % 256, pad]], np.uint8)

    def _first(self, e: int) -> np.ndarray:  # the initial stack: distinct padding frames, then the first frame
        return np.stack([self._frame(e, 0, pad=K - 1 - j) for j in range(K)])

    def _restart(self, e: int) -> None:
        self.episode[e] += 1
        self.t[e] = 0
        self.length[e] = self.rng.integers(1, 12)

    def cut(self) -> np.ndarray:
        for e in range(self.num_envs):
            self._restart(e)
        self.obs = np.stack([self._first(e) for e in range(self.num_envs)])
        return self.obs

    def step(self):
        next_real, terminated, done = [], np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        for e in range(self.num_envs):
            self.t[e] += 1
            next_real.append(np.concatenate([self.obs[e][1:], self._frame(e, self.t[e])[None]]))
            if self.t[e] >= self.length[e]:
                done[e] = True
                terminated[e] = self.rng.random() < 0.5  # else a truncation
        next_real = np.stack(next_real)
        new_obs = next_real.copy()
        for e in np.flatnonzero(done):
            self._restart(e)
            new_obs[e] = self._first(e)
        self.obs = new_obs
        return next_real, terminated, done


def _fill(rb: dqn.ReplayBuffer, envs: StackedEpisodes, steps: int, rng, truth: dict, abs_slot: dict,
          cut_every: int = 0) -> None:
    """Step the envs into the buffer; truth[action id] = (env, obs, next_obs, reward, terminated)."""
    obs = envs.obs
    for i in range(steps):
        if cut_every and i % cut_every == cut_every - 1:
            obs = envs.cut()
            rb.begin(range(envs.num_envs))
        next_real, terminated, done = envs.step()
        ids = len(truth) + np.arange(envs.num_envs)
        rewards = rng.normal(size=envs.num_envs).astype(np.float32)
        for e in range(envs.num_envs):
            truth[int(ids[e])] = (e, obs[e].copy(), next_real[e].copy(), rewards[e], terminated[e])
        rb.add(obs, next_real, ids, rewards, terminated)
        for e in range(envs.num_envs):
            abs_slot[int(ids[e])] = int(rb.pos[e]) - 1
        rb.begin(np.flatnonzero(done))
        obs = envs.obs


@pytest.mark.parametrize("seed", range(4))
def test_replay_never_mixes_episodes_across_ends_cuts_and_wraparound(seed):
    rng = np.random.default_rng(seed)
    num_envs, per_env = 3, 37  # small rings: the buffer wraps around every ~30 steps
    rb = dqn.ReplayBuffer(num_envs * per_env, num_envs, (K, 2, 2), np.uint8)
    envs = StackedEpisodes(num_envs, rng)
    truth: dict = {}
    abs_slot: dict = {}
    for round_ in range(12):
        _fill(rb, envs, int(rng.integers(5, 40)), rng, truth, abs_slot, cut_every=int(rng.integers(0, 9)))
        # every stored transition is exactly the one that was added, frames from its own episode only
        e_idx, slots = rb.sample_indices(256, rng)
        obs, actions, rewards, terminated, next_obs = rb.gather(e_idx, slots)
        for j in range(len(actions)):
            e, o, n, r, t = truth[int(actions[j])]
            assert e == e_idx[j]
            np.testing.assert_array_equal(obs[j], o)
            np.testing.assert_array_equal(next_obs[j], n)
            assert rewards[j] == r and terminated[j] == t
            assert len({(f[0, 0], f[0, 1]) for f in np.concatenate([obs[j], next_obs[j]])}) == 1  # one episode
        # nothing whose frames are still in the rings is lost: valid = the transitions whose window [slot-K, slot]
        # is not overwritten yet
        expected = {a for a, s in abs_slot.items() if s - K >= rb.pos[truth[a][0]] - per_env}
        stored = {int(rb.actions[e, s]) for e, s in zip(*np.nonzero(rb.valid))}
        assert stored == expected, round_
        assert len(rb) == len(expected)


def test_replay_clear_and_refill_samples_only_new_transitions():
    rng = np.random.default_rng(5)
    rb = dqn.ReplayBuffer(2 * 50, 2, (K, 2, 2), np.uint8)
    envs = StackedEpisodes(2, rng)
    truth, abs_slot = {}, {}
    _fill(rb, envs, 60, rng, truth, abs_slot)
    first = len(truth)
    rb.clear()
    assert len(rb) == 0 and rb.added == 0
    _fill(rb, envs, 1, rng, truth, abs_slot)  # one step: 2 valid transitions among 100 slots (the fallback path)
    _, actions, *_ = rb.gather(*rb.sample_indices(64, rng))
    assert set(actions.tolist()) == {first, first + 1}


def test_vector_observations_and_state_dict_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    rb = dqn.ReplayBuffer(40, 2, (3,), np.float32)
    assert rb.k == 1
    obs = rng.normal(size=(2, 3)).astype(np.float32)
    rb.begin([0, 1])
    for i in range(30):
        nxt = rng.normal(size=(2, 3)).astype(np.float32)
        rb.add(obs, nxt, np.array([2 * i, 2 * i + 1]), np.ones(2, np.float32), np.zeros(2, bool))
        obs = nxt
    torch.save(rb.state_dict(), tmp_path / "rb.pt")
    other = dqn.ReplayBuffer(40, 2, (3,), np.float32)
    other.load_state_dict(torch.load(tmp_path / "rb.pt", weights_only=True))
    draw = rb.sample_indices(32, np.random.default_rng(3))
    assert all(np.array_equal(a, b) for a, b in zip(rb.gather(*draw), other.gather(*draw)))
    assert np.array_equal(draw[0], other.sample_indices(32, np.random.default_rng(3))[0])


def test_binary_storage_reads_back_the_float_observations_of_a_float_buffer(tmp_path):
    # MinAtar's grids (0/1 floats, zero padding): stored as bools, gathered as the very floats a float buffer gives
    rng = np.random.default_rng(4)
    shape = (10, 10, 10)
    ref, rb = (dqn.ReplayBuffer(60, 2, shape, np.float32, binary=b) for b in (False, True))
    assert rb.bytes_per_transition() == 1000 + 4 + 4 + 2 and ref.bytes_per_transition() == 4000 + 4 + 4 + 2
    obs = (rng.random((2,) + shape) < 0.3).astype(np.float32)
    for b in (ref, rb):
        b.begin([0, 1])
    for i in range(70):  # past the wrap-around
        nxt, rewards = (rng.random((2,) + shape) < 0.3).astype(np.float32), rng.normal(size=2).astype(np.float32)
        for b in (ref, rb):
            b.add(obs, nxt, np.array([i, i + 1]), rewards, np.zeros(2, bool))
        obs = nxt
    draw = rb.sample_indices(32, np.random.default_rng(5))
    for a, b in zip(ref.gather(*draw), rb.gather(*draw)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert rb.gather_obs(*draw).dtype == np.float32 and np.array_equal(rb.gather_obs(*draw), ref.gather_obs(*draw))
    torch.save(rb.state_dict(), tmp_path / "rb.pt")
    assert os.path.getsize(tmp_path / "rb.pt") < 60 * 1000 + 20_000
    back = dqn.ReplayBuffer(60, 2, shape, np.float32, binary=True)
    back.load_state_dict(torch.load(tmp_path / "rb.pt", weights_only=True))
    assert all(np.array_equal(a, b) for a, b in zip(rb.gather(*draw), back.gather(*draw)))
    # a checkpoint of float frames (written before bool storage) loads into bools when it is 0/1, else is refused
    torch.save(ref.state_dict(), tmp_path / "float.pt")
    back.load_state_dict(torch.load(tmp_path / "float.pt", weights_only=True))
    assert all(np.array_equal(a, b) for a, b in zip(ref.gather(*draw), back.gather(*draw)))
    state = ref.state_dict()
    state["frames"] = state["frames"] * 0.5
    with pytest.raises(TrainingError, match="not 0/1"):
        back.load_state_dict(state)
    rb.begin([0])
    with pytest.raises(TrainingError, match="not 0/1"):
        rb.add(obs * 0.5, obs, np.zeros(2), np.zeros(2), np.zeros(2, bool))


def test_atari_bytes_per_transition_and_non_stacks_are_refused():
    rb = dqn.ReplayBuffer(2000, 1, (4, 84, 84), np.uint8)
    assert rb.bytes_per_transition() == 84 * 84 + 4 + 4 + 2 == 7066
    assert rb.frames.nbytes == 2000 * 84 * 84  # one frame per slot, not a 4-frame stack
    obs = np.zeros((1, 4, 84, 84), np.uint8)
    rb.begin([0])
    rb.add(obs, obs + 1, np.zeros(1), np.zeros(1), np.zeros(1, bool))  # the first add writes the whole stack
    with pytest.raises(TrainingError, match="not frame stacks"):
        rb.add(obs + 1, obs + 2, np.zeros(1), np.zeros(1), np.zeros(1, bool))


@pytest.mark.parametrize("channels", [4, 6, 10])  # Breakout, SpaceInvaders, Seaquest
def test_minatar_grids_get_the_minatar_papers_network(channels):
    # the Nature CNN's 8x8/4 convolution leaves 1x1 of a 10x10 grid and its next 4x4 convolution raised; MinAtar's
    # examples/dqn.py: conv 16 3x3 stride 1 -> ReLU -> 128 units -> ReLU -> one output per action
    torch.manual_seed(0)
    net = dqn.QNetwork((channels, 10, 10), 6)
    shapes = [tuple(p.shape) for p in net.parameters()]
    assert shapes == [(16, channels, 3, 3), (16,), (128, 16 * 8 * 8), (128,), (6, 128), (6,)]
    x = (torch.rand(5, channels, 10, 10) < 0.2).float()
    conv, fc, head = (m for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))
    ref = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double()).relu()
    ref = (ref.reshape(5, -1) @ fc.weight.double().T + fc.bias.double()).relu()
    ref = ref @ head.weight.double().T + head.bias.double()
    torch.testing.assert_close(net(x).double(), ref, rtol=1e-5, atol=1e-6)


def test_dqn_trains_on_minatar(tmp_path):
    run = _train(tmp_path, "--backend", "MinAtar", "--env_id", "MinAtar/Breakout", "--num_envs", "2",
                 "--num_steps", "32", "--total_timesteps", "512", "--learning_starts", "128", "--buffer_size", "1000",
                 "--modifs", "", data={})
    recs = read_metrics(os.path.join(run, "metrics.jsonl"))
    assert any(r["kind"] == "episode" for r in recs)
    assert [r for r in recs if r["kind"] == "iteration"][-1]["charts/updates"] > 0


# --- runs ---------------------------------------------------------------------------------------------------------
CORRIDOR = {
    "env_id": "helpers.corridor_envs:Corridor-v0", "backend": "Gymnasium", "num_envs": 2, "num_steps": 16,
    "reward_scaling": "none", "learning_starts": 64, "buffer_size": 300, "train_frequency": 2,
    "target_network_frequency": 64, "replay_batch_size": 16, "exploration_fraction": 0.5, "learning_rate": 1e-3,
    "modification_factory": "SequentialModificationFactory",
    "modification_factory_kwargs": {"num_total_steps": 1536, "modifications": ["", "goal=3", "goal=6"],
                                    "switching_thresholds": [512, 1024]},
}


def _train(tmp_path, *flags: str, data: dict = CORRIDOR, name: str = "full") -> str:
    cfg = write_config(tmp_path, data, f"{name}.json")
    runs = str(tmp_path / "runs")
    dqn.main(["--config", str(cfg), "--runs_dir", runs, "--run_name", name, "--no-progress-bar",
              "--checkpoint_minutes", "0", "--no-metrics", *flags])
    return os.path.join(runs, name)


def _load(path: str) -> dict:
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("flags", [("--double_dqn",), ("--reset_replay_on_switch", "--epsilon_rewarm_on_switch",
                                                        "--shrink_and_perturb"),
                                   # plasticity methods: their state (counts, theta_0, norms) is in the checkpoint
                                   ("--redo", "--redo_every", "256", "--redo_tau", "0.5", "--l2_init", "--nap",
                                    "--reset_layers", "1"),
                                   ("--plasticity_injection", "at_switches", "--redo", "--redo_every", "256",
                                    "--redo_tau", "0.5"),
                                   # C-CHAIN: its reference network, coefficient and records; random steps per regime
                                   ("--double_dqn", "--c_chain", "--learning_starts_each_regime")])
def test_resume_from_a_switch_checkpoint_equals_the_uninterrupted_run(tmp_path, flags):
    full = _train(tmp_path, "--save_agent_with_switch", "--save_replay_buffer", *flags)
    switch = glob.glob(os.path.join(full, "checkpoints", "switch__goal-3__step1024.cleanrl_model")) or \
        glob.glob(os.path.join(full, "checkpoints", "switch__*step1024.cleanrl_model"))
    assert len(switch) == 1, os.listdir(os.path.join(full, "checkpoints"))
    cut = str(tmp_path / "runs" / "cut")
    shutil.copytree(full, cut)
    for f in glob.glob(os.path.join(cut, "checkpoints", "*")):
        if "step1024" not in f:
            os.unlink(f)
    dqn.main(["--resume", os.path.join(cut, "checkpoints", os.path.basename(switch[0])), "--no-progress-bar"])
    a, b = _load(os.path.join(full, "checkpoints", "final__step1536.cleanrl_model")), \
        _load(os.path.join(cut, "checkpoints", "final__step1536.cleanrl_model"))
    for key in ("model", "target_model"):
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), (key, name)
    for name in ("frames", "actions", "rewards", "terminated", "valid", "pos"):
        assert torch.equal(a["replay"][name], b["replay"][name]), name
    assert a["explore_from"] == b["explore_from"] == (1024 if "--epsilon_rewarm_on_switch" in flags else 0)
    assert a["regime_start"] == b["regime_start"] == 1024
    if "--c_chain" in flags:
        assert a["c_chain"]["updates"] == b["c_chain"]["updates"] > 500
        for name in a["c_chain"]["ref"]:
            assert torch.equal(a["c_chain"]["ref"][name], b["c_chain"]["ref"][name]), name
        assert torch.equal(a["c_chain"]["coefficient"]["main"]["buf"], b["c_chain"]["coefficient"]["main"]["buf"])
    assert a["rng"]["numpy"] == b["rng"]["numpy"]
    ep = [[(r["global_step"], r["return"]) for r in read_metrics(os.path.join(d, "metrics.jsonl"))
           if r["kind"] == "episode" and r["global_step"] > 1024] for d in (full, cut)]
    assert ep[0] == ep[1] and len(ep[0]) > 10
    it = [[(r["global_step"], r["losses/td_loss"]) for r in read_metrics(os.path.join(d, "metrics.jsonl"))
           if r["kind"] == "iteration" and r["global_step"] > 1024] for d in (full, cut)]
    assert it[0] == it[1]
    if "--redo" in flags:  # the methods acted: ReDo every 256 steps once training started, the heads reset at the switch
        switches = sum(r["kind"] == "switch" for r in read_metrics(os.path.join(full, "metrics.jsonl")))
        if "--reset_layers" in flags:
            assert a["plasticity_methods"]["redo_count"] >= 3 and a["plasticity_methods"]["reset_count"] == switches >= 1
            assert a["model"]["network.2.weight"].dim() == 1  # NaP's LayerNorm after the first hidden layer
        else:  # injected at every switch, the target network alike
            assert a["plasticity_methods"]["inject_count"] == switches >= 1
            assert "q_head." + "old." * (switches - 1) + "new.weight" in a["target_model"]


def test_reset_replay_on_switch_pauses_training_until_learning_starts(tmp_path):
    run = _train(tmp_path, "--reset_replay_on_switch", data={**CORRIDOR, "learning_starts": 128})
    rows = [r for r in read_metrics(os.path.join(run, "metrics.jsonl")) if r["kind"] == "iteration"]
    updates = {r["global_step"]: r["charts/updates"] for r in rows}
    # 32 agent steps per iteration; a fresh buffer trains once more than 128 transitions are stored
    for start in (0, 512, 1024):
        assert [updates[start + 32 * i] for i in range(1, 6)] == [0, 0, 0, 0, 16], start
    assert _load(glob.glob(os.path.join(run, "checkpoints", "final__*"))[0])["replay"] is None


def test_learning_starts_each_regime_acts_randomly_and_waits_in_every_regime(tmp_path):
    """--learning_starts_each_regime (C-CHAIN's 10k random steps per task): no update in the first learning_starts
    steps of every regime (the buffer is kept), epsilon 1 until the first phase ends and decaying from there."""
    run = _train(tmp_path, "--learning_starts_each_regime", data={**CORRIDOR, "learning_starts": 96})
    rows = [r for r in read_metrics(os.path.join(run, "metrics.jsonl")) if r["kind"] == "iteration"]
    updates = {r["global_step"]: r["charts/updates"] for r in rows}
    # 32 agent steps per iteration, one update per 2 steps: 96 steps without updates after each switch
    for start in (0, 512, 1024):
        assert [updates[start + 32 * i] for i in range(1, 6)] == [0, 0, 0, 16, 16], start
    eps = {r["global_step"]: r["charts/epsilon"] for r in rows}
    # epsilon of the iteration's last step (step s - 2 before counting it): 1 until step 96, then linear over 768
    assert eps[96] == 1.0 and eps[128] == pytest.approx(1.0 - 0.99 * (126 - 96) / 768)


def test_continual_evaluation_and_eval_py_on_a_dqn_run(tmp_path):
    run = _train(tmp_path, "--eval_every", "768", "--eval_episodes", "2",
                 data={**CORRIDOR, "modification_factory_kwargs": {**CORRIDOR["modification_factory_kwargs"],
                                                                    "num_total_steps": 768,
                                                                    "switching_thresholds": [256, 512]}})
    rows = list(csv.DictReader(open(os.path.join(run, "eval_table.csv"))))
    assert {int(r["step"]) for r in rows} == {0, 768} and len(rows) == 6
    out = str(tmp_path / "ev")
    for greedy in ("--greedy", "--no-greedy"):  # in-process: eval.py rebuilds the agent from the checkpoint
        rows = eval_script.main(["--agent_path", run, "--modifs", "goal=3", "--eval_episodes", "2", "--output", out,
                                 "--no-progress-bar", greedy])
        assert [r["episodes"] for r in rows] == [2]
        assert json.load(open(out + ".json"))["architecture"] == "DQN"


@pytest.mark.parametrize("flags,field", [
    (["--architecture", "PPO", "--double_dqn"], "double_dqn"),
    (["--architecture", "DQN", "--buffer_size", "5"], "buffer_size"),  # DQN's one env needs 2 x (4 + 1) slots
    (["--architecture", "DQN", "--tau", "0"], "tau"),
    (["--architecture", "DQN", "--end_e", "1.5"], "end_e"),
    (["--architecture", "DQN", "--env_id", "Pendulum-v1"], "architecture"),
    (["--architecture", "DQN", "--norm_obs"], "norm_obs"),
])
def test_bad_dqn_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, field):
    with pytest.raises(SystemExit) as exit_info:
        continual_training_example.main(["--backend", "Gymnasium", "--env_id", "CartPole-v1",
                                         "--runs_dir", str(tmp_path / "runs"), *flags])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == ""
    assert err.startswith(f"error: {field}:") and err.count("\n") == 1, err
    assert not os.path.exists(tmp_path / "runs")


def test_dqn_plays_the_games_of_the_pinned_reference(tmp_path):
    """The games played, the TD loss of every iteration and the final weights equal, bit for bit, those recorded
    from an earlier revision (tests/helpers/dqn_reference.py: MinAtar at one update per env step, Double DQN, a switch):
    DQN's speed work changes how fast it learns, never what."""
    from helpers.dqn_reference import recording_path, recordings, run, run_reference_here
    from helpers.reference_revision import expected_for

    def meant_for_this_machine() -> dict:
        with open(recording_path()) as f:
            return json.load(f)

    got = run(str(tmp_path / "case"))
    expected = expected_for(got, recordings(), lambda: run_reference_here(str(tmp_path / "reference")),
                            meant_for_this_machine, keys=("episodes", "td_losses", "weights"))
    if expected is None:
        return
    assert got["episodes"] == expected["episodes"]
    assert got["td_losses"] == expected["td_losses"]
    assert got["weights"] == expected["weights"]


@pytest.mark.slow  # ~45 s: two runs
def test_a_machine_no_dqn_recording_matches_runs_the_reference_revision_and_is_compared_with_it(tmp_path, monkeypatch):
    """The path of a machine with new kernels: no recording matches, so the reference revision runs here from its
    worktree, and the case must equal what it did."""
    from helpers import dqn_reference
    from helpers.reference_revision import checkout

    if checkout(dqn_reference.REFERENCE_REVISION) is None:
        pytest.skip(f"this checkout has no {dqn_reference.REFERENCE_REVISION} (no git history, a shallow clone)")
    ran, original = [], dqn_reference.run_reference_here

    def spy(workdir):
        ran.append(original(workdir))
        return ran[-1]
    monkeypatch.setattr(dqn_reference, "recordings", lambda: [])
    monkeypatch.setattr(dqn_reference, "run_reference_here", spy)
    test_dqn_plays_the_games_of_the_pinned_reference(tmp_path)
    assert ran and ran[0] is not None and ran[0]["td_losses"], "the reference revision did not run here"


def test_fused_adam_is_adam_up_to_float_rounding(tmp_path):
    """--fused_adam: 300 Double-DQN updates of MinAtar's network with torch's fused Adam stay within float rounding of
    the default Adam's (the same update, its operations in another order), and a run with the flag trains with it."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    batches = [tuple(torch.as_tensor(x) for x in (
        (rng.random((32, 10, 10, 10)) < 0.1).astype(np.float32), rng.integers(0, 6, 32),
        rng.random(32).astype(np.float32), rng.random(32) < 0.05, (rng.random((32, 10, 10, 10)) < 0.1).astype(np.float32)))
        for _ in range(300)]

    def train(fused: bool):
        torch.manual_seed(0)
        q, t = dqn.QNetwork((10, 10, 10), 6), dqn.QNetwork((10, 10, 10), 6)
        t.load_state_dict(q.state_dict())
        opt = torch.optim.Adam(q.parameters(), lr=3e-4, **({"fused": True} if fused else {}))
        losses = []
        for i, (obs, a, r, term, nxt) in enumerate(batches):
            with torch.no_grad():
                target = dqn.td_target(r, term, 0.99, t(nxt), q(nxt))
            loss = torch.nn.functional.mse_loss(target, q(obs).gather(1, a.long().unsqueeze(1)).squeeze(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
            if i % 100 == 99:
                t.load_state_dict(q.state_dict())
        return np.array(losses), [p.detach().clone() for p in q.parameters()]

    (l0, w0), (l1, w1) = train(False), train(True)
    np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-7)
    for a, b in zip(w0, w1):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    run = _train(tmp_path, "--fused_adam", data={**CORRIDOR, "modification_factory_kwargs": {
        **CORRIDOR["modification_factory_kwargs"], "num_total_steps": 256, "switching_thresholds": [128, 192]}})
    state = _load(glob.glob(os.path.join(run, "checkpoints", "final__*"))[0])
    assert state["optimizer"]["param_groups"][0]["fused"] is True


@pytest.mark.slow
def test_dqn_learns_cartpole(tmp_path):
    """Learning check: DQN on CartPole (CleanRL dqn.py's network and most of its values, a shorter run) reaches a
    mean return >= 195 over its last 20 games within 60k steps (fixed seed)."""
    cfg = json.load(open(os.path.join(ROOT, "configs", "dqn_cartpole.json")))
    for k in ("modification_factory", "modification_factory_kwargs"):
        cfg.pop(k, None)
    path = write_config(tmp_path, cfg, "cfg.json")
    runs = str(tmp_path / "runs")
    run_script("agents/dqn.py", "--config", str(path), "--total_timesteps", "60000", "--seed", "1",
               "--runs_dir", runs, "--no-progress-bar")
    run = glob.glob(os.path.join(runs, "*"))[0]
    returns = [r["return"] for r in read_metrics(os.path.join(run, "metrics.jsonl")) if r["kind"] == "episode"]
    assert np.mean(returns[-20:]) >= 195, returns[-20:]
