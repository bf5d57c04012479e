"""What one ``attention_id`` names: a request's full attention maps, their axes' labels, and context.

A record is self-describing (task, model, version, token strings or patch-grid geometry, the input
image for overlays) so that any replica can render it without the model. It serialises to one
``.npz`` blob (arrays stored exactly, float32; the metadata as a JSON string inside), the unit the
stores keep and the body of the binary download.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field

import numpy as np

MAP_AXES = ("layer", "head", "query", "key")
_META = "__meta__.json"
_IMAGE = "__image__"


class RecordError(ValueError):
    """A blob that is not an attention record (corrupted, or written by an incompatible version)."""


@dataclass
class AttentionRecord:
    task: str  # "image-classification" | "translation"
    model: str
    version: str
    maps: dict[str, np.ndarray]  # name -> (layers, heads, query, key) float32
    meta: dict = field(default_factory=dict)  # JSON-able: grid, tokens, labels of the axes, prediction
    image: np.ndarray | None = None  # the model's input pixels (H, W, C) uint8, for overlays
    created_at: float = field(default_factory=time.time)
    owner: str | None = None  # the fingerprint of the API key that made it; only that key may read it

    def __post_init__(self) -> None:
        for name, m in self.maps.items():
            if m.ndim != 4:
                raise ValueError(f"map {name!r} must be (layers, heads, query, key), got shape {m.shape}")

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.maps.values()) + (0 if self.image is None else self.image.nbytes)

    def to_bytes(self) -> bytes:
        header = {
            "task": self.task,
            "model": self.model,
            "version": self.version,
            "created_at": self.created_at,
            "meta": self.meta,
            "owner": self.owner,
        }
        arrays = {name: np.ascontiguousarray(m, dtype=np.float32) for name, m in self.maps.items()}
        arrays[_META] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        if self.image is not None:
            arrays[_IMAGE] = self.image
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> AttentionRecord:
        try:
            with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
            header = json.loads(arrays.pop(_META).tobytes())
            image = arrays.pop(_IMAGE, None)
            return cls(
                header["task"],
                header["model"],
                header["version"],
                arrays,
                header["meta"],
                image,
                header["created_at"],
                header.get("owner"),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RecordError(f"not an attention record: {e}") from e
