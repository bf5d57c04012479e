"""Request and response bodies: validated input, and the documented shape of every answer."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ClassifyOptions(BaseModel):
    """Options shared by the JSON and the multipart form of ``POST /classify``."""

    model_config = ConfigDict(extra="forbid")

    top_k: int = Field(5, ge=1, description="How many labels to return per image, best first.")
    model: str | None = Field(
        None, min_length=1, max_length=200, description="Model name (default: the service's default classifier)."
    )
    return_attention: bool = Field(
        False, description="Not available yet: `true` is refused with 422 until attention retrieval ships."
    )


class ClassifyJSONRequest(ClassifyOptions):
    model_config = ConfigDict(extra="forbid", strict=True)

    images: list[str] = Field(
        min_length=1,
        description="Images, each base64-encoded (standard alphabet; a `data:image/...;base64,` prefix is accepted).",
    )


class LabelScore(BaseModel):
    label: str
    index: int = Field(description="Class index in the model's label list.")
    score: float = Field(description="Softmax probability.")


class ImageResult(BaseModel):
    top_k: list[LabelScore]


class ClassifyResponse(BaseModel):
    model: str
    version: str
    results: list[ImageResult] = Field(description="One entry per image, in request order.")


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable snake_case code to branch on.")
    message: str = Field(description="What went wrong, for a person.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelInput(BaseModel):
    image_size: int
    channels: int
    color_mode: str


class ModelInfo(BaseModel):
    name: str
    version: str
    task: str | None
    status: str = Field(description="pending, loading, warming, ready, failed or unsupported.")
    reason: str | None = Field(None, description="Why the model is not ready, when it is not.")
    provider: str | None = Field(None, description="onnxruntime execution provider actually in use.")
    default: bool = Field(False, description="Used when a request names no model.")
    created_at: str | None = None
    labels: list[str] | None = None
    input: ModelInput | None = None
    max_batch_size: int | None = None
    evaluation: dict | None = Field(None, description="Figures measured at export (accuracy, parity).")


class ModelsResponse(BaseModel):
    models: list[ModelInfo]


class HealthResponse(BaseModel):
    status: str


class ReadinessResponse(BaseModel):
    status: str
    models: dict[str, str] = Field(description="`name/version` -> status.")


class NotReadyResponse(ErrorResponse):
    status: str
    models: dict[str, str]


ERROR_RESPONSES = {
    400: {"model": ErrorResponse, "description": "Undecodable image, invalid base64 or JSON."},
    404: {"model": ErrorResponse, "description": "Unknown model."},
    413: {"model": ErrorResponse, "description": "Body or image too large (bytes or pixels)."},
    415: {"model": ErrorResponse, "description": "Content type is neither JSON nor multipart."},
    422: {"model": ErrorResponse, "description": "Invalid field (top_k out of range, too many images, ...)."},
    500: {"model": ErrorResponse, "description": "Inference failed; the request id identifies it in the logs."},
    503: {"model": ErrorResponse, "description": "Queue full or model not ready; see `Retry-After`."},
}
