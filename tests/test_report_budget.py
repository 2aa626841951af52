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
