"""The model-repository contract between export/ (writes it) and the service (reads and verifies it).

A repository is ``<root>/<name>/<version>/`` folders, each holding its files and a
``manifest.json`` that lists every file with its sha256. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1
REQUIRED_KEYS = ("schema_version", "name", "version", "task", "created_at", "files", "graphs")


class ManifestError(RuntimeError):
    """A repository entry cannot be served: missing, malformed, or its files do not match."""


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    path: Path
    manifest: dict


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def describe_files(entry_dir: Path, names: list[str]) -> dict[str, dict]:
    """The ``files`` section of a manifest: sha256 and size of each named file."""
    return {n: {"sha256": sha256_file(entry_dir / n), "bytes": (entry_dir / n).stat().st_size} for n in sorted(names)}


def write_manifest(entry_dir: Path, manifest: dict) -> Path:
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise ManifestError(f"manifest lacks required keys {missing}")
    path = Path(entry_dir) / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return path


def read_manifest(entry_dir: Path) -> dict:
    path = Path(entry_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"{entry_dir}: no {MANIFEST_NAME}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}: not valid JSON ({e})") from e
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise ManifestError(f"{path}: missing required keys {missing}")
    if manifest["schema_version"] != SCHEMA_VERSION:
        raise ManifestError(f"{path}: schema_version {manifest['schema_version']} is not {SCHEMA_VERSION}")
    return manifest


def verify_files(entry_dir: Path, manifest: dict) -> None:
    """Refuse an entry whose files are missing or differ from what the manifest recorded."""
    for name, meta in manifest["files"].items():
        path = Path(entry_dir) / name
        if not path.is_file():
            raise ManifestError(f"{path}: listed in the manifest but missing")
        actual = sha256_file(path)
        if actual != meta["sha256"]:
            raise ManifestError(
                f"{path}: sha256 mismatch (manifest {meta['sha256'][:12]}..., file {actual[:12]}...); "
                "the file is corrupted or was replaced without re-exporting"
            )


def load_entry(entry_dir: Path) -> Entry:
    """Read and verify one ``<name>/<version>`` folder."""
    entry_dir = Path(entry_dir)
    manifest = read_manifest(entry_dir)
    verify_files(entry_dir, manifest)
    return Entry(manifest["name"], str(manifest["version"]), entry_dir, manifest)


def latest_versions(root: Path) -> list[Path]:
    """For each model folder under ``root``, its highest numeric version folder."""
    root = Path(root)
    if not root.is_dir():
        raise ManifestError(f"model repository {root} does not exist")
    found = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        versions = [v for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit()]
        if versions:
            found.append(max(versions, key=lambda v: int(v.name)))
    return found
