"""Pictures of a run and of a mixture's schedule (matplotlib, written as PNG files).

``plot_run``: the training loss, each source's training and validation loss, and each source's share of the examples of
every step against its weight (stages visible as steps in the weight lines; the run's weight log, ``weights.jsonl``, when
it has one, so online updates and hand reweights show). ``plot_schedule``: the same weight lines for a mixture config
before any training, or for a run's weight log. A source has one colour in every panel and picture (``source_colors``: by its
place in the config), and legends sit beside the panels, over no data.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import numpy as np

from tokenmix.config.mixture import LMMixtureDatasetConfig
from tokenmix.train.weight_log import WEIGHT_LOG, read_log, stages

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tokenmix.train.config import TrainLmConfig


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scheduled_weights(config: LMMixtureDatasetConfig, steps: int, weight_log: list[tuple[int, dict[str, float]]] | None = None,
                      ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per step ``0..steps-1``: each training source's normalized weight at the step's first example, from the config's
    stages (or a run's ``weight_log``, starts in example indices) and batch sizes."""
    stages = config.weight_schedule() if weight_log is None else weight_log
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


def source_colors(config: LMMixtureDatasetConfig) -> dict[str, tuple[float, ...]]:
    """One colour per source of the config, by its place in the config: the same in every panel and picture."""
    import matplotlib

    names = list(config.configs)
    palette = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: palette(i % palette.N) for i, name in enumerate(names)}


def plot_schedule(config: LMMixtureDatasetConfig, steps: int, path: str, weight_log: list[tuple[int, dict[str, float]]] | None = None) -> str:
    """Each source's scheduled share of the examples by step (the config's, or a run's ``weight_log``), as a stacked area chart;
    returns the file written: ``path``, with ``.png`` added where it has no extension (as matplotlib adds it), its
    directory made where missing."""
    if not os.path.splitext(path)[1][1:]:
        path = path.rstrip(".") + ".png"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    plt = _pyplot()
    x, weights = scheduled_weights(config, steps, weight_log)
    colors = source_colors(config)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.stackplot(x, *weights.values(), labels=list(weights), colors=[colors[n] for n in weights], alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("share of examples")
    ax.set_ylim(0, 1)
    ax.set_xlim(0, max(steps - 1, 1))
    ax.set_title(f"mixture schedule of {len(weights)} sources over {steps:,} steps")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def read_metrics(run_dir: str) -> tuple[list[dict], list[dict]]:
    """The run's training steps and evaluations, the last record of each step kept (a resumed run logs some twice); the
    weight stages an online algorithm logged there are in ``weights.jsonl`` too (``weight_log.read_log``)."""
    train: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if record["kind"] in ("train", "eval"):
                (train if record["kind"] == "train" else evals)[record["step"]] = record
    return [train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)]


def run_title(config: TrainLmConfig, trained: int) -> str:
    """What a run is, in a line or two: the model, the data, the steps and batches, and where it is."""
    model, trainer = config.model, config.trainer
    layers = f"{model.num_layers} layer{'s' if model.num_layers != 1 else ''}"
    return (f"TinyLM ({layers}, {model.hidden_dim} wide) trained {trained:,} of {trainer.num_train_steps:,} steps on "
            f"{', '.join(config.data.configs)}\nbatches of {trainer.first_batch_size()} x {trainer.seq_len} tokens, data seed "
            f"{config.data.seed}; run {trainer.checkpoint_dir}")


def plot_run(config: TrainLmConfig, path: str | None = None) -> str:
    """``run_figure`` written as a PNG: ``train.png`` in the run's directory unless ``path`` says otherwise."""
    plt = _pyplot()
    fig = run_figure(config)
    path = path or os.path.join(config.trainer.checkpoint_dir, "train.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_figure(config: TrainLmConfig) -> Figure:
    """Training loss, validation loss per source, and per-source share of each step's examples against the schedule, for
    the run in ``config.trainer.checkpoint_dir``; a source's lines carry its name as their ``gid``."""
    from matplotlib.lines import Line2D

    plt = _pyplot()
    run_dir = config.trainer.checkpoint_dir
    train, evals = read_metrics(run_dir)
    steps = np.array([r["step"] for r in train])
    colors = source_colors(config.data)
    fig, (loss_ax, share_ax) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    loss_ax.plot(steps, [r["loss"] for r in train], label="train", color="black", lw=1)
    for name in [n for n in colors if any(n in r["loss"] for r in evals)]:
        points = [(r["step"], r["loss"][name]) for r in evals if name in r["loss"]]
        loss_ax.plot(*zip(*points), marker="o", color=colors[name], label=f"validation: {name}", gid=name)
    for name in [n for n in colors if any((r.get("source_loss") or {}).get(n) is not None for r in train)]:
        points = [(r["step"], r["source_loss"][name]) for r in train if (r.get("source_loss") or {}).get(name) is not None]
        loss_ax.plot(*zip(*points), color=colors[name], lw=0.8, alpha=0.6, label=f"train: {name}", gid=name)
    loss_ax.set_ylabel("loss (nats / token)")
    loss_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    log = stages(read_log(run_dir)) if os.path.exists(os.path.join(run_dir, WEIGHT_LOG)) else None
    _, weights = scheduled_weights(config.data, int(steps.max()) + 1 if len(steps) else 1, log)
    for name, weight in weights.items():
        share = np.array([r["sources"].get(name, 0) / r["examples"] for r in train])
        share_ax.plot(steps, share, color=colors[name], alpha=0.3, lw=1, gid=name)
        seen = np.cumsum(share)
        window = 10  # a trailing mean over the last ten steps (fewer at the start)
        trailing = (seen - np.concatenate([np.zeros(window), seen[:-window]])[: len(seen)]) / np.minimum(np.arange(1, len(seen) + 1), window)
        share_ax.plot(steps, trailing, color=colors[name], lw=1.5, gid=name)
        share_ax.plot(np.arange(len(weight)), weight, color=colors[name], ls="--", lw=1.5, gid=name)
    share_ax.set_xlabel("step")
    share_ax.set_ylabel("share of the step's examples")
    share_ax.set_ylim(0, 1)
    legend = [Line2D([], [], color=colors[name], lw=2, label=name) for name in weights]
    legend += [Line2D([], [], color="grey", lw=1.5, label="seen, 10-step mean"),
               Line2D([], [], color="grey", alpha=0.3, lw=1, label="seen, per step"),
               Line2D([], [], color="grey", ls="--", lw=1.5, label="weight (the run's weight log)" if log else "scheduled weight")]
    share_ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    fig.suptitle(run_title(config, len(train)), fontsize=10)
    fig.tight_layout()
    return fig
