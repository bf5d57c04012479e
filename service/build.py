"""Which build of the code is running: the package version and a digest of the code that computes answers.

The version string alone does not move when the span rules, the sentence splitting or the search change,
so entries a shared response cache keeps (``service/core/response_cache.py``) carry :func:`identity`:
``0.1.0+`` and the first 16 hex digits of a sha256 over every ``.py`` file of ``contract/`` and ``service/``
(path and bytes, in path order). Two builds whose code differs in any of them never share an entry, also
during a rolling upgrade; the same code on every replica does.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from service import __version__

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("contract", "service")


def code_digest(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> str:
    """The sha256 of every ``.py`` file under ``root``'s ``packages``: relative path and contents, in path order."""
    h = hashlib.sha256()
    for path in sorted(p for package in packages for p in (root / package).rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@cache
def identity() -> str:
    """``version+digest`` of the running code, computed once."""
    return f"{__version__}+{code_digest()[:16]}"
