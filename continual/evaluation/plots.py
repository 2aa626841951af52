"""PNG plots of continual runs (matplotlib, Agg canvas: no display needed).

    python -m continual.evaluation.plots RUN_DIR [RUN_DIR ...] [--out DIR] [--group_by KEY[,KEY]] [--smooth N]

Per run (written to RUN_DIR/plots at the end of training with --plots):
- training_returns.png: training episode returns (points) and their running mean, on coloured bands showing which
  regime was trained when, dotted lines at switches; below, the evaluation return of the regime being trained and
  the mean over all regimes (when the run has an evaluation table);
- eval_curves.png: one panel per regime, its evaluation return (mean +- std over the games) over training, shaded
  where that regime was being trained;
- eval_heatmap.png: the evaluation matrix, regime x evaluation step, boxes on the regime being trained;
- plasticity.png: plasticity diagnostics at switches (dormant fraction per layer, effective rank) and the return
  gained early in each visit, by visit number (when present).
With several runs: comparison.png, runs grouped into methods (config.json architecture + shrink & perturb, or
--group_by keys), seeds aggregated as mean +- 95% CI bands; robust.png, rliable's statistics of the per-regime final
scores (IQM / mean / median with stratified-bootstrap CIs, performance profile, probability of improvement).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import textwrap
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import tyro

from continual.config.loading import cli
from continual.errors import UserError
from continual.evaluation import metrics as M
from continual.evaluation.table import read_eval_table
from continual.io import atomic_open
from continual.modstrings import normalize_modification, parse_tasks, task_env_ids

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110


# ---------------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------------


def regime_label(m: str) -> str:
    return m.replace(" ", " + ") if m else "(none)"


def wrapped(m: str, width: int = 30) -> str:
    return "\n".join(textwrap.wrap(regime_label(m), width=width, break_on_hyphens=False)) or "(none)"


def regime_colors(regimes: Sequence[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    n = len(regimes)
    if n <= 10:
        cmap = colormaps["tab10"]
        cols = [cmap(i) for i in range(10)]
    elif n <= 20:
        cmap = colormaps["tab20"]
        cols = [cmap(i) for i in list(range(0, 20, 2)) + list(range(1, 20, 2))]
    else:
        cmap = colormaps["hsv"]
        cols = [cmap(i / n) for i in range(n)]
    return {r: cols[i] for i, r in enumerate(regimes)}


def _steps_fmt(x: float, _pos: int = 0) -> str:
    if abs(x) >= 1e6:
        return f"{x / 1e6:g}M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:g}k"
    return f"{x:g}"


def steps_formatter():
    """The x-axis tick formatter of agent steps (25k, 1M); matplotlib loads when a plot is drawn, not with every run."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(_steps_fmt)


def _step_axes(ax, title: str, ylabel: str, legend: Optional[dict] = None) -> None:
    """Title, labels, k/M step ticks and grid of a panel whose x axis is agent steps."""
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("agent steps")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_formatter(steps_formatter())
    ax.grid(alpha=0.25)
    if legend is not None:
        ax.legend(**legend)


def _save(fig: Figure, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_open(path, "wb") as f:  # a crash never leaves a half-written image
        fig.savefig(f, format=os.path.splitext(path)[1][1:] or "png", dpi=DPI, bbox_inches="tight")
    return path


def _bands(ax, visits: Sequence[M.Visit], colors: dict, alpha: float = 0.16, markers: bool = True) -> None:
    for v in visits:
        ax.axvspan(v.start, v.end, color=colors.get(v.regime, (0.5, 0.5, 0.5, 1)), alpha=alpha, lw=0, zorder=0)
        if markers and v.start > 0:
            ax.axvline(v.start, color="0.35", ls=":", lw=0.9, zorder=1)


def _regime_at(visits: Sequence[M.Visit], step: int) -> Optional[str]:
    """The regime trained in the visit containing `step` (an evaluation at a switch belongs to the visit it ends)."""
    for v in visits:
        if v.start < step <= v.end:
            return v.regime
    return None


def _running_mean(x: np.ndarray, n: int) -> np.ndarray:
    out = np.empty(len(x))
    c = np.cumsum(np.insert(x, 0, 0.0))
    for i in range(len(x)):
        lo = max(0, i + 1 - n)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def _eval_std(run_dir: str) -> tuple[dict[tuple[str, int], float], set[int]]:
    """(regime, step) -> std over the games, and the numbers of games per point, from eval_table.csv."""
    path = os.path.join(run_dir, M.EVAL_TABLE)
    out: dict[tuple[str, int], float] = {}
    games: set[int] = set()
    if os.path.exists(path):
        for r in read_eval_table(path):
            out[(normalize_modification(r["modification"]), r["step"])] = r["std"]
            games.add(r["episodes"])
    return out, games


def _title(run: M.RunData) -> str:
    env = run.config.get("env_id", "")
    games = task_env_ids(parse_tasks(run.config.get("possible_modifications") or [], env_id=env))
    if len(games) > 1:  # a task sequence across games
        env = f"{len(games)} games: {', '.join(games)}"
    return f"{run.name}  ({M.method_label(run.config)}{', ' + env if env else ''})"


def _kind(run: M.RunData, m: str) -> str:
    if m in run.heldout:
        return " (held-out)"
    if m not in run.trained:
        return " (never trained)"
    return ""


# ---------------------------------------------------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------------------------------------------------


def plot_training(run: M.RunData, path: str, smooth: int = 20) -> str:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    colors = regime_colors(run.regimes or run.trained)
    has_eval = bool(run.evals)
    fig = Figure(figsize=(12, (7.2 if run.episodes else 6.0) if has_eval else 4.6))
    ratios = [1.0, 1.0 if run.episodes else 2.2] if has_eval else [1.0]
    axes = fig.subplots(len(ratios), 1, sharex=True, squeeze=False, height_ratios=ratios)[:, 0]
    ax = axes[0]
    _bands(ax, run.visits, colors)
    if run.episodes:
        steps = np.array([s for s, _, _ in run.episodes], dtype=float)
        rets = np.array([r for _, _, r in run.episodes], dtype=float)
        order = np.argsort(steps, kind="stable")
        steps, rets = steps[order], rets[order]
        ax.scatter(steps, rets, s=7, color="0.45", alpha=0.45, lw=0, label="episode return", zorder=2)
        n = max(1, min(smooth, len(rets)))
        ax.plot(steps, _running_mean(rets, n), color="black", lw=1.8, label=f"running mean ({n} episodes)", zorder=3)
        ax.legend(loc="upper left", fontsize=9, framealpha=0.9)
    else:
        ax.text(0.5, 0.5, "no training episode finished in this run (games outlasted the regime visits)",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="0.3",
                bbox={"facecolor": "white", "edgecolor": "0.7", "alpha": 0.9})
        ax.set_yticks([])
    ax.set_ylabel("training episode return")
    ax.set_title("Training episode returns (background: regime being trained; dotted lines: switches)", fontsize=11)
    ax.grid(alpha=0.25)
    if has_eval:
        ax2 = axes[1]
        _bands(ax2, run.visits, colors)
        steps = sorted({s for c in run.evals.values() for s, _ in c})
        first_cur = True
        for v in run.visits:  # one segment per visit: the line breaks at every switch
            pts = [(s, y) for s, y in run.evals.get(v.regime, []) if v.start < s <= v.end]
            if pts:
                ax2.plot(*zip(*pts), color="black", lw=1.8, marker="o", ms=4, zorder=3,
                         label="regime being trained (breaks at switches)" if first_cur else None)
                first_cur = False
        curriculum = [m for m in run.regimes if m not in run.heldout]
        mean_all = [(s, np.mean([dict(run.evals[m])[s] for m in curriculum if s in dict(run.evals[m])]))
                    for s in steps]
        ax2.plot(*zip(*mean_all), color="tab:blue", lw=1.5, ls="--", marker="s", ms=3,
                 label=f"mean over the curriculum's {len(curriculum)} regimes", zorder=3)
        if run.heldout:
            held = [(s, np.mean([dict(run.evals[m])[s] for m in run.heldout if s in dict(run.evals[m])]))
                    for s in steps]
            ax2.plot(*zip(*held), color="tab:red", lw=1.5, ls=":", marker="^", ms=3,
                     label=f"mean over {len(run.heldout)} held-out regimes", zorder=3)
        ax2.set_ylabel("evaluation return")
        ax2.set_title("Continual evaluation (separate envs, the policy at each evaluation step)", fontsize=11)
        ax2.legend(loc="upper left", fontsize=9, framealpha=0.9)
        ax2.grid(alpha=0.25)
    axes[-1].set_xlabel("agent steps (summed over envs)")
    axes[-1].xaxis.set_major_formatter(steps_formatter())
    trained = run.trained
    handles = [Patch(color=colors[m], alpha=0.5, label=regime_label(m)) for m in trained]
    fig.suptitle(_title(run), fontsize=12)
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.93), fontsize=9,
               title="regime trained\n(background colour)", title_fontsize=9)
    return _save(fig, path)


def plot_eval_curves(run: M.RunData, path: str) -> str:
    from matplotlib.figure import Figure

    colors = regime_colors(run.regimes)
    std, games = _eval_std(run.run_dir)
    regimes = run.regimes
    n = len(regimes)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(3.7 * ncols + 0.6, 2.7 * nrows + 0.9))
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    for i, m in enumerate(regimes):
        ax = axes[i // ncols][i % ncols]
        for v in run.visits:
            if v.regime == m:
                ax.axvspan(v.start, v.end, color="0.82", lw=0, zorder=0)
        s = np.array([p[0] for p in run.evals[m]], dtype=float)
        y = np.array([p[1] for p in run.evals[m]], dtype=float)
        sd = np.array([std.get((m, int(t)), np.nan) for t in s])
        if np.isfinite(sd).any():
            ax.fill_between(s, y - np.nan_to_num(sd), y + np.nan_to_num(sd), color=colors[m], alpha=0.18, lw=0)
        ax.plot(s, y, color=colors[m], lw=1.8, marker="o", ms=3.5)
        ax.set_title(wrapped(m) + _kind(run, m), fontsize=9)
        ax.grid(alpha=0.25)
        ax.xaxis.set_major_formatter(steps_formatter())
        ax.tick_params(labelsize=8)
        ax.label_outer()
    for j in range(n, nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    for r in range(nrows):
        axes[r][0].set_ylabel("eval return", fontsize=9)
    for c in range(ncols):
        last = max(r for r in range(nrows) if r * ncols + c < n)
        axes[last][c].set_xlabel("agent steps", fontsize=9)
        axes[last][c].tick_params(labelbottom=True)
    if games and max(games) > 1:
        what = f"line: mean of {'/'.join(map(str, sorted(games)))} games, band: ± std"
    else:
        what = "one game per point"
    fig.suptitle(f"{_title(run)}\nEvaluation return per regime ({what}; grey: steps trained on that regime)",
                 fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def heatmap(matrix: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str], path: str, title: str,
            xlabel: str, ylabel: str, cbar_label: str, outline: Optional[Sequence[tuple[int, int]]] = None,
            outline_label: Optional[str] = None) -> str:
    """A labelled heatmap; cells annotated when the matrix is small, NaN cells grey."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    nr, nc = matrix.shape
    width = min(22.0, 2.5 + 0.55 * nc + 0.075 * max((len(r) for r in row_labels), default=10))
    fig = Figure(figsize=(max(6.5, width), max(3.0, 1.3 + 0.38 * nr)))
    ax = fig.subplots()
    masked = np.ma.masked_invalid(matrix)
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="0.85")
    im = ax.imshow(masked, aspect="auto", cmap=cmap, interpolation="nearest")
    ax.set_yticks(range(nr), labels=row_labels, fontsize=9)
    ax.set_xticks(range(nc), labels=col_labels, fontsize=8, rotation=45 if nc > 6 else 0,
                  ha="right" if nc > 6 else "center")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if nc <= 30 and nr <= 30 and np.isfinite(matrix).any():
        lo, hi = np.nanmin(matrix), np.nanmax(matrix)
        mid = (lo + hi) / 2
        for i in range(nr):
            for j in range(nc):
                v = matrix[i, j]
                if np.isfinite(v):
                    ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=7 if nc > 12 else 8,
                            color="black" if v > mid else "white")
    for i, j in outline or []:
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=1.8))
    cbar = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    cbar.set_label(cbar_label)
    if outline and outline_label:
        title += f"\n(red boxes: {outline_label})"
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def plot_eval_heatmap(run: M.RunData, path: str) -> str:
    regimes = run.regimes
    steps = sorted({s for c in run.evals.values() for s, _ in c})
    mat = np.full((len(regimes), len(steps)), np.nan)
    for i, m in enumerate(regimes):
        for s, y in run.evals[m]:
            mat[i, steps.index(s)] = y
    outline = []
    for j, s in enumerate(steps):
        cur = _regime_at(run.visits, s)
        if cur in regimes:
            outline.append((regimes.index(cur), j))
    rows = [regime_label(m) + _kind(run, m) for m in regimes]
    return heatmap(mat, rows, [f"{s:,}" if s < 100_000 else _steps_fmt(s) for s in steps], path,
                   f"{_title(run)}\nEvaluation matrix: mean return per regime and evaluation step",
                   "evaluation step (agent steps)", "evaluated regime", "mean evaluation return", outline,
                   "regime being trained at that step")


def plot_plasticity(run: M.RunData, path: str, gains: Optional[list[dict]] = None) -> Optional[str]:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    recs = sorted(run.plasticity, key=lambda r: r["global_step"])
    gains = [g for g in (gains or []) if g.get("gain") is not None]
    if not recs and not gains:
        return None
    colors = regime_colors(run.regimes or run.trained)
    panels = (2 if recs else 0) + (1 if gains else 0)
    fig = Figure(figsize=(5.2 * panels, 4.2))
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    if recs:
        steps = [r["global_step"] for r in recs]
        ax = axes.pop(0)
        _bands(ax, run.visits, colors, alpha=0.12)
        keys = sorted({k for r in recs for k in r if k.startswith("plasticity/dormant_fraction/")})
        for k in keys:
            ys = [r.get(k, np.nan) for r in recs]
            ax.plot(steps, ys, marker="o", ms=3, lw=2.2 if k.endswith("/all") else 1.3,
                    color="black" if k.endswith("/all") else None, label=k.rsplit("/", 1)[1])
        top = max([r.get(k, 0) or 0 for r in recs for k in keys] + [0.0])
        ax.set_ylim(0, max(0.05, 1.15 * top))
        _step_axes(ax, "Dormant units (fraction, per layer)", "dormant fraction",
                   legend=dict(fontsize=8, title="layer", title_fontsize=8))
        ax = axes.pop(0)
        _bands(ax, run.visits, colors, alpha=0.12)
        ax.plot(steps, [r.get("plasticity/effective_rank", np.nan) for r in recs], marker="o", ms=3, color="tab:purple")
        _step_axes(ax, "Effective rank of the penultimate features", "effective rank")
    if gains:
        ax = axes.pop(0)
        visits = sorted({g["visit"] for g in gains})
        means = [np.mean([g["gain"] for g in gains if g["visit"] == n]) for n in visits]
        ax.bar(visits, means, color="0.75", edgecolor="0.3", label="mean over regimes", zorder=2)
        for g in gains:
            ax.scatter(g["visit"], g["gain"], color=colors.get(g["regime"], "k"), s=22, zorder=3, edgecolor="k",
                       lw=0.4)
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set_xticks(visits)
        ax.set_xlabel("visit number of the regime")
        ax.set_ylabel("return gained (2nd half - 1st half of window)")
        ax.set_title("Plasticity: return gained early in each visit", fontsize=11)
        ax.grid(alpha=0.25, axis="y")
        ax.legend(fontsize=8, loc="best")
    trained = run.trained
    fig.suptitle(f"{_title(run)}: plasticity diagnostics", fontsize=12)
    fig.tight_layout()
    if recs or gains:
        handles = [Patch(color=colors[m], alpha=0.5, label=regime_label(m)) for m in trained]
        fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(4, len(handles)),
                   fontsize=8, title="regime (background colour" + (" / dots)" if gains else ")"),
                   title_fontsize=8)
    return _save(fig, path)


def plot_run(run_dir: str, out: Optional[str] = None, smooth: int = 20) -> list[str]:
    """Every per-run plot into `out` (default RUN_DIR/plots); returns the paths written."""
    run = M.load_run(run_dir)
    out = out or os.path.join(run_dir, "plots")
    paths = [plot_training(run, os.path.join(out, "training_returns.png"), smooth)]
    gains = None
    if run.evals:
        paths.append(plot_eval_curves(run, os.path.join(out, "eval_curves.png")))
        paths.append(plot_eval_heatmap(run, os.path.join(out, "eval_heatmap.png")))
    if run.episodes:
        gains = M.plasticity_gains(run.episodes, run.visits)
    p = plot_plasticity(run, os.path.join(out, "plasticity.png"), gains)
    if p:
        paths.append(p)
    return paths


# ---------------------------------------------------------------------------------------------------------------------
# several runs
# ---------------------------------------------------------------------------------------------------------------------


def _ci_band(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column-wise mean and 95% CI half-width (t) over the finite entries of each column."""
    mean = np.full(rows.shape[1], np.nan)
    half = np.zeros(rows.shape[1])
    for j in range(rows.shape[1]):
        col = rows[:, j][np.isfinite(rows[:, j])]
        if len(col):
            mean[j] = col.mean()
        if len(col) > 1:
            half[j] = M.t_quantile_975(len(col) - 1) * col.std(ddof=1) / math.sqrt(len(col))
    return mean, half


def plot_comparison(run_dirs: Sequence[str], path: str, group_by: Optional[Sequence[str]] = None,
                    bins: int = 40) -> str:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    runs = [M.load_run(d) for d in run_dirs]
    M.warn_mixed_groups([r.config for r in runs], group_by)
    groups = M.group_runs(runs, [r.config for r in runs], group_by)
    palette = regime_colors([f"g{i}" for i in range(max(10, len(groups)))])
    gcol = {g: palette[f"g{i}"] for i, g in enumerate(groups)}
    same_schedule = all([(v.regime, v.start, v.end) for v in r.visits] ==
                        [(v.regime, v.start, v.end) for v in runs[0].visits] for r in runs)
    rcolors = regime_colors(runs[0].regimes or runs[0].trained)
    has_eval = any(r.evals for r in runs)
    has_eps = any(r.episodes for r in runs)
    panels = [p for p, ok in (("eval", has_eval), ("train", has_eps), ("bars", has_eval)) if ok] or ["train"]
    fig = Figure(figsize=(6.0 * len(panels), 4.8))
    axes = dict(zip(panels, fig.subplots(1, len(panels), squeeze=False)[0]))
    end = max(r.end_step for r in runs) or 1
    if "eval" in axes:
        ax = axes["eval"]
        if same_schedule:
            _bands(ax, runs[0].visits, rcolors, alpha=0.10)
        for g, rs in groups.items():
            curves = []
            for r in rs:
                cur = [m for m in r.regimes if m not in r.heldout]
                steps = sorted({s for m in cur for s, _ in r.evals[m]})
                curves.append((steps, [np.mean([dict(r.evals[m]).get(s, np.nan) for m in cur]) for s in steps]))
            grid = sorted({s for st, _ in curves for s in st})
            rows = np.array([np.interp(grid, st, ys, left=np.nan, right=np.nan) for st, ys in curves if st])
            if not len(rows):
                continue
            mean, half = _ci_band(rows)
            ax.plot(grid, mean, color=gcol[g], lw=2, marker="o", ms=3, label=f"{g} (n={len(rs)})")
            ax.fill_between(grid, mean - half, mean + half, color=gcol[g], alpha=0.2, lw=0)
        _step_axes(ax, "Mean evaluation return over the curriculum's regimes", "evaluation return",
                   legend=dict(fontsize=9))
    if "train" in axes:
        ax = axes["train"]
        if same_schedule:
            _bands(ax, runs[0].visits, rcolors, alpha=0.10)
        edges = np.linspace(0, end, bins + 1)
        centres = (edges[1:] + edges[:-1]) / 2
        for g, rs in groups.items():
            rows = []
            for r in rs:
                st = np.array([s for s, _, _ in r.episodes], dtype=float)
                rt = np.array([x for _, _, x in r.episodes], dtype=float)
                idx = np.clip(np.digitize(st, edges) - 1, 0, bins - 1)
                rows.append([rt[idx == b].mean() if (idx == b).any() else np.nan for b in range(bins)])
            mean, half = _ci_band(np.array(rows))
            ok = np.isfinite(mean)
            ax.plot(centres[ok], mean[ok], color=gcol[g], lw=2, label=f"{g} (n={len(rs)})")
            ax.fill_between(centres[ok], (mean - half)[ok], (mean + half)[ok], color=gcol[g], alpha=0.2, lw=0)
        _step_axes(ax, f"Training episode return (mean per {_steps_fmt(end / bins)}-step bin)", "episode return",
                   legend=dict(fontsize=9))
    if "bars" in axes:
        ax = axes["bars"]
        keys = [("final", "final"), ("average", "average"), ("cw_forgetting", "forgetting\n(Continual World)"),
                ("forgetting_all_visits", "forgetting\n(all later visits)"), ("transfer_zero_shot", "zero-shot\ntransfer")]
        results = {g: [M.run_metrics(r) for r in rs if r.evals] for g, rs in groups.items()}
        width = 0.8 / max(1, len(groups))
        for gi, (g, res) in enumerate(results.items()):
            stats = [M.mean_ci(x["summary"].get(k) for x in res) for k, _ in keys]
            xs = np.arange(len(keys)) + (gi - (len(groups) - 1) / 2) * width
            means = [s["mean"] if s["mean"] is not None else np.nan for s in stats]
            errs = [s["ci95"] if s["ci95"] is not None else np.nan for s in stats]  # none drawn for n = 1
            ax.bar(xs, means, width, yerr=errs, capsize=3, color=gcol[g], label=g, edgecolor="0.2", lw=0.5)
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set_xticks(range(len(keys)), labels=[lab for _, lab in keys], fontsize=9)
        ax.set_ylabel("return (raw)")
        ax.set_title("Continual metrics (mean ± 95% CI over runs)", fontsize=11)
        ax.grid(alpha=0.25, axis="y")
        ax.legend(fontsize=9)
    sizes = ", ".join(f"{g}: {len(rs)}" for g, rs in groups.items())
    fig.suptitle(f"Method comparison ({sizes} runs); bands and error bars: 95% CI (t)", fontsize=12)
    fig.tight_layout()
    if same_schedule and ("eval" in axes or "train" in axes):
        handles = [Patch(color=rcolors[m], alpha=0.4, label=regime_label(m)) for m in runs[0].trained]
        n_time = sum(k in axes for k in ("eval", "train"))  # under the panels with a time axis
        fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(n_time / len(panels) / 2, 0.0),
                   ncol=min(4, len(handles)), fontsize=8, title="regime trained (background colour)",
                   title_fontsize=8)
    return _save(fig, path)


def plot_robust(run_dirs: Sequence[str], path: str, group_by: Optional[Sequence[str]] = None, reps: int = 2000
                ) -> Optional[str]:
    """rliable's figures over the runs x trained-regimes final scores: interval estimates (IQM, mean, median),
    the performance profile and the probability of improvement. None when no run has per-regime final scores."""
    from matplotlib.figure import Figure

    runs = [M.load_run(d) for d in run_dirs]
    runs = [r for r in runs if r.evals]
    if not runs:
        return None
    norm = M.Normalizer("raw", runs=runs)
    results = [M.run_metrics(r, norm) for r in runs]
    robust = M.robust_aggregate(results, [r.config for r in runs], group_by, reps)
    k = robust["keys"].get("final")
    if not k:
        return None
    methods = list(k["methods"])
    palette = regime_colors([f"g{i}" for i in range(max(10, len(methods)))])
    gcol = {g: palette[f"g{i}"] for i, g in enumerate(methods)}
    fig = Figure(figsize=(17, 4.6))
    axes = fig.subplots(1, 3)
    ax = axes[0]
    stats_ = ("iqm", "mean", "median")
    for gi, g in enumerate(methods):
        for si, st in enumerate(stats_):
            d = k["methods"][g][st]
            y = si + (gi - (len(methods) - 1) / 2) * 0.8 / max(1, len(methods))
            ax.plot(d["ci95"], [y, y], color=gcol[g], lw=6, alpha=0.6, solid_capstyle="butt",
                    label=f"{g} (n={k['methods'][g]['runs']})" if si == 0 else None)
            ax.plot([d["estimate"]], [y], "|", color="k", ms=14)
    ax.set_yticks(range(len(stats_)), labels=["IQM", "mean", "median"])
    ax.set_xlabel("final evaluation return (raw)")
    ax.set_title("Point estimate and 95% stratified-bootstrap CI", fontsize=11)
    ax.grid(alpha=0.25, axis="x")
    ax.legend(fontsize=8)
    ax = axes[1]
    for g in methods:
        ax.plot(k["profile_taus"], k["profiles"][g], color=gcol[g], lw=2, label=g, drawstyle="steps-post")
    ax.set_xlabel("final evaluation return τ")
    ax.set_ylabel("fraction of (run, regime) scores > τ")
    ax.set_title("Performance profile", fontsize=11)
    ax.grid(alpha=0.25)
    ax.legend(fontsize=8)
    ax = axes[2]
    pairs = list(k["probability_of_improvement"].items())
    for i, (pair, d) in enumerate(pairs):
        ax.plot(d["ci95"], [i, i], color=gcol[pair.split(" > ")[0]], lw=6, alpha=0.6, solid_capstyle="butt")
        ax.plot([d["estimate"]], [i], "|", color="k", ms=14)
    ax.axvline(0.5, color="0.3", lw=0.8, ls="--")
    ax.set_yticks(range(len(pairs)), labels=[p.replace(" > ", " > \n") for p, _ in pairs], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("P(X > Y)")
    ax.set_title("Probability of improvement" if pairs else "Probability of improvement (one method)", fontsize=11)
    ax.grid(alpha=0.25, axis="x")
    fig.suptitle(f"Robust comparison (rliable statistics) over {len(k['tasks'])} trained regime(s), "
                 f"{len(results)} runs", fontsize=12)
    fig.tight_layout()
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PlotArgs:
    run_dirs: tyro.conf.Positional[list[str]]
    """run directories"""
    out: Optional[str] = None
    """output folder (default: RUN_DIR/plots for one run, ./plots for several: one sub-folder per run +
    comparison.png)"""
    group_by: Optional[str] = None
    """comma-separated config.json keys that define a method (default: exp_name where set, else architecture,
    + S&P)"""
    smooth: int = 20
    """running-mean window (episodes) of the training return"""
    bootstrap_reps: int = 2000
    """resamples of the stratified bootstrap behind robust.png"""


def main(argv: Optional[Sequence[str]] = None) -> list[str]:

    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli(PlotArgs, argv, default=None, description=__doc__.splitlines()[0])
    for d in args.run_dirs:
        if not os.path.isdir(d):
            raise UserError(f"{d!r} is not a run directory")
    if args.smooth <= 0:
        raise UserError(f"smooth: must be positive, got {args.smooth}")
    if args.bootstrap_reps < 1:
        raise UserError(f"bootstrap_reps: must be positive, got {args.bootstrap_reps}")
    group_by = [k.strip() for k in args.group_by.split(",")] if args.group_by else None
    paths: list[str] = []
    if len(args.run_dirs) == 1:
        paths += plot_run(args.run_dirs[0], args.out, args.smooth)
    else:
        out = args.out or "plots"
        for d in args.run_dirs:
            paths += plot_run(d, os.path.join(out, os.path.basename(os.path.normpath(d))), args.smooth)
        paths.append(plot_comparison(args.run_dirs, os.path.join(out, "comparison.png"), group_by))
        robust = plot_robust(args.run_dirs, os.path.join(out, "robust.png"), group_by, args.bootstrap_reps)
        if robust:
            paths.append(robust)
    for p in paths:
        print(p)
    return paths


if __name__ == "__main__":
    from continual.errors import exit_on_user_error

    exit_on_user_error(main)()
