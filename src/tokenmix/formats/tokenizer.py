"""Loading a tokenizer and describing it: identity fingerprint, special tokens, default BOS/EOS.

A tokenizer is a Hugging Face hub id or tokenizer directory, or given by its files as Cerebras' preprocessing takes
them: a single ``tokenizer.json`` file (its NeoX ``encoder_file``), or a directory holding GPT-2's ``vocab.json`` and
``merges.txt`` alone (its GPT-2 ``encoder_file`` and ``vocab_file``).

The fingerprint hashes the tokenizer's full serialized definition (vocabulary, merges,
normalizer, pre-tokenizer, added tokens) plus its special-token settings and chat template, so
the same tokenizer loaded by hub name or from a local copy gets the same fingerprint, and any
change to what it produces gets a different one.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class _NoTorchAdvice(logging.Filter):
    """Drops transformers' "PyTorch was not found" advice: tokenmix uses its tokenizers only, never its models."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("PyTorch was not found")


_NO_TORCH_ADVICE = _NoTorchAdvice()


def import_transformers() -> None:
    """Import ``transformers`` (for its tokenizers and chat templates) without its advice to install PyTorch."""
    logging.getLogger("transformers").addFilter(_NO_TORCH_ADVICE)
    import transformers  # noqa: F401


class TokenizerLoadError(ValueError):
    """The tokenizer named in a config could not be loaded."""


@dataclass(frozen=True)
class TokenizerIdentity:
    """The part of a tokenizer's description a cache's identity is made of: what opening a cache checks."""

    fingerprint: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    adds_bos: bool
    """Whether the tokenizer's own post-processor puts a BOS at the start of a sequence."""
    adds_eos: bool
    """Whether the tokenizer's own post-processor puts an EOS at the end of a sequence."""


@dataclass(frozen=True)
class TokenizerInfo(TokenizerIdentity):
    """What the cache needs to know about a tokenizer, picklable for worker processes."""

    name_or_path: str
    backend_json: str
    special_tokens: tuple[tuple[str, str], ...] = ()
    """Named special tokens (``bos_token``, ``eos_token``, ...) as a chat template sees them."""
    chat_template: str | None = None

    def identity(self) -> TokenizerIdentity:
        """The identity part alone (what ``tokenizer_identity.py`` remembers)."""
        return TokenizerIdentity(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TokenizerIdentity)})


_TOKENIZER_FILES = re.compile(
    r"(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab.*|merges\.txt|.*\.model|.*\.tiktoken|chat_template.*|config\.json)"
)
"""Files of a tokenizer directory that ``AutoTokenizer`` may read (``config.json`` chooses the tokenizer class)."""
_CHAT_TEMPLATES = "additional_chat_templates"
"""The subdirectory of a tokenizer directory whose ``*.jinja`` files ``AutoTokenizer`` reads as named chat templates."""


def tokenizer_files(path: str) -> list[str]:
    """The files a local tokenizer at absolute ``path`` is read from: the file itself, or the files of a directory that
    ``AutoTokenizer`` may read (its named chat templates included), in a fixed order; none for a path that is neither."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        return []
    files = [os.path.join(path, name) for name in sorted(os.listdir(path)) if _TOKENIZER_FILES.fullmatch(name)]
    templates = os.path.join(path, _CHAT_TEMPLATES)
    if os.path.isdir(templates):
        files += [os.path.join(templates, name) for name in sorted(os.listdir(templates)) if name.endswith(".jinja")]
    return [file for file in files if os.path.isfile(file)]


def file_state(path: str) -> tuple[int, ...]:
    """What the file system says of a file's version (size, modification and change times, device and inode, the link
    followed): a rewrite changes it even where the size and modification time are put back, as only a file's change
    time cannot be."""
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_dev, stat.st_ino


def _files_state(path: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The state of every file of the local tokenizer at ``path`` (empty for a hub id): what a tokenizer loaded or described
    in this process is kept under beside its name, so that one whose files change is loaded anew."""
    return tuple((file, file_state(file)) for file in tokenizer_files(path))


_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = ("1", "ON", "YES", "TRUE")  # the values huggingface_hub reads as set
GPT2_SPECIAL_TOKEN = "<|endoftext|>"
"""GPT-2's and GPT-NeoX's one special token: BOS, EOS and unknown token of a tokenizer given by its files, when it has it."""


def load_tokenizer(name_or_path: str) -> Any:
    """Load a Hugging Face tokenizer from a local directory or file (see ``_from_local``), or by hub id.

    A name that exists locally is loaded from there, never from the hub. Any other name goes to the hub only if it
    could be a hub id (see ``_is_local_path``), and then to the local hub cache alone when HF_HUB_OFFLINE or
    TRANSFORMERS_OFFLINE is set; a local path that does not exist is refused at once, instead of after the hub's
    retries (about 46 s without a network). Tokenizers are kept by absolute path or hub id and the state of their
    local files (``_files_state``), so a relative path means what it means in the current directory and a tokenizer
    whose files change is loaded anew; a failure is never kept.
    """
    path = os.path.abspath(os.path.expanduser(name_or_path))
    local = os.path.exists(path)
    if not local and _is_local_path(name_or_path):
        raise TokenizerLoadError(f"tokenizer {name_or_path!r} could not be loaded: {_missing(name_or_path, path)}. Fix: check the path, "
                                 "or give a Hugging Face hub id such as 'gpt2' or 'org/name' to download the tokenizer")
    offline = None if local else next((v for v in _OFFLINE_VARIABLES if os.environ.get(v, "").strip().upper() in _TRUE), None)
    try:
        return _load(path if local else name_or_path, local, offline is not None, _files_state(path) if local else ())
    except (OSError, ValueError) as e:
        if local:
            problem = (f"{path} exists but holds no tokenizer transformers can load. Fix: give a directory holding tokenizer.json "
                       "(or vocabulary files) and tokenizer_config.json, a tokenizer.json file, or a directory holding GPT-2's "
                       "vocab.json and merges.txt")
        elif offline:
            problem = (f"{_missing(name_or_path, path)}, and {offline} is set, so only the local Hugging Face cache was searched "
                       f"and it does not hold this hub id. Fix: check the name, unset {offline} to download it, or give a local directory")
        else:
            problem = (f"{_missing(name_or_path, path)}, and the Hugging Face hub could not provide it as a hub id. Fix: check "
                       "the name and the network, or give a local tokenizer directory")
        raise TokenizerLoadError(f"tokenizer {name_or_path!r} could not be loaded: {problem} ({e})") from e


@functools.lru_cache(maxsize=8)
def _load(source: str, local: bool, offline: bool, state: tuple[tuple[str, tuple[int, ...]], ...]) -> Any:
    """A local tokenizer (``_from_local``) or a hub id's, kept per absolute path or hub id and ``state`` of its files (a
    call that raises keeps nothing)."""
    return _from_local(source) if local else _from_pretrained(source, local_files_only=offline)


def _from_local(path: str) -> Any:
    """A local tokenizer: a ``tokenizer.json`` file; a directory holding ``vocab.json`` and ``merges.txt`` but neither
    ``tokenizer.json`` nor ``tokenizer_config.json`` (GPT-2's files, which ``AutoTokenizer`` cannot place); else a Hugging
    Face tokenizer directory."""
    if os.path.isfile(path):
        return _from_tokenizer_file(path)
    names = set(os.listdir(path))
    if {"vocab.json", "merges.txt"} <= names and not names & {"tokenizer.json", "tokenizer_config.json"}:
        return _from_vocab_and_merges(path)
    return _from_pretrained(path, local_files_only=True)


def _from_pretrained(source: str, local_files_only: bool) -> Any:
    """``AutoTokenizer.from_pretrained``."""
    import_transformers()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source, local_files_only=local_files_only)


def _from_tokenizer_file(path: str) -> Any:
    """A fast tokenizer over a ``tokenizer.json`` file (a NeoX-style ``encoder_file``), with ``<|endoftext|>`` as BOS, EOS
    and unknown token when it has that token (as GPT-NeoX's own configuration sets them), else no special tokens."""
    import_transformers()
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    try:
        backend = Tokenizer.from_file(path)
    except Exception as e:  # the tokenizers library raises a bare Exception for a file it cannot parse
        raise ValueError(f"{path} is not a tokenizer.json file the tokenizers library can read: {e}") from e
    special = GPT2_SPECIAL_TOKEN if backend.token_to_id(GPT2_SPECIAL_TOKEN) is not None else None
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=special, eos_token=special, unk_token=special)


def _from_vocab_and_merges(directory: str) -> Any:
    """GPT-2's byte-level BPE over a directory's ``vocab.json`` and ``merges.txt``, with ``<|endoftext|>`` as BOS, EOS and
    unknown token when the vocabulary has it; without it, no special tokens (GPT-2's defaults would add it as a new id)."""
    import_transformers()
    from transformers import GPT2TokenizerFast

    with open(os.path.join(directory, "vocab.json"), "rb") as f:
        has_special = GPT2_SPECIAL_TOKEN in json.load(f)
    special = {} if has_special else {"bos_token": None, "eos_token": None, "unk_token": None}
    return GPT2TokenizerFast.from_pretrained(directory, local_files_only=True, **special)


def _is_local_path(name: str) -> bool:
    """Whether a name that does not exist locally is a local path all the same, so that the hub need not be asked.

    A hub id is ``name`` or ``org/name`` in letters, digits, ``-``, ``_`` and ``.``, starting with neither ``.``
    nor ``-`` (huggingface_hub's own check). Anything else is a path: ``./x``, ``../x``, ``/x``, ``~/x``, ``a/b/c``,
    a Windows path; and so is ``org/name`` when ``org`` is a local directory (``data/tokenizr``, a typo).
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    first, slash, _ = name.partition("/")
    return bool(slash) and os.path.isdir(first)


def _missing(name: str, path: str) -> str:
    """What is known of a path that does not exist: where it was looked for, and the nearest thing that does exist."""
    where = "" if os.path.isabs(os.path.expanduser(name)) else f" (a relative path is resolved against the current directory, {os.getcwd()})"
    parent, part = os.path.split(path)
    while not os.path.isdir(parent) and parent != os.path.dirname(parent):
        parent, part = os.path.split(parent)
    try:
        close = difflib.get_close_matches(part, os.listdir(parent), n=1)
    except OSError:
        close = []
    near = f" (did you mean {close[0]!r}?)" if close else ""
    return f"no such local file or directory {path}{where}; {parent} holds no {part!r}{near}"


def describe_tokenizer(name_or_path: str) -> TokenizerInfo:
    """Load a tokenizer and describe it (fingerprint, vocabulary size, special ids, BOS/EOS habits); kept, as the
    tokenizer itself is, per name and state of its local files."""
    return _describe(name_or_path, _files_state(os.path.abspath(os.path.expanduser(name_or_path))))


@functools.lru_cache(maxsize=8)
def _describe(name_or_path: str, state: tuple[tuple[str, tuple[int, ...]], ...]) -> TokenizerInfo:
    tok = load_tokenizer(name_or_path)
    backend = tok.backend_tokenizer
    backend_json = backend.to_str()
    identity = {
        "backend_sha256": hashlib.sha256(backend_json.encode("utf-8")).hexdigest(),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "chat_template": getattr(tok, "chat_template", None),
    }
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()
    sample = "a" if backend.token_to_id("[UNK]") is not None or not _word_level_without_unknown(backend_json) else ""
    probe = backend.encode(sample, add_special_tokens=True).ids
    plain = backend.encode(sample, add_special_tokens=False).ids
    bos_id, eos_id = tok.bos_token_id, tok.eos_token_id
    adds_bos = bos_id is not None and len(probe) > len(plain) and probe[0] == bos_id
    adds_eos = eos_id is not None and len(probe) > len(plain) and probe[-1] == eos_id
    return TokenizerInfo(
        name_or_path=name_or_path,
        fingerprint=fingerprint,
        backend_json=backend_json,
        vocab_size=len(tok),
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=tok.pad_token_id,
        adds_bos=adds_bos,
        adds_eos=adds_eos,
        special_tokens=tuple(sorted((k, str(v)) for k, v in tok.special_tokens_map.items() if isinstance(v, str))),
        chat_template=identity["chat_template"] if isinstance(identity["chat_template"], str) else None,
    )


def _word_level_without_unknown(backend_json: str) -> bool:
    """Whether a tokenizer is a word-level one that cannot encode a word outside its vocabulary (the passthrough
    tokenizer's ids as text): its BOS/EOS habit is probed on empty text instead of "a"."""
    model = json.loads(backend_json).get("model", {})
    return model.get("type") == "WordLevel" and model.get("unk_token") not in model.get("vocab", {})
