"""Benchmark online mixing (issue 38): what ODM and DoReMi do to the tiny model's per-source validation losses, what the
per-source statistics and the updates cost, and the start-up and memory of a mixture with a long weight log.

1. Quality: a tiny model (hidden 64, 1 layer, batches of 8 x 64 tokens, one device) on the bundled three-source demo
   mixture (config/train_demo.yaml otherwise), equal steps, fixed weights (the demo's 0.5 / 0.3 / 0.2) against ODM and
   against DoReMi (its reference: the fixed run). Reports each source's final validation loss, their mean and the worst
   source (DoReMi's target).
2. Cost, as a share of the fixed run's median step time: the per-source sums the step adds (``per_source`` of the row
   sums, timed alone, jitted, on the step's shapes), and an update (the updater, ``append_stage`` and the log written).
3. Start-up and traced memory of a MixtureDataset over 1,000 synthetic sources built with a log of 1,000 and of 10,000
   stages, and over 3 sources with 10,000 (an online run's log), ``append_stage`` on it, and its first read in the
   last stage.

Run from the repository root:  .venv/bin/python scripts/bench_adaptive.py [--steps 150] [--out runs/bench_adaptive]
The long logs alone:           .venv/bin/python scripts/bench_adaptive.py --long-logs-only [--long-logs 1000x1000,3x10000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
import tracemalloc

import numpy as np

STEPS_DEFAULT = 200


def quality(out: str, steps: int) -> dict[str, dict]:
    """Train fixed, ODM and DoReMi runs of ``steps`` steps; each run's final validation losses and median step time."""
    from tokenmix.train.config import load_train_config
    from tokenmix.train.loop import train
    from tokenmix.train.plots import read_metrics

    common = ["--trainer.num_train_steps", str(steps), "--trainer.mesh", "{data: 1, model: 1}",
              "--trainer.steps_per_eval", str(steps), "--trainer.max_eval_batches", "8", "--trainer.steps_per_checkpoint", str(steps),
              "--trainer.train_batch_size", "8", "--trainer.seq_len", "64", "--trainer.warmup_steps", "10",
              "--trainer.learning_rate", "0.01", "--model.hidden_dim", "64", "--model.num_layers", "1", "--model.num_heads", "2",
              "--data.mixture_block_size", "64"]
    results = {}
    for name, adaptive in (("fixed", None), ("odm", {"algorithm": "odm", "update_every": 10}),
                           ("doremi", {"algorithm": "doremi", "update_every": 10, "reference_metrics": os.path.join(out, "fixed", "metrics.jsonl")})):
        run = os.path.join(out, name)
        shutil.rmtree(run, ignore_errors=True)
        extra = [] if adaptive is None else ["--data.adaptive", json.dumps(adaptive)]
        config = load_train_config("config/train_demo.yaml", [*common, "--trainer.checkpoint_dir", run, *extra])
        began = time.perf_counter()
        result = train(config)
        train_steps, _ = read_metrics(run)
        results[name] = {"validation": result.validation, "step_s": statistics.median(r["seconds"] for r in train_steps[1:]),
                         "wall_s": time.perf_counter() - began, "config": config}
        print(f"{name}: {result.validation} in {results[name]['wall_s']:.0f} s", file=sys.stderr)
    return results


def stats_cost(config, step_s: float) -> tuple[float, float]:
    """Seconds the per-source sums take on the step's shapes (jitted, the median of 200), and one update's seconds."""
    import jax
    import jax.numpy as jnp

    from tokenmix.config.adaptive import AdaptiveMixing
    from tokenmix.loader.batch_schedule import BatchSchedule
    from tokenmix.mixing.source_stats import SourceStats
    from tokenmix.mixing.weight_updaters import OdmUpdater
    from tokenmix.train.model import per_source
    from tokenmix.train.online_mixing import OnlineMixing
    from tokenmix.train.weight_log import config_log, write_log

    batch = config.trainer.train_batch_size
    rows, counts = jnp.ones(batch), jnp.full(batch, float(config.trainer.seq_len))
    ids = jnp.asarray(np.arange(batch) % 3, jnp.int32)
    sums = jax.jit(lambda r, c, i: jnp.stack([per_source(r, i, 3), per_source(c, i, 3)]))
    sums(rows, counts, ids).block_until_ready()
    times = []
    for _ in range(200):
        began = time.perf_counter()
        sums(rows, counts, ids).block_until_ready()
        times.append(time.perf_counter() - began)
    train_set = config.data.train_set(config.trainer.seq_len)
    schedule = BatchSchedule.of(batch)
    log = config_log(train_set, schedule)
    updater = OdmUpdater(AdaptiveMixing("odm", update_every=1), train_set.names)
    zero = np.zeros(len(train_set.names))
    mixing = OnlineMixing(updater.config, updater, SourceStats(tuple(train_set.names), zero, zero), train_set, schedule, 4)
    stats = SourceStats(tuple(train_set.names), np.array([700.0, 900.0, 800.0]), np.array([100.0, 120.0, 110.0]))
    run_dir = os.path.join(os.path.dirname(config.trainer.checkpoint_dir), "update_cost")
    os.makedirs(run_dir, exist_ok=True)
    updates = []
    for step in range(100):
        began = time.perf_counter()
        stage = mixing.observe(step * 20, stats)
        assert stage is not None
        train_set.append_stage(stage.start, stage.weights)
        log.append(stage)
        write_log(run_dir, log)
        updates.append(time.perf_counter() - began)
    return statistics.median(times), statistics.median(updates)


def long_log(sources: int, stages: int) -> dict[str, float]:
    """A mixture of ``sources`` synthetic sources with a log of ``stages`` stages, one block (2,048 indices) each, the
    weights as an online algorithm sets them (multiples of 1e-4, every stage its own dict): construction's seconds
    (best of 3) and traced peak MiB, one ``append_stage``'s seconds, and the first ``locate`` of a batch in the last
    stage (which finds the base counts of every stage before it): its seconds, and its traced peak MiB up to 10^6
    weights (nan beyond)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from bench_datasets import Synthetic

    from tokenmix import MixtureDataset

    rng = np.random.default_rng(0)
    names = [f"s{i:04d}" for i in range(sources)]
    datasets = {n: Synthetic(10**10) for n in names}

    def weights() -> dict[str, float]:
        units = rng.integers(1, 20, sources)
        return {n: int(u) / 10_000 for n, u in zip(names, units)}

    log = [(i * 2048, weights()) for i in range(stages)]
    built = math.inf
    for _ in range(3):  # the best of 3: the machine's other work only ever adds
        began = time.perf_counter()
        MixtureDataset(datasets, log)
        built = min(built, time.perf_counter() - began)
    tracemalloc.start()
    mix = MixtureDataset(datasets, log)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    began = time.perf_counter()
    mix.append_stage(stages * 2048, weights())
    appended = time.perf_counter() - began
    last = np.arange(stages * 2048 - 8, stages * 2048)
    began = time.perf_counter()
    mix.locate(last)
    located = time.perf_counter() - began
    read_peak = math.nan
    if sources * stages <= 10**6:  # traced again on a fresh mixture (tracing slows the walk several times over)
        fresh = MixtureDataset(datasets, log)
        tracemalloc.start()
        fresh.locate(last)
        _, read_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return {"construct_s": built, "construct_mib": peak / 2**20, "append_s": appended, "first_read_s": located,
            "first_read_mib": read_peak / 2**20}


def print_long_logs(cases: list[tuple[int, int]]) -> None:
    for sources, stages in cases:
        r = long_log(sources, stages)
        print(f"{sources:,} sources, {stages:,} logged stages: construct {r['construct_s'] * 1e3:.1f} ms, traced peak "
              f"{r['construct_mib']:.2f} MiB; append_stage {r['append_s'] * 1e3:.2f} ms; first read in the last stage "
              f"{r['first_read_s']:.2f} s, traced peak {r['first_read_mib']:.1f} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS_DEFAULT)
    parser.add_argument("--out", default="runs/bench_adaptive")
    parser.add_argument("--long-logs", default="1000x1000,1000x10000,3x10000",
                        help="the long-log cases, SOURCESxSTAGES, comma-separated")
    parser.add_argument("--long-logs-only", action="store_true", help="measure the long logs alone, no training runs")
    args = parser.parse_args()
    cases = [tuple(int(n) for n in case.split("x")) for case in args.long_logs.split(",")]
    if args.long_logs_only:
        print_long_logs(cases)
        return
    results = quality(args.out, args.steps)
    names = list(results["fixed"]["validation"])
    print("| run | " + " | ".join(names) + " | mean | worst | median step |")
    print("|---|" + "---|" * (len(names) + 3))
    for run, r in results.items():
        losses = [r["validation"][n] for n in names]
        worst = max(range(len(names)), key=lambda i: losses[i])
        print(f"| {run} | " + " | ".join(f"{v:.3f}" for v in losses) + f" | {np.mean(losses):.3f} | {names[worst]} {losses[worst]:.3f} "
              f"| {r['step_s'] * 1e3:.0f} ms |")
    step_s = results["fixed"]["step_s"]
    sums_s, update_s = stats_cost(results["fixed"]["config"], step_s)
    print(f"per-source sums: {sums_s * 1e6:.0f} us a step = {100 * sums_s / step_s:.3f}% of a {step_s * 1e3:.0f} ms step; "
          f"an update: {update_s * 1e3:.2f} ms = {100 * update_s / (10 * step_s):.3f}% of the 10 steps between updates")
    print_long_logs(cases)


if __name__ == "__main__":
    main()
