"""A training launch's config: ``data`` (any data config ``build-cache`` takes, Levanter-shaped ones included),
``trainer`` and ``model``, from one YAML file with draccus-style ``--section.field value`` overrides."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import draccus

from tokenmix.config.loading import ConfigError, data_section_config, explain_error, parse_overrides, read_yaml, set_path
from tokenmix.config.mixture import LMMixtureDatasetConfig
from tokenmix.loader.batch_schedule import BatchSchedule
from tokenmix.train.model import ModelConfig


@dataclass(frozen=True)
class TrainerConfig:
    """How the model is trained (``trainer:``); Levanter's names where it has them."""

    num_train_steps: int = 60
    train_batch_size: int | list[tuple[int, int]] = 16
    """An int, or a ramp ``[[start_step, size], ...]``: the loader's batch sizes, and what turns weight stages in
    steps into examples."""
    seq_len: int = 128
    mesh: dict[str, int] = field(default_factory=lambda: {"data": -1, "model": 1})
    """Mesh axes and sizes, ``data`` (the batch) and ``model`` (heads and MLP units); -1 takes the devices left."""
    cpu_devices: int | None = None
    """On a machine without accelerators: this many fake CPU devices (set before JAX starts), for meshes on a laptop."""
    learning_rate: float = 3e-3
    weight_decay: float = 0.1
    warmup_steps: int = 10
    seed: int = 0
    """Initial parameters (the data order is the data config's ``seed``)."""
    steps_per_eval: int = 20
    """Evaluate on every source's validation set every this many steps (and after the last)."""
    max_eval_batches: int | None = None
    """Evaluate the first this many batches of each validation set; None (Levanter's default too): every example of it,
    the last batch padded with examples that weigh nothing."""
    eval_batch_size: int | None = None
    """None: the first training batch size."""
    checkpoint_dir: str = "runs/train_lm"
    """Where checkpoints (``checkpoints/step-<N>/``), ``metrics.jsonl`` and ``train.png`` go; a run finding a checkpoint
    there resumes from the newest."""
    steps_per_checkpoint: int = 20
    keep_checkpoints: int = 2
    """The newest this many checkpoints are kept (more than one: if the newest is found damaged, an older one is there)."""
    allow_data_change: bool = False
    """Resume from a checkpoint trained on other data (another seed, weights, sources, seq_len, batch size, caches):
    the change is logged and recorded. Unset, such a resume is refused, naming each changed field."""
    allow_optimizer_change: bool = False
    """Resume from a checkpoint trained with other optimizer settings (``num_train_steps``, ``learning_rate``,
    ``warmup_steps``, ``weight_decay``): the new ones apply from the resumed step, and the change is logged and recorded.
    Unset, such a resume is refused, naming each changed field and what it does to the learning rate."""
    prefetch: int = 2
    loader_workers: int = 0
    """Processes that read the training batches (``DataLoader(workers=...)``); 0 reads them in a thread of this one."""
    loader_read_timeout_s: float = 300.0
    """How long a reader process may not run at all (stopped, frozen) before its step fails (``DataLoader(read_timeout_s=...)``)."""
    fingerprint: bool = True
    """Log each batch's fingerprint (what a resumed run must reproduce)."""
    coordinator_address: str | None = None
    """``host:port`` of the coordinator of a run of several processes (``jax.distributed.initialize``'s argument; the
    host of process 0). None: the run is one process."""
    num_processes: int = 1
    """How many processes train the run (each on its own devices), joined through ``coordinator_address``."""
    process_id: int = 0
    """This process's number, 0 to ``num_processes - 1`` (a different one for each, e.g. ``--trainer.process_id 1``)."""

    def __post_init__(self) -> None:
        for name in ("num_train_steps", "seq_len", "steps_per_eval", "steps_per_checkpoint", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be at least 1, got {getattr(self, name)}")
        unknown = set(self.mesh) - {"data", "model"}
        if unknown:
            raise ValueError(f"trainer.mesh: axes {sorted(unknown)} are not used; name `data` and `model`")
        for axis, size in self.mesh.items():
            if size < 1 and not (axis == "data" and size == -1):
                raise ValueError(f"trainer.mesh: axis {axis} has size {size}; an axis takes at least 1 device"
                                 + (" (data: -1 takes the devices left)" if axis == "data" else ""))
        if self.num_processes < 1 or not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"trainer.process_id must be 0 to trainer.num_processes - 1 (num_processes >= 1), got process_id "
                             f"{self.process_id} of {self.num_processes}")
        if self.num_processes > 1 and self.coordinator_address is None:
            raise ValueError(f"trainer.num_processes {self.num_processes} needs trainer.coordinator_address (host:port of "
                             "process 0's coordinator, e.g. 127.0.0.1:12355 on one machine)")
        if self.warmup_steps < 0:
            raise ValueError(f"trainer.warmup_steps must be 0 or more (steps of rising learning rate), got {self.warmup_steps}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"trainer.learning_rate must be a finite number > 0 (the peak of the schedule), got {self.learning_rate}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"trainer.weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if self.max_eval_batches is not None and self.max_eval_batches < 1:
            raise ValueError(f"trainer.max_eval_batches must be at least 1, or null to evaluate every example of each "
                             f"validation set, got {self.max_eval_batches}")
        for name in ("eval_batch_size", "cpu_devices"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be at least 1, or null (unset), got {getattr(self, name)}")
        if not self.loader_read_timeout_s > 0:
            raise ValueError(f"trainer.loader_read_timeout_s must be a number of seconds > 0, got {self.loader_read_timeout_s}")

    def first_batch_size(self) -> int:
        size = self.train_batch_size
        return size if isinstance(size, int) else int(size[0][1])


@dataclass(frozen=True)
class TrainLmConfig:
    """``data`` + ``trainer`` + ``model``; refused when an example has more tokens than the model has positions (they
    would share the last position's embedding, silently), or when the data's batch size is not the trainer's (its weight
    stages would switch at other steps than they name)."""

    data: LMMixtureDatasetConfig
    trainer: TrainerConfig
    model: ModelConfig

    def __post_init__(self) -> None:
        batch_size = self.data.batch_size
        if batch_size is not None and BatchSchedule.of(batch_size) != BatchSchedule.of(self.trainer.train_batch_size):
            raise ValueError(f"data.batch_size {batch_size!r} is not trainer.train_batch_size {self.trainer.train_batch_size!r}: "
                             "the run's batches are trainer.train_batch_size, and data.batch_size turns the data section's steps "
                             "(weight stages, max_train_batches, train_steps) into examples, so they would fall at other steps "
                             "than they say. Remove data.batch_size (the trainer's is taken), or make the two the same")
        extra = int(self.data.example_convention != "levanter")  # megatron and datatrove examples hold seq_len + 1 tokens
        width = self.trainer.seq_len + extra
        if width > self.model.max_position:
            what = (f"trainer.seq_len {self.trainer.seq_len} makes examples of {width} tokens (data.example_convention "
                    f"{self.data.example_convention}), more" if extra else f"trainer.seq_len {width} is more")
            raise ValueError(f"{what} than model.max_position {self.model.max_position}: positions past "
                             f"{self.model.max_position - 1} would have no embedding of their own. Raise model.max_position to at "
                             f"least {width}, or lower trainer.seq_len to at most {self.model.max_position - extra}")


def load_train_config(path: str, overrides: Sequence[str] = ()) -> TrainLmConfig:
    """The training config at ``path`` (``!include`` resolved, as for data configs), with ``--data.x``,
    ``--trainer.x`` and ``--model.x`` overrides. The data section takes the trainer's batch size for its weight
    stages when it sets none (as Levanter does)."""
    doc: dict[str, Any] = read_yaml(path)
    unknown = sorted(set(doc) - {"data", "trainer", "model"})
    if unknown:
        raise ConfigError(f"{path}: sections {unknown} are not read by the training launch; it takes data, trainer and model")
    for key, value in parse_overrides(overrides):
        set_path(doc, key, value)
    trainer_doc, model_doc = doc.get("trainer") or {}, doc.get("model") or {}
    try:
        trainer = draccus.decode(TrainerConfig, trainer_doc)
        model = draccus.decode(ModelConfig, model_doc)
    except (draccus.utils.ParsingError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {explain_error(e, (TrainerConfig, ModelConfig))}") from None
    data_doc = dict(doc.get("data") or {})
    data_doc.setdefault("batch_size", trainer.train_batch_size)
    data = data_section_config(data_doc, f"{path}'s data section")
    if not isinstance(data, LMMixtureDatasetConfig):
        raise ConfigError(f"{path}: the data section must be a mixture (configs: or components:), so that each source is evaluated")
    try:
        return TrainLmConfig(data, trainer, model)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
