"""The typed manifest: what a valid entry must hold for its task, and that every problem is one clear error."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from contract.manifest import (
    ManifestError,
    load_entry,
    parse_manifest,
    read_manifest,
    write_manifest,
)
from tests.conftest import SHIPPED_TRANSLATOR

ROOT = Path(__file__).resolve().parents[2]
VIT, TRANSLATOR = ROOT / "models" / "vit" / "1", SHIPPED_TRANSLATOR


def raw(entry: Path) -> dict:
    return json.loads((entry / "manifest.json").read_text())


def test_the_shipped_entries_parse_into_typed_sections():
    vit = load_entry(VIT).manifest
    assert vit.task == "image-classification" and vit.version == "1"
    assert vit.io.images == "pixel_values" and vit.graph("model").output(vit.io.logits).shape == ["batch", 10]
    assert vit.preprocessing.color_mode == "L" and vit.preprocessing.channels == 1
    assert vit.image_attention.grid == (7, 7) and vit.image_attention.graph == "attention"
    assert len(vit.labels) == 10 and vit.samples and vit.evaluation["test_accuracy"] > 0.9
    translator = load_entry(TRANSLATOR).manifest
    assert translator.tokenizer.special_ids.eos == 2 and translator.decoding.layers == 2
    assert translator.languages == {"source": "en", "target": "de"} and translator.image_attention is None
    assert {"encoder", "decoder", "decoder_prefix"} <= set(translator.graphs)


def test_unknown_fields_are_kept_as_written():
    data = raw(VIT)
    data["owner"] = {"team": "vision"}
    assert parse_manifest(data).model_extra["owner"] == {"team": "vision"}


def broken(entry: Path, path: str, value) -> dict:
    """The entry's manifest with the field at dotted ``path`` set to ``value`` (or removed when it is ...)."""
    data = copy.deepcopy(raw(entry))
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(
    "entry, path, value, message",
    [
        (VIT, "io", ..., "image-classification manifest needs io"),
        (VIT, "labels", [], "needs labels"),
        (VIT, "preprocessing.color_mode", "RGB", "does not give 1 channels"),
        (VIT, "preprocessing.std", [0.0], "positive stds"),
        (VIT, "attention.tokens", 49, "49 tokens are not 1 + the (7, 7) grid"),
        (VIT, "graphs.model", ..., "needs graphs.model"),
        (
            VIT,
            "graphs.attention.weights",
            "weights.bin",
            "graphs.attention.weights 'weights.bin' not listed under files",
        ),
        (TRANSLATOR, "tokenizer", ..., "translation manifest needs tokenizer"),
        (TRANSLATOR, "decoding.layers", 0, "decoding.layers: Input should be greater than or equal to 1"),
        (TRANSLATOR, "tokenizer.library", "tiktoken", "tokenizer.library"),
        (TRANSLATOR, "schema_version", 2, "schema_version"),
        (
            TRANSLATOR,
            "graphs.decoder.inputs",
            [{"name": "tokens"}],
            "missing required keys ['graphs.decoder.inputs.0.dtype', 'graphs.decoder.inputs.0.shape']",
        ),
    ],
)
def test_a_manifest_missing_what_its_task_needs_is_one_clear_error(entry, path, value, message):
    with pytest.raises(ManifestError, match=re.escape(message)):
        parse_manifest(broken(entry, path, value), "entry")


def test_files_need_a_sha256_and_a_size():
    data = raw(VIT)
    data["files"]["model.onnx"] = {"sha256": "not-a-digest", "bytes": -1}
    with pytest.raises(ManifestError) as e:
        parse_manifest(data)
    assert "files.model.onnx.sha256" in str(e.value) and "files.model.onnx.bytes" in str(e.value)


def test_an_unknown_task_is_readable_so_the_service_can_say_it_does_not_serve_it():
    data = raw(VIT)
    data["task"] = "speech-recognition"
    for key in ("io", "preprocessing", "labels"):
        del data[key]
    assert parse_manifest(data).task == "speech-recognition"


def test_write_refuses_an_invalid_manifest_and_read_refuses_it_too(tmp_path):
    data = broken(VIT, "io", ...)
    with pytest.raises(ManifestError, match="needs io"):
        write_manifest(tmp_path, data)
    assert not (tmp_path / "manifest.json").exists()
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"manifest.json: manifest: Value error, a image-classification"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ManifestError, match="not a JSON object"):
        read_manifest(tmp_path)
