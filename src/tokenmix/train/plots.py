"""Pictures of a run and of a mixture's schedule (matplotlib, written as PNG files).

``plot_run``: the training loss, each source's validation loss, and each source's share of the examples of every step
against its scheduled weight (stages visible as steps in the weight lines). ``plot_schedule``: the same weight lines for
a mixture config before any training.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from tokenmix.config.mixture import LMMixtureDatasetConfig


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scheduled_weights(config: LMMixtureDatasetConfig, steps: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per step ``0..steps-1``: each training source's normalized weight, from the config's stages and batch sizes."""
    stages = config.weight_schedule()
    schedule = config.batch_schedule()
    offsets = np.array([schedule.offset(s) if schedule else s for s in range(steps)])
    names = [n for n in config.configs if any(w.get(n, 0) > 0 for _, w in stages)]
    out = {n: np.zeros(steps) for n in names}
    starts = [start for start, _ in stages]
    stage = np.searchsorted(starts, offsets, side="right") - 1
    for i, (_, weights) in enumerate(stages):
        total = sum(weights.get(n, 0.0) for n in names)
        for n in names:
            out[n][stage == i] = weights.get(n, 0.0) / total
    return np.arange(steps), out


def plot_schedule(config: LMMixtureDatasetConfig, steps: int, path: str) -> str:
    """Each source's scheduled share of the examples by step, as a stacked area chart."""
    plt = _pyplot()
    x, weights = scheduled_weights(config, steps)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.stackplot(x, *weights.values(), labels=list(weights), alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("share of examples")
    ax.set_ylim(0, 1)
    ax.set_title("mixture schedule")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def read_metrics(run_dir: str) -> tuple[list[dict], list[dict]]:
    """The run's training steps and evaluations, the last record of each step kept (a resumed run logs some twice)."""
    train: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            (train if record["kind"] == "train" else evals)[record["step"]] = record
    return [train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)]


def plot_run(config: LMMixtureDatasetConfig, run_dir: str, path: str | None = None) -> str:
    """Training loss, validation loss per source, and per-source share of each step's examples against the schedule."""
    plt = _pyplot()
    train, evals = read_metrics(run_dir)
    steps = np.array([r["step"] for r in train])
    fig, (loss_ax, share_ax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    loss_ax.plot(steps, [r["loss"] for r in train], label="train", color="black", lw=1)
    sources: Sequence[str] = sorted({n for r in evals for n in r["loss"]})
    for name in sources:
        points = [(r["step"], r["loss"][name]) for r in evals if name in r["loss"]]
        loss_ax.plot(*zip(*points), marker="o", label=f"validation: {name}")
    loss_ax.set_ylabel("loss (nats / token)")
    loss_ax.legend(fontsize=8)
    loss_ax.set_title(os.path.basename(os.path.abspath(run_dir)))
    _, weights = scheduled_weights(config, int(steps.max()) + 1 if len(steps) else 1)
    for i, (name, weight) in enumerate(weights.items()):
        color = f"C{i}"
        share = np.array([r["sources"].get(name, 0) / r["examples"] for r in train])
        share_ax.plot(steps, share, color=color, alpha=0.35, lw=1)
        seen = np.cumsum(share)
        window = 10  # a trailing mean over the last ten steps (fewer at the start)
        trailing = (seen - np.concatenate([np.zeros(window), seen[:-window]])[: len(seen)]) / np.minimum(np.arange(1, len(seen) + 1), window)
        share_ax.plot(steps, trailing, color=color, lw=1.5, label=f"{name}, seen (10-step mean)")
        share_ax.plot(np.arange(len(weight)), weight, color=color, ls="--", lw=1.5, label=f"{name}, scheduled")
    share_ax.set_xlabel("step")
    share_ax.set_ylabel("share of the step's examples")
    share_ax.set_ylim(0, 1)
    share_ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = path or os.path.join(run_dir, "train.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
