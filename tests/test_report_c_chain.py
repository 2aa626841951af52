"""continual.report.c_chain on hand-made experiment folders: the paper code's logged curve (the next game's step-0
evaluation at a boundary), the score and its sensitivity variant, per-game means, mean +- SE, t and Welch intervals
against independent float64 computations, the paper's numbers, unfinished runs left out, the CLI's files."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil

import numpy as np
import pytest
from scipy import stats

from continual.report import c_chain
from continual.report.__main__ import main as report_main

COLUMNS = ["step", "modification", "slug", "split", "episodes", "mean", "std", "min", "max", "mean_length",
           "seconds", "greedy", "success_rate"]
GAMES = ["MinAtar/SpaceInvaders", "MinAtar/Asterix", "MinAtar/Seaquest"]
REGIMES = ["env=MinAtar/SpaceInvaders", "env=MinAtar/Asterix", "env=MinAtar/Seaquest no_reward_cutoff=1000"]
LABELS = {"vanilla": "Double DQN", "C-CHAIN": "Double DQN + C-CHAIN"}  # the experiment file's method labels
EXPERIMENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "experiments",
                          "c_chain_minatar.json")
TASK, EVERY = 100, 50  # 3 tasks of 100 steps, an evaluation every 50: steps 0, 50, ..., 300


def value(step: int, game: int, seed: int, arm: str) -> float:
    """A run's evaluation return of `game` at `step` (distinct everywhere, so a wrong row shows)."""
    return 10.0 * game + step / 7.0 + 0.37 * seed ** 1.5 + (5.0 if arm == "C-CHAIN" else 0.0)


def make_run(folder: str, name: str, seed: int, arm: str, last: int = 3 * TASK) -> None:
    d = os.path.join(folder, "runs", name)
    os.makedirs(d)
    tasks = [{"env_id": GAMES[0], "steps": TASK}, {"env_id": GAMES[1], "steps": TASK},
             {"env_id": GAMES[2], "modifications": "no_reward_cutoff=1000", "steps": TASK}]
    cfg = {"architecture": "DQN", "seed": seed, "env_id": GAMES[0], "c_chain": arm == "C-CHAIN", "double_dqn": True,
           "exp_name": LABELS[arm], "total_timesteps": 3 * TASK, "eval_every": EVERY, "eval_episodes": 10,
           "eval_greedy": True, "modification_factory": "TaskSequence",
           "modification_factory_kwargs": {"cycles": 1, "tasks": tasks}}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(d, "eval_table.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for step in range(0, last + 1, EVERY):
            for k, m in enumerate(REGIMES):
                w.writerow({"step": step, "modification": m, "slug": m, "split": "curriculum", "episodes": 10,
                            "mean": value(step, k, seed, arm), "std": 1.0, "min": 0, "max": 40, "mean_length": 300.0,
                            "seconds": 1.0, "greedy": True, "success_rate": ""})


def by_hand(seed: int, arm: str) -> tuple[float, float, dict]:
    """The score: steps 0, 50 of game 0; 100 (game 1's step 0, logged over game 0's final), 150 of game 1; 200, 250,
    300 of game 2. All evaluations: + game 0 at 100 and game 1 at 200. Per game: its own evaluations."""
    logged = [(0, 0), (50, 0), (100, 1), (150, 1), (200, 2), (250, 2), (300, 2)]
    vals = [value(s, k, seed, arm) for s, k in logged]
    extra = [value(100, 0, seed, arm), value(200, 1, seed, arm)]
    per_game = {GAMES[0]: np.mean([value(s, 0, seed, arm) for s in (0, 50, 100)]),
                GAMES[1]: np.mean([value(s, 1, seed, arm) for s in (100, 150, 200)]),
                GAMES[2]: np.mean([value(s, 2, seed, arm) for s in (200, 250, 300)])}
    return sum(vals) / 7, (sum(vals) + sum(extra)) / 9, per_game


@pytest.fixture
def folder(tmp_path):
    i = 0
    for seed in range(1, 6):
        for arm in ("vanilla", "C-CHAIN"):
            if (seed, arm) == (5, "C-CHAIN"):
                continue  # 5 vanilla, 4 C-CHAIN runs finished
            make_run(str(tmp_path), f"{i:03d}_seed={seed}_{arm}", seed, arm)
            i += 1
    make_run(str(tmp_path), "999_seed=5_C-CHAIN", 5, "C-CHAIN", last=150)  # running: not counted
    return str(tmp_path)


def test_scores_per_run_by_hand(folder):
    recs = c_chain.load(folder)
    assert len(recs) == 10 and sum(r["finished"] for r in recs) == 9
    for r in recs:
        if not r["finished"]:
            continue
        score, score_all, per_game = by_hand(r["seed"], r["arm"])
        assert r["scores"]["score"] == pytest.approx(score, rel=1e-14)
        assert r["scores"]["score_all_evaluations"] == pytest.approx(score_all, rel=1e-14)
        assert r["scores"]["evaluations"] == 7
        for g in GAMES:
            assert r["scores"]["per_game_mean"][g] == pytest.approx(per_game[g], rel=1e-14)
        assert r["scores"]["per_game_final"][GAMES[0]] == value(100, 0, r["seed"], r["arm"])


def _t95(x):
    x = np.asarray(x, np.float64)
    se = x.std(ddof=1) / math.sqrt(len(x))
    h = stats.t.ppf(0.975, len(x) - 1) * se
    return x.mean(), se, x.mean() - h, x.mean() + h


def test_mean_se_intervals_and_difference_by_independent_computation(folder):
    recs = c_chain.load(folder)
    main = c_chain.summarize(recs)
    van = [by_hand(s, "vanilla")[0] for s in range(1, 6)]
    cc = [by_hand(s, "C-CHAIN")[0] for s in range(1, 5)]
    for arm, xs in (("vanilla", van), ("C-CHAIN", cc)):
        m, se, lo, hi = _t95(xs)
        got = main[arm]
        assert got["n"] == len(xs)
        assert got["mean"] == pytest.approx(m, rel=1e-12) and got["se"] == pytest.approx(se, rel=1e-12)
        assert got["t95"]["ci"] == pytest.approx([lo, hi], rel=1e-9)
    # Welch: C-CHAIN - vanilla
    a, b = np.asarray(cc), np.asarray(van)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    h = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    d = a.mean() - b.mean()
    welch = main["difference"]["welch"]
    assert welch["estimate"] == pytest.approx(d, rel=1e-12)
    assert welch["ci"] == pytest.approx([d - h, d + h], rel=1e-9)
    # paired by seed: seeds 1-4 finished in both arms; every difference is 5 here (value's arm offset)
    assert main["difference"]["paired_seeds"] == [1, 2, 3, 4]
    assert main["difference"]["paired"]["estimate"] == pytest.approx(5.0, rel=1e-12)


def declare(folder: str) -> None:
    """The folder's copy of the experiment file, which declares Table 4 under declared.published."""
    shutil.copy(EXPERIMENT, os.path.join(folder, "experiment.json"))


def test_the_published_numbers_are_the_declared_ones_and_their_intervals(folder):
    declare(folder)
    paper = c_chain.published(folder, c_chain.load(folder))
    assert paper["source"].startswith("Tang, Obando-Ceron, Castro, Courville, Berseth")
    p = paper["arms"]["vanilla"]
    h = stats.t.ppf(0.975, 11) * 0.733
    assert (p["label"], p["mean"], p["se"], p["n"]) == ("Double DQN", 22.044, 0.733, 12)
    assert [p["low"], p["high"]] == pytest.approx([22.044 - h, 22.044 + h])
    assert [p["low_normal"], p["high_normal"]] == pytest.approx([22.044 - 1.96 * 0.733, 22.044 + 1.96 * 0.733])
    assert paper["arms"]["C-CHAIN"]["mean"] == 29.513 and paper["arms"]["C-CHAIN"]["label"] == LABELS["C-CHAIN"]
    # a number the declaration changes is the number the report prints: it keeps none of its own
    data = json.load(open(EXPERIMENT))
    data["declared"]["published"]["results"]["Double DQN"] = {"mean": 20.0, "se": 1.0}
    with open(os.path.join(folder, "experiment.json"), "w") as f:
        json.dump(data, f)
    md = "\n".join(c_chain.report(folder)["markdown"])
    assert "| 20.000 +- 1.000 (n=?, Double DQN) |  | [18.04, 21.96] |" in md and "published: +9.513" in md


def test_without_a_declaration_the_published_column_says_not_declared(folder):
    res = c_chain.report(folder)
    assert res["paper"]["arms"] == {"vanilla": None, "C-CHAIN": None} and res["paper"]["source"] is None
    md = "\n".join(res["markdown"])
    assert md.count("| not declared |  |  |") == 2 and "published: not declared" in md and "22.044" not in md


def test_logged_task_is_the_next_games_at_a_boundary():
    tasks = [{"end": 100}, {"end": 200}, {"end": 300}]
    assert [c_chain.logged_task(s, tasks) for s in (0, 99, 100, 199, 200, 300)] == [0, 0, 1, 1, 2, 2]


def test_cli_writes_the_report(folder, tmp_path, capsys):
    declare(folder)
    out = str(tmp_path / "out")
    report_main(["c_chain", folder, "--out", out])
    printed = capsys.readouterr().out
    assert "22.044 +- 0.733" in printed and "C-CHAIN - vanilla" in printed
    assert "unfinished: evaluated up to step 150" in printed
    assert {"report.md", "report.json", "curves.png"} <= set(os.listdir(out))
    data = json.load(open(os.path.join(out, "report.json")))
    assert data["score"]["vanilla"]["n"] == 5 and len(data["runs"]) == 10
    # the settings that differ from the paper code's are listed (these hand-made runs lack most of them)
    assert "Settings that differ from the paper code's" in printed


def test_a_folder_without_runs_is_a_one_line_error(tmp_path):
    from continual.errors import UserError

    with pytest.raises(UserError):
        c_chain.load(str(tmp_path))


def test_provenance_lists_the_commits_and_the_resumes_from_the_runs_start_records(folder):
    """The runs' "start" records (metrics.jsonl, or the archive's metrics.jsonl.gz): each commit with its runs, each
    resumed run with its steps. The C-CHAIN experiment's runs changed commit at a resume (2026-12-01)."""
    import gzip

    def start(step, commit, resumed):
        return json.dumps({"kind": "start", "global_step": step, "resumed": resumed,
                           "code_revision": {"commit": commit, "dirty": False}})

    runs = sorted(os.listdir(os.path.join(folder, "runs")))
    with open(os.path.join(folder, "runs", runs[0], "metrics.jsonl"), "w") as f:
        f.write("\n".join([start(0, "a" * 40, False), '{"kind": "iteration", "global_step": 10}',
                           start(50, "b" * 40, True), start(150, "b" * 40, True)]) + "\n")
    with gzip.open(os.path.join(folder, "runs", runs[1], "metrics.jsonl.gz"), "wt") as f:
        f.write(start(0, "b" * 40, False) + "\n")
    res = c_chain.report(folder)
    text = "\n".join(res["markdown"])
    assert "- Code: aaaaaaa (1 run); bbbbbbb (2 runs)\n" in text  # the hand-made runs without records: none
    assert f"- Resumed from a checkpoint (1 run; episodes in flight restarted): {runs[0]} at 50, 150" in text


def test_learned_check_counts_final_evaluations_above_a_random_policy(folder, tmp_path, capsys):
    """--baseline (eval.py's JSON of a --random_actions evaluation): per arm and game, the runs that reached the end of
    the game's task (the unfinished seed-5 C-CHAIN run has reached SpaceInvaders' end at step 100), their final
    evaluations' mean and t interval, and how many beat the random mean and the random best game (learned)."""
    rand = {REGIMES[0]: (15.0, 20.0), REGIMES[1]: (25.0, 26.0), REGIMES[2]: (0.1, 1.0)}
    path = tmp_path / "random.json"
    path.write_text(json.dumps({"random_actions": True, "greedy": False, "seed": 1, "results": [
        {"modification": m, "episodes": 100, "mean": a, "max": b} for m, (a, b) in rand.items()]}))
    res = c_chain.report(folder, baseline=str(path))
    got = {(c["arm"], c["game"]): c for c in res["learned_check"]["games"]}
    assert len(got) == 6
    seeds = {"vanilla": [1, 2, 3, 4, 5], "C-CHAIN": [1, 2, 3, 4]}
    for (arm, game), c in got.items():
        k = GAMES.index(game)
        finals = [value((k + 1) * TASK, k, s, arm) for s in seeds[arm] + ([5] if arm == "C-CHAIN" and k == 0 else [])]
        mean, top = rand[REGIMES[k]]
        assert c["runs"] == len(finals) and c["final"]["estimate"] == pytest.approx(np.mean(finals), rel=1e-12)
        half = stats.t.ppf(0.975, len(finals) - 1) * np.std(finals, ddof=1) / math.sqrt(len(finals))
        assert c["final"]["ci"] == pytest.approx([np.mean(finals) - half, np.mean(finals) + half], rel=1e-9)
        assert (c["above_mean"], c["learned"]) == (sum(v > mean for v in finals), sum(v > top for v in finals))
    assert got["C-CHAIN", GAMES[0]]["runs"] == 5 and 0 < got["C-CHAIN", GAMES[0]]["learned"] < 5  # the bar bites
    text = "\n".join(res["markdown"])
    assert "| C-CHAIN | SpaceInvaders | 5 |" in text and "15.00 / 20 |" in text
    # a constant-action evaluation, or two files, are refused in one line
    other = tmp_path / "always.json"
    other.write_text(json.dumps({"constant_action": 1, "results": [{"modification": "", "episodes": 1, "mean": 0}]}))
    for argv, words in ((["--baseline", str(other)], "not an evaluation with --random_actions"),
                        (["--baseline", str(path), str(path)], "reads one eval.py JSON")):
        with pytest.raises(SystemExit) as e:
            report_main(["c_chain", folder, *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and words in err[0], err


def test_the_remains_of_a_run_started_again_are_left_out(folder):
    """runs/<entry>.incomplete<k> (the launcher's remains of a run started again from step 0) is not a run."""
    before = [r["run"] for r in c_chain.report(folder)["runs"]]
    first = os.path.join(folder, "runs", before[0])
    shutil.copytree(first, first + ".incomplete1")
    assert [r["run"] for r in c_chain.report(folder)["runs"]] == before
