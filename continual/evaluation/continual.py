"""Continual evaluation during training: the current policy on every regime the curriculum can emit (plus held-out
`--eval_modifs`), at step 0, every `--eval_every` steps, optionally right before every switch, and at the end
(`--eval_final_only`: at the end alone, the same rows).

- Evaluation envs are separate from the training envs: built once (whole games, no life cuts, capped by
  `--eval_max_episode_steps` when given), switched in place between regimes, seeded at their first evaluation (env
  i gets `eval_seed + i`; with `--eval_reseed` before every regime of every evaluation, so every evaluation of a
  regime plays the same games up to the policy, at the cost of an ALE ROM reload each time).
- Actions are the argmax (`--eval_greedy`) or sampled from a private `torch.Generator` seeded per regime; the
  global Python/NumPy/torch RNG states are saved and restored around everything the evaluator does in the training
  process, so a run with evaluation trains exactly as the same run without it.
- `--eval_background`: a single background process (sync envs, one torch thread, nice +10) receives a CPU copy of
  the weights at each evaluation step and sends back results tagged with that step; training only waits when three
  evaluations are already queued, and at the end of the run. The process is stopped when the run ends, on errors,
  and exits by itself if the training process dies.

Outputs in the run directory: `eval_table.csv` (one row per evaluation step x regime: mean, std, min, max, episodes,
mean length, seconds), `kind: "eval"` lines in metrics.jsonl, TensorBoard/W&B scalars `eval/<regime slug>`,
`eval/average` (mean over the curriculum's regimes), `eval/heldout_average`, `eval/time_share` (evaluation seconds
spent by the training process / total seconds); at the end `metrics.json` (`continual.evaluation.metrics`, with `--metrics`)
and PNG plots under `plots/` (`continual.evaluation.plots`, with `--plots`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import time
import traceback
import zlib
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from continual.envs.vector import EnvSettings, make_vector_env, regime_slug
from continual.evaluation import metrics, plots  # both import scipy, rliable and matplotlib only when used
from continual.evaluation.episodes import evaluate
from continual.evaluation.table import COLUMNS, EVAL_TABLE, keep_rows_until
from continual.evaluation.table import read_eval_table as read_eval_table  # re-exported: its old home
from continual.io import AppendFile, storage_cause
from continual.modstrings import normalize_modification, parse_eval_modifs
from continual.plasticity.injection import restore_injection
from continual.processes import stop_processes
from continual.training.extensions import Extension, SwitchEvent

MAX_PENDING = 3  # background evaluations queued before training waits for the oldest one


def eval_enabled(args: Any) -> bool:
    return args.eval_every > 0 or args.eval_at_switches or args.eval_final_only


def regime_seed(seed: int, modification: str) -> int:
    """Seed of the action sampler for one regime: independent of evaluation order and process."""
    return (seed * 1_000_003 + zlib.crc32(modification.encode())) % (2 ** 63)


@contextlib.contextmanager
def single_torch_thread() -> Iterator[None]:
    """Batch-of-a-few inference runs best on one thread: on a loaded CPU, a thread pool waiting on its busiest
    thread made evaluation 10-40x slower. The training's thread count is restored afterwards."""
    n = torch.get_num_threads()
    if n != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if n != 1:
            torch.set_num_threads(n)


@contextlib.contextmanager
def preserved_global_rng() -> Iterator[None]:
    """Restore Python, NumPy and torch (CPU and initialised CUDA) global RNG states afterwards."""
    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(th)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class PolicyActor:
    """obs -> actions from an agent with `features` and `actor` (agents.ppo.Agent and subclasses)."""

    def __init__(self, agent: torch.nn.Module, greedy: bool):
        if not (hasattr(agent, "features") and hasattr(agent, "actor")):
            raise TypeError("continual evaluation needs an agent with .features(obs) and .actor (see agents/ppo.py)")
        self.agent, self.greedy = agent, greedy
        self.generator = torch.Generator()

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor, goals: Optional[torch.Tensor] = None) -> torch.Tensor:
        if goals is not None:  # HER: goal-conditioned play (the agent samples with the global torch RNG)
            return self.agent.get_action_and_value(obs, goal=goals, greedy=self.greedy)[0]
        out = self.agent.actor(self.agent.features(obs))
        if getattr(self.agent, "continuous", False):  # Box actions: the Normal's mean, or a sample from it
            if self.greedy:
                return out
            noise = torch.randn(out.shape, generator=self.generator).to(out.device)
            return out + self.agent.actor_logstd.exp() * noise
        logits = out
        if self.greedy:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float(), dim=-1).cpu()
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)


def switch_without_reset(envs, modification: str) -> None:
    """`ContinualVectorEnv.switch` minus its reset: `evaluate` resets every env with the evaluation seed right after
    (an ALE reset costs ~0.15 s, one per regime and evaluation saved)."""
    envs.modification = normalize_modification(modification)
    envs.env.call("set_modifications", envs.modification, 0)


def evaluate_regimes(actor: PolicyActor, envs, modifs: Sequence[str], episodes: int, device: torch.device,
                     seed: int, reseed: bool = False) -> list[tuple[dict, float]]:
    """Every modification in turn on the same envs (switched in place): [(EvalResult.row(), seconds)].

    The envs are seeded (env i: seed + i) at their first evaluation, and again before every regime with `reseed`
    (then every evaluation plays the same games up to the policy; an ALE seed reloads the ROM, ~0.2 s). HER agents
    (goal-conditioned) play through the same loop, which adds the success rate.
    """
    out = []
    for m in modifs:
        t0 = time.time()
        if envs.modification != m:
            switch_without_reset(envs, m)
        actor.reseed(regime_seed(seed, m))
        env_seed = seed if reseed or not getattr(envs, "_continual_eval_seeded", False) else None
        envs._continual_eval_seeded = True
        row = evaluate(actor, envs, episodes, device, seed=env_seed).row()
        out.append((row, time.time() - t0))
    return out


def _state_bytes(agent: torch.nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().clone() for k, v in agent.state_dict().items()}, buf)
    return buf.getvalue()


def _background_main(make_agent: Callable[..., torch.nn.Module], args: Any, settings: EnvSettings, modifs: list[str], episodes: int, num_envs: int, seed: int,
                     greedy: bool, tasks: Any, results: Any) -> None:
    """The background evaluation process: (step, weights) in, rows out, until None or the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; the learner stops us
    with contextlib.suppress(OSError):
        os.nice(10)
    torch.set_num_threads(1)
    parent = mp.parent_process()
    envs = None
    try:
        envs = make_vector_env(settings, num_envs, modifs[0], "sync")
        agent = make_agent(envs.single_observation_space, envs.single_action_space, args)
        actor = PolicyActor(agent, greedy)
        results.put(("ready", os.getpid()))
        while True:
            try:
                task = tasks.get(timeout=1.0)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    return
                continue
            if task is None:
                results.put(("done",))
                return
            _, step, blob = task
            state = torch.load(io.BytesIO(blob), weights_only=True)
            restore_injection(agent, state)  # --plasticity_injection: the learner's heads may have been injected
            agent.load_state_dict(state)
            t0 = time.time()
            rows = evaluate_regimes(actor, envs, modifs, episodes, torch.device("cpu"), seed,
                                    reseed=args.eval_reseed)
            results.put(("result", step, rows, time.time() - t0))
    except BaseException:  # noqa: BLE001 - reported to the learner, which raises it
        results.put(("error", traceback.format_exc()))
    finally:
        if envs is not None:
            envs.close()


class BackgroundEvaluation:
    """One evaluation process fed through a task queue; results come back in submission order."""

    def __init__(self, make_agent: Callable[..., torch.nn.Module], args: Any, settings: EnvSettings,
                 modifs: list[str], episodes: int, num_envs: int, seed: int, greedy: bool):
        ctx = settings.worker_context()
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_background_main, name="continual-eval", daemon=True,
                                args=(make_agent, args, settings, modifs, episodes, num_envs, seed, greedy, self.tasks,
                                      self.results))
        self.proc.start()
        self.pending = 0
        self.worker_seconds = 0.0
        self.pid: Optional[int] = self.proc.pid

    def submit(self, step: int, agent: torch.nn.Module) -> None:
        self.tasks.put(("eval", step, _state_bytes(agent)))
        self.pending += 1

    def _get(self, timeout: Optional[float]) -> Optional[tuple]:
        try:
            return self.results.get(timeout=timeout) if timeout != 0 else self.results.get_nowait()
        except queue.Empty:
            return None

    def poll(self, wait_for: int = 0) -> list[tuple[int, list, float]]:
        """Finished evaluations; blocks until at most `wait_for` are still pending."""
        done = []
        while True:
            block = self.pending > wait_for
            msg = self._get(1.0 if block else 0)
            if msg is None:
                if not block:
                    return done
                if not self.proc.is_alive():
                    raise RuntimeError(f"the background evaluation process died (exit code {self.proc.exitcode})")
                continue
            if msg[0] == "error":
                raise RuntimeError(f"background evaluation failed:\n{msg[1]}")
            if msg[0] == "result":
                self.pending -= 1
                self.worker_seconds += msg[3]
                done.append((msg[1], msg[2], msg[3]))

    def close(self, wait: bool) -> list[tuple[int, list, float]]:
        """wait=True: finish the queued evaluations, then stop; wait=False: stop at once."""
        done: list = []
        try:
            if wait and self.proc.is_alive():
                done = self.poll(wait_for=0)
                self.tasks.put(None)
                deadline = time.time() + 60
                while time.time() < deadline and self.proc.is_alive():
                    msg = self._get(0.5)
                    if msg is not None and msg[0] == "done":
                        break
        finally:
            stop_processes([self.proc], join_timeout=10 if wait else 0.5)
            for q in (self.tasks, self.results):
                q.cancel_join_thread()
                q.close()
        return done


class ContinualEvaluator(Extension):
    """Evaluation as a run's extension (it adds itself to the session); see the module docstring."""

    def __init__(self, session, agent: torch.nn.Module, device: torch.device,
                 make_agent: Callable[..., torch.nn.Module]):
        args = session.args
        self.session, self.agent, self.device, self.args = session, agent, device, args
        self.make_agent = make_agent  # (obs_space, action_space, args) -> a fresh network, for the background process
        self.enabled = eval_enabled(args)
        self.curriculum = list(session.regimes)
        extra = [m for m in parse_eval_modifs(args.eval_modifs) if m not in self.curriculum]
        self.modifs = self.curriculum + extra
        self.episodes = args.eval_episodes
        self.num_envs = args.eval_num_envs or min(args.eval_episodes, 4)
        self.seed = args.eval_seed if args.eval_seed is not None else args.seed + 10_000
        self.settings = EnvSettings.from_args(
            args, regimes=self.modifs, curriculum=self.curriculum, episodic_life=False, max_episode_steps=args.eval_max_episode_steps or args.max_episode_steps)
        self.table_path = os.path.join(session.run_dir, EVAL_TABLE)
        self.eval_seconds = 0.0
        self.evaluated: set[int] = set()
        self.envs = None
        self.actor: Optional[PolicyActor] = None
        self.background: Optional[BackgroundEvaluation] = None
        self.completed = False
        self._last_step = session.global_step
        session.add_extension(self)
        if not self.enabled:
            return
        self._prepare_table(session.global_step if session.resume_state is not None else None)
        if session.global_step == 0 and 0 not in self.evaluated and not args.eval_final_only:
            self.evaluate_now()

    # --- table -----------------------------------------------------------------------------------------------------
    def _prepare_table(self, resume_step: Optional[int]) -> None:
        """Keep rows up to the resumed step (later ones will be produced again)."""
        if os.path.exists(self.table_path):
            self.evaluated = keep_rows_until(self.table_path, resume_step)

    def _write(self, step: int, rows: list[tuple[dict, float]]) -> None:
        new = not os.path.exists(self.table_path)
        logger = self.session.logger
        scalars: dict[str, float] = {}
        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        for row, secs in rows:
            m = row["modification"]
            writer.writerow({"step": step, "modification": m, "slug": regime_slug(m),
                             "split": "curriculum" if m in self.curriculum else "heldout",
                             "episodes": row["episodes"], "mean": row["mean"], "std": row["std"],
                             "min": row["min"], "max": row["max"], "mean_length": row["mean_length"],
                             "seconds": round(secs, 3), "greedy": self.args.eval_greedy,
                             "success_rate": row.get("success_rate", ""),
                             "max_episode_steps": row.get("max_episode_steps") or "", "capped": row.get("capped", 0)})
        # the step's rows in one write: a full disk leaves the table as it was, never a torn row (StorageError)
        table = AppendFile(self.table_path)
        try:
            table.write(buf.getvalue())
        finally:
            table.close()
        for row, secs in rows:
            m = row["modification"]
            split = "curriculum" if m in self.curriculum else "heldout"
            her = {"success_rate": row["success_rate"]} if "success_rate" in row else {}
            logger.record("eval", step, modification=m, split=split, mean=row["mean"], std=row["std"],
                          episodes=row["episodes"], mean_length=row["mean_length"], seconds=round(secs, 3),
                          max_episode_steps=row.get("max_episode_steps"), capped=row.get("capped", 0), **her)
            scalars[f"eval/{regime_slug(m)}"] = row["mean"]
            if her:
                scalars[f"eval/success_rate/{regime_slug(m)}"] = row["success_rate"]
        cur = [r["mean"] for r, _ in rows if r["modification"] in self.curriculum]
        held = [r["mean"] for r, _ in rows if r["modification"] not in self.curriculum]
        if cur:
            scalars["eval/average"] = float(np.mean(cur))
        if held:
            scalars["eval/heldout_average"] = float(np.mean(held))
        scalars["eval/time_share"] = self.time_share()
        logger.scalars(scalars, step)

    # --- evaluation ------------------------------------------------------------------------------------------------
    def time_share(self) -> float:
        return self.eval_seconds / max(time.time() - self.session.start_time, 1e-9)

    def evaluate_now(self) -> None:
        step = self.session.global_step
        if step in self.evaluated:
            return
        self.evaluated.add(step)
        t0 = time.time()
        try:
            with preserved_global_rng(), single_torch_thread():
                if self.args.eval_background:
                    if self.background is None:
                        self.background = BackgroundEvaluation(self.make_agent, self.args, self.settings, self.modifs, self.episodes,
                                                               self.num_envs, self.seed, self.args.eval_greedy)
                    self.background.submit(step, self.agent)
                    self._collect(wait_for=MAX_PENDING)
                else:
                    if self.envs is None:
                        self.envs = make_vector_env(self.settings, self.num_envs, self.modifs[0],
                                                    self.args.vector_env)
                        self.actor = PolicyActor(self.agent, self.args.eval_greedy)
                    rows = evaluate_regimes(self.actor, self.envs, self.modifs, self.episodes, self.device,
                                            self.seed, reseed=self.args.eval_reseed)
                    self.eval_seconds += time.time() - t0
                    t0 = time.time()
                    self._write(step, rows)
        finally:
            self.eval_seconds += time.time() - t0

    def _collect(self, wait_for: int) -> None:
        if self.background is not None:
            for step, rows, _ in self.background.poll(wait_for=wait_for):
                self._write(step, rows)

    def on_switch_start(self, event: SwitchEvent) -> None:
        if self.enabled and self.args.eval_at_switches:
            self.evaluate_now()

    def on_iteration_end(self) -> None:
        if not self.enabled:
            return
        every = self.args.eval_every
        step = self.session.global_step
        if every and step // every != self._last_step // every:
            self.evaluate_now()
        elif self.background is not None and self.background.pending:
            t0 = time.time()
            with preserved_global_rng():
                self._collect(wait_for=self.background.pending)  # non-blocking: whatever has finished
            self.eval_seconds += time.time() - t0
        self._last_step = step

    def on_training_end(self) -> None:
        session = self.session
        if not self.enabled:
            self.completed = session.stop_signal is None
            return
        if session.stop_signal is None:
            self.evaluate_now()  # the final policy (no-op when this step was just evaluated)
        if self.background is not None:
            t0 = time.time()
            for step, rows, _ in self.background.close(wait=True):
                self._write(step, rows)
            self.eval_seconds += time.time() - t0
        total = time.time() - session.start_time
        share = self.eval_seconds / max(total, 1e-9)
        extra = {}
        if self.background is not None:
            extra["background_seconds"] = round(self.background.worker_seconds, 3)
            extra["background_pid"] = self.background.pid
        session.logger.record("eval_summary", session.global_step, eval_seconds=round(self.eval_seconds, 3),
                              total_seconds=round(total, 3), time_share=share, background=self.args.eval_background,
                              **extra)
        session.logger.scalars({"eval/time_share": share}, session.global_step)
        where = (f" (background process: {self.background.worker_seconds:.1f} s of evaluation)"
                 if self.background is not None else "")
        print(f"continual evaluation: {self.eval_seconds:.1f} s of {total:.1f} s in the training process "
              f"({100 * share:.1f}%){where}; table: {self.table_path}")
        self.completed = session.stop_signal is None

    def on_close(self) -> None:
        try:
            if self.completed:
                self._reports(self.session)
        finally:
            if self.envs is not None:
                self.envs.close()
                self.envs = None
            if self.background is not None:
                self.background.close(wait=False)

    # --- end of run ------------------------------------------------------------------------------------------------
    def _reports(self, session) -> None:
        """metrics.json and plots; a failure here is reported but never loses the finished run."""
        args = session.args
        if args.metrics and self.enabled:
            try:
                result = metrics.compute_run_metrics(session.run_dir)
                print_run_metrics(result, session.run_dir)
                session.logger.summary({f"final_metrics/{k}": v for k, v in result["summary"].items()
                                        if isinstance(v, (int, float))})
                print(f"metrics: {os.path.join(session.run_dir, metrics.METRICS_FILE)}")
            except Exception as e:  # noqa: BLE001
                print(f"warning: metrics.json could not be written:{_why(e)}", file=sys.stderr)
        if args.plots:
            try:
                paths = plots.plot_run(session.run_dir)
                print(f"plots: {', '.join(paths)}")
                wandb_run = session.logger.wandb_run
                if wandb_run is not None and paths:
                    import wandb

                    wandb_run.log({f"plots/{os.path.splitext(os.path.basename(p))[0]}": wandb.Image(p)
                                   for p in paths} | {"global_step": session.global_step})
            except Exception as e:  # noqa: BLE001
                print(f"warning: plots could not be written:{_why(e)}", file=sys.stderr)


def print_run_metrics(result: dict, run_dir: str) -> None:
    """The metrics table at the end of a run. Where no visit could measure plasticity, the line says so with what a
    training run can change (shorter games, longer visits) and the metrics command that takes a window
    (`--plasticity_window` is a flag of `python -m continual.evaluation.metrics`, not of the training scripts)."""
    gains = result.get("summary", {}).get("plasticity_by_visit")
    if not (gains and all(g is None for g in gains.values())):
        metrics.print_run_table(result)
        return
    metrics.print_run_table({**result, "summary": {**result["summary"], "plasticity_by_visit": {}}})
    print("plasticity: no visit has training episodes in both halves of its window (games outlast the visits: "
          "shorter games with --max_episode_steps, or longer visits); with a shorter window: "
          f"python -m continual.evaluation.metrics {run_dir} --plasticity_window K")


def _why(e: Exception) -> str:
    """A full disk in one line (the run itself is finished and saved); anything else with its traceback."""
    cause = storage_cause(e)
    return f" {cause.strerror or cause}" if cause is not None else f"\n{traceback.format_exc()}"


def attach(session, agent: torch.nn.Module, device: torch.device,
           make_agent: Callable[..., torch.nn.Module]) -> ContinualEvaluator:
    """Call once the agent holds its starting (or resumed) weights; evaluates step 0 of a new run at once.
    `make_agent(obs_space, action_space, args)` builds the same network in the background process (a module-level
    function of the agent file, so that it pickles by name)."""
    return ContinualEvaluator(session, agent, device, make_agent)

