"""Exporting real caches to Cerebras HDF5 samples: windows cut as Cerebras cuts them, and with this exporter's own
options (``keep_last_window``, ``short_seq_carry``) every token of the stream back in order; labels are the inputs
shifted, masks mark what is trained on (the completion, for Summarization), files split and name as Cerebras's do, the
statistics add up, the output depends on the seed alone, and an export that fails leaves nothing that looks finished.
``test_export_hdf5_modelzoo.py`` checks the samples against modelzoo's own output."""

from __future__ import annotations

import json
import os
import random
import threading

import h5py
import numpy as np
import pytest
from helpers import DEMO_CORPUS, TOKENIZER, build, read_jsonl_zst, write_jsonl

import tokenmix
from tokenmix import SupervisedLmDatasetFormat, TokenCache, UnsafeFileError
from tokenmix.export import Hdf5ExportOptions, export_datatrove, export_hdf5, read_hdf5_samples
from tokenmix.sources.cerebras_hdf5 import DATA_PARAMS

MSL = 64
SHORT_TEXTS = ["Hi", "to be", "ox"]
"""Documents of fewer than 10 tokens (EOS included)."""
LOSSLESS = {"keep_last_window": True, "short_seq_carry": True}
"""This exporter's options that keep every token of a packed stream."""


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """A text cache (40 dictionary entries with short documents among them) and a supervised one (some completions
    truncated at ``MSL + 1`` tokens, some cut off whole), both finished."""
    root = tmp_path_factory.mktemp("hdf5")
    records = read_jsonl_zst(DEMO_CORPUS / "webster" / "train-00-of-02.jsonl.zst")[:40]
    for i, text in enumerate(SHORT_TEXTS):
        records.insert(7 + 11 * i, {"text": text})
    build(str(root / "text"), [write_jsonl(root / "text.jsonl", records)])
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    pairs = [{"prompt": " ".join(rng.choices(words, k=rng.randint(1, 12))), "response": " " + " ".join(rng.choices(words, k=rng.randint(1, 12)))}
             for _ in range(60)]
    pairs[5]["prompt"] = " ".join(words * 5)  # 100 prompt tokens: truncation leaves nothing to train on
    pairs[9]["response"] = " " + " ".join(words * 5)  # truncated within the completion
    build(str(root / "sft"), [write_jsonl(root / "sft.jsonl", pairs)], SupervisedLmDatasetFormat())
    return {"text": TokenCache(str(root / "text")), "sft": TokenCache(str(root / "sft"))}


def documents(cache: TokenCache) -> list[np.ndarray]:
    return cache.get_rows(range(cache.num_rows()))


def export(cache, out, **options):
    """Export with ``options`` (MSL positions unless said); the statistics, all samples, and the files in order."""
    options.setdefault("max_seq_length", MSL)
    stats = export_hdf5(cache, str(out), Hdf5ExportOptions(**options), progress=False, tokenizer=TOKENIZER)
    files = sorted((f for f in os.listdir(out) if f.endswith(".h5")), key=lambda f: int(f.split("_")[1]))
    arrays = list(read_hdf5_samples(str(out)))
    data = np.concatenate(arrays) if arrays else np.empty((0, 3, options["max_seq_length"]), np.int32)
    return stats, data, files


def covered(data: np.ndarray, real: np.ndarray) -> np.ndarray:
    """The tokens samples that follow one another cover: the first input, then every label of a real position."""
    return np.concatenate([data[:1, 0, 0], data[:, 2][real]])


def test_packed_samples_give_back_the_stream_in_order_split_into_files(caches, tmp_path):
    cache = caches["text"]
    stats, data, files = export(cache, tmp_path, files_per_record=100, keep_last_window=True)
    stream = np.concatenate(documents(cache))  # packed, short documents are joined onto the next, as Cerebras does
    real = data[:, 1].astype(bool)

    assert data.dtype == np.int32 and data.shape == (-(-(len(stream) - 1) // MSL), 3, MSL)
    assert real[:-1].all() and (real[-1] == (np.arange(MSL) < (len(stream) - 1) - MSL * (len(data) - 1))).all()  # only the last is padded
    np.testing.assert_array_equal(covered(data, real), stream)  # nothing lost, reordered or repeated
    np.testing.assert_array_equal(data[:, 0][real], stream[:-1])
    np.testing.assert_array_equal(data[1:, 0, 0], data[:-1, 2, -1])  # a sample starts on the last label of the one before
    np.testing.assert_array_equal(data[:, 2, :-1][real[:, 1:]], data[:, 0, 1:][real[:, 1:]])
    assert (data[:, 0][~real] == 0).all() and (data[:, 2][~real] == 0).all()  # padded with the EOS id

    assert files == [f"examples_{i}_0.h5" for i in range(-(-len(data) // 100))]
    assert sorted(os.listdir(tmp_path)) == sorted([*files, DATA_PARAMS])  # no .partial left
    for i, name in enumerate(files):
        with h5py.File(tmp_path / name, "r") as h5:
            assert h5["data"].shape == (min(100, len(data) - 100 * i), 3, MSL)
            assert h5.attrs["n_examples"] == h5["data"].shape[0] and h5["data"].dtype == np.int32

    params = json.loads((tmp_path / DATA_PARAMS).read_text())
    assert set(params) == {"setup", "processing", "dataset", "post-process", "h5_dataset_stats", "tokenmix"}
    assert params["h5_dataset_stats"] == stats
    assert stats["num_sequences"] == params["post-process"]["n_examples"] == len(data) and stats["num_tokens"] == len(data) * MSL
    assert stats["loss_valid_tokens"] == real.sum() == len(stream) - 1
    assert stats["non_pad_tokens"] == (data[:, 0] != 0).sum() < real.sum()  # Cerebras does not count the EOS (here the pad id)
    assert params["post-process"]["processed_files"] == cache.num_rows() and params["post-process"]["discarded_files"] == 0
    ours = params["tokenmix"]
    assert ours["n_files"] == len(files) and ours["last_window_tokens_dropped"] == ours["remainder_samples_dropped"] == 0
    assert params["setup"]["mode"] == "LMData" and params["setup"]["input_dir"] == cache.location
    assert params["dataset"] == {"min_sequence_len": 6, "pack_sequences": True, "inverted_mask": False, "input_ids_dtype": "int32",
                                 "input_mask_dtype": "int32"}
    processing = params["processing"]
    assert (processing["max_seq_length"], processing["pad_id"], processing["eos_id"], params["post-process"]["vocab_size"]) == (MSL, 0, 0, 32000)
    assert (ours["data_dtype"], processing["seed"], ours["keep_last_window"]) == ("int32", 0, True)


def test_cerebras_leaves_the_last_window_and_partial_file_unwritten_and_they_are_counted(caches, tmp_path):
    cache = caches["text"]
    stream_tokens = sum(map(len, documents(cache)))
    partial = [msl for msl in (MSL, 50, 37) if (stream_tokens - 1) % msl]  # lengths that leave a final partial window
    assert partial
    for msl in partial:
        _, whole, _ = export(cache, tmp_path / f"whole{msl}", max_seq_length=msl, keep_last_window=True, files_per_record=100)
        _, data, _ = export(cache, tmp_path / f"cerebras{msl}", max_seq_length=msl, files_per_record=100)
        np.testing.assert_array_equal(data, whole[:-1])
        ours = json.loads((tmp_path / f"cerebras{msl}" / DATA_PARAMS).read_text())["tokenmix"]
        assert ours["last_window_tokens_dropped"] == whole[-1, 1].sum() + 1  # its first token was the last label before it
    _, dropped, _ = export(cache, tmp_path / "dropped", max_seq_length=msl, files_per_record=100, write_remainder=False)
    np.testing.assert_array_equal(dropped, data[: len(data) // 100 * 100])
    params = json.loads((tmp_path / "dropped" / DATA_PARAMS).read_text())
    assert params["tokenmix"]["remainder_samples_dropped"] == len(data) % 100 > 0
    assert params["post-process"]["n_examples"] == params["h5_dataset_stats"]["num_sequences"] == len(dropped)
    _, padded, _ = export(cache, tmp_path / "padded", max_seq_length=msl, pad_id=7, keep_last_window=True)
    np.testing.assert_array_equal(padded[:-1], whole[:-1])
    assert (padded[-1, 0][padded[-1, 1] == 0] == 7).all()


def test_unpacked_documents_are_cut_alone_overlapping_by_one_token(caches, tmp_path):
    """Each document's windows start every MSL tokens; a window of one token (the label before it) or of fewer than
    ``min_sequence_len`` is skipped, as Cerebras skips it."""
    cache = caches["text"]
    stats, data, _ = export(cache, tmp_path / "default", pack_sequences=False, min_sequence_len=10)
    expected, skipped = [], 0
    for doc in documents(cache):
        for start in range(0, len(doc), MSL):
            piece = doc[start : start + MSL + 1]
            if len(piece) < 10:
                skipped += 1
                continue
            sample = np.zeros((3, MSL), np.int32)
            sample[0, : len(piece) - 1], sample[1, : len(piece) - 1], sample[2, : len(piece) - 1] = piece[:-1], 1, piece[1:]
            expected.append(sample)
    np.testing.assert_array_equal(data, np.stack(expected))
    params = json.loads((tmp_path / "default" / DATA_PARAMS).read_text())
    assert params["post-process"]["discarded_files"] == skipped >= len(SHORT_TEXTS) and stats["loss_valid_tokens"] == data[:, 1].sum()

    _, data_all, _ = export(cache, tmp_path / "every", pack_sequences=False, min_sequence_len=0)
    assert len(data_all) == len(data) + params["tokenmix"]["too_short"]


@pytest.mark.parametrize("pack", [True, False])
def test_short_sequences_follow_the_seed_and_with_short_seq_carry_lose_no_token(caches, tmp_path, pack):
    cache = caches["text"]
    carry = {**LOSSLESS, "min_sequence_len": 0}
    export(cache, tmp_path / "a", pack_sequences=pack, short_seq_prob=0.5, seed=3, files_per_record=200, **carry)
    export(cache, tmp_path / "b", pack_sequences=pack, short_seq_prob=0.5, seed=3, files_per_record=200, **carry)
    _, data, _ = export(cache, tmp_path / "c", pack_sequences=pack, short_seq_prob=0.5, seed=4, files_per_record=200, **carry)
    files = sorted(f for f in os.listdir(tmp_path / "a") if f.endswith(".h5"))
    assert len(files) > 1 and files == sorted(f for f in os.listdir(tmp_path / "b") if f.endswith(".h5"))
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    _, seeded, _ = export(cache, tmp_path / "d", pack_sequences=pack, short_seq_prob=0.5, seed=3, **carry)
    assert not np.array_equal(seeded[: len(data)], data[: len(seeded)])

    real = seeded[:, 1].astype(bool)
    lengths = real.sum(1)
    assert (real == (np.arange(MSL) < lengths[:, None])).all() and lengths.min() >= 1
    if pack:
        assert 0.3 < (lengths[:-1] < MSL).mean() < 0.7  # about half the samples were made short
        np.testing.assert_array_equal(covered(seeded, real), np.concatenate(documents(cache)))
    else:
        samples = iter(seeded)
        for doc in documents(cache):
            first = next(samples)
            got = [first[0, :1], first[2][first[1] == 1]]
            while sum(map(len, got)) < len(doc):
                sample = next(samples)
                assert sample[0, 0] == got[-1][-1]
                got.append(sample[2][sample[1] == 1])
            np.testing.assert_array_equal(np.concatenate(got), doc)
        assert next(samples, None) is None


def test_cerebras_short_sequences_lose_the_tokens_they_cut_and_count_them(caches, tmp_path):
    """Packed, each window still starts MSL tokens after the one before: a window cut short loses the rest of its
    tokens (as Cerebras, one draw of Python's random per window), and the export counts them."""
    cache = caches["text"]
    _, full, _ = export(cache, tmp_path / "full")
    _, short, _ = export(cache, tmp_path / "short", short_seq_prob=0.5, seed=3)
    lengths = short[:, 1].sum(1)
    assert len(short) == len(full) and 0.3 < (lengths < MSL).mean() < 0.7
    for got, want, n in zip(short, full, lengths):
        np.testing.assert_array_equal(got[:, :n], want[:, :n])
        assert (got[[0, 2], n:] == 0).all() and n <= MSL - 2 or n == MSL
    ours = json.loads((tmp_path / "short" / DATA_PARAMS).read_text())["tokenmix"]
    assert ours["short_seq_tokens_dropped"] == (MSL - lengths).sum() > 0


@pytest.mark.parametrize("options", [{}, {"pack_sequences": False}, {"short_seq_prob": 0.4}, {"pack_sequences": False, "short_seq_prob": 0.4},
                                     {"short_seq_prob": 0.4, **LOSSLESS}, {"pack_sequences": False, "short_seq_prob": 0.4, **LOSSLESS}])
def test_the_samples_do_not_depend_on_the_batch_size(caches, tmp_path, options):
    _, whole, _ = export(caches["text"], tmp_path / "whole", **options)
    _, small, _ = export(caches["text"], tmp_path / "small", batch_tokens=MSL + 1, **options)
    np.testing.assert_array_equal(small, whole)


def test_inverted_mask_marks_what_is_not_trained(caches, tmp_path):
    stats, data, _ = export(caches["sft"], tmp_path / "plain", mode="summarization")
    inverted_stats, inverted, _ = export(caches["sft"], tmp_path / "inverted", mode="summarization", inverted_mask=True)
    np.testing.assert_array_equal(inverted[:, 1], 1 - data[:, 1])
    np.testing.assert_array_equal(inverted[:, [0, 2]], data[:, [0, 2]])
    assert inverted_stats.pop("loss_valid_tokens") == inverted[:, 1].sum()  # Cerebras sums the mask row as it is
    assert inverted_stats == {k: v for k, v in stats.items() if k != "loss_valid_tokens"}


@pytest.mark.parametrize("dtype", ["int16", "uint16"])
def test_narrow_id_dtypes_store_the_same_values(caches, tmp_path, dtype):
    _, wide, _ = export(caches["text"], tmp_path / "wide")
    _, narrow, files = export(caches["text"], tmp_path / "narrow", input_ids_dtype=dtype)
    assert narrow.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(narrow, wide)
    params = json.loads((tmp_path / "narrow" / DATA_PARAMS).read_text())
    assert (params["dataset"]["input_ids_dtype"], params["dataset"]["input_mask_dtype"], params["tokenmix"]["data_dtype"]) == (dtype, "int32", dtype)


def test_ids_that_do_not_fit_the_dtype_are_refused(caches, tmp_path):
    with pytest.raises(ValueError, match="input_ids_dtype int8 holds ids up to 127.*up to 31999 .its vocabulary of 32000.*int32"):
        export_hdf5(caches["text"], str(tmp_path / "a"), Hdf5ExportOptions(input_ids_dtype="int8"), progress=False)
    with pytest.raises(ValueError, match="pad_id 40000 does not fit input_ids_dtype int16"):
        export_hdf5(caches["text"], str(tmp_path / "b"), Hdf5ExportOptions(input_ids_dtype="int16", pad_id=40000), progress=False)


@pytest.mark.parametrize(("field", "value"), [
    ("max_seq_length", 1), ("short_seq_prob", 1.5), ("short_seq_prob", -0.1), ("input_ids_dtype", "float32"),
    ("input_mask_dtype", "nonsense"), ("files_per_record", 0), ("mode", "vsl"), ("output_name", "a/b"), ("pad_id", -1),
    ("compression", "lzf"), ("batch_tokens", MSL), ("min_sequence_len", -1), ("inverted_mask", "yes"), ("fim_rate", 1.5),
    ("spm_rate", -1), ("fim_middle_tok", ""), ("keep_last_window", 1), ("short_seq_carry", None),
])
def test_bad_options_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"Hdf5ExportOptions.{field} is"):
        Hdf5ExportOptions(**{"max_seq_length": MSL, field: value})
    with pytest.raises(ValueError, match="short_seq_prob.*summarization keeps each document whole"):
        Hdf5ExportOptions(mode="summarization", short_seq_prob=0.2)


def test_summarization_trains_exactly_on_the_completion(caches, tmp_path):
    """A document of at most MSL tokens is one sample whose inputs are all its tokens (its EOS last, with a padded
    label), its mask marking where the label is trained on; longer ones are skipped, as Cerebras skips them."""
    cache = caches["sft"]
    stats, data, _ = export(cache, tmp_path, mode="summarization", min_sequence_len=0)
    rows = cache.num_rows()
    trained = [np.zeros(len(d), bool) for d in documents(cache)]
    for row, begin, end in zip(*cache.loss_spans(0, rows)):
        trained[row][begin:end] = True
    samples, too_long = iter(data), 0
    for doc, marks in zip(documents(cache), trained):
        if len(doc) > MSL:
            too_long += 1
            continue
        sample, n = next(samples), len(doc)
        assert doc[-1] == 0 and sample[0, n - 1] == 0  # the EOS is the last input
        np.testing.assert_array_equal(sample[0], np.pad(doc, (0, MSL - n)))
        np.testing.assert_array_equal(sample[2], np.pad(doc[1:], (0, MSL - n + 1)))
        np.testing.assert_array_equal(sample[1], np.pad(marks[1:], (0, MSL - n + 1)))  # the label is in a loss span
    assert next(samples, None) is None
    params = json.loads((tmp_path / DATA_PARAMS).read_text())
    assert too_long == 2 and params["tokenmix"]["too_long"] == params["post-process"]["discarded_files"] == too_long
    assert params["post-process"]["successful_files"] == rows - too_long
    assert stats["loss_valid_tokens"] == data[:, 1].sum() < stats["non_pad_tokens"]  # prompts are not trained on
    assert params["setup"]["mode"] == "Summarization" and "pack_sequences" not in params["dataset"]


def test_summarization_needs_a_cache_with_loss_spans(caches, tmp_path):
    with pytest.raises(ValueError, match=f"{caches['text'].location}.*summarization.*type: supervised"):
        export_hdf5(caches["text"], str(tmp_path), Hdf5ExportOptions(mode="summarization"), progress=False, tokenizer=TOKENIZER)
    assert not os.listdir(tmp_path)


def test_an_export_decodes_with_the_caches_own_tokenizer_or_refuses_before_writing(caches, tmp_path, tiny_tokenizer):
    with pytest.raises(ValueError, match=f"{caches['text'].location} was built with another tokenizer than .*give the tokenizer the cache"):
        export_hdf5(caches["text"], str(tmp_path), Hdf5ExportOptions(max_seq_length=MSL), progress=False, tokenizer=tiny_tokenizer)
    assert not os.listdir(tmp_path)
    stats = export_hdf5(caches["text"], str(tmp_path), Hdf5ExportOptions(max_seq_length=MSL), progress=False)  # the ledger's
    assert stats == export(caches["text"], tmp_path / "given")[0]


@pytest.mark.parametrize("mode", ["lm", "summarization"])
def test_a_reader_of_token_files_exports_the_same_samples(caches, tmp_path, mode):
    """Datatrove files (tokens and loss mask) read in place give the samples of the cache they were written from."""
    export_datatrove(caches["sft"], str(tmp_path / "files" / "sft.ds"), progress=False)
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "caches"), "configs": {
        "sft": {"train_urls": [str(tmp_path / "files")], "token_files": {"kind": "datatrove"}, "format": {"type": "supervised"}}}})
    files = tokenmix.open_cache(config, "sft")
    _, ours, _ = export(caches["sft"], tmp_path / "cache", mode=mode, pack_sequences=False)
    stats, theirs, _ = export(files, tmp_path / "files_hdf5", mode=mode, pack_sequences=False)
    np.testing.assert_array_equal(theirs, ours)
    assert stats["num_sequences"] == len(ours) > 0


class FailingCache:
    """A real cache whose storage fails after ``reads`` token reads."""

    def __init__(self, cache: TokenCache, reads: int):
        self._cache = cache
        self._left = reads

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        if self._left == 0:
            raise OSError("storage went away")
        self._left -= 1
        return self._cache.read_tokens(start, stop)


def test_a_failed_export_leaves_only_whole_files_and_a_rerun_finishes_it(caches, tmp_path):
    cache = caches["text"]
    _, clean, _ = export(cache, tmp_path / "clean", files_per_record=20)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="storage went away"):
        export_hdf5(FailingCache(cache, reads=20), str(out), Hdf5ExportOptions(max_seq_length=MSL, files_per_record=20, batch_tokens=500),
                    progress=False)
    left = sorted(os.listdir(out), key=lambda f: int(f.split("_")[1]))
    assert 0 < len(left) < len(clean) // 20 and left == [f"examples_{i}_0.h5" for i in range(len(left))]  # no .partial, no data_params
    for i, name in enumerate(left):
        with h5py.File(out / name, "r") as h5:
            assert h5.attrs["n_examples"] == 20
            np.testing.assert_array_equal(h5["data"][()], clean[20 * i : 20 * (i + 1)])
    with pytest.raises(FileNotFoundError, match="no finished HDF5 export"):
        read_hdf5_samples(str(out))

    (out / f".examples_{len(left)}_0.h5.partial").write_bytes(b"killed mid-write")
    export(cache, out, files_per_record=20)
    np.testing.assert_array_equal(np.concatenate(list(read_hdf5_samples(str(out)))), clean)
    assert not [f for f in os.listdir(out) if f.endswith(".partial")]
    with pytest.raises(FileExistsError, match="finished HDF5 export"):
        export_hdf5(cache, str(out), Hdf5ExportOptions(max_seq_length=MSL), progress=False)


def test_a_second_export_into_a_directory_another_is_writing_is_refused_and_the_first_ends_whole(caches, tmp_path):
    """The second export took the first's files for an unfinished export's and removed them (the first's finished
    files included), then both wrote samples and a data_params.json into one directory."""
    cache = caches["text"]
    _, clean, _ = export(cache, tmp_path / "clean", files_per_record=20)
    out = tmp_path / "out"
    reading, go = threading.Event(), threading.Event()

    class Held(FailingCache):
        def read_tokens(self, start: int, stop: int) -> np.ndarray:
            if self._left == 0:
                reading.set()
                assert go.wait(60)
            self._left -= 1
            return self._cache.read_tokens(start, stop)

    first = threading.Thread(target=export_hdf5, args=(Held(cache, reads=20), str(out), Hdf5ExportOptions(
        max_seq_length=MSL, files_per_record=20, batch_tokens=500)), kwargs={"progress": False, "tokenizer": TOKENIZER})
    first.start()
    try:
        assert reading.wait(60)
        assert [f for f in os.listdir(out) if f.endswith(".h5")]  # the first has finished files already
        with pytest.raises(FileExistsError, match=f"{out / DATA_PARAMS}: another export is writing it"):
            export(caches["text"], out, files_per_record=5)
    finally:
        go.set()
        first.join(60)
    np.testing.assert_array_equal(np.concatenate(list(read_hdf5_samples(str(out)))), clean)
    assert not [f for f in os.listdir(out) if f.endswith(".partial")]


@pytest.mark.parametrize("name", [".examples_0_0.h5.partial", "examples_0_0.h5", ".data_params.json.partial"])
def test_a_symbolic_link_where_an_export_writes_is_refused_and_its_target_untouched(caches, tmp_path, name):
    """A link planted where a partial (or an unfinished export's) file goes is refused by name: before, the export
    wrote its samples through it, over the link's target."""
    out, target = tmp_path / "out", tmp_path / "precious"
    out.mkdir()
    target.write_bytes(b"not yours")
    (out / name).symlink_to(target)
    with pytest.raises(UnsafeFileError, match=rf"{out / name}: the .* is a symbolic link \(to {target}\)"):
        export(caches["text"], out, files_per_record=20)
    assert target.read_bytes() == b"not yours" and (out / name).is_symlink()
