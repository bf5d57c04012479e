"""Which versions of each model the service loads: a version policy per model, as Triton's ``version_policy``.

A model folder may hold ``config.json`` beside its version folders::

    models/vit/config.json   {"version_policy": {"latest": 2}}        the two highest versions
                             {"version_policy": "all"}                 every version
                             {"version_policy": {"specific": [1, 3]}}  exactly these

Without one, the repository-wide setting applies (``ATTNSERVE_VERSION_POLICY``: ``latest:1``,
the default, ``latest:N``, ``all`` or ``specific:1,3``). Of the loaded versions, the highest ready
one answers requests that name no version; ``name:version`` pins one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.manifest import ManifestError

CONFIG = "config.json"


@dataclass(frozen=True)
class VersionPolicy:
    latest: int | None = None  # the N highest versions
    specific: tuple[str, ...] | None = None  # exactly these (``None`` with ``latest`` None: all)

    def __str__(self) -> str:
        if self.latest is not None:
            return f"latest:{self.latest}"
        return "all" if self.specific is None else "specific:" + ",".join(self.specific)

    def select(self, versions: list[str]) -> list[str]:
        """The versions of ``versions`` (numeric folder names) this policy loads, lowest first."""
        ordered = sorted(versions, key=int)
        if self.latest is not None:
            return ordered[-self.latest :]
        if self.specific is None:
            return ordered
        return [v for v in ordered if v in self.specific]


def parse_setting(text: str) -> VersionPolicy:
    """``latest:N``, ``all`` or ``specific:1,3`` (the ``ATTNSERVE_VERSION_POLICY`` setting)."""
    kind, _, arg = text.strip().partition(":")
    if kind == "all" and not arg:
        return VersionPolicy()
    if kind == "latest" and arg.strip().isdigit() and int(arg) >= 1:
        return VersionPolicy(latest=int(arg))
    if kind == "specific" and arg:
        versions = tuple(v.strip() for v in arg.split(","))
        if all(v.isdigit() for v in versions):
            return VersionPolicy(specific=versions)
    raise ValueError(f"version policy {text!r}: expected latest:N (N >= 1), all, or specific:1,3")


def parse_config(value: object, where: str) -> VersionPolicy:
    """A ``config.json``'s ``version_policy``: ``{"latest": N}``, ``"all"`` or ``{"specific": [...]}``."""
    if value == "all":
        return VersionPolicy()
    if isinstance(value, dict) and len(value) == 1:
        ((kind, arg),) = value.items()
        if kind == "latest" and isinstance(arg, int) and not isinstance(arg, bool) and arg >= 1:
            return VersionPolicy(latest=arg)
        if kind == "specific" and isinstance(arg, list) and arg and all(str(v).isdigit() for v in arg):
            return VersionPolicy(specific=tuple(str(v) for v in arg))
    raise ManifestError(f'{where}: version_policy must be {{"latest": N}}, "all" or {{"specific": [1, 3]}}')


def model_policy(model_dir: Path, default: VersionPolicy) -> VersionPolicy:
    path = model_dir / CONFIG
    if not path.is_file():
        return default
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ManifestError(f"{path}: {e}") from e
    if not isinstance(config, dict) or "version_policy" not in config:
        return default
    return parse_config(config["version_policy"], str(path))


def version_folders(model_dir: Path) -> list[str]:
    return [v.name for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit()]


def selected_versions(root: Path, default: VersionPolicy) -> dict[str, tuple[list[str], VersionPolicy]]:
    """For each model folder of the repository: the versions its policy selects, and that policy."""
    root = Path(root)
    if not root.is_dir():
        raise ManifestError(f"model repository {root} does not exist")
    found = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        versions = version_folders(model_dir)
        if versions:
            policy = model_policy(model_dir, default)
            found[model_dir.name] = (policy.select(versions), policy)
    return found
