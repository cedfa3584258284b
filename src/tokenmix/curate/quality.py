"""A model-based quality step (Zyda-2's): a local Hugging Face sequence-classification model labels each record's text.

``quality`` runs the model over the text in batches and writes the predicted label (from the model config's
``id2label``) and its probability into fields; it removes nothing, so that a ``field_filter`` after it decides
(Zyda-2 keeps ``High``)::

    stages:
      - {type: quality, model_path: /models/quality-classifier}
      - {type: field_filter, field: quality_label, op: "==", value: High}

The model is read from a local directory only (``local_files_only``: a pipeline never downloads), once per process:
the stage itself is a few strings and numbers, cheap to ship to Ray or Dask workers, and a worker that curates many
shards keeps the loaded model in a module-level cache. PyTorch is imported only when the stage runs (the ``quality``
extra: ``pip install 'tokenmix[quality]'``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from tokenmix.curate.records import field_column, set_field
from tokenmix.curate.stages import ShardContext, Stage

logger = logging.getLogger(__name__)

_INSTALL = "pip install 'tokenmix[quality]'"


@Stage.register_subclass("quality")
@dataclass(frozen=True)
class QualityClassifier(Stage):
    """Labels each record's text with a local Hugging Face sequence-classification model and writes the predicted label
    and its probability (and, when asked, every label's probability); removes nothing: filter with ``field_filter``.

    A null text, or one the tokenizer turns into no tokens, gets a null label and null scores (nothing to classify; a
    ``field_filter`` on the label removes it). Texts are cut to ``max_length`` tokens. Within a batch of records, texts
    are classified longest first in groups of ``batch_size`` (less padding) and written back in their own order; the
    model runs in eval mode, so the same batch gives the same labels and scores, and other batchings agree to float
    rounding (about 1e-6: padding changes the arithmetic, not the result)."""

    model_path: str
    """A local directory holding the model (``AutoModelForSequenceClassification``) and its tokenizer, as written by
    ``save_pretrained`` or ``huggingface-cli download NAME --local-dir DIR``; never a hub name."""
    text_field: str | None = None
    """Unset: the source's ``text_field``."""
    label_field: str = "quality_label"
    """Where the predicted label (a string from the model config's ``id2label``) is written."""
    score_field: str = "quality_score"
    """Where the predicted label's probability is written."""
    scores_field: str | None = None
    """Where every label's probability is written, as a struct ``{label: probability}``; unset: not written."""
    batch_size: int = 32
    """Texts per forward pass."""
    max_length: int = 512
    """Tokens per text at most (longer texts are truncated); at most what the model's positions allow."""
    device: str = "cpu"
    """``cpu``, ``cuda`` (or ``cuda:N``), or ``auto``: CUDA where this worker has it, else the CPU."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The model's weights and arithmetic; ``bfloat16`` or ``float16`` are faster on a GPU, less exact."""

    def __post_init__(self) -> None:
        if not os.path.isfile(os.path.join(self.model_path, "config.json")):
            what = "has no config.json" if os.path.isdir(self.model_path) else "does not exist"
            raise ValueError(
                f"quality.model_path: {self.model_path!r} {what}; give a local directory written by save_pretrained (download a "
                "hub model first: huggingface-cli download NAME --local-dir DIR); the pipeline never downloads"
            )
        if self.batch_size < 1:
            raise ValueError(f"quality.batch_size must be >= 1, got {self.batch_size}")
        if self.max_length < 1:
            raise ValueError(f"quality.max_length must be >= 1, got {self.max_length}")
        written = list(self.written_fields())
        if len(set(written)) != len(written):
            raise ValueError(f"quality: label_field, score_field and scores_field must differ, got {written}")
        if importlib.util.find_spec("torch") is None:
            raise ImportError(f"the quality stage needs PyTorch, which is not installed: {_INSTALL}")

    def written_fields(self) -> tuple[str, ...]:
        return tuple(f for f in (self.label_field, self.score_field, self.scores_field) if f is not None)

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        classifier = _classifier(self.model_path, self.device, self.dtype)
        texts = field_column(table, self.text_field or context.text_field).to_pylist()
        probabilities = classifier.probabilities(texts, self.batch_size, self.max_length)
        missing = np.isnan(probabilities[:, 0])
        predicted = probabilities.argmax(axis=1)
        labels = pa.array([None if m else classifier.labels[p] for m, p in zip(missing.tolist(), predicted.tolist())], pa.string())
        scores = pa.array(probabilities.max(axis=1).astype(np.float64), pa.float64(), mask=missing)
        table = set_field(set_field(table, self.label_field, labels), self.score_field, scores)
        if self.scores_field is not None:
            columns = [pa.array(probabilities[:, j].astype(np.float64), pa.float64()) for j in range(len(classifier.labels))]
            table = set_field(table, self.scores_field, pa.StructArray.from_arrays(columns, names=classifier.labels, mask=pa.array(missing)))
        return table, Counter()

    @property
    def label(self) -> str:
        return f"quality({os.path.basename(os.path.normpath(self.model_path))})"


class _Classifier:
    """A loaded model and tokenizer on one device: what a process keeps between shards."""

    def __init__(self, model_path: str, device: str, dtype: str) -> None:
        torch = _import_torch()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(
                f"quality.device: {device!r} was asked for but this worker has no CUDA device; use device: auto (CUDA where there "
                "is one, else the CPU) or device: cpu"
            )
        self.torch = torch
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(model_path, local_files_only=True)
        if self.tokenizer.pad_token is None:
            # decoder-style classifiers (GPT-2's) ship no padding token; their end-of-text token pads, as their model cards do
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(device=self.device, dtype=getattr(torch, dtype)).eval()
        self.labels = [str(model.config.id2label[i]) for i in range(model.config.num_labels)]
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"quality.model_path: {model_path!r} has repeated labels in its config's id2label: {self.labels}")
        logger.info("quality: loaded %s on %s (%s), labels %s", model_path, self.device, dtype, self.labels)

    def probabilities(self, texts: list[str | None], batch_size: int, max_length: int) -> np.ndarray:
        """Every label's probability per text (``[len(texts), labels]`` float32); NaN rows for null texts and texts with no
        tokens. Longest texts first (less padding per batch), written back in the texts' own order."""
        out = np.full((len(texts), len(self.labels)), np.nan, dtype=np.float32)
        order = sorted((i for i, text in enumerate(texts) if text is not None), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), batch_size):
            rows = np.array(order[start : start + batch_size])
            encoded = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            present = encoded["attention_mask"].sum(dim=1).numpy() > 0
            if not present.any():
                continue
            with self.torch.inference_mode():
                logits = self.model(**{k: v.to(self.device) for k, v in encoded.items()}).logits
            out[rows[present]] = self.torch.softmax(logits.float(), dim=-1).cpu().numpy()[present]
        return out


_LOADED: dict[tuple[str, str, str], _Classifier] = {}
_LOADING = threading.Lock()


def _classifier(model_path: str, device: str, dtype: str) -> _Classifier:
    """The process's classifier for this model, device and dtype, loaded on first use (Dask runs tasks in threads: one
    loads, the others wait)."""
    key = (os.path.realpath(model_path), device, dtype)
    with _LOADING:
        if key not in _LOADED:
            _LOADED[key] = _Classifier(model_path, device, dtype)
        return _LOADED[key]


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"the quality stage needs PyTorch, which is not installed: {_INSTALL}") from e
    return torch
