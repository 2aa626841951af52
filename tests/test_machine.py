"""continual/machine.py: the machine description against /proc/cpuinfo read here independently, the launch records
and how a run's start records get their machines from them (the C-CHAIN runs' code, pinned to c127f01, writes start
records without one)."""

from __future__ import annotations

import json
import os

import pytest

from continual import machine as M
from continual.launch import ray_runner


def _proc_cpuinfo() -> tuple[str, list[str]]:
    text = open("/proc/cpuinfo").read()
    model = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags"))
    return model, flags


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo") or "model name" not in open("/proc/cpuinfo").read(),
                    reason="an x86 Linux /proc/cpuinfo")
def test_machine_names_the_cpu_its_vector_isa_and_the_usable_cores():
    model, flags = _proc_cpuinfo()
    m = M.machine()
    assert m["cpu"] == model
    assert m["isa"] == [f for f in M.ISA_FLAGS if f in flags] and ("avx2" in m["isa"]) == ("avx2" in flags)
    assert m["cores"] == len(os.sched_getaffinity(0))
    assert M.describe(m) == f"{model} ({' '.join(m['isa']) or 'no listed vector ISA'}; {m['cores']} cores)"
    assert M.describe(None) == "not recorded"


def test_machine_reads_an_arm_cpuinfo(tmp_path, monkeypatch):
    """aarch64 Linux: no "model name" on many kernels, "Features" in place of "flags"."""
    arm = tmp_path / "cpuinfo"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes sve\nCPU part\t: 0xd0c\n\n"
                   "processor\t: 1\nFeatures\t: fp asimd\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(arm if p == "/proc/cpuinfo" else p, *a, **k))
    m = M.machine()
    assert m["isa"] == ["asimd", "sve"] and m["cpu"]  # the first processor's features; platform's name for the cpu


def _launch(path, t, cpu):
    with open(path, "a") as f:
        f.write(json.dumps({"kind": "launch", "time": t, "machine": {"cpu": cpu, "isa": [], "cores": 2}}) + "\n")


def test_each_start_gets_the_machine_of_the_newest_launch_at_or_before_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _launch(run / M.LAUNCHES, 20.0, "B")  # written out of order: read sorted by time
    _launch(run / M.LAUNCHES, 10.0, "A")
    (run / M.LAUNCHES).open("a").write('{"kind": "launch", "ti')  # cut by a crash
    own = {"cpu": "C", "isa": ["avx2"], "cores": 4}
    starts = [{"kind": "start", "time": 5.0}, {"kind": "start", "time": 10.0}, {"kind": "start", "time": 19.9},
              {"kind": "start", "time": 25.0}, {"kind": "start", "time": 30.0, "machine": own}]
    records = [starts[0], {"kind": "iteration", "time": 6.0}, *starts[1:], {"kind": "episode", "time": 31.0}]
    got = M.starts_with_machines(str(run), records)
    assert [(s.get("machine") or {}).get("cpu") for s in got] == [None, "A", "A", "B", "C"]
    assert starts[1] == {"kind": "start", "time": 10.0}  # the caller's records are not changed
    assert M.starts_with_machines(str(tmp_path / "no-launches"), records) == starts


def test_a_launch_record_is_read_back_as_this_machine(tmp_path):
    M.record_launch(str(tmp_path), 100.0, "abc123")
    M.record_launch(str(tmp_path), 200.0, "abc123")
    recs = [json.loads(line) for line in (tmp_path / M.LAUNCHES).read_text().splitlines()]
    assert [r["time"] for r in recs] == [100.0, 200.0] and recs[0]["node"] == "abc123"
    assert recs[0]["machine"] == M.machine() and recs[0]["pid"] == os.getpid()
    assert M.starts_with_machines(str(tmp_path), [{"kind": "start", "time": 150.0}])[0]["machine"] == M.machine()


def test_launches_are_recorded_once_each_run_directory_exists_and_a_failed_write_only_notes_it(tmp_path, monkeypatch):
    """A new run's directory is made by the run itself, after the launch: it is recorded once it appears; a record
    that cannot be written (a full disk) is a line in the log, and the run goes on."""
    class Log:
        lines: list = []

        def write(self, data: bytes) -> None:
            self.lines.append(data.decode())

    log = Log()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    left = ray_runner._record_launches([str(a), str(b)], 1.0, "n", log)
    assert left == [str(b)] and len((a / M.LAUNCHES).read_text().splitlines()) == 1
    b.mkdir()
    assert ray_runner._record_launches(left, 1.0, "n", log) == [] and (b / M.LAUNCHES).exists()

    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:5]))  # the disk fills mid-line
    assert ray_runner._record_launches([str(a)], 2.0, "n", log) == []
    monkeypatch.setattr(os, "write", real_write)
    assert log.lines == [f"=== launch: no space left on device writing {a / M.LAUNCHES}; the launch is not recorded; "
                         "the run goes on\n"]
    assert len((a / M.LAUNCHES).read_text().splitlines()) == 1  # the cut line taken back off
