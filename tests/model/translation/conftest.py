"""A package cache built from real excerpts (excerpts.py), so the corpus builder runs offline in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.translation import sources
from model.translation.corpus import WESNOTH_PACKAGES
from tests.model.translation.excerpts import (
    CATACLYSM_ENTRIES,
    DING_LINES,
    FREECIV_ENTRIES,
    FREEDINK_ENTRIES,
    FREEDROID_ENTRIES,
    HELP_DE,
    HELP_EN,
    NAEV_ENTRIES,
    STAMP_KANGAROO,
    UI_ENTRIES,
    WESNOTH_ENTRIES,
    WIDELANDS_ENTRIES,
    build_mo,
    make_package,
)


@pytest.fixture
def excerpt_cache(tmp_path) -> Path:
    """Every source as `debian.fetch` leaves it in a cache, holding only the excerpts."""
    cache = tmp_path / "cache"
    make_package(cache, "trans-de-en", {sources.DING_FILE: "\n".join(DING_LINES) + "\n"}, "1.9-6")
    page = "text/shared/01/01010000.html"
    make_package(cache, "libreoffice-help-en-us", {f"{sources.HELP_DIR}/en-US/{page}": HELP_EN})
    make_package(cache, "libreoffice-help-de", {f"{sources.HELP_DIR}/de/{page}": HELP_DE})
    make_package(cache, "libreoffice-l10n-de", {f"{sources.UI_CATALOG_DIR}/sc.mo": build_mo(UI_ENTRIES)})
    for name in WESNOTH_PACKAGES:  # the excerpt in the data package, empty campaign catalogs beside it
        entries = WESNOTH_ENTRIES if name == "wesnoth-1.16-data" else []
        make_package(cache, name, {f"{sources.WESNOTH_LOCALE_DIR}/{name}.mo": build_mo(entries)}, "1:1.16.9-1")
    catalog = {f"{sources.FREECIV_LOCALE_DIR}/freeciv-core.mo": build_mo(FREECIV_ENTRIES)}
    make_package(cache, "freeciv-data", catalog, "3.0.6-1+deb12u1")
    catalog = {f"{sources.CATACLYSM_LOCALE_DIR}/cataclysm-dda.mo": build_mo(CATACLYSM_ENTRIES)}
    make_package(cache, "cataclysm-dda-data", catalog, "0.F-3-9")
    catalog = {f"{sources.WIDELANDS_LOCALE_DIR}/widelands.mo": build_mo(WIDELANDS_ENTRIES)}
    make_package(cache, "widelands-data", catalog, "2:1.1-3")
    stamp = {f"{sources.TUXPAINT_STAMPS_DIR}/animals/marsupials/kangaroo.txt": STAMP_KANGAROO}
    make_package(cache, "tuxpaint-stamps-default", stamp, "2022.06.04-1")
    make_package(cache, "naev-data", {f"{sources.NAEV_LOCALE_DIR}/naev.mo": build_mo(NAEV_ENTRIES)}, "0.8.2-1")
    catalog = {f"{sources.FREEDROID_LOCALE_DIR}/freedroidrpg-dialogs.mo": build_mo(FREEDROID_ENTRIES)}
    make_package(cache, "freedroidrpg-data", catalog, "1.0-1")
    catalog = {f"{sources.FREEDINK_LOCALE_DIR}/dink.mo": build_mo(FREEDINK_ENTRIES)}
    make_package(cache, "freedink-data", catalog, "1.08.20190120-2")
    return cache
