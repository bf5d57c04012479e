"""The classifier: preprocessing bit-identical to the export's, softmax top-k, and the manifest contract."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from contract.manifest import ManifestError, load_entry, parse_manifest, read_manifest
from service.classifier import (
    Classifier,
    Preprocessing,
    Ranked,
    ranked_softmax,
    shares_weights,
    warm_up_batch_sizes,
)
from service.runtime import SharedWeights, create_session
from service.settings import Settings
from tests.conftest import ROOT

SHIPPED = ROOT / "models"


@pytest.fixture(scope="module")
def entry():
    return load_entry(SHIPPED / "vit" / "1")  # the shipped ViT: no training, no torch


@pytest.fixture(scope="module")
def classifier(entry):
    handle = create_session(entry.path / "model.onnx", Settings(intra_op_threads=1))
    return Classifier(entry, handle)


def test_normalisation_is_bit_identical_to_the_export(entry, fashion_test):

    images, _ = fashion_test
    prep = Preprocessing.from_manifest(entry.manifest)
    ours = prep.normalize(prep.stack([img[..., 0] for img in images]))  # as decoded images are queued
    reference = entry.manifest.preprocessing.apply(images)  # the contract's reference arithmetic
    assert ours.dtype == np.float32 and ours.flags.c_contiguous
    np.testing.assert_array_equal(ours, reference)


def test_logits_match_a_plain_onnxruntime_session(classifier, entry, fashion_test):
    images, _ = fashion_test
    x = Preprocessing.from_manifest(entry.manifest).normalize(images[:8])
    plain = ort.InferenceSession(str(entry.path / "model.onnx"), providers=["CPUExecutionProvider"])
    (expected,) = plain.run(["logits"], {"pixel_values": x})
    np.testing.assert_allclose(classifier.run(x), expected, rtol=1e-5, atol=1e-5)


def test_top_k_is_a_calibrated_softmax_best_first(classifier):
    logits = np.array([[0.0, 2.0, 1.0] + [-5.0] * 7, [3.0] * 10], np.float32)
    top = classifier.top_k(Ranked(*ranked_softmax(logits)), 3)
    e = np.exp(logits[0].astype(np.float64) - 2.0)
    assert [t["index"] for t in top[0]] == [1, 2, 0]
    assert [t["label"] for t in top[0]] == [classifier.labels[i] for i in (1, 2, 0)]
    assert top[0][0]["score"] == pytest.approx(e[1] / e.sum(), rel=1e-12)
    full = classifier.top_k(Ranked(*ranked_softmax(logits)), 10)
    assert sum(t["score"] for t in full[0]) == pytest.approx(1.0, abs=1e-12)
    assert [t["index"] for t in top[1]] == [0, 1, 2]  # ties: lowest index first, deterministically
    assert all(type(t["index"]) is int and type(t["score"]) is float for t in full[0])  # JSON-ready


def test_a_batch_gets_the_same_answers_as_its_images_alone(classifier, fashion_test):
    images, _ = fashion_test
    probabilities, order, _ = classifier.infer(images[:16])
    for i in (0, 7, 15):
        alone_p, alone_order, _ = classifier.infer(images[i : i + 1])
        np.testing.assert_allclose(probabilities[i], alone_p[0], atol=1e-6)
        assert order[i][0] == alone_order[0][0]


@pytest.mark.parametrize("max_batch_size, sizes", [(1, [1]), (2, [2, 1]), (32, [32, 1]), (4096, [4096, 1])])
def test_warm_up_is_the_largest_batch_then_one_image_whatever_the_largest(max_batch_size, sizes):
    assert warm_up_batch_sizes(max_batch_size) == sizes


def test_warm_up_runs_the_sizes_it_is_given_and_stops_when_told(classifier, monkeypatch):
    seen = []
    real_run = Classifier.run
    monkeypatch.setattr(Classifier, "run", lambda self, x: seen.append(len(x)) or real_run(self, x))
    classifier.warm_up([12, 1])
    assert seen == [12, 1]
    classifier.warm_up([12, 1], should_stop=lambda: len(seen) >= 3)
    assert seen == [12, 1, 12]


def mappings_of(path: Path) -> int:
    """How many mappings of the file this process holds (/proc/self/maps)."""
    return sum(line.rstrip("\n").endswith(" " + str(path)) for line in open("/proc/self/maps"))


def test_graphs_sharing_a_weights_file_compute_on_one_mapping_of_it(tiny_vit_repository, tmp_path, fashion_test):
    source = tiny_vit_repository / "vit" / "1"  # exported by export.vit: both graphs point into weights.bin
    shutil.copytree(source, tmp_path / "1")  # a file no other test's session has mapped
    entry = load_entry(tmp_path / "1")
    graphs, settings = entry.manifest.graphs, Settings(intra_op_threads=1)
    assert shares_weights(graphs) and not shares_weights(load_entry(SHIPPED / "vit" / "1").manifest.graphs)
    weights = (entry.path / graphs["model"].weights).resolve()

    def classifier(shared: SharedWeights | None) -> Classifier:
        model, attention = (
            create_session(entry.path / graphs[g].file, settings, shared) for g in ("model", "attention")
        )
        return Classifier(entry, model, attention)

    shared = classifier(SharedWeights.map(weights))
    assert mappings_of(weights) == 1  # both sessions compute on the one mapping: no copy, no second mapping
    packed = classifier(None)
    images, _ = fashion_test
    x = Preprocessing.from_manifest(entry.manifest).normalize(images[:8])
    np.testing.assert_allclose(shared.run(x), packed.run(x), rtol=1e-5, atol=1e-5)
    (logits, attention), (packed_logits, packed_attention) = shared.run_with_attention(x), packed.run_with_attention(x)
    np.testing.assert_allclose(logits, packed_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(attention, packed_attention, rtol=1e-5, atol=1e-6)
    assert attention.shape[:2] == (8, entry.manifest.image_attention.layers)


def _break(manifest: dict, how: str) -> dict:
    m = copy.deepcopy(manifest)
    if how == "input-name":
        m["graphs"]["model"]["inputs"][0]["name"] = "images"
    elif how == "input-shape":
        m["graphs"]["model"]["inputs"][0]["shape"] = ["batch", 3, 28, 28]
    elif how == "no-logits":
        m["graphs"]["model"]["outputs"] = [o for o in m["graphs"]["model"]["outputs"] if o["name"] != "logits"]
    elif how == "labels":
        m["labels"] = m["labels"][:-1]
    elif how == "mean":
        m["preprocessing"]["mean"] = [0.5, 0.5, 0.5]
    elif how == "color-mode":
        m["preprocessing"]["color_mode"] = "RGB"
    elif how == "task":
        m["task"] = "translation"
    elif how == "io-logits":
        m["io"]["logits"] = "scores"
    return m


@pytest.mark.parametrize(
    "how", ["input-name", "input-shape", "no-logits", "labels", "mean", "color-mode", "task", "io-logits"]
)
def test_a_manifest_that_does_not_describe_the_graph_is_refused(entry, classifier, how):
    with pytest.raises(ManifestError):  # by the contract's validation, or by the classifier against the graph
        manifest = parse_manifest(_break(read_manifest(entry.path), how))
        Classifier(type(entry)(entry.name, entry.version, entry.path, manifest), classifier.handle)


@pytest.mark.parametrize("channels", [1, 3])
def test_the_normalisation_table_gives_the_training_arithmetic_bit_for_bit(channels):
    rng = np.random.default_rng(channels)
    prep = Preprocessing(
        8,
        channels,
        "L" if channels == 1 else "RGB",
        np.float32(1 / 255),
        rng.random(channels, np.float32),
        rng.random(channels, np.float32) + 0.05,
    )
    pixels = np.concatenate(
        [np.arange(256, dtype=np.uint8).repeat(channels), rng.integers(0, 256, 5 * 64 * channels - 256 * channels)]
    )
    pixels = pixels.astype(np.uint8).reshape(5, 8, 8, channels)
    arithmetic = np.ascontiguousarray(
        (((pixels.astype(np.float32) * prep.scale) - prep.mean) / prep.std).transpose(0, 3, 1, 2)
    )
    ours = prep.normalize(pixels)
    assert ours.dtype == np.float32 and ours.flags.c_contiguous and ours.shape == (5, channels, 8, 8)
    assert np.array_equal(ours.view(np.uint32), arithmetic.view(np.uint32))  # every one of the 256 values, every bit
