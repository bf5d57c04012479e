"""Which precision of a model version this process loads (``ATTNSERVE_PRECISION``).

``auto`` serves a version's int8 variant (``contract/precision.py``) on the CPU when its manifest
records that it loses no more quality than ``export.quantize`` allows and that its answers depend no
more than fp32's on the batch they are computed in (int8 products run two to three times faster than
fp32's on a CPU with VNNI). fp32 stays the choice on a GPU, for a version without a variant and for
one that fails either test; ``fp32`` and ``int8`` force one (``int8`` fails the load of a version that
has none).
"""

from __future__ import annotations

from pathlib import Path

from contract.manifest import MANIFEST_NAME, ManifestError, read_manifest
from contract.precision import FP32, INT8, batch_dependence, quality, variant_folder


def choose(entry_dir: Path, setting: str, on_cpu: bool) -> tuple[Path, str, str]:
    """(the folder to load, its precision, why) for the version in ``entry_dir``."""
    own = read_manifest(entry_dir) if (entry_dir / MANIFEST_NAME).is_file() else {}
    if own.get("variant"):  # a variant made an entry of its own (export.quantize --name): served as it is
        return entry_dir, own["variant"]["precision"], f"a variant of {own['variant']['from']}, an entry of its own"
    folder = variant_folder(entry_dir, INT8)
    present = (folder / MANIFEST_NAME).is_file()
    if setting == FP32:
        return entry_dir, FP32, "precision fp32 is set"
    if setting == INT8:
        if not present:
            raise ManifestError(
                f"precision int8 is set but {entry_dir} has no int8 variant "
                f"(python -m export.quantize --entry {entry_dir} writes {folder})"
            )
        return folder, INT8, "precision int8 is set"
    if not present:
        return entry_dir, FP32, "no int8 variant"
    if not on_cpu:
        return entry_dir, FP32, "int8 is served on the CPU only"
    evaluation = read_manifest(folder).get("evaluation", {})
    measured = quality(evaluation)
    if measured is None:
        return entry_dir, FP32, "the int8 variant records no quality against fp32"
    score, fp32, allowed, measure = measured
    verdict = f"int8 scores {score:g} {measure} against fp32's {fp32:g}"
    if fp32 - score > allowed + 1e-9:
        return entry_dir, FP32, f"{verdict}, more than {allowed:g} below"
    batches = batch_dependence(evaluation)
    if batches is None:
        return entry_dir, FP32, "the int8 variant records no check that its answers do not depend on the batch"
    same, fp32_same, tried = batches
    if same < fp32_same:
        return (
            entry_dir,
            FP32,
            (
                f"int8 answers {same} of {tried} test inputs the same alone as in a batch, fp32 {fp32_same}: "
                "its answers would change with the load"
            ),
        )
    return folder, INT8, f"{verdict} (at most {allowed:g} below); as batch-invariant as fp32 ({same} of {tried})"
