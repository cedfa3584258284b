"""The ``quality`` curation stage (Zyda-2's model-based quality step) with a tiny BERT classifier built here: labels and
scores equal running the model directly, whatever the batch size; nulls; refusals; config decoding; and a pipeline
that keeps ``quality_label == High`` with every record accounted.

The stage needs PyTorch (the ``quality`` extra), which the dev extra leaves out (its wheel is large): without it the
tests that run a model skip, and those of the stage's refusals still run."""

from __future__ import annotations

import json
import pickle
import sys

import draccus
import pyarrow as pa
import pytest
from helpers import DEMO_CORPUS, TOKENIZER, read_jsonl_zst

from tokenmix.curate import CurationConfig, CurationOutput, CurationSource, FieldFilter, Stage, load_curation_config, run_curation
from tokenmix.curate import quality as quality_module
from tokenmix.curate.quality import QualityClassifier
from tokenmix.curate.stages import ShardContext

LABELS = {0: "Low", 1: "Medium", 2: "High"}
CONTEXT = ShardContext("s", 0, 0, "text")
SHARD = DEMO_CORPUS / "webster" / "train-00-of-02.jsonl.zst"
TEXTS = ["A short one.", "the the the the", "Noah Webster's dictionary of the English language, " * 200, "x", "Two\nlines of text here", "é ü ñ 漢字"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny BERT classifier (labels Low, Medium, High) with the bundled tokenizer, saved as a local model directory."""
    torch = pytest.importorskip("torch", reason="the quality stage needs PyTorch: pip install 'tokenmix[quality]' (not in the dev extra)")
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=len(LABELS),
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    with torch.no_grad():  # larger logits than a fresh head gives, so that labels differ from text to text
        model.classifier.weight.mul_(40.0)
    path = tmp_path_factory.mktemp("models") / "tiny-quality"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _direct(model_dir: str, texts: list[str], max_length: int = 512) -> list[tuple[str, float, list[float]]]:
    """The model run directly, one text at a time (no padding): label, its probability, every label's probability."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    out = []
    for text in texts:
        with torch.no_grad():
            probabilities = torch.softmax(model(**tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")).logits[0], dim=-1)
        out.append((model.config.id2label[int(probabilities.argmax())], float(probabilities.max()), probabilities.tolist()))
    return out


def _classify(stage: QualityClassifier, texts: list[str | None]) -> pa.Table:
    table, removed = stage.apply(pa.table({"text": pa.array(texts, pa.string()), "id": list(range(len(texts)))}), CONTEXT)
    assert removed == {}, "the stage removes nothing; a field_filter after it does"
    return table


def test_labels_and_scores_are_the_models_for_every_record_in_order(model_dir):
    table = _classify(QualityClassifier(model_dir, scores_field="quality_scores"), TEXTS)
    assert table.column_names == ["text", "id", "quality_label", "quality_score", "quality_scores"]
    assert table.column("id").to_pylist() == list(range(len(TEXTS))), "records stay in their order, their fields untouched"
    expected = _direct(model_dir, TEXTS)
    assert table.column("quality_label").to_pylist() == [label for label, _, _ in expected]
    assert table.column("quality_score").to_pylist() == pytest.approx([score for _, score, _ in expected], abs=1e-5)
    for row, (_, _, probabilities) in zip(table.column("quality_scores").to_pylist(), expected):
        assert list(row) == list(LABELS.values())
        assert list(row.values()) == pytest.approx(probabilities, abs=1e-5)
    assert len(set(table.column("quality_label").to_pylist())) > 1, "the test model should tell these texts apart"


def test_batch_size_and_truncation(model_dir):
    texts = [r["text"][: 50 * (1 + i % 9)] for i, r in enumerate(read_jsonl_zst(SHARD)[:40])] + TEXTS
    tables = {b: _classify(QualityClassifier(model_dir, batch_size=b), texts) for b in (1, 7, 32)}
    for b in (7, 32):
        assert tables[b].column("quality_label").to_pylist() == tables[1].column("quality_label").to_pylist()
        assert tables[b].column("quality_score").to_pylist() == pytest.approx(tables[1].column("quality_score").to_pylist(), abs=1e-5)
    again = _classify(QualityClassifier(model_dir, batch_size=7), texts)
    assert again.equals(tables[7]), "the same batch gives the same labels and scores, bit for bit"

    short = _classify(QualityClassifier(model_dir, max_length=8), TEXTS)
    assert short.column("quality_score").to_pylist() == pytest.approx([s for _, s, _ in _direct(model_dir, TEXTS, max_length=8)], abs=1e-5)


def test_null_and_empty_texts_get_null_labels(model_dir):
    table = _classify(QualityClassifier(model_dir, scores_field="all"), [None, "Some text.", "", None])
    assert table.column("quality_label").to_pylist() == [None, _direct(model_dir, ["Some text."])[0][0], None, None]
    assert table.column("quality_score").null_count == 3 and table.column("all").null_count == 3
    assert _classify(QualityClassifier(model_dir), [None, ""]).column("quality_label").to_pylist() == [None, None]


def test_the_model_loads_once_per_process(model_dir, monkeypatch):
    monkeypatch.setattr(quality_module, "_LOADED", {})
    for batch_size in (2, 3):
        _classify(QualityClassifier(model_dir, batch_size=batch_size, label_field=f"label{batch_size}"), TEXTS)
    assert len(quality_module._LOADED) == 1


def test_cuda_asked_for_where_there_is_none_is_refused_and_auto_falls_back(model_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="quality.device: 'cuda' was asked for but this worker has no CUDA device; use device: auto"):
        _classify(QualityClassifier(model_dir, device="cuda"), TEXTS)
    auto = _classify(QualityClassifier(model_dir, device="auto"), TEXTS)
    assert auto.column("quality_label").to_pylist() == [label for label, _, _ in _direct(model_dir, TEXTS)]


def test_a_missing_model_path_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"quality.model_path: '.*nowhere' does not exist; .*huggingface-cli download"):
        QualityClassifier(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="quality.model_path: .* has no config.json"):
        QualityClassifier(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="must differ"):
        QualityClassifier(str(tmp_path), label_field="q", score_field="q")


def test_without_torch_the_error_says_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"pip install 'tokenmix\[quality\]'"):
        QualityClassifier(str(tmp_path))


def test_decoded_from_config_cheap_to_ship_and_labelled(model_dir, tmp_path):
    stage = draccus.decode(Stage, {"type": "quality", "model_path": model_dir, "batch_size": 4, "dtype": "bfloat16"})
    assert stage == QualityClassifier(model_dir, batch_size=4, dtype="bfloat16")
    assert stage.label == "quality(tiny-quality)"
    assert pickle.loads(pickle.dumps(stage)) == stage and len(pickle.dumps(stage)) < 1000
    config = load_curation_config(
        {
            "sources": [{"name": "s", "paths": [str(SHARD)]}],
            "output": {"path": str(tmp_path)},
            "stages": [{"type": "quality", "model_path": model_dir}, {"type": "field_filter", "field": "quality_label", "op": "==", "value": "High"}],
        }
    )
    assert config.stages == [QualityClassifier(model_dir), FieldFilter("quality_label", "==", "High")]


def test_a_pipeline_keeps_high_quality_records_and_accounts_for_every_record(model_dir, tmp_path):
    records = read_jsonl_zst(SHARD)
    expected = [label for label, _, _ in _direct(model_dir, [r["text"] for r in records])]
    config = CurationConfig(
        sources=[CurationSource("webster", [str(SHARD)])],
        num_workers=0,
        stages=[QualityClassifier(model_dir), FieldFilter("quality_label", "==", "High")],
        output=CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True),
    )
    stats = run_curation(config)
    kept = [json.loads(line) for line in (tmp_path / "out" / "webster" / "train-00-of-02.jsonl").read_text().splitlines()]
    high = [r["id"] for r, label in zip(records, expected) if label == "High"]
    assert 0 < len(high) < len(records), "the test model should keep some records and remove others"
    assert [r["id"] for r in kept] == high and {r["quality_label"] for r in kept} == {"High"}
    assert all(0 < r["quality_score"] <= 1 for r in kept)
    assert stats["accounted"] and stats["sources"]["webster"]["read"] == len(records)
    assert [(s["stage"], s["in"], s["out"]) for s in stats["stages"]] == [
        ("quality(tiny-quality)", len(records), len(records)),
        ("quality_label == High", len(records), len(high)),
    ]
    assert stats["stages"][1]["removed"] == {"quality_label == High": len(records) - len(high)}
