"""continual.report.plasticity (python -m continual.report plasticity): per-regime returns, the early-vs-late drop,
its Student-t intervals (against the formula by hand), Welch differences, the probability of improvement and the exact
Mann-Whitney p against PPO and PPO_fresh, on hand-made run directories; post-hoc and chosen-default marks; the whole
report on a tiny real experiment folder (MinAtar with permuted channels and actions, two methods x two seeds, trained
here); --from-report on the committed report.json reproduces its table, report.md and records exactly; README's and
the results page's plasticity numbers are the committed report.json's; the shipped experiment file (every entry
validates, seeds fixed, one budget, its post-hoc labels); bad input (one line, exit 2, nothing created)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest

from conftest import run_main, write_config
from continual.config.args import Args
from continual.envs.backends import minatar_permutation
from continual.errors import UserError
from continual.evaluation.metrics import COLLAPSED_ENTROPY
from continual.launch.experiment import load_experiment, validate
from continual.modstrings import normalize_modification
from continual.report import plasticity as R
from continual.report.__main__ import main as report_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENT = os.path.join("configs", "experiments", "plasticity_minatar.json")
REPORT = os.path.join("bench", "results", "plasticity_minatar")
REGIMES = ["permute_obs=1", "permute_obs=2", "permute_obs=3", "permute_obs=4"]  # visits (0,10], (10,20], ...
# t_{0.975, df} from a printed table (df 1, 2, 4, 10 digits): the hand formula of the t interval
T975 = {1: 12.70620474, 2: 4.302652730, 4: 2.776445105}


def write_run(runs_dir: str, name: str, episodes: list[list[float]], total: int = 40, dormant=(0.1, 0.3),
              entropy: Optional[list[float]] = None, trac: Optional[list[float]] = None) -> str:
    """A run directory whose regime k (steps (10k, 10k+10]) has training episodes with `episodes[k]`'s returns, ending
    at steps 10k+1, 10k+2, ..., one iteration record at its end (policy entropy `entropy[k]` if given), and
    plasticity records at the first switch and the end."""
    d = os.path.join(runs_dir, name)
    os.makedirs(d)
    write_config(d, {"architecture": "PPO", "seed": 1, "resolved_total_timesteps": total, "modification_factory_kwargs": {
        "modifications": REGIMES, "switching_thresholds": [10, 20, 30]}}, "config.json")
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for k, rets in enumerate(episodes):
            if k:
                f.write(json.dumps({"kind": "switch", "global_step": 10 * k, "previous": REGIMES[k - 1],
                                    "modification": REGIMES[k]}) + "\n")
            for j, r in enumerate(rets):
                f.write(json.dumps({"kind": "episode", "global_step": 10 * k + 1 + j, "modification": REGIMES[k],
                                    "return": r}) + "\n")
            it = {"kind": "iteration", "global_step": 10 * k + 10, "modification": REGIMES[k]}
            if entropy is not None:
                it["losses/entropy"] = entropy[k]
            if trac is not None:
                it["plasticity/trac_scale"] = trac[k]
            f.write(json.dumps(it) + "\n")
        for step, dm in zip((10, 40), dormant):
            f.write(json.dumps({"kind": "plasticity", "global_step": step, "plasticity/dormant_fraction/all": dm,
                                "plasticity/effective_rank": 20.0 - 10 * dm, "plasticity/weight_norm/a": 3.0,
                                "plasticity/weight_norm/b": 4.0}) + "\n")
    return d


def summaries(runs_dir: str, early: int, late: int) -> list[dict]:
    return [R.run_summary(os.path.join(runs_dir, d), early, late) for d in sorted(os.listdir(runs_dir))]


def tables(lines: list[str]) -> list[list[str]]:
    """The markdown tables among report lines (runs of lines starting with '|')."""
    out: list[list[str]] = []
    for i, line in enumerate(lines):
        if line.startswith("|"):
            if i == 0 or not lines[i - 1].startswith("|"):
                out.append([])
            out[-1].append(line)
    return out


def rectangular(lines: list[str]) -> bool:
    return all(len({row.count("|") for row in t}) == 1 for t in tables(lines))


def t_by_hand(xs: list[float]) -> tuple[float, float, float]:
    """mean -+ t_{0.975, n-1} sd / sqrt(n), sd with divisor n - 1."""
    n, m = len(xs), sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = T975[n - 1] * sd / math.sqrt(n)
    return m, m - h, m + h


def cell(m: float, lo: float, hi: float) -> str:
    return f"{m:.2f} [{lo:.2f}, {hi:.2f}]"


# ---------------------------------------------------------------------------------------------------------------------
# per run
# ---------------------------------------------------------------------------------------------------------------------


def test_run_summary_by_hand(tmp_path):
    # regime returns: mean of the episodes ending in each visit; steps 8-10 of (0, 10] are its last quarter (> 7.5)
    eps = [[1, 3, 5, 5, 5, 5, 5, 5, 7, 9], [2, 4], [1, 1, 1], [0, 2]]
    d = write_run(str(tmp_path), "003_PPO_seed=2", eps)
    s = R.run_summary(d, early=2, late=2)
    assert s["method"] == "PPO" and s["seed"] == 2 and s["done"]
    assert s["regimes"] == [5.0, 3.0, 1.0, 1.0]
    assert s["final_quarter"][0] == 7.0  # the episodes ending at steps 8, 9 and 10: (5 + 7 + 9) / 3
    assert s["early"] == 4.0 and s["late"] == 1.0 and s["drop"] == 3.0 and s["relative_drop"] == 0.75
    assert s["diagnostics"][0] == {"step": 10, "dormant": 0.1, "effective_rank": 19.0, "weight_norm": 5.0}
    assert s["diagnostics"][-1]["dormant"] == 0.3
    assert s["collapsed"] is None  # no entropy logged
    # the early/late fields are a function of the per-regime lists (what --from-report recomputes)
    assert R.windows(s, 2, 2) == {k: s[k] for k in R.windows(s, 2, 2)}
    assert R.windows(s, 3, 2) == {}  # 4 regimes hold no 3 + 2 window


def test_time_average_weights_the_parts_of_a_visit_equally(tmp_path):
    # regime 1: four failing episodes end at step 1 (return 0), one good one at step 2 (return 10)
    d = write_run(str(tmp_path), "001_PPO_seed=1", [[0, 10], [4], [4], [4]])
    with open(os.path.join(d, "metrics.jsonl"), "a") as f:
        for _ in range(3):
            f.write(json.dumps({"kind": "episode", "global_step": 1, "modification": REGIMES[0], "return": 0}) + "\n")
    s = R.run_summary(d, early=1, late=1)
    assert s["regimes"][0] == 2.0  # (0 + 0 + 0 + 0 + 10) / 5
    assert s["time_average"] == [5.0, 4.0, 4.0, 4.0]  # parts (0, 1] and (1, 2]: 0 and 10; empty parts do not count
    assert s["drop"] == -2.0 and s["drop_time_average"] == 1.0 and s["late_time_average"] == 4.0


def test_collapsed_share_of_updates(tmp_path):
    # 2 of 4 updates below 0.01 nats; exactly 0.01 is not collapsed
    d = write_run(str(tmp_path), "003_PPO_seed=2", [[1], [1], [1], [1]], entropy=[1.05, 0.0, 0.009, 0.01])
    assert R.run_summary(d, early=1, late=1)["collapsed"] == 0.5


def test_trac_scale_per_regime_and_at_zero(tmp_path):
    runs_dir = str(tmp_path / "runs")
    scales = {1: [0.5, 0.0, 0.2, 0.0], 2: [0.7, 0.1, 0.0, 0.3]}
    for seed, s in scales.items():
        write_run(runs_dir, f"00{seed}_PPO_TRAC_seed={seed}", [[1], [1], [1], [1]], trac=s)
    write_run(runs_dir, "003_PPO_seed=1", [[1], [1], [1], [1]])
    runs = summaries(runs_dir, 1, 1)
    assert runs[0]["trac_scale_end"] == scales[1] and runs[0]["trac_scale_zero"] == 0.5
    assert "trac_scale_end" not in runs[2]
    table = R.summarize(runs)
    assert table["PPO_TRAC"]["trac_scale_end_median"] == pytest.approx([0.6, 0.05, 0.1, 0.15])
    assert table["PPO_TRAC"]["trac_scale_zero"] == [0.5, 0.25] and "trac_scale_zero" not in table["PPO"]
    lines = R.markdown(table, runs, 1, 1)
    assert "| PPO_TRAC | 0.6 | 0.05 | 0.1 | 0.15 | 0.50, 0.25 |" in lines
    assert rectangular(lines)


def test_run_names_in_either_grid_order():
    assert R.parse_run_name("003_seed=2_PPO_ReDo") == ("PPO_ReDo", 2)
    assert R.parse_run_name("013_PPO_CBP_scaled_seed=12") == ("PPO_CBP_scaled", 12)
    assert R.parse_run_name("pilot_Breakout") is None


def test_unfinished_runs_and_unnamed_runs(tmp_path):
    d = write_run(str(tmp_path), "some_run", [[1], [2], [3], [4]], total=80)
    s = R.run_summary(d, early=1, late=1)
    assert not s["done"] and s["method"] == "PPO"  # the config's architecture when the name is not the launcher's
    assert R.run_summary(str(tmp_path / "missing"), 1, 1) is None


def test_weight_norm_is_the_root_sum_of_layer_norms():
    assert R.weight_norm({"plasticity/weight_norm/x": 1.0, "plasticity/weight_norm/y": 2.0, "other": 9.0}) == \
        pytest.approx(np.sqrt(5.0))


# ---------------------------------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------------------------------


def test_t_intervals_welch_differences_and_exact_p_by_hand(tmp_path):
    runs_dir = str(tmp_path / "runs")
    drops = {"PPO": [6, 5, 7], "PPO+S&P": [1, 0, 2]}  # late returns: PPO 4, 5, 3; S&P 9, 10, 8
    for m, ds in drops.items():
        for seed, drop in enumerate(ds, 1):
            write_run(runs_dir, f"00{seed}_{m}_seed={seed}", [[10], [10], [10 - drop], [10 - drop]])
    write_run(runs_dir, "009_PPO_seed=9", [[1], [1]], total=40)  # unfinished: left out
    runs = summaries(runs_dir, 2, 2)
    table = R.summarize(runs)
    ppo, sp = table["PPO"], table["PPO+S&P"]
    assert ppo["n"] == 3 and ppo["seeds"] == [1, 2, 3] and ppo["drop"]["per_seed"] == [6.0, 5.0, 7.0]
    # the t interval: 6 -+ t_{0.975, 2} * 1 / sqrt(3)
    m, lo, hi = t_by_hand([6.0, 5.0, 7.0])
    assert ppo["drop"]["method"] == "t" and ppo["drop"]["estimate"] == m
    assert ppo["drop"]["ci"] == pytest.approx([lo, hi], rel=1e-9)
    assert ppo["early"]["estimate"] == 10.0 and ppo["early"]["ci"] == [None, None]  # every seed equal: no interval
    # Welch: S&P late - PPO late = 5, variances 1/3 + 1/3, Welch-Satterthwaite df = 4
    d = sp["late_minus_PPO"]
    assert d["method"] == "Welch t" and d["estimate"] == pytest.approx(5.0)
    h = T975[4] * math.sqrt(2 / 3)
    assert d["ci"] == pytest.approx([5.0 - h, 5.0 + h], rel=1e-9)
    assert sp["drop_minus_PPO"]["estimate"] == pytest.approx(-5.0)
    # every S&P late return above every PPO one: P = 1, no bootstrap interval, exact one-sided p = 1 / C(6, 3)
    p = sp["p_late_above_PPO"]
    assert p["estimate"] == 1.0 and p["ci"] == [None, None] and "every bootstrap resample" in p["reason"]
    assert p["mann_whitney"]["p"] == pytest.approx(1 / 20) and p["mann_whitney"]["method"] == "exact"
    lines = R.markdown(table, runs, 2, 2)
    assert any(line.startswith(f"| PPO | 3 | 10.00 | {cell(*t_by_hand([4.0, 5.0, 3.0]))} | {cell(m, lo, hi)} |")
               for line in lines)
    row = next(line for line in lines if line.startswith("| PPO+S&P |"))
    assert f"| {cell(5.0, 5.0 - h, 5.0 + h)} | 1.00 (every pair) | 0.050 |" in row
    header = next(line for line in lines if line.startswith("| method"))
    assert "late - PPO | P(late > PPO) | p |" in header and "PPO_fresh" not in header  # a baseline without runs
    assert rectangular(lines)  # every row as wide as its header
    assert any("009_PPO_seed=9" in line for line in lines)
    heading = "\n".join(lines[:4])
    assert "95% Student-t interval" in heading and "Welch interval" in heading and "BCa" in heading
    assert "exact one-sided Mann-Whitney" in heading and "with 3 seeds each the smallest possible is 1/20" in heading


def test_differences_to_a_fresh_network(tmp_path):
    # late returns: PPO 4, PPO_fresh 6, a remedy 7 and 5 over its two seeds
    runs_dir = str(tmp_path / "runs")
    lates = {"PPO": [4, 4], "PPO_fresh": [6, 6], "PPO_ReDo": [7, 5]}
    for i, (m, ls) in enumerate(lates.items()):
        for seed, late in enumerate(ls, 1):
            write_run(runs_dir, f"{i}{seed}_{m}_seed={seed}", [[10], [10], [late], [late]])
    runs = summaries(runs_dir, 2, 2)
    table = R.summarize(runs)
    redo = table["PPO_ReDo"]
    assert redo["late_minus_PPO_fresh"]["estimate"] == pytest.approx(0.0)
    assert redo["p_late_above_PPO_fresh"]["estimate"] == 0.5  # one seed above, one below every fresh seed
    assert redo["late_minus_PPO"]["estimate"] == pytest.approx(2.0)
    assert redo["late_time_average_minus_PPO_fresh"]["estimate"] == pytest.approx(0.0)  # one episode per part here
    assert table["PPO_fresh"]["late_minus_PPO"]["estimate"] == pytest.approx(2.0)
    assert "late_minus_PPO_fresh" not in table["PPO_fresh"] and "late_minus_PPO" not in table["PPO"]
    lines = R.markdown(table, runs, 2, 2)
    header = next(line for line in lines if line.startswith("| method"))
    assert "late - PPO_fresh | P(late > PPO_fresh) | p |" in header
    # sensitivity row: drops 3 and 5, time-average late 7 and 5 (t, df 1); the difference to fresh: Welch, df 1
    drop, late = cell(*t_by_hand([3.0, 5.0])), cell(*t_by_hand([7.0, 5.0]))
    assert f"| PPO_ReDo | {drop} | {drop} | {late} | {cell(0.0, -T975[1], T975[1])} |" in lines
    rows = [line for line in tables(lines)[0] if line.startswith("| PPO")]
    assert [r.split(" | ")[0] for r in rows] == ["| PPO", "| PPO_fresh", "| PPO_ReDo"]  # baselines first
    assert rectangular(lines)


def test_post_hoc_and_chosen_default_marks(tmp_path):
    folder = tmp_path / "exp"
    lates = {"PPO": [4, 3], "PPO_fresh": [6, 6.5], "PPO_ReDo": [7, 5], "PPO_L2Init_x": [5, 5.5]}
    for i, (m, ls) in enumerate(lates.items()):
        for seed, late in enumerate(ls, 1):
            write_run(str(folder / "runs"), f"{i}{seed}_{m}_seed={seed}", [[10], [10], [late], [late]])
    write_config(folder, {"_post_hoc": [{"label": "PPO_ReDo", "reason": "added after PPO failed", "added": "abc1234"},
                                        {"label": "PPO_L2Init_x", "added": "def5678"}],
                          "_defaults_chosen_here": [{"flag": "l2_init_coef", "value": 1e-4, "label": "PPO_L2Init_x",
                                                     "set": "0123abc", "reason": "the best of three"}]},
                 "experiment.json")
    res = R.report(str(folder), str(tmp_path / "out"), early=2, late=2)
    lines = res["markdown"]
    for t in tables(lines)[:3]:  # main, end of a regime, sensitivity: every method row is marked
        assert any(row.startswith("| PPO_ReDo † |") for row in t), t
        assert any(row.startswith("| PPO_L2Init_x †‡ |") for row in t), t
        assert not any(row.startswith("| PPO † ") or row.startswith("| PPO_fresh †") for row in t)
    text = "\n".join(lines)
    assert "- PPO_ReDo (added at abc1234): added after PPO failed" in text
    assert "- `--l2_init_coef` = 0.0001 (PPO_L2Init_x, set at 0123abc): the best of three" in text
    stored = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [i["label"] for i in stored["post_hoc"]] == ["PPO_ReDo", "PPO_L2Init_x"]
    assert stored["defaults_chosen_here"][0]["flag"] == "l2_init_coef"
    assert stored["args"]["experiment"] == str(folder / "experiment.json")
    for name in ("report.md", "regimes.png", "drop.png", "diagnostics.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    # --from-report on it, without the experiment file: the stored labels
    os.remove(folder / "experiment.json")
    again = R.report(from_report=str(tmp_path / "out" / "report.json"), figures=False)
    assert again["table"] == json.loads(json.dumps(res["table"]))
    assert "| PPO_ReDo † |" in "\n".join(again["markdown"])


# ---------------------------------------------------------------------------------------------------------------------
# the committed report
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def committed() -> dict:
    with open(os.path.join(ROOT, REPORT, "report.json"), encoding="utf-8") as f:
        return json.load(f)


def test_from_report_reproduces_the_committed_report(committed, tmp_path, monkeypatch):
    """The committed report.md, report.json and figures are what `--from-report` computes from the committed per-run
    records, byte for byte (report.json: but the args naming the file read and the output folder), and the records'
    windowed fields are their per-regime lists'."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "again"
    report_main(["plasticity", "--from-report", os.path.join(REPORT, "report.json"), "--out", str(out)])
    for name in ("report.md", "report.json"):
        new = (out / name).read_text(encoding="utf-8")
        old = open(os.path.join(ROOT, REPORT, name), encoding="utf-8").read()
        if name == "report.json":  # args name the file read and the output folder; everything else is equal
            a, b = json.loads(new), json.loads(old)
            assert a["args"]["out"] == str(out) and b["args"]["out"] == REPORT
            assert {k: v for k, v in a.items() if k not in ("args", "source")} == \
                {k: v for k, v in b.items() if k not in ("args", "source")}
            assert new[new.index('\n "runs": ['):] == old[old.index('\n "runs": ['):]  # the records, as text
        else:
            assert new == old
    for name in ("regimes.png", "drop.png", "diagnostics.png"):  # the figures too, byte for byte
        with open(os.path.join(ROOT, REPORT, name), "rb") as f:
            assert (out / name).read_bytes() == f.read(), name
    assert committed["runs_sha256"] == R.runs_digest(committed["runs"])
    assert len(committed["runs"]) == 90 and all(r["done"] for r in committed["runs"])
    early, late = committed["args"]["early"], committed["args"]["late"]
    for r in committed["runs"]:
        assert R.windows(r, early, late) == {k: r[k] for k in R.windows(r, early, late)}, r["run"]
    # the interval methods the heading names
    row = committed["table"]["PPO_LN"]
    assert row["late"]["method"] == "t" and row["late_minus_PPO"]["method"] == "Welch t"
    assert row["p_late_above_PPO_fresh"]["method"] == "BCa" and row["p_late_above_PPO"]["mann_whitney"]["method"] == \
        "exact"


def test_committed_t_intervals_are_the_formula(committed):
    for method, row in committed["table"].items():
        for key in ("early", "late", "drop"):
            xs = row[key]["per_seed"]
            m, lo, hi = t_by_hand(xs)
            assert row[key]["estimate"] == pytest.approx(m, rel=1e-12, abs=1e-12)
            assert row[key]["ci"] == pytest.approx([lo, hi], rel=1e-9, abs=1e-8), (method, key)


def test_committed_report_marks_post_hoc_arms_and_the_chosen_default(committed):
    experiment = json.load(open(os.path.join(ROOT, EXPERIMENT), encoding="utf-8"))
    # the arms of the report's runs that were added after the first results (PPO_CCHAIN, appended for the next run,
    # is post hoc too but has no run in this report)
    post = {i["label"] for i in experiment["_post_hoc"]} & set(committed["table"])
    assert post == {"PPO_NaP_torso", "PPO_L2Init_1e-3", "PPO_L2Init_1e-4", "PPO_TRAC_ref"}
    assert {i["label"] for i in experiment["_post_hoc"]} - post == {"PPO_CCHAIN"}
    assert {i["label"] for i in committed["post_hoc"]} == post
    chosen = experiment["_defaults_chosen_here"]
    assert [(c["flag"], c["value"], c["label"]) for c in chosen] == [("l2_init_coef", Args.l2_init_coef,
                                                                       "PPO_L2Init_1e-4")]
    md = open(os.path.join(ROOT, REPORT, "report.md"), encoding="utf-8").read().splitlines()
    for t in tables(md)[:3]:
        for method in committed["table"]:
            row = next(r for r in t if r.startswith(f"| {method} "))
            expected = (" †" if method in post else "") + ("‡" if method == "PPO_L2Init_1e-4" else "")
            assert row.startswith(f"| {method}{expected} |"), row
    assert any(line.startswith("† Post hoc") for line in md) and any(line.startswith("‡ A flag's default") for line in md)
    assert any("`--l2_init_coef` = 0.0001 (PPO_L2Init_1e-4, set at 21e9535)" in line for line in md)


def test_edited_records_are_refused(committed, tmp_path):
    edited = json.loads(json.dumps(committed))
    edited["runs"][0]["regimes"][0] += 1.0
    path = tmp_path / "report.json"
    path.write_text(json.dumps(edited))
    with pytest.raises(UserError, match="runs_sha256"):
        R.report(from_report=str(path))


def test_from_report_with_other_windows_recomputes_them(committed):
    res = R.report(from_report=os.path.join(ROOT, REPORT, "report.json"), early=2, late=3, figures=False)
    ppo = [r for r in committed["runs"] if r["method"] == "PPO"]
    assert res["table"]["PPO"]["early"]["per_seed"] == [float(np.mean(r["regimes"][:2])) for r in ppo]
    assert res["table"]["PPO"]["late"]["per_seed"] == [float(np.mean(r["regimes"][-3:])) for r in ppo]
    assert "early = regimes 1-2, late = regimes 8-10 of 10" in res["markdown"][0]
    assert committed["runs"][0]["early"] == ppo[0]["early"]  # the stored records are not modified


# ---------------------------------------------------------------------------------------------------------------------
# README and the results page (docs/results/plasticity.md) quote the committed report
# ---------------------------------------------------------------------------------------------------------------------

NUMBER = r"-?\d+\.\d+"
TRIPLE = re.compile(rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]")


def _decimals(s: str) -> int:
    return len(s.split(".")[1])


def _intervals(table: dict) -> list[dict]:
    """Every interval dict of the table (estimate and ci)."""
    out = []

    def walk(x):
        if isinstance(x, dict):
            if "estimate" in x and "ci" in x:
                out.append(x)
            for k, v in x.items():
                if k != "per_seed":
                    walk(v)
    walk(table)
    return out


def _numbers(table: dict) -> list[float]:
    """Every number of the table but the per-seed values: estimates, interval ends, p-values, diagnostics."""
    out = []

    def walk(x, key=""):
        if isinstance(x, dict):
            for k, v in x.items():
                if k not in ("per_seed", "seeds", "n", "confidence", "statistic", "trac_scale_zero"):
                    walk(v, k)
        elif isinstance(x, list):
            for v in x:
                walk(v, key)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out.append(float(x))
    walk(table)
    return out


def check_triples(text: str, table: dict) -> int:
    """Every 'm [lo, hi]' in `text` is an interval of the table at the printed precision (or its negation: 'below')."""
    printed = set()
    for iv in _intervals(table):
        if iv["ci"][0] is None:
            continue
        for sign in (1, -1):
            m, lo, hi = sign * iv["estimate"], sign * iv["ci"][0], sign * iv["ci"][1]
            lo, hi = min(lo, hi), max(lo, hi)
            for d in (1, 2, 3):
                printed.add(f"{m:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]")
    found = TRIPLE.findall(text)
    for m, lo, hi in found:
        assert f"{m} [{lo}, {hi}]" in printed, f"{m} [{lo}, {hi}] is no interval of the report"
    return len(found)


def check_p_values(text: str, table: dict) -> int:
    """'P = x' is a probability of improvement of the table, 'p = x' an exact Mann-Whitney p-value of it."""
    poi = {f"{iv['estimate']:.2f}" for iv in _intervals(table) if iv["method"] == "BCa"}
    mw = {f"{row[k]['mann_whitney']['p']:.3f}" for row in table.values() for k in row if k.startswith("p_late_above")}
    found = re.findall(r"\b([Pp]) = (\d\.\d+(?:(?:, | and )\d\.\d+)*)", text)
    for which, values in found:
        for value in re.findall(r"\d\.\d+", values):
            assert value in (poi if which == "P" else mw), f"{which} = {value} is not in the report"
    return len(found)


def section(path: str, start: str, end: str) -> str:
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    i = text.index(start)
    return text[i:text.index(end, i + len(start))]


def test_readme_plasticity_numbers_are_the_report(committed):
    bullet = section("README.md", "- **Loss of plasticity**", "\n- **")
    table = committed["table"]
    assert "t interval" in bullet and "Welch" in bullet  # the interval methods named
    assert check_triples(bullet, table) >= 10 and check_p_values(bullet, table) >= 2
    # every other decimal number of the bullet is a number of the report at its printed precision
    rest = re.sub(r"\b[Pp] = \d\.\d+(?:(?:, | and )\d\.\d+)*", "", TRIPLE.sub("", bullet))
    numbers = _numbers(table)
    allowed = {f"{COLLAPSED_ENTROPY}"}
    for s in re.findall(r"(?<![\w.])\d+\.\d+", rest):
        d = _decimals(s)
        assert s in allowed or any(f"{abs(x):.{d}f}" == s for x in numbers), f"README: {s} is not in report.json"


def test_readme_plasticity_claims_are_the_report(committed):
    """Each number of README's plasticity bullet, rendered from report.json where the bullet puts it."""
    bullet = " ".join(section("README.md", "- **Loss of plasticity**", "\n- **").split())
    t = committed["table"]

    def c(method: str, key: str, sign: float = 1.0) -> str:
        d = t[method][key]
        lo, hi = sorted((sign * d["ci"][0], sign * d["ci"][1]))
        return cell(sign * d["estimate"], lo, hi)

    def mw(method: str, baseline: str = "PPO") -> str:
        return f"{t[method][f'p_late_above_{baseline}']['mann_whitney']['p']:.3f}"

    keep = ("PPO_LN", "PPO_Parseval", "PPO_NaP_torso", "PPO_L2Init_1e-4")
    part = ("PPO_reset", "PPO_SP", "PPO_L2Init_1e-3", "PPO_ReDo")
    not_restored = ("PPO_NSAdam", "PPO_CBP", "PPO_CBP_scaled", "PPO_TRAC", "PPO_TRAC_ref")
    gaps = sorted(-t[m]["late_minus_PPO_fresh"]["estimate"] for m in keep)
    expected = [
        f"falls from {c('PPO', 'early')} in regimes 1-3 to {c('PPO', 'late')} in regimes 6-10. The drop is "
        f"{c('PPO', 'drop')}",
        f"every regime to {c('PPO_fresh', 'late')}: PPO's late regimes are {c('PPO_fresh', 'late_minus_PPO')} below it "
        f"(p = {mw('PPO_fresh')},",
        f"PPO reaches {t['PPO']['late_final_quarter']['estimate']:.1f} where a fresh network reaches "
        f"{t['PPO_fresh']['late_final_quarter']['estimate']:.1f}",
        "late " + ", ".join(c(m, "late") for m in keep[:3]) + f" and {c(keep[3], 'late')}",
        f"(P = 1.00, p = {mw(keep[0])}) and {gaps[0]:.2f}-{gaps[-1]:.2f} below a fresh network",
        f"(LayerNorm {c('PPO_LN', 'late_minus_PPO_fresh')}, L2 Init {c('PPO_L2Init_1e-4', 'late_minus_PPO_fresh')})",
        f"(early {t['PPO_LN']['early']['estimate']:.2f} and {t['PPO_L2Init_1e-4']['early']['estimate']:.2f}, PPO's "
        f"{t['PPO']['early']['estimate']:.2f}); Parseval and NaP do not ({t['PPO_Parseval']['early']['estimate']:.2f}, "
        f"{t['PPO_NaP_torso']['early']['estimate']:.2f})",
        "late " + ", ".join(f"{t[m]['late']['estimate']:.2f}" for m in part[:3]) +
        f" and {t[part[3]]['late']['estimate']:.2f}, above PPO's with p = " + ", ".join(mw(m) for m in part[:3]) +
        f" and {mw(part[3])}",
        f"late returns {c('PPO_NSAdam', 'late')}, {c('PPO_CBP', 'late')} ({c('PPO_CBP_scaled', 'late')}), "
        f"{c('PPO_TRAC', 'late')} and {c('PPO_TRAC_ref', 'late')}",
        f"entropy < {COLLAPSED_ENTROPY} nats in {c('PPO_CReLU', 'collapsed')} of its updates",
        f"late return, {c('PPO_CReLU', 'late')}, is below PPO's, though not significantly: "
        f"{c('PPO_CReLU', 'late_minus_PPO')}",
        f"learns no regime (late {c('PPO_L2Init', 'late')})",
        f"did not learn at all (late {c('PPO_NaP', 'late')})",
    ]
    for text in expected:
        assert text in bullet, f"README's plasticity bullet should say: {text}"
    # the claims the numbers carry
    for m in keep + part[:1] + part[2:3]:
        assert t[m]["p_late_above_PPO"]["estimate"] == 1.0 and mw(m) == "0.004", m  # above PPO in every pair
    for m in keep:
        lo, hi = t[m]["late_minus_PPO_fresh"]["ci"]
        assert lo < 0 < hi, m  # "a difference whose interval includes 0"
    for m in not_restored + ("PPO_CReLU",):
        lo, hi = t[m]["late_minus_PPO"]["ci"]
        assert lo < 0 < hi, m  # not different from PPO
    assert {i["label"] for i in committed["post_hoc"]} == {"PPO_NaP_torso", "PPO_L2Init_1e-3", "PPO_L2Init_1e-4",
                                                            "PPO_TRAC_ref"}
    assert "chosen on these same 5 seeds" in bullet and "Post hoc" in bullet


def test_results_plasticity_intervals_are_the_report(committed):
    text = open(os.path.join(ROOT, "docs", "results", "plasticity.md"), encoding="utf-8").read()
    text = text[text.index("## Loss of plasticity: PPO on 10 permuted"):]  # the measurements, below the report
    assert check_triples(text, committed["table"]) >= 60 and check_p_values(text, committed["table"]) >= 5
    assert "[95% Student-t interval]" in text and "[95% Welch interval]" in text and "bootstrap CI" not in text


# ---------------------------------------------------------------------------------------------------------------------
# a tiny real experiment, the shipped experiment file, bad input
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A real experiment folder: PPO and PPO + S&P, seeds 1 and 2, 4 permuted Breakout regimes of 2,048 steps,
    trained by the training script under the launcher's run names."""
    folder = tmp_path_factory.mktemp("plasticity_experiment")
    cfg = {"env_id": "MinAtar/Breakout-v1", "backend": "MinAtar", "num_envs": 8, "num_steps": 32,
           "num_minibatches": 2, "update_epochs": 1, "learning_rate": 5e-3, "anneal_lr": False,
           "total_timesteps": 8192, "max_episode_steps": 200, "torch_threads": 1, "progress_bar": False,
           "modification_factory": "SequentialModificationFactory",
           "modification_factory_kwargs": {"num_total_steps": 8192, "modifications": [
               f"permute_obs={k} permute_actions={k} sticky_action_prob=0" for k in (1, 2, 3, 4)],
               "switching_thresholds": [2048, 4096, 6144]}}
    path = write_config(folder, cfg, "cfg.json")
    for i, (method, flags) in enumerate([("PPO", []), ("PPO_SP", ["--shrink_and_perturb"])] * 2):
        seed = 1 + i // 2
        run_main("continual_training_example.py", "--config", str(path), "--seed", str(seed),
                 "--runs_dir", str(folder / "runs"), "--run_name", f"{i:03d}_{method}_seed={seed}", *flags)
    return folder


def test_report_on_a_tiny_real_experiment(tiny_folder, tmp_path):
    out = tmp_path / "report"
    # in this process: the command line as a process is test_bad_input_from_the_command_line's
    report_main(["plasticity", str(tiny_folder), "--out", str(out), "--early", "1", "--late", "1"])
    report = json.loads((out / "report.json").read_text())
    assert set(report["table"]) == {"PPO", "PPO_SP"}
    for row in report["table"].values():
        assert row["n"] == 2 and row["seeds"] == [1, 2]
    for run in report["runs"]:
        assert run["done"] and len(run["regimes"]) == 4 and len(run["diagnostics"]) >= 3  # one per switch at least
        assert [v[0] for v in run["visits"]] == [normalize_modification(f"permute_obs={k} permute_actions={k} "
                                                                        "sticky_action_prob=0") for k in (1, 2, 3, 4)]
        assert run["drop"] == pytest.approx(run["regimes"][0] - run["regimes"][-1])
    for name in ("report.md", "regimes.png", "drop.png", "diagnostics.png"):
        assert (out / name).stat().st_size > 0
    assert "| PPO | 2 |" in (out / "report.md").read_text()
    assert "- Code: " in (out / "report.md").read_text()  # the runs' revision, from their start records
    # the stored report rebuilds the same table
    again = R.report(from_report=str(out / "report.json"), figures=False)
    assert again["table"] == report["table"]


def test_shipped_experiment_every_entry_validates_with_one_budget(tmp_path):
    experiment = load_experiment(os.path.join(ROOT, EXPERIMENT))
    seeds = sorted({e.config["seed"] for e in experiment.entries})
    methods = {R.parse_run_name(e.name)[0] for e in experiment.entries}
    # method by method, seeds varying fastest; plain PPO and the fresh-network reference first
    assert [R.parse_run_name(e.name) for e in experiment.entries[:6]] == [("PPO", s) for s in range(1, 6)] + [
        ("PPO_fresh", 1)]
    assert seeds == [1, 2, 3, 4, 5] and len(experiment.entries) == 5 * len(methods)
    assert {"PPO", "PPO_NSAdam", "PPO_CBP", "PPO_SP", "PPO_ReDo", "PPO_L2Init", "PPO_LN", "PPO_CReLU", "PPO_reset",
            "PPO_Parseval", "PPO_NaP", "PPO_TRAC"} <= methods
    labels = R.read_labels(os.path.join(ROOT, EXPERIMENT))
    assert {i["label"] for i in labels["post_hoc"]} <= methods and all(i["added"] for i in labels["post_hoc"])
    assert {i["label"] for i in labels["defaults_chosen_here"]} <= methods
    chosen = next(e for e in experiment.entries if R.parse_run_name(e.name)[0] == "PPO_L2Init_1e-4")
    assert chosen.config["l2_init_coef"] == Args.l2_init_coef  # the arm whose value became the default
    budgets = {(e.config["total_timesteps"], json.dumps(e.config["modification_factory_kwargs"], sort_keys=True))
               for e in experiment.entries}
    assert len(budgets) == 1  # the same sequence and budget for every method
    kwargs = experiment.entries[0].config["modification_factory_kwargs"]
    regimes = kwargs["modifications"]
    assert len(regimes) >= 10 and len(kwargs["switching_thresholds"]) == len(regimes) - 1
    # every regime a different (channel, action) permutation pair of Breakout (4 channels, 3 actions)
    pairs = set()
    for m in regimes:
        tokens = dict(t.split("=") for t in m.split())
        pairs.add((tuple(minatar_permutation(int(tokens["permute_obs"]), 4)),
                   tuple(minatar_permutation(int(tokens["permute_actions"]), 3))))
    assert len(pairs) == len(regimes)
    one_per_method = [e for e in experiment.entries if e.config["seed"] == 1]
    assert len(one_per_method) == len(methods)
    validate(type(experiment)(**{**experiment.__dict__, "entries": one_per_method}), str(tmp_path / "runs"))


@pytest.mark.parametrize("argv,message", [
    (["{missing}"], "is not a folder"),
    (["{empty}"], "no run with"),
    (["{empty}", "--late", "0"], "--late"),
    (["{empty}", "--experiment", "{missing}/experiment.json"], "no such experiment file"),
    (["--from-report", "{missing}/report.json"], "no such file"),
    (["--from-report", "{not_a_report}"], "no per-run records"),
    (["--from-report", "{broken}"], "not a readable JSON"),
    ([], "one of the two"),
    (["{empty}", "--from-report", "{not_a_report}"], "one of the two"),
])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, capsys, argv, message):
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    (tmp_path / "not_a_report.json").write_text(json.dumps({"table": {}}))
    (tmp_path / "broken.json").write_text("{")
    argv = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty", not_a_report=tmp_path / "not_a_report.json",
                     broken=tmp_path / "broken.json") for a in argv]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        report_main(["plasticity", *argv, "--out", str(out)])
    assert e.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert not captured.out and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not out.exists()


def test_bad_input_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "continual.report", "plasticity", "--from-report",
                           str(tmp_path / "nope.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'nope.json'}: no such file (give a report.json "
                                                "written by this report)"]
