"""NeMo Curator's face as NeMo users drive it: the reference document's code with only its imports changed, scripts
chained step by step (each in its own process, reading the directory the one before wrote), scripts without an
``if __name__ == "__main__":`` guard, and the pieces they use (``get_all_files_paths_under``, ``Filter``).

Every script here runs in a fresh interpreter on slices of the demo corpus, with worker processes (the default).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import DEMO_CORPUS, REPO, read_jsonl_zst

from tokenmix.curate import DocumentDataset, Filter, Score, ScoreFilter, WordCountFilter, get_all_files_paths_under

NEMO_IMPORTS = {
    "import nemo_curator as nc": "import tokenmix.curate as nc",
    "from nemo_curator.datasets import DocumentDataset": "from tokenmix.curate import DocumentDataset",
    "from nemo_curator.utils.file_utils import get_all_files_paths_under": "from tokenmix.curate import get_all_files_paths_under",
    "from nemo_curator.filters import WordCountFilter": "from tokenmix.curate import WordCountFilter",
    "from nemo_curator.utils.file_utils import get_remaining_files": "from tokenmix.curate import get_remaining_files",
    "from nemo_curator.utils.file_utils import get_batched_files": "from tokenmix.curate import get_batched_files",
}

# The code blocks of the reference document (NeMo Curator's "Working with DocumentDataset", reference 002), as written
# there. The blocks after the first use its imports without repeating them (one session in the document); each runs
# here as a script of its own, so the first block's imports go in front of them.
READ_FILTER_WRITE = '''\
import nemo_curator as nc
from nemo_curator.datasets import DocumentDataset
from nemo_curator.utils.file_utils import get_all_files_paths_under
from nemo_curator.filters import WordCountFilter

files = get_all_files_paths_under("books_dataset/")
books = DocumentDataset.read_json(files, add_filename=True)

filter_step = nc.ScoreFilter(
                WordCountFilter(min_words=80),
                text_field="text",
                score_field="word_count",
            )

long_books = filter_step(books)

long_books.to_json("long_books/", write_to_filename=True)
'''
FIRST_IMPORTS = "\n".join(READ_FILTER_WRITE.splitlines()[:4]) + "\n\n"
RESUME = '''\
from nemo_curator.utils.file_utils import get_remaining_files

files = get_remaining_files("books_dataset/", "long_books/", "jsonl")
books = DocumentDataset.read_json(files, add_filename=True)

filter_step = nc.ScoreFilter(
                WordCountFilter(min_words=80),
                text_field="text",
                score_field="word_count",
            )

long_books = filter_step(books)

long_books.to_json("long_books/", write_to_filename=True)
'''
BATCHED = '''\
from nemo_curator.utils.file_utils import get_batched_files

for files in get_batched_files("books_dataset/", "long_books/", "jsonl", batch_size=64):
    books = DocumentDataset.read_json(files, add_filename=True)

    filter_step = nc.ScoreFilter(
                    WordCountFilter(min_words=80),
                    text_field="text",
                    score_field="word_count",
                )

    long_books = filter_step(books)

    long_books.to_json("long_books/", write_to_filename=True)
'''
BLEND = '''\
import nemo_curator as nc

books = DocumentDataset.read_json("books_dataset/")
articles = DocumentDataset.read_json("articles_dataset/")
journals = DocumentDataset.read_json("journals_dataset/")

datasets = [books, articles, journals]
target_samples = 1000
weights = [5.0, 2.0, 1.0]

blended_dataset = nc.blend_datasets(target_samples, datasets, weights)

blended_dataset.to_json("blended_dataset/")
'''
SHUFFLE = '''\
import nemo_curator as nc

books = DocumentDataset.read_json("books_dataset/")

shuffle = nc.Shuffle(seed=42)

shuffled_books = shuffle(books)

shuffled_books.to_json("shuffled_books/")
'''


def _with_tokenmix_imports(code: str) -> str:
    for nemo, ours in NEMO_IMPORTS.items():
        code = code.replace(nemo, ours)
    assert "nemo_curator" not in code
    return code


def _run_script(directory: Path, name: str, code: str) -> subprocess.CompletedProcess[str]:
    """``python <name>`` in ``directory``, as a user runs a script, with this checkout's tokenmix; fails the test with
    the script's output when it fails."""
    (directory / name).write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, name], cwd=directory, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _slice(source: str, shard: int, count: int) -> list[dict]:
    return read_jsonl_zst(DEMO_CORPUS / source / f"train-0{shard}-of-02.jsonl.zst")[:count]


def _word_counts(records: list[dict]) -> list[int]:
    return WordCountFilter().score(pa.array([r["text"] for r in records])).to_pylist()


@pytest.fixture
def books(tmp_path) -> dict[str, list[dict]]:
    """books_dataset/books_0{0,1}.jsonl: real documentation pages, short and long ones (the filter keeps some of each shard)."""
    shards = {f"books_{k:02d}.jsonl": _slice("linux_doc", k, 40) for k in range(2)}
    for name, records in shards.items():
        _write_jsonl(tmp_path / "books_dataset" / name, records)
        counts = _word_counts(records)
        assert 0 < sum(c >= 80 for c in counts) < len(records)
    return shards


@pytest.mark.slow
def test_the_reference_documents_code_runs_as_written_with_its_imports_changed(tmp_path, books):
    """Each block of the reference document as a script of its own (no main guard, as written), with worker processes:
    read, filter and write keeping shard names; resume by remaining files, and by batches; blend; shuffle."""
    expected = {}
    for name, records in books.items():
        expected[name] = [{**r, "filename": name, "word_count": c} for r, c in zip(records, _word_counts(records), strict=True) if c >= 80]

    _run_script(tmp_path, "read_filter_write.py", _with_tokenmix_imports(READ_FILTER_WRITE))
    written = {name: (tmp_path / "long_books" / name).read_bytes() for name in books}
    assert {name: _read_jsonl(tmp_path / "long_books" / name) for name in books} == expected

    os.remove(tmp_path / "long_books" / "books_01.jsonl")  # a run interrupted before its second shard
    _run_script(tmp_path, "resume.py", _with_tokenmix_imports(FIRST_IMPORTS + RESUME))
    assert {name: (tmp_path / "long_books" / name).read_bytes() for name in books} == written

    for name in books:
        os.remove(tmp_path / "long_books" / name)
    _run_script(tmp_path, "batched.py", _with_tokenmix_imports(FIRST_IMPORTS + BATCHED))
    assert {name: (tmp_path / "long_books" / name).read_bytes() for name in books} == written

    articles = _slice("python_doc", 0, 20)
    journals = _slice("webster", 0, 30)
    _write_jsonl(tmp_path / "articles_dataset" / "articles_00.jsonl", articles)
    _write_jsonl(tmp_path / "journals_dataset" / "journals_00.jsonl", journals)
    _run_script(tmp_path, "blend.py", _with_tokenmix_imports(FIRST_IMPORTS + BLEND))
    blended = [r for path in get_all_files_paths_under(str(tmp_path / "blended_dataset")) for r in _read_jsonl(Path(path))]
    book_records = books["books_00.jsonl"] + books["books_01.jsonl"]
    counts = Counter(json.dumps(r, sort_keys=True) for r in blended)
    # ceil(1000 * w / 8) of each: 625, 250 and 125; a dataset with fewer documents repeats them whole, then its first ones
    for records, wanted in ((book_records, 625), (articles, 250), (journals, 125)):
        whole, extra = divmod(wanted, len(records))
        assert [counts.pop(json.dumps(r, sort_keys=True), 0) for r in records] == [whole + (i < extra) for i in range(len(records))]
    assert not counts and len(blended) == 1000

    _run_script(tmp_path, "shuffle.py", _with_tokenmix_imports(FIRST_IMPORTS + SHUFFLE))
    shuffled = [r for path in get_all_files_paths_under(str(tmp_path / "shuffled_books")) for r in _read_jsonl(Path(path))]
    assert sorted(shuffled, key=lambda r: r["id"]) == sorted(book_records, key=lambda r: r["id"])
    assert shuffled != book_records


STEP_1 = '''\
from tokenmix.curate import DocumentDataset, ScoreFilter, WordCountFilter, get_all_files_paths_under

files = get_all_files_paths_under("raw/")
books = DocumentDataset.read_json(files, add_filename=True)
long_books = ScoreFilter(WordCountFilter(min_words=80), text_field="text", score_field="word_count")(books)
long_books.to_json("step1/", write_to_filename=True)
'''
STEP_2 = '''\
from tokenmix.curate import DocumentDataset, Filter, get_all_files_paths_under


def long_enough(count):
    return count >= 300


{read}
longer = Filter(long_enough, filter_field="word_count")(books)
longer.to_json("step2/"{write})
'''


@pytest.mark.parametrize("add_filename", [True, False], ids=["add_filename", "without_add_filename"])
def test_two_scripts_chained_each_reads_the_directory_the_one_before_wrote(tmp_path, books, add_filename):
    """NeMo's step-by-step scripts: step 1 writes a directory (shard names kept, records holding ``filename``), step 2
    lists it with ``get_all_files_paths_under`` (the curation's statistics and work directory beside the shards are
    no shards) or reads the directory itself, and filters on the score step 1 wrote with NeMo's ``Filter`` and a
    function of its own. With ``add_filename`` the records' ``filename`` is set again (NeMo assigns the column) and
    the shards keep their names; without it, ``filename`` is a field like any other and step 2 writes partitions."""
    (tmp_path / "books_dataset").rename(tmp_path / "raw")
    _run_script(tmp_path, "step1.py", STEP_1)
    assert sorted(os.listdir(tmp_path / "step1")) == [".curate", "books_00.jsonl", "books_01.jsonl", "curation_stats.json"]
    read = ('files = get_all_files_paths_under("step1/")\nbooks = DocumentDataset.read_json(files, add_filename=True)' if add_filename
            else 'books = DocumentDataset.read_json("step1/")')
    _run_script(tmp_path, "step2.py", STEP_2.format(read=read, write=", write_to_filename=True" if add_filename else ""))

    expected = {name: [{**r, "filename": name, "word_count": c} for r, c in zip(records, _word_counts(records), strict=True) if c >= 300]
                for name, records in books.items()}
    assert all(expected.values())
    step2 = get_all_files_paths_under(str(tmp_path / "step2"))
    if add_filename:
        assert [os.path.basename(p) for p in step2] == ["books_00.jsonl", "books_01.jsonl"]
        assert {os.path.basename(p): _read_jsonl(Path(p)) for p in step2} == expected
    else:
        assert [os.path.basename(p) for p in step2] == ["part-00000.jsonl", "part-00001.jsonl"]
        assert [r for p in step2 for r in _read_jsonl(Path(p))] == expected["books_00.jsonl"] + expected["books_01.jsonl"]
    stats = json.loads((tmp_path / "step2" / "curation_stats.json").read_text())
    assert stats["accounted"] and stats["output"]["records"] == sum(len(v) for v in expected.values())


GUARDED_OR_NOT = '''\
import logging

from tokenmix.curate import DocumentDataset, ExactDedup, ScoreFilter, WordCountFilter

logging.basicConfig(level=logging.INFO)
{guard}books = DocumentDataset.read_json("books_dataset/", add_filename=True)
{indent}books = ExactDedup()(ScoreFilter(WordCountFilter(min_words=80), score_field="word_count")(books))
{indent}books.to_json("{out}/", write_to_filename=True, num_workers=2)
'''


def test_a_script_without_a_main_guard_runs_with_worker_processes_and_writes_what_a_guarded_one_does(tmp_path, books):
    """Spawned workers import the main script again, which without a guard ran its work again in each worker and broke
    the pool (``BrokenProcessPool``). Unguarded, the workers are forked (the log says so, naming the line); guarded,
    they are spawned as before; the outputs are byte-identical."""
    unguarded = _run_script(tmp_path, "unguarded.py", GUARDED_OR_NOT.format(guard="", indent="", out="unguarded"))
    assert "unguarded.py, line 8: outside `if __name__ == \"__main__\":`, so the worker processes are forked" in unguarded.stderr
    guarded = _run_script(tmp_path, "guarded.py", GUARDED_OR_NOT.format(guard='if __name__ == "__main__":\n    ', indent="    ", out="guarded"))
    assert "forked" not in guarded.stderr
    for name in books:
        assert (tmp_path / "unguarded" / name).read_bytes() == (tmp_path / "guarded" / name).read_bytes()
        assert (tmp_path / "unguarded" / name).stat().st_size > 0


def test_a_pool_that_cannot_fork_refuses_an_unguarded_script_in_one_line_before_any_worker_starts(tmp_path):
    """A pool whose driver may run threads a fork would leave holding locks (the cache builder's) starts no worker from
    an unguarded script: one line names the script's line and the fix."""
    script = textwrap.dedent('''\
        from tokenmix.execution import worker_process_pool

        pool = worker_process_pool(2)
        ''')
    (tmp_path / "pool.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run([sys.executable, "pool.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: ") and "pool.py, line 3: starts worker processes outside `if __name__ == \"__main__\":`" in last
    assert "num_workers=0" in last


def test_get_all_files_paths_under_lists_as_nemo_does_less_a_curations_own_files(tmp_path):
    """Every file below the root, sorted, joined to the root as given; not recursing lists the root's own files only;
    ``keep_extensions`` keeps the files ending so. A curated directory's statistics, work directory and temporary
    files are left out."""
    books = DocumentDataset.read_json([str(p) for p in _dataset(tmp_path)], add_filename=True)
    books.to_json(str(tmp_path / "data" / "curated"), write_to_filename=True, num_workers=0)
    (tmp_path / "data" / "curated" / ".b.jsonl.partial").write_text("")  # left by a killed run
    (tmp_path / "data" / "notes.txt").write_text("not a shard")
    root = str(tmp_path / "data") + "/"
    assert get_all_files_paths_under(root) == [root + p for p in ["a.jsonl", "curated/a.jsonl", "curated/b.jsonl", "notes.txt", "sub/b.jsonl"]]
    assert get_all_files_paths_under(root, recurse_subdirectories=False) == [root + "a.jsonl", root + "notes.txt"]
    assert get_all_files_paths_under(root, keep_extensions="jsonl") == [root + p for p in ["a.jsonl", "curated/a.jsonl", "curated/b.jsonl",
                                                                                         "sub/b.jsonl"]]
    assert get_all_files_paths_under(root, keep_extensions=[".txt"]) == [root + "notes.txt"]


def _dataset(tmp_path: Path) -> list[Path]:
    records = _slice("webster", 0, 4)
    shards = [tmp_path / "data" / "a.jsonl", tmp_path / "data" / "sub" / "b.jsonl"]
    for k, shard in enumerate(shards):
        _write_jsonl(shard, records[2 * k:2 * k + 2])
    return shards


def _keep_high(label):
    return label == "High"


def test_filter_keeps_records_by_a_field_with_a_function_or_a_documentfilter_and_inverts(tmp_path):
    """NeMo's ``Filter``: the function gets each record's value of the field (``None`` where a record lacks it); a
    ``DocumentFilter`` applies its rule to the field as its score; ``invert`` keeps the rest."""
    records = [{"text": r["text"], "quality_pred": q, "n": n} for r, q, n in
               zip(_slice("webster", 0, 6), ["High", "Low", "High", None, "Medium", "High"], [10, 90, 50, 70, 120, 5], strict=True)]
    del records[3]["quality_pred"]
    _write_jsonl(tmp_path / "in" / "s.jsonl", records)
    ds = DocumentDataset.read_json(str(tmp_path / "in"))

    def kept(stage: Filter) -> list[dict]:
        return [r for t in stage(ds).iter_batches() for r in t.to_pylist()]

    assert [r["n"] for r in kept(Filter(_keep_high, filter_field="quality_pred"))] == [10, 50, 5]
    assert [r["n"] for r in kept(Filter(_keep_high, "quality_pred", invert=True))] == [90, 70, 120]
    assert [r["n"] for r in kept(Filter(WordCountFilter(min_words=50, max_words=100), filter_field="n"))] == [90, 50, 70]
    assert [r["n"] for r in kept(Filter("test_curate_nemo:_keep_high", filter_field="quality_pred"))] == [10, 50, 5]
    with pytest.raises(ValueError, match="define it with def at the top level"):
        Filter(lambda label: label == "High", filter_field="quality_pred")
    with pytest.raises(ValueError, match="filter_field"):
        Filter(_keep_high)


def test_score_and_score_filter_take_their_arguments_in_nemos_order(tmp_path):
    """``Score(score_fn, score_field, text_field)`` and ``ScoreFilter(filter, text_field, score_field)``, as NeMo orders
    them, so a NeMo call with positional arguments writes the field it names."""
    records = [{"text": r["text"], "n": n} for n, r in enumerate(_slice("webster", 0, 4))]
    _write_jsonl(tmp_path / "in" / "s.jsonl", records)
    ds = DocumentDataset.read_json(str(tmp_path / "in"))
    scored = [r for t in Score(WordCountFilter(), "words", "text")(ds).iter_batches() for r in t.to_pylist()]
    assert [r["words"] for r in scored] == [len(r["text"].split()) for r in records]
    filtered = [r for t in ScoreFilter(WordCountFilter(min_words=1), "text", "words")(ds).iter_batches() for r in t.to_pylist()]
    assert [r["words"] for r in filtered] == [len(r["text"].split()) for r in records]


def test_a_filter_function_edited_between_runs_makes_another_pipeline_not_a_reuse_of_the_earlier_work(tmp_path, monkeypatch):
    """A NeMo user edits the function in their script and runs it again: the function's code is part of the work
    directory's key, so the second run filters anew instead of finding the first run finished."""
    import importlib

    records = [{"text": r["text"], "n": n} for n, r in enumerate(_slice("webster", 0, 6))]
    _write_jsonl(tmp_path / "in" / "s.jsonl", records)
    monkeypatch.syspath_prepend(str(tmp_path))
    kept = []
    for threshold in (2, 4):
        (tmp_path / "user_filters.py").write_text(f"def keep(n):\n    return n >= {threshold}\n")
        module = importlib.reload(sys.modules["user_filters"]) if "user_filters" in sys.modules else importlib.import_module("user_filters")
        ds = Filter(module.keep, filter_field="n")(DocumentDataset.read_json(str(tmp_path / "in"), add_filename=True))
        ds.to_json(str(tmp_path / "out"), write_to_filename=True, num_workers=0)
        kept.append([r["n"] for r in _read_jsonl(tmp_path / "out" / "s.jsonl")])
    assert kept == [[2, 3, 4, 5], [4, 5]]
