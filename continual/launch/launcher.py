"""Run an experiment's entries as Ray tasks, resumably, with a live table; then aggregate them.

    python -m continual.launch EXPERIMENT.json [--folder DIR] [--address ADDR] [--resume-id N] [--max_retries N]

Every entry is the ordinary training CLI (`continual_training_example.py`) in a subprocess of a Ray task, with its
own run directory under the experiment folder (see `continual.launch.queue` for the layout). Re-running the same
command continues the experiment: finished entries are skipped, unfinished ones resume from their newest
checkpoint. A run that exits non-zero is retried from its checkpoint up to --max_retries times, then reported as
failed (a run refused with exit code 2, bad input, is not retried). Damaged files are not bad input: a run stopped by
a full disk (exit 1) is retried, and every retry resumes from the newest checkpoint that reads (corrupt newer ones are
skipped; a run with none whole starts again, its remains kept as `<entry>.incomplete<k>`; --restart_failed does the
same for the entries an earlier launch reported failed, whose checkpoints may be whole but unusable). A run lost with
its Ray node is resumed elsewhere without counting as a failure. Several launchers may share one experiment folder
(also from several machines, the folder on shared storage): each entry is run by one of them.

The first launch records the experiment file's sha256, git revision and declarations in the folder
(`declarations.json`, continual/launch/declarations.py); a later launch whose file declares otherwise, or renames or
removes an entry that was started, is refused (entries may be appended; a new method must be listed in post_hoc).
`--code REV` pins the folder's runs to a git revision, run from a worktree of it at every later launch
(continual/launch/code.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
import signal
import sys
import time
from typing import Any, Callable, Optional, Sequence, Union

import tyro
from rich.console import Console
from rich.live import Live
from rich.table import Table

from continual.config.loading import cli
from continual.errors import UserError, one_line
from continual.evaluation import metrics, plots
from continual.io import atomic_write_json
from continual.launch import archive, carry, code, declarations, ray_runner
from continual.launch.experiment import Entry, Experiment, load_experiment, run_config, validate
from continual.launch.queue import DONE, FAILED, Claim, Queue, set_aside
from continual.training.checkpoint import newest_whole_step

SCRIPT = "continual_training_example.py"
LOST_LIMIT = 5  # runs lost with their node, per entry and launcher, before it counts as failed
USER_ERROR_EXIT = 2  # the training CLI's exit code for bad input: retrying cannot help


@dataclasses.dataclass
class LaunchArgs:
    experiment: tyro.conf.Positional[str]
    """the experiment file (JSON: flags, grid and/or runs; see continual/launch/experiment.py)"""
    folder: Optional[str] = None
    """the experiment folder (default: experiments/<name>); on a cluster, on storage every node sees"""
    address: Optional[str] = None
    """join this Ray cluster ("auto", or host:port of its head) instead of starting Ray on this machine"""
    script: Optional[str] = None
    """the training script (default: the experiment's "script", else continual_training_example.py in the current
    folder, beside the experiment file or in the repository)"""
    resume_id: Optional[int] = None
    """run or resume entry N alone (entries are numbered from 0 in the order --dry_run lists them)"""
    entries: Optional[tuple[int, ...]] = None
    """run or resume only these entries (numbers as --dry_run lists them), e.g. the first seeds of every arm before
    the rest: the others stay as they are, their carries included, for a later launch without the flag"""
    max_retries: Optional[int] = None
    """times a failed run is restarted from its checkpoint before it is reported (default: the file's, else 2)"""
    retry_failed: bool = False
    """run entries that an earlier launch reported as failed again"""
    restart_failed: bool = False
    """run entries that an earlier launch reported as failed again from step 0, each run directory first kept aside as
    runs/<entry>.incomplete<k> (which the reports leave out): for runs whose checkpoints cannot be resumed"""
    num_cpus: Optional[int] = None
    """CPUs of the local Ray instance (default: all); runs at once = CPUs / the experiment's cpus_per_run"""
    object_store_mb: int = 200
    """object store of the local Ray instance (runs exchange nothing through it)"""
    stale_after: float = 120.0
    """seconds without a heartbeat after which another host's claim on an entry is taken over"""
    aggregate: bool = True
    """when every entry is done: python -m continual.evaluation.metrics and .plots over the runs (needs evaluation:
    --eval_every, --eval_at_switches or --eval_final_only in the runs' flags)"""
    archive: Optional[str] = None
    """keep each finished run here too, without its checkpoints (continual/launch/archive.py; 0.1-1.6 MB a 2M-step
    MinAtar run: a folder in a git repository); a launch restores the entries archived there first and runs only the
    others. As it stops, the launcher carries each unfinished run's newest checkpoint and records to its carry/
    (continual/launch/carry.py), from which a launch into a new folder resumes them: commit both at a session's end"""
    carry_every: float = 30.0
    """with --archive: minutes between carries of the unfinished runs while they run (0: only as the launcher stops), so
    that a machine lost without a stop (a session cut off, a kill) costs a new machine at most this much training"""
    code: Optional[str] = None
    """pin the folder's runs to this git revision: they run its script from a worktree of it (made under
    ~/.cache/continual/code), and later launches of the folder (or of a new folder restored from its archive and carry)
    run it again without the flag (continual/launch/code.py)"""
    code_change: bool = False
    """run other code than the folder's pinned revision (--code REV, or --script), recorded in its declarations
    record; without it, such a launch is refused"""
    dry_run: bool = False
    """check the experiment and list its entries, then exit (creates nothing)"""


def seeds_script(script: str) -> str:
    """agents/dqn_seeds.py of the training script's checkout (seeds_per_process)."""
    return os.path.join(os.path.dirname(script), "agents", "dqn_seeds.py")


def find_script(given: Optional[str], experiment_path: str) -> str:
    if given:
        if not os.path.isfile(given):
            raise UserError(f"script: {given!r} does not exist")
        return os.path.abspath(given)
    here = os.path.dirname(os.path.abspath(experiment_path))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [os.getcwd()]
    while True:
        candidates.append(here)
        if os.path.dirname(here) == here:
            break
        here = os.path.dirname(here)
    for d in [*candidates, repo]:
        path = os.path.join(d, SCRIPT)
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise UserError(f"script: no {SCRIPT} in the current folder, beside the experiment file or in the repository; "
                    f"pass --script")


# --- progress --------------------------------------------------------------------------------------------------------


def read_progress(run_dir: str, rate: bool = False) -> dict:
    """Last step, SPS and episode return of a run, from the tail of its metrics.jsonl; with `rate`, also its recent
    steps/s over the tail's iterations since its last (re)start, which the start-up does not lower (the SPS it logs
    counts from the start), nor a pause: gaps between iterations over 5x the median gap (a SIGSTOP while tests ran)
    are left out."""
    out: dict = {}
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            out["total"] = json.load(f).get("resolved_total_timesteps")
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return out
    timed, since_start = [], rate  # (step, time) of the iterations since the last start, newest first
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("kind") == "iteration":
            if "step" not in out:
                out["step"], out["sps"] = rec.get("global_step"), rec.get("charts/SPS")
            if since_start and all(isinstance(rec.get(k), (int, float)) for k in ("global_step", "time")):
                timed.append((rec["global_step"], rec["time"]))
        elif rec.get("kind") == "start":
            since_start = False
        elif rec.get("kind") == "episode" and "return" not in out:
            out["return"] = rec.get("return")
        if "step" in out and "return" in out and not since_start:
            break
    gaps = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(timed, timed[1:])]  # (steps, seconds), newest first
    if gaps:
        usual = 5 * sorted(g[1] for g in gaps)[len(gaps) // 2]
        kept = [g for g in gaps if g[1] <= usual]
        seconds = sum(g[1] for g in kept)
        if seconds > 0:
            out["rate"] = sum(g[0] for g in kept) / seconds
    return out


def time_left(p: dict) -> str:
    """", ~H h left" at the run's recent steps/s (read_progress: over the iterations in its metrics' tail since its
    last start, else its last SPS, which counts from the start), for planning sessions; "" when it cannot be told."""
    step, total, sps = p.get("step"), p.get("total"), p.get("rate", p.get("sps"))
    if not all(isinstance(v, (int, float)) for v in (step, total, sps)) or sps <= 0 or step >= total:
        return ""
    return f", ~{(total - step) / sps / 3600:.1f} h left"


def last_error(log_path: str) -> str:
    """The run's `error: ...` line, else its last line of output."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    attempt = [ln for ln in lines if ln and not ln.startswith("=== launch:")]
    errors = [ln for ln in attempt if ln.startswith("error:")]
    return one_line(errors[-1] if errors else attempt[-1] if attempt else "")[:300]


# --- the launcher ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Job:
    """One Ray task: one entry, or a group of entries of one arm that differ by seed (seeds_per_process), run by
    agents/dqn_seeds.py. The launcher holds every entry's claim; the task holds none."""
    entries: list[Entry]
    claims: list[Claim]
    ref: object = None
    where: str = ""
    started: float = 0.0
    lost: int = 0
    resumed: bool = False  # its last submission resumed checkpoints

    @property
    def entry(self) -> Entry:  # the one the job is known by: its log, its stop file
        return self.entries[0]


def omp_wait_policy() -> str:
    """The OpenMP wait policy of the runs: the launcher's own OMP_WAIT_POLICY, else PASSIVE.

    A launcher shares its cores: runs side by side, evaluations, other jobs. Under OpenMP's default an idle thread spins
    before it sleeps, and a parallel region waits for its slowest thread; with torch's 2 threads on 2 cores and one
    more busy process, a Nature-CNN update took 9-10 s where it took 0.9-1.0 s alone (the Freeway robustness runs'
    `time/learn_s`, 2026-11-30), and a 32-sample minibatch step 410 ms against 20 ms with PASSIVE (2 threads, the
    same load). The wait policy changes when threads sleep, not what they compute."""
    return os.environ.get("OMP_WAIT_POLICY") or "PASSIVE"


class Launcher:
    def __init__(self, exp: Experiment, entries: Sequence[Entry], queue: Queue, script: str, max_retries: int,
                 retry_failed: bool, console: Console, kept: Optional[Queue] = None, restart_failed: bool = False,
                 configs: Optional[dict] = None, carry_every: float = 0.0):
        self.exp, self.entries, self.queue, self.script, self.kept = exp, list(entries), queue, script, kept
        # with an archive: the unfinished entries' configs, carried every `carry_every` seconds (0: only at the stop)
        self.configs, self.carry_every, self.carried_at = configs or {}, carry_every, time.time()
        self.max_retries, self.retry_failed, self.console = max_retries, retry_failed or restart_failed, console
        # --restart_failed: the entries an earlier launch reported failed start from step 0, once
        self.restarting = {e.name for e in self.entries
                           if restart_failed and queue.status(e.name).get("state") == FAILED}
        self.jobs: dict[str, Job] = {}  # by the name of its first entry
        self.returned: list[Entry] = []  # entries of a group given back to the loop (a claim taken over)
        # seeds_per_process: entries whose configurations differ only by their seed are one arm
        self.arm = {e.name: json.dumps({k: v for k, v in run_config(e, exp.name).items() if k != "seed"},
                                       sort_keys=True) for e in self.entries}
        self.note: dict[str, str] = {}  # entry -> what this launcher knows (other launcher, skipped, ...)
        self.task = ray_runner.remote_run(exp.cpus_per_run, exp.gpus_per_run)
        paths = [os.path.dirname(script)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "OMP_WAIT_POLICY": omp_wait_policy(),
                    **{k: v for k, v in os.environ.items() if k.startswith("WANDB_")}}

    # --- one entry ---------------------------------------------------------------------------------------------
    def resume_step(self, entry: Entry) -> Optional[int]:
        """The step its newest whole checkpoint is at, None for an entry that starts afresh. Damaged files (a full
        disk, a partial copy) are not bad input: resume from the newest whole checkpoint (the run skips newer corrupt
        ones itself); with none whole, start again. An entry --restart_failed restarts starts afresh once."""
        if entry.name in self.restarting:
            return None
        return newest_whole_step(self.queue.run_dir(entry.name))

    def resumable(self, entry: Entry) -> bool:
        return self.resume_step(entry) is not None

    def argv(self, entries: Sequence[Entry]) -> list[str]:
        """One entry: the training script, resumed from its checkpoint or started; several of one arm:
        agents/dqn_seeds.py beside it, each seed in the run directory its entry would have, all started or all
        resumed (their newest checkpoints at one step)."""
        if self.resumable(entries[0]):
            if len(entries) == 1:
                return [self.script, "--resume", self.queue.run_dir(entries[0].name)]
            return [seeds_script(self.script), "--resume", *(self.queue.run_dir(e.name) for e in entries)]
        for entry in entries:
            # started but lost before its first whole checkpoint, or --restart_failed: start again, keep the remains
            set_aside(self.queue.run_dir(entry.name))
            self.restarting.discard(entry.name)
            if self.kept is not None:  # a carry of the run set aside would resume it on the next machine
                carry.drop(self.kept.folder, entry.name)
        first = entries[0]
        where = ["--config", self.queue.config_path(first.name), "--runs_dir",
                 os.path.dirname(self.queue.run_dir(first.name))]
        if len(entries) == 1:
            return [self.script, *where, "--run_name", first.name]
        # the entries' configurations differ only by the seed: the first's with each seed is each one's
        return [seeds_script(self.script), "--seeds", *(str(e.config["seed"]) for e in entries),
                "--run_names", *(e.name for e in entries),
                "--configs", *(self.queue.config_path(e.name) for e in entries), *where]

    def stop_path(self, entry: Entry) -> str:
        return os.path.join(self.queue.dir, entry.name + ".stop")

    def submit(self, job: Job) -> None:
        argv = self.argv(job.entries)
        if os.path.exists(self.stop_path(job.entry)):
            os.unlink(self.stop_path(job.entry))
        for e in job.entries[1:]:  # the group's output is in its first entry's log
            with open(self.queue.log_path(e.name), "a") as log:
                log.write(f"\n=== launch: {time.strftime('%Y-%m-%d %H:%M:%S')} with {len(job.entries)} seeds in one "
                          f"process: its output is in {self.queue.log_path(job.entry.name)}\n")
        job.ref = self.task.remote(argv, self.queue.log_path(job.entry.name), self.env, self.queue.folder,
                                   self.stop_path(job.entry), [self.queue.run_dir(e.name) for e in job.entries])
        job.started, job.where, job.resumed = time.time(), "", "--resume" in argv
        for e in job.entries:
            self.queue.set_status(e.name, state="running", resumed="--resume" in argv)

    def split(self, job: Job) -> list[Job]:
        """A group's entries as jobs of one entry each, with their claims (one entry's job: itself): after a group
        fails, each entry goes on alone, resumed from its own checkpoint (agents/dqn_seeds.py writes dqn.py's)."""
        if len(job.entries) == 1:
            return [job]
        del self.jobs[job.entry.name]
        jobs = [Job([e], [c], where=job.where, lost=job.lost) for e, c in zip(job.entries, job.claims)]
        self.jobs.update((j.entry.name, j) for j in jobs)
        return jobs

    def finish(self, job: Job) -> None:
        """The task of `job` returned or failed: done, retry, or failed."""
        import ray

        try:
            res = ray.get(job.ref)
        except ray.exceptions.RayError as e:  # the worker or its node died: not the run's fault
            job.lost += 1
            msg = one_line(str(e).splitlines()[0] if str(e) else type(e).__name__)[:200]
            for one in self.split(job):
                if one.lost <= LOST_LIMIT:
                    self.queue.set_status(one.entry.name, state="lost", error=f"ray: {msg}")
                    self.submit(one)
                else:
                    self.give_up(one, f"lost {one.lost} times: {msg}", None)
            return
        job.where = ray_runner.node_of(res)
        rc = res["returncode"]
        if rc == 0:
            for e in job.entries:
                self.queue.set_status(e.name, state=DONE, returncode=0, where=job.where, error="")
            self.release(job)
            for e in job.entries:
                self.keep(e.name)
            return
        error = last_error(self.queue.log_path(job.entry.name)) or f"exit code {rc}"
        for one in self.split(job):
            name = one.entry.name
            attempts = int(self.queue.status(name).get("attempts", 0)) + 1
            self.queue.set_status(name, attempts=attempts, returncode=rc, error=error)
            if rc == USER_ERROR_EXIT and len(job.entries) > 1 and job.resumed:
                # a group resumed together and refused (checkpoints that were not at one step after all): each goes
                # on alone, this attempt not counted
                self.queue.set_status(name, attempts=attempts - 1)
                self.submit(one)
            elif rc == USER_ERROR_EXIT or attempts > self.max_retries:
                self.give_up(one, error, rc)
            else:
                self.submit(one)

    def keep(self, name: str) -> None:
        """Archive a finished entry (--archive); a failure is noted, not fatal: the next launch archives it."""
        if self.kept is None:
            return
        try:
            archive.archive_entry(self.queue, self.kept, name)
            if archive.archived(self.kept, name):
                carry.drop(self.kept.folder, name)  # finished: its carry is out of date
        except OSError as e:
            self.note[name] = f"not archived: {one_line(str(e))[:120]}"

    def give_up(self, job: Job, error: str, rc: Optional[int]) -> None:
        for e in job.entries:
            self.queue.set_status(e.name, state=FAILED, error=error, returncode=rc)
        self.release(job)

    def release(self, job: Job) -> None:
        for claim in job.claims:
            claim.release()
        del self.jobs[job.entry.name]

    # --- the loop ----------------------------------------------------------------------------------------------
    def settled(self, entry: Entry) -> bool:
        st = self.queue.status(entry.name).get("state")
        return st == DONE or (st == FAILED and not self.retry_failed)

    def running(self) -> set[str]:
        return {e.name for job in self.jobs.values() for e in job.entries}

    def try_claim(self, entry: Entry) -> Union[Claim, bool]:
        """The entry's claim; False when another launcher holds it, True when it is settled meanwhile."""
        claim = self.queue.claim(entry.name)
        if claim is None:
            owner = self.queue.owner(entry.name) or {}
            self.note[entry.name] = f"other launcher ({owner.get('host', '?')}:{owner.get('pid', '?')})"
            return False
        if self.settled(entry):  # finished by another launcher since we looked
            claim.release()
            return True
        return claim

    def group_size(self, waiting: Sequence[Entry], free: int) -> int:
        """seeds_per_process, but no more than keeps every free slot busy (on a cluster with more slots than groups,
        smaller groups finish sooner)."""
        running = self.running()
        left = sum(e.name not in running and not self.settled(e) for e in waiting)
        return min(self.exp.seeds_per_process, -(-left // max(free, 1)))

    def try_start(self, entry: Entry, size: int = 1) -> bool:
        """Claim and run `entry`, with up to size - 1 other pending entries of its arm (seeds_per_process)."""
        claim = self.try_claim(entry)
        if isinstance(claim, bool):
            return claim
        members, claims = [entry], [claim]
        if size > 1 and "seed" in entry.config:
            # seeds_per_process: the other pending entries of its arm that start afresh, or, for an entry with a
            # checkpoint, those whose newest checkpoint is at its step (agents/dqn_seeds.py --resume)
            step = self.resume_step(entry)
            running = self.running()
            for other in self.entries:
                if len(members) == size:
                    break
                if other.name in running or self.arm[other.name] != self.arm[entry.name] or \
                        other.config.get("seed") in {None, *(m.config["seed"] for m in members)} or self.settled(other) or \
                        self.resume_step(other) != step:
                    continue
                claim = self.try_claim(other)
                if isinstance(claim, Claim):
                    members.append(other)
                    claims.append(claim)
        for e in members:
            if self.queue.status(e.name).get("state") == FAILED:  # --retry_failed: a fresh retry budget
                self.queue.set_status(e.name, attempts=0)
            self.note.pop(e.name, None)
        job = Job(members, claims)
        self.jobs[entry.name] = job
        self.submit(job)
        return True

    def slots(self) -> int:
        import ray

        cpus = ray.cluster_resources().get("CPU", 1.0)
        return max(1, int(cpus // self.exp.cpus_per_run + 1e-9))

    def run(self, live: Optional[Union[Live, "LineProgress"]]) -> None:
        import ray

        todo = [e for e in self.entries if not self.settled(e)]
        slots, slots_at = self.slots(), time.time()
        while todo or self.jobs:
            if time.time() - slots_at > 5:
                slots, slots_at = self.slots(), time.time()
            todo += self.returned
            self.returned = []
            waiting = []
            for i, e in enumerate(todo):
                if self.settled(e) or e.name in self.running():  # started with its group
                    continue
                free = slots - len(self.jobs)
                size = self.group_size(todo[i:], free) if self.exp.seeds_per_process > 1 and free > 0 else 1
                if free <= 0 or not self.try_start(e, size):
                    waiting.append(e)
            todo = waiting
            refs = {job.ref: job for job in self.jobs.values()}
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=1.0) if refs else ([], [])
            for ref in ready:
                self.finish(refs[ref])
            for job in list(self.jobs.values()):
                lost = [e for e, c in zip(job.entries, job.claims) if not self.queue.still_mine(c)]
                if lost:  # judged dead and taken over: the new owner runs it
                    ray.cancel(job.ref, force=True)
                    for e in lost:
                        self.note[e.name] = "taken over by another launcher"
                    del self.jobs[job.entry.name]
                    # the rest of a group: released, to be claimed again (by this launcher, or the one that took over)
                    for e, c in zip(job.entries, job.claims):
                        if e not in lost:
                            c.release()
                            self.returned.append(e)
                else:
                    for claim in job.claims:
                        claim.beat()
            if live is not None:
                live.update(self.table())
            if self.kept is not None and self.carry_every > 0 and time.time() - self.carried_at >= self.carry_every:
                self.carry_now()
            if not refs and todo:
                time.sleep(1.0)  # entries held by other launchers: wait for them to finish or go stale

    def beat(self) -> None:
        for job in self.jobs.values():
            for claim in job.claims:
                claim.beat()

    def carry_now(self) -> None:
        """Carry the runs this launcher runs while they run (their newest whole checkpoints: a resume drops the
        records written after one); the others were carried as they stopped, and another launcher on the folder
        carries its own. A carry that fails (a full disk) is reported in a line and tried again next time; the runs
        go on."""
        self.carried_at = time.time()
        running = self.running()
        mine = {name: config for name, config in self.configs.items() if name in running}
        try:
            n, written = carry.carry_folder(self.queue, self.kept.folder, mine, between=self.beat)
        except (OSError, UserError) as e:
            self.console.print(f"{time.strftime('%H:%M:%S')} carry failed, tried again in {self.carry_every / 60:g} "
                               f"min: {one_line(str(e))[:200]}", soft_wrap=True)
            return
        if n:
            self.console.print(f"{time.strftime('%H:%M:%S')} {n} unfinished entries carried to "
                               f"{carry.folder_of(self.kept.folder)} ({written / 1e6:.1f} MB; the next in "
                               f"{self.carry_every / 60:g} min)", soft_wrap=True)

    def stop(self) -> None:
        """Stop the running runs (SIGTERM: each saves an interrupted checkpoint), record how each ended, release
        the claims."""
        import ray

        for job in self.jobs.values():
            with open(self.stop_path(job.entry), "w"):
                pass
        for job in list(self.jobs.values()):
            state = "interrupted"
            try:
                res = ray.get(job.ref, timeout=180)
                if res["returncode"] == 0 and not res["stopped"]:  # it finished meanwhile
                    state = DONE
                job.where = ray_runner.node_of(res)
            except Exception:  # noqa: BLE001  (lost, or still stopping: its checkpoint decides the next launch)
                ray.cancel(job.ref, force=True)
            for e in job.entries:
                self.queue.set_status(e.name, state=state, where=job.where)
            try:
                os.unlink(self.stop_path(job.entry))
            except FileNotFoundError:
                pass
            for claim in job.claims:
                claim.release()
        self.jobs.clear()

    def row(self, e: Entry) -> tuple[str, str, str, str, str]:
        """An entry's state, step, steps/s, last training return and node or note, as the table shows them."""
        st = self.queue.status(e.name)
        state = "running" if e.name in self.running() else st.get("state", "pending")
        if state == "running" and st.get("state") == "lost":
            state = "resumed (node lost)"
        elif state == "running" and st.get("attempts"):
            state = f"retry {st['attempts']}/{self.max_retries}"
        p = read_progress(self.queue.run_dir(e.name))
        step = f"{p['step']}/{p.get('total') or '?'}" if p.get("step") is not None else "-"
        sps = str(p["sps"]) if p.get("sps") is not None and state != DONE else "-"
        ret = f"{p['return']:.1f}" if isinstance(p.get("return"), (int, float)) else "-"
        note = self.note.get(e.name) or (st.get("error") if state == FAILED else st.get("where", ""))
        return state, step, sps, ret, note or ""

    def table(self) -> Table:
        t = Table(title=f"experiment {self.exp.name}: {self.queue.folder}", title_justify="left")
        for c in ("#", "run", "status", "step", "SPS", "last return", "node / note"):
            # labels fold rather than end in "...": at 80 columns "architecture=PPO" and "architecture=PPO_CBP" differ
            t.add_column(c, justify="left" if c in ("run", "status", "node / note") else "right",
                         overflow="fold" if c == "run" else "ellipsis")
        for e in self.entries:
            t.add_row(str(e.index), e.label, *self.row(e))
        return t


class LineProgress:
    """Progress as lines, for a launcher whose output is not a terminal (nohup, sbatch, a pipe): a line when an entry
    changes state, and every `every` seconds a line per running entry and a count. Has Live's `update`."""

    def __init__(self, launcher: "Launcher", console: Console, every: float = 300.0):
        self.launcher, self.console, self.every = launcher, console, every
        self.seen: dict[str, str] = {}
        self.last = time.time()

    def update(self, _renderable: Any = None) -> None:
        now = time.strftime("%H:%M:%S")
        rows = {e.name: (e, self.launcher.row(e)) for e in self.launcher.entries}
        for name, (e, (state, step, sps, ret, note)) in rows.items():
            if self.seen.get(name) != state:
                self.seen[name] = state
                self.console.print(f"{now} entry {e.index} ({e.label}): {state}" +
                                   (f", step {step}" if step != "-" else "") + (f", {note}" if note else ""),
                                   soft_wrap=True)
        if time.time() - self.last >= self.every:
            self.last = time.time()
            states = [state for _, (state, *_rest) in rows.values()]
            for e, (state, step, sps, ret, _note) in rows.values():
                if state == "running" or state.startswith(("retry", "resumed")):
                    self.console.print(f"{now} entry {e.index} ({e.label}): step {step}, {sps} steps/s"
                                       f"{time_left(read_progress(self.launcher.queue.run_dir(e.name), rate=True))}, last "
                                       f"return {ret}", soft_wrap=True)
            self.console.print(f"{now} {states.count(DONE)}/{len(states)} done, {states.count('running')} running, "
                               f"{states.count(FAILED)} failed", soft_wrap=True)


def check_configs(queue: Queue, exp: Experiment, entries: Sequence[Entry]) -> None:
    """An entry whose configuration changed since it was first launched would resume a different run, and one that is
    gone from the file (renamed by an entry inserted before it, or removed) would leave its run to the reports under
    a name the file no longer has: refuse both (entries may be appended at the end of the expansion order)."""
    names = {e.name for e in exp.entries}
    folder = os.path.join(queue.folder, "configs")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".json") and name[:-len(".json")] not in names:
            raise UserError(f"experiment {exp.path!r}: the entry {name[:-len('.json')]!r} started in {queue.folder!r} "
                            f"is not in the file (an entry inserted before it renames it; entries may only be appended "
                            f"at the end of the expansion order): use another --folder for a changed experiment")
    for e in entries:
        path = queue.config_path(e.name)
        if os.path.exists(path):
            with open(path) as f:
                old = json.load(f)
            if old != run_config(e, exp.name):
                raise UserError(f"entry {e.index} ({e.label}) differs from the one started in {queue.folder!r} "
                                f"(configs/{e.name}.json): use another --folder for a changed experiment")


def records(queue: Queue, kept: Optional[str]) -> list[tuple[str, Optional[dict]]]:
    """(folder, declarations record or None) of the experiment folder, then of the archive and its carry."""
    out = [(queue.folder, declarations.read_record(queue.folder))]
    if kept is not None:
        out += [(f, declarations.read_record(f)) for f in (kept, carry.folder_of(kept)) if os.path.isdir(f)]
    return out


def going_on(found: Sequence[tuple[str, Optional[dict]]]) -> Optional[dict]:
    """The record the folder goes on with: its own, else the archive's, else the carry's while nothing is archived
    (None: a first start)."""
    return next((record for _, record in found if record is not None), None)


def check_declarations(queue: Queue, exp: Experiment, kept: Optional[Queue] = None) -> Optional[dict]:
    """The declarations record the folder goes on with, after refusing a file whose declarations differ from any of
    them (declarations.check_record)."""
    found = records(queue, kept.folder if kept is not None else None)
    for folder, record in found:
        if record is not None:
            declarations.check_record(record, exp, folder)
    return going_on(found)


def start(queue: Queue, exp: Experiment, record: Optional[dict], pins: Sequence[dict] = (),
          commit: Optional[str] = None, script: Optional[str] = None) -> None:
    """Create the folder (or go on with it): the experiment file's copy, its declarations record (a new one, or this
    file's revision appended; the code pin moved by --code or --code_change), each entry's config."""
    started = len(glob.glob(os.path.join(queue.dir, "*.status.json")))  # runs before the record: an older folder
    queue.create()
    shutil.copyfile(exp.path, os.path.join(queue.folder, "experiment.json"))
    updated = declarations.updated_record(record, exp, started_before=started if record is None else 0)
    if script is not None:
        updated = code.updated(updated, pins, commit, script, declarations.now())
    atomic_write_json(os.path.join(queue.folder, declarations.RECORD), updated)
    for e in exp.entries:
        if not os.path.exists(queue.config_path(e.name)):
            with open(queue.config_path(e.name), "w") as f:
                json.dump(run_config(e, exp.name), f, indent=2)


def aggregate(queue: Queue, entries: Sequence[Entry], console: Console) -> None:
    dirs = [queue.run_dir(e.name) for e in entries]
    if not all(os.path.exists(os.path.join(d, metrics.EVAL_TABLE)) for d in dirs):
        console.print("no aggregate: the runs have no evaluation table (add eval_every, eval_at_switches or "
                      "eval_final_only to the experiment's flags)")
        return
    out = os.path.join(queue.folder, "aggregate.json")
    try:
        metrics.main([*dirs, "--out", out])
        plots.main([*dirs, "--out", os.path.join(queue.folder, "plots")])
    except UserError as e:
        console.print(f"no aggregate: {one_line(str(e))}")


def selected(entries: Sequence[Entry], resume_id: Optional[int], numbers: Optional[Sequence[int]]) -> list[Entry]:
    """The entries --resume_id or --entries names, in the experiment's order (bad input: a UserError)."""
    if resume_id is not None and numbers is not None:
        raise UserError("entries: give --resume_id N or --entries N ..., not both")
    flag = "entries" if resume_id is None else "resume_id"
    numbers = numbers if resume_id is None else [resume_id]
    if numbers is None:
        return list(entries)
    if not numbers:
        raise UserError("entries: name at least one entry number")
    wrong = [n for n in numbers if not 0 <= n < len(entries)]
    if wrong:
        raise UserError(f"{flag}: the experiment has entries 0..{len(entries) - 1}, got {', '.join(map(str, wrong))}")
    return [entries[n] for n in sorted(set(numbers))]


def main(argv: Optional[Sequence[str]] = None, prepare: Optional[Callable[[str], None]] = None) -> int:
    """`prepare(script)` runs before validation (the entry point registers the script's factories with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(LaunchArgs, argv, default=None, description=__doc__.splitlines()[0])
    exp = load_experiment(args.experiment, stand_ins=args.dry_run)
    entries = selected(exp.entries, args.resume_id, args.entries)
    max_retries = exp.max_retries if args.max_retries is None else args.max_retries
    if max_retries < 0:
        raise UserError(f"max_retries: must be >= 0, got {max_retries}")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UserError(f"num_cpus: must be positive, got {args.num_cpus}")
    if args.stale_after <= 0:
        raise UserError(f"stale_after: must be positive, got {args.stale_after}")
    if not args.carry_every >= 0:
        raise UserError(f"carry_every: must be >= 0 minutes, got {args.carry_every}")
    folder = args.folder or os.path.join("experiments", exp.name)
    queue = Queue(folder, args.stale_after)
    pins = code.pins_of(record for _, record in records(queue, args.archive))
    commit = code.choose(pins, args.code, args.script, args.code_change)
    tree = None
    if commit is not None:
        tree = code.worktree_path(commit) if args.dry_run else code.worktree(commit)
        script = code.script_in(tree, exp.script, SCRIPT)
        if not os.path.isdir(tree):  # a dry run makes no worktree: it checks with the current checkout's factories
            script = find_script(exp.script, args.experiment)
        elif not os.path.isfile(script):
            raise UserError(f"code: {commit[:12]} has no {os.path.relpath(script, tree)}")
    else:
        script = find_script(args.script or exp.script, args.experiment)
    if exp.seeds_per_process > 1 and not os.path.isfile(seeds_script(script)):
        raise UserError(f"seeds_per_process: no {seeds_script(script)} beside the training script {script} (the seeds "
                        f"of a group run in it)")
    if prepare is not None:
        prepare(script)
    validate(exp, os.path.join(queue.folder, "runs"))
    check_configs(queue, exp, exp.entries)
    kept = None
    if args.archive is not None:
        configs = {e.name: run_config(e, exp.name) for e in exp.entries}
        archive.check_archive(args.archive, configs, exp.path, source=queue)
        carry.check(args.archive, configs, exp.path)
        kept = Queue(args.archive)
    record = check_declarations(queue, exp, kept)
    console = Console()
    if args.dry_run:
        for e in entries:
            console.print(f"{e.index:>4}  {e.name}")
        console.print(f"{len(entries)} entries, folder {queue.folder}, script {script}")
        if commit is not None:
            console.print(f"code: {commit[:12]}, from the worktree {tree}"
                          + ("" if os.path.isdir(tree) else " (made at the first launch)"))
        for name, spec in exp.placeholders.items():
            if spec.get("value") is None:
                console.print(f"placeholder {name}: not set yet ({spec.get('set_by')} sets it); this dry run used "
                              f"the stand-in {spec['dry_run']:,}")
        return 0

    start(queue, exp, record, pins, commit, script)
    if commit is not None:
        console.print(f"code: {commit[:12]} (the worktree {tree})")
    if kept is not None:
        restored = sum(archive.restore_entry(kept, queue, e.name) for e in entries)
        if restored:
            console.print(f"{restored} finished entries restored from the archive {kept.folder}")
        steps = [s for e in entries if (s := carry.restore_entry(kept.folder, queue, e.name)) is not None]
        if steps:
            console.print(f"{len(steps)} unfinished entries restored from the carry {carry.folder_of(kept.folder)} "
                          f"(steps {min(steps):,}-{max(steps):,}): they resume there")
    ray_runner.start(args.address, args.num_cpus, args.object_store_mb)
    launcher = Launcher(exp, entries, queue, script, max_retries, args.retry_failed, console, kept,
                        restart_failed=args.restart_failed, configs={e.name: configs[e.name] for e in entries}
                        if kept is not None else None, carry_every=args.carry_every * 60)
    for e in exp.entries:  # finished before this launch (or by an earlier one without --archive, or interrupted)
        launcher.keep(e.name)
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    interrupted = False
    try:
        with (Live(launcher.table(), console=console, refresh_per_second=1, transient=False) if console.is_terminal
              else contextlib.nullcontext(LineProgress(launcher, console))) as live:
            try:
                live.update(launcher.table())
                launcher.run(live)
            except KeyboardInterrupt:
                interrupted = True
                launcher.stop()
            live.update(launcher.table())
        console.print()
    finally:
        signal.signal(signal.SIGTERM, previous)
        ray_runner.stop()
        for e in entries:  # those that finished while the launcher stopped
            launcher.keep(e.name)
        if kept is not None:  # the others, for a launch on another machine; another launcher carries its own
            n, written = carry.carry_folder(queue, kept.folder, {e.name: configs[e.name] for e in entries
                                                                 if not queue.run_by_another(e.name)})
            if n:
                console.print(f"{n} unfinished entries carried to {carry.folder_of(kept.folder)} "
                              f"({written / 1e6:.1f} MB): commit it with the archive")
    states = {e.name: queue.status(e.name).get("state") for e in entries}
    failed = [e for e in entries if states[e.name] == FAILED]
    done = sum(s == DONE for s in states.values())
    console.print(f"{done}/{len(entries)} done, {len(failed)} failed" + ("; interrupted: run the same command again "
                                                                           "to continue" if interrupted else ""))
    for e in failed:
        st = queue.status(e.name)
        console.print(f"failed: entry {e.index} ({e.label}): {st.get('error')} (log: {queue.log_path(e.name)})")
    if interrupted:
        return 130
    if args.aggregate and all(queue.status(e.name).get("state") == DONE for e in exp.entries):
        aggregate(queue, exp.entries, console)
    return 1 if failed else 0
