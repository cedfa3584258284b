"""Mixture configs: named sources sharing a tokenizer and a cache directory, weighted into a training set.

Field names follow Levanter's (``configs``, ``train_weights``, ``mixture_block_size``, ``shuffle``,
``stop_strategy``, ``num_validation_sequences``) so that Levanter data YAMLs parse unchanged. These
classes turn configuration into the objects of ``cache``, ``datasets`` and ``loader``; nothing below
imports them. The modules of the datasets (numpy's, and tensorstore's for those that read caches) are imported by the
methods that make datasets, not at the top: reading a config, which every build and training launch does, imports
neither, and a build loads its tokenizer beside their imports (``build_caches``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING, Literal

from tokenmix.config.adaptive import AdaptiveMixing
from tokenmix.config.caches import DataConfigBase, open_cache
from tokenmix.config.components import DatasetComponentBase, components_shuffle, resolve_components
from tokenmix.config.levanter import CacheOptions, note_cache_options, refuse_removed_shard_counts
from tokenmix.config.plain_decoding import register_plain_mapping
from tokenmix.config.sources import LMDatasetSourceConfig
from tokenmix.datasets.settings import STOP_STRATEGIES, BlockShuffle, check_shuffle, normalize_schedule
from tokenmix.datasets.splits import SPLIT_NAMES, split_bounds
from tokenmix.formats.preference import PreferenceChatLmDatasetFormat
from tokenmix.formats.ul2r import Ul2rLmDatasetFormat
from tokenmix.loader.batch_schedule import BatchSchedule
from tokenmix.sources.urls import join_location

if TYPE_CHECKING:
    import numpy as np

    from tokenmix.cache.reader import TokenCache
    from tokenmix.datasets.base import Dataset
    from tokenmix.datasets.mixture import MixtureDataset
    from tokenmix.datasets.nanoset_order import NanosetOrderDataset

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LMMixtureDatasetConfig(DataConfigBase):
    """Named sources sharing a tokenizer and a cache directory, mixed by weight into a training set."""

    configs: dict[str, LMDatasetSourceConfig] = field(default_factory=dict)
    components: dict[str, DatasetComponentBase] = field(default_factory=dict)
    """Newer Levanter's schema, instead of ``configs``: resolved into ``configs`` (and ``train_weights``) when the config
    is made, after which it is empty (``config/components.py``)."""
    cache_dir: str | None = "cache/"
    """Where each source's caches go (``<cache_dir>/<source name>``); null (as Levanter allows) when every source has a
    ``cache_dir`` of its own."""
    cache_options: CacheOptions | None = None
    """Levanter's cache-builder options: accepted, and logged as having no effect here."""
    train_weights: dict[str, float] | list[tuple[int, dict[str, float]]] | None = field(default_factory=dict)
    """A weight per source, or ``[[start_step, {source: weight}], ...]`` stages (steps, not examples);
    missing sources weigh 0, a source with weight 0 everywhere is evaluation-only; empty or null: equal weights."""
    batch_size: int | list[tuple[int, int]] | None = None
    """Training batch size, or a ramp ``[[start_step, batch_size], ...]`` as the loader takes it; turns stage start
    steps into example indices (needed with stages), through the same schedule the loader uses."""
    mixture_block_size: int = 2048
    """Examples per block; every block holds its exact per-source counts."""
    shuffle: bool | int | BlockShuffle | None = None
    """Per-source order: true = full shuffle per epoch, false = in order, an int = shuffle within eras of that many,
    ``{io_block_size, window_blocks}`` = newer Levanter's block shuffle (``datasets/block_shuffle.py``). Unset, Levanter's
    default for the schema: false with ``configs`` (``LMMixtureDatasetConfig``), the block shuffle ``{256, 512}`` with
    ``components`` (``LmDataConfig``)."""
    shuffle_buffer_size: int | None = None
    """Older Levanter: shuffle through a buffer of this many examples; read as ``shuffle:`` eras of that many, the same
    bound on how far an example moves."""
    stop_strategy: str = "restart"
    """restart (sources loop, new order each epoch), first_exhausted or all_exhausted."""
    seed: int = 0
    num_validation_sequences: dict[str, int] | None = None
    """Per source without validation URLs: hold out documents holding this many ``seq_len`` sequences."""
    validation_fraction: dict[str, float] | None = None
    """Per source without validation URLs: hold out this fraction of its tokens (whole documents)."""
    target_budget: int | None = None
    """Levanter's simulated epoching, with ``experiment_budget``: each source keeps a random
    ``experiment_budget / target_budget`` of its training examples, so a short run repeats its data as often as a
    run of the target budget would."""
    experiment_budget: int | None = None
    simulated_epoch_subset_seed: int | None = None
    """Newer Levanter: the seed choosing the examples simulated epoching keeps; unset, the training seed chooses them."""
    max_train_batches: dict[str, int] | None = None
    """Per source: keep a random ``max_train_batches[source] x`` the first batch size of its training examples."""
    ignore_token_id: int | None = None
    """Levanter's field: no position is trained to predict this token id (Levanter's default, -100, is no id at all)."""
    permutation_type: Literal["feistel", "linear"] | None = None
    """Levanter's choice of shuffle permutation: accepted; tokenmix shuffles with its own keyed Feistel permutation."""
    shuffle_before_trainval_split: bool = True
    """With ``num_validation_sequences``: hold out randomly chosen documents (true), or the last ones (false), as Levanter."""
    auto_build_caches: bool | None = None
    """Newer Levanter: whether opening a missing cache builds it. Accepted: opening never builds here (``build_caches``
    or ``tokenmix build-cache`` does), so a missing cache is an error either way."""
    example_convention: Literal["levanter", "megatron", "datatrove"] = "levanter"
    """levanter: an example is ``seq_len`` tokens of a source's stream, the next starting where it ends. megatron (Megatron,
    Nanoset): ``seq_len + 1`` tokens read every ``seq_len``, so inputs and their shifted labels come from one read and
    consecutive examples share a token. datatrove (Nanotron's datatrove-backed Nanosets): ``seq_len + 1`` tokens with no
    overlap, never across the end of a token file (a file's last partial window is left out). Batches are ``seq_len + 1``
    wide under both."""
    example_order: Literal["tokenmix", "nanotron"] = "tokenmix"
    """tokenmix: ``MixtureDataset``'s exact, lazy blocks over each source's keyed shuffles. nanotron (what
    ``load_data_config`` sets for a Nanotron config of Nanoset files): Nanotron's own order, sample for sample: each
    ``train_weights`` stage a BlendedNanoset of its sources in the order listed, with the stage's seed
    (``stage_seeds``), reading from the index where the stage starts (``datasets/nanoset_order.py``). Needs
    ``example_convention: megatron`` and unpacked sources."""
    train_steps: int | None = None
    """Nanotron's ``tokens.train_steps``: with ``example_order: nanotron`` the training set has ``train_steps x
    batch_size`` examples (every stage's blend is built for that many); unset, it does not end."""
    stage_seeds: list[int] | None = None
    """With ``example_order: nanotron``: each ``train_weights`` stage's ``data.seed`` (unset: ``seed`` for every stage)."""
    adaptive: AdaptiveMixing | None = None
    """An online algorithm changing the weights during a training run (``config/adaptive.py``); ``train_weights`` is its
    first stage. Each update is appended to the run's weight log."""
    block_cross_document_attention: bool | None = None
    """Newer Levanter: whether attention stops at document boundaries. Accepted: every tokenmix batch carries the
    segment ids that blocking needs, and whether to block is the model's choice."""

    def __post_init__(self) -> None:
        if self.components:
            if self.configs:
                raise ValueError("give `configs` (Levanter's older schema) or `components` (its newer one), not both")
            object.__setattr__(self, "shuffle", components_shuffle(self.components, self.shuffle))
            configs, weights = resolve_components(self.components, self.train_weights, self.cache_dir)
            for name, value in (("configs", configs), ("train_weights", weights), ("components", {})):
                object.__setattr__(self, name, value)
        elif self.shuffle is None:
            object.__setattr__(self, "shuffle", False)
        if not self.configs:
            raise ValueError("a mixture needs at least one source in `configs` (or `components`), as in Levanter")
        names = list(self.configs)
        if self.cache_dir == "":
            raise ValueError("cache_dir is empty, which would put each source's caches at /<source name>: give a directory or "
                             "URL, or null when every source has a cache_dir of its own")
        homeless = [name for name, source in self.configs.items() if not source.cache_dir]
        if self.cache_dir is None and homeless:
            raise ValueError(f"cache_dir is null, so every source needs a cache_dir of its own, and {homeless} have none: set "
                             "the mixture's cache_dir (their caches go to <cache_dir>/<source name>) or theirs")
        if self.train_weights is None:
            object.__setattr__(self, "train_weights", {})  # Levanter's newer schema: null means equal weights
        note_cache_options(self.cache_options)
        if self.shuffle_buffer_size is not None and self.shuffle != self.shuffle_buffer_size:
            logger.info("shuffle_buffer_size %d (older Levanter) is read as shuffle: %d: each source shuffled within eras of "
                        "that many examples", self.shuffle_buffer_size, self.shuffle_buffer_size)
            object.__setattr__(self, "shuffle", self.shuffle_buffer_size)
        if self.example_convention not in ("levanter", "megatron", "datatrove"):
            raise ValueError(f"example_convention must be levanter, megatron or datatrove, got {self.example_convention!r}")
        if self.mixture_block_size < 1:
            raise ValueError(f"mixture_block_size must be at least 1 (examples per block), got {self.mixture_block_size}")
        if self.stop_strategy not in STOP_STRATEGIES:
            raise ValueError(f"stop_strategy: expected one of {STOP_STRATEGIES}, got {self.stop_strategy!r}")
        check_shuffle(self.shuffle, "mixture config")
        self.batch_schedule()  # refuses a bad ramp, naming `batch_size`
        if self.train_weights:
            normalize_schedule(self._weights_in_steps(), names, unit="step")
        if isinstance(self.train_weights, list) and len(self.train_weights) > 1 and not self.batch_size:
            raise ValueError("train_weights has stages given in steps: set `batch_size` (or, in a training config, "
                             "trainer.train_batch_size) so they can be turned into examples")
        for field_name in ("num_validation_sequences", "validation_fraction"):
            for name, value in (getattr(self, field_name) or {}).items():
                if name not in self.configs:
                    raise ValueError(f"{field_name}: unknown source {name!r}; the config defines {sorted(names)}")
                if self.configs[name].validation_urls or self.configs[name].id is not None or self._split_weights(name) is not None:
                    raise ValueError(f"{field_name}[{name!r}]: the source has its own validation split; remove it from {field_name}")
                limit = " and below 1" if field_name == "validation_fraction" else ""
                if not value > 0 or (limit and value >= 1):
                    raise ValueError(f"{field_name}[{name!r}] must be positive{limit}, got {value}")
        self._check_budgets()
        self._check_nanotron_order()
        self._check_preference_pairs()
        if self.adaptive is not None and self.example_order != "tokenmix":
            raise ValueError(f"adaptive mixing appends stages to tokenmix's own mixture: set example_order: tokenmix (not "
                             f"{self.example_order}), or remove adaptive")
        if self.adaptive is not None and isinstance(self.train_weights, list) and len(self.train_weights) > 1:
            raise ValueError(f"adaptive: train_weights is a schedule of {len(self.train_weights)} stages, and an online update applies "
                             "from a block of the last stage, so none would apply before the last stage starts (at step "
                             f"{self.train_weights[-1][0]}): give train_weights one mapping of weights, the first stage, or remove "
                             "adaptive")
        if self.adaptive is not None and self.stop_strategy == "all_exhausted" and self.adaptive.floor <= 0:
            raise ValueError("stop_strategy all_exhausted ends once every source is read through, and adaptive.floor 0 lets an "
                             "update give a source weight 0, so the mixture might never end: set adaptive.floor above 0")
        for field_name, why in (("auto_build_caches", "opening a cache never builds it here; build_caches or `tokenmix build-cache` "
                                 "builds missing caches"),
                                ("block_cross_document_attention", "every batch carries segment ids, and a model blocks "
                                 "attention across documents with them or not")):
            if getattr(self, field_name) is not None:
                logger.info("%s: %s is accepted; %s", field_name, getattr(self, field_name), why)
        if self.permutation_type == "linear":
            logger.info("permutation_type: linear is read as tokenmix's shuffle, a keyed Feistel permutation: Levanter's linear "
                        "permutation is a cheaper, less random stand-in for it, and the example order differs from Levanter's anyway")
        elif self.permutation_type not in (None, "feistel"):
            raise ValueError(f"permutation_type must be feistel or linear (Levanter's names), got {self.permutation_type!r}")

    def _check_budgets(self) -> None:
        """Levanter's rules for ``target_budget``/``experiment_budget`` and ``max_train_batches``."""
        budgets = (self.target_budget, self.experiment_budget)
        if (budgets[0] is None) != (budgets[1] is None):
            raise ValueError("target_budget and experiment_budget go together (simulated epoching): set both, or neither")
        if budgets[0] is not None:
            if not 0 < budgets[1] <= budgets[0]:  # type: ignore[operator]
                raise ValueError(f"experiment_budget must be positive and at most target_budget, got {budgets[1]} > {budgets[0]}")
            if self.max_train_batches or self.num_validation_sequences:
                raise ValueError("simulated epoching (target_budget, experiment_budget) cannot be combined with max_train_batches "
                                 "or num_validation_sequences, as in Levanter; keep one")
        for name, batches in (self.max_train_batches or {}).items():
            if name not in self.configs:
                raise ValueError(f"max_train_batches: unknown source {name!r}; the config defines {sorted(self.configs)}")
            if batches < 1:
                raise ValueError(f"max_train_batches[{name!r}] must be at least 1, got {batches}")
        if self.max_train_batches and self.batch_schedule() is None:
            raise ValueError("max_train_batches counts batches of the first batch size: set `batch_size` (or, in a training "
                             "config, trainer.train_batch_size)")

    def _check_preference_pairs(self) -> None:
        """Preference pairs are ``2 x seq_len`` wide: a training mixture holds them only with each other (Levanter's DPO
        data config takes preference_chat components only)."""
        trained = {n for _, w in self._stages() for n, v in w.items() if v > 0}
        pairs = {n for n in trained if isinstance(self.configs[n].format, PreferenceChatLmDatasetFormat)}
        if pairs and pairs != trained:
            raise ValueError(f"sources {sorted(pairs)} are preference_chat pairs and {sorted(trained - pairs)} are not: a training "
                             "mixture holds preference pairs only with each other (as Levanter's DPO data config); give the others "
                             "train_weights 0 or train them in another config")

    def _stages(self) -> list[tuple[int, dict[str, float]]]:
        weights = self._weights_in_steps() or dict.fromkeys(self.configs, 1.0)
        return [(0, weights)] if isinstance(weights, dict) else weights

    def _check_nanotron_order(self) -> None:
        """``example_order`` and the fields only Nanotron's order reads."""
        if self.example_order not in ("tokenmix", "nanotron"):
            raise ValueError(f"example_order must be tokenmix or nanotron, got {self.example_order!r}")
        if self.example_order == "tokenmix":
            unused = [f for f in ("train_steps", "stage_seeds") if getattr(self, f) is not None]
            if unused:
                logger.info("%s: read by example_order: nanotron only; tokenmix's order draws by seed and never ends", unused)
            return
        if self.example_convention != "megatron":
            raise ValueError(f"example_order: nanotron reads Nanoset samples (seq_len + 1 tokens every seq_len): set "
                             f"example_convention: megatron, not {self.example_convention}")
        packed = [name for name, source in self.configs.items() if source.packing_options() is not None]
        if packed:
            raise ValueError(f"example_order: nanotron reads windows of each source's stream, but {packed} pack documents; "
                             "remove their packing (or use example_order: tokenmix)")
        stages = len(self.train_weights) if isinstance(self.train_weights, list) else 1
        if self.stage_seeds is not None and len(self.stage_seeds) != stages:
            raise ValueError(f"stage_seeds has {len(self.stage_seeds)} seed(s) for {stages} train_weights stage(s); give one per stage")
        if self.train_steps is not None and (self.train_steps < 1 or self.batch_size is None):
            raise ValueError(f"train_steps ({self.train_steps}) must be at least 1 and needs batch_size: the training set has "
                             "train_steps x batch_size examples")

    def sources(self) -> dict[str, LMDatasetSourceConfig]:
        return dict(self.configs)

    def cache_location(self, name: str, split: str) -> str:
        source = self.configs[name]
        return join_location(source.cache_dir, split) if source.cache_dir else join_location(self.cache_dir, name, split)

    def pack_root(self, name: str) -> str | None:
        return None if self.configs[name].cache_dir else self.cache_dir

    def _weights_in_steps(self) -> dict[str, float] | list[tuple[int, dict[str, float]]]:
        if isinstance(self.train_weights, dict):
            return self.train_weights
        return [(int(step), dict(w)) for step, w in self.train_weights]

    def batch_schedule(self) -> BatchSchedule | None:
        """The batch sizes by step (``batch_size``), or None when it is not set."""
        if self.batch_size is None:
            return None
        spec = self.batch_size if isinstance(self.batch_size, int) else [tuple(stage) for stage in self.batch_size]
        return BatchSchedule.of(spec)

    def weight_schedule(self) -> list[tuple[int, dict[str, float]]]:
        """The weight stages with starts in example indices: the first example of each stage's start step."""
        weights = self._weights_in_steps() or {name: 1.0 for name in self.configs}
        stages = normalize_schedule(weights, list(self.configs), unit="step")
        schedule = self.batch_schedule() or BatchSchedule.constant(1)
        return [(schedule.offset(step), w) for step, w in stages]

    def _examples(self, name: str, cache: TokenCache, seq_len: int, source_id: int, documents: np.ndarray | None = None) -> Dataset:
        """A source's examples: packed documents, or windows of its token stream (see ``packing_options``), trained on
        nowhere they would predict ``ignore_token_id``."""
        from tokenmix.datasets.ignored_targets import IgnoredTargets

        examples = self._source_examples(name, cache, seq_len, source_id, documents)
        if self.ignore_token_id is None or not 0 <= self.ignore_token_id < (1 << 32):
            return examples
        return IgnoredTargets(examples, self.ignore_token_id)

    def _source_examples(self, name: str, cache: TokenCache, seq_len: int, source_id: int, documents: np.ndarray | None) -> Dataset:
        from tokenmix.cache.token_files_cache import TokenFilesCache
        from tokenmix.datasets.packed import PackedDataset
        from tokenmix.datasets.preference_pairs import PreferencePairs
        from tokenmix.datasets.token_seq import TokenSeqDataset
        from tokenmix.datasets.ul2r_denoising import UL2R_PAD_ID, DenoisingTask, Ul2rDataset

        fmt = self.configs[name].format
        if isinstance(fmt, Ul2rLmDatasetFormat):
            if documents is not None:
                raise ValueError(f"source {name!r}: format ul2r: Levanter's UL2R packs every document of the cache in order; remove "
                                 "it from num_validation_sequences/validation_fraction and give validation_urls instead")
            return Ul2rDataset(cache, self._example_width(name, seq_len), source_id,
                               tasks=[DenoisingTask(*task) for task in fmt.task_table()], task_probs=fmt.probabilities(),
                               seed=fmt.rng_seed, sentinel_ids=fmt.sentinel_ids(), pad_id=UL2R_PAD_ID)
        if isinstance(fmt, PreferenceChatLmDatasetFormat):
            if documents is not None:
                raise ValueError(f"source {name!r}: format preference_chat: holding out documents would split its pairs; remove it "
                                 "from num_validation_sequences/validation_fraction and give validation_urls instead")
            sides = PackedDataset(cache, seq_len, source_id, pad_id=self.pad_id(), max_segments_per_example=1)
            return PreferencePairs(sides, cache)
        packing = self.configs[name].packing_options()
        width = self._example_width(name, seq_len)
        if packing is None:
            if self.example_convention != "datatrove":
                return TokenSeqDataset(cache, width, source_id, documents=documents, stride=seq_len)
            runs = None
            if isinstance(cache, TokenFilesCache) and documents is None:
                begins, sizes = cache.file_ranges()
                runs = (begins, sizes // width * width)
            return TokenSeqDataset(cache, width, source_id, documents=documents, token_runs=runs)
        return PackedDataset(
            cache, width, source_id, pad_id=self.pad_id(), max_segments_per_example=packing.max_segments_per_example,
            long_documents=packing.long_documents, shuffle=packing.shuffle, key=packing.seed, documents=documents,
        )

    def _example_width(self, name: str, seq_len: int) -> int:
        """Tokens in each of a source's training examples: ``seq_len``, one more under ``example_convention`` megatron or
        datatrove (inputs and shifted labels from one read), twice ``seq_len`` for preference pairs (both sides)."""
        if isinstance(self.configs[name].format, PreferenceChatLmDatasetFormat):
            return 2 * seq_len
        return seq_len if self.example_convention == "levanter" else seq_len + 1

    def _train_dataset(self, name: str, seq_len: int, source_id: int) -> Dataset:
        if self._split_weights(name) is not None:
            return self._split_part(name, "train", seq_len, source_id)
        from tokenmix.config.holdout import kept_documents

        cache = open_cache(self, name, "train")
        held = self._held_out(name, cache, seq_len)
        if held is None:
            return self._examples(name, cache, seq_len, source_id)
        return self._examples(name, cache, seq_len, source_id, kept_documents(cache.num_rows(), held))

    def _held_out(self, name: str, cache: TokenCache, seq_len: int) -> np.ndarray | None:
        """Rows held out of a training cache for validation, or None when the source holds none out."""
        import numpy as np

        from tokenmix.config.holdout import held_out_documents
        from tokenmix.datasets.permutation import derive_key

        sequences = (self.num_validation_sequences or {}).get(name)
        fraction = (self.validation_fraction or {}).get(name)
        if sequences is None and fraction is None:
            return None
        if not cache.is_finished():
            logger.info("%s: waiting for the cache to finish: holding out validation documents needs all of them", cache.location)
            cache.wait_until_finished()
        bounds = cache.row_bounds(0, cache.num_rows())
        by_sequences = sequences * seq_len if sequences else 0
        by_fraction = int(np.ceil(fraction * bounds[-1])) if fraction else 0
        asked = (f"num_validation_sequences {sequences} x seq_len {seq_len}" if by_sequences >= by_fraction
                 else f"validation_fraction {fraction}")
        # keyed by the source name alone: every run and seed validates on the same documents
        return held_out_documents(np.diff(bounds), max(by_sequences, by_fraction), derive_key("holdout", name),
                                  f"source {name!r}: {asked}", self.shuffle_before_trainval_split)

    def train_set(self, seq_len: int, key: int | None = None,
                  weight_log: list[tuple[int, dict[str, float]]] | None = None) -> MixtureDataset | NanosetOrderDataset:
        """The training mixture of ``seq_len``-token examples (``seq_len + 1`` under ``example_convention`` megatron or datatrove);
        ``key`` overrides the config's ``seed``; ``weight_log`` (a run's ``[(start_index, weights), ...]``, as a checkpoint
        records it) is drawn by instead of ``train_weights``. Under ``example_order: nanotron``, Nanotron's order instead
        (a ``NanosetOrderDataset``; ``key`` then overrides every stage's seed; no weight log)."""
        from tokenmix.datasets.mixture import MixtureDataset

        if self.example_order == "nanotron":
            if weight_log is not None:
                raise ValueError("example_order: nanotron draws by train_weights' stages only; a weight log (a hand reweight at "
                                 "a resume, online weights) needs example_order: tokenmix")
            return self._nanotron_train_set(seq_len, key)
        schedule = self.weight_schedule() if weight_log is None else weight_log
        seed = self._seed(key)
        datasets = self._train_sources(seq_len, seed, self.weight_schedule() + list(weight_log or []), deferred=True)
        weights = [(start, {n: w.get(n, 0.0) for n in datasets}) for start, w in schedule]
        return MixtureDataset(
            datasets,
            weights if len(weights) > 1 else weights[0][1],
            block_size=self.mixture_block_size,
            seed=seed,
            shuffle=self.shuffle,
            stop_strategy=self.stop_strategy,  # type: ignore[arg-type]
        )

    def _nanotron_train_set(self, seq_len: int, key: int | None) -> NanosetOrderDataset:
        """Nanotron's stages of BlendedNanosets over each source's train part (``datasets/nanoset_order.py``)."""
        from tokenmix.datasets.nanoset_order import NanosetOrderDataset, NanotronStage

        raw = [(0, dict(self.train_weights or {n: 1.0 for n in self.configs}))] if not isinstance(self.train_weights, list) \
            else [(int(step), dict(w)) for step, w in self.train_weights]
        starts = [start for start, _ in self.weight_schedule()]
        seeds = self.stage_seeds or [self.seed] * len(raw)
        stages = [NanotronStage(start, tuple(w), tuple(float(v) for v in w.values()), seed if key is None else self._seed(key))
                  for start, (_, w), seed in zip(starts, raw, seeds)]
        used = [n for n in self.configs if any(n in s.sources for s in stages)]
        datasets = {n: self._train_dataset(n, seq_len, i) for i, n in enumerate(used)}
        length = None if self.train_steps is None else self.batch_schedule().offset(self.train_steps)  # type: ignore[union-attr]
        return NanosetOrderDataset(datasets, stages, length)

    def train_sources(self, seq_len: int, key: int | None = None,
                      weight_log: list[tuple[int, dict[str, float]]] | None = None) -> dict[str, Dataset]:
        """Per source with a training weight (in ``train_weights`` or in ``weight_log``), its training examples before
        mixing: what ``train_set`` draws from (held-out documents, a ``split``'s other parts and budgets already taken
        away), in config order."""
        return self._train_sources(seq_len, self._seed(key), self.weight_schedule() + list(weight_log or []), deferred=False)

    def _train_sources(self, seq_len: int, seed: int, schedule: list[tuple[int, dict[str, float]]], deferred: bool) -> dict[str, Dataset]:
        """``train_sources``; ``deferred``: each source is opened when a batch first draws from it (``DeferredDataset``),
        except those cut to a budget, whose length is needed now (opened together, concurrently)."""
        from tokenmix.datasets.deferred import DeferredDataset, open_together

        sources = {n: DeferredDataset(partial(self._train_source, n, seq_len, i, seed), self._example_width(n, seq_len), n)
                   for i, n in enumerate(self.configs) if any(w.get(n, 0) > 0 for _, w in schedule)}
        open_together(ds for n, ds in sources.items() if not deferred or self._has_budget(n))
        return sources if deferred else {n: ds.dataset for n, ds in sources.items()}

    def _train_source(self, name: str, seq_len: int, source_id: int, seed: int) -> Dataset:
        """Source ``name``'s training examples, opened."""
        return self._budgeted(name, self._train_dataset(name, seq_len, source_id), seed)

    def _has_budget(self, name: str) -> bool:
        """Whether a source's training examples are cut to a budget (``_budgeted``)."""
        return (self.target_budget is not None and self.experiment_budget is not None) or name in (self.max_train_batches or {})

    def _seed(self, key: int | None) -> int:
        """The config's ``seed``, or the last word of a given key (a JAX PRNG key as well as an int)."""
        if key is None:
            return self.seed
        import numpy as np

        return int(np.asarray(key).ravel()[-1])

    def _budgeted(self, name: str, dataset: Dataset, seed: int) -> Dataset:
        """A source's training examples cut to its simulated budget or ``max_train_batches`` (a random subset)."""
        if not self._has_budget(name):
            return dataset
        from tokenmix.datasets.permutation import derive_key
        from tokenmix.datasets.subset import ExampleSubset

        if self.target_budget is not None and self.experiment_budget is not None:
            count = int(_length(dataset) * self.experiment_budget / self.target_budget)
        else:
            count = self.max_train_batches[name] * self.batch_schedule().batch_size(0)  # type: ignore[index, union-attr]
        why = "max_train_batches" if self.target_budget is None else "target_budget and experiment_budget (simulated epoching)"
        if not 0 < count <= _length(dataset):
            raise ValueError(f"{why}: source {name!r} would keep {count} of its {_length(dataset)} training examples; "
                             f"it must keep between 1 and {_length(dataset)}")
        logger.info("%s: keeping %d of its %d training examples (%s)", name, count, _length(dataset), why)
        subset_seed = seed if self.simulated_epoch_subset_seed is None or self.target_budget is None else self.simulated_epoch_subset_seed
        return ExampleSubset(dataset, count, derive_key("subset", name, subset_seed))

    def tagged_validation_sets(self, seq_len: int) -> list[tuple[str, Dataset, list[str]]]:
        """Per source, its validation examples and the names its loss is reported under: its ``tags`` and its own name
        (Levanter's ``tagged_eval_sets``)."""
        return [(name, ds, [*(self.configs[name].tags or []), name]) for name, ds in self.validation_sets(seq_len).items()]

    def _split_weights(self, name: str) -> tuple[float, ...] | None:
        token_files = self.configs[name].token_files
        return None if token_files is None else token_files.split_weights()

    def _split_part(self, name: str, part: str, seq_len: int, source_id: int) -> Dataset:
        """One contiguous part (train, validation or test) of a source cut by its ``token_files.split``."""
        import numpy as np

        from tokenmix.datasets.subset import ExampleRange

        weights = self._split_weights(name)
        assert weights is not None
        cache = open_cache(self, name, "train")
        index = SPLIT_NAMES.index(part)
        if self.configs[name].token_files.split_by == "documents":  # type: ignore[union-attr]
            bounds = split_bounds(cache.num_rows(), weights)
            return self._examples(name, cache, seq_len, source_id, np.arange(bounds[index], bounds[index + 1], dtype=np.int64))
        examples = self._examples(name, cache, seq_len, source_id)
        if self.example_order != "nanotron":
            bounds = split_bounds(_length(examples), weights)
            return ExampleRange(examples, bounds[index], bounds[index + 1])
        # Nanotron counts int(tokens / seq_len) samples: one more than can be read when the tokens are a whole number of
        # samples (the last has no label token), and its split bounds follow that count
        tokens = cache.num_tokens()
        bounds = split_bounds(tokens // seq_len, weights)
        readable = _length(examples)
        if part == "train" and bounds[1] > readable:
            raise ValueError(f"source {name!r}: its {tokens} tokens are a whole number of {seq_len}-token samples, and Nanotron's "
                             f"train part (split {self.configs[name].token_files.split}) takes the last one, which has no label "  # type: ignore[union-attr]
                             "token: Nanotron fails when it reads it. Give validation or test a share of the split, or drop the "
                             "file's last token")
        return ExampleRange(examples, min(bounds[index], readable), min(bounds[index + 1], readable))

    def test_sets(self, seq_len: int) -> dict[str, Dataset]:
        """Per source cut by a ``split`` with a test share, its test examples (Nanotron's and Megatron's third part)."""
        return {name: self._split_part(name, "test", seq_len, i) for i, name in enumerate(self.configs)
                if (self._split_weights(name) or (0, 0, 0))[2] > 0}

    def validation_sets(self, seq_len: int) -> dict[str, Dataset]:
        """Per source, its validation examples: its validation split, the part its ``split`` gives validation, or the
        documents held out of training. The sources are opened together, a few at a time (``open_together``): a run
        over a thousand sources on an object store does not wait for a thousand openings one after another."""
        from tokenmix.datasets.deferred import DeferredDataset, open_together

        kinds = {name: self._validation_kind(name) for name in self.configs}
        sets = {name: DeferredDataset(partial(self._validation_set, name, kind, seq_len, i), self._example_width(name, seq_len), name)
                for i, (name, kind) in enumerate(kinds.items()) if kind is not None}
        open_together(sets.values())
        return {name: deferred.dataset for name, deferred in sets.items()}

    def _validation_kind(self, name: str) -> Literal["split", "validation", "held_out"] | None:
        """Where source ``name``'s validation examples come from: the validation part of its ``split``, its validation
        split, the documents held out of its training cache; None where it has none."""
        weights = self._split_weights(name)
        if weights is not None:
            return "split" if weights[1] > 0 else None
        if "validation" in self.configs[name].split_names():
            return "validation"
        held_out = (self.num_validation_sequences or {}).get(name) is not None or (self.validation_fraction or {}).get(name) is not None
        return "held_out" if held_out else None

    def _validation_set(self, name: str, kind: str, seq_len: int, source_id: int) -> Dataset:
        """Source ``name``'s validation examples of ``kind`` (``_validation_kind``), opened."""
        if kind == "split":
            return self._split_part(name, "validation", seq_len, source_id)
        if kind == "validation":
            return self._examples(name, open_cache(self, name, "validation"), seq_len, source_id)
        cache = open_cache(self, name, "train")
        return self._examples(name, cache, seq_len, source_id, self._held_out(name, cache, seq_len))


@dataclass(frozen=True)
class LMDatasetConfig(LMDatasetSourceConfig, DataConfigBase):
    """A single source with its tokenizer and cache directory (Levanter's single-dataset form)."""

    cache_dir: str | None = "cache/"
    """Where the dataset's caches go (``<cache_dir>/train``, ``<cache_dir>/validation``); null is refused, as Levanter
    refuses it."""
    cache_options: CacheOptions | None = None
    """Levanter's cache-builder options: accepted, and logged as having no effect here."""
    shuffle: bool | int = False
    """Levanter's single-dataset order: false (its default) in cache order, true a full shuffle, an int shuffles within
    eras of that many examples."""
    permutation_type: Literal["feistel", "linear"] | None = None
    """As the mixture's: accepted; tokenmix shuffles with its own keyed Feistel permutation."""
    ignore_token_id: int | None = None
    """As the mixture's: no position is trained to predict this token id."""
    num_train_shards: int | None = None
    """Removed in Levanter 1.0: refused, with what replaces it."""
    num_val_shards: int | None = None
    """Removed in Levanter 1.0: refused, with what replaces it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.cache_dir:
            raise ValueError(f"cache_dir is {'null' if self.cache_dir is None else 'empty'}: a single dataset keeps its caches in "
                             "<cache_dir>/train and <cache_dir>/validation; give a directory or URL")
        note_cache_options(self.cache_options)
        refuse_removed_shard_counts(self.num_train_shards, self.num_val_shards)
        self.as_mixture()  # refuses a bad shuffle or permutation_type, naming the field

    def sources(self) -> dict[str, LMDatasetSourceConfig]:
        return {"default": self}

    def as_mixture(self) -> LMMixtureDatasetConfig:
        """The one-source mixture (named ``default``, its caches where this config keeps them) that trains as Levanter
        trains a single dataset: its examples in cache order or shuffled (``shuffle``), with ``ignore_token_id``."""
        source = {f.name: getattr(self, f.name) for f in fields(LMDatasetSourceConfig)}
        source.update(cache_dir=self.cache_dir, text_key=None, plaintext=None, rows_per_chunk=None)
        tokenization = {f.name: getattr(self, f.name) for f in fields(DataConfigBase)}
        return LMMixtureDatasetConfig(**tokenization, configs={"default": LMDatasetSourceConfig(**source)}, shuffle=self.shuffle,
                                      permutation_type=self.permutation_type, ignore_token_id=self.ignore_token_id)

    def train_set(self, seq_len: int, key: int | None = None) -> MixtureDataset:
        """The training examples, as ``as_mixture`` defines them."""
        return self.as_mixture().train_set(seq_len, key)

    def validation_sets(self, seq_len: int) -> dict[str, Dataset]:
        """The validation examples (of ``validation_urls``, or the dataset's validation split), under ``default``."""
        return self.as_mixture().validation_sets(seq_len)

    def cache_location(self, name: str, split: str) -> str:
        return join_location(self.cache_dir, split)  # type: ignore[arg-type]  # never null (__post_init__)


DataConfig = LMMixtureDatasetConfig | LMDatasetConfig
register_plain_mapping(LMDatasetSourceConfig)  # a mixture's thousand plain sources decode in milliseconds


def _length(dataset: Dataset) -> int:
    """A dataset's final length, waiting for its cache to finish (a subset of it needs the whole)."""
    n = dataset.final_len()
    return n if n is not None else dataset.wait_until_final(why="keeping a subset of its examples needs its length")
