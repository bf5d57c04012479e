"""``GET /models``: what is loaded, on which execution provider, and how well it measured at export."""

from __future__ import annotations

from fastapi import APIRouter

from service.deps import RegistryDep
from service.schemas import ModelsResponse

router = APIRouter(tags=["models"])


@router.get("/models", response_model=ModelsResponse, summary="List the models this process serves")
async def list_models(registry: RegistryDep) -> dict:
    """Every model in the repository, failed ones included with the reason, so an operator sees why."""
    defaults = {registry.default_model_name(task) for task in {m.task for m in registry.models.values()} if task}
    return {"models": [{**m.describe(), "default": m.name in defaults} for m in registry.models.values()]}
