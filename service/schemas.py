"""Request and response bodies: validated input, and the documented shape of every answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.errors import InvalidField

SETTINGS_KEY = "x-settings"
Schema = TypeVar("Schema", bound=BaseModel)


def validated(schema: type[Schema], data: object) -> Schema:
    """``data`` as ``schema``, or 422 ``invalid_field`` naming every field that does not fit."""
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise InvalidField(describe_validation(e.errors(include_url=False, include_input=False))) from e


def describe_validation(errors: list[Any]) -> str:
    """``top_k: Input should be less than or equal to 10; ...`` from pydantic's error list."""
    parts = []
    for e in errors[:10]:
        where = ".".join(str(p) for p in e.get("loc", ())) or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
    return "; ".join(parts) + more


def bounded_by(**keywords: Any) -> dict[str, Any]:
    """``json_schema_extra`` for a field bounded by a setting, such as ``maxItems="max_texts_per_request"``.

    The handlers check these limits against the running service's settings, which a class cannot
    know; the OpenAPI document (``service/http/openapi.py``) writes in the settings' values. Values
    are setting names, or nested keywords (``items={"maxLength": "max_text_chars"}``).
    """
    return {SETTINGS_KEY: keywords}


class ClassifyOptions(BaseModel):
    """Options shared by the JSON and the multipart form of ``POST /classify``."""

    model_config = ConfigDict(extra="forbid")

    top_k: int = Field(
        5,
        ge=1,
        description="How many labels to return per image, best first (at most the model's number of labels).",
        json_schema_extra=bounded_by(maximum="max_top_k"),
    )
    model: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Model name, or `name:version` to pin a version (default: the service's default classifier).",
    )
    return_attention: bool = Field(
        False,
        description="Also answer, per image, an `attention_id` (for `GET /attention/{id}`) and the class "
        "token's attention rollout over the patch grid.",
    )
    rollout_fusion: Literal["mean", "max"] = Field(
        "mean", description="How the rollout fuses each layer's heads: their mean or their element-wise max."
    )
    priority: Literal["interactive", "batch"] = Field(
        "interactive",
        description='`"batch"` for bulk work: its images run in batches of their own once no interactive request '
        "waits, and never wait longer than the service's `batch_max_wait_s` for them.",
    )


class ClassifyJSONRequest(ClassifyOptions):
    model_config = ConfigDict(extra="forbid", strict=True)

    images: list[str] = Field(
        min_length=1,
        description="Images, each base64-encoded (standard alphabet; a `data:image/...;base64,` prefix is accepted).",
        json_schema_extra=bounded_by(maxItems="max_images_per_request"),
    )


class LabelScore(BaseModel):
    label: str
    index: int = Field(description="Class index in the model's label list.")
    score: float = Field(description="Softmax probability.")


class AttentionError(BaseModel):
    code: str = Field(description="`attention_store_unavailable`: the maps were computed but could not be kept.")
    message: str


class RolloutSummary(BaseModel):
    kind: Literal["rollout"] = "rollout"
    fusion: Literal["mean", "max"]
    grid: list[int] = Field(description="[grid_h, grid_w]: the patch grid.")
    rollout: list[list[float]] = Field(
        description="grid_h x grid_w: the class token's attention rollout over the patches."
    )


class ImageResult(BaseModel):
    top_k: list[LabelScore]
    attention_id: str | None = Field(
        None, description="With return_attention: the id of the full maps (null if the store failed)."
    )
    attention: RolloutSummary | None = None
    attention_error: AttentionError | None = None


class ClassifyResponse(BaseModel):
    model: str
    version: str
    results: list[ImageResult] = Field(description="One entry per image, in request order.")


_ONE_OF_TEXT_OR_TEXTS = {
    "oneOf": [
        {"required": ["text"], "properties": {"text": {"type": "string"}}},
        {"required": ["texts"], "properties": {"texts": {"type": "array"}}},
    ]
}
NOT_BLANK = {"pattern": r"\S"}  # documents the handler's check, which also ignores invisible characters
Text = Annotated[str, Field(json_schema_extra=NOT_BLANK)]


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_ONE_OF_TEXT_OR_TEXTS)

    text: Text | None = Field(
        None,
        description="One English text (or use `texts`), not blank.",
        json_schema_extra=bounded_by(maxLength="max_text_chars"),
    )
    texts: list[Text] | None = Field(
        None,
        min_length=1,
        description="Several texts, translated together.",
        json_schema_extra=bounded_by(maxItems="max_texts_per_request", items={"maxLength": "max_text_chars"}),
    )
    model: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Model name, or `name:version` to pin a version (default: the first translation model).",
    )
    beam_size: int | None = Field(
        None,
        ge=1,
        description="1: greedy decoding; up to the service's `max_beam_size`. Default: the model's "
        "`default_beam_size` (`GET /models`), or 1 with `stream: true` (tokens stream from greedy decoding).",
        json_schema_extra=bounded_by(maximum="max_beam_size"),
    )
    length_penalty: float | None = Field(
        None,
        ge=0.0,
        le=5.0,
        description="Beam hypotheses are ranked by score / length**length_penalty. "
        "Default: the model's `default_length_penalty` (`GET /models`).",
    )
    num_return_sequences: int = Field(
        1,
        ge=1,
        description="n-best list size (at most `beam_size`); > 1 adds `nbest`.",
        json_schema_extra=bounded_by(maximum="max_beam_size"),
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="Generated-token limit of each sentence (default: 1.5 x its source tokens + 10, capped; at most "
        "the model's positions); a sentence cut there is reported (`finished: false`).",
        json_schema_extra=bounded_by(maximum="max_new_tokens"),
    )
    return_attention: bool = Field(
        False,
        description="Also answer, per text, an `attention_id` and the source-target "
        "alignment of the returned translation.",
    )
    protect_placeholders: bool = Field(
        True,
        description="Mask printf/brace placeholders, tags, entities and escapes before decoding, make the search "
        "place each exactly once, and restore them (`placeholders` in the answer); false: translate the text as is.",
    )
    format: Literal["text", "html"] = Field(
        "text",
        description='`"html"`: each text is an HTML fragment or page. Block elements are translated as segments, '
        "inline tags put back around the words they wrapped; scripts, styles, `pre`, `code`, comments and every "
        "attribute but `title` and `alt` are kept as they are.",
    )
    priority: Literal["interactive", "batch"] = Field(
        "interactive",
        description='`"batch"` for bulk work (a catalog, a document set): it is decoded after the waiting '
        "interactive requests, and is never delayed past the service's `batch_max_wait_s` by them.",
    )
    stream: bool = Field(
        False,
        description="Answer `text/event-stream`: a `token` event per generated token "
        "(greedy), then a `done` event with the full result. One text only.",
    )

    @model_validator(mode="after")
    def _one_of_text_or_texts(self) -> TranslateRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError("give exactly one of `text` and `texts`")
        return self

    @property
    def all_texts(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])


class Hypothesis(BaseModel):
    translation: str
    score: float = Field(description="Sum of the tokens' log-probabilities.")
    normalized_score: float = Field(description="score / length**length_penalty: what the n-best list is sorted by.")
    finished: bool = Field(description="False when the length limit stopped it before its end-of-sentence token.")


class AlignmentSummary(BaseModel):
    source_tokens: list[str]
    target_tokens: list[str] = Field(description="The generated pieces, `</s>` last when the translation finished.")
    layer: int = Field(description="The decoder layer the alignment is taken from (the last).")
    reduction: str
    alignment: list[list[float]] = Field(description="target x source: each row sums to 1.")


class Placeholder(BaseModel):
    text: str = Field(description="The span as it stands in the source, carried over verbatim.")
    kind: str = Field(description="printf, percent, positional, name, strftime, brace, tag, entity or escape.")
    restored: bool = Field(description="It came back exactly once (always, unless the text was not protected).")


class SentenceResult(BaseModel):
    source: str
    translation: str
    finished: bool = Field(description="False when the sentence was cut at `max_new_tokens`.")


class TranslationResult(BaseModel):
    translation: str
    source_tokens: list[str] = Field(
        description="Subword pieces of the source (`▁` starts a word), each sentence's eos included; a "
        "protected span shows as itself."
    )
    target_tokens: list[str]
    finished: bool = Field(description="Every sentence ended with its end-of-sentence token.")
    placeholders: list[Placeholder] = Field(description="The protected spans of the text, in source order.")
    sentences: list[SentenceResult] = Field(description="The sentences the text was split into, decoded as one batch.")
    nbest: list[Hypothesis] | None = Field(None, description="Best first; only when num_return_sequences > 1.")
    attention_id: str | None = Field(
        None, description="With return_attention: the id of the full maps (null if the store failed)."
    )
    attention: AlignmentSummary | None = None
    attention_error: AttentionError | None = None


class TranslateResponse(BaseModel):
    model: str
    version: str
    results: list[TranslationResult] = Field(description="One entry per text, in request order.")


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable snake_case code to branch on.")
    message: str = Field(description="What went wrong, for a person.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ProtocolErrorResponse(BaseModel):
    """The Open Inference Protocol's error body: the message only (the service's code is in its log)."""

    error: str = Field(description="What went wrong, for a person.")


class ModelInput(BaseModel):
    image_size: int
    channels: int
    color_mode: str


class ModelInfo(BaseModel):
    name: str
    version: str
    task: str | None
    status: str = Field(description="pending, loading, warming, ready, failed, unsupported or unloading.")
    reason: str | None = Field(None, description="Why the model is not ready, when it is not.")
    provider: str | None = Field(None, description="onnxruntime execution provider actually in use.")
    default: bool = Field(False, description="Used when a request names no model.")
    unpinned: bool = Field(
        True, description="Answers requests that name this model without a version (`name`, not `name:version`)."
    )
    created_at: str | None = None
    precision: str | None = Field(
        None, description="fp32, or int8: the version's int8 variant, or an entry made by export.quantize."
    )
    precision_reason: str | None = Field(
        None, description="Why this precision is served (`ATTNSERVE_PRECISION`, the int8 variant's measured loss)."
    )
    variant_of: str | None = Field(None, description="A variant: name/version of the entry it was made from.")
    labels: list[str] | None = None
    input: ModelInput | None = None
    max_batch_size: int | None = None
    languages: dict[str, str] | None = Field(None, description="Translation: source and target language.")
    decoding: dict | None = Field(None, description="Translation: defaults the model was evaluated with.")
    scheduler: dict | None = Field(None, description="Translation: sequences running and waiting now.")
    attention: dict | None = Field(None, description="Attention geometry: layers and heads (and the ViT's patch grid).")
    evaluation: dict | None = Field(None, description="Figures measured at export (accuracy, BLEU, parity).")


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
