"""Optional API keys: a presented ``Bearer <key>`` checked against the sha256 hashes in the settings.

Every transport presents the key the same way, ``Authorization: Bearer <key>``: as an HTTP header, or as
gRPC metadata (``authorization``). The service holds hashes only (``ATTNSERVE_API_KEY_HASHES``, or a file of them such as a mounted
Kubernetes Secret), never keys. A presented key is hashed and compared with every accepted hash in
constant time. A key is known afterwards by its fingerprint (the first 12 hex digits of its hash):
the access log names it, and attention records belong to it. Keys themselves are never logged.

A line of the key file may give its key terms after the hash (``service/core/quotas.py``):
``<hash> quota=requests=60/min,characters=20000/min priority=batch``: its own quota instead of
``ATTNSERVE_QUOTA``, and ``priority=batch`` to queue its requests as batch work whatever they ask.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from service.core.quotas import KeyTerms, parse_policy
from service.errors import ServiceError
from service.settings import Settings, check_hashes

FINGERPRINT_CHARS = 12


class Unauthorized(ServiceError):
    status, code = 401, "unauthorized"


def hash_key(key: str) -> str:
    """What to put in ``ATTNSERVE_API_KEY_HASHES`` for ``key`` (``python -m service.core.keys KEY`` prints it)."""
    return hashlib.sha256(key.encode()).hexdigest()


def read_hashes(inline: tuple[str, ...], path: Path | None) -> tuple[str, ...]:
    """The accepted hashes: the setting's and the file's (one per line; blank lines and ``#`` comments skipped)."""
    return tuple(read_terms(inline, path))


def read_terms(inline: tuple[str, ...], path: Path | None) -> dict[str, KeyTerms]:
    """Each accepted hash (lower case) and the terms its line in the file gives (a ValueError names a bad line)."""
    terms = {h: KeyTerms() for h in inline}
    if path is not None:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if words:
                try:
                    terms[words[0]] = _terms(words[1:])
                except ValueError as e:
                    raise ValueError(f"{path}, line {number}: {e}") from None
    check_hashes(list(terms))
    return {h.lower(): t for h, t in terms.items()}


def _terms(words: list[str]) -> KeyTerms:
    quota, priority = None, None
    for word in words:
        name, _, value = word.partition("=")
        if name == "quota":
            quota = parse_policy(value)
        elif name == "priority" and value in ("interactive", "batch"):
            priority = value
        else:
            raise ValueError(
                f"{word!r}: a key's terms are quota=MEASURE=AMOUNT/WINDOW,... and priority=interactive|batch"
            )
    return KeyTerms(quota, priority)


def load_keys(settings: Settings) -> Keys | None:
    """The keys the settings accept, or None when keys are off (no hashes configured)."""
    terms = read_terms(settings.api_key_hashes, settings.api_key_hashes_file)
    return Keys(tuple(terms), terms) if terms else None


class Keys:
    def __init__(self, hashes: tuple[str, ...], terms: dict[str, KeyTerms] | None = None) -> None:
        self._hashes = [bytes.fromhex(h) for h in hashes]
        self.terms = {h[:FINGERPRINT_CHARS]: t for h, t in (terms or {}).items()}  # by fingerprint

    def batch_only(self, key_id: str | None) -> bool:
        """Whether key ``key_id``'s terms queue its requests as batch work whatever they ask."""
        terms = self.terms.get(key_id) if key_id is not None else None
        return terms is not None and terms.priority == "batch"

    def check(self, authorization: str | None) -> str:
        """The fingerprint of the presented key, or 401 ``unauthorized`` (with ``WWW-Authenticate``)."""
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized(
                "this service requires an API key: send Authorization: Bearer <key>",
                headers={"WWW-Authenticate": 'Bearer realm="attnserve"'},
            )
        digest = hashlib.sha256(key.strip().encode()).digest()
        accepted = False
        for h in self._hashes:  # every hash compared, in constant time: no early exit to time
            accepted |= hmac.compare_digest(digest, h)
        if not accepted:
            raise Unauthorized(
                "the API key is not accepted",
                headers={"WWW-Authenticate": 'Bearer realm="attnserve", error="invalid_token"'},
            )
        return digest.hex()[:FINGERPRINT_CHARS]


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m service.core.keys KEY   (prints the sha256 hash to configure)")
    print(hash_key(sys.argv[1]))
