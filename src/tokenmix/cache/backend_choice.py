"""Choosing a build's tokenizer backend: ``fastokens`` where it gives the ids ``tokenizers`` gives, else ``tokenizers``.

Unless ``build.tokenizer_backend`` is ``tokenizers``, both backends encode the first ``BACKEND_SAMPLE_BYTES`` of the
first shard left to read into what the cache would hold, and must agree for ``fastokens`` to be used
(``formats.backends.choose_backend`` says why not). The choice is made in a thread started with the build: the check
(and loading ``fastokens``, about 0.15 s) overlaps the build's first reads, which need no tokenizer. A run of builds
over many caches chooses once per encoder spec (``BackendChoices``). The sample's verdict is remembered on the machine
(``formats/probe_verdicts.py``): a build whose sample, spec, libraries and encoding code were all checked before takes
it, and neither loads ``tokenizers`` nor encodes the sample.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future

from tokenmix.cache.ledger import CacheLedger
from tokenmix.formats.backends import FAST, REFERENCE, BackendChoice, TokenizerBackend, choose_backend
from tokenmix.formats.encoder import DocumentEncoder, chunk_difference
from tokenmix.formats.encoder_spec import TEXT_LIBRARIES, EncoderSpec, encoding_modules
from tokenmix.formats.probe_verdicts import ProbeVerdict, recall_verdict, remember_verdict, verdict_key
from tokenmix.formats.tokenizer_facts import tokenizer_facts
from tokenmix.sources.shards import RawChunk, Shard, ShardReadError, approx_size

logger = logging.getLogger(__name__)

BACKEND_SAMPLE_BYTES = 64 << 10
"""Input bytes of the first shard left to read that both tokenizer backends encode before a build chooses between them."""



def sample_verdict_key(spec: EncoderSpec, sample: RawChunk) -> str | None:
    """The key under which the check's verdict on ``sample`` encoded by ``spec`` is remembered (``probe_verdicts.py``);
    None where it is not remembered: a tokenizer that encodes at random, or records that are not bytes (the parsed rows
    of a Hugging Face dataset, whose values need not have one exact serialization)."""
    if tokenizer_facts(spec.tokenizer_json).encodes_at_random or not all(isinstance(r, bytes) for r in sample.records):
        return None
    described = repr(dataclasses.replace(spec, tokenizer_json="", backend=REFERENCE))
    checked = [described, str(sample.start), *(part for r in sample.records for part in (type(r).__name__, r))]
    return verdict_key(spec.tokenizer_json, checked, (*encoding_modules(), __file__), libraries=TEXT_LIBRARIES)


class ChoosingBackend:
    """The tokenizer backend being chosen for one build, in a thread started when this is made."""

    def __init__(self, location: str, shards: Sequence[Shard], ledger: CacheLedger, spec: EncoderSpec, requested: TokenizerBackend):
        self.location = location
        self.shards = shards
        self.spec = spec
        self.requested = requested
        self._choice: Future[BackendChoice] = Future()
        threading.Thread(target=self._choose_into_future, args=(ledger,), name="tokenmix-backend-check").start()

    def done(self) -> bool:
        """Whether the backend is chosen (or choosing it failed)."""
        return self._choice.done()

    def result(self) -> BackendChoice:
        """The backend chosen and why, once chosen; raises what choosing it raised."""
        return self._choice.result()

    def encoder_spec(self) -> EncoderSpec:
        """The build's encoder spec with the chosen backend (waiting for the choice)."""
        return dataclasses.replace(self.spec, backend=self.result().name)

    def _choose_into_future(self, ledger: CacheLedger) -> None:
        try:
            self._choice.set_result(self._choose(ledger))
        except BaseException as e:  # raised where the build waits for the choice
            self._choice.set_exception(e)

    def _choose(self, ledger: CacheLedger) -> BackendChoice:
        """Pick the tokenizer backend on the first ``BACKEND_SAMPLE_BYTES`` of the first shard left to read: encoded by
        both backends into what the cache would hold, they must agree for ``fastokens`` to be used."""
        sample, sampled = None, "no sample"
        if self.requested != REFERENCE:
            sample, sampled = self._sample(ledger)
        key = sample_verdict_key(self.spec, sample) if sample else None
        known = recall_verdict(key, "sample") if key else None
        if known is not None:
            sampled += " (checked by an earlier build on this machine)"
        expected = None
        if sample and known is None:  # encoded now, by the reference, while fastokens may still be loading
            expected = DocumentEncoder(dataclasses.replace(self.spec, backend=REFERENCE)).encode(sample)

        def sample_difference() -> str | None:
            if known is not None:
                return known.difference
            if sample is None or expected is None:
                return None
            difference = chunk_difference(expected, DocumentEncoder(dataclasses.replace(self.spec, backend=FAST)).encode(sample))
            if key:
                remember_verdict(key, ProbeVerdict(difference), "sample")
            return difference

        choice = choose_backend(self.spec.tokenizer_json, self.requested, sample_difference, sampled)
        log = logger.info if choice.name == FAST or self.requested == REFERENCE else logger.warning
        log("%s: encoding with %s (%s)", self.location, choice.name, choice.reason)
        return choice

    def _sample(self, ledger: CacheLedger) -> tuple[RawChunk | None, str]:
        """The first records of the first shard left to read that can be read, and what they are (for the log)."""
        for shard, progress in zip(self.shards, ledger.shards):
            if progress.finished:
                continue
            try:
                first = next(iter(shard.read(progress.position, BACKEND_SAMPLE_BYTES)), None)
            except ShardReadError:
                continue  # the build reports it where it reads the shard
            if first is None:
                continue
            records, room = [], BACKEND_SAMPLE_BYTES
            for record in first.records:
                size = approx_size(record)
                if size <= room or not records and size <= 16 * BACKEND_SAMPLE_BYTES:  # a very long document waits for the build
                    records.append(record)
                    room -= size
            if records:
                return RawChunk(first.start, records), f"{len(records)} records sampled from {shard.name}"
        return None, "no sample (no record short enough for one)"


class BackendChoices:
    """The tokenizer backends of one run of builds: one choice per encoder spec and requested backend, made on the sample
    of the first cache of them that is built; the run's later caches of that spec take it.

    A spec is one tokenizer and format, so what a choice checks (that both backends give the cache the same ids) is the
    same for each of its caches; only the sampled text differs, as it does between a cache's own shards, of which only
    the first left to read is sampled. Choosing once spares every further cache the sample's encoding by the slow
    backend (about 20 ms of a core), which a build of a thousand small sources would otherwise pay a thousand times."""

    def __init__(self) -> None:
        self._choices: dict[tuple[EncoderSpec, TokenizerBackend], ChoosingBackend] = {}
        self._lock = threading.Lock()

    def choose(self, location: str, shards: Sequence[Shard], ledger: CacheLedger, spec: EncoderSpec,
               requested: TokenizerBackend) -> ChoosingBackend:
        """The backend for a cache of ``spec``: chosen on this cache's sample if it is the run's first of that spec."""
        with self._lock:
            choosing = self._choices.get((spec, requested))
            if choosing is None:
                choosing = self._choices[(spec, requested)] = ChoosingBackend(location, shards, ledger, spec, requested)
            return choosing
