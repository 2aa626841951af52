"""bench/overhead.py (one script for every method's overhead): its analyses on hand-made iteration records, the
summary table's ratios, and bad input (one line after the usage, exit 2, before any run)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import BENCH, ROOT, load_bench

overhead = load_bench("overhead")


def it(step, t, **kw):
    return {"kind": "iteration", "global_step": step, "time": t, **kw}


def test_switch_timings_after_the_switch_iteration():
    # PPO-sized iterations of 1024 steps; the switch at 1024 falls in the 2nd iteration (ends at 2048, 5 s long),
    # the steady ones after it take 2, 2 and 4 s
    its = [it(1024, 10.0), it(2048, 15.0), it(3072, 17.0), it(4096, 19.0), it(5120, 23.0)]
    out = overhead.switch_timings(its)
    assert out == {"sps": 3 * 1024 / 8.0, "switch_s": 5.0 - 2.0}


def test_pnc_analysis_leaves_out_the_first_two_and_the_switch_iteration():
    rec = [it(320 * k, 0.0, **{"time/iteration_s": s, "time/learn_s": 0.1 * k, "time/actor_utilisation": 0.5,
                                "pnc/compress": float(k % 2)})
           for k, s in zip(range(1, 7), (9.0, 9.0, 1.0, 6.0, 2.0, 2.0))]
    rec.append({"kind": "switch", "global_step": 960})  # the 4th iteration (steps 960-1280) holds the switch
    out = overhead.pnc_analysis(rec)
    assert out["sps"] == 320 * 3 / 5.0  # iterations 3, 5, 6
    assert out["switch_s"] == 6.0 - 2.0  # minus the median steady iteration
    assert out["learn_s_per_update"] == pytest.approx(0.5)
    assert out["learn_s_progress"] == pytest.approx(0.6) and out["learn_s_compress"] == pytest.approx(0.4)


def test_full_run_rounds_by_hand():
    # 10 iterations of 100 steps, every 250: step 0, the first ends at or after 250, 500, 750, and the end
    assert overhead.full_run_rounds(1000, 250, 100) == 5
    assert overhead.full_run_rounds(1000, 0, 100) == 2


def test_table_ratios_to_each_kinds_baseline(capsys):
    kinds = overhead.Kinds({"a": [], "a+x": [], "b": []}, {"a": "a", "a+x": "a", "b": "b"})
    runs = {"a": [{"sps": 100.0, "s": 1.0}, {"sps": 200.0, "s": 3.0}], "a+x": [{"sps": 50.0, "s": 2.0},
            {"sps": 200.0, "s": 2.0}], "b": [{"sps": 10.0, "s": 0.0}, {"sps": 30.0, "s": 0.0}]}
    out = overhead.table("t", kinds, runs)
    assert out["median"]["a+x"] == {"sps": 125.0, "s": 2.0}
    assert out["ratio"] == {"a": 1.0, "a+x": 125.0 / 150.0, "b": 1.0}
    assert out["paired_ratio"]["a+x"] == 0.75  # median of 0.5 and 1.0
    assert "a+x" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [[], ["variants", "--variant", "noequals"], ["cbp", "--repeats", "x"]])
def test_bad_input_exits_2_before_any_run(tmp_path, argv):
    r = subprocess.run([sys.executable, f"{BENCH}/overhead.py", *argv, "--json", str(tmp_path / "o.json")] if argv
                       else [sys.executable, f"{BENCH}/overhead.py"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == ""
    assert re.match(r"overhead\.py( cbp)?: error: ", r.stderr.splitlines()[-1])
    assert list(tmp_path.iterdir()) == []
