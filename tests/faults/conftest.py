"""What the fault suite sends: real sentences and real Fashion-MNIST images. Its servers (``python -m service`` on
the tiny ViT and translator, ``both_repository``) get their faults through ``ATTNSERVE_FAULTS``
(``service/faults.py``) or through real broken parts (a full Redis, a slow one)."""

from __future__ import annotations

import base64

import pytest

from tests.model.translation.excerpts import DING_PAIRS, UI_PAIRS
from tests.service.service_testing import png_bytes


@pytest.fixture(scope="session")
def translate_jobs() -> list[tuple[str, dict]]:
    """Real sentences, each once greedy and once with a beam of 2."""
    texts = [en for en, _ in (DING_PAIRS[:6] + UI_PAIRS[:6])]
    return [("/translate", {"text": t, "beam_size": beam}) for t in texts for beam in (1, 2)]


@pytest.fixture(scope="session")
def classify_jobs() -> list[tuple[str, dict]]:
    """Real Fashion-MNIST test images, one to three per request."""
    from model.data import load_image_dataset

    images = load_image_dataset("fashion-mnist").test_images[:12]
    pngs = [base64.b64encode(png_bytes(img[..., 0])).decode() for img in images]
    return [("/classify", {"images": pngs[i : i + 1 + i % 3]}) for i in range(len(pngs))]
