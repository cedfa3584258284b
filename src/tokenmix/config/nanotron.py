"""Nanotron's ``data_stages`` (a Nanotron training YAML, or its ``data_stages`` list alone) as a tokenmix mixture.

Each stage's ``data.dataset.data_path`` (one path, or a mapping of paths to weights; newer Nanotron's
``dataset_folder`` likewise) names token files: a ``.npy`` file is a Nanoset dump, a folder holds datatrove ``.ds``
files. Every path becomes a token-file source named after its file; the stages become weight stages from
``start_training_step`` (Nanotron counts steps from 1, tokenmix from 0); ``split`` (Nanotron's default ``949,50,1``
for Nanoset files) cuts each source into contiguous train / validation / test parts. Examples follow Nanotron's
conventions: Nanoset files give ``seq_len + 1`` tokens read every ``seq_len``; datatrove folders alone, windows of
``seq_len + 1`` that do not overlap nor cross a file's end. The batch size is Nanotron's ``micro_batch_size x
batch_accumulation_per_replica x dp``.

A config of Nanoset files reads in Nanotron's own order (``example_order: nanotron``): each stage's seed (Nanotron's
default 42 where unset) and paths in the order given, ``tokens.train_steps``. Datatrove folders belong to a later
Nanotron whose order this does not reproduce: such configs keep tokenmix's order, with the first stage's ``seed``.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from tokenmix.formats.tokenizer_identity import tokenizer_identity

logger = logging.getLogger(__name__)

NANOSET_SUFFIXES = ("_input_ids.npy", ".npy")
NANOTRON_SPLIT = "949,50,1"
"""Nanotron's ``split`` where a Nanoset stage gives none."""
NANOTRON_SEED = 42
"""Nanotron's ``data.seed`` where a stage gives none."""


def is_nanotron(doc: dict[str, Any]) -> bool:
    """Whether a YAML document is (or holds) Nanotron's ``data_stages``."""
    return "data_stages" in doc


def _source_name(path: str, taken: set[str]) -> str:
    base = os.path.basename(path.rstrip("/"))
    for suffix in NANOSET_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", base) or "source"
    unique, n = name, 2
    while unique in taken:
        unique, n = f"{name}_{n}", n + 1
    return unique


def _paths(dataset: dict[str, Any], where: str) -> dict[str, float]:
    given = dataset.get("data_path", dataset.get("dataset_folder"))
    if given is None:
        raise ValueError(f"{where}: data.dataset has no data_path (nor dataset_folder); name the Nanoset .npy file(s) or datatrove folder(s)")
    if isinstance(given, str):
        return {given: 1.0}
    if isinstance(given, list):
        weights = dataset.get("dataset_weights") or [1.0] * len(given)
        if len(weights) != len(given):
            raise ValueError(f"{where}: {len(given)} dataset folders but {len(weights)} dataset_weights; give one weight each")
        return {str(p): float(w) for p, w in zip(given, weights)}
    if isinstance(given, dict):
        return {str(p): float(w) for p, w in given.items()}
    raise ValueError(f"{where}: data_path must be a path or a mapping of paths to weights, got {type(given).__name__}")


def nanotron_mixture(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The tokenmix mixture document of a Nanotron config's ``data_stages`` (its tokenizer and batch size too, where the
    config gives them)."""
    stages = doc["data_stages"]
    if not isinstance(stages, list) or not stages:
        raise ValueError(f"{where}: data_stages must be a non-empty list of stages")
    tokenizer = doc.get("tokenizer")
    tokenizer = tokenizer.get("tokenizer_name_or_path") if isinstance(tokenizer, dict) else tokenizer
    sources: dict[str, dict[str, Any]] = {}
    by_path: dict[str, str] = {}
    weights: list[list[Any]] = []
    seeds: list[Any] = []
    cache_dir = None
    for i, stage in enumerate(sorted(stages, key=lambda s: int(s.get("start_training_step", 1)))):
        here = f"{where}: data_stages[{i}] ({stage.get('name', 'unnamed')})"
        data = stage.get("data") or {}
        dataset = data.get("dataset") or {}
        seeds.append(data.get("seed"))
        cache_dir = cache_dir or dataset.get("path_to_cache")
        stage_weights: dict[str, float] = {}
        for path, weight in _paths(dataset, here).items():
            kind = "nanoset" if path.endswith(".npy") else "datatrove"
            split = dataset.get("split", NANOTRON_SPLIT if kind == "nanoset" else None)
            if path not in by_path:
                name = by_path[path] = _source_name(path, set(sources))
                token_files: dict[str, Any] = {"kind": kind}
                if kind == "nanoset" and tokenizer:
                    from tokenmix.sources.nanoset import nanoset_dtype  # here: the Nanoset reader imports numpy, and reading a config must not

                    token_files["dtype"] = nanoset_dtype(tokenizer_identity(tokenizer).vocab_size)
                if split is not None:
                    token_files["split"] = str(split)
                sources[name] = {"train_urls": [path], "token_files": token_files}
            elif split is not None and sources[by_path[path]]["token_files"].get("split") != str(split):
                raise ValueError(f"{here}: {path} is split {split} here but otherwise in another stage; Nanotron splits a "
                                 "dataset once, so give it one split")
            stage_weights[by_path[path]] = weight
        start = int(stage.get("start_training_step", 1)) - 1
        if start < 0:
            raise ValueError(f"{here}: start_training_step must be at least 1 (Nanotron counts steps from 1)")
        weights.append([start, stage_weights])
    if weights[0][0] != 0:
        raise ValueError(f"{where}: the first stage starts at step {weights[0][0] + 1}; Nanotron's first stage starts at step 1")
    kinds = {source["token_files"]["kind"] for source in sources.values()}
    if kinds == {"nanoset", "datatrove"}:
        logger.info("%s: Nanoset files and datatrove folders in one config: every source is read in Nanoset's examples "
                    "(seq_len + 1 tokens every seq_len); Nanotron reads datatrove folders in windows that do not overlap", where)
    convention = "datatrove" if kinds == {"datatrove"} else "megatron"
    mixture: dict[str, Any] = {"configs": sources, "train_weights": weights if len(weights) > 1 else weights[0][1],
                               "example_convention": convention, "shuffle": True, "seed": int(seeds[0] or 0),
                               "cache_dir": cache_dir or ".tokenmix_cache"}
    if tokenizer:
        mixture["tokenizer"] = tokenizer
    tokens = doc.get("tokens") or {}
    dp = (doc.get("parallelism") or {}).get("dp", 1)
    if "micro_batch_size" in tokens:
        mixture["batch_size"] = int(tokens["micro_batch_size"]) * int(tokens.get("batch_accumulation_per_replica", 1)) * int(dp)
    if kinds == {"nanoset"}:
        mixture["example_order"] = "nanotron"
        mixture["stage_seeds"] = [NANOTRON_SEED if seed is None else int(seed) for seed in seeds]
        if "train_steps" in tokens and "batch_size" in mixture:
            mixture["train_steps"] = int(tokens["train_steps"])
    else:
        logger.info("%s: datatrove folders are read in tokenmix's order (Nanotron's order is reproduced for Nanoset files only)", where)
    return mixture
