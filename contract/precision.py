"""The int8 variant a model version may carry in its own folder, and when it may stand in for fp32.

``python -m export.quantize --entry <repository>/<name>/<version>`` writes ``<version>/int8/``: a complete
entry (same name and version, a ``variant`` section, its own files and sha256s) whose evaluation holds
its quality and fp32's, measured in one run on the same test split, and how many test inputs each
answers the same alone as in a batch. It may be served in fp32's place when it loses at most
``MAX_BLEU_LOSS`` BLEU (beam search) or ``MAX_ACCURACY_LOSS`` accuracy (the bound ``export.quantize``
refuses a variant beyond) and its answers depend no more than fp32's on the batch they are computed in:
a request's answer must not change with the load. onnxruntime's dynamic quantisation scales each
activation tensor as a whole, so a sentence's tokens depend on the other rows of its batch.
"""

from __future__ import annotations

from pathlib import Path

INT8 = "int8"
FP32 = "fp32"
MAX_BLEU_LOSS = 0.5  # BLEU points, beam search, whole test split
MAX_ACCURACY_LOSS = 0.003  # accuracy (0.3 points), whole test split
SEARCH = "beam4"  # the evaluation the translator's bound reads (export.translator.BEAM)
BATCH_INVARIANCE = "batch_invariance"  # {"sentences" or "images": n, "batch": b, "fp32": same, "int8": same}


def variant_folder(entry_dir: Path, precision: str = INT8) -> Path:
    return Path(entry_dir) / precision


def quality(evaluation: dict) -> tuple[float, float, float, str] | None:
    """(the variant's score, fp32's, the most the variant may lose, the measure) from a variant's evaluation;
    None when it records no fp32 figure to compare with."""
    fp32 = evaluation.get(FP32) or {}
    if SEARCH in fp32 and SEARCH in evaluation:
        return evaluation[SEARCH]["bleu"], fp32[SEARCH]["bleu"], MAX_BLEU_LOSS, f"{SEARCH} BLEU"
    if "fp32_test_accuracy" in evaluation and "test_accuracy" in evaluation:
        return evaluation["test_accuracy"], evaluation["fp32_test_accuracy"], MAX_ACCURACY_LOSS, "test accuracy"
    return None


def batch_dependence(evaluation: dict) -> tuple[int, int, int] | None:
    """(inputs the variant answers the same alone as in a batch, fp32's, inputs tried); None when not measured."""
    record = evaluation.get(BATCH_INVARIANCE)
    if not record or INT8 not in record or FP32 not in record:
        return None
    return record[INT8], record[FP32], record.get("sentences", record.get("images", 0))
