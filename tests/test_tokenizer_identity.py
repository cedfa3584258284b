"""Opening caches without loading the tokenizer: its description is remembered per digest of its files, so a reader
imports no ``transformers``; a changed tokenizer file is noticed, and an unwritable description cache costs only time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import DEMO_CORPUS, REPO, TOKENIZER, cache_bytes

from tokenmix import CacheMismatchError, LMDatasetSourceConfig, LMMixtureDatasetConfig, TextLmDatasetFormat, build_caches, open_cache
from tokenmix.formats.tokenizer import describe_tokenizer
from tokenmix.formats.tokenizer_identity import descriptions_dir, tokenizer_identity, tokenizer_info

OPEN_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import tokenmix
    config = tokenmix.load_data_config(sys.argv[1])
    cache = tokenmix.open_cache(config, "webster", "train")
    batch = config.train_set(128).get_batch([0, 1, 2])
    print(json.dumps({"rows": cache.num_rows(), "transformers": "transformers" in sys.modules}))
""")


BUILD_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import tokenmix
    stats = tokenmix.build_caches(tokenmix.load_data_config(sys.argv[1]), progress=False)
    print(json.dumps({"documents": stats["webster", "train"]["documents"], "transformers": "transformers" in sys.modules}))
""")


def _config(tmp_path, tokenizer: str) -> LMMixtureDatasetConfig:
    urls = [str(DEMO_CORPUS / "webster" / "train-00-of-02.jsonl.zst")]
    return LMMixtureDatasetConfig(tokenizer=tokenizer, cache_dir=str(tmp_path / "cache"),
                                  configs={"webster": LMDatasetSourceConfig(train_urls=urls)})


def _open_in_a_fresh_process(tmp_path, config: LMMixtureDatasetConfig, description_dir, code: str = OPEN_IN_A_FRESH_PROCESS) -> dict:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"tokenizer": config.tokenizer, "cache_dir": config.cache_dir,
                                "configs": {"webster": {"train_urls": config.configs["webster"].train_urls}}}))
    env = {**os.environ, "TOKENMIX_CACHE_DIR": str(description_dir)}
    out = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_after_a_build_a_fresh_process_opens_the_cache_without_importing_transformers(tmp_path):
    config = _config(tmp_path, TOKENIZER)
    build_caches(config, progress=False)
    remembered = _open_in_a_fresh_process(tmp_path, config, os.environ["TOKENMIX_CACHE_DIR"])
    assert remembered["rows"] > 0 and remembered["transformers"] is False
    first_time = _open_in_a_fresh_process(tmp_path, config, tmp_path / "empty")  # nothing remembered: describes it once
    assert first_time["rows"] == remembered["rows"] and first_time["transformers"] is True
    assert len(list((tmp_path / "empty" / "tokenizers").glob("*.json"))) == 1


def test_a_build_in_a_fresh_process_after_one_description_imports_no_transformers_and_writes_the_same_cache(tmp_path):
    reference = _config(tmp_path / "reference", TOKENIZER)
    build_caches(reference, progress=False)  # describes the tokenizer (or finds it described) and remembers it
    for name, descriptions, imports in (("remembered", os.environ["TOKENMIX_CACHE_DIR"], False), ("described", tmp_path / "empty", True)):
        config = _config(tmp_path / name, TOKENIZER)
        built = _open_in_a_fresh_process(tmp_path, config, descriptions, BUILD_IN_A_FRESH_PROCESS)
        assert built["documents"] > 0 and built["transformers"] is imports, name
        location = config.cache_location("webster", "train")
        assert cache_bytes(location) == cache_bytes(reference.cache_location("webster", "train")), name
    assert {p.suffix for p in (tmp_path / "empty" / "tokenizers").iterdir()} == {".json", ".backend"}


def test_the_remembered_identity_is_the_description_and_gives_the_builds_cache_identity(tmp_path):
    identity = tokenizer_identity(TOKENIZER)
    assert identity == describe_tokenizer(TOKENIZER).identity()
    config = _config(tmp_path, TOKENIZER)
    assert config.cache_identity(TextLmDatasetFormat(), "t") == config.encoder_spec(TextLmDatasetFormat(), "t")[1]


def test_a_changed_tokenizer_file_is_noticed_and_its_caches_refused(tmp_path):
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(TOKENIZER, tokenizer)
    config = _config(tmp_path, str(tokenizer))
    build_caches(config, progress=False)
    before = tokenizer_identity(str(tokenizer))
    spec = json.loads((tokenizer / "tokenizer.json").read_text())
    spec["added_tokens"].append({**spec["added_tokens"][-1], "id": len(spec["model"]["vocab"]), "content": "<|new|>"})
    (tokenizer / "tokenizer.json").write_text(json.dumps(spec))
    after = tokenizer_identity(str(tokenizer))
    assert after.fingerprint != before.fingerprint and after.vocab_size == before.vocab_size + 1
    with pytest.raises(CacheMismatchError):
        open_cache(config, "webster", "train")


DESCRIBE_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    from tokenmix.formats.tokenizer import describe_tokenizer
    from tokenmix.formats.tokenizer_identity import tokenizer_info
    remembered, described = tokenizer_info(sys.argv[1]), describe_tokenizer(sys.argv[1])
    print(json.dumps([remembered.fingerprint, remembered.vocab_size, described.fingerprint, described.vocab_size]))
""")


def test_a_tokenizer_whose_files_change_while_a_process_runs_is_described_anew_and_remembered_as_it_now_is(tmp_path, monkeypatch):
    """A process that described a tokenizer, then sees its files change (a token added; a file added, which sets the
    padding token; a token renamed with the file's size and modification time kept, as ``cp -p`` or ``rsync -t`` leave
    them; a symbolic link retargeted at a file of the same size and time), describes it anew; and what it remembers is
    the description of the files as they now are, which a fresh process then reads. Before, the description kept per
    name in the process was remembered under the changed files' key: every later process on the machine took the old
    vocabulary for the new files."""
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(tmp_path / "remembered"))
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(TOKENIZER, tokenizer)
    file = tokenizer / "tokenizer.json"
    spec = json.loads(file.read_text())
    seen = [tokenizer_info(str(tokenizer))]

    spec["added_tokens"].append({**spec["added_tokens"][-1], "id": len(spec["model"]["vocab"]), "content": "<|new|>"})
    file.write_text(json.dumps(spec))
    seen.append(tokenizer_info(str(tokenizer)))
    assert seen[-1].vocab_size == seen[0].vocab_size + 1

    (tokenizer / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<|endoftext|>"}))
    seen.append(tokenizer_info(str(tokenizer)))
    assert seen[-1].pad_id == seen[-1].eos_id != seen[0].pad_id

    kept = file.stat()
    spec["added_tokens"][-1]["content"] = "<|wen|>"
    file.write_text(json.dumps(spec))
    os.utime(file, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert (file.stat().st_size, file.stat().st_mtime_ns) == (kept.st_size, kept.st_mtime_ns)
    seen.append(tokenizer_info(str(tokenizer)))

    file.rename(tmp_path / "first.json")
    file.symlink_to(tmp_path / "first.json")
    assert tokenizer_info(str(tokenizer)) == seen[-1]
    spec["added_tokens"][-1]["content"] = "<|ewn|>"
    (tmp_path / "second.json").write_text(json.dumps(spec))
    os.utime(tmp_path / "second.json", ns=(kept.st_atime_ns, kept.st_mtime_ns))
    file.unlink()
    file.symlink_to(tmp_path / "second.json")
    seen.append(tokenizer_info(str(tokenizer)))
    assert len({info.fingerprint for info in seen}) == len(seen)

    env = {**os.environ, "TOKENMIX_CACHE_DIR": str(tmp_path / "remembered")}
    out = subprocess.run([sys.executable, "-c", DESCRIBE_IN_A_FRESH_PROCESS, str(tokenizer)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [seen[-1].fingerprint, seen[-1].vocab_size] * 2


def test_a_named_chat_template_added_to_a_tokenizer_directory_is_a_changed_tokenizer(tmp_path, monkeypatch):
    """``AutoTokenizer`` reads ``additional_chat_templates/*.jinja`` as the tokenizer's named chat templates, which its
    fingerprint hashes: one added (or edited) there is a changed tokenizer, described anew, not the remembered
    description of the directory without it."""
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(tmp_path / "remembered"))
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(TOKENIZER, tokenizer)
    before = tokenizer_info(str(tokenizer))
    (tokenizer / "additional_chat_templates").mkdir()
    (tokenizer / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages[0]['content'] }}")
    after = tokenizer_info(str(tokenizer))
    assert after.fingerprint != before.fingerprint
    env = {**os.environ, "TOKENMIX_CACHE_DIR": str(tmp_path / "remembered")}
    out = subprocess.run([sys.executable, "-c", DESCRIBE_IN_A_FRESH_PROCESS, str(tokenizer)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [after.fingerprint, after.vocab_size] * 2


RECALL_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import dataclasses, json, sys
    from tokenmix.formats.tokenizer import describe_tokenizer
    from tokenmix.formats.tokenizer_identity import tokenizer_identity, tokenizer_info
    identity, info = tokenizer_identity(sys.argv[1]), tokenizer_info(sys.argv[1])
    print(json.dumps([dataclasses.asdict(identity), dataclasses.asdict(info), dataclasses.asdict(describe_tokenizer(sys.argv[1]))]))
""")


def _damage_backend_empty(remembered):
    next(remembered.glob("*.backend")).write_bytes(b"")


def _damage_backend_vocabulary(remembered):
    backend = next(remembered.glob("*.backend"))
    spec = json.loads(backend.read_text())
    vocab = spec["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[300:302]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two ids swapped: still a tokenizer, giving other ids
    backend.write_text(json.dumps(spec))


def _damage_identity_vocab_size(remembered):
    description = next(remembered.glob("*.backend")).with_suffix(".json")
    known = json.loads(description.read_text())
    known["vocab_size"] += 1
    description.write_text(json.dumps(known))


@pytest.mark.parametrize("damage", [_damage_backend_empty, _damage_backend_vocabulary, _damage_identity_vocab_size])
def test_a_damaged_remembered_description_is_described_again_never_trusted(tmp_path, damage):
    """A remembered description is checked before it is trusted: a serialization cut short (a crash before the file
    system wrote it), one that still parses but holds other ids, or an identity whose vocabulary size changed, is
    refused, and the tokenizer described again and remembered whole. Before, the damaged serialization was what the
    build's encoders loaded, with the cache's identity still the tokenizer's: other tokens, under the right name."""
    remembered = tmp_path / "remembered"
    env = {**os.environ, "TOKENMIX_CACHE_DIR": str(remembered)}

    def fresh_process() -> list:
        out = subprocess.run([sys.executable, "-c", RECALL_IN_A_FRESH_PROCESS, TOKENIZER], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    identity, info, described = fresh_process()
    assert info == described
    damage(remembered / "tokenizers")
    identity, info, described = fresh_process()
    assert info == described and identity == {k: described[k] for k in identity}
    _, info, _ = fresh_process()  # and the description was remembered whole again
    assert info == described


def test_a_tokenizer_described_by_other_code_is_described_again(tmp_path):
    """The description is made by tokenmix's own code (``formats/tokenizer.py``: which tokens are BOS, EOS and padding,
    whether the tokenizer adds BOS itself, what the fingerprint hashes), which decides the ids put around each document
    and a cache's identity: a description remembered by other code (another checkout or release of tokenmix) is not
    taken, or two machines would build one config into other tokens under other identities."""
    package = tmp_path / "src" / "tokenmix"
    shutil.copytree(REPO / "src" / "tokenmix", package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "TOKENMIX_CACHE_DIR": str(tmp_path / "remembered"), "PYTHONPATH": str(tmp_path / "src")}

    def remembered_pad_id() -> int | None:
        code = "import sys; from tokenmix.formats.tokenizer_identity import tokenizer_identity; print(tokenizer_identity(sys.argv[1]).pad_id)"
        out = subprocess.run([sys.executable, "-c", code, TOKENIZER], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().replace("None", "null"))

    assert remembered_pad_id() == describe_tokenizer(TOKENIZER).pad_id is not None
    describing = package / "formats" / "tokenizer.py"
    code = describing.read_text()
    assert "pad_id=tok.pad_token_id," in code
    describing.write_text(code.replace("pad_id=tok.pad_token_id,", "pad_id=None,"))  # other code: no padding token
    assert remembered_pad_id() is None


def test_an_unwritable_description_cache_only_costs_the_description(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(blocked))
    assert not descriptions_dir().is_dir()
    assert tokenizer_identity(TOKENIZER) == describe_tokenizer(TOKENIZER).identity()


DESCRIBE_ON_A_FULL_DISK = textwrap.dedent("""
    import json, resource, signal, sys
    from tokenmix.formats.tokenizer_identity import tokenizer_info
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as one on a full disk does
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))
    print(json.dumps([tokenizer_info(sys.argv[1]).vocab_size]))
""")


def test_a_description_that_cannot_be_written_whole_leaves_nothing_behind(tmp_path):
    """Where the disk fills up while a description is remembered (its serialization is megabytes), nothing is left in
    the directory: before, every process left its scratch file, hundreds of kilobytes each, filling the disk further, and the small
    file, written after the serialization failed, said a whole description was there. The description is still given."""
    remembered = tmp_path / "remembered"
    env = {**os.environ, "TOKENMIX_CACHE_DIR": str(remembered)}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", DESCRIBE_ON_A_FULL_DISK, TOKENIZER], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [describe_tokenizer(TOKENIZER).vocab_size]
    assert sorted(p.name for p in (remembered / "tokenizers").iterdir()) == []


def test_processes_describing_one_tokenizer_at_once_remember_one_whole_description(tmp_path):
    """Four processes that find nothing remembered describe the tokenizer at the same time: each gets the description,
    and what is left is one whole description (its two files, no scratch file), which a later process takes."""
    remembered = tmp_path / "remembered"
    env = {**os.environ, "TOKENMIX_CACHE_DIR": str(remembered)}
    runs = [subprocess.Popen([sys.executable, "-c", RECALL_IN_A_FRESH_PROCESS, TOKENIZER], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = []
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        results.append(json.loads(out))
    assert all(result == results[0] for result in results) and results[0][1] == results[0][2]
    assert sorted(p.suffix for p in (remembered / "tokenizers").iterdir()) == [".backend", ".json"]
    out = subprocess.run([sys.executable, "-c", RECALL_IN_A_FRESH_PROCESS, TOKENIZER], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == results[0]


def test_a_hub_id_is_never_looked_up_in_the_description_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(tmp_path / "descriptions"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="could not be loaded"):
        tokenizer_identity("no-such-org/no-such-tokenizer")
    assert not (tmp_path / "descriptions").exists()
