"""An image-classification entry: its manifest contract, preprocessing, inference and top-k answer.

Everything about the model comes from its manifest (tensor names, input shape, labels,
normalisation); nothing is guessed. Normalisation is bit-for-bit the export's
``export/vit.py::preprocess``: ``float32(uint8) * scale``, then ``(x - mean) / std`` in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from contract.manifest import IMAGE_CLASSIFICATION, Entry, GraphSpec, ImageAttention, Manifest, ManifestError
from service.runtime import SessionHandle

TASK = IMAGE_CLASSIFICATION


@dataclass(frozen=True)
class Preprocessing:
    image_size: int
    channels: int
    color_mode: str
    scale: np.float32
    mean: np.ndarray  # (C,) float32
    std: np.ndarray  # (C,) float32
    resize: str = "bilinear"  # how a decoded image reaches image_size (contract/images.py)
    resize_size: int | None = None
    lut: np.ndarray = field(init=False, repr=False, compare=False)  # (C, 256) float32: every uint8 value normalised

    def __post_init__(self) -> None:
        values = np.arange(256, dtype=np.uint8).astype(np.float32) * self.scale
        object.__setattr__(self, "lut", np.ascontiguousarray(((values[:, None] - self.mean) / self.std).T))

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> Preprocessing:
        """The manifest's preprocessing section (validated by the contract) as arrays ready to use."""
        p = manifest.preprocessing
        if p is None:
            raise ManifestError(f"{manifest.name}/{manifest.version}: the manifest has no preprocessing section")
        mean, std = np.asarray(p.mean, np.float32), np.asarray(p.std, np.float32)
        return cls(p.image_size, p.channels, p.color_mode, np.float32(p.scale), mean, std, p.resize, p.resize_size)

    def stack(self, images: list[np.ndarray]) -> np.ndarray:
        """Decoded uint8 images (H, W) or (H, W, C) -> one uint8 block (N, H, W, C) to queue."""
        shape = (len(images), self.image_size, self.image_size, self.channels)
        return images[0].reshape(shape) if len(images) == 1 else np.stack(images).reshape(shape)

    def normalize(self, pixels: np.ndarray) -> np.ndarray:
        """uint8 (N, H, W, C) -> float32 (N, C, H, W), as the model was trained.

        A lookup in a table of the 256 values normalised with the training arithmetic
        (``float32(x) * scale``, then ``(x - mean) / std`` in float32): elementwise float32 arithmetic
        gives every value the same bits wherever it is computed, so the table's answer is the
        arithmetic's, in one numpy call instead of four (it runs on the event loop for every request).
        """
        n, h, w, c = pixels.shape
        if c == 1:
            return self.lut[0][pixels.reshape(n, 1, h, w)]
        out = np.empty((n, c, h, w), np.float32)
        for channel in range(c):
            np.take(self.lut[channel], pixels[..., channel], out=out[:, channel])
        return out

    def denormalize(self, x: np.ndarray) -> np.ndarray:
        """float32 (N, C, H, W) -> the nearest uint8 (N, H, W, C): the image a normalised input shows."""
        values = (x * self.std[:, None, None] + self.mean[:, None, None]) / self.scale
        return np.clip(np.rint(values), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)


class Ranked(NamedTuple):
    """A batch's (or one request's) answer rows, each array with one row per image."""

    probabilities: np.ndarray  # (N, classes) float64 softmax
    order: np.ndarray  # (N, classes) class indices, best first
    attention: np.ndarray | None = None  # (N, layers, heads, tokens, tokens) when the batch computed it


def attention_spec(manifest: Manifest, graph_outputs: set[str]) -> ImageAttention | None:
    """The entry's attention section, checked against the graph that computes it (None: no attention)."""
    spec = manifest.image_attention
    if spec is not None and spec.output not in graph_outputs:
        raise ManifestError(f"manifest names attention output {spec.output!r}, the graph has {sorted(graph_outputs)}")
    return spec


class Classifier:
    """Runs the ``logits`` output only, unless a batch holds a request that asked for attention."""

    def __init__(self, entry: Entry, handle: SessionHandle, attention_handle: SessionHandle | None = None) -> None:
        manifest = entry.manifest
        if manifest.task != TASK:
            raise ManifestError(f"{entry.path}: task {manifest.task!r} is not {TASK!r}")
        self.name, self.version = entry.name, entry.version
        self.handle = handle
        self.preprocessing = Preprocessing.from_manifest(manifest)
        self.labels: list[str] = list(manifest.labels)
        self.input_name, self.logits_name = _io_names(manifest, self.preprocessing, len(self.labels))
        graph_inputs = {i.name for i in handle.session.get_inputs()}
        graph_outputs = {o.name for o in handle.session.get_outputs()}
        if self.input_name not in graph_inputs or self.logits_name not in graph_outputs:
            raise ManifestError(
                f"{entry.path}: manifest names input {self.input_name!r} / output {self.logits_name!r} but the graph "
                f"has inputs {sorted(graph_inputs)} and outputs {sorted(graph_outputs)}"
            )
        self._outputs = [self.logits_name]
        # Attention comes from its own graph when the entry has one (the serving graph then computes
        # logits only); older entries carry it as a second output of the serving graph.
        if attention_handle is not None:
            self._attention_session = attention_handle.session
        elif manifest.image_attention is not None and manifest.image_attention.graph == "model":
            self._attention_session = handle.session
        else:  # the entry's attention graph was not loaded: serve without attention
            self._attention_session = None
        self.attention = None
        if self._attention_session is not None:
            outputs = {o.name for o in self._attention_session.get_outputs()}
            self.attention = attention_spec(manifest, outputs)
        self._with_attention = self._outputs + ([self.attention.output] if self.attention else [])

    @property
    def input_shape(self) -> tuple[int, int, int]:
        p = self.preprocessing
        return (p.channels, p.image_size, p.image_size)

    def run(self, x: np.ndarray) -> np.ndarray:
        """(N, C, H, W) float32 -> logits (N, classes). Called on the batcher's thread."""
        (logits,) = self.handle.session.run(self._outputs, {self.input_name: x})
        return logits

    def run_with_attention(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, C, H, W) -> (logits (N, classes), attention (N, layers, heads, tokens, tokens))."""
        if self.attention is None or self._attention_session is None:
            raise ManifestError(f"model {self.name} has no attention output")
        logits, attention = self._attention_session.run(self._with_attention, {self.input_name: x})
        return logits, attention

    def warm_up(self, batch_sizes: list[int], should_stop=lambda: False) -> None:
        """Run the serving graph at each of ``batch_sizes`` (``warm_up_batch_sizes``), then the attention
        graph at one image, so that no client pays for first-run allocations or for paging the weights in."""
        for n in batch_sizes:
            if should_stop():
                return
            self.run(np.zeros((n, *self.input_shape), np.float32))
        if self.attention is not None and not should_stop():
            self.run_with_attention(np.zeros((1, *self.input_shape), np.float32))

    def forward(self, x: np.ndarray, attention: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Normalised (N, C, H, W) -> logits, plus the attention maps when ``attention`` is true.

        All the batcher runs on its instance threads: nothing but the onnxruntime call, so a thread
        takes the GIL only to start and to return. Normalising (``normalize``, per request as it is
        queued) and ranking (``rank``, once per batch) run on the event loop: on the thread, every
        numpy call released the GIL and then waited up to the switch interval for the busy event
        loop to give it back, 4 ms per batch of 32 (15% of the thread's time) with 64 clients.
        """
        return self.run_with_attention(x) if attention else self.run(x)

    def rank(self, out: np.ndarray | tuple[np.ndarray, np.ndarray]) -> Ranked:
        """``forward``'s output -> probabilities and classes best first, plus the attention maps if any."""
        if isinstance(out, tuple):
            logits, maps = out
            return Ranked(*ranked_softmax(logits), maps)
        return Ranked(*ranked_softmax(out))

    def infer(self, pixels: np.ndarray, attention: bool = False) -> Ranked:
        """uint8 (N, H, W, C) -> ``Ranked``: the batcher's three steps in one call."""
        return self.rank(self.forward(self.preprocessing.normalize(pixels), attention))

    def top_k(self, ranked: Ranked, k: int) -> list[list[dict]]:
        """The answer for each row: its k best labels with their probabilities."""
        labels = self.labels
        return [
            [{"label": labels[i], "index": i, "score": p[i]} for i in idx]
            for p, idx in zip(ranked.probabilities.tolist(), ranked.order[:, :k].tolist())
        ]


def warm_up_batch_sizes(max_batch_size: int) -> list[int]:
    """The largest batch first, so that onnxruntime's memory arena grows to its peak in one go, then one
    image, the lone request whose latency shows most. Two runs, whatever ``max_batch_size``, instead of
    one per size: after them the first run at any other size costs what its next run does
    (``benchmarks/bench_startup.py``'s first requests)."""
    return [max_batch_size, 1] if max_batch_size > 1 else [1]


def shares_weights(graphs: dict[str, GraphSpec]) -> bool:
    """Whether the serving and the attention graph point into one weights file: the same network twice."""
    model, attention = graphs.get("model"), graphs.get("attention")
    return (
        model is not None and attention is not None and model.weights is not None and model.weights == attention.weights
    )


def ranked_softmax(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Softmax in float64 (so probabilities sum to 1 to the last bit that JSON shows), and the
    classes sorted by it; ties keep the lower index first so answers are deterministic."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return p, np.argsort(-p, axis=1, kind="stable")


def _io_names(manifest: Manifest, prep: Preprocessing, num_labels: int) -> tuple[str, str]:
    """The image input and logits output the manifest names by role, checked against its own tensor list."""
    graph, io = manifest.graph("model"), manifest.io
    assert io is not None  # the contract requires it of an image classifier
    image, logits = graph.input(io.images), graph.output(io.logits)
    if image is None or logits is None:
        raise ManifestError(
            f"manifest io names input {io.images!r} and output {io.logits!r}, graphs.model lists inputs "
            f"{[t.name for t in graph.inputs]} and outputs {[t.name for t in graph.outputs]}"
        )
    expected = [prep.channels, prep.image_size, prep.image_size]
    if image.dtype != "float32" or list(image.shape)[1:] != expected:
        raise ManifestError(f"graph input {image.name!r} is not float32 (batch, {', '.join(map(str, expected))})")
    if list(logits.shape)[1:] != [num_labels]:
        raise ManifestError(f"graph output {logits.name!r} is not (batch, {num_labels}) for the {num_labels} labels")
    return image.name, logits.name
