"""A Nanotron config of Nanoset files gives Nanotron's own sample order: Nanoset and BlendedNanoset, and the trainer's
switch between data stages, checked against numbers Nanotron's code produced.

How ``tests/data/nanotron/nanotron_order.npz`` was made: huggingface/nanotron at commit
e3190be3406cb19bf9d4e5129bebe68d59b030c4 (the Nanosets design our reference document describes), installed from its
source in a separate venv (Python 3.11, torch 2.13.0+cpu, numpy 2.4.6; the trainer's model imports ``flash_attn``,
which was stubbed: no model was built). Three headerless uint16 token files were written with ``token_file`` below
(a 40,001, b 70,003, c 25,013, d 24,000 tokens, a whole number of samples; their sha256 are in the fixture).

- ``{single,blend2,blend3}_{1234,42,7}_*``: ``NanosetBuilder(NanosetConfig(random_seed=seed, sequence_length=32,
  data_path=..., split="949,50,1", train_split_samples=10000, path_to_cache=...)).build()`` (``nanotron/data/
  dataset_builder.py``) under a one-process gloo group; ``data_path`` is ``a`` (a plain Nanoset), ``{a: 0.7, b: 0.3}``,
  or ``{a: 0.2, b: 0.3, c: 0.5}`` (largest weight last). For the first 10,000 positions of the train dataset: ``_file``
  is BlendedNanoset's ``dataset_index`` (0 for the Nanoset), ``_sample`` the file's sample index it reads
  (``shuffle_index[i]``, or ``datasets[dataset_index[i]].shuffle_index[dataset_sample_index[i]]``), ``_tokens`` the
  ``input_ids`` of ``train[i]`` for ``i`` in ``picks``, ``_length`` ``len(train)``. ``bounds_*``:
  ``get_split_indices([0.949, 0.05, 0.001], tokens, 32)`` of each file.
- ``stages_*``: two data stages (``warmup`` from step 1: ``{a: 0.7, b: 0.3}``, seed 1234; ``anneal`` from step 11:
  ``{b: 0.25, c: 0.75}``, seed 42; split 949,50,1) run through ``run_train_nanoset.get_dataloader`` and
  ``DistributedTrainer._update_dataloader_based_on_training_stages`` called as ``DistributedTrainer.train`` calls them
  (steps 1..20, ``consumed_train_samples += 8`` after each), with two data-parallel ranks (two gloo processes),
  micro_batch_size 2, batch_accumulation_per_replica 2, sequence_length 32, train_steps 20. Each micro-batch's
  ``input_ids`` plus its last label is a sample, looked up in the files: ``[step, dp rank, micro-batch, row]`` holds
  its file (0 a, 1 b, 2 c) and sample index.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import TOKENIZER

import tokenmix
from tokenmix import DataLoader
from tokenmix.datasets.greedy_blend import GreedyBlend
from tokenmix.datasets.nanoset_order import NanosetOrderDataset

FIXTURE = np.load(Path(__file__).parent / "data" / "nanotron" / "nanotron_order.npz")
SEQ = 32
FILES = {"a": (40_001, 1), "b": (70_003, 2), "c": (25_013, 3), "d": (24_000, 4)}
CASES = {"single": "a", "blend2": {"a": 0.7, "b": 0.3}, "blend3": {"a": 0.2, "b": 0.3, "c": 0.5}}


def token_file(n: int, salt: int) -> np.ndarray:
    """The fixture's token files: a multiplicative hash of the position, so every 33-token sample is distinct."""
    return ((np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(salt * 7919)) % np.uint64(32000)).astype(np.uint16)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("nanosets")
    paths = {}
    for name, (n, salt) in FILES.items():
        paths[name] = folder / f"{name}_input_ids.npy"
        token_file(n, salt).tofile(paths[name])
        assert hashlib.sha256(paths[name].read_bytes()).hexdigest() == str(FIXTURE[f"sha256_{name}"])
    return paths


def nanotron_config(tmp_path: Path, stages: list[tuple[int, str | dict[str, float], int]], train_steps: int) -> str:
    """A Nanotron training YAML (global batch 2 x 2 x 2 = 8) with these (start step, data_path, seed) stages."""
    text = [f"tokenizer: {{tokenizer_name_or_path: {TOKENIZER}}}",
            f"tokens: {{sequence_length: {SEQ}, micro_batch_size: 2, batch_accumulation_per_replica: 2, train_steps: {train_steps}}}",
            "parallelism: {dp: 2, tp: 1, pp: 1}", "data_stages:"]
    for i, (start, data_path, seed) in enumerate(stages):
        text += [f"  - name: stage{i}", f"    start_training_step: {start}", "    data:", "      dataset:"]
        if isinstance(data_path, str):
            text.append(f"        data_path: {data_path}")
        else:
            text.append("        data_path:")
            text += [f"          {p}: {w}" for p, w in data_path.items()]
        text += ["        split: 949,50,1", f"        path_to_cache: {tmp_path}/nanoset_cache", f"      seed: {seed}"]
    path = tmp_path / "nanotron.yaml"
    path.write_text("\n".join(text) + "\n")
    return str(path)


def stream(name: str) -> np.ndarray:
    return token_file(*FILES[name])


@pytest.mark.parametrize("seed", [1234, 42, 7])
@pytest.mark.parametrize("case", list(CASES))
def test_the_first_10000_samples_are_nanosets_and_blended_nanosets(tmp_path, files, case, seed):
    spec = CASES[case]
    data_path = str(files[spec]) if isinstance(spec, str) else {str(files[n]): w for n, w in spec.items()}
    config = tokenmix.load_data_config(nanotron_config(tmp_path, [(1, data_path, seed)], train_steps=1250))
    assert config.example_order == "nanotron" and config.batch_size == 8 and config.train_steps == 1250
    train = config.train_set(SEQ)
    assert isinstance(train, NanosetOrderDataset) and len(train) == 10_000
    names = [spec] if isinstance(spec, str) else list(spec)
    sources, samples = train.locate(np.arange(10_000))
    assert [train.names[s] for s in sources[:50]] == [names[k] for k in FIXTURE[f"{case}_{seed}_file"][:50]]
    assert np.array_equal(np.array(names)[FIXTURE[f"{case}_{seed}_file"]], np.array(train.names)[sources])
    assert np.array_equal(samples, FIXTURE[f"{case}_{seed}_sample"])
    picks = FIXTURE["picks"]
    assert np.array_equal(train.get_batch(picks).tokens, FIXTURE[f"{case}_{seed}_tokens"])
    batch = train.get_batch(np.arange(10_000))
    for k, name in enumerate(train.names):
        rows = np.flatnonzero(sources == k)
        want = stream(name)[samples[rows, None] * SEQ + np.arange(SEQ + 1)]
        assert np.array_equal(batch.tokens[rows], want)
    assert batch.loss_mask[:, :-1].all() and not batch.loss_mask[:, -1].any()  # Nanotron trains on every label


def test_split_bounds_are_nanotrons_when_the_tokens_are_a_whole_number_of_samples(tmp_path, files):
    """Nanotron counts ``int(tokens / 32)`` samples: for d that is one more than can be read (its label token is past the
    end), and its bounds follow that count; the unreadable sample is left out of the part it falls in (test)."""
    config = tokenmix.load_data_config(nanotron_config(tmp_path, [(1, {str(files[n]): 1.0 for n in "abcd"}, 1)], train_steps=10))
    train, validation, test = config.train_sources(SEQ), config.validation_sets(SEQ), config.test_sets(SEQ)
    for name in "abcd":
        bounds = FIXTURE[f"bounds_{name}"].tolist()
        readable = (FILES[name][0] - 1) // SEQ
        want = np.diff(np.minimum(bounds, readable)).tolist()
        assert [len(train[name]), len(validation[name]), len(test.get(name, []))] == want
    assert len(validation["d"]) == 38 and len(test["d"]) == 0
    whole = Path(nanotron_config(tmp_path, [(1, str(files["d"]), 1)], train_steps=10))
    whole.write_text(whole.read_text().replace("949,50,1", "1,0,0"))
    with pytest.raises(ValueError, match="drop the file's last token"):
        tokenmix.load_data_config(str(whole)).train_set(SEQ)


def test_a_second_stage_starts_where_nanotrons_trainer_switches_and_reads_its_blend_from_there(tmp_path, files):
    stages = [(1, {str(files["a"]): 0.7, str(files["b"]): 0.3}, 1234), (11, {str(files["b"]): 0.25, str(files["c"]): 0.75}, 42)]
    config = tokenmix.load_data_config(nanotron_config(tmp_path, stages, train_steps=20))
    assert config.stage_seeds == [1234, 42] and config.weight_schedule()[1][0] == 80
    train = config.train_set(SEQ)
    file_names = np.array(["a", "b", "c"])
    ranks, micro, rows = 2, 2, 2  # Nanotron's rank d, micro-batch m, row k holds the global batch's index d + 2 * (2 * m + k)
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices("cpu")[:2])
    with DataLoader(train, config.batch_size, mesh, {"batch": "data"}, prefetch=0) as loader:
        assert loader.num_steps() == 20
        resumed = next(loader.iter_from_step(15))
        for step in range(20):
            tokens = np.asarray(loader.batch(step).batch.tokens.array)
            for d in range(ranks):
                for m in range(micro):
                    for k in range(rows):
                        name = file_names[FIXTURE["stages_file"][step, d, m, k]]
                        j = int(FIXTURE["stages_sample"][step, d, m, k])
                        assert np.array_equal(tokens[d + ranks * (rows * m + k)], stream(name)[j * SEQ : j * SEQ + SEQ + 1]), (step, d, m, k)
        assert np.array_equal(np.asarray(resumed.batch.tokens.array), np.asarray(loader.batch(15).batch.tokens.array))
    warmup = set(file_names[FIXTURE["stages_file"][:10]].ravel())
    anneal = set(file_names[FIXTURE["stages_file"][10:]].ravel())
    assert warmup == {"a", "b"} and anneal == {"b", "c"}  # the switch is at Nanotron's step 11, tokenmix's step 10


def test_tokenmix_order_stays_available_by_name(tmp_path, files):
    path = nanotron_config(tmp_path, [(1, {str(files["a"]): 0.7, str(files["b"]): 0.3}, 1234)], train_steps=1250)
    config = tokenmix.load_data_config(path, ["--example_order", "tokenmix"])
    train = config.train_set(SEQ)
    assert isinstance(train, tokenmix.MixtureDataset) and not train.is_finite()
    with pytest.raises(tokenmix.ConfigError, match="example_convention: megatron"):
        tokenmix.load_data_config(path, ["--example_convention", "levanter"])


@pytest.mark.parametrize("weights", [[0.7, 0.3], [0.2, 0.3, 0.5], [1 / 3] * 3, [0.37, 0.21, 0.42001], [np.pi, np.e, 1.0, 0.5]])
def test_the_blend_read_anywhere_equals_the_walk_from_the_start(weights):
    """Blocks resolved out of order, far first, give what resolving them in order gives (the guess one period back
    never changes the result, only how fast it comes)."""
    w = (np.asarray(weights) / np.sum(weights)).tolist()
    positions = np.array([5 * (1 << 16) + 17, 3, (1 << 16) - 1, 1 << 16, 2 * (1 << 16) + 5])
    far_first = GreedyBlend(w).locate(positions)
    in_order = GreedyBlend(w)
    in_order.locate(np.arange(0, 6 * (1 << 16), 1 << 15))
    assert all(np.array_equal(a, b) for a, b in zip(far_first, in_order.locate(positions)))
    ids, draws = GreedyBlend(w).locate(np.arange(3 * (1 << 16)))
    for k in range(len(w)):
        assert np.array_equal(draws[ids == k], np.arange(np.count_nonzero(ids == k)))
        assert abs(np.count_nonzero(ids == k) - w[k] * len(ids)) < 1.5
