"""Every knob of the service, read once from ``ATTNSERVE_*`` environment variables.

One class so that the settings page (docs/configuration.md, checked against it by a test), the validation and
the defaults cannot drift apart.
Validators refuse values that would make the service unsafe (unbounded bodies, pixel bombs) or
self-contradictory (a request larger than any batch), at startup rather than at the first request;
``explain`` turns their refusal into the one line ``python -m service`` prints.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1 << 20

# Hard ceilings no configuration may exceed: past these a single request can exhaust the machine.
MAX_BODY_CEILING = 512 * MiB
MAX_PIXELS_CEILING = 178_956_970  # twice Pillow's own decompression-bomb threshold
MAX_TIMEOUT_S = 86_400.0  # a day: no request needs longer, and a deadline must stay a number a timer can take

GraphOptimization = Literal["disabled", "basic", "extended", "all"]
ExecutionProvider = Literal["auto", "cuda", "cpu"]
Precision = Literal["auto", "fp32", "int8"]
DecoderCache = Literal["auto", "host", "device"]
CacheScope = Literal["shared", "key"]
LogFormat = Literal["json", "text"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
DEFAULT_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")

# Settings whose values no error message repeats: the API key hashes (a hash of a short key can be
# brute-forced back to the key) and the Redis URL (it may carry a password: redis://:password@host).
SECRET_SETTINGS = frozenset({"api_key_hashes", "redis_url"})

LIST_FORMS = 'write it as ["a","b"] or as a,b'


def list_from_env(value: Any) -> Any:
    """A list setting as written in the environment: a JSON list (``["a","b"]``) or comma-separated
    (``a,b``, the form many servers take); empty is the empty list. Other values pass through."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON list ({e.msg} at character {e.pos}); {LIST_FORMS}") from None
        if not all(isinstance(item, str) for item in items):
            raise ValueError(f"a JSON list of strings only; {LIST_FORMS}")
        return items
    return [item.strip() for item in text.split(",") if item.strip()]


EnvList = Annotated[tuple[str, ...], BeforeValidator(list_from_env)]


class Settings(BaseSettings):
    """Configuration of one service process. Field descriptions are the settings page's."""

    # enable_decoding=False: pydantic-settings would read a list only as JSON, and fail with a traceback on
    # anything else; list fields are EnvList, whose validator takes both forms and refuses with a message.
    model_config = SettingsConfigDict(env_prefix="ATTNSERVE_", extra="forbid", frozen=True, enable_decoding=False)

    # --- server -----------------------------------------------------------------------------
    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on (0.0.0.0 in a container).")
    port: int = Field(8000, ge=1, le=65535, description="TCP port.")
    grpc_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description="TCP port of the Open Inference Protocol over gRPC (Triton's `inference.GRPCInferenceService`, "
        "on `host`); 0: no gRPC server.",
    )
    workers: int = Field(
        1, ge=1, le=64, description="uvicorn worker processes; each loads its own copy of every model."
    )
    keep_alive_s: int = Field(
        75,
        ge=1,
        le=3600,
        description="Seconds an idle keep-alive connection stays open. Longer than the idle timeout of the clients "
        "and proxies in front (httpx 5 s, AWS ALB 60 s), so that they, not the service, close an idle connection: "
        "one closed by the service just as a client sends on it loses that request.",
    )
    drain_delay_s: float = Field(
        5.0,
        ge=0.0,
        le=300.0,
        description="After SIGTERM or SIGINT, seconds the service goes on accepting and answering while its readiness "
        "(`/readyz`, and the Open Inference Protocol's over REST and gRPC) says it is draining, so that a load "
        "balancer takes it out before it stops accepting; a second signal ends the delay at once. 0: stop accepting "
        "at the first signal.",
    )
    drain_timeout_s: float = Field(
        30.0,
        gt=0.0,
        le=3600.0,
        description="Once the service stops accepting, longest it lets the HTTP requests and gRPC calls in flight "
        "finish (streams included) before it cancels them and stops.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="Longest a request's line and headers may take to arrive: from the connection's opening, or on a "
        "keep-alive connection from the first byte of its next request; a slower one (slowloris) gets 408 "
        "`request_timeout` and its connection is closed. Also the gRPC port's handshake timeout.",
    )
    write_timeout_s: float = Field(
        30.0,
        gt=0.0,
        le=3600.0,
        description="Longest an answer may wait for a client that does not read it (the connection's send buffer "
        "full): past it the connection is dropped and the handler released.",
    )
    max_connections: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Most HTTP connections the process holds, and most gRPC connections: at the bound a new HTTP "
        "connection closes the one that has waited longest for a request (headers incomplete, or idle between "
        "requests), else the one whose answer has gone unread longest, else the one whose body has been arriving "
        "longest, or, when every connection has a request in progress, gets 503 `overloaded` and is closed; a "
        "new gRPC connection is closed. 0: half of the process's open-file limit (RLIMIT_NOFILE) less 256, at most "
        "4096.",
    )
    log_level: LogLevel = Field("info", description="Minimum level of the service's logs.")
    log_format: LogFormat = Field("json", description="`json`: one JSON object per line; `text` for humans.")
    access_log: bool = Field(True, description="Log one line per request (method, path, status, latency).")

    # --- model repository and runtime ---------------------------------------------------------
    model_repository: Path = Field(Path("models"), description="Root of the model repository (`<name>/<version>/`).")
    default_model: str | None = Field(
        None,
        description="Classifier used when a /classify request names none (default: the first image-classification model).",
    )
    version_policy: str = Field(
        "latest:1",
        description="Versions loaded of a model whose folder has no config.json: `latest:N`, `all` or `specific:1,3`.",
    )
    memory_release_s: float = Field(
        30.0,
        ge=0,
        description="Every so many seconds give the C heap's freed pages back to the system (glibc's malloc_trim, in "
        "a thread); 0: only after a model version is loaded or unloaded.",
    )
    repository_poll_s: float = Field(
        0,
        ge=0,
        description="Read the repository every so many seconds and load what changed (0: only at startup and on "
        "POST /v2/repository/models/{name}/load).",
    )
    execution_provider: ExecutionProvider = Field(
        "auto", description="`auto`: CUDA when onnxruntime offers it, else CPU; `cuda` or `cpu` to force."
    )
    precision: Precision = Field(
        "auto",
        description="`auto`: on the CPU, a version's int8 variant (its `int8/` folder) when its manifest records "
        "that it loses at most 0.5 BLEU (0.3 accuracy points) against fp32 and that its answers depend no more than "
        "fp32's on the batch they are computed in, else fp32; `fp32` or `int8` to force.",
    )
    require_gpu: bool = Field(
        False, description="Fail startup/readiness instead of falling back to the CPU when CUDA is not obtained."
    )
    cuda_device_id: int = Field(0, ge=0, le=63, description="GPU used by the CUDA execution provider.")
    intra_op_threads: int = Field(
        0,
        ge=0,
        le=1024,
        description="onnxruntime intra-op threads; 0: one per available core but one, left to the HTTP event loop.",
    )
    inter_op_threads: int = Field(0, ge=0, le=1024, description="onnxruntime inter-op threads (0: default).")
    graph_optimization_level: GraphOptimization = Field("all", description="onnxruntime graph optimisation level.")
    allow_spinning: bool = Field(
        False,
        description="Let idle onnxruntime threads spin; off because spinning steals the CPU the HTTP layer needs.",
    )
    share_classifier_weights: bool = Field(
        False,
        description="An image classifier whose serving and attention graphs point into one weights file keeps one "
        "copy of its weights (one mapping of the file, which both sessions compute on) instead of one packed copy "
        "per session: half the memory, for some speed on a CPU, and scores whose last digits depend on the batch "
        "a request shares.",
    )
    decoder_cache: DecoderCache = Field(
        "auto",
        description="Where a translator's decoding batch keeps its key/value caches: `device`, in onnxruntime "
        "buffers on the session's device, stepped through IO binding (only token ids go in, only the best "
        "candidates come out); `host`, in numpy arrays handed to every step; `auto`: `device` on CUDA, `host` on "
        "the CPU, where it is the faster. Both decode the same tokens with the same scores.",
    )

    # --- batching -----------------------------------------------------------------------------
    max_batch_size: int = Field(32, ge=1, le=4096, description="Most images in one onnxruntime run.")
    model_instances: int = Field(
        2,
        ge=1,
        le=64,
        description="Batches of one model computing at once, each on its own thread of the model's onnxruntime session.",
    )
    max_queue_delay_ms: float = Field(
        2.0,
        ge=0.0,
        le=1000.0,
        description="Longest a batch waits for requests already being received; an idle queue never waits.",
    )
    max_queue_images: int = Field(
        512, ge=1, le=1_000_000, description="Images queued per model before requests get 503 `overloaded`."
    )
    retry_after_s: int = Field(1, ge=1, le=3600, description="`Retry-After` seconds sent with 503 answers.")
    max_requests_in_flight: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Requests that queue work (classify, translate, OIP infer over REST or gRPC) being read, queued or "
        "computed at once; one more gets 503 `overloaded` (gRPC: `UNAVAILABLE`) at once, over HTTP before its body is "
        "read. 0: `max_queue_images` + `max_waiting_sequences`, the most requests the queues can hold.",
    )

    # --- request limits -----------------------------------------------------------------------
    max_body_bytes: int = Field(16 * MiB, ge=1024, description="Largest request body (413 beyond).")
    max_image_bytes: int = Field(8 * MiB, ge=64, description="Largest encoded image (413 beyond).")
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="Largest decoded image, width x height (413 beyond; decompression-bomb guard)."
    )
    max_images_per_request: int = Field(32, ge=1, description="Most images in one request (422 beyond).")
    max_top_k: int = Field(100, ge=1, le=100_000, description="Largest `top_k` a request may ask for.")
    max_running_sequences: int = Field(
        64, ge=1, le=4096, description="Translation: most decoder rows in the running batch (a beam of k takes k rows)."
    )
    decoding_lanes: int = Field(
        0,
        ge=0,
        le=64,
        description="Translation: decoding loops per model, each with its own running batch (of up to "
        "`max_running_sequences` rows) and thread, sharing the queue, the sessions and so the weights; 0: on the "
        "CPU one per `intra_op_threads` of the available cores (two on two cores), one on a GPU.",
    )
    max_waiting_sequences: int = Field(
        512, ge=1, description="Translation: most decoder rows waiting to join the running batch (503 beyond)."
    )
    batch_max_wait_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="Longest a `priority: batch` request (a translation's sentences, a classification's images) "
        "waits while interactive ones go first; past it, it is taken before them.",
    )
    max_texts_per_request: int = Field(32, ge=1, description="Translation: most texts in one request (422 beyond).")
    max_text_chars: int = Field(2000, ge=1, description="Translation: longest text in characters (413 beyond).")
    max_html_chars: int = Field(
        200_000, ge=1, description='Translation: longest `format: "html"` document in characters (413 beyond).'
    )
    max_source_tokens: int = Field(256, ge=1, description="Translation: longest text in tokens (413 beyond).")
    max_new_tokens: int = Field(256, ge=1, description="Translation: cap on generated tokens per text.")
    max_beam_size: int = Field(8, ge=1, le=64, description="Translation: largest `beam_size` a request may ask for.")
    default_beam_size: int = Field(
        0,
        ge=0,
        le=64,
        description="Translation: `beam_size` of a request that gives none (0: the model's manifest, "
        "capped at `max_beam_size`; 1: greedy).",
    )

    # --- deadlines ----------------------------------------------------------------------------
    request_timeout_s: float = Field(
        60.0,
        gt=0.0,
        le=MAX_TIMEOUT_S,
        description="Deadline of a request that asks for none, from its arrival: past it, it leaves its queue or "
        "decode batch and gets 504 `deadline_exceeded`.",
    )
    max_request_timeout_s: float = Field(
        300.0,
        gt=0.0,
        le=MAX_TIMEOUT_S,
        description="Longest deadline a request may ask for (`X-Request-Timeout` seconds, or the OIP `timeout` "
        "parameter); a longer one is cut to this.",
    )
    body_timeout_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="Longest a request's body may take to arrive, from its headers: a slower one (a stalled or "
        "trickling client, slow-loris) gets 408 `request_timeout` and its connection is closed.",
    )
    api_key_hashes: EnvList = Field(
        (),
        description="sha256 hex digests of the accepted API keys (a JSON list or comma-separated); set, every route but "
        "the health probes, the web page's files and the docs requires `Authorization: Bearer <key>`.",
    )
    api_key_hashes_file: Path | None = Field(
        None, description="A file of more accepted key hashes, one per line (a mounted Kubernetes Secret)."
    )
    protect_metrics: bool = Field(False, description="With API keys: `/metrics` requires a key too.")
    cors_origins: EnvList = Field(
        (),
        description="Origins whose browser pages may call the API (a JSON list or comma-separated, e.g. "
        "`https://app.example.com,https://admin.example.com`; `*` for any). Empty: no cross-origin calls.",
    )
    image_formats: EnvList = Field(
        DEFAULT_IMAGE_FORMATS, min_length=1, description="Pillow formats accepted (a JSON list or comma-separated)."
    )
    inline_decode_max_pixels: int = Field(
        65_536,
        ge=0,
        description="Images up to this many pixels are decoded on the event loop; larger ones in a thread.",
    )
    decode_threads: int = Field(2, ge=1, le=256, description="Threads decoding large images.")

    # --- attention store ----------------------------------------------------------------------
    attention_store: Literal["memory", "redis"] = Field(
        "memory",
        description="Where attention maps asked for are kept: `memory` (this process) or `redis` "
        "(shared by every replica that uses the same Redis).",
    )
    redis_url: str = Field(
        "redis://localhost:6379/0",
        pattern=r"^(redis|rediss|unix)://",
        description="Redis of the `redis` attention store and of the response cache.",
    )
    redis_timeout_s: float = Field(
        0.5,
        gt=0.0,
        le=60.0,
        description="Connect/read timeout of each Redis call; past it the store counts as unreachable.",
    )
    attention_ttl_s: int = Field(600, ge=1, le=7 * 86400, description="Seconds an attention id stays retrievable.")
    attention_max_bytes: int = Field(
        256 * MiB, ge=1 * MiB, description="Memory store: total size of kept maps; the least recently used go first."
    )

    # --- response cache -----------------------------------------------------------------------
    response_cache: bool = Field(
        False,
        description="Keep answers of /translate (each text) and /classify (each image), and of the Open Inference "
        "Protocol's infer on the same models, in the Redis of `redis_url`, shared by every replica that uses it: a "
        "text or image asked for again with the same model file and options is answered from there. Needs "
        "`redis_url` set.",
    )
    response_cache_ttl_s: int = Field(
        86_400, ge=1, le=30 * 86_400, description="Seconds a cached answer is kept (Redis expires it)."
    )
    response_cache_max_entry_bytes: int = Field(
        65_536,
        ge=256,
        le=16 * MiB,
        description="Largest answer of one text or image that is cached (its JSON); a larger one is answered but "
        "not kept.",
    )
    response_cache_scope: CacheScope = Field(
        "shared",
        description="`shared`: one entry per text or image whoever asks, so a string is computed once for every "
        "caller; `key`: with API keys, entries are per key, so that a caller cannot tell from `X-Cache` or the "
        "latency that another key asked for the same text (refused at start without keys).",
    )
    response_cache_budget_ms: float = Field(
        50.0,
        gt=0.0,
        le=10_000.0,
        description="Longest a request waits for the cache's lookup, and for its store before the answer goes out "
        "(never past its deadline): a slower Redis is left alone for a second, its requests computed without it, "
        "and a slow store finishes in the background.",
    )

    # --- quotas -------------------------------------------------------------------------------
    quota: str = Field(
        "off",
        description="Every API key's quota unless its line in `api_key_hashes_file` sets its own: limits such as "
        "`requests=600/min,characters=100000/min,images=600/min` (windows `s`, `min`, `h`; characters: of the "
        "texts to translate, images: to classify); `off`: none. Over it, 429 `quota_exceeded` with `Retry-After`.",
    )
    anonymous_quota: str = Field(
        "requests=600/min,characters=120000/min,images=600/min",
        description="Without API keys: each client address's quota (the addresses of `quota_exempt` have none); "
        "`off`: none.",
    )
    quota_exempt: EnvList = Field(
        ("127.0.0.0/8", "::1"),
        description="Client addresses (or networks) that the anonymous quota leaves alone (a JSON list or "
        "comma-separated): the host's own tools and probes. A proxy in front must forward the client's address "
        "(`X-Forwarded-For`, trusted from `FORWARDED_ALLOW_IPS`).",
    )
    quota_store: Literal["memory", "redis"] = Field(
        "memory",
        description="Where quota windows are counted: `memory` (each process its own: N replicas allow N times "
        "the quota) or `redis` (`redis_url`, shared by every replica; a Redis that fails lets requests through).",
    )

    # --- faults -------------------------------------------------------------------------------
    engine_restart_limit: int = Field(
        3,
        ge=1,
        le=1000,
        description="Failures of a model's engine loops (a translation lane, a classification instance thread) "
        "within `engine_restart_window_s` that make the model not ready; each loop is restarted, with backoff "
        "from then on.",
    )
    engine_restart_window_s: float = Field(
        60.0, gt=0.0, le=86_400.0, description="The window over which `engine_restart_limit` counts failures."
    )
    faults: str | None = Field(
        None,
        description="For fault drills and the fault suite only: failures to inject, `POINT:KIND[=SECONDS][@N][xCOUNT]` "
        "separated by `;` (e.g. `decoder:raise@400`); see service/faults.py. Unset: none.",
    )

    @property
    def requests_in_flight_bound(self) -> int:
        """``max_requests_in_flight``, or what 0 stands for: as many requests as the queues can hold (each
        request takes one image or one decoder row at least); beyond that a request could only wait in
        front of them, on the event loop, where nothing else bounds its wait."""
        return self.max_requests_in_flight or self.max_queue_images + self.max_waiting_sequences

    @property
    def connection_bound(self) -> int:
        """``max_connections``, or what 0 stands for: half the open files the process may hold (HTTP's and
        gRPC's connections each bounded by it) less 256 for the models, logs and Redis, at most 4096."""
        return self.max_connections or default_connection_bound()

    @field_validator("version_policy", mode="after")
    @classmethod
    def _valid_policy(cls, value: str) -> str:
        from service.versions import parse_setting

        parse_setting(value)  # raises ValueError, which pydantic reports with the field's name
        return value

    @field_validator("faults", mode="after")
    @classmethod
    def _valid_faults(cls, value: str | None) -> str | None:
        from service.faults import parse

        parse(value or "")  # raises ValueError naming the rule it cannot read
        return value

    @field_validator("api_key_hashes", mode="after")
    @classmethod
    def _hex_digests(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        check_hashes(value)
        return value

    @field_validator("quota", "anonymous_quota", mode="after")
    @classmethod
    def _quota_policy(cls, value: str) -> str:
        from service.core.quotas import parse_policy

        parse_policy(value)
        return value

    @field_validator("quota_exempt", mode="after")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        import ipaddress

        for net in value:
            ipaddress.ip_network(net, strict=False)
        return value

    @field_validator("image_formats", mode="after")
    @classmethod
    def _upper_case_formats(cls, formats: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f.upper() for f in formats)

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        problems = []
        if self.grpc_port == self.port:
            problems.append(f"grpc_port must differ from port ({self.port})")
        if self.max_body_bytes > MAX_BODY_CEILING:
            problems.append(f"max_body_bytes {self.max_body_bytes} exceeds the ceiling {MAX_BODY_CEILING}")
        if self.max_image_bytes > self.max_body_bytes:
            problems.append("max_image_bytes must not exceed max_body_bytes")
        if self.max_image_pixels > MAX_PIXELS_CEILING:
            problems.append(f"max_image_pixels {self.max_image_pixels} exceeds the ceiling {MAX_PIXELS_CEILING}")
        if self.max_images_per_request > self.max_batch_size:
            problems.append(
                f"max_images_per_request ({self.max_images_per_request}) must not exceed max_batch_size "
                f"({self.max_batch_size}): a request is never split across batches"
            )
        if self.max_queue_images < self.max_batch_size:
            problems.append("max_queue_images must be at least max_batch_size, or no full batch could ever form")
        if self.max_beam_size > self.max_running_sequences:
            problems.append("max_beam_size must not exceed max_running_sequences: a beam runs in one batch")
        if self.default_beam_size > self.max_beam_size:
            problems.append("default_beam_size must not exceed max_beam_size, the largest a request may ask for")
        if self.max_waiting_sequences < self.max_beam_size * self.max_texts_per_request:
            problems.append("max_waiting_sequences must hold one full request (max_texts_per_request x max_beam_size)")
        if self.request_timeout_s > self.max_request_timeout_s:
            problems.append(
                "request_timeout_s must not exceed max_request_timeout_s, the longest a request may ask for"
            )
        if self.response_cache and "redis_url" not in self.model_fields_set:
            problems.append(
                "response_cache is shared through Redis: set redis_url (e.g. redis://redis:6379/0) to the Redis "
                "every replica uses"
            )
        if self.response_cache_scope == "key" and not self.api_key_hashes and self.api_key_hashes_file is None:
            problems.append(
                "response_cache_scope='key' keeps entries per API key, but no keys are configured (api_key_hashes or "
                "api_key_hashes_file): every caller would share them; configure keys or use scope 'shared'"
            )
        if self.require_gpu and self.execution_provider == "cpu":
            problems.append("require_gpu contradicts execution_provider='cpu'")
        unknown = sorted(set(self.image_formats) - _pillow_formats())
        if unknown:
            problems.append(f"image_formats {unknown} are not formats Pillow can decode")
        if problems:
            raise ValueError("; ".join(problems))
        return self


CONNECTION_BOUND_CEILING = 4096  # HAProxy's maxconn in the Compose profile; far more than two cores can serve
RESERVED_FILES = 256  # model files, logs, Redis, the listeners


def default_connection_bound() -> int:
    """What ``ATTNSERVE_MAX_CONNECTIONS=0`` stands for in this process (see ``Settings.connection_bound``)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return CONNECTION_BOUND_CEILING
    return max(16, min(CONNECTION_BOUND_CEILING, (soft - RESERVED_FILES) // 2))


def _pillow_formats() -> set[str]:
    """Formats this Pillow build can open, so a typo in ``image_formats`` fails at startup."""
    from PIL import Image

    Image.init()
    return set(Image.OPEN)


def variable(field: str) -> str:
    """The environment variable of a setting: ``max_batch_size`` -> ``ATTNSERVE_MAX_BATCH_SIZE``."""
    return f"{Settings.model_config['env_prefix']}{field.upper()}"


def check_hashes(hashes: list[str] | tuple[str, ...]) -> None:
    """API key hashes must be sha256 hex digests (``service/core/keys.py`` hashes what clients present)."""
    bad = [h for h in hashes if len(h) != 64 or any(c not in "0123456789abcdefABCDEF" for c in h)]
    if bad:
        raise ValueError(f"{len(bad)} API key hashes are not sha256 hex digests (64 hex digits); hash the keys first")


def explain(error: ValidationError) -> str:
    """The refusal of a ValidationError from ``Settings`` on one line, for an operator: the variable, what is
    wrong with it, the expected form; the value only where it is not secret (``SECRET_SETTINGS``)."""
    return "; ".join(_explain_one(e) for e in error.errors(include_url=False))


# Expected forms pydantic's message leaves out, by error type.
_EXPECTED = {"bool_parsing": "true or false (also 1/0, yes/no, on/off)"}


def _explain_one(e: dict[str, Any]) -> str:
    message = e["msg"].removeprefix("Value error, ")
    if e["type"] in _EXPECTED:
        message += f"; expected {_EXPECTED[e['type']]}"
    if not e["loc"]:  # a model-level check (_refuse_unsafe): its message names the settings it compares
        return _with_variables(message)
    field, *inside = e["loc"]
    where = variable(str(field)) + "".join(f" item {i}" for i in inside)
    if field in SECRET_SETTINGS or field not in Settings.model_fields:  # an unknown name may be a misspelt secret
        return f"{where} (value not shown): {message}"
    return f"{where}={e['input']!r}: {message}"


def _with_variables(text: str) -> str:
    """``text`` with each setting it names written as its variable."""
    return re.sub(r"\b[a-z][a-z0-9_]*\b", lambda m: variable(m[0]) if m[0] in Settings.model_fields else m[0], text)
