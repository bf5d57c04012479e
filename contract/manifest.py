"""The model-repository contract between export/ (writes it) and the service (reads and verifies it).

A repository is ``<root>/<name>/<version>/`` folders, each holding its files and a
``manifest.json`` that lists every file with its sha256. :class:`Manifest` is the typed form of that
file: the sections the service reads are typed and validated once, on load (graphs and their tensors,
files, preprocessing, the classifier's tensor names, attention, tokenizer, decoding); the rest
(evaluation, training, data, samples, framework) is kept as the exporter wrote it. The model-repository
docs page describes every field. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1
IMAGE_CLASSIFICATION, TRANSLATION = "image-classification", "translation"
COLOR_MODES = {"L": 1, "RGB": 3}  # PIL mode -> channels


class ManifestError(RuntimeError):
    """A repository entry cannot be served: missing, malformed, or its files do not match."""


class Section(BaseModel):
    """A manifest section: validated on load, read-only, and keeping any field it does not know."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Tensor(Section):
    name: str
    dtype: str
    shape: list[int | str]  # a string names a dynamic axis ("batch")


class GraphSpec(Section):
    file: str
    inputs: list[Tensor] = []
    outputs: list[Tensor] = []
    opset: int | None = None
    weights: str | None = None  # the file beside it holding its parameters (ONNX external data), if any

    def input(self, name: str) -> Tensor | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> Tensor | None:
        return next((t for t in self.outputs if t.name == name), None)


class FileInfo(Section):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class Preprocessing(Section):
    """How an image becomes the graph's input: resized to ``image_size``, ``pixel * scale`` then (x - mean) / std."""

    image_size: int = Field(ge=1)
    channels: int
    color_mode: Literal["L", "RGB"]
    resize: Literal["bilinear", "bicubic"] = "bilinear"  # the filter (contract/images.py)
    resize_size: int | None = Field(None, ge=1)  # resize to this square first, then centre-crop to image_size
    scale: float
    mean: list[float]
    std: list[float]

    @model_validator(mode="after")
    def _crop_fits(self) -> Preprocessing:
        if self.resize_size is not None and self.resize_size < self.image_size:
            raise ValueError(
                f"resize_size {self.resize_size} is smaller than the image_size {self.image_size} cut from it"
            )
        return self

    def apply(self, images: np.ndarray) -> np.ndarray:
        """uint8 (N, H, W, C) at ``image_size`` -> the graph's float32 (N, C, H, W): ``float32(pixel) * scale``,
        then ``(x - mean) / std`` in float32. The reference arithmetic: the exporter evaluates with it, and
        the service's lookup table (``service.classifier.Preprocessing``) is tested against it bit for bit."""
        x = images.astype(np.float32) * np.float32(self.scale)
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))

    @model_validator(mode="after")
    def _consistent(self) -> Preprocessing:
        if COLOR_MODES[self.color_mode] != self.channels:
            raise ValueError(f"color_mode {self.color_mode!r} does not give {self.channels} channels")
        if len(self.mean) != self.channels or len(self.std) != self.channels or min(self.std) <= 0:
            raise ValueError(f"needs {self.channels} means and {self.channels} positive stds")
        return self


class ClassifierIO(Section):
    """The serving graph's tensors by role: the image batch it takes and the logits it returns."""

    images: str
    logits: str


class ImageAttention(Section):
    """Where an image classifier's attention maps are, and how their tokens map onto the image."""

    graph: str = "model"  # the graph that computes them: "attention" (a graph of its own) or the serving graph
    output: str
    layout: list[str] = ["batch", "layer", "head", "query", "key"]
    layers: int = Field(ge=1)
    heads: int = Field(ge=1)
    tokens: int = Field(ge=1)
    prefix_tokens: int = Field(ge=0)
    grid: tuple[int, int]
    patch_size: int = Field(ge=1)

    @model_validator(mode="after")
    def _tokens_cover_the_grid(self) -> ImageAttention:
        if self.tokens != self.prefix_tokens + self.grid[0] * self.grid[1]:
            raise ValueError(f"{self.tokens} tokens are not {self.prefix_tokens} + the {self.grid} grid")
        return self


class SpecialIds(Section):
    pad: int
    bos: int | None = None  # a tokenizer without one (Marian) starts decoding from ``decoder_start``
    eos: int
    unk: int
    decoder_start: int | None = None  # the id the decoder is fed first; default ``bos``

    @property
    def start(self) -> int:
        return self.bos if self.decoder_start is None else self.decoder_start  # type: ignore[return-value]

    @model_validator(mode="after")
    def _has_a_start(self) -> SpecialIds:
        if self.bos is None and self.decoder_start is None:
            raise ValueError("needs bos or decoder_start: the id decoding starts from")
        return self


class TokenizerSpec(Section):
    """The translator's text <-> ids: one SentencePiece model (``sentencepiece``: ``file``, its own ids), or
    a source and a target model whose pieces map to ids through a JSON vocabulary (``sentencepiece-pair``:
    ``source_file``, ``target_file``, ``vocab_file``; the layout of Marian / OPUS-MT). ``contract/tokenizer.py``
    (``load_tokenizer``) reads both."""

    library: Literal["sentencepiece", "sentencepiece-pair"]
    file: str | None = None
    source_file: str | None = None
    target_file: str | None = None
    vocab_file: str | None = None
    special_ids: SpecialIds
    vocab_size: int = Field(ge=1)
    normalization: str | None = None  # "contract.tokenizer.normalize_text", or None: SentencePiece's own only

    @model_validator(mode="after")
    def _files_of_the_library(self) -> TokenizerSpec:
        needs = ("file",) if self.library == "sentencepiece" else ("source_file", "target_file", "vocab_file")
        missing = [k for k in needs if not getattr(self, k)]
        if missing:
            raise ValueError(f"a {self.library} tokenizer needs {', '.join(missing)}")
        return self


class AlignmentSpec(Section):
    """Which cross-attention maps align a translation's words with its source's (contract/projection.py)."""

    layers: list[int] | None = None  # None: every layer
    heads: list[int] | None = None  # None: every head
    shift: int = Field(default=0, ge=0)  # 0: the step that emitted the token; 1: the step that was fed it


class DecodingSpec(Section):
    """The step decoder's cache geometry and the decoding defaults (contract/decoding.py drives it)."""

    layers: int = Field(ge=1)
    heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    max_positions: int = Field(ge=1)
    beam: int = Field(default=1, ge=1)
    length_penalty: float = 1.0
    # "request": the decoder's cross_keys/cross_values/src_mask may hold one row per request, shared by
    # its beam rows (export/group_cross.py); "row": one per decoder row
    cross_rows: Literal["row", "request"] = "row"
    # What masking puts in place of a protected span, each spelt by one piece of the tokenizer, in the order
    # they are used (contract/translation_text.py); empty: the capital letters the tokenizer spells as one piece.
    sentinels: list[str] = Field(default_factory=list)
    # Where inline markup and unplaced spans go (contract/projection.py): the cross-attention layers and heads
    # whose mean aligns target to source words best; absent: every layer and head.
    alignment: AlignmentSpec | None = None


class Variant(Section):
    """A variant of another entry (export/quantize.py): its precision and the entry it was made from."""

    precision: str
    method: str
    from_: str = Field(alias="from")


class Manifest(Section):
    """One ``manifest.json``; the sections a task needs are required for that task."""

    schema_version: Literal[1]
    name: str
    version: str
    task: str
    created_at: str
    files: dict[str, FileInfo]
    graphs: dict[str, GraphSpec]
    languages: dict[str, str] | None = None  # a translator's {"source": "en", "target": "de"}
    labels: list[str] = []
    preprocessing: Preprocessing | None = None
    io: ClassifierIO | None = None
    attention: dict[str, Any] | None = None  # task-specific: see image_attention
    tokenizer: TokenizerSpec | None = None
    decoding: DecodingSpec | None = None
    model: dict[str, Any] = {}  # architecture, config, parameters
    samples: list[dict[str, Any]] = []
    evaluation: dict[str, Any] = {}
    training: dict[str, Any] = {}
    variant: Variant | None = None  # absent: the model as trained (fp32)

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, v: object) -> object:
        return str(v) if isinstance(v, int) else v

    @model_validator(mode="after")
    def _task_sections(self) -> Manifest:
        needs = {
            IMAGE_CLASSIFICATION: ("labels", "preprocessing", "io"),
            TRANSLATION: ("tokenizer", "decoding"),
        }.get(self.task, ())
        missing = [k for k in needs if not getattr(self, k)]
        graphs = {IMAGE_CLASSIFICATION: ("model",), TRANSLATION: ("encoder", "decoder")}.get(self.task, ())
        missing += [f"graphs.{g}" for g in graphs if g not in self.graphs]
        if missing:
            raise ValueError(f"a {self.task} manifest needs {', '.join(missing)}")
        unlisted = [
            f"graphs.{r}.weights {g.weights!r}" for r, g in self.graphs.items() if g.weights not in (None, *self.files)
        ]
        if unlisted:  # a weights file must have its sha256 checked like the graphs
            raise ValueError(f"{', '.join(unlisted)} not listed under files")
        if self.task == IMAGE_CLASSIFICATION:
            self.image_attention  # noqa: B018 - validates the section now, not on the first attention request
        return self

    @cached_property
    def image_attention(self) -> ImageAttention | None:
        """The attention section of an image classifier, typed (None when it declares none, or is no classifier)."""
        if self.task != IMAGE_CLASSIFICATION or not self.attention:
            return None
        return ImageAttention.model_validate(self.attention)

    def graph(self, role: str) -> GraphSpec:
        if role not in self.graphs:
            raise ManifestError(f"{self.name}/{self.version}: the manifest lists no {role!r} graph")
        return self.graphs[role]


def parse_manifest(data: dict, where: str = "manifest") -> Manifest:
    """Validate a manifest's content; every problem is one :class:`ManifestError` naming the fields."""
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        missing = [".".join(map(str, err["loc"])) for err in e.errors() if err["type"] == "missing"]
        problems = [f"missing required keys {missing}"] if missing else []
        problems += [
            f"{'.'.join(map(str, err['loc'])) or 'manifest'}: {err['msg']}"
            for err in e.errors()
            if err["type"] != "missing"
        ]
        raise ManifestError(f"{where}: {'; '.join(problems)}") from None


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    path: Path
    manifest: Manifest


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def describe_files(entry_dir: Path, names: list[str]) -> dict[str, dict]:
    """The ``files`` section of a manifest: sha256 and size of each named file."""
    return {n: {"sha256": sha256_file(entry_dir / n), "bytes": (entry_dir / n).stat().st_size} for n in sorted(names)}


def write_manifest(entry_dir: Path, manifest: dict) -> Path:
    """Write ``manifest.json`` as given (key order kept), after checking it is a valid :class:`Manifest`."""
    parse_manifest(manifest)
    path = Path(entry_dir) / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return path


def _read_json(entry_dir: Path) -> dict:
    path = Path(entry_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"{entry_dir}: no {MANIFEST_NAME}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: not a JSON object")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ManifestError(f"{path}: schema_version {manifest.get('schema_version')} is not {SCHEMA_VERSION}")
    return manifest


def read_manifest(entry_dir: Path) -> dict:
    """The validated content of an entry's ``manifest.json`` as a dict, for tools that edit it."""
    data = _read_json(entry_dir)
    parse_manifest(data, str(Path(entry_dir) / MANIFEST_NAME))
    return data


def verify_files(entry_dir: Path, manifest: Manifest) -> None:
    """Refuse an entry whose files are missing or differ from what the manifest recorded."""
    for name, meta in manifest.files.items():
        path = Path(entry_dir) / name
        if not path.is_file():
            raise ManifestError(f"{path}: listed in the manifest but missing")
        actual = sha256_file(path)
        if actual != meta.sha256:
            raise ManifestError(
                f"{path}: sha256 mismatch (manifest {meta.sha256[:12]}..., file {actual[:12]}...); "
                "the file is corrupted or was replaced without re-exporting"
            )


def load_entry(entry_dir: Path) -> Entry:
    """Read and verify one ``<name>/<version>`` folder."""
    entry_dir = Path(entry_dir)
    manifest = parse_manifest(_read_json(entry_dir), str(entry_dir / MANIFEST_NAME))
    verify_files(entry_dir, manifest)
    return Entry(manifest.name, manifest.version, entry_dir, manifest)


def latest_versions(root: Path) -> list[Path]:
    """For each model folder under ``root``, its highest numeric version folder."""
    root = Path(root)
    if not root.is_dir():
        raise ManifestError(f"model repository {root} does not exist")
    found = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        versions = [v for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit()]
        if versions:
            found.append(max(versions, key=lambda v: int(v.name)))
    return found
