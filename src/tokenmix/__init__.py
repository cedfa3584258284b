"""tokenmix: tokenized caches on tensorstore, exact lazy mixtures over them, and sharded batches for JAX meshes.

From raw shards to a training step::

    import tokenmix

    config = tokenmix.load_data_config("config/demo.yaml")   # or a dict; overrides as ["--cache_dir", "/tmp/c"]
    tokenmix.build_caches(config)                             # every source and split; resumes, extends
    train = config.train_set(seq_len=1024)                    # a MixtureDataset: exact, lazy, deterministic
    loader = tokenmix.DataLoader(train, 32, mesh, {"batch": "data"})

Importing tokenmix is cheap: each name below is imported on first use, and only the four names of the
loader that hold JAX arrays or live beside them (``DataLoader``, ``StepBatch``, ``LmBatch``, ``LoaderError``)
start JAX. The stage packages (``tokenmix.sources``, ``formats``, ``cache``, ``datasets``,
``loader``, ``config``, and ``execution``, where tasks run) each name more of their own.

Configs (draccus dataclasses; Levanter's field names)
    load_data_config            Load a data config (mixture or single dataset) from a YAML file or a mapping, with overrides.
    DataConfig                  Either data config: LMMixtureDatasetConfig or LMDatasetConfig.
    LMMixtureDatasetConfig      Named sources sharing a tokenizer and a cache directory, mixed by weight into a training set.
    LMDatasetConfig             A single source with its tokenizer and cache directory (Levanter's single-dataset form).
    LMDatasetSourceConfig       One data source, given by URLs (with brace expansion and globs) or as a Hugging Face dataset.
    TokenizationConfig          The tokenizer and the special tokens every document gets; part of each cache's identity.
    PackingConfig               Packing a source's whole documents into ``seq_len`` examples, instead of cutting its token stream.
    TokenFilesConfig            Token files read in place instead of text: which stack wrote them and what they were tokenized with.
    BuildOptions                How a cache is built; none of these change the cache's contents.
    LocalExecutorConfig         Worker processes on this machine (``num_workers`` of them); a cache build encodes ``fastokens`` in threads instead.
    RayExecutorConfig           Tasks on Ray (``pip install 'tokenmix[ray]'``).
    DaskExecutorConfig          Tasks on Dask distributed (``pip install 'tokenmix[dask]'``).

Formats (``format: {type: ...}``)
    LmDatasetFormatBase         How records of a source become documents; chosen in YAML with ``format: {type: ...}``.
    TextLmDatasetFormat         Plain text in one field of each record (a list of strings is joined with blank lines).
    SupervisedLmDatasetFormat   A prompt and a completion per record; loss only on the completion and its EOS.
    ChatLmDatasetFormat         A conversation per record; loss only on what the template marks as generated (the assistant turns).
    FimLmDatasetFormat          Text in one field, fill-in-the-middle transformed with probability ``fim_rate``.
    PrebuiltLmDatasetFormat     Token ids given by each record, with optional 0/1 loss weights.

Caches
    build_caches                Build (or resume, or extend) every cache of the config; returns statistics per (source, split).
    open_cache                  Open a built (or building) cache of the config, refusing one made with other settings.
    TokenCache                  Random access to the committed documents of one cache.
    TokenFilesCache             The documents of token files, in the order given, as a finished read-only cache.
    verify_cache                Check every stored byte of a cache against its checksums, bounds and ledger; optionally repair.
    CacheReport                 What ``verify_cache`` found (and repaired) in one cache.

Datasets
    Dataset                     Random access to examples by index; the length may grow while the underlying cache builds.
    TokenBatch                  A batch of fixed-length examples (numpy arrays; the loader turns them into jax arrays).
    TokenSeqDataset             Fixed-length examples over a cache's documents, with loss masks and per-document segment ids.
    PackedDataset               Examples of ``seq_len`` tokens packed from whole documents of a cache, with segment ids and loss masks.
    MixtureDataset              Examples drawn from named sources in exact proportions, per block of ``block_size``.
    SourceUsage                 What a mixture has drawn from one source up to some index.

Online mixing (weights an algorithm sets during a run; ``MixtureDataset.append_stage`` applies them: ``tokenmix.mixing``)
    AdaptiveMixing              An online weight algorithm and when its updates apply. ``train_weights`` is the first stage.
    WeightUpdater               An online weight algorithm over the mixture's sources (``names``, sorted by name).
    OdmUpdater                  ODM (Albalak, Pan, Raffel, Wang 2023, arXiv:2312.02406): EXP3 over the sources, the training loss as reward.
    DoReMiUpdater               DoReMi's online form (Xie et al. 2023, arXiv:2305.10429, Algorithm 1): exponentiated gradient on the excess loss.
    make_updater                The updater ``config.algorithm`` names, over ``names``, starting from the weights in effect ``initial``.
    SourceStats                 Per source (in mixture order): summed training loss and trained tokens of one step (or of several, added).

Loader (DataLoader, StepBatch, LmBatch and LoaderError import JAX)
    DataLoader                  Global batches of ``dataset`` for each training step, sharded over ``mesh`` by ``axis_mapping``.
    BatchSchedule               Batch sizes by step: stage ``i`` runs from ``stages[i][0]`` (a step) with batch size ``stages[i][1]``.
    StepBatch                   One step of the loader: which step and examples, the batch, and its fingerprint.
    LmBatch                     A global batch on the mesh: haliax NamedArrays, sharded as the loader's axis mapping says.
    batch_fingerprint           The fingerprint of a whole batch held in one place (what the loader computes from its shards).

Export (to the files other stacks train from: ``tokenmix.export``)
    export_cache                Write a finished cache (``TokenCache``, or the ``TokenFilesCache`` of a token-file source) as ``to``:
    Hdf5ExportOptions           How a cache becomes Cerebras HDF5 samples, with the option names of Cerebras's ``create_hdf5_dataset.py``.

Curation (before tokenizing; NeMo Curator's calls and its heuristic filters by name: ``tokenmix.curate``)
    load_curation_config        A pipeline from a YAML file (or a mapping), with draccus-style overrides (``--output.path /tmp/out``).
    run_curation                Run (or resume) a pipeline; returns what ``curation_stats.json`` holds.
    CurationConfig              A curation pipeline (``tokenmix curate --config_path pipeline.yaml``).
    DocumentDataset             A lazy collection of documents over sharded files, with the stages to run on them.

Errors
    ConfigError                 A data config that cannot be used; the message names the file and field, and what to change.
    NoShardsError               A URL pattern matched no file.
    ShardReadError              A shard could not be read (further); ``position`` is where reading stopped.
    BadRecordError              A record that cannot become a document; ``reason`` is the counter it is skipped under.
    TokenizerLoadError          The tokenizer named in a config could not be loaded.
    BadInputError               A bad record or unreadable shard under ``on_error: raise``.
    ShardTaskError              A shard's task failed on every try on the cluster (worker lost, storage error, ...).
    MissingExtraError           The chosen executor's engine is not installed.
    CacheNotFoundError          No cache (no ledger) at the location.
    CacheMismatchError          An existing cache was made with a different tokenizer, format or options.
    ShardListMismatchError      The configured shard list is not an extension of the one the cache was built from.
    ShardChangedError           An input shard is not what the cache was built from: its size, modification time or ETag changed.
    EncodingChangedError        A build would add rows to a cache encoded otherwise than its rows (a library or tokenmix upgraded since).
    CacheLockedError            Another builder holds the cache's build lock; the message names it (host, pid, start time).
    LockLostError               This builder's lease on the cache was taken over by another builder; it stopped before its next commit.
    CurationError               A pipeline that cannot run as configured; the message names the field and what to change.
    CurationInputError          A bad record or an unreadable shard under ``on_error: raise``; the message names the file and the line.
    TokenFileError              A token file that cannot be read as the kind it was declared; the message names the file and the fix.
    CacheWriteError             The cache's storage refused a write (permissions, a full disk, ...); the message says what is kept and what to do.
    UnsafeFileError             A path where tokenmix writes a file of its own holds a symbolic link (or something else that is not a file).
    CacheDamagedError           Stored bytes of a cache failed their check: a checksum mismatch, a missing or cut-short object, a damaged index.
    RepairError                 A cache that cannot be repaired from its inputs; the message says why and what to do instead.
    LoaderError                 Loading a step failed (waiting for, reading or placing its examples); the message names the step.
"""

from typing import TYPE_CHECKING

from tokenmix._blas_threads import shorten_idle_spin
from tokenmix._lazy import lazy_exports

shorten_idle_spin()

if TYPE_CHECKING:
    from tokenmix._safe_files import UnsafeFileError
    from tokenmix.cache.appending import BadInputError
    from tokenmix.cache.cluster_build import ShardTaskError
    from tokenmix.cache.damage import CacheDamagedError
    from tokenmix.cache.encoding_continuity import EncodingChangedError
    from tokenmix.cache.ledger import CacheMismatchError, ShardChangedError, ShardListMismatchError
    from tokenmix.cache.lock import CacheLockedError, LockLostError
    from tokenmix.cache.options import BuildOptions
    from tokenmix.cache.reader import CacheNotFoundError, TokenCache
    from tokenmix.cache.repair import RepairError
    from tokenmix.cache.scrub import CacheReport
    from tokenmix.cache.store import CacheWriteError
    from tokenmix.cache.token_files_cache import TokenFilesCache
    from tokenmix.config.adaptive import AdaptiveMixing
    from tokenmix.config.caches import build_caches, open_cache
    from tokenmix.config.loading import ConfigError, load_data_config
    from tokenmix.config.mixture import DataConfig, LMDatasetConfig, LMMixtureDatasetConfig
    from tokenmix.config.sources import LMDatasetSourceConfig, PackingConfig
    from tokenmix.config.token_file_source import TokenFilesConfig
    from tokenmix.config.tokenization import TokenizationConfig
    from tokenmix.config.verification import verify_cache
    from tokenmix.curate.document_dataset import DocumentDataset
    from tokenmix.curate.pipeline import load_curation_config, run_curation
    from tokenmix.curate.pipeline_config import CurationConfig, CurationError
    from tokenmix.curate.shard_io import CurationInputError
    from tokenmix.datasets.base import Dataset, TokenBatch
    from tokenmix.datasets.mixture import MixtureDataset, SourceUsage
    from tokenmix.datasets.packed import PackedDataset
    from tokenmix.datasets.token_seq import TokenSeqDataset
    from tokenmix.execution.configs import DaskExecutorConfig, LocalExecutorConfig, RayExecutorConfig
    from tokenmix.execution.extras import MissingExtraError
    from tokenmix.export.dispatch import export_cache
    from tokenmix.export.hdf5_options import Hdf5ExportOptions
    from tokenmix.formats.base import BadRecordError, LmDatasetFormatBase
    from tokenmix.formats.chat import ChatLmDatasetFormat
    from tokenmix.formats.fim import FimLmDatasetFormat
    from tokenmix.formats.prebuilt import PrebuiltLmDatasetFormat
    from tokenmix.formats.supervised import SupervisedLmDatasetFormat
    from tokenmix.formats.text import TextLmDatasetFormat
    from tokenmix.formats.tokenizer import TokenizerLoadError
    from tokenmix.loader.batch import LmBatch, StepBatch
    from tokenmix.loader.batch_schedule import BatchSchedule
    from tokenmix.loader.fingerprint import batch_fingerprint
    from tokenmix.loader.loader import DataLoader, LoaderError
    from tokenmix.mixing.source_stats import SourceStats
    from tokenmix.mixing.weight_updaters import DoReMiUpdater, OdmUpdater, WeightUpdater, make_updater
    from tokenmix.sources.shards import ShardReadError
    from tokenmix.sources.token_file_base import TokenFileError
    from tokenmix.sources.urls import NoShardsError

__all__ = [
    "AdaptiveMixing",
    "BadInputError",
    "BadRecordError",
    "BatchSchedule",
    "BuildOptions",
    "CacheDamagedError",
    "CacheLockedError",
    "CacheMismatchError",
    "CacheNotFoundError",
    "CacheReport",
    "CacheWriteError",
    "ChatLmDatasetFormat",
    "ConfigError",
    "CurationConfig",
    "CurationError",
    "CurationInputError",
    "DaskExecutorConfig",
    "DataConfig",
    "DataLoader",
    "Dataset",
    "DoReMiUpdater",
    "DocumentDataset",
    "EncodingChangedError",
    "FimLmDatasetFormat",
    "Hdf5ExportOptions",
    "LMDatasetConfig",
    "LMDatasetSourceConfig",
    "LMMixtureDatasetConfig",
    "LmBatch",
    "LmDatasetFormatBase",
    "LoaderError",
    "LocalExecutorConfig",
    "LockLostError",
    "MissingExtraError",
    "MixtureDataset",
    "NoShardsError",
    "OdmUpdater",
    "PackedDataset",
    "PackingConfig",
    "PrebuiltLmDatasetFormat",
    "RayExecutorConfig",
    "RepairError",
    "ShardChangedError",
    "ShardListMismatchError",
    "ShardReadError",
    "ShardTaskError",
    "SourceStats",
    "SourceUsage",
    "StepBatch",
    "SupervisedLmDatasetFormat",
    "TextLmDatasetFormat",
    "TokenBatch",
    "TokenCache",
    "TokenFileError",
    "TokenFilesCache",
    "TokenFilesConfig",
    "TokenSeqDataset",
    "TokenizationConfig",
    "TokenizerLoadError",
    "UnsafeFileError",
    "WeightUpdater",
    "batch_fingerprint",
    "build_caches",
    "export_cache",
    "load_curation_config",
    "load_data_config",
    "make_updater",
    "open_cache",
    "run_curation",
    "verify_cache",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
