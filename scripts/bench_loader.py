"""Benchmark the loader: time to first batch, steady throughput and CPU cost on a (4, 2) fake CPU mesh.

Builds (or reuses) the caches of ../shared/corpus (config/shared_corpus.yaml), then streams shuffled
64 x 2048 batches of the three-source mixture through ``DataLoader`` onto a (data 4, model 2) mesh of 8
fake CPU devices (batch over ``data``, ``model`` replicated), and in the same run gathers the very same
token windows from raw numpy memmaps of the caches' token streams (the limit). Runs alternate and the
best of each counts (the 2-core VMs share hosts). Reports:

* time to first batch: build the mixture and the loader and take the first batch (caches ready, JAX
  already started);
* steady tokens/s of the loader (consumer blocks until each batch is on the devices), with and
  without fingerprints, without prefetch (read and placed in the consumer's thread, as the limit is) and with one
  reader process (``workers=1``, timed after a first pass that fills that process's chunk cache), and of the
  bare dataset (``get_batch``), each as a ratio to the memmap gather;
* the memmap gather plus placing its rows on the mesh as the loader places its four arrays
  (``jax.make_array_from_process_local_data``): the limit for a loader on this mesh, JAX's own cost
  included;
* the tightest limit: the same gather written into 64-byte-aligned arrays and placed as the loader places
  (``tokenmix.loader.placement.ArrayPlacer``, JAX's dispatch done once);
* CPU seconds (all threads, ``time.process_time``) per million tokens for each;
* beside a training step (``--step_ms``, default 1 ms, standing for the device's step: the consumer sleeps that long
  after taking each batch, the GIL released as it is while a program waits on its accelerator): the time per step
  with the default ``prefetch=2``, with ``prefetch=0`` and with one reader process against the sleep alone, i.e. how
  much of the loader's own time the step still sees.

Run from the repository root:  .venv/bin/python scripts/bench_loader.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterator

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before JAX starts a backend

import numpy as np  # noqa: E402 - after the device count, by intent
from memmap_baseline import memmap_gather  # noqa: E402

from tokenmix import DataLoader, StepBatch, build_caches, load_data_config  # noqa: E402
from tokenmix.datasets.base import aligned_empty  # noqa: E402
from tokenmix.loader.placement import ArrayPlacer  # noqa: E402

MAPPING = {"batch": "data"}
STEP_ALONE, STEP_PREFETCH, STEP_NO_PREFETCH = "step alone", "loader beside the step", "loader, prefetch 0, beside the step"
STEP_PROCESS = "loader, 1 reader process, beside the step"


def timed(run: Callable[[], tuple[float, float] | None], tokens: int) -> tuple[float, float]:
    """(tokens per second, CPU seconds of this process per million tokens) of ``run``: its whole time, or the (wall, CPU)
    seconds it returns (the part of it that counts, after a warm-up)."""
    wall, cpu = time.perf_counter(), time.process_time()
    counted = run()
    wall, cpu = counted or (time.perf_counter() - wall, time.process_time() - cpu)
    return tokens / wall, cpu / tokens * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", default="config/shared_corpus.yaml")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step_ms", type=float, default=1.0, help="the stand-in training step (a sleep) for the 'beside a step' rows")
    parser.add_argument("--platform", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: a (4, 2) mesh of 8 fake CPU devices; gpu: the machine's GPUs as a (n, 1) mesh")
    args = parser.parse_args()
    config = load_data_config(args.config_path, [])
    build_caches(config, progress=False)
    devices = jax.devices(args.platform)
    mesh_shape = (4, 2) if args.platform == "cpu" else (len(devices), 1)
    mesh = jax.make_mesh(mesh_shape, ("data", "model"), devices=devices[: mesh_shape[0] * mesh_shape[1]])
    jax.block_until_ready(jax.device_put(np.zeros(8), devices[0]))  # JAX's start-up is the training program's, not the loader's

    start = time.perf_counter()
    train = config.train_set(args.seq_len)
    loader = DataLoader(train, args.batch, mesh, MAPPING)
    first = next(iter(loader))
    jax.block_until_ready(first.batch)
    first_batch_s = time.perf_counter() - start
    print(f"time to first batch (open {len(train.names)} caches, build the mixture and the loader, read and place {args.batch} x {args.seq_len} "
          f"on a {mesh_shape} {args.platform} mesh): {first_batch_s:.3f} s")

    start_step, steps = 1, args.batches
    tokens = steps * args.batch * args.seq_len
    index = np.arange(start_step * args.batch, (start_step + steps) * args.batch)

    def stream(fingerprint: bool, prefetch: int = 2, workers: int = 0) -> Callable[[], tuple[float, float] | None]:
        """The loader's batches; with reader processes, only a second pass of ``steps`` batches counts: the first fills
        the readers' own chunk caches (this process's is warm from the first loader)."""
        def run() -> tuple[float, float] | None:
            with DataLoader(train, args.batch, mesh, MAPPING, fingerprint=fingerprint, prefetch=prefetch, workers=workers) as ld:
                it = ld.iter_from_step(start_step)
                if not workers:
                    for sb, _ in zip(it, range(steps)):
                        jax.block_until_ready(sb.batch)
                    return None
                return warm_then_time(it, lambda: None)
        return run

    def warm_then_time(it: Iterator[StepBatch], step: Callable[[], None]) -> tuple[float, float]:
        """Take ``steps`` batches, then time ``steps`` more, each followed by ``step()``."""
        for sb, _ in zip(it, range(steps)):
            jax.block_until_ready(sb.batch)
        wall, cpu = time.perf_counter(), time.process_time()
        for sb, _ in zip(it, range(steps)):
            jax.block_until_ready(sb.batch)
            step()
        return time.perf_counter() - wall, time.process_time() - cpu

    step_s = args.step_ms / 1000

    def beside_step(prefetch: int | None, workers: int = 0) -> Callable[[], tuple[float, float] | None]:
        """The consumer takes each batch and then waits ``step_s`` (the device's step); ``None``: the wait alone."""
        def run() -> tuple[float, float] | None:
            if prefetch is None:
                for _ in range(steps):
                    time.sleep(step_s)
                return None
            with DataLoader(train, args.batch, mesh, MAPPING, prefetch=prefetch, workers=workers) as ld:
                it = ld.iter_from_step(start_step)
                if workers:  # as in stream(): the readers' caches filled first
                    return warm_then_time(it, lambda: time.sleep(step_s))
                for sb, _ in zip(it, range(steps)):
                    jax.block_until_ready(sb.batch)
                    time.sleep(step_s)
            return None
        return run

    def dataset() -> None:
        for s in range(steps):
            train.get_batch(index[s * args.batch : (s + 1) * args.batch])

    with tempfile.TemporaryDirectory() as tmp:
        gather = memmap_gather(config, train, index, args.seq_len, tmp)
        assert np.array_equal(np.asarray(loader.batch(start_step).batch.tokens.array), gather(index[: args.batch])), "must gather the same rows"

        def memmap() -> None:
            for s in range(steps):
                gather(index[s * args.batch : (s + 1) * args.batch])

        layout = loader._layout(args.batch)
        token_sharding, row_sharding = layout.token_sharding, layout.row_sharding
        shape = (args.batch, args.seq_len)

        def memmap_placed() -> None:
            """The memmap gather of the same rows, placed on the mesh as the loader's four arrays are (JAX's own cost)."""
            for s in range(steps):
                tokens = gather(index[s * args.batch : (s + 1) * args.batch])
                arrays = [tokens, tokens != 0, tokens, np.zeros(args.batch, np.int32)]
                jax.block_until_ready(jax.make_array_from_process_local_data(
                    [token_sharding, token_sharding, token_sharding, row_sharding], arrays, [shape, shape, shape, shape[:1]]))

        placer = ArrayPlacer([token_sharding, token_sharding, token_sharding, row_sharding])
        aligned = aligned_empty([(shape, np.int32), (shape, bool), (shape[:1], np.int32)])

        def memmap_placed_direct() -> None:
            """The same gather into 64-byte-aligned arrays, placed as the loader places them (``ArrayPlacer``): the tightest limit."""
            tokens, mask, sources = aligned
            sources[:] = 0
            for s in range(steps):
                gather(index[s * args.batch : (s + 1) * args.batch], out=tokens)
                np.not_equal(tokens, 0, out=mask)
                jax.block_until_ready(placer([tokens, mask, tokens, sources]))

        runs = {"loader": stream(False), "loader + fingerprints": stream(True), "loader, prefetch 0": stream(False, 0),
                "loader, 1 reader process": stream(False, workers=1),
                "dataset.get_batch": dataset, "memmap gather": memmap,
                "memmap gather + placement": memmap_placed, "memmap + direct placement": memmap_placed_direct,
                **{STEP_ALONE: beside_step(None), STEP_PREFETCH: beside_step(2), STEP_NO_PREFETCH: beside_step(0),
                   STEP_PROCESS: beside_step(2, workers=1)}}
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeats):
            for label, run in runs.items():
                rate, cpu = timed(run, tokens)
                if label not in best or rate > best[label][0]:
                    best[label] = (rate, cpu)
    loader.close()
    limit = best["memmap gather"][0]
    placed = best["memmap gather + placement"][0]
    direct = best["memmap + direct placement"][0]
    alone, with_prefetch, without, in_process = (tokens / best.pop(label)[0] / steps * 1e3
                                                 for label in (STEP_ALONE, STEP_PREFETCH, STEP_NO_PREFETCH, STEP_PROCESS))
    print(f"{steps} shuffled batches of {args.batch} x {args.seq_len} from {train.names}, best of {args.repeats}:")
    for label, (rate, cpu) in best.items():
        print(f"  {label:<26} {rate / 1e6:7.1f} M tok/s  ratio to memmap {rate / limit:5.2f}x, to memmap + placement "
              f"{rate / placed:5.2f}x, to memmap + direct placement {rate / direct:5.2f}x  CPU {cpu:.3f} s per M tokens")
    print(f"beside a {args.step_ms:g} ms step (a sleep): {alone:.3f} ms per step alone, {with_prefetch:.3f} ms with the loader "
          f"(prefetch 2), {without:.3f} ms with prefetch 0: the step sees {with_prefetch - alone:.3f} ms of the loader's "
          f"{without - alone:.3f} ms; with 1 reader process {in_process:.3f} ms ({in_process - alone:.3f} ms seen)")


if __name__ == "__main__":
    main()
