"""A curation pipeline (``CurationConfig``; its parts in ``pipeline_config.py``), and the engine that runs it shard by
shard, resumably, locally or on Ray or Dask (``run_curation``).

A pipeline reads named sources (lists of shards), runs its stages over every record, and writes the result: each
input shard back under its own name (``output.write_to_filename``), or N partitions, in order or shuffled, with an
optional offline blend in front. It runs in passes, each a set of independent tasks:

1. map passes: one task per input shard runs the record stages and writes the shard out. ``exact_dedup`` and
   ``fuzzy_dedup`` split the stages into two map passes: the first writes each record's hash (or MinHash signature),
   then duplicates are decided (``exact_dedup.py``; ``fuzzy_dedup.py``, itself in tasks), and the second drops them.
2. when writing partitions: a scatter pass (one task per shard: each record, each blend copy, to its bucket) and a
   gather pass (one task per partition, a bucket at a time: bounded memory) (``scatter.py``, ``blend.py``).

Every task writes its output under a temporary name and renames it when complete, then writes its statistics, which
record each file's size and digest; a task whose statistics are there and whose files are still as it wrote them is
done. So a run killed at any moment and run again redoes only unfinished tasks and produces byte-identical output, and
a finished run run again writes anew only the outputs deleted or damaged since. A pipeline's work goes to
``<output>/.curate/<key>``, the key a hash of the pipeline and of its inputs' sizes and modification times (or ETags):
work done for another pipeline, or over inputs that have since changed, is never reused for this one.

``curation_stats.json`` accounts for every input record: read, bad (by reason), removed by each stage (by reason,
per source), blended, written.

Beside this module: ``pipeline_plan.py`` lays a run out (input shards, passes, output names), ``pipeline_tasks.py``
holds the tasks the workers run, ``pipeline_stats.py`` adds up their statistics.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import marshal
import os
import posixpath
import stat
import time
from typing import Any

import draccus
import xxhash
from fsspec.implementations.local import LocalFileSystem
from tqdm.auto import tqdm

import tokenmix.curate.quality  # noqa: F401  (registers the quality stage as a choice of Stage)
from tokenmix._object_stores import url_to_fs
from tokenmix.curate import blend as blending
from tokenmix.curate import exact_dedup, fuzzy_dedup, scatter
from tokenmix.curate.listing import STATS_FILE, WORK_DIR
from tokenmix.curate.partial_files import damage
from tokenmix.curate.pipeline_config import CurationConfig, CurationError
from tokenmix.curate.pipeline_plan import (
    final_url,
    list_shards,
    output_urls,
    partition_count,
    partition_url,
    refuse_inputs_among_outputs,
    split_at_dedups,
)
from tokenmix.curate.pipeline_stats import curation_statistics
from tokenmix.curate.pipeline_tasks import GatherTask, MapTask, ScatterTask, ShardRef, bucket_url, run_gather_task, run_map_task, run_scatter_task
from tokenmix.curate.shard_io import exists, local_or_url_join, output_suffix, read_json, temporary_path, write_json
from tokenmix.curate.stages import ExactDedup
from tokenmix.execution.configs import LocalExecutorConfig
from tokenmix.execution.retrying import run_tasks
from tokenmix.sources.shards import FileShard
from tokenmix.sources.urls import shard_name

logger = logging.getLogger(__name__)

OUTPUTS_FILE = "outputs.json"
"""In a work directory: the files below the output directory that the run writes for its user, and whether it writes
them under its input shards' names."""


def _fingerprint(config: CurationConfig, shards: list[ShardRef]) -> dict[str, Any]:
    """What a work directory is for: the pipeline (not where it runs), each input shard and each model directory's files
    as they are now. Its hash names the work directory, so work done for another pipeline, or over inputs or a model
    since changed, is never taken for this one's."""
    described = describe(dataclasses.replace(config, executor=LocalExecutorConfig(), num_workers=None, keep_intermediate=False))
    models = {}
    for stage in config.stages:
        model_path = getattr(stage, "model_path", None)
        if model_path and os.path.isdir(model_path):
            files = {name: os.stat(os.path.join(model_path, name)) for name in sorted(os.listdir(model_path))}
            models[model_path] = {name: [st.st_size, st.st_mtime_ns] for name, st in files.items() if stat.S_ISREG(st.st_mode)}
    inputs = []
    for shard in shards:
        try:
            identity = FileShard(shard.url).identity()
        except FileNotFoundError:
            identity = None
        inputs.append({"url": shard.url, "identity": identity})
    return {"pipeline": described, "inputs": inputs, **({"models": models} if models else {})}


def describe(value: Any) -> Any:
    """A config as plain JSON values: dataclasses as their fields (a draccus choice with its ``type``), functions by
    import path and a hash of their code (a function edited since makes another pipeline)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        if isinstance(value, draccus.ChoiceRegistry):
            out["type"] = type(value).get_choice_name(type(value))
        for f in dataclasses.fields(value):
            out[f.name] = describe(getattr(value, f.name))
        return out
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [describe(v) for v in value]
    if callable(value):
        code = getattr(value, "__code__", None)
        digest = "" if code is None else "#" + xxhash.xxh3_64_hexdigest(marshal.dumps(code))
        return f"{value.__module__}:{value.__qualname__}{digest}"
    return value


def run_curation(config: CurationConfig) -> dict[str, Any]:
    """Run (or resume) a pipeline; returns what ``curation_stats.json`` holds."""
    started = time.perf_counter()
    out = config.output.path
    shards = list_shards(config)
    fingerprint = _fingerprint(config, shards)
    key = xxhash.xxh3_64_hexdigest(json.dumps(fingerprint, sort_keys=True).encode())
    work = local_or_url_join(out, WORK_DIR, key)
    suffix = output_suffix(config.output.format)
    planned = output_urls(config, shards, suffix)
    refuse_inputs_among_outputs(config, shards, planned)
    _settle_outputs_of_other_runs(out, key, planned, config.output.write_to_filename, [s.url for s in shards])
    if read_json(local_or_url_join(work, "pipeline.json")) is None:
        write_json(local_or_url_join(work, "pipeline.json"), fingerprint)
    if read_json(local_or_url_join(work, OUTPUTS_FILE)) is None:  # before any output is written: what a later run checks
        write_json(local_or_url_join(work, OUTPUTS_FILE), {"write_to_filename": config.output.write_to_filename,
                                                           "files": [_below(out, url) for url in planned]})
    segments = split_at_dedups(config.stages)
    partitioned = not config.output.write_to_filename
    checked: dict[str, str | None] = {}
    finished = read_json(local_or_url_join(work, STATS_FILE))
    if finished is not None:
        final_stats = ([local_or_url_join(work, "gather", "stats", f"{p:06d}.json") for p in range(partition_count(config, shards))] if partitioned
                       else [local_or_url_join(work, f"pass-{len(segments) - 1}", "stats", f"{s.index:06d}.json") for s in shards])
        damaged = [d for url in final_stats for d in _damaged_files(url, read_json(url), True, checked)]
        if not damaged:
            logger.info("%s: this pipeline already ran to completion over these inputs (%s), and its outputs are as it wrote them; "
                        "nothing to do", out, work)
            if not config.keep_intermediate:
                _remove_intermediates(work)  # what a run killed while removing them, or one that kept them, left
            return finished
        logger.warning("%s: this pipeline ran to completion, but outputs are no longer as it wrote them (%d: %s); writing them again",
                       out, len(damaged), "; ".join(damaged[:5]) + ("; ..." if len(damaged) > 5 else ""))
    map_results: list[list[dict[str, Any]]] = []
    removal_urls: list[list[str]] = [[] for _ in shards]
    removal_reason = ""
    decisions: dict[str, Any] = {}
    with config.executor.open(config.num_workers) as executor:
        for k, (first_stage, stages, barrier) in enumerate(segments):
            last = k == len(segments) - 1
            phase = local_or_url_join(work, f"pass-{k}")
            tasks = []
            for shard in shards:
                final = last and not partitioned
                output_url = (final_url(config.output, shard, suffix) if final
                              else local_or_url_join(phase, "data", f"{shard.index:06d}.parquet"))
                tasks.append(MapTask(
                    shard=shard,
                    input_url=shard.url if k == 0 else local_or_url_join(work, f"pass-{k - 1}", "data", f"{shard.index:06d}.parquet"),
                    from_intermediate=k > 0, stages=stages, first_stage=first_stage, removal_urls=removal_urls[shard.index],
                    removal_reason=removal_reason,
                    output_url=output_url, output_format=config.output.format if final else "parquet", keep_hidden=not final,
                    artifact_url=local_or_url_join(phase, "artifacts", f"{shard.index:06d}.parquet") if barrier is not None else None,
                    barrier=barrier, stats_url=local_or_url_join(phase, "stats", f"{shard.index:06d}.json"),
                    filename_field=config.filename_field, on_error=config.on_error, chunk_bytes=config.chunk_bytes))
            map_results.append(_run_phase(executor, run_map_task, tasks, [t.stats_url for t in tasks], f"pass {k + 1}/{len(segments)}",
                                          checked, records=lambda r: r["read"], final=last and not partitioned))
            artifacts = [t.artifact_url for t in tasks if t.artifact_url]

            def run_phase(fn: Any, phase_tasks: list[Any], stats_urls: list[str], label: str) -> list[dict[str, Any]]:
                return _run_phase(executor, fn, phase_tasks, stats_urls, label, checked)

            if isinstance(barrier, ExactDedup):
                decided = exact_dedup.decide(artifacts, local_or_url_join(phase, "dedup"), sum(r["written"] for r in map_results[-1]),
                                             barrier.memory_bytes, [s.source_rank for s in shards], barrier.policy, run_phase)
                removal_urls = [decided for _ in shards]
                removal_reason = "exact_duplicate"
            elif isinstance(barrier, fuzzy_dedup.FuzzyDedup):
                names = [s.name for s in config.sources]
                removal_urls, decisions[str(first_stage + len(stages))] = fuzzy_dedup.decide(
                    barrier, run_phase, artifacts, [t.output_url for t in tasks], [s.text_field for s in shards], names,
                    [s.source_rank for s in shards], [r["written"] for r in map_results[-1]], local_or_url_join(phase, "fuzzy"))
                removal_reason = "fuzzy_duplicate"
        blend_stats = shuffle_stats = None
        outputs: list[str]
        if partitioned:
            outputs, blend_stats, shuffle_stats = _write_partitions(config, executor, shards, map_results[-1], work, len(segments) - 1, checked)
        else:
            outputs = [t.output_url for t in tasks]
    stats = curation_statistics(config, shards, map_results, blend_stats, outputs, time.perf_counter() - started)
    stats["shuffle"] = shuffle_stats
    for index, decision in decisions.items():
        stats["stages"][int(index)]["fuzzy_dedup"] = decision
    write_json(local_or_url_join(out, STATS_FILE), stats)
    write_json(local_or_url_join(work, STATS_FILE), stats)  # last: the run counts as finished once it is there
    if not config.keep_intermediate:
        _remove_intermediates(work)
    return stats


def _settle_outputs_of_other_runs(out: str, key: str, outputs: list[str], to_filenames: bool, inputs: list[str]) -> None:
    """Refuse to run into an output directory where an earlier run of another pipeline (or of this one over inputs
    since changed: another work key) left outputs that this run would not replace: read from the directory with this
    run's, they would be taken for part of its output. Runs that each write their input shards under their own names
    (``to_filenames``) may add to one directory, as NeMo's scripts do batch by batch (``get_remaining_files``); partitions
    are a whole output, never added to. What an earlier run may have written is what its ``outputs.json`` lists, written
    before its first output, so a run killed at any point is known; the temporary files it left for outputs this run
    does not write, which no run would finish or remove, are removed."""
    fs, root = url_to_fs(out)
    ours = {_below(out, url) for url in outputs}
    left: dict[str, str] = {}
    for run in sorted(posixpath.basename(p) for p in _listing(fs, posixpath.join(root, WORK_DIR))):
        earlier = None if run == key else read_json(local_or_url_join(out, WORK_DIR, run, OUTPUTS_FILE))
        if earlier is None or (to_filenames and earlier["write_to_filename"]):
            continue
        for name in earlier["files"]:
            if name in ours or name in left:
                continue
            if exists(local_or_url_join(out, name)):
                left[name] = run
            temporary = temporary_path(posixpath.join(root, name))
            if fs.exists(temporary):
                logger.info("%s: removing %s, the temporary file of an earlier run (%s) for an output this run does not write", out,
                            temporary, run)
                fs.rm_file(temporary)
    if left:
        names = sorted(left)
        read = set(inputs) & {shard_name(local_or_url_join(out, name)) for name in names}
        fix = ("set another output.path: they are this run's inputs" if read else
               "remove them (or the whole directory), or set another output.path")
        raise CurationError(
            f"output.path {out} holds {len(names)} files that an earlier run of another pipeline (or of this one over inputs "
            f"that have since changed) wrote there, and that this run would not replace: {', '.join(names[:5])}"
            f"{', ...' if len(names) > 5 else ''} (work of that run: {', '.join(sorted({local_or_url_join(WORK_DIR, r) for r in left.values()}))}). "
            "Read from the directory with this run's output, they would be taken for part of it (runs may add to one directory "
            f"only when each writes its input shards under their names, output.write_to_filename): {fix}")


def _listing(fs: Any, path: str) -> list[str]:
    """The paths in a directory; none where it is not one (glob patterns would read brackets in ``path`` as classes)."""
    return fs.ls(path, detail=False) if fs.isdir(path) else []


def _below(base: str, url: str) -> str:
    """``url``'s path below the directory ``base``, which holds it."""
    return url[len(base.rstrip("/")) + 1:]


def _run_phase(executor: Any, fn: Any, tasks: list[Any], stats_urls: list[str], label: str, checked: dict[str, str | None],
               records: Any = None, final: bool = False) -> list[dict[str, Any]]:
    """Run the tasks of one pass that have not finished yet; the stats of every task, in task order.

    A task has finished when its stats are there and every file it wrote is still as it wrote it (``_damaged_files``;
    ``final``: the pass writes the pipeline's outputs, checked down to their digests)."""
    results: list[dict[str, Any] | None] = [read_json(url) for url in stats_urls]
    damaged: list[str] = []
    with tqdm(total=sum(r is not None for r in results), desc=f"{label}: checking outputs", unit="task", dynamic_ncols=True,
              disable=not final) as bar:
        for i, url in enumerate(stats_urls):
            if results[i] is not None:
                found = _damaged_files(url, results[i], final, checked)
                if found:
                    damaged += found
                    results[i] = None
                bar.update(1)
    if damaged:
        logger.warning("%s: %d files of finished tasks are not as those tasks wrote them, so the tasks run again: %s", label, len(damaged),
                       "; ".join(damaged[:3]) + ("; ..." if len(damaged) > 3 else ""))
    todo = [i for i, r in enumerate(results) if r is None]
    if len(todo) < len(tasks):
        logger.info("%s: %d of %d tasks done by an earlier run", label, len(tasks) - len(todo), len(tasks))
    started = time.perf_counter()
    docs = 0
    with tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=label, unit="task", dynamic_ncols=True) as bar:
        for j, result in run_tasks(executor, fn, [tasks[i] for i in todo]):
            results[todo[j]] = result
            docs += records(result) if records else result.get("written", 0)
            bar.set_postfix_str(f"{docs / max(time.perf_counter() - started, 1e-9):,.0f} docs/s", refresh=False)
            bar.update(1)
    return [r for r in results if r is not None]


def _damaged_files(stats_url: str, result: dict[str, Any] | None, final: bool, checked: dict[str, str | None]) -> list[str]:
    """What is wrong with the files a finished task wrote (``result``, its stats), as ``'<file>: <what>'``: a final
    output (one a user reads) is checked by size and digest, an intermediate one (the engine's, read once more at
    most) by size. ``checked`` keeps each file's answer for the rest of the run."""
    if result is None:
        return [f"{stats_url}: missing"]
    found = []
    for url, record in result.get("files", {}).items():
        if url not in checked:
            checked[url] = damage(url, record, final)
        if checked[url] is not None:
            found.append(f"{url}: {checked[url]}")
    return found


def _write_partitions(config: CurationConfig, executor: Any, shards: list[ShardRef], results: list[dict[str, Any]], work: str,
                      last_pass: int, checked: dict[str, str | None]) -> tuple[list[str], dict[str, Any] | None, dict[str, Any] | None]:
    """Blend (when asked), then scatter and gather into the output partitions; the output files, the blend's and the
    shuffle's statistics."""
    names = [s.name for s in config.sources]
    counts = [sum(r["written"] for s, r in zip(shards, results, strict=True) if s.source == name) for name in names]
    if config.blend is not None:
        wanted = blending.blend_counts(config.blend.target_size, [config.blend.weights.get(n, 0.0) for n in names])
        for name, count, want in zip(names, counts, wanted, strict=True):
            if count == 0 and want > 0:
                raise CurationError(f"blend.weights gives source {name!r} {want} records, but none of its records are left after the "
                                    "stages; give it weight 0 or loosen its filters")
        plans = blending.plan_sources(counts, wanted, config.blend.seed)
        blend_stats = {name: {"records": c, "blended": w, "whole_copies": p.rounds, "extra": int(len(p.extra))}
                       for name, c, w, p in zip(names, counts, wanted, plans, strict=True)}
    else:
        plans = blending.plan_sources(counts, counts, None)
        blend_stats = None
    total = sum(p.wanted for p in plans)
    partitions = partition_count(config, shards)
    seed = config.shuffle.seed if config.shuffle is not None else None
    nbytes = sum(r["bytes"] * (plans[names.index(s.source)].wanted / max(plans[names.index(s.source)].count, 1))
                 for s, r in zip(shards, results, strict=True))
    buckets = scatter.bucket_count(int(nbytes), partitions, config.shuffle.buffer_bytes) if config.shuffle is not None else partitions
    scatter_dir = local_or_url_join(work, "scatter")
    first: dict[str, int] = dict.fromkeys(names, 0)
    tasks = []
    for shard, result in zip(shards, results, strict=True):
        tasks.append(ScatterTask(shard.index, local_or_url_join(work, f"pass-{last_pass}", "data", f"{shard.index:06d}.parquet"),
                                 plans[names.index(shard.source)], first[shard.source], seed, buckets, partitions, total,
                                 local_or_url_join(scatter_dir, "data"), local_or_url_join(scatter_dir, "stats", f"{shard.index:06d}.json")))
        first[shard.source] += result["written"]
    scattered = _run_phase(executor, run_scatter_task, tasks, [t.stats_url for t in tasks], "scatter", checked)
    suffix = output_suffix(config.output.format)
    gathers = []
    for p in range(partitions):
        members = []
        for bucket in scatter.buckets_of_partition(p, partitions, buckets):
            urls = [bucket_url(local_or_url_join(scatter_dir, "data"), t.index, bucket) for t, r in zip(tasks, scattered, strict=True)
                    if str(bucket) in r["buckets"]]
            members.append((bucket, urls))
        gathers.append(GatherTask(p, members, seed, partition_url(config.output, p, suffix), config.output.format,
                                  local_or_url_join(work, "gather", "stats", f"{p:06d}.json")))
    gathered = _run_phase(executor, run_gather_task, gathers, [g.stats_url for g in gathers], "gather", checked, final=True)
    shuffle_stats = None if seed is None else {"seed": seed, "partitions": partitions, "buckets": buckets, "record_bytes": int(nbytes),
                                                "max_bucket_bytes": max(g["max_bucket_bytes"] for g in gathered)}
    return [g.output_url for g in gathers], blend_stats, shuffle_stats


def _remove_intermediates(work: str) -> None:
    """Remove the records passed between passes and the fuzzy decision's shuffles; statistics and dedup decisions
    (clusters, removals) stay, so that a rerun after a damaged output redoes no decision."""
    fs, path = url_to_fs(work)
    for pattern in ("pass-*/data", "pass-*/artifacts", "pass-*/fuzzy/lsh/buckets", "pass-*/fuzzy/edges/*.parquet",
                    "pass-*/fuzzy/components/round-*/labels", "pass-*/fuzzy/components/round-*/messages",
                    "pass-*/fuzzy/components/members/*.parquet", "pass-*/fuzzy/removed/scatter", "scatter/data"):
        for target in fs.glob(posixpath.join(glob.escape(path), pattern)):
            # fsspec's rm reads its path as a glob, but for local files
            fs.rm(target if isinstance(fs, LocalFileSystem) else glob.escape(target), recursive=True)


def load_curation_config(path: str | os.PathLike[str] | dict[str, Any], overrides: list[str] | None = None) -> CurationConfig:
    """A pipeline from a YAML file (or a mapping), with draccus-style overrides (``--output.path /tmp/out``)."""
    import copy

    from tokenmix.config.loading import decode_document, read_yaml

    where = "the curation config" if isinstance(path, dict) else os.fspath(path)
    doc = copy.deepcopy(path) if isinstance(path, dict) else read_yaml(where)
    return decode_document(CurationConfig, doc, overrides, where, "a curation pipeline", (CurationConfig,))
