"""One guard for what CI must have: on CI (``CI=true``, as ``.ci/run`` and GitHub set it) a missing tool or limit is a
failure, since ``make test`` installs everything first; elsewhere it is a skip that says what is missing."""

from __future__ import annotations

import os
import shutil

import pytest

ON_CI = os.environ.get("CI", "").lower() in ("true", "1")


def missing(reason: str) -> None:
    """Fails the test on CI, skips it elsewhere."""
    if ON_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def needs_tool(tool: str, install: str) -> pytest.MarkDecorator:
    """Skips without ``tool`` except on CI, where the test runs and fails without it."""
    return pytest.mark.skipif(shutil.which(tool) is None and not ON_CI, reason=f"needs {tool} ({install})")
