"""ATTNSERVE_PRECISION: which folder of a version the service loads, and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.manifest import ManifestError
from contract.precision import MAX_ACCURACY_LOSS, MAX_BLEU_LOSS
from service.precision import choose
from tests.conftest import SHIPPED_TRANSLATOR


def version(tmp_path: Path, evaluation: dict | None) -> Path:
    """A version folder; with ``evaluation``, an int8/ variant whose manifest (the shipped translator's, as
    export.quantize makes it) records it."""
    entry = tmp_path / "t" / "1"
    entry.mkdir(parents=True)
    if evaluation is not None:
        (entry / "int8").mkdir()
        manifest = json.loads((SHIPPED_TRANSLATOR / "manifest.json").read_text())
        variant = {"precision": "int8", "method": "dynamic", "from": f"translator/{SHIPPED_TRANSLATOR.name}"}
        (entry / "int8" / "manifest.json").write_text(
            json.dumps({**manifest, "variant": variant, "evaluation": evaluation})
        )
    return entry


def translator_evaluation(int8: float, fp32: float, same: tuple[int, int] = (500, 500)) -> dict:
    """BLEU of int8 and fp32, and how many of 500 sentences each decodes the same alone as in a batch."""
    return {
        "beam4": {"bleu": int8},
        "greedy": {"bleu": 1.0},
        "fp32": {"beam4": {"bleu": fp32}, "greedy": {"bleu": 9}},
        "batch_invariance": {"sentences": 500, "batch": 32, "int8": same[0], "fp32": same[1]},
    }


def test_auto_serves_an_int8_variant_within_the_bound_on_the_cpu(tmp_path):
    entry = version(tmp_path, translator_evaluation(29.0 - MAX_BLEU_LOSS, 29.0))
    folder, precision, why = choose(entry, "auto", on_cpu=True)
    assert (folder, precision) == (entry / "int8", "int8")
    assert (
        why
        == "int8 scores 28.5 beam4 BLEU against fp32's 29 (at most 0.5 below); as batch-invariant as fp32 (500 of 500)"
    )


def test_auto_keeps_fp32_when_int8_loses_more_than_the_bound(tmp_path):
    entry = version(tmp_path, translator_evaluation(28.49, 29.0))
    assert choose(entry, "auto", on_cpu=True) == (
        entry,
        "fp32",
        "int8 scores 28.49 beam4 BLEU against fp32's 29, more than 0.5 below",
    )


def test_auto_keeps_fp32_when_int8_answers_depend_on_the_batch(tmp_path):
    entry = version(tmp_path, translator_evaluation(29.0, 29.0, same=(410, 500)))
    assert choose(entry, "auto", on_cpu=True) == (
        entry,
        "fp32",
        (
            "int8 answers 410 of 500 test inputs the same alone as in a batch, fp32 500: its answers would change "
            "with the load"
        ),
    )
    unchecked = translator_evaluation(29.0, 29.0)
    del unchecked["batch_invariance"]
    _, precision, why = choose(version(tmp_path / "b", unchecked), "auto", on_cpu=True)
    assert (
        precision == "fp32" and why == "the int8 variant records no check that its answers do not depend on the batch"
    )


def test_a_classifier_variant_is_judged_on_its_accuracy(tmp_path):
    invariant = {"batch_invariance": {"images": 500, "batch": 32, "int8": 500, "fp32": 500}}
    close = {"test_accuracy": 0.912, "fp32_test_accuracy": 0.912 + MAX_ACCURACY_LOSS, **invariant}
    assert choose(version(tmp_path / "a", close), "auto", on_cpu=True)[1] == "int8"
    far = {"test_accuracy": 0.90, "fp32_test_accuracy": 0.91, **invariant}
    _, precision, why = choose(version(tmp_path / "b", far), "auto", on_cpu=True)
    assert precision == "fp32" and why.endswith("test accuracy against fp32's 0.91, more than 0.003 below")


@pytest.mark.parametrize(
    ("evaluation", "on_cpu", "why"),
    [
        (None, True, "no int8 variant"),
        (translator_evaluation(29.0, 29.0), False, "int8 is served on the CPU only"),
        ({"beam4": {"bleu": 29.0}}, True, "the int8 variant records no quality against fp32"),
    ],
)
def test_auto_keeps_fp32_otherwise_and_says_why(tmp_path, evaluation, on_cpu, why):
    entry = version(tmp_path, evaluation)
    assert choose(entry, "auto", on_cpu) == (entry, "fp32", why)


def test_fp32_and_int8_force_a_precision(tmp_path):
    entry = version(tmp_path, translator_evaluation(10.0, 29.0))  # far below the bound: forced all the same
    assert choose(entry, "int8", on_cpu=False) == (entry / "int8", "int8", "precision int8 is set")
    assert choose(entry, "fp32", on_cpu=True) == (entry, "fp32", "precision fp32 is set")


def test_int8_forced_on_a_version_without_a_variant_is_one_clear_error(tmp_path):
    entry = version(tmp_path, None)
    with pytest.raises(ManifestError, match=r"precision int8 is set but .*t/1 has no int8 variant \(python -m export"):
        choose(entry, "int8", on_cpu=True)
