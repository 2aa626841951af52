"""The pilot budget report (continual/report/budget.py) against a direct reading of its declared rule."""

import json
import os
import random

import pytest

from continual.report import budget
from continual.report.__main__ import main as report_main


def write_run(root, name, seed, episodes, end_step, total=None):
    path = os.path.join(root, "runs", name)
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architecture": "PPO", "exp_name": "PPO unmodified (pilot)", "seed": seed,
                   "total_timesteps": total or end_step}, f)
    recs = [{"kind": "iteration", "global_step": s, "modification": ""} for s in range(1024, end_step + 1, 1024)]
    recs += [{"kind": "episode", "global_step": s, "modification": "", "return": r, "length": 2048}
             for s, r in episodes]
    recs.sort(key=lambda r: r["global_step"])
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)


def reference_budget(runs, threshold, window, multiple):
    """The rule read word by word: for S = multiple, 2 * multiple, ... up to the shortest run's end, each run's
    episodes with S - window < step <= S, their plain mean; the first S at which every run has one >= threshold."""
    end = min(e for _, e in runs)
    s = multiple
    while s <= end:
        ok = True
        for episodes, _ in runs:
            inside = [r for step, r in episodes if s - window < step <= s]
            if not inside or sum(inside) / len(inside) < threshold:
                ok = False
        if ok:
            return s
        s += multiple
    return None


@pytest.mark.parametrize("case", range(40))
def test_budget_equals_the_rule_read_directly(tmp_path, case):
    rng = random.Random(case)
    window = rng.choice([2048, 4096, 10240])
    multiple = rng.choice([2048, 4096])
    threshold = rng.choice([5.0, 10.0, 20.0])
    runs = []
    for i in range(rng.choice([1, 2, 3])):
        end = rng.randrange(20000, 60000, 1024)
        n = rng.randrange(5, 80)
        steps = sorted(rng.sample(range(1, end + 1), n))
        # a return that grows with the step (noisy), on the window's edges too: steps exactly at S - window and S
        episodes = [(s, round(max(0.0, 30.0 * s / end + rng.gauss(0, 6)), 1)) for s in steps]
        episodes += [(multiple * k, float(rng.randrange(0, 35))) for k in range(1, 4)]
        write_run(tmp_path, f"{i:03d}_seed={i + 1}", i + 1, episodes, end)
        runs.append((episodes, end))
    got = budget.report(str(tmp_path), threshold=threshold, window=window, multiple=multiple)
    assert got["budget"] == reference_budget(runs, threshold, window, multiple)
    assert (got["why_none"] is None) == (got["budget"] is not None)
    for row, (episodes, end) in zip(got["runs"], runs):
        assert row["first_reached"] == reference_budget([(episodes, end)], threshold, window, multiple)


def test_hand_case_every_run_at_the_same_step(tmp_path):
    # run 1 reaches 20 at 4,096 and falls below at 8,192; run 2 reaches it at 8,192 only; both at 12,288
    write_run(tmp_path, "000_seed=1", 1, [(4096, 25.0), (8192, 10.0), (12288, 21.0)], 12288)
    write_run(tmp_path, "001_seed=2", 2, [(4096, 5.0), (8192, 30.0), (12288, 20.0)], 12288)
    got = budget.report(str(tmp_path), threshold=20, window=4096, multiple=4096, every=4096)
    assert [r["first_reached"] for r in got["runs"]] == [4096, 8192]
    assert got["budget"] == 12288
    assert got["runs"][0]["windowed"] == {"4096": 25.0, "8192": 10.0, "12288": 21.0}
    # a wider window averages both episodes: (25 + 10) / 2 and (10 + 21) / 2 for run 1
    wide = budget.report(str(tmp_path), threshold=20, window=8192, multiple=4096, every=4096)
    assert wide["runs"][0]["windowed"]["12288"] == pytest.approx(15.5) and wide["budget"] is None
    assert "12,288" in wide["why_none"]


def test_cli_writes_the_report_and_refuses_bad_input(tmp_path, capsys):
    write_run(tmp_path, "000_seed=1", 1, [(20480 * k, 10.0 + 4 * k) for k in range(1, 6)], 102400, total=2000000)
    out = tmp_path / "out"
    report_main(["budget", str(tmp_path), "--out", str(out), "--threshold", "20"])
    text = (out / "report.md").read_text()
    assert "**Budget: 61,440 steps**" in text  # 10 + 4 * 3 = 22 >= 20 at the third multiple of 20,480
    assert json.loads((out / "report.json").read_text())["budget"] == 61440
    assert json.loads((out / "report.json").read_text())["all_finished"] is False
    for argv, words in ((["budget", str(tmp_path), "--window", "0"], "--window must be a positive"),
                        (["budget", str(tmp_path / "nothing")], "is not a folder"),
                        (["budget", str(tmp_path / "out")], "no runs/ folder"),
                        (["tuning", str(tmp_path), "--threshold", "3"], "--threshold is for the budget report")):
        with pytest.raises(SystemExit) as e:
            report_main(argv)
        assert e.value.code == 2 and words in capsys.readouterr().err


def test_an_amended_bar_is_labelled_and_the_declared_budget_is_given_beside(tmp_path):
    # run 1 reaches 20 at 4,096 and 28 at 12,288; run 2 reaches 20 at 8,192 and 28 at 16,384
    write_run(tmp_path, "000_seed=1", 1, [(4096, 21.0), (8192, 22.0), (12288, 29.0), (16384, 30.0)], 16384)
    write_run(tmp_path, "001_seed=2", 2, [(4096, 15.0), (8192, 21.0), (12288, 25.0), (16384, 28.0)], 16384)
    plain = budget.report(str(tmp_path), threshold=28, window=4096, multiple=4096, every=4096)
    assert plain["budget"] == 16384 and "budget_declared" not in plain
    assert plain["markdown"][0].startswith("Rule (declared before the pilot)")
    got = budget.report(str(tmp_path), threshold=28, window=4096, multiple=4096, every=4096, declared_threshold=20)
    assert got["budget"] == 16384 and got["budget_declared"] == 8192
    assert [r["first_reached"] for r in got["runs"]] == [12288, 16384]
    assert [r["first_reached_declared"] for r in got["runs"]] == [4096, 8192]
    assert got["rule"]["declared_threshold"] == 20
    assert got["markdown"][0].startswith("Rule (amended after the pilot: its bar was declared >= 20 before it ran, "
                                         "and set to >= 28 after its curves were read)")
    assert "The declared bar (>= 20) gives 8,192 steps (each run's first step at it: 000_seed=1 4,096, " \
           "001_seed=2 8,192)." in got["markdown"]
    # the same bar given as declared is no amendment
    same = budget.report(str(tmp_path), threshold=28, window=4096, multiple=4096, every=4096, declared_threshold=28)
    assert same["markdown"] == plain["markdown"]


def test_committed_freeway_pilot_report_is_reproduced_byte_for_byte(tmp_path, monkeypatch):
    """bench/results/hackatari_freeway_pilot, the budget of issue 46's robustness and continual files, comes out of
    the archived pilot runs byte for byte with the command its report.json records (the amended bar, 28, and the
    declared one, 20), and that budget is the value both files' placeholder BUDGET holds."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    committed = os.path.join(root, "bench", "results", "hackatari_freeway_pilot")
    with open(os.path.join(committed, "report.json"), encoding="utf-8") as f:
        stored = json.load(f)
    folder, rule = stored["folder"], stored["rule"]
    assert folder == "bench/experiments/hackatari_freeway_pilot" and len(stored["runs"]) == 2
    assert rule == {"threshold": 28.0, "window": 20480, "multiple": 20480, "declared_threshold": 20.0}
    monkeypatch.chdir(root)  # the report keeps the folder as given
    report_main(["budget", folder, "--out", str(tmp_path), "--threshold", "28", "--declared-threshold", "20"])
    for name in ("report.md", "report.json"):
        with open(os.path.join(committed, name), "rb") as f:
            assert (tmp_path / name).read_bytes() == f.read(), name
    assert stored["budget"] == 1515520 and stored["budget_declared"] == 307200
    for name in ("hackatari_freeway_robustness", "hackatari_freeway_continual"):
        with open(os.path.join(root, "configs", "experiments", f"{name}.json"), encoding="utf-8") as f:
            spec = json.load(f)["placeholders"]["BUDGET"]
        assert spec["value"] == stored["budget"] and ">= 28" in spec["rule"] and "after the pilot" in spec["amended"]
