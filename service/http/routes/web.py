"""``GET /``: the web page to try both models and look at their attention; ``GET /samples`` and the
sample files it lists (real test images and sentences recorded in the served models' manifests).

The page is static HTML/CSS/JS (``service/static/``) that calls the same public API as any client.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.core.serving import Serving
from service.errors import ServiceError
from service.http.common import JSON_TYPE, dump_json
from service.http.router import Route
from service.registry import Status
from service.translator import TASK as TRANSLATION

STATIC = Path(__file__).resolve().parents[2] / "static"
_FILES = StaticFiles(directory=STATIC)
MAX_SAMPLE_TEXTS = 8


class SampleNotFound(ServiceError):
    status, code = 404, "not_found"


async def index(request: Request, serving: Serving) -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


def sample_texts(examples: list[dict]) -> list[dict]:
    """At most ``MAX_SAMPLE_TEXTS`` examples; where they are marked, as many translated badly as well, so
    that the page shows what the model cannot do beside what it can."""
    marked = [e for e in examples if e.get("quality") in ("good", "fair", "poor")]
    if not marked:
        return examples[:MAX_SAMPLE_TEXTS]
    good = [e for e in marked if e["quality"] == "good"] + [e for e in marked if e["quality"] == "fair"]
    poor = [e for e in marked if e["quality"] == "poor"]
    half = MAX_SAMPLE_TEXTS // 2
    take_poor = min(len(poor), max(half, MAX_SAMPLE_TEXTS - len(good)))
    return good[: MAX_SAMPLE_TEXTS - take_poor] + poor[:take_poor]


async def static_file(request: Request, serving: Serving) -> Response:
    """The web page's script and style."""
    return await _FILES.get_response(request.path_params["path"], request.scope)


async def samples(request: Request, serving: Serving) -> Response:
    """Images: `{model, label, url}` from each ready classifier's manifest; texts: test-set sources of
    each ready translator's manifest (its evaluation examples), with their domain and how well the model
    translates them (`good`, `fair`, `poor` by sentence chrF against the reference) where the manifest says."""
    images, texts = [], []
    for m in serving.registry.models.values():
        if m.status is not Status.READY:
            continue
        if m.task == IMAGE_CLASSIFICATION:
            images += [
                {"model": m.name, "label": s["label"], "url": f"/samples/{m.name}/{s['file']}"}
                for s in m.manifest.samples
            ]
        elif m.task == TRANSLATION:
            texts += [
                {
                    "model": m.name,
                    "text": e["source"],
                    "reference": e.get("reference"),
                    "domain": e.get("domain"),
                    "quality": e.get("quality"),
                }
                for e in sample_texts(m.manifest.evaluation.get("examples", []))
            ]
    return Response(dump_json({"images": images, "texts": texts}), media_type=JSON_TYPE)


async def sample_file(request: Request, serving: Serving) -> Response:
    """A sample image listed in a ready model's manifest."""
    model, file = request.path_params["model"], request.path_params["file"]
    m = serving.registry.models.get(model)
    listed = {s["file"] for s in m.manifest.samples} if m is not None and m.manifest is not None else set()
    if m is None or file not in listed:  # only files the manifest lists (and sha256-verified): no path games
        raise SampleNotFound(f"no sample {file!r} in model {model!r}")
    return FileResponse(m.path / file, media_type="image/png", headers={"Cache-Control": "public, max-age=3600"})


ROUTES = [
    Route("GET", "/", index, documented=False, access="open"),  # the page asks for a key when the API wants one
    Route("GET", "/static/{path:path}", static_file, documented=False, access="open"),
    Route("GET", "/samples", samples, summary="Sample inputs shipped with the served models", tags=("web page",)),
    Route(
        "GET",
        "/samples/{model}/{file}",
        sample_file,
        summary="One sample image",
        tags=("web page",),
        response={"image/png": {"schema": {"type": "string", "format": "binary"}}},
        errors={404: "No such sample."},
    ),
]
