"""Run outputs: per-iteration metrics (JSONL + CSV), diagnostics, and learning-curve plots."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import threading
from pathlib import Path
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from rlhp_jax.files import open_append, own_folder, write_atomic


def segment_return_correlation(predicted: jax.Array, true: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Pearson correlation between predicted and true segment returns ([S] each) over the segments
    in ``mask`` (all by default); NaN if either is constant there (or fewer than two segments)."""
    w = jnp.ones_like(predicted) if mask is None else mask.astype(predicted.dtype)
    n = jnp.maximum(jnp.sum(w), 1.0)
    p = w * (predicted - jnp.sum(w * predicted) / n)
    t = w * (true - jnp.sum(w * true) / n)
    denom = jnp.sqrt(jnp.sum(p * p) * jnp.sum(t * t))
    return jnp.where(denom > 0, jnp.sum(p * t) / jnp.maximum(denom, 1e-12), jnp.nan)


class MetricsWriter:
    """Appends one JSON object per line and flushes it, so a crash loses at most the current row.

    A CSV with the union of all columns seen is rewritten by ``close`` (and ``write_csv``).
    Without ``append`` the file starts empty, as a new file of its own: a symlink left at its
    name (a run directory someone else made) is replaced, and what it pointed at is never truncated.
    """

    def __init__(self, path: str | os.PathLike, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not append:
            write_atomic(self.path, b"")
        # never through a link planted at the name meanwhile (files.open_append refuses one)
        self._file = io.TextIOWrapper(open_append(self.path), encoding="utf-8")

    def write(self, row: dict) -> None:
        clean = {k: _jsonable(v) for k, v in row.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        write_csv(read_jsonl(self.path), self.path.with_suffix(".csv"))


def _jsonable(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The rows of a metrics file: every line that is a JSON object.  A line cut short by a crash, or
    anything else (a damaged or hand-edited file: ``[1, 2]``, a number of a thousand digits, text that
    is not UTF-8), is not a row and is left out, so every reader meets only dicts."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):  # JSONDecodeError, a too-long integer, nesting too deep
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    return rows


def write_csv(rows: Iterable[dict], path: str | os.PathLike) -> None:
    """``rows`` as a CSV with the union of their columns, written whole (``files.write_atomic``: a
    symlink at ``path`` is replaced, never written through)."""
    rows = list(rows)
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=columns)
    w.writeheader()
    w.writerows(rows)
    write_atomic(path, text.getvalue())


def finite_or_none(x) -> float | None:
    """A float for a metrics row: None for NaN/inf (JSON has no NaN)."""
    v = float(x)
    return v if math.isfinite(v) else None


def nanmean_or_none(x) -> float | None:
    """Mean of the finite entries, or None when there are none."""
    a = np.asarray(x, np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else None


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display): every plot of this module."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def import_plotting_ahead() -> None:
    """Import :func:`pyplot` on a thread, so the learning curve at a run's end does not wait for it
    (~0.7 s of the README job's ~1.3 s plot, 2-core Xeon): a run calls this once its loop runs,
    while its main thread mostly waits on programs.  Python's import lock makes a plot that starts
    first wait for the import, not repeat it; an import that fails here fails again, with its
    message, where the plot imports it."""
    def load():
        try:
            pyplot()
        except Exception:
            pass

    threading.Thread(target=load, name="import-matplotlib", daemon=True).start()


def plot_learning_curve(rows: list[dict], path: str | os.PathLike, title: str = "") -> Path:
    """PNG with true/evaluation/predicted return, labels, and reward-model quality against env steps."""
    plt = pyplot()

    def series(key):
        pts = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None]
        return ([p[0] for p in pts], [p[1] for p in pts]) if pts else ([], [])

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for key, label, style in [("eval_return", "eval return (unmodified task)", "-o"),
                              ("episode_return", "score per episode (task reward, training)", "-")]:
        x, y = series(key)
        if x:
            ax.plot(x, y, style, label=label, markersize=3)
    # the oracle's reward per horizon has its own scale (penalties, clipping): a second axis
    x, y = series("true_return")
    lines, labels = ax.get_legend_handles_labels()
    if x:
        twin = ax.twinx() if lines else ax
        twin.plot(x, y, "-", color="tab:green", alpha=0.8, label="true return per horizon (oracle's reward)")
        twin.set_ylabel("oracle's return per horizon")
        more, more_labels = twin.get_legend_handles_labels()
        if twin is not ax:
            lines, labels = lines + more, labels + more_labels
        else:
            lines, labels = more, more_labels
    ax.set_xlabel("environment steps")
    ax.set_ylabel("return")
    ax.set_title("true return")
    if lines:
        ax.legend(lines, labels, loc="best", fontsize=8)
    ax.grid(alpha=0.3)

    ax = axes[1]
    x, y = series("predicted_return")
    if x:
        ax.plot(x, y, color="tab:purple", label="predicted return (r̂ per episode)")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("predicted return")
    ax2 = ax.twinx()
    x, y = series("labels")
    if x:
        ax2.step(x, y, where="post", color="tab:gray", label="labels")
    ax2.set_ylabel("labels collected")
    ax.set_title("predicted return and labels")
    ax.grid(alpha=0.3)

    ax = axes[2]
    plotted = False
    for key, label in [("reward_correlation", "corr(r̂, true) on fresh segments"),
                       ("val_accuracy", "ensemble validation accuracy")]:
        x, y = series(key)
        if x:
            ax.plot(x, y, label=label)
            plotted = True
    ax.set_ylim(-0.1, 1.05)
    ax.set_xlabel("environment steps")
    ax.set_title("reward model quality")
    if plotted:
        ax.legend(loc="best", fontsize=8)
    else:  # a run on the true reward has no reward model: say so rather than draw an empty legend
        ax.text(0.5, 0.5, "no reward model\n(trained on the true reward)", ha="center", va="center",
                transform=ax.transAxes, color="tab:gray")
    ax.grid(alpha=0.3)

    return _save_figure(fig, axes, title, path)


def _save_figure(fig, axes, title: str, path) -> Path:
    """Engineering-notation step axes, the title, a tight layout; write the PNG (``save_png``) and close."""
    from matplotlib.ticker import EngFormatter

    plt = pyplot()

    for a in axes:
        a.xaxis.set_major_formatter(EngFormatter(sep=""))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = save_png(fig, path)
    plt.close(fig)
    return path


def save_png(fig, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Write a matplotlib figure at ``path``, whole or not at all (``files.write_atomic``): a plot
    written into a run directory replaces a symlink left at its name, never the file it points at.
    A PNG, unless the name asks for another format matplotlib writes (``falls.svg``, ``x.pdf``): the
    bytes are always what the name says."""
    fmt = Path(path).suffix[1:].lower() or "png"
    return write_atomic(path, lambda f: fig.savefig(f, format=fmt, dpi=dpi))


def plot_ibarz_run(rows: list[dict], path: str | os.PathLike, title: str = "") -> Path:
    """PNG of an Ibarz-protocol run: game score; r̂ against the oracle's reward per 1,000 steps
    (rising r̂ with falling true reward is reward hacking, Ibarz Fig. 4); reward-model loss against
    its label-entropy lower bound (Ibarz Fig. 7) with validation accuracy."""
    plt = pyplot()

    its = [r for r in rows if r.get("phase") == "iteration"]

    def series(key, source=its):
        pts = [(r["env_steps"], r[key]) for r in source if r.get(key) is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    x, y = series("episode_return")
    ax.plot(x, y, "-o", markersize=3, label="score per episode (game reward)")
    ax2 = ax.twinx()
    x, y = series("labels", rows)
    if x:
        ax2.step(x, y, where="post", color="tab:gray", alpha=0.6, label="labels")
    ax2.set_ylabel("labels")
    ax.set_title("game score")
    ax.set_ylabel("score")
    ax.legend(loc="upper left", fontsize=8)

    ax = axes[1]
    x, y = series("true_reward_per_1000")
    ax.plot(x, y, color="tab:blue", label="oracle's reward")
    ax.set_ylabel("oracle's reward per 1,000 steps", color="tab:blue")
    ax2 = ax.twinx()
    x, y = series("model_reward_per_1000")
    ax2.plot(x, y, color="tab:red", label="r̂ (reward model)")
    ax2.set_ylabel("r̂ per 1,000 steps", color="tab:red")
    ax.set_title("true vs model reward on the agent's steps")

    ax = axes[2]
    for key, label, style in [("rm_loss", "reward-model loss (all labels)", "-"),
                              ("rm_val_loss", "reward-model loss (held out)", "-"),
                              ("label_entropy_bound", "label-entropy lower bound", "k:")]:
        x, y = series(key, rows)
        if x:
            ax.plot(x, y, style, label=label)
    x, y = series("val_accuracy", rows)
    if x:
        ax.plot(x, y, "--", color="tab:green", label="held-out accuracy")
    ax.set_title("reward model")
    if ax.get_legend_handles_labels()[0]:  # a frozen or imitation run trains no reward model
        ax.legend(loc="best", fontsize=8)
    for a in axes:
        a.set_xlabel("actor steps")
        a.grid(alpha=0.3)
    return _save_figure(fig, axes, title, path)


TENSORBOARDX_OPTIONAL = ("boto3", "google.cloud.storage")  # what tensorboardX imports for remote log directories


class TensorBoardWriter:
    """Writes the numbers of metric rows as TensorBoard scalars (``events.out.tfevents.*`` in ``logdir``).

    Uses ``tensorboardX`` (no TensorFlow).  Every writer opens a new event file (its name carries
    the creation time in nanoseconds and the pid), so a resumed run appends to the same ``logdir``.  Pass
    ``purge_step`` (the first step the resumed run will log) when resuming from a checkpoint older
    than the last logged step: TensorBoard then hides the events at and after that step from the
    earlier files instead of drawing two curves.  Each ``scalars`` call is flushed to the file.
    """

    def __init__(self, logdir: str | os.PathLike, purge_step: int | None = None):
        import time

        from rlhp_jax import deferred

        # without PyTorch (imported for a type annotation), boto3 and Google Cloud Storage (for
        # s3:// and gs:// directories) until used: up to ~1.5 s of every run's start (``deferred``)
        SummaryWriter = deferred.import_module("tensorboardX", deferring=TENSORBOARDX_OPTIONAL,
                                               blocking=("torch",)).SummaryWriter

        self.logdir = own_folder(logdir)  # never a link to elsewhere (a run directory from someone else)
        # tensorboardX names files events.out.tfevents.<unix seconds>.<host><suffix> and opens them
        # with "wb": the nanosecond suffix keeps a writer opened in the same second from overwriting
        # the previous file, and keeps TensorBoard's (name-sorted) reading order the creation order.
        self._writer = SummaryWriter(logdir=str(self.logdir), purge_step=purge_step,
                                     filename_suffix=f".{time.time_ns():020d}.{os.getpid()}")

    def scalars(self, step: int, row: dict) -> None:
        """One scalar per finite number in ``row`` (nested dicts become ``outer/inner`` tags);
        strings, None, NaN, infinities, booleans and arrays of more than one element are skipped."""
        step = int(step)
        for tag, value in _finite_numbers(row):
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _finite_numbers(row: dict, prefix: str = ""):
    for key, value in row.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _finite_numbers(value, tag + "/")
            continue
        if isinstance(value, bool) or getattr(value, "dtype", None) == bool:
            continue
        if hasattr(value, "shape") and hasattr(value, "dtype"):  # NumPy / JAX scalars and 0-d arrays
            if value.shape != () or getattr(value.dtype, "kind", "") not in "iuf":
                continue
            value = value.item()
        if isinstance(value, (int, float)) and math.isfinite(value):
            yield tag, float(value)


SWEEP_PANELS = (("eval_return", "evaluation return (unmodified task)"),
                ("true_return", "oracle's return per horizon (training)"),
                ("reward_correlation", "corr(r̂, true) over segments"))


def plot_sweep(groups: dict[str, dict[str, np.ndarray]], steps: np.ndarray, path: str | os.PathLike,
               title: str = "") -> Path:
    """Mean ± std over seeds per setting (``groups``: label -> {metric: [seeds, iterations]}),
    each seed a thin line behind its band; one panel per metric of ``SWEEP_PANELS`` that some
    setting has values of."""
    plt = pyplot()

    def has_data(key):
        return any(np.isfinite(np.asarray(m[key], np.float64)).any() for m in groups.values())

    # a panel only where some setting has a value (a sweep on the true reward has no r̂ to correlate)
    panels = [p for p in SWEEP_PANELS if has_data(p[0])] or list(SWEEP_PANELS[:1])
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False)
    axes = list(axes[0])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, label) in zip(axes, panels):
        for i, (name, metrics) in enumerate(groups.items()):
            y = np.asarray(metrics[key], np.float64)  # [seeds, iterations]
            ok = np.isfinite(y).any(axis=0)
            if not ok.any():
                continue
            color = colors[i % len(colors)]
            for row in y:
                ax.plot(steps[ok], row[ok], color=color, alpha=0.15, linewidth=0.7)
            with np.errstate(invalid="ignore"):
                mean, std = np.nanmean(y[:, ok], axis=0), np.nanstd(y[:, ok], axis=0)
            ax.plot(steps[ok], mean, color=color, label=f"{name} ({y.shape[0]} seeds)")
            ax.fill_between(steps[ok], mean - std, mean + std, color=color, alpha=0.25)
        ax.set_xlabel("environment steps")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save_figure(fig, axes, title, path)
