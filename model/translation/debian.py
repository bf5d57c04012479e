"""Fetch Debian packages as data: ``apt-get download`` + ``dpkg -x`` into a cache, never ``apt-get install``.

Installing ``libreoffice-help-de`` would pull in LibreOffice itself; downloading and unpacking the
``.deb`` gives its files and nothing else, without root once the apt lists exist. An unpacked
package is marked with its version and reused on the next run.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("attnserve.translation.debian")

MARKER = ".attnserve-unpacked"  # holds the package version once unpacking has finished
APT_LISTS = Path("/var/lib/apt/lists")


class PackageError(RuntimeError):
    """A package cannot be fetched or unpacked; the message says what to do."""


@dataclass(frozen=True)
class Unpacked:
    name: str
    version: str
    root: Path  # the package's files lie under it as they would under / (root / "usr/share/...")


def cached(name: str, cache: Path) -> Unpacked | None:
    """The package as already unpacked in ``cache``, or ``None``."""
    marker = cache / name / MARKER
    if not marker.is_file():
        return None
    return Unpacked(name, marker.read_text(encoding="utf-8").strip(), cache / name)


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    if shutil.which(args[0]) is None:
        raise PackageError(
            f"'{args[0]}' not found: the Debian corpus needs apt-get and dpkg (Debian or Ubuntu); "
            "elsewhere pass your own data with --tsv FILE or --source FILE --target FILE"
        )
    env = {**os.environ, "LC_ALL": "C"}  # English messages, so errors can be read and reported
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip() and not line.startswith("W:")]
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


def _apt_lists_present() -> bool:
    return any(APT_LISTS.glob("*_Packages*"))


def _update_apt_lists() -> None:
    """A fresh container has no apt lists; ``apt-get download`` then knows no package at all."""
    if os.geteuid() != 0:
        raise PackageError("apt has no package lists yet: run 'sudo apt-get update' once, then try again")
    log.info("apt-get update (no package lists yet)")
    proc = _run(["apt-get", "update", "-qq"])
    if proc.returncode != 0:
        raise PackageError(f"apt-get update failed: {_last_line(proc)}")


def download(name: str, folder: Path) -> Path:
    """``apt-get download NAME`` into ``folder``; returns the ``.deb``."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{name}_*.deb"):
        old.unlink()
    if not _apt_lists_present():
        _update_apt_lists()
    proc = _run(["apt-get", "download", "-q", name], cwd=folder)
    debs = sorted(folder.glob(f"{name}_*.deb"))
    if proc.returncode != 0 or not debs:
        raise PackageError(f"apt-get could not download package '{name}': {_last_line(proc)}")
    return debs[-1]


def unpack(deb: Path, name: str, cache: Path) -> Unpacked:
    """``dpkg -x`` into ``cache/NAME`` (replacing an older copy) and mark it with the package version."""
    proc = _run(["dpkg-deb", "--field", str(deb), "Version"])
    if proc.returncode != 0:
        raise PackageError(f"{deb} is not a Debian package: {_last_line(proc)}")
    version = proc.stdout.strip()
    target = cache / name
    shutil.rmtree(target, ignore_errors=True)
    proc = _run(["dpkg", "-x", str(deb), str(target)])
    if proc.returncode != 0:
        raise PackageError(f"dpkg -x {deb} failed: {_last_line(proc)}")
    (target / MARKER).write_text(version + "\n", encoding="utf-8")
    return Unpacked(name, version, target)


def fetch(name: str, cache: Path, *, offline: bool = False, refresh: bool = False) -> Unpacked:
    """The unpacked package: from the cache when there, else downloaded and unpacked (unless ``offline``)."""
    if not refresh and (hit := cached(name, cache)):
        log.info("%s %s: cached in %s", name, hit.version, hit.root)
        return hit
    if offline:
        raise PackageError(f"package '{name}' is not in the cache {cache} (run without --offline to fetch it)")
    log.info("%s: apt-get download + dpkg -x into %s", name, cache)
    deb = download(name, cache / "debs")
    return unpack(deb, name, cache)
