"""``GET /``: the web page to try both models and look at their attention; ``GET /samples`` and the
sample files it lists (real test images and sentences recorded in the served models' manifests).

The page is static HTML/CSS/JS (``service/static/``) that calls the same public API as any client.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import FileResponse

from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.deps import RegistryDep
from service.errors import ServiceError
from service.registry import Status
from service.translator import TASK as TRANSLATION

router = APIRouter(tags=["web page"])
STATIC = Path(__file__).resolve().parents[1] / "static"
MAX_SAMPLE_TEXTS = 8


class SampleNotFound(ServiceError):
    status, code = 404, "not_found"


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get("/samples", summary="Sample inputs shipped with the served models")
async def samples(registry: RegistryDep) -> dict:
    """Images: `{model, label, url}` from each ready classifier's manifest; texts: test-set sources of
    each ready translator's manifest (its evaluation examples)."""
    images, texts = [], []
    for m in registry.models.values():
        if m.status is not Status.READY:
            continue
        if m.task == IMAGE_CLASSIFICATION:
            images += [
                {"model": m.name, "label": s["label"], "url": f"/samples/{m.name}/{s['file']}"}
                for s in m.manifest.samples
            ]
        elif m.task == TRANSLATION:
            examples = m.manifest.evaluation.get("examples", [])[:MAX_SAMPLE_TEXTS]
            texts += [{"model": m.name, "text": e["source"], "reference": e.get("reference")} for e in examples]
    return {"images": images, "texts": texts}


@router.get("/samples/{model}/{file}", summary="One sample image")
async def sample_file(model: str, file: str, registry: RegistryDep) -> FileResponse:
    m = registry.models.get(model)
    listed = {s["file"] for s in m.manifest.samples} if m is not None and m.manifest is not None else set()
    if m is None or file not in listed:  # only files the manifest lists (and sha256-verified): no path games
        raise SampleNotFound(f"no sample {file!r} in model {model!r}")
    return FileResponse(m.path / file, media_type="image/png", headers={"Cache-Control": "public, max-age=3600"})
