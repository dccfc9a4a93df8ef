"""Run outputs: per-iteration metrics (JSONL + CSV), diagnostics, and learning-curve plots."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Iterable

import jax
import jax.numpy as jnp


def segment_return_correlation(predicted: jax.Array, true: jax.Array) -> jax.Array:
    """Pearson correlation between predicted and true segment returns ([S] each); NaN if constant."""
    p = predicted - jnp.mean(predicted)
    t = true - jnp.mean(true)
    denom = jnp.sqrt(jnp.sum(p * p) * jnp.sum(t * t))
    return jnp.where(denom > 0, jnp.sum(p * t) / jnp.maximum(denom, 1e-12), jnp.nan)


class MetricsWriter:
    """Appends one JSON object per line and flushes it, so a crash loses at most the current row.

    A CSV with the union of all columns seen is rewritten by ``close`` (and ``write_csv``).
    """

    def __init__(self, path: str | os.PathLike, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a" if append else "w", encoding="utf-8")

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
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a row cut short by a crash
                    continue
    return rows


def write_csv(rows: Iterable[dict], path: str | os.PathLike) -> None:
    rows = list(rows)
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def plot_learning_curve(rows: list[dict], path: str | os.PathLike, title: str = "") -> Path:
    """PNG with true/evaluation/predicted return, labels, and reward-model quality against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key):
        pts = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None]
        return ([p[0] for p in pts], [p[1] for p in pts]) if pts else ([], [])

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for key, label, style in [("eval_return", "eval return (unmodified task)", "-o"),
                              ("true_return", "true return (training episodes)", "-")]:
        x, y = series(key)
        if x:
            ax.plot(x, y, style, label=label, markersize=3)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("return")
    ax.set_title("true return")
    ax.legend(loc="best", fontsize=8)
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
    for key, label in [("reward_correlation", "corr(r̂, true) on fresh segments"),
                       ("val_accuracy", "ensemble validation accuracy")]:
        x, y = series(key)
        if x:
            ax.plot(x, y, label=label)
    ax.set_ylim(-0.1, 1.05)
    ax.set_xlabel("environment steps")
    ax.set_title("reward model quality")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)

    from matplotlib.ticker import EngFormatter

    for a in axes:
        a.xaxis.set_major_formatter(EngFormatter(sep=""))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
