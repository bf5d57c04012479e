"""A package cache built from real excerpts (excerpts.py), so the corpus builder runs offline in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.translation import sources
from tests.model.translation.excerpts import DING_LINES, HELP_DE, HELP_EN, UI_ENTRIES, build_mo, make_package


@pytest.fixture
def excerpt_cache(tmp_path) -> Path:
    """The three sources as `debian.fetch` leaves them in a cache, holding only the excerpts."""
    cache = tmp_path / "cache"
    make_package(cache, "trans-de-en", {sources.DING_FILE: "\n".join(DING_LINES) + "\n"}, "1.9-6")
    page = "text/shared/01/01010000.html"
    make_package(cache, "libreoffice-help-en-us", {f"{sources.HELP_DIR}/en-US/{page}": HELP_EN})
    make_package(cache, "libreoffice-help-de", {f"{sources.HELP_DIR}/de/{page}": HELP_DE})
    make_package(cache, "libreoffice-l10n-de", {f"{sources.UI_CATALOG_DIR}/sc.mo": build_mo(UI_ENTRIES)})
    return cache
