"""Typed answers of the service, as pydantic models.

They accept fields they do not know (``extra="allow"``), so a newer service never breaks an older
client; the fields they do know are validated. Arrays (attention maps, rollouts, alignments) stay
nested lists, so numpy is optional; ``.to_numpy()`` converts them when it is installed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AlignmentSummary",
    "Attention",
    "AttentionMap",
    "ClassifyResponse",
    "DoneEvent",
    "ErrorInfo",
    "Health",
    "Hypothesis",
    "ImageResult",
    "LabelScore",
    "ModelInfo",
    "ModelInput",
    "Readiness",
    "Rollout",
    "RolloutSummary",
    "StreamEvent",
    "TokenEvent",
    "TranslateResponse",
    "TranslationResult",
]


def _numpy() -> Any:
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("to_numpy() needs numpy: pip install 'attnserve-client[numpy]'") from e
    return numpy


def _array(data: Any, shape: list[int] | None = None) -> Any:
    array = _numpy().asarray(data, dtype="float32")
    return array.reshape(shape) if shape is not None else array


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class ErrorInfo(_Model):
    """A failure confined to part of an answer (``attention_error``: the maps were computed but not stored)."""

    code: str
    message: str


# --- POST /classify ---------------------------------------------------------------------------


class LabelScore(_Model):
    label: str
    index: int = Field(description="Class index in the model's label list.")
    score: float = Field(description="Softmax probability.")


class RolloutSummary(_Model):
    """Attention rollout over the patch grid: where the class token looked, fused over heads."""

    kind: str = "rollout"
    fusion: str
    grid: list[int] = Field(description="(rows, columns) of patches.")
    rollout: list[list[float]] = Field(description="grid[0] x grid[1] weights.")

    def to_numpy(self) -> Any:
        """The rollout as a float32 array of shape ``grid``."""
        return _array(self.rollout, self.grid)


class ImageResult(_Model):
    top_k: list[LabelScore] = Field(description="Best first.")
    attention_id: str | None = Field(None, description="For `attention()`; only with return_attention.")
    attention: RolloutSummary | None = None
    attention_error: ErrorInfo | None = Field(
        None, description="Why there is no attention_id despite return_attention."
    )


class ClassifyResponse(_Model):
    model: str
    version: str
    results: list[ImageResult] = Field(description="One entry per image, in request order.")


# --- POST /translate --------------------------------------------------------------------------


class Hypothesis(_Model):
    translation: str
    score: float = Field(description="Sum of the tokens' log-probabilities.")
    normalized_score: float = Field(description="score / length**length_penalty: what n-best lists are sorted by.")
    finished: bool


class AlignmentSummary(_Model):
    """Cross attention of one decoder layer averaged over heads: which source token each target token read."""

    source_tokens: list[str]
    target_tokens: list[str]
    alignment: list[list[float]] = Field(description="target x source weights.")
    layer: int
    reduction: str

    def to_numpy(self) -> Any:
        """The alignment as a float32 array of shape (target tokens, source tokens)."""
        return _array(self.alignment)


class TranslationResult(_Model):
    translation: str
    source_tokens: list[str]
    target_tokens: list[str]
    finished: bool = Field(description="False when the length limit cut the sentence.")
    nbest: list[Hypothesis] | None = Field(None, description="Best first; only when num_return_sequences > 1.")
    attention_id: str | None = None
    attention: AlignmentSummary | None = None
    attention_error: ErrorInfo | None = None


class TranslateResponse(_Model):
    model: str
    version: str
    results: list[TranslationResult] = Field(description="One entry per text, in request order.")


class TokenEvent(_Model):
    """One generated token of a streamed translation."""

    type: Literal["token"] = "token"
    index: int = Field(description="Position of the token in the output.")
    token: str = Field(description="The subword piece (`▁` starts a word).")
    text: str = Field(description="The whole translation so far.")
    delta: str = Field("", description="What this token added to `text` (computed by the client).")


class DoneEvent(_Model):
    """The end of a streamed translation: the same answer a plain ``translate()`` gives."""

    type: Literal["done"] = "done"
    response: TranslateResponse


StreamEvent = TokenEvent | DoneEvent


# --- GET /attention/{id} ----------------------------------------------------------------------


class AttentionMap(_Model):
    """Attention probabilities of some layers and heads: ``data`` is indexed like ``axes``."""

    axes: list[str] = Field(description='Usually ["layer", "head", "query", "key"].')
    shape: list[int]
    layers: list[int] = Field(description="Model layer of each entry along the layer axis.")
    heads: list[int] = Field(description="Head of each entry along the head axis.")
    data: list = Field(description="Nested lists of the given shape.")
    query_tokens: list[str] | None = Field(None, description="Translation: the token of each query row.")
    key_tokens: list[str] | None = Field(None, description="Translation: the token of each key column.")

    def to_numpy(self) -> Any:
        """The map as a float32 array of shape ``shape``."""
        return _array(self.data, self.shape)


class Rollout(_Model):
    fusion: str
    data: list[list[float]]

    def to_numpy(self) -> Any:
        return _array(self.data)


class Attention(_Model):
    """Every attention map stored for an earlier request (``attention_id`` of a result)."""

    id: str
    model: str
    version: str
    task: str = Field(description="image-classification or translation.")
    created_at: datetime | None = None
    expires_at: datetime | None = Field(None, description="After this the id answers NotFoundError.")
    maps: dict[str, AttentionMap]
    # image classification
    grid: list[int] | None = Field(None, description="(rows, columns) of patches.")
    prefix_tokens: int | None = Field(None, description="Tokens before the patches (the class token).")
    prediction: LabelScore | None = None
    rollout: Rollout | None = None
    # translation
    source_tokens: list[str] | None = None
    target_tokens: list[str] | None = None
    translation: str | None = None

    def to_numpy(self, name: str | None = None) -> Any:
        """Map ``name`` as an array; without a name, the only map (an error lists the names if there are several)."""
        if name is None:
            if len(self.maps) != 1:
                raise ValueError(f"this attention has several maps; name one of {sorted(self.maps)}")
            (name,) = self.maps
        if name not in self.maps:
            raise KeyError(f"no map {name!r}; this attention has {sorted(self.maps)}")
        return self.maps[name].to_numpy()


# --- GET /models, /healthz, /readyz -----------------------------------------------------------


class ModelInput(_Model):
    image_size: int
    channels: int
    color_mode: str


class ModelInfo(_Model):
    name: str
    version: str
    task: str | None = None
    status: str = Field(description="pending, loading, warming, ready, failed or unsupported.")
    reason: str | None = Field(None, description="Why the model is not ready, when it is not.")
    provider: str | None = Field(None, description="onnxruntime execution provider in use.")
    default: bool = False
    created_at: str | None = None
    precision: str | None = Field(None, description="fp32, or int8 for a quantised variant.")
    variant_of: str | None = Field(None, description="name/version of the entry a variant was made from.")
    labels: list[str] | None = None
    input: ModelInput | None = None
    max_batch_size: int | None = None
    languages: dict[str, str] | None = None
    decoding: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None


class Health(_Model):
    status: str


class Readiness(_Model):
    """``GET /readyz``, ready or not: ``ready`` says which, ``reason`` why not."""

    status: str
    models: dict[str, str] = Field(default_factory=dict, description="`name/version` -> status.")
    reason: str | None = None

    @property
    def ready(self) -> bool:
        return self.status == "ready"
